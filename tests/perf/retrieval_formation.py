"""When does the retrieval arm's passkey circuit form? Passkey accuracy at L along one training run.

The retrieval arm (``conf/arm/retrieval.yaml``) must learn to retrieve the passkey at its training
length L on every seed: F4 reads only seeds whose model retrieves, and F5 checks it. Retrieval
is an induction circuit that forms abruptly, at a seed-dependent update. This script trains the
arm's model exactly as ``lenbench +experiment=findings arm=retrieval`` does (the same composed
config, the same :class:`bench.train.trainer.Trainer`), but with ``train.steps`` given here, and after
every ``--every`` updates scores passkey at L on the examples the evaluation uses (the job's
passkey grid: the same seed, depths, trials and template), teacher-forced exact match, with a
Wilson interval. The weights are not changed by the checks, so the trajectory is the run's.

It prints, per seed, the accuracy after each check and the first update from which every later
check is >= ``--retrieves`` (the circuit "formed" there and stayed), and writes
results/perf/retrieval_formation_seed<S>_<steps>.json. Figures and what they decided:
reports/reference/README.md, "The retrieval arm's base budget".

Run from the repository root after ``pip install -e ".[dev]"``; extra Hydra overrides follow
``--``::

    python tests/perf/retrieval_formation.py --seeds 16,17 --steps 4000 --every 250 --threads 1
    python tests/perf/retrieval_formation.py --seeds 0 --steps 2000 -- train.decay_steps=250
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from operator import itemgetter
from pathlib import Path

import torch
from hydra import compose, initialize_config_module

from bench.data.corpora import load_corpus
from bench.eval.metrics.passkey import passkey_verdicts
from bench.findings import wilson
from bench.job import configure_threads
from bench.schema import JobConfig
from bench.tasks.passkey import passkey_grid
from bench.train.trainer import Trainer

RESULTS = Path("results") / "perf"


def job_for(
    seed: int,
    steps: int,
    overrides: list[str],
    experiment: str = "findings",
    arm: str = "retrieval",
) -> JobConfig:
    """The raw RoPE job of ``arm`` in ``experiment`` (by default the findings experiment's
    retrieval arm), with ``train.steps``."""
    job = [
        f"+experiment={experiment}",
        f"arm={arm}",
        "position=rope",
        "scaling=none",
        "extend=none",
        f"seed={seed}",
        f"train.steps={steps}",
        *overrides,
    ]
    with initialize_config_module("conf", version_base="1.3"):
        return JobConfig.from_hydra(compose("config", overrides=job))


class CheckedTrainer(Trainer):
    """A Trainer that records ``score(model, done)`` after every ``every`` updates (and the last),
    in eval mode and outside the timed training."""

    def __init__(self, *args, every: int, examples, **kwargs):
        super().__init__(*args, **kwargs)
        self.every, self.examples = every, examples
        self.checks: list[dict] = []

    def _snapshot(self, done: int) -> None:
        if done % self.every and done != self.spec.steps:
            return
        with self._untimed():
            model = self.accelerator.unwrap_model(self.model)
            model.eval()
            self.checks.append(self.score(model, done))
            model.train()

    def score(self, model: torch.nn.Module, done: int) -> dict:
        raise NotImplementedError


class PasskeyCheckedTrainer(CheckedTrainer):
    """Passkey accuracy at L on the evaluation's examples, with its Wilson interval."""

    def score(self, model: torch.nn.Module, done: int) -> dict:
        verdicts = passkey_verdicts(model, self.examples, batch_size=16, device=self.device)
        hits, n = sum(verdicts), len(verdicts)
        low, high = wilson(hits, n)
        loss = float(self.losses[max(0, done - self.spec.log_every) : done].mean())
        print(
            f"  seed {self.job.seed} update {done:5d}: passkey at L {hits:3d}/{n} "
            f"[{low:.2f}, {high:.2f}], loss {loss:.3f}",
            flush=True,
        )
        return {
            "update": done,
            "hits": hits,
            "n": n,
            "acc": hits / n,
            "low": low,
            "high": high,
            "train_loss": loss,
        }


