"""Progress in a log: plain lines, never tqdm's carriage returns or ANSI codes, when the output
is not a terminal (issue 51); a terminal still gets tqdm's bar. Each check has its control: tqdm
itself, written to the same kind of file, does put carriage returns there."""

from __future__ import annotations

import contextlib
import io
import re

import pytest
from tqdm.std import tqdm as std_tqdm

import bench.core.progress as progress_mod
from bench.core.progress import PlainProgress, adopt_bars, progress_bar

from fixtures import ROOT

CONTROL = ("\r", "\x1b[")


def control_codes(text: str) -> list[str]:
    return [code for code in CONTROL if code in text]


def raw(path) -> str:
    """The file's text as written: ``read_text`` would turn a carriage return into a newline."""
    return path.read_bytes().decode("utf-8")


@pytest.fixture
def every_update(monkeypatch):
    """A line at every update and at the end of even a quick loop (deterministic line count)."""
    monkeypatch.setattr(progress_mod, "PLAIN_INTERVAL_S", 0.0)
    monkeypatch.setattr(progress_mod, "PLAIN_DELAY_S", 0.0)


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_progress_loop_in_a_file_writes_plain_lines(tmp_path, every_update):
    log = tmp_path / "run.log"
    with log.open("w", encoding="utf-8") as stream:
        assert not stream.isatty()
        with progress_bar(total=5, desc="nll L=64", unit="win", leave=False, file=stream) as bar:
            assert isinstance(bar, PlainProgress)
            for _ in range(5):
                bar.update(1)
                bar.set_postfix(loss="1.500")
        for _ in progress_bar(range(3), desc="eval lengths", unit="len", file=stream):
            pass
    text = raw(log)
    assert not control_codes(text), control_codes(text)
    lines = text.splitlines()
    assert len(lines) == 5 + 3  # every update; the ends repeat no count already shown
    assert re.fullmatch(
        r"nll L=64: 5/5 win \(100%\), 00:00 elapsed(, [\d.,]+ win/s)?, loss=1\.500", lines[4]
    ), lines[4]
    assert lines[-1].startswith("eval lengths: 3/3 len (100%), 00:00 elapsed")


def test_the_same_loop_through_tqdm_puts_carriage_returns_in_the_file(tmp_path):
    """Negative control: what the check above rules out is what tqdm writes to a file."""
    log = tmp_path / "run.log"
    with log.open("w", encoding="utf-8") as stream:
        with std_tqdm(total=5, desc="nll L=64", file=stream, mininterval=0, leave=False) as bar:
            for _ in range(5):
                bar.update(1)
    assert "\r" in control_codes(raw(log))


def test_a_terminal_gets_tqdms_bar_and_a_disabled_bar_writes_nothing(every_update):
    terminal, pipe = FakeTerminal(), io.StringIO()
    bar = progress_bar(total=2, desc="x", file=terminal)
    assert isinstance(bar, std_tqdm)  # the drawn bar, as before
    bar.close()
    plain = progress_bar(total=2, desc="x", file=pipe)
    assert isinstance(plain, PlainProgress)  # control: the same call in a pipe
    plain.close()
    quiet = progress_bar(total=2, desc="x", file=pipe, disable=True)
    quiet.update(2)
    quiet.close()
    assert pipe.getvalue().count("\n") == 1  # the plain bar's one line; none from the disabled


