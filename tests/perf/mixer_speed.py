"""CPU cost of a training step per token mixer (issue #75 Part B): the recurrent mixers of
``models.mixers`` beside a plain causal attention block of the same width.

Every model is the same pre-norm decoder (RMSNorm, SwiGLU MLP of width 8/3 D rounded to 32, tied
embeddings, byte vocabulary 259) and differs only in its token mixer:

- ``attention``: q, k, v, o projections and causal ``F.scaled_dot_product_attention``, no position
  encoding (the baseline: plain causal attention of the same width);
- ``gated_deltanet``, ``mamba2``, ``kda``: the mixers at their defaults from ``models.mixers``;
- ``<mixer>/<k>``: the hybrid, attention every k-th layer (layers k-1, 2k-1, ...) and the mixer
  elsewhere (``gated_deltanet/4``: Qwen3-Next's and Olmo Hybrid's 3 : 1).

A step is forward, cross-entropy, backward and an AdamW update on one random batch. Steps go
round-robin over the models (so load from other processes hits all alike), after ``--warmup``
untimed rounds; the table gives the median step, its min and max, tokens/s
at the median, the median over attention's and the parameter count. Prints the machine line, the
load average before and after, the table, and writes
results/perf/mixer_speed.json (measured figures: tests/perf/README.md)::

    python tests/perf/mixer_speed.py                       # 4 layers, width 128, L 128, batch 16
    python tests/perf/mixer_speed.py --seq 256 --batch 8 --models attention,gated_deltanet

``--decode``: greedy decoding instead, through lenbench's own model (``models.transformer``
``DecoderLM.generate_greedy``, its KV cache): ``--new`` tokens after a ``--prompt``-token prompt
per model (batch 1 unless ``--batch``), each mixer both from its recurrent state (``stateful``,
what a model does) and by reading the whole prefix again for every token (``recompute``, the
cache before the state: ``Block.stateful = False``); attention (RoPE) keeps its keys and values.
Reports the prefill, the ms per decoded token and the whole call (median over ``--repeats``
interleaved rounds), to results/perf/mixer_decode.json::

    python tests/perf/mixer_speed.py --decode --prompt 1024 --new 64 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.mixers import GatedDeltaNet, KimiDeltaAttention, Mamba2

RESULTS = Path("results") / "perf"
VOCAB = 259
MODELS = ("attention", "gated_deltanet", "mamba2", "kda", "gated_deltanet/4")


class CausalAttention(nn.Module):
    """The baseline mixer: multi-head causal softmax attention, no positions."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, length, width = x.shape
        q, k, v = self.qkv(x).view(n, length, 3, self.n_heads, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [N, H, L, d]
        return self.o_proj(y.transpose(1, 2).reshape(n, length, width))


MIXERS: dict[str, Callable[[int, int], nn.Module]] = {
    "attention": CausalAttention,
    "gated_deltanet": GatedDeltaNet,
    "kda": KimiDeltaAttention,
    "mamba2": lambda d_model, n_heads: Mamba2(d_model, head_dim=d_model // n_heads),
}


class Block(nn.Module):
    def __init__(self, mixer: nn.Module, d_model: int):
        super().__init__()
        hidden = 32 * round(8 * d_model / 3 / 32)
        self.mixer_norm, self.mixer = nn.RMSNorm(d_model), mixer
        self.mlp_norm = nn.RMSNorm(d_model)
        self.up = nn.Linear(d_model, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mixer(self.mixer_norm(x))
        gate, up = self.up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class TinyLM(nn.Module):
    def __init__(self, name: str, layers: int, d_model: int, n_heads: int):
        super().__init__()
        mixer, _, every = name.partition("/")
        if mixer not in MIXERS or (every and not every.isdigit()):
            raise SystemExit(f"unknown model {name!r}: one of {sorted(MIXERS)}, or <mixer>/<k>")
        k = int(every) if every else 0
        kinds = ["attention" if k and (i + 1) % k == 0 else mixer for i in range(layers)]
        self.emb = nn.Embedding(VOCAB, d_model)
        self.blocks = nn.ModuleList(Block(MIXERS[m](d_model, n_heads), d_model) for m in kinds)
        self.norm = nn.RMSNorm(d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.emb.weight.T  # tied head, [N, L, V]


def _step(model: TinyLM, opt: torch.optim.Optimizer, tokens: torch.Tensor) -> float:
    start = time.perf_counter()
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - start


def _decoder(name: str, layers: int, width: int, heads: int, length: int):
    """lenbench's DecoderLM with ``name`` (a model of MODELS) on its layers: a mixer alone
    position=nope, attention or a hybrid with RoPE."""
    from models.positions import PositionConfig
    from models.transformer import DecoderLM, ModelConfig

    mixer, _, every = name.partition("/")
    cfg = ModelConfig(n_layers=layers, d_model=width, n_heads=heads, mixer=mixer,
                      hybrid_every=int(every or 0))  # fmt: skip
    kind = "nope" if mixer != "attention" and not every else "rope"
    return DecoderLM(cfg, PositionConfig(kind=kind), length).eval()


def _decode_times(model, prompt: torch.Tensor, new: int) -> tuple[float, float]:
    """(seconds of the prefill alone, of generate_greedy's whole call) for ``new`` tokens."""
    with torch.no_grad():
        start = time.perf_counter()
        model(prompt, use_cache=True, logits_from=prompt.shape[1] - 1)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        model.generate_greedy(prompt, max_new_tokens=new)
        return prefill, time.perf_counter() - start


def decode_main(args: argparse.Namespace, machine: str, load: float) -> None:
    """--decode: greedy decoding per model, stateful vs recompute for the mixers."""
    torch.manual_seed(0)
    runs = {}  # "<model> <path>" -> (model, recompute?)
    for name in args.models.split(","):
        model = _decoder(name, args.layers, args.width, args.heads, args.prompt + args.new)
        paths = ("kv cache",) if name == "attention" else ("stateful", "recompute")
        for path in paths:
            runs[f"{name} {path}"] = model, path == "recompute"
    prompt = torch.randint(0, VOCAB, (args.batch, args.prompt))
    times: dict[str, list[tuple[float, float]]] = {key: [] for key in runs}
    for round_ in range(args.warmup + args.repeats):
        for key, (model, recompute) in runs.items():  # interleaved: load hits every run alike
            for block in model.blocks:
                block.stateful = block.mixer is not None and not recompute
            measured = _decode_times(model, prompt, args.new)
            print(f"round {round_}: {key} {measured[1]:.2f} s", flush=True)  # progress
            if round_ >= args.warmup:
                times[key].append(measured)
    rows = []
    print(f"{'model':<32} {'prefill ms':>10} {'ms/token':>9} {'whole s':>8} {'min s':>7}")
    for key, measured in times.items():
        prefill = statistics.median(p for p, _ in measured)
        whole = statistics.median(w for _, w in measured)
        per_token = 1e3 * (whole - prefill) / max(args.new - 1, 1)  # new - 1 cached steps
        row = {"run": key, "prefill_ms": 1e3 * prefill, "ms_per_token": per_token,
               "whole_s": whole, "min_whole_s": min(w for _, w in measured)}  # fmt: skip
        rows.append(row)
        print(f"{key:<32} {row['prefill_ms']:10.1f} {per_token:9.2f} {whole:8.2f} "
              f"{row['min_whole_s']:7.2f}")  # fmt: skip
    print(f"load after {os.getloadavg()[0]:.1f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "mixer_decode.json"
    record = {"machine": machine, "load_before": load, "args": vars(args), "rows": rows}
    out.write_text(json.dumps(record, indent=2))
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=None, help="16; --decode: 1")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decode", action="store_true", help="greedy decoding (see above)")
    parser.add_argument("--prompt", type=int, default=1024, help="--decode: prompt length")
    parser.add_argument("--new", type=int, default=64, help="--decode: tokens generated")
    args = parser.parse_args()
    from bench.core.runtime import machine_line, machine_summary

    torch.set_num_threads(args.threads)
    machine = machine_line(machine_summary())
    load = os.getloadavg()[0]
    print(f"machine: {machine}; load before {load:.1f}")
    if args.decode:
        args.batch = args.batch or 1  # one sequence decoded: the figure per sequence
        return decode_main(args, machine, load)
    args.batch = args.batch or 16
    torch.manual_seed(0)
    names = args.models.split(",")
    models = {n: TinyLM(n, args.layers, args.width, args.heads) for n in names}
    opts = {n: torch.optim.AdamW(m.parameters(), lr=1e-4) for n, m in models.items()}
    tokens = torch.randint(0, VOCAB, (args.batch, args.seq + 1))
    times: dict[str, list[float]] = {n: [] for n in names}
    for round_ in range(args.warmup + args.repeats):
        for n in names:  # interleaved: one step of each model per round
            t = _step(models[n], opts[n], tokens)
            if round_ >= args.warmup:
                times[n].append(t)
    base = statistics.median(times.get("attention", times[names[0]]))
    rows = []
    print(
        f"{'model':<18} {'median ms':>9} {'min':>7} {'max':>7} {'tok/s':>8} {'vs attn':>7} params"
    )
    for n in names:
        med = statistics.median(times[n])
        row = {
            "model": n, "median_ms": 1e3 * med, "min_ms": 1e3 * min(times[n]),
            "max_ms": 1e3 * max(times[n]), "tokens_per_s": args.batch * args.seq / med,
            "vs_attention": med / base, "params": sum(p.numel() for p in models[n].parameters()),
        }  # fmt: skip
        rows.append(row)
        print(
            f"{n:<18} {row['median_ms']:9.1f} {row['min_ms']:7.1f} {row['max_ms']:7.1f} "
            f"{row['tokens_per_s']:8.0f} {row['vs_attention']:7.2f} {row['params']}"
        )
    print(f"load after {os.getloadavg()[0]:.1f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "mixer_speed.json"
    out.write_text(
        json.dumps(
            {"machine": machine, "load_before": load, "args": vars(args), "rows": rows}, indent=2
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