def train_checked(trainer: type[CheckedTrainer], job: JobConfig, corpus, every: int, examples):
    """Train ``job`` with ``trainer``'s checks; returns the trainer, its stats and the start."""
    started = time.perf_counter()
    checked = trainer(
        job,
        corpus,
        progress=False,
        accelerator=None,
        init=None,
        resume=None,
        snapshot=None,
        started=started,
        every=every,
        examples=examples,
    )
    checked.setup()
    _, stats = checked.train()
    return checked, stats, started


def formed_at(
    checks: list[dict], threshold: float, acc: Callable[[dict], float] = itemgetter("acc")
) -> int | None:
    """The first checked update from which every later check has ``acc(check) >= threshold``."""
    first = None
    for check in checks:
        if acc(check) >= threshold:
            first = check["update"] if first is None else first
        else:
            first = None
    return first


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the script's arguments, the Hydra overrides after ``--``)."""
    if "--" not in argv:
        return argv, []
    return argv[: argv.index("--")], argv[argv.index("--") + 1 :]


def formation_parser(doc: str, steps: int, every: int) -> argparse.ArgumentParser:
    """The formation scripts' shared options (seeds, updates, check interval, threads); each
    script adds its own threshold."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--seeds", required=True, help="comma-separated seeds")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--every", type=int, default=every, help="updates between checks")
    parser.add_argument("--threads", type=int, default=None)
    return parser


def parse_formation_args(
    parser: argparse.ArgumentParser, argv: list[str] | None
) -> tuple[argparse.Namespace, list[int], list[str]]:
    """(arguments, seeds, Hydra overrides) of a :func:`formation_parser` command line, its counts
    checked, the threads set."""
    argv = sys.argv[1:] if argv is None else argv
    argv, overrides = split_overrides(argv)
    args = parser.parse_args(argv)
    if args.every < 1 or args.steps < 1:
        parser.error(f"--every and --steps must be >= 1, got {args.every} and {args.steps}.")
    return args, [int(s) for s in args.seeds.split(",")], overrides


def start(threads: int | None) -> None:
    configure_threads(threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")


def run(seed: int, steps: int, every: int, retrieves: float, overrides: list[str]) -> dict:
    job = job_for(seed, steps, overrides)
    corpus = load_corpus(job.data)
    length = job.train.length
    passkey = job.eval.resolve(length).metrics["passkey"]
    examples = passkey_grid(
        [length], passkey.depths, passkey.trials, job.seed, template=job.train.passkey_template
    )
    trainer, stats, started = train_checked(PasskeyCheckedTrainer, job, corpus, every, examples)
    out = {
        "seed": seed,
        "steps": steps,
        "decay_steps": job.train.decay_steps,
        "overrides": overrides,
        "threads": torch.get_num_threads(),
        "train_time_s": stats.train_time_s,
        "wall_time_s": time.perf_counter() - started,
        "retrieves": retrieves,
        "formed_at": formed_at(trainer.checks, retrieves),
        "checks": trainer.checks,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"retrieval_formation_seed{seed}_{steps}.json"
    path.write_text(json.dumps(out, indent=1))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = formation_parser(__doc__, steps=4000, every=250)
    parser.add_argument("--retrieves", type=float, default=0.9, help="accuracy that counts")
    args, seeds, overrides = parse_formation_args(parser, argv)
    start(args.threads)
    results = [run(s, args.steps, args.every, args.retrieves, overrides) for s in seeds]
    print("\n| seed | formed at (update) | acc at the end | train time (s) |")
    print("|---|---|---|---|")
    for r in results:
        last = r["checks"][-1]
        print(
            f"| {r['seed']} | {r['formed_at']} | {last['hits']}/{last['n']} | "
            f"{r['train_time_s']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
