"""When do the RULER arm's task circuits form? The exact score of every task at L along one run.

The RULER arm (``conf/arm/ruler.yaml``) must learn every task of its mixture at its training
length L (issue #28: every task clearly above chance on every documented seed). Each task's
circuit forms abruptly, at an update that depends on the seed and on which other tasks share
the rows (``reports/ruler/README.md``). This script trains the arm's model exactly as
``lenbench +experiment=ruler arm=ruler`` does (the same composed config, the same
:class:`bench.train.trainer.Trainer`; extra Hydra overrides such as ``train.ruler_stages`` after ``--``),
with ``train.steps`` given here, and after every ``--every`` updates scores every task of
``eval.ruler.tasks`` at L on the examples the evaluation uses (the job's ruler grid: the same
seed, depths, trials, task sizes and filler), the teacher-forced exact verdict, plus passkey at
L. The checks do not change the weights, so the trajectory is the run's, and the last check
equals the run's ``exact`` rows at L on the same machine and thread count.

It prints a table (one row per check, one column per task) and, per task, the first update from
which every later check is >= ``--forms``; it writes results/perf/ruler_formation_seed<S>_<steps>.json.

Run from the repository root after ``pip install -e ".[dev]"``::

    python tests/perf/ruler_formation.py --seeds 0 --steps 24000 --every 1000 --threads 2
    python tests/perf/ruler_formation.py --seeds 1 --steps 4000 --every 500 -- \\
        'train.ruler_tasks=[niah_single,niah_multikey]'
"""

from __future__ import annotations

import json
import time

import torch
from retrieval_formation import (
    RESULTS,
    CheckedTrainer,
    formation_parser,
    formed_at,
    job_for,
    parse_formation_args,
    start,
    train_checked,
)

from bench.data.corpora import load_corpus
from bench.eval.metrics.passkey import corpus_filler_source, passkey_verdicts
from bench.eval.metrics.ruler import _ALNUM_IDS
from bench.findings import wilson
from bench.schema import JobConfig
from bench.tasks.passkey import passkey_grid
from bench.tasks.ruler import params_from, ruler_grid


def check_examples(job: JobConfig, corpus) -> dict[str, list]:
    """The evaluation's examples at L: every ruler task's grid, and passkey's."""
    length = job.train.length
    resolved = job.eval.resolve(length).metrics
    ruler, passkey = resolved["ruler"], resolved["passkey"]
    source = None
    if ruler.filler == "corpus":
        source = corpus_filler_source(corpus.split("test"), length, "ruler")
    params = params_from(ruler.params)
    out = {
        task: ruler_grid(
            [task],
            [length],
            ruler.depth_list,
            ruler.trials,
            job.seed,
            params,
            ruler.filler,
            source,
        )
        for task in ruler.tasks
    }
    out["passkey"] = passkey_grid(
        [length], passkey.depths, passkey.trials, job.seed, template=job.train.passkey_template
    )
    return out


class RulerCheckedTrainer(CheckedTrainer):
    """Every task's exact score at L (and passkey's) on the evaluation's examples."""

    def score(self, model: torch.nn.Module, done: int) -> dict:
        scores = {}
        for task, examples in self.examples.items():
            ends = {} if task == "passkey" else {"continues": _ALNUM_IDS}
            verdicts = passkey_verdicts(model, examples, 16, self.device, **ends)
            hits, n = sum(verdicts), len(verdicts)
            scores[task] = {"hits": hits, "n": n, "acc": hits / n, "ci": wilson(hits, n)}
        line = " ".join(f"{t} {s['acc']:.2f}" for t, s in scores.items())
        print(f"  seed {self.job.seed} update {done:5d}: {line}", flush=True)
        return {"update": done, "tasks": scores}


def _task_acc(task: str):
    return lambda check: check["tasks"][task]["acc"]


def run(seed: int, steps: int, every: int, forms: float, overrides: list[str]) -> dict:
    job = job_for(seed, steps, overrides, experiment="ruler", arm="ruler")
    corpus = load_corpus(job.data)
    examples = check_examples(job, corpus)
    trainer, stats, started = train_checked(RulerCheckedTrainer, job, corpus, every, examples)
    tasks = list(trainer.examples)
    out = {
        "seed": seed,
        "steps": steps,
        "overrides": overrides,
        "ruler_stages": job.train.ruler_stages,
        "ruler_tasks": job.train.ruler_tasks,
        "threads": torch.get_num_threads(),
        "train_time_s": stats.train_time_s,
        "wall_time_s": time.perf_counter() - started,
        "forms": forms,
        "formed_at": {task: formed_at(trainer.checks, forms, _task_acc(task)) for task in tasks},
        "checks": trainer.checks,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"ruler_formation_seed{seed}_{steps}.json"
    path.write_text(json.dumps(out, indent=1))
    return out


def table(result: dict) -> str:
    """The checks as a markdown table: one row per check, one column per task (exact at L)."""
    tasks = list(result["formed_at"])
    lines = ["| update | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for check in result["checks"]:
        cells = " | ".join(f"{check['tasks'][t]['acc']:.2f}" for t in tasks)
        lines.append(f"| {check['update']} | {cells} |")
    formed = " | ".join(str(result["formed_at"][t]) for t in tasks)
    lines.append(f"| formed at (>= {result['forms']}) | {formed} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = formation_parser(__doc__, steps=24000, every=1000)
    parser.add_argument("--forms", type=float, default=0.5, help="exact score that counts")
    args, seeds, overrides = parse_formation_args(parser, argv)
    if not 0.0 < args.forms <= 1.0:
        parser.error(f"--forms must be in (0, 1], got {args.forms}.")
    start(args.threads)
    for seed in seeds:
        result = run(seed, args.steps, args.every, args.forms, overrides)
        print(f"\nseed {seed}, train time {result['train_time_s']:.0f} s\n{table(result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
