"""Peak memory of evaluation against length: chunked scoring beside full-vocabulary logits.

Each (model, length, scoring) runs ``evaluate_model`` with the nll metric only (2 documents of
random tokens, batch 1, the window at that length) in a fresh subprocess, so its peak RSS is its
own. Reported per cell: the process's peak RSS (VmHWM) and its growth over the RSS just before
evaluating (model built and warmed up), in MiB. ``full`` is the reference path (per-token NLL from
the full [N, L, V] logits, ``EvalContext(chunked_scoring=False)``), ``chunked`` what lenbench runs
(``models.scoring``). Models, random weights (memory does not depend on what they learned):

- ``llama32k``: a transformers Llama, 2 layers, width 64, 4 heads, vocabulary 32,000, trained
  length 512, loaded through lenbench's pretrained adapter (``bench.pretrained``);
- ``ours``: lenbench's DecoderLM, rope, 4 layers, width 128, byte vocabulary (259), trained
  length 256; ``ours_rnope_swa`` and ``ours_irope`` the same model as RNoPE-SWA and iRoPE
  (3 windowed or chunked RoPE layers and one NoPE layer, window and chunk 64);
- ``llama1b`` (``--one-b``): Llama 3.2 1B's shapes (width 2048, 32 heads, 8 key/value heads, MLP
  8192, vocabulary 128,256, tied) with 2 of its 16 layers, chunked only: its growth per token
  (a least-squares line through the lengths) and the 1B model's weights give the longest length
  a machine of ``--budget-gib`` can evaluate (no_grad: one layer's activations are alive at a
  time, so the per-token cost does not grow with the number of layers; the hidden states are).

Run from the repository root after ``pip install -e ".[dev]"``; writes
results/perf/eval_memory.json (measured figures: tests/perf/README.md)::

    python tests/perf/eval_memory.py
    python tests/perf/eval_memory.py --models llama32k --multiples 1,16 --one-b
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

RESULTS = Path("results") / "perf"
MODELS = {
    "llama32k": 512,
    "ours": 256,
    "ours_rnope_swa": 256,
    "ours_irope": 256,
}  # -> trained length
ONE_B = {  # Llama 3.2 1B (meta-llama/Llama-3.2-1B config.json)
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": True,
    "max_position_embeddings": 131072,
}
ONE_B_LAYERS_BUILT = 2


def _build(name: str):
    """(model, trained length) with random weights."""
    import torch

    torch.manual_seed(0)
    if name.startswith("ours"):
        from models.positions import PositionConfig
        from models.transformer import DecoderLM, ModelConfig

        cfg = ModelConfig(vocab_size=259, n_layers=4, d_model=128, n_heads=4)
        kind = name.removeprefix("ours_") if "_" in name else "rope"
        return DecoderLM(cfg, PositionConfig(kind=kind), MODELS[name]).eval(), MODELS[name]
    from transformers import LlamaConfig, LlamaForCausalLM

    from bench.pretrained.adapter import PretrainedLM

    if name == "llama32k":
        config = LlamaConfig(
            vocab_size=32000,
            hidden_size=64,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=MODELS["llama32k"],
            tie_word_embeddings=True,
        )
        train = MODELS["llama32k"]
    else:  # llama1b, with fewer layers
        config = LlamaConfig(**{**ONE_B, "num_hidden_layers": ONE_B_LAYERS_BUILT})
        train = 8192
    model = LlamaForCausalLM(config).eval()
    return PretrainedLM(model, None, train), train


def worker(name: str, length: int, scoring: str, threads: int) -> dict:
    import torch
    from training_free_cost import _reset_peak, _status_mib  # VmHWM reset and read (Linux)

    import bench.eval.evaluate
    from bench.data.corpora import Document
    from bench.eval.evaluate import evaluate_model
    from bench.eval.metrics import METRICS, EvalContext

    if threads:
        torch.set_num_threads(threads)
    model, train = _build(name)
    vocab = model.model_cfg.vocab_size
    rng = np.random.default_rng(0)
    docs = [Document(f"d{i}", rng.integers(0, min(vocab, 30000), length + 1)) for i in range(2)]
    cfg = {m: {"enabled": m == "nll"} for m in METRICS}
    cfg.update(lengths=[length], batch_size=1, precision="fp32")
    cfg["nll"] = {"enabled": True, "max_docs": 2, "bootstrap": 0}
    if scoring == "full":  # the reference path, which evaluate_model does not expose
        bench.eval.evaluate.EvalContext = functools.partial(EvalContext, chunked_scoring=False)
    with torch.no_grad():
        model(torch.zeros(1, 8, dtype=torch.long))  # warm-up: lazy allocations, kernels
    before = _status_mib("VmRSS")
    _reset_peak()
    rows = evaluate_model(model, cfg, docs, train_length=train, progress=False)
    peak = _status_mib("VmHWM")
    whole = [r for r in rows if r["metric"] == "nll" and r.get("axis") == "docs"]
    return {
        "model": name,
        "length": length,
        "multiple": length / train,
        "scoring": scoring,
        "rss_before_mib": before,
        "peak_mib": peak,
        "growth_mib": peak - before,
        "nll": whole[0]["value"] if whole else None,
        "threads": torch.get_num_threads(),
    }


def _run(name: str, length: int, scoring: str, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", name, str(length), scoring, str(threads)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def one_b_estimate(rows: list[dict], budget_gib: float) -> dict:
    """Longest length within ``budget_gib`` for the 16-layer model, from the 2-layer runs."""
    lengths = np.array([r["length"] for r in rows], dtype=float)
    growth = np.array([r["growth_mib"] for r in rows], dtype=float)
    per_token, _ = np.polyfit(lengths, growth, 1)  # MiB per token
    # the built model's RSS before evaluating = runtime + weights of 2 layers + embedding;
    # add the other 14 layers' weights (fp32) to get the 1B model's
    h, f, kv = ONE_B["hidden_size"], ONE_B["intermediate_size"], ONE_B["num_key_value_heads"]
    head_dim = h // ONE_B["num_attention_heads"]
    layer_params = 2 * h * h + 2 * h * kv * head_dim + 3 * h * f + 2 * h
    extra_layers = ONE_B["num_hidden_layers"] - ONE_B_LAYERS_BUILT
    base_mib = float(np.median([r["rss_before_mib"] for r in rows]))
    base_mib += extra_layers * layer_params * 4 / 2**20
    longest = int((budget_gib * 1024 - base_mib) / per_token)
    return {
        "per_token_mib": per_token,
        "model_rss_mib": base_mib,
        "budget_gib": budget_gib,
        "longest_length": longest,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--multiples", default="1,2,4,8,16", help="of each model's trained length")
    parser.add_argument("--scorings", default="chunked,full")
    parser.add_argument("--one-b", action="store_true", help="also the 1B-shaped estimate")
    parser.add_argument("--one-b-lengths", default="1024,2048,4096")
    parser.add_argument("--budget-gib", type=float, default=24.0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    parser.add_argument("--out", default=str(RESULTS / "eval_memory.json"))
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        name, length, scoring, threads = sys.argv[2:6]
        print(json.dumps(worker(name, int(length), scoring, int(threads))))
        return
    args = parser.parse_args()
    from bench.core.runtime import machine_line, machine_summary

    names = [m for m in args.models.split(",") if m]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"--models {unknown} unknown; allowed: {', '.join(MODELS)}.")
    multiples = [int(m) for m in args.multiples.split(",")]
    rows = []
    print(f"machine: {machine_line(machine_summary())}")
    print(f"{'model':10} {'length':>7} {'x':>4} {'scoring':8} {'peak MiB':>9} {'growth':>8} nll")
    for name in names:
        for multiple in multiples:
            for scoring in args.scorings.split(","):
                row = _run(name, MODELS[name] * multiple, scoring, args.threads)
                rows.append(row)
                print(
                    f"{name:10} {row['length']:>7} {multiple:>4} {scoring:8} "
                    f"{row['peak_mib']:>9.0f} {row['growth_mib']:>8.0f} {row['nll']:.6f}",
                    flush=True,
                )
    for name in names:
        for scoring in args.scorings.split(","):
            cells = {
                r["multiple"]: r for r in rows if r["model"] == name and r["scoring"] == scoring
            }
            if 1 in cells and max(cells) > 1:
                top = max(cells)
                ratio = cells[top]["peak_mib"] / cells[1]["peak_mib"]
                print(f"{name} {scoring}: peak at {top:g}x / peak at 1x = {ratio:.2f}")
    estimate = None
    if args.one_b:
        one_b = []
        for length in (int(x) for x in args.one_b_lengths.split(",")):
            row = _run("llama1b", length, "chunked", args.threads)
            one_b.append(row)
            print(
                f"llama1b({ONE_B_LAYERS_BUILT} layers) {length:>7} chunked "
                f"{row['peak_mib']:>9.0f} {row['growth_mib']:>8.0f}",
                flush=True,
            )
        rows += one_b
        estimate = one_b_estimate(one_b, args.budget_gib)
        print(
            f"1B (16 layers, vocabulary 128,256, fp32): {estimate['per_token_mib'] * 1024:.1f} KiB "
            f"per token, model {estimate['model_rss_mib'] / 1024:.2f} GiB -> longest length "
            f"within {args.budget_gib:g} GiB: {estimate['longest_length']:,} tokens"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = machine_summary()
    out.write_text(json.dumps({"machine": machine_line(summary), "rows": rows, "one_b": estimate}))


if __name__ == "__main__":
    main()
