"""One discovery rule (models.discovery) and a user's own package loaded from config
(``extensions: [...]``, issue #52 item 2): a scaling method, a metric and a finding of a package
outside lenbench, without editing lenbench."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench.schema import JobConfig
from models.discovery import import_package, load_extensions

from fixtures.jobs import compose_config, compose_job
from fixtures.user_code import METRIC

ROOT = Path(__file__).resolve().parents[2]

METHOD = '''
from models.scaling import default_inv_freq, register_scaling


@register_scaling("{name}", applies_to=("positions",), auto_keys=("factor",))
def renamed_linear(geometry, *, factor: float):
    """linear position interpolation under another name"""
    return default_inv_freq(geometry.rotary_dim, geometry.base) / factor, 1.0
'''


def write_package(root: Path, package: str, method: str, metric: str) -> Path:
    """A package of the user's own (methods and metrics modules, one private module) and its
    config directory with the method's scaling preset."""
    pkg = root / package
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "methods.py").write_text(METHOD.format(name=method))
    (pkg / "metrics.py").write_text(METRIC.format(name=metric))
    (pkg / "_private.py").write_text("raise RuntimeError('a private module is not scanned')\n")
    conf = root / "user_conf" / "scaling"
    conf.mkdir(parents=True)
    (conf / f"{method}.yaml").write_text(
        f"name: {method}\nmethod: {method}\nparams: {{factor: auto}}\n"
    )
    return root / "user_conf"


