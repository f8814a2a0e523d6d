"""Model FLOPs per token and the machine's measured GEMM peak, for the benchmarks' FLOP/s columns.

Convention (PaLM, Chowdhery et al. 2022, appendix B, with causal attention counted as done): a
forward pass costs ``2 N + 4 n_layers d_model K`` FLOPs per token and a training step three times
that, where N counts the weights that take part in a matrix multiply per token (every linear
layer, the LM head once even when it is tied to the embedding; not the embedding lookup, norms or
position tables) and K is the number of keys a query attends to on average: (T + 1) / 2 in a
causal window of T tokens (PaLM's MFU counts T, which overstates the work of a causal kernel by up
to 2x at long lengths), P + (T + 1) / 2 for T new tokens after a cache of P. A position family's
own work (biases, rotations, CoPE's gates) is not counted: FLOP/s is then comparable across
families as "useful model FLOPs per second".

The peak is measured, not taken from a data sheet: the best of several square matrix multiplies
(``torch.mm``, n = 2048; 512 for bf16 on a CPU, where emulation is slow) with the threads the benchmark uses, in fp32 and bf16. On a CPU without
native bf16 (AVX2 only) bf16 is emulated, and its "peak" is what that emulation reaches.

``python tests/perf/flops.py`` prints the peaks with the machine line.
"""

from __future__ import annotations

import argparse
import functools
import time

import torch

__all__ = [
    "causal_keys",
    "forward_flops_per_token",
    "gemm_peak_gflops",
    "matmul_params",
    "share_of_peak",
]


def matmul_params(model: torch.nn.Module) -> int:
    """Weights of every ``nn.Linear`` (each tensor once: a tied LM head counts as one matmul)."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            total += module.weight.numel()
    return total


def causal_keys(new_tokens: int, past: int = 0) -> float:
    """Keys a query attends to on average: ``new_tokens`` causal queries after ``past`` cached."""
    return past + (new_tokens + 1) / 2


def forward_flops_per_token(n_matmul: int, n_layers: int, d_model: int, keys: float) -> float:
    """2 N + 4 n_layers d_model K (module doc; K from :func:`causal_keys`); a training step is 3x."""
    return 2.0 * n_matmul + 4.0 * n_layers * d_model * keys


@functools.cache
def gemm_peak_gflops(
    dtype: str = "fp32", threads: int | None = None, n: int | None = None
) -> float:
    """Best GFLOP/s of ``torch.mm`` on [n, n] x [n, n] in ``dtype`` (fp32 | bf16), on the CPU with
    ``threads`` (None = torch's current setting) or on CUDA when available and asked (``cuda:``
    prefix in dtype, e.g. ``cuda:bf16``)."""
    device = "cpu"
    if dtype.startswith("cuda:"):
        device, dtype = "cuda", dtype.removeprefix("cuda:")
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    if n is None:  # CPU bf16 without native support runs at a few GFLOP/s: a smaller product
        n = 512 if device == "cpu" and dtype == "bf16" else 2048
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        a = torch.randn(n, n, device=device).to(torch_dtype)
        b = torch.randn(n, n, device=device).to(torch_dtype)

        def seconds(reps: int) -> float:
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(reps):
                torch.mm(a, b)
            if device == "cuda":
                torch.cuda.synchronize()
            return (time.perf_counter() - start) / reps

        # about 0.2 s per round whatever the speed (emulated bf16 can be 20x slower than fp32)
        reps = max(1, int(0.2 / max(seconds(1), 1e-6)))
        best = min(seconds(reps) for _ in range(5))
    finally:
        torch.set_num_threads(before)
    return 2.0 * n**3 / best / 1e9


def share_of_peak(gflops: float, dtype: str, threads: int | None = None) -> float:
    """``gflops`` as a fraction of :func:`gemm_peak_gflops` for ``dtype``."""
    return gflops / gemm_peak_gflops(dtype, threads)


def main() -> None:
    from bench.core.runtime import machine_line, machine_summary

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    print(f"machine: {machine_line(machine_summary())}")
    for dtype in ("fp32", "bf16"):
        print(f"GEMM peak {dtype}: {gemm_peak_gflops(dtype, args.threads):.1f} GFLOP/s")
    if torch.cuda.is_available():
        for dtype in ("fp32", "bf16"):
            print(f"CUDA GEMM peak {dtype}: {gemm_peak_gflops('cuda:' + dtype):.0f} GFLOP/s")


if __name__ == "__main__":
    main()
