"""Training throughput and peak memory of our DecoderLM against transformers' LlamaForCausalLM.

Both models get identical dimensions (RoPE "half" layout, SwiGLU, RMSNorm, tied embeddings, no
biases), batches, loss and AdamW step, in one process. Before timing, Llama is loaded with our
weights and the logits are compared (``parity_max_abs_diff``), so "identical" is checked, not
assumed. Our model is timed for each position family asked for (``--positions``), optionally
also under ``torch.compile`` (``--compile``, as ``train.compile=true`` does, and Llama compiled,
the alternative a user would pick); steps go round-robin
over the models so that load from other processes hits all alike; tokens/s uses the median step
time, and ``vs llama`` (``vs llama+compile``) is Llama's (compiled Llama's) median step time over
ours. ``GFLOP/s`` are model FLOPs (tests/perf/flops.py: 6 N + 12 n_layers d_model (T+1)/2 per token)
per second of the median step, ``% peak`` their share of this machine's measured GEMM peak in the
same precision. Peak memory: ``torch.cuda.max_memory_allocated`` on
CUDA; on CPU the sampled peak RSS above the RSS right before the model is built.

Run from the repository root after ``pip install -e ".[dev]"`` (pytest does not collect the
scripts in tests/perf/: none is named test_*.py); prints a table and writes
results/perf/train_speed_<config>.json (measured figures: tests/perf/README.md)::

    python tests/perf/train_speed.py --width 128
    python tests/perf/train_speed.py --layers 2 --width 64 --heads 2 --positions rope,alibi --compile
    python tests/perf/train_speed.py --width 256 --precisions fp32,bf16 --steps 8
    python tests/perf/train_speed.py --seq 64 --batch 32 --precisions fp32 \
        --positions rope,alibi,t5,kerple_log,kerple_power,fire,sandwich,p_rope,xpos,cope
    python tests/perf/train_speed.py --layers 2 --width 128 --seq 64 --batch 32 --kernel-share

``--kernel-share`` also profiles Llama's step and prints the share of its time in GEMMs and in
SDPA's fused attention kernels (profiled self time per step over its unprofiled median step): a
model that does Llama's FLOPs through the same kernels cannot be faster than Llama by more than
step / (GEMM + attention), whatever else it removes.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from models.model_config import ATTENTIONS
from models.positions import PositionConfig, families
from models.transformer import DecoderLM, ModelConfig

#: Output directory, relative to the working directory (like lenbench's paths.results).
RESULTS = Path("results") / "perf"
VOCAB = 259
#: every registered position family (the zoo's included)
FAMILIES = tuple(families())


def build_ours(args: argparse.Namespace, kind: str = "rope") -> DecoderLM:
    """Our model of position ``kind``, or ``<kind>:<attention>`` for a ``model.attention``."""
    kind, _, attention = kind.partition(":")
    cfg = ModelConfig(
        attention=attention or "softmax",
        vocab_size=VOCAB,
        n_layers=args.layers,
        d_model=args.width,
        n_heads=args.heads,
        mlp="swiglu",
        norm="rms",
        tie_embeddings=True,
    )
    position = PositionConfig(kind=kind, base=args.base, layout="half")
    return DecoderLM(cfg, position, args.seq)


def build_llama(args: argparse.Namespace, ours: DecoderLM) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=args.width,
        intermediate_size=ours.model_cfg.ff_width,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=args.seq,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": float(args.base)},
        rms_norm_eps=torch.finfo(torch.float32).eps,  # what nn.RMSNorm(eps=None) uses
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        bos_token_id=256,
        eos_token_id=257,
        pad_token_id=258,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg)


def copy_weights(ours: DecoderLM, llama: torch.nn.Module) -> None:
    """Load our weights into the Llama model (our fused kv/gate-up projections are split)."""
    d = ours.model_cfg.d_model
    ff = ours.model_cfg.ff_width
    with torch.no_grad():
        llama.model.embed_tokens.weight.copy_(ours.tok_emb.weight)
        llama.model.norm.weight.copy_(ours.final_norm.weight)
        for block, layer in zip(ours.blocks, llama.model.layers, strict=True):
            layer.input_layernorm.weight.copy_(block.attn_norm.weight)
            layer.post_attention_layernorm.weight.copy_(block.mlp_norm.weight)
            layer.self_attn.q_proj.weight.copy_(block.attn.q_proj.weight)
            layer.self_attn.k_proj.weight.copy_(block.attn.kv_proj.weight[:d])
            layer.self_attn.v_proj.weight.copy_(block.attn.kv_proj.weight[d:])
            layer.self_attn.o_proj.weight.copy_(block.attn.o_proj.weight)
            layer.mlp.gate_proj.weight.copy_(block.mlp.up.weight[:ff])
            layer.mlp.up_proj.weight.copy_(block.mlp.up.weight[ff:])
            layer.mlp.down_proj.weight.copy_(block.mlp.down.weight)


def logits_of(model: torch.nn.Module, tokens: torch.Tensor, reference: bool) -> torch.Tensor:
    if reference:
        return model(input_ids=tokens, use_cache=False).logits
    return model(tokens).logits


def make_step(
    model: torch.nn.Module, name: str, precision: str, device: torch.device
) -> Callable[[torch.Tensor], None]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    reference = name.removesuffix("+compile") == "llama"
    forward = compiled_if_asked(model, name)
    autocast = (
        (lambda: torch.autocast(device.type, dtype=torch.bfloat16))
        if precision == "bf16"
        else contextlib.nullcontext
    )

    def step(batch: torch.Tensor) -> None:
        with autocast():
            logits = logits_of(forward, batch[:, :-1], reference)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), batch[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release_memory() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PeakRSS:
    """Peak resident set size while active, sampled by a thread (CPU memory)."""

    def __init__(self, interval: float = 0.002):
        import psutil

        self.process, self.interval = psutil.Process(), interval
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self) -> PeakRSS:
        self.peak = self.process.memory_info().rss
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.interval)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def build(args: argparse.Namespace, name: str, device: torch.device) -> torch.nn.Module:
    """``llama[+compile]`` (the reference, with our RoPE model's weights) or
    ``<family>[+compile]`` (ours)."""
    torch.manual_seed(0)
    kind = name.removesuffix("+compile")
    ours = build_ours(args, "rope" if kind == "llama" else kind)
    if kind != "llama":
        return ours.to(device).train()
    llama = build_llama(args, ours)
    copy_weights(ours, llama)
    return llama.to(device).train()


def compiled_if_asked(model: torch.nn.Module, name: str) -> torch.nn.Module:
    """The module a step calls: the model itself, or torch.compile(model) as bench.train.trainer does."""
    if not name.endswith("+compile"):
        return model
    from bench.train.trainer import compiled

    return compiled(model)


def peak_memory_mb(
    args: argparse.Namespace,
    name: str,
    precision: str,
    device: torch.device,
    batches: list[torch.Tensor],
) -> float:
    """Peak memory (MiB) of building the model and running a few training steps."""
    release_memory()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        model = build(args, name, device)
        step = make_step(model, name, precision, device)
        for batch in batches[:3]:
            step(batch)
        sync(device)
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        with PeakRSS() as rss:
            base = rss.peak
            model = build(args, name, device)
            step = make_step(model, name, precision, device)
            for batch in batches[:3]:
                step(batch)
        peak = rss.peak - base
    del model, step
    release_memory()
    return peak / 2**20


def parity(args: argparse.Namespace, device: torch.device, batch: torch.Tensor) -> float:
    """max |logits ours - logits llama| with identical weights, fp32, eval mode."""
    ours = build(args, "rope", device).eval()
    llama = build(args, "llama", device).eval()
    with torch.no_grad():
        diff = (logits_of(ours, batch[:, :-1], False) - logits_of(llama, batch[:, :-1], True)).abs()
    return float(diff.max())


def throughput(
    args: argparse.Namespace,
    names: list[str],
    precision: str,
    device: torch.device,
    batches: list[torch.Tensor],
) -> dict[str, list[float]]:
    """Per-step seconds of each model, round-robin step by step (the order rotates each round)
    so that load from other processes hits all alike."""
    models = {name: build(args, name, device) for name in names}
    steps = {name: make_step(model, name, precision, device) for name, model in models.items()}
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(args.warmup + args.steps):
        batch = batches[i % len(batches)]
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            sync(device)
            start = time.perf_counter()
            steps[name](batch)
            sync(device)
            if i >= args.warmup:
                times[name].append(time.perf_counter() - start)
        print(
            f"  {precision} round {i + 1}/{args.warmup + args.steps}"
            + ("" if i >= args.warmup else " (warmup)"),
            file=sys.stderr,
            flush=True,
        )
    return times


#: Profiler keys of the kernels that a model with Llama's FLOPs has to run as well.
GEMM_KERNELS = ("aten::mm", "aten::bmm", "aten::addmm")


def llama_kernel_share(
    args: argparse.Namespace,
    precision: str,
    device: torch.device,
    batches: list[torch.Tensor],
    step_s: float,
) -> dict:
    """Time per Llama training step in GEMMs and in SDPA's fused kernels, as shares of ``step_s``.

    ``step_s`` is Llama's unprofiled median step (wall clock) from the throughput run; the kernel
    times come from a profile of the same step (self time per step). A model with Llama's FLOPs
    that runs them through the same GEMM and attention kernels can at most remove the rest, so
    ``bound`` = step_s / (GEMM + attention) caps its speed-up over Llama.
    """
    from torch.profiler import ProfilerActivity, profile

    model = build(args, "llama", device)
    step = make_step(model, "llama", precision, device)
    for batch in batches[:2]:
        step(batch)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for batch in batches:
            step(batch)
        sync(device)
    on_device = device.type == "cuda"

    def seconds_per_step(keep: Callable[[str], bool]) -> float:
        micros = sum(
            e.self_device_time_total if on_device else e.self_cpu_time_total
            for e in prof.key_averages()
            if keep(e.key)
        )
        return micros / 1e6 / len(batches)

    gemm = seconds_per_step(lambda key: key in GEMM_KERNELS)
    attention = seconds_per_step(lambda key: "scaled_dot_product" in key)
    del model, step
    release_memory()
    return {
        "precision": precision,
        "step_s": step_s,
        "gemm_s": gemm,
        "attention_s": attention,
        "gemm": gemm / step_s,
        "attention": attention / step_s,
        "rest": 1 - (gemm + attention) / step_s,
        "bound": step_s / (gemm + attention),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per model and precision")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before timing")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precisions", default="fp32,bf16", help="comma list of fp32, bf16")
    parser.add_argument(
        "--positions", default="rope", help=f"comma list of our families: {', '.join(FAMILIES)}"
    )
    parser.add_argument(
        "--compile", action="store_true", help="also time each family under torch.compile"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--base", type=float, default=10000.0, help="RoPE base")
    parser.add_argument(
        "--kernel-share",
        action="store_true",
        help="also profile Llama's step: its share in GEMM and fused-attention kernels, and the "
        "speed-up over Llama that a model with the same FLOPs and kernels cannot exceed",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    bad = [p for p in precisions if p not in ("fp32", "bf16")]
    if bad:
        parser.error(f"--precisions {bad} unknown; allowed values are fp32, bf16.")
    families = [p.strip() for p in args.positions.split(",") if p.strip()]
    bad = [
        p
        for p in families
        if p.partition(":")[0] not in FAMILIES or p.partition(":")[2] not in ("", *ATTENTIONS)
    ]
    if bad or not families:
        parser.error(
            f"--positions {args.positions!r}: allowed values are {', '.join(FAMILIES)}, each "
            f"optionally :<model.attention> ({', '.join(ATTENTIONS)})."
        )
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    compiled_names = ["llama+compile", *(f"{f}+compile" for f in families)]
    names = ["llama", *families, *(compiled_names if args.compile else [])]

    import transformers

    from bench.core.runtime import machine_line, machine_summary

    generator = torch.Generator().manual_seed(1234)
    batches = [
        torch.randint(0, 256, (args.batch, args.seq + 1), generator=generator).to(device)
        for _ in range(4)
    ]
    load_before = os.getloadavg()
    max_diff = parity(args, device, batches[0][:2])
    print(f"parity: max |logits ours - llama| = {max_diff:.2e}", file=sys.stderr)
    from flops import causal_keys, forward_flops_per_token, gemm_peak_gflops, matmul_params

    rows = []
    tokens_per_step = args.batch * args.seq
    # model FLOPs per token of a training step (flops.py: 3 x forward, PaLM's convention); the
    # position families' own work is not counted, so every row's FLOPs are Llama's
    ours = build_ours(args)
    step_flops = 3 * forward_flops_per_token(
        matmul_params(ours), args.layers, args.width, causal_keys(args.seq)
    )
    peak_device = "cuda:" if device.type == "cuda" else ""
    for precision in precisions:
        times = throughput(args, names, precision, device, batches)
        reference = statistics.median(times["llama"])
        compiled_reference = statistics.median(times.get("llama+compile", [float("nan")]))
        peak = gemm_peak_gflops(peak_device + precision, args.threads)
        for name in names:
            median = statistics.median(times[name])
            gflops = step_flops * tokens_per_step / median / 1e9
            rows.append(
                {
                    "model": name,
                    "precision": precision,
                    "tokens_per_s": tokens_per_step / median,
                    "median_step_s": median,
                    "gflops": gflops,
                    "share_of_peak": gflops / peak,
                    "gemm_peak_gflops": peak,
                    "vs_llama": reference / median,
                    "vs_llama_compiled": compiled_reference / median,
                    "step_s": times[name],
                    "peak_mem_mib": peak_memory_mb(args, name, precision, device, batches),
                }
            )
    shares = (
        [
            llama_kernel_share(args, row["precision"], device, batches, row["median_step_s"])
            for row in rows
            if row["model"] == "llama"
        ]
        if args.kernel_share
        else []
    )
    n_params = build_ours(args).num_parameters()
    machine = machine_summary()
    result = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "n_params": n_params,
        "parity_max_abs_diff": max_diff,
        "rows": rows,
        "llama_kernel_share": shares,
        "machine": machine,
        "env": {
            "transformers": transformers.__version__,
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        },
    }
    print(
        f"\nDecoderLM vs LlamaForCausalLM: layers={args.layers} width={args.width} "
        f"heads={args.heads} ff={build_ours(args).model_cfg.ff_width} seq={args.seq} "
        f"batch={args.batch} device={device} params={n_params:,} parity={max_diff:.1e}\n"
        f"machine: {machine_line(machine)}\n"
        f"load average before/after: {load_before[0]:.2f} / {os.getloadavg()[0]:.2f}"
    )
    print(
        f"model FLOPs per token of a training step: {step_flops:,.0f} (tests/perf/flops.py); "
        + ", ".join(
            f"GEMM peak {p}: {gemm_peak_gflops(peak_device + p, args.threads):.1f} GFLOP/s"
            for p in precisions
        )
    )
    print(
        f"{'precision':<9} {'model':<20} {'tokens/s':>10} {'step s':>8} {'GFLOP/s':>8} "
        f"{'% peak':>7} {'vs llama':>9} {'vs llama+compile':>17} {'peak MiB':>9}"
    )
    for row in rows:
        print(
            f"{row['precision']:<9} {row['model']:<20} {row['tokens_per_s']:>10,.0f} "
            f"{row['median_step_s']:>8.4f} {row['gflops']:>8.1f} {row['share_of_peak']:>7.0%} "
            f"{row['vs_llama']:>8.2f}x {row['vs_llama_compiled']:>16.2f}x "
            f"{row['peak_mem_mib']:>9.1f}"
        )
    for share in shares:
        print(
            f"{share['precision']} llama step {share['step_s']:.4f} s: GEMM {share['gemm']:.0%}, "
            f"fused attention {share['attention']:.0%}, rest {share['rest']:.0%} -> a model "
            f"with Llama's FLOPs and kernels is at most {share['bound']:.2f}x faster than Llama"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    name = (
        f"train_speed_L{args.layers}_D{args.width}_H{args.heads}_S{args.seq}_B{args.batch}_"
        f"{device.type}.json"
    )
    path = args.out / name
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