def test_import_package_scans_every_public_module_alphabetically(tmp_path, monkeypatch):
    pkg = tmp_path / "scanned_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("ORDER = []\n")
    for name in ("b_mod", "a_mod", "_skipped"):
        (pkg / f"{name}.py").write_text(f"import scanned_pkg\nscanned_pkg.ORDER.append({name!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = import_package("scanned_pkg")
    assert [m.__name__ for m in modules] == ["scanned_pkg.a_mod", "scanned_pkg.b_mod"]
    assert sys.modules["scanned_pkg"].ORDER == ["a_mod", "b_mod"]  # control: _skipped is not
    for name in ("scanned_pkg", "scanned_pkg.a_mod", "scanned_pkg.b_mod"):
        sys.modules.pop(name)


def test_the_builtin_registries_are_the_scanned_modules():
    """Scaling methods live in modules of models/scaling/ found by the scan, not in a list."""
    from models import scaling

    files = {p.stem for p in (ROOT / "models" / "scaling").glob("*.py")} - {"__init__"}
    modules = {m.__name__.rpartition(".")[2] for m in import_package("models.scaling")}
    assert modules == {f for f in files if not f.startswith("_")}
    homes = {scaling.SCALING_METHODS[m].fn.__module__ for m in scaling.SCALING_METHODS}
    assert homes == {
        "models.scaling.frequencies",
        "models.scaling.training_free",
        "models.scaling.drope",
    }


def test_a_bad_extension_is_one_sentence():
    with pytest.raises(ValueError, match=r"extensions entry 'no_such_pkg' cannot be imported"):
        load_extensions(["no_such_pkg"])
    with pytest.raises(ValueError, match=r"extensions entry '' is invalid"):
        load_extensions([""])
    with pytest.raises(ValueError, match=r"extensions 'my_pkg' is invalid; allowed: a list"):
        JobConfig.from_hydra({"extensions": "my_pkg"})


def test_extensions_register_before_the_config_is_checked(tmp_path, monkeypatch):
    from bench.eval.metrics import METRICS
    from models.scaling import SCALING_METHODS

    conf = write_package(tmp_path, "ext_inproc", "ext_linear", "ext_docs")
    monkeypatch.syspath_prepend(str(tmp_path))
    overrides = [f"hydra.searchpath=[file://{conf}]", "scaling=ext_linear"]
    try:
        # control: without the extension the method is unknown
        with pytest.raises(ValueError, match="ext_linear"):
            compose_job(*overrides)
        job = compose_job(*overrides, "extensions=[ext_inproc]", "+eval.ext_docs.enabled=true")
        assert job.scaling.method == "ext_linear" and job.eval.ext_docs.enabled is True
        assert "ext_linear" in SCALING_METHODS and "ext_docs" in METRICS
    finally:
        SCALING_METHODS.pop("ext_linear", None)
        METRICS.pop("ext_docs", None)
        for name in [m for m in sys.modules if m.startswith("ext_inproc")]:
            sys.modules.pop(name)


def test_a_run_uses_a_method_and_a_metric_of_the_users_package(tmp_path):
    """End to end: ``lenbench +experiment=smoke extensions=[...]`` trains, scales with the
    package's method (a renamed linear: its rows differ from the raw model's) and writes the
    package's metric rows; the report is written."""
    conf = write_package(tmp_path, "ext_e2e", "ext_pi", "ext_count")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    common = ["+experiment=smoke", "position=rope", f"paths.results={tmp_path}/res",
              f"paths.reports={tmp_path}/rep", f"paths.cache={tmp_path}/cache",
              "eval.lengths=[1x,2x]"]  # fmt: skip
    run = [sys.executable, "-c", "import sys; from bench.cli import main; sys.exit(main())"]
    for extra in (["scaling=none"], ["extensions=[ext_e2e]", "scaling=ext_pi",
                  f"hydra.searchpath=[file://{conf}]", "+eval.ext_count.enabled=true"]):  # fmt: skip
        done = subprocess.run([*run, *common, *extra], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    rows = pd.concat(pd.read_parquet(p) for p in (tmp_path / "res" / "smoke").glob("*.parquet"))
    assert set(rows["scaling"]) == {"none", "ext_pi"}
    assert set(rows.loc[rows["metric"] == "ext_count", "scaling"]) == {"ext_pi"}
    nll = rows[(rows["metric"] == "nll") & rows["bucket_lo"].isna()]
    at = nll.pivot_table(index="eval_length", columns="scaling", values="value")
    assert at["ext_pi"].sub(at["none"]).abs().max() > 1e-6  # the method changes the model's nll
    assert (tmp_path / "rep" / "smoke" / "report.md").is_file()


FAMILY = '''
from dataclasses import dataclass

from models.positions import Family, PositionConfig, ScoreBias, register_family


def scaled_distance(head, q_pos, k_pos, slope):
    return -slope * (q_pos - k_pos).clamp(min=0).float()


@dataclass
class SlopeConfig(PositionConfig):
    slope: float = 0.5


@register_family
class OneSlope(Family):
    """ALiBi with one slope for every head: the family's own field, declared beside it."""

    name, acts_on, config = "{name}", "scores", SlopeConfig

    def score_bias(self, model, length):
        return ScoreBias(scaled_distance, (float(model.position_cfg.slope),))
'''


def test_a_family_of_the_users_package_brings_its_own_fields(tmp_path, monkeypatch):
    """Issue #52 item 3: a family with a parameter is one class and its dataclass in the user's
    package plus one YAML, no edit of lenbench; its field is checked and reaches the model, and
    another family's field is refused for it (and its field for another family)."""
    from models.positions import FAMILIES
    from models.transformer import DecoderLM, ModelConfig

    pkg = tmp_path / "ext_family"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "families.py").write_text(FAMILY.format(name="one_slope"))
    conf = tmp_path / "user_conf" / "position"
    conf.mkdir(parents=True)
    (conf / "one_slope.yaml").write_text("kind: one_slope\nslope: 0.25\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    base = [f"hydra.searchpath=[file://{tmp_path / 'user_conf'}]", "extensions=[ext_family]"]
    try:
        cfg = compose_config(*base, "position=one_slope", "position.slope=2.0")
        foreign = compose_config(*base, "position=one_slope", "+position.base=5")
        rope = compose_config(*base, "+position.slope=2.0")
        job = JobConfig.from_hydra(cfg)
        assert type(job.position).__name__ == "SlopeConfig" and job.position.slope == 2.0
        assert job.position.params() == {"slope": 2.0}
        with pytest.raises(
            ValueError, match=r"position\.base=5 means nothing for position=one_slope"
        ):
            JobConfig.from_hydra(foreign)
        with pytest.raises(
            ValueError, match=r"position\.slope=2\.0 means nothing for position=rope"
        ):
            JobConfig.from_hydra(rope)
        model = DecoderLM(ModelConfig(n_layers=1, d_model=16, n_heads=2), job.position, 16)
        assert model.position_cfg.slope == 2.0
        bias = model.position_cfg.family.score_bias(model, 4)
        assert bias.args == (2.0,)  # control of the field's path: the configured slope, not 0.5
    finally:
        FAMILIES.pop("one_slope", None)
        for name in [m for m in sys.modules if m.startswith("ext_family")]:
            sys.modules.pop(name)


def _user_folder_with_conf(root: Path, regular: bool) -> Path:
    """The documented layout: ``~/my_code/{my_pkg, conf/scaling/my_pi.yaml}``; ``regular``: the
    user's conf/ has an ``__init__.py`` (a regular package, ahead of lenbench's on any path)."""
    (root / "my_pkg").mkdir(parents=True)
    (root / "my_pkg" / "__init__.py").write_text("")
    (root / "conf" / "scaling").mkdir(parents=True)
    (root / "conf" / "scaling" / "my_pi.yaml").write_text(
        "name: my_pi\nmethod: linear\nparams: {factor: auto}\n"
    )
    if regular:
        (root / "conf" / "__init__.py").write_text("")
    return root / "conf"


@pytest.mark.parametrize("regular", [False, True], ids=["namespace_conf", "package_conf"])
def test_a_users_conf_folder_does_not_hide_lenbenchs_configs(tmp_path, regular):
    """Issue #75: a user's folder named ``conf/`` on the path (PYTHONPATH and the working
    directory) is the importable module ``conf`` there (control), yet ``lenbench`` composes its
    own config with the user's preset from ``--config-dir``, a bad value is lenbench's sentence
    (not "Primary config module 'conf' not found"), and lenbench-harness reads its presets."""
    user = tmp_path / "my_code"
    conf = _user_folder_with_conf(user, regular)
    # the package conf/ shadows lenbench's on any path; the namespace one where lenbench is
    # installed (its finder comes after the path's folders), as it is where these tests run
    path = [str(user), str(ROOT)] if regular else [str(user)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}

    def python(code: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code, *args], cwd=user, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    shadow = python("import conf; print(list(conf.__path__))")
    assert shadow.returncode == 0 and str(conf) in shadow.stdout, shadow  # the clash is real
    cli = "import sys; from bench.cli import main; sys.argv[0] = 'lenbench'; sys.exit(main())"
    common = ["--config-dir", str(conf), "extensions=[my_pkg]", "scaling=my_pi"]
    done = python(cli, *common, "--cfg", "job")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "name: my_pi" in done.stdout and "method: linear" in done.stdout
    assert "kind: rope" in done.stdout  # lenbench's own defaults composed around it
    bad = python(cli, *common, "position=no_such_family")
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert "position 'no_such_family' is unknown" in bad.stderr
    assert "Primary config module" not in bad.stderr + bad.stdout
    presets = python(
        "from bench.harness.args import scaling_presets as p; import sys; "
        "print(sorted(p(sys.argv[1])))", str(conf)
    )  # fmt: skip
    assert presets.returncode == 0, presets.stderr[-2000:]
    assert "'linear'" in presets.stdout and "'my_pi'" in presets.stdout
