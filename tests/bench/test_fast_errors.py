"""Errors come fast: the config check path (composition, the schema's checks, ``--help``) loads no
torch, pandas or scipy (issue 51, item 8). Each case runs ``lenbench`` in a fresh interpreter and
reads back which heavy packages it loaded; a bad setting that needs the model code (a scaling
parameter checked at the model's geometry) is the control: there torch does load, so the probe can
fail. Wall time is measured by ``tests/perf/fast_errors.py``, not here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "pandas", "scipy", "matplotlib", "pyarrow")

PROBE = """
import json, sys
from bench.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exc:  # --help: Hydra exits itself
    status = exc.code
print(json.dumps({"status": status, "loaded": [m for m in HEAVY if m in sys.modules]}))
""".replace("HEAVY", repr(HEAVY))


def run_cli(*argv: str) -> tuple[int, list[str], str]:
    """(exit status, heavy packages loaded, stderr) of ``lenbench *argv`` in a new interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120
    )
    last = done.stdout.strip().splitlines()[-1]
    out = json.loads(last)
    return out["status"], out["loaded"], done.stderr


BAD_SETTINGS = [
    (("train.lr=-1",), "train.lr must be a number >= 0, got -1.0."),
    (("position=bogus",), "position 'bogus' is unknown; allowed: "),
    (("position=kerple_log", "position.layout=bogus"), "position.layout means nothing"),
    (("position=cope", "model.attention_sink=learned"), "does not combine with position=cope"),
    (("position=cope", "train.position_sampling=randomized"), "means nothing for position=cope"),
    (("position=alibi", "scaling=yarn"), "does not apply to position alibi"),
    (("+experiment=smoke", "eval.ruler.enabled=true"), "ruler"),
    (("eval.lengths=[0]",), "eval.lengths"),
    (("position=xpos", "position.xpos_scale_base=1"), "too long for one row of position=xpos"),
    (("+experiment=smoke", "extend=pi", "extend.steps=8"), "extend.warmup_steps 20 is not below"),
    (("device=tpu",), "device 'tpu' is unknown; allowed: auto, cpu, cuda"),
    (("-m", "position=rope,alibi", "train.lr=-1"), "train.lr must be a number >= 0"),
]


@pytest.mark.parametrize(("argv", "sentence"), BAD_SETTINGS, ids=lambda v: " ".join(v)[:40])
def test_a_bad_setting_is_answered_without_loading_torch(argv, sentence, tmp_path):
    status, loaded, err = run_cli(*argv, f"paths.results={tmp_path}", f"paths.cache={tmp_path}")
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2
    assert len(lines) == 1 and lines[0].startswith("lenbench: error: ") and sentence in lines[0]
    assert loaded == [], f"the config check loaded {loaded}"


def test_a_sweep_with_one_unknown_option_is_one_sentence_before_any_job(tmp_path):
    """Hydra composes every cell before the first job; the check before it stops at the first
    cell that runs (composing all 80 of the quickstart's twice cost 10 s), whose corpus it reads
    (so torch loads): the unknown option is still one sentence and nothing is trained."""
    status, loaded, err = run_cli(
        "-m", "position=rope,bogus_kind", f"paths.results={tmp_path}", f"paths.cache={tmp_path}/c"
    )
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and "position 'bogus_kind' is unknown" in lines[0]
    assert not (tmp_path / "c").exists()


def test_help_loads_no_torch():
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "--help"], capture_output=True, text=True, timeout=120
    )
    assert "== Config ==" in done.stdout or "Powered by Hydra" in done.stdout
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["status"] == 0 and out["loaded"] == []


def test_control_a_check_that_needs_the_model_code_does_load_torch(tmp_path):
    """The probe can fail: a scaling parameter is checked at the model's geometry, in torch."""
    status, loaded, err = run_cli(
        "scaling=yarn", "scaling.params.beta_fast=-1", f"paths.results={tmp_path}"
    )
    assert status == 2 and "beta_fast must be > 0" in err
    assert "torch" in loaded