def test_lines_come_every_interval_and_quick_loops_write_none(monkeypatch):
    """Default rules on a fake clock: a 0.5 s loop writes nothing; a 100 s loop writes one line
    every PLAIN_INTERVAL_S (30 s) and one at its end, with the rate and the time left."""

    class Clock:
        now = 1000.0

        @classmethod
        def monotonic(cls) -> float:
            return cls.now

    monkeypatch.setattr(progress_mod, "time", Clock)
    out = io.StringIO()
    bar = progress_bar(total=10, desc="quick", file=out)
    for _ in range(10):
        Clock.now += 0.05
        bar.update(1)
    bar.close()
    assert out.getvalue() == ""
    bar = progress_bar(total=10, desc="train rope L=64", unit="step", file=out, initial=0)
    for _ in range(10):
        Clock.now += 10.0
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines == [
        "train rope L=64: 3/10 step (30%), 00:30 elapsed, 10 s/step, 01:10 left",
        "train rope L=64: 6/10 step (60%), 01:00 elapsed, 10 s/step, 00:40 left",
        "train rope L=64: 9/10 step (90%), 01:30 elapsed, 10 s/step, 00:10 left",
        "train rope L=64: 10/10 step (100%), 01:40 elapsed, 10 s/step",
    ]


def test_training_in_a_log_writes_plain_lines(tmp_path, every_update, monkeypatch):
    """The real training loop (its bar's loss postfix and total included) with stderr going to a
    file, as in ``lenbench ... 2> run.log``."""
    import torch

    from bench.data.corpora import load_corpus
    from bench.schema import DataConfig, JobConfig
    from bench.train.trainer import train_model

    for i in range(12):
        text = (ROOT / "bench" / "core" / "progress.py").read_text(encoding="utf-8")[
            i * 300 : i * 300 + 900
        ]
        (tmp_path / f"doc{i:02d}.txt").write_text(text, encoding="utf-8")
    corpus = load_corpus(DataConfig(name="text", paths=[str(tmp_path)]))
    job = JobConfig.from_hydra(
        {
            "model": {"n_layers": 1, "d_model": 16, "n_heads": 2},
            "position": {"kind": "rope"},
            "data": {"name": "text", "paths": ["unused"]},
            "train": {
                "length": 16,
                "steps": 4,
                "batch_size": 2,
                "eval_batches": 0,
                "log_every": 1,
                "warmup_steps": 1,
            },  # fmt: skip
            "seed": 0,
        }
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    log = tmp_path / "run.log"
    try:
        with log.open("w", encoding="utf-8") as stream, contextlib.redirect_stderr(stream):
            train_model(job, corpus, progress=True)
    finally:
        torch.set_num_threads(threads)
    text = raw(log)
    assert not control_codes(text), control_codes(text)
    steps = [line for line in text.splitlines() if line.startswith("train rope L=16: ")]
    assert [s.split(": ")[1].split(" ")[0] for s in steps] == ["1/4", "2/4", "3/4", "4/4"]
    assert all("loss=" in s for s in steps), steps


def test_lm_evals_bars_are_adopted_in_a_log(monkeypatch):
    """``lenbench-harness`` in a log: lm-eval's request-building bar (``from tqdm import tqdm``
    in lm_eval.api.task) becomes ours; on a terminal nothing changes (control)."""
    import lm_eval.api.task as task_module

    monkeypatch.setattr(task_module, "tqdm", std_tqdm)
    monkeypatch.setattr("sys.stderr", FakeTerminal())
    assert adopt_bars("lm_eval.api.task", "no_such_module_here") == []
    assert task_module.tqdm is std_tqdm
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert adopt_bars("lm_eval.api.task", "no_such_module_here") == ["lm_eval.api.task"]
    assert task_module.tqdm is progress_bar


#: a module that draws its own tqdm bar instead of bench.core.progress.progress_bar
DIRECT_TQDM = re.compile(r"^\s*(from tqdm(\.\w+)? import|import tqdm)", re.M)


def test_every_bar_of_lenbench_goes_through_progress_bar():
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "bench").rglob("*.py"))
        if path.name != "progress.py" and DIRECT_TQDM.search(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, (
        f"{offenders} draw tqdm bars directly; use bench.core.progress.progress_bar"
    )
    # control: the pattern catches the import every module used before
    assert DIRECT_TQDM.search("import torch\nfrom tqdm.auto import tqdm\n")
    assert DIRECT_TQDM.search("    from tqdm import tqdm\n")
