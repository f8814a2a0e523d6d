"""On a CUDA machine, in a few minutes: training tokens/s and MFU of the `small` and `base` presets
in bf16 (RoPE through SDPA, ALiBi through flex_attention) beside transformers' Llama at equal
dimensions, their evaluation at 16L with the chunked head, and the longest length a
pretrained-size model evaluates within the GPU's memory with chunked scoring.

1. **Training**: our DecoderLM with conf/model/{small,base}.yaml, ``--seq`` tokens (default
   1024) x ``--batch`` rows, AdamW, bf16 autocast, ``--steps`` timed steps after ``--warmup``;
   tokens/s from the median step; MFU = model FLOPs (tests/perf/flops.py: 6 N + 12 n_layers
   d_model (T+1)/2 per token) per second over the GPU's measured bf16 GEMM peak (``torch.mm``, so MFU
   is against what this GPU's matrix units reach, not its data sheet); peak memory
   ``torch.cuda.max_memory_allocated``. Our families' kernels: RoPE SDPA (flash), ALiBi compiled
   flex attention (``models.flex``; the first step compiles it, which the warm-up absorbs).
   Beside them, in the same process and the same loop, transformers' ``LlamaForCausalLM`` with
   each preset's vocabulary, width, layers, heads and MLP width (the builder of
   tests/perf/train_speed.py; ``--no-llama`` leaves it out): ``vs llama`` is its median step
   over ours (> 1: ours is faster).
2. **Evaluation at 16L**: each preset and position scores one ``--eval-multiple`` (16) x
   ``--seq`` token sequence (batch 1, bf16, no_grad) through the chunked head
   (``forward(targets=...)``, what lenbench's evaluation runs): seconds of the second call (the
   first warms up and compiles), tokens/s, peak memory, and the mean NLL (must be finite).
3. **Longest length**: a Llama of Llama 3.2 1B's shapes (16 layers, width 2048, vocabulary
   128,256; random weights, bf16) through lenbench's pretrained adapter: per-token NLL with
   chunked scoring (``forward(targets=...)``, batch 1) at doubling lengths from ``--from-length``
   until the GPU runs out of memory or ``--max-length``; prints each length's peak memory and the
   longest that ran. The same with full logits (``--full-logits``) shows what chunking buys.

Run from the repository root after ``pip install -e ".[dev]"``; prints tables with the machine
line and writes results/perf/gpu_speed.json (measured figures: tests/perf/README.md, GPU)::

    python tests/perf/gpu_speed.py
    python tests/perf/gpu_speed.py --presets small --positions rope --skip-length
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

RESULTS = Path("results") / "perf"
CONF = Path(__file__).resolve().parents[2] / "conf" / "model"


def model_config(preset: str):
    """conf/model/<preset>.yaml (with its tiny defaults) as a ModelConfig."""
    from omegaconf import OmegaConf

    from models.transformer import ModelConfig

    values = OmegaConf.to_container(OmegaConf.load(CONF / "tiny.yaml"))
    if preset != "tiny":
        override = OmegaConf.to_container(OmegaConf.load(CONF / f"{preset}.yaml"))
        override.pop("defaults", None)
        values.update(override)
    return ModelConfig(**values)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device: str) -> float | None:
    """Peak GPU memory since the last reset; None on a CPU (measured there by eval_memory.py)."""
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} GiB"


def _timed_training(model: torch.nn.Module, hf: bool, args: argparse.Namespace, vocab: int) -> dict:
    """Median training step (AdamW, bf16 autocast, ``--batch`` x ``--seq`` random tokens) and peak
    memory of ``model``; ``hf``: a transformers model (``input_ids=``, no cache)."""
    device = args.device
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.startswith("cuda"))
    batch = torch.randint(0, vocab, (args.batch, args.seq + 1), device=device)
    _reset_peak(device)
    times = []
    for i in range(args.warmup + args.steps):
        _sync(device)
        start = time.perf_counter()
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            inputs = batch[:, :-1]
            logits = model(input_ids=inputs, use_cache=False).logits if hf else model(inputs).logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    del optimizer
    return {"median_step_s": statistics.median(times), "peak_gib": _peak_gib(device)}


def llama_at_equal_dims(cfg, seq: int) -> torch.nn.Module:
    """transformers' LlamaForCausalLM with the preset's vocabulary, width, layers, heads and MLP
    width (tests/perf/train_speed.py's builder: SwiGLU, RMSNorm, tied embeddings, SDPA)."""
    from types import SimpleNamespace

    from train_speed import VOCAB, build_llama

    from models.positions import PositionConfig

    if cfg.vocab_size != VOCAB or cfg.kv_heads != cfg.n_heads:
        raise ValueError(f"the Llama builder assumes vocabulary {VOCAB} and no GQA, got {cfg}")
    dims = SimpleNamespace(
        width=cfg.d_model, layers=cfg.n_layers, heads=cfg.n_heads, seq=seq,
        base=PositionConfig(kind="rope").base,
    )  # fmt: skip
    return build_llama(dims, SimpleNamespace(model_cfg=cfg))


def train_speed(preset: str, position: str, args: argparse.Namespace, peak: float) -> dict:
    """One training row: our DecoderLM of ``position``, or transformers' Llama at the preset's
    dimensions for ``position`` = ``llama``."""
    from flops import causal_keys, forward_flops_per_token, matmul_params

    from models.positions import PositionConfig
    from models.transformer import DecoderLM

    torch.manual_seed(0)
    cfg = model_config(preset)
    hf = position == "llama"
    if hf:
        model = llama_at_equal_dims(cfg, args.seq)
    else:
        model = DecoderLM(cfg, PositionConfig(kind=position), args.seq)
    model = model.to(args.device).train()
    timed = _timed_training(model, hf, args, cfg.vocab_size)
    step = timed["median_step_s"]
    tokens = args.batch * args.seq
    flops = 3 * forward_flops_per_token(
        matmul_params(model), cfg.n_layers, cfg.d_model, causal_keys(args.seq)
    )
    result = {
        "preset": preset,
        "position": position,
        "params": sum(p.numel() for p in model.parameters()),
        "seq": args.seq,
        "batch": args.batch,
        "tokens_per_s": tokens / step,
        "median_step_s": step,
        "tflops": flops * tokens / step / 1e12,
        "mfu": flops * tokens / step / 1e9 / peak,
        "peak_gib": timed["peak_gib"],
    }
    del model
    _reset_peak(args.device)
    return result


def eval_speed(preset: str, position: str, args: argparse.Namespace) -> dict:
    """Per-token NLL of one ``--eval-multiple`` x ``--seq``-token sequence (batch 1, bf16, no_grad)
    through the chunked head (``forward(targets=...)``), as lenbench's evaluation scores: seconds
    of the second call (the first warms up and compiles), tokens/s and peak memory."""
    from models.positions import PositionConfig
    from models.transformer import DecoderLM

    torch.manual_seed(0)
    cfg = model_config(preset)
    device = args.device
    model = DecoderLM(cfg, PositionConfig(kind=position), args.seq).to(device).eval()
    length = args.eval_multiple * args.seq
    ids = torch.randint(0, cfg.vocab_size, (1, length + 1), device=device)
    seconds = nll = None
    for _ in range(2):
        _reset_peak(device)
        _sync(device)
        start = time.perf_counter()
        with torch.no_grad(), torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            nll = model(ids[:, :-1], targets=ids[:, 1:]).token_nll
        _sync(device)
        seconds = time.perf_counter() - start
    mean_nll = float(nll.float().mean())
    if not math.isfinite(mean_nll):
        raise RuntimeError(f"{preset} {position}: the NLL at {length} tokens is {mean_nll}")
    result = {
        "preset": preset,
        "position": position,
        "length": length,
        "seconds": seconds,
        "tokens_per_s": length / seconds,
        "peak_gib": _peak_gib(device),
        "mean_nll": mean_nll,
    }
    del model
    _reset_peak(device)
    return result


def longest_length(args: argparse.Namespace, chunked: bool, layers: int = 16) -> list[dict]:
    from eval_memory import ONE_B
    from transformers import LlamaConfig, LlamaForCausalLM

    from bench.pretrained.adapter import PretrainedLM

    torch.manual_seed(0)
    device = args.device
    shape = {**ONE_B, "max_position_embeddings": args.max_length, "num_hidden_layers": layers}
    hf = LlamaForCausalLM(LlamaConfig(**shape)).to(torch.bfloat16).to(device).eval()
    lm = PretrainedLM(hf, None, 8192)
    rows, length = [], args.from_length
    while length <= args.max_length:
        ids = torch.randint(0, 32000, (1, length + 1), device=device)
        _reset_peak(device)
        try:
            _sync(device)
            start = time.perf_counter()
            with torch.no_grad():
                if chunked:
                    nll = lm(ids[:, :-1], targets=ids[:, 1:]).token_nll
                else:
                    logits = lm(ids[:, :-1]).logits
                    nll = F.cross_entropy(logits.flatten(0, 1), ids[0, 1:], reduction="none")
            _sync(device)
            rows.append(
                {
                    "scoring": "chunked" if chunked else "full",
                    "length": length,
                    "ok": True,
                    "seconds": time.perf_counter() - start,
                    "peak_gib": _peak_gib(device),
                    "mean_nll": float(nll.float().mean()),
                }
            )
            del nll
        except torch.OutOfMemoryError:
            rows.append(
                {"scoring": "chunked" if chunked else "full", "length": length, "ok": False}
            )
            break
        print(rows[-1], flush=True)
        length *= 2
    del lm, hf
    _reset_peak(device)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="small,base")
    parser.add_argument("--positions", default="rope,alibi")
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--from-length", type=int, default=8192)
    parser.add_argument("--max-length", type=int, default=1 << 18)
    parser.add_argument("--full-logits", action="store_true", help="also the full-logit lengths")
    parser.add_argument("--skip-length", action="store_true", help="no 1B-shaped Llama lengths")
    parser.add_argument(
        "--no-llama", action="store_true", help="no transformers Llama at the presets' dimensions"
    )
    parser.add_argument("--eval-multiple", type=int, default=16, help="eval length / --seq")
    parser.add_argument("--skip-eval", action="store_true", help="no eval at --eval-multiple")
    parser.add_argument("--out", default=str(RESULTS / "gpu_speed.json"))
    parser.add_argument(
        "--device",
        default="cuda",
        help="cuda; cpu only to check the script (e.g. --presets tiny --seq 64 --batch 2 "
        "--from-length 64 --max-length 128 --layers 1)",
    )
    parser.add_argument("--layers", type=int, default=16, help="layers of the 1B-shaped Llama")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("gpu_speed.py needs a CUDA GPU; none is visible (torch.cuda.is_available()).")
    from flops import gemm_peak_gflops

    from bench.core.runtime import machine_line, machine_summary

    machine = machine_line(machine_summary())
    if args.device.startswith("cuda"):
        machine += f"; GPU {torch.cuda.get_device_name()}"
        peak = gemm_peak_gflops("cuda:bf16")
    else:
        peak = gemm_peak_gflops("bf16")
    print(f"machine: {machine}\nbf16 GEMM peak (torch.mm 2048^3): {peak / 1e3:.0f} TFLOP/s")
    training, evals = [], []
    for preset in args.presets.split(","):
        names = args.positions.split(",") + ([] if args.no_llama else ["llama"])
        rows = [train_speed(preset, name, args, peak) for name in names]
        llama_step = rows[-1]["median_step_s"] if not args.no_llama else None
        for row in rows:
            if llama_step is not None:  # > 1: ours is faster than Llama at equal dimensions
                row["vs_llama"] = llama_step / row["median_step_s"]
            training.append(row)
            print(
                f"{preset:6} {row['position']:6} params {row['params'] / 1e6:6.1f}M  "
                f"{row['tokens_per_s']:>10,.0f} tok/s  {row['tflops']:6.1f} TFLOP/s  "
                f"MFU {row['mfu']:.0%}  peak {_gib(row['peak_gib'])}"
                + (f"  vs llama {row['vs_llama']:.2f}x" if "vs_llama" in row else ""),
                flush=True,
            )
        for position in [] if args.skip_eval else args.positions.split(","):
            row = eval_speed(preset, position, args)
            evals.append(row)
            print(
                f"{preset:6} {position:6} eval at {row['length']:,} tokens (chunked head): "
                f"{row['seconds']:.2f} s  {row['tokens_per_s']:>10,.0f} tok/s  "
                f"peak {_gib(row['peak_gib'])}  mean NLL {row['mean_nll']:.3f}",
                flush=True,
            )
    lengths = []
    if not args.skip_length:
        lengths += longest_length(args, chunked=True, layers=args.layers)
        if args.full_logits:
            lengths += longest_length(args, chunked=False, layers=args.layers)
        for scoring in ("chunked", "full"):
            ran = [r["length"] for r in lengths if r["scoring"] == scoring and r["ok"]]
            if ran:
                print(f"1B-shaped Llama, bf16, {scoring} scoring: longest length run {max(ran):,}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": machine,
                "bf16_peak_gflops": peak,
                "training": training,
                "eval": evals,
                "lengths": lengths,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
