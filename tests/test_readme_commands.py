"""Every ``lenbench`` command the README (and the READMEs its measurements moved to) shows
composes and validates as a job; every script they name exists and every relative link resolves;
the README's scaling-method example registers and runs, and its preset composes from a user's
config directory (each with a negative control).

The documents' code blocks are parsed; each ``lenbench ...`` line (with ``\\`` continuations) is
split into words by bash itself (brace expansion, globbing, quotes and ``$VARS`` as a reader's
shell does them), then composed by Hydra with its overrides (the first value of a sweep list,
hydra.* keys with the Hydra config) and parsed into a typed JobConfig, which is what every job
does first: a command that would stop with an error (a key that does not exist, two options that
exclude each other) fails here. Every command (``lenbench-harness`` and ``lenbench-report`` too,
the command examples in conf/ comments) and every Hydra list or dict override the prose shows
must reach the program as written: an unquoted ``key=[a,b]`` (a glob pattern: bash keeps it only
while no file matches, zsh refuses it) or ``key=[{a:1,b:[x,y]}]`` (brace-expanded into several
words) fails. Placeholders in angle brackets are filled with a plausible value.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from bench.schema import JobConfig

from fixtures import ROOT
from fixtures.jobs import compose_config, compose_job

README = ROOT / "README.md"
#: the README and the READMEs that hold what moved out of it (measurements, reference numbers)
DOCS = [
    README,
    ROOT / "tests" / "perf" / "README.md",
    ROOT / "reports" / "reference" / "README.md",
    ROOT / "results" / "README.md",
    ROOT / "reports" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]


#: the console scripts whose command lines the documents show
PROGRAMS = ("lenbench", "lenbench-harness", "lenbench-report")


def readme_commands(path: Path = README, programs: tuple[str, ...] = ("lenbench",)) -> list[str]:
    text = path.read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split("  #")[0].strip()
            if line.split(" ")[0] in programs:
                commands.append(line)
    return commands


# ------------------------------------------------------------------- what bash makes of a command

#: what a command line must not hold to be handed to bash here: it is one simple command
UNSAFE = re.compile(r"[;&|<>`\n]|\$\(")
#: the environment bash expands ``$VARS`` from (the documents use $HOME)
BASH_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.path.expanduser("~")}


def _fill_placeholders(text: str) -> str:
    return re.sub(r"<[^>]+>", "placeholder", text)


def bash_words(command: str, setup: str = "shopt -s failglob") -> list[str]:
    """The words bash makes of ``command`` (placeholders filled), in an empty folder.

    ``setup`` runs first: by default ``failglob``, so that an unquoted glob pattern such as a
    Hydra list ``key=[a,b]`` is an error rather than kept only while no file matches.
    """
    command = _fill_placeholders(command)
    if UNSAFE.search(command):
        raise ValueError(f"{command!r} is not one simple command (; & | < > ` $( or a newline).")
    with tempfile.TemporaryDirectory() as empty:
        proc = subprocess.run(
            ["bash", "--norc", "--noprofile", "-c", f"{setup}\nprintf '%s\\0' {command}"],
            cwd=empty,
            env=BASH_ENV,
            capture_output=True,
            text=True,
            timeout=30,
        )
    if proc.returncode != 0:
        raise ValueError(f"bash refuses {command!r}: {proc.stderr.strip()}")
    return proc.stdout.split("\0")[:-1]


def pasted_words(command: str) -> list[str]:
    """The words ``command`` reaches its program with when pasted into bash; a ValueError when
    bash's brace expansion or globbing changes them (the words differ from bash's with both
    turned off) or an unquoted glob pattern matches no file."""
    words = bash_words(command)
    literal = bash_words(command, setup="set +B -f")  # no brace expansion, no globbing
    if words != literal:
        raise ValueError(
            f"bash turns {command!r} into {words}, not {literal}: quote the override(s)."
        )
    return words


def hydra_overrides(words: list[str]) -> list[str]:
    """Every word that is a Hydra override (``key=value``, ``+key=...``), parsed by Hydra's own
    override parser (a ValueError names the one it refuses)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = [w for w in words if "=" in w and not w.startswith("-")]
    parser = OverridesParser.create()
    for word in overrides:
        try:
            parser.parse_overrides([word])
        except Exception as exc:
            raise ValueError(f"Hydra refuses {word!r}: {str(exc).splitlines()[0]}") from None
    return overrides


def _first(value: str) -> str:
    """The first value of a sweep list ``a,b`` (not of a list literal ``[a,b]``)."""
    return value if value.startswith("[") else value.split(",")[0]


def _overrides(command: str) -> tuple[list[str], list[str]]:
    """(job overrides, hydra overrides) of one command line."""
    args = pasted_words(command)[1:]  # what the program gets from bash
    hydra_overrides(args)
    job, hydra = [], []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in ("-m", "--multirun"):
            continue
        if arg == "--cfg":
            skip = True
            continue
        key, _, value = arg.partition("=")
        arg = f"{key}={_first(value)}" if value else arg
        (hydra if key.startswith("hydra") else job).append(arg)
    return job, hydra


COMMANDS = [c for doc in DOCS if doc.exists() for c in readme_commands(doc)]


def test_the_readme_shows_commands():
    assert len(readme_commands()) >= 15, readme_commands()
    assert all(doc.exists() for doc in DOCS), [d for d in DOCS if not d.exists()]


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_composes_and_validates(command: str):
    job, hydra = _overrides(command)
    if not any(a.startswith("+experiment=") for a in job) and command.strip() == "lenbench":
        job = ["+experiment=quickstart"]  # what lenbench with no arguments runs
    compose_job(*job)
    if hydra:
        compose_config(*job, *hydra, hydra=True)


#: a command example in a conf/ comment: ``#   lenbench +experiment=smoke``
CONF_COMMAND = re.compile(
    r"^#\s{2,}((?:lenbench|lenbench-report|lenbench-harness)\b.*?)(?:\s{2,}.*)?$"
)


def conf_commands() -> list[str]:
    out = []
    for path in sorted((ROOT / "conf").rglob("*.yaml")):
        for line in path.read_text(encoding="utf-8").splitlines():
            match = CONF_COMMAND.match(line.rstrip())
            if match:
                out.append(match.group(1).strip())
    return out


#: the documents whose commands and overrides a reader may paste: DOCS and every report's README
SHELL_DOCS = [*DOCS, *(d for d in sorted(ROOT.glob("reports/*/README.md")) if d not in DOCS)]

ALL_COMMANDS = [
    *(c for doc in SHELL_DOCS if doc.exists() for c in readme_commands(doc, PROGRAMS)),
    *conf_commands(),
]

#: a Hydra list or dict override inside prose: ``position.layers=[swa,nope]``, ``+a=[{...}]``
PROSE_OVERRIDE = re.compile(r"(?:^|\s)['\"]?(?:\+{1,2}\w+(?:\.\w+)*|\w+(?:\.\w+)+)=[\[{]")


def prose_overrides() -> list[str]:
    """The inline code spans of the documents that show a Hydra list or dict override."""
    spans = []
    for doc in SHELL_DOCS:
        text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
        for span in re.findall(r"`([^`]+)`", text):
            span = " ".join(span.split())  # a span may wrap over lines
            if PROSE_OVERRIDE.search(span):
                spans.append(span)
    return spans


def test_the_documents_show_commands_everywhere():
    assert {c.split(" ")[0] for c in ALL_COMMANDS} == set(PROGRAMS), ALL_COMMANDS
    assert any(c.startswith("lenbench") for c in conf_commands())
    assert len(prose_overrides()) >= 5, prose_overrides()


@pytest.mark.parametrize("command", ALL_COMMANDS)
def test_every_command_reaches_its_program_as_written(command: str):
    """Pasted into bash, a command gives its program the words it shows (nothing brace-expanded,
    no glob pattern left to chance), and each Hydra override among them parses."""
    words = pasted_words(command)
    assert words[0] in PROGRAMS
    if words[0] == "lenbench":
        hydra_overrides(words[1:])


@pytest.mark.parametrize("span", prose_overrides())
def test_every_list_or_dict_override_in_the_prose_is_quoted(span: str):
    """A list or dict override the prose shows, copied into a command, survives bash and
    parses: ``'+train.ruler_stages=[{steps:8000,tasks:[...]}]'``, quoted."""
    assert hydra_overrides(pasted_words(span))


def test_an_unquoted_brace_override_is_caught():
    """Negative controls: the README's curriculum override unquoted is three words to bash (its
    braces expand) and a glob pattern; unquoted lists are caught; quoted, both pass."""
    stages = "+train.ruler_stages=[{steps:8000,tasks:[niah_single,niah_multikey]}]"
    assert bash_words(f"lenbench {stages}", setup="") == [
        "lenbench",
        "+train.ruler_stages=[steps:8000]",
        "+train.ruler_stages=[tasks:[niah_single]",
        "+train.ruler_stages=[niah_multikey]]",
    ]
    with pytest.raises(ValueError, match="no match"):
        pasted_words(f"lenbench arm=ruler {stages}")
    # braces without brackets: no glob pattern, but two words where one was written
    assert bash_words("lenbench +a={x,y}", setup="set +B -f") == ["lenbench", "+a={x,y}"]
    with pytest.raises(
        ValueError, match=r"into \['lenbench', '\+a=x', '\+a=y'\].*quote the override"
    ):
        pasted_words("lenbench +a={x,y}")
    with pytest.raises(ValueError, match="no match"):
        pasted_words("lenbench position=rnope_swa position.layers=[swa,nope]")
    with pytest.raises(ValueError, match="Hydra refuses 'data.paths=\\[~/x\\]'"):
        hydra_overrides(pasted_words("lenbench 'data.paths=[~/x]'"))
    with pytest.raises(ValueError, match="not one simple command"):
        bash_words("lenbench x; touch y")
    words = pasted_words(f"lenbench arm=ruler '{stages}' 'position.layers=[swa,nope]'")
    assert words[2:] == [stages, "position.layers=[swa,nope]"]
    assert hydra_overrides(words[1:]) == words[1:]


# ------------------------------------------------------------------- scripts and the README's code

#: a repository path to a script or module that a document names (``tests/perf/train_speed.py``)
SCRIPT = re.compile(r"(?<![\w./-])((?:tests|bench|models)/[\w/]+\.py)\b")


def _named_scripts() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for path in sorted(set(SCRIPT.findall(doc.read_text(encoding="utf-8")))):
            if (
                path != "bench/eval/metrics/logit_entropy.py"
            ):  # the example metric's file, to create
                out.append((str(doc.relative_to(ROOT)), path))
    return out


def test_the_documents_name_scripts():
    named = {path for _, path in _named_scripts()}
    assert {"tests/perf/train_speed.py", "tests/perf/eval_speed.py"} <= named, named


@pytest.mark.parametrize(("doc", "path"), _named_scripts())
def test_every_script_a_document_names_exists(doc: str, path: str):
    assert (ROOT / path).is_file(), f"{doc} names {path}, which does not exist"


def test_the_script_check_fails_on_a_renamed_script():
    """Negative control: the pattern finds the paths the check needs (an old name is caught)."""
    assert SCRIPT.findall("run `python tests/perf/bench_train.py --width 64`") == [
        "tests/perf/bench_train.py"
    ]
    assert not (ROOT / "tests" / "perf" / "bench_train.py").exists()


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_readme_scaling_method_example_registers_and_runs():
    """The "Adding a scaling method" example, executed: it registers, applies to RoPE, and
    computes the frequencies it says it does."""
    import torch

    from models import scaling

    (example,) = [b for b in _python_blocks() if "@register_scaling" in b]
    name = re.search(r'@register_scaling\("(\w+)"', example).group(1)
    assert name not in scaling.SCALING_METHODS
    try:
        exec(compile(example, "README.md", "exec"), {})
        assert name in scaling.SCALING_METHODS
        assert name in scaling.applicable_methods("rope")
        geometry = scaling.RopeGeometry(rotary_dim=16, base=10000.0, original_length=64, seq_len=64)
        inv_freq, attention = scaling.SCALING_METHODS[name](geometry, factor=4.0)
        torch.testing.assert_close(inv_freq, scaling.default_inv_freq(16, 10000.0) / 4.0)
        assert attention == 1.0
    finally:
        scaling.SCALING_METHODS.pop(name, None)


#: a relative Markdown link target: [text](target)
LINK = re.compile(r"\]\(([^)#\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path):
    text = doc.read_text(encoding="utf-8")
    targets = [t for t in LINK.findall(text) if "://" not in t]
    missing = [t for t in targets if not (doc.parent / t).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} links to missing {missing}"


def _scaling_yaml() -> tuple[str, str]:
    """(file name, text) of the README's example scaling preset (``# conf/scaling/<name>.yaml``)."""
    text = README.read_text(encoding="utf-8")
    (block,) = [
        b for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S) if "conf/scaling/" in b
    ]
    name = re.search(r"# conf/scaling/(\w+\.yaml)", block).group(1)
    return name, block


def _compose_scaling(tmp_path: Path, text: str):
    """Compose the default job with ``text`` as a preset of the user's own config directory."""
    name, _ = _scaling_yaml()
    (tmp_path / "scaling").mkdir(exist_ok=True)
    (tmp_path / "scaling" / name).write_text(text, encoding="utf-8")
    overrides = [f"hydra.searchpath=[file://{tmp_path}]", f"scaling={name.removesuffix('.yaml')}"]
    cfg = compose_config(*overrides)
    return cfg, JobConfig.from_hydra(cfg)


def test_the_readme_scaling_preset_composes_from_a_user_config_dir(tmp_path):
    _, text = _scaling_yaml()
    cfg, _ = _compose_scaling(tmp_path, text)
    assert cfg.scaling.logn is True and cfg.scaling.params.factor == "auto"


def test_the_readme_scaling_preset_check_fails_on_an_unknown_method(tmp_path):
    """Negative control: the same preset naming a method nobody registered is refused."""
    _, text = _scaling_yaml()
    wrong = re.sub(r"^method: \w+", "method: no_such_method", text, flags=re.M)
    assert wrong != text
    with pytest.raises(ValueError, match="no_such_method"):
        _compose_scaling(tmp_path, wrong)


def test_the_readme_position_encoding_example_registers_and_runs():
    """The "Adding a position encoding" example, executed: the family registers, builds a model,
    its bias is the formula it states, and attention uses it (controls: zero slopes give NoPE's
    logits, and the registry refuses the name twice)."""
    import torch

    from models import positions
    from models.scaling import applicable_methods
    from models.transformer import DecoderLM, ModelConfig

    (example,) = [b for b in _python_blocks() if "@register_family" in b]
    name = re.search(r'name, acts_on = "(\w+)"', example).group(1)
    assert name not in positions.FAMILIES
    try:
        namespace: dict = {}
        exec(compile(example, "README.md", "exec"), namespace)
        cfg = positions.PositionConfig(kind=name)
        assert cfg.acts_on == "scores" and cfg.params() == {}
        assert applicable_methods(name) == ("default",)
        model_cfg = ModelConfig(n_layers=1, d_model=32, n_heads=4)
        torch.manual_seed(0)
        model = DecoderLM(model_cfg, cfg, train_length=16).eval()
        q_pos, k_pos = torch.tensor(9), torch.tensor(2)
        bias = model.family.score_bias(model, 10)(torch.tensor(1), q_pos, k_pos)
        expected = -positions.alibi_slopes(4)[1] * torch.log(torch.tensor(8.0))
        torch.testing.assert_close(bias, expected)
        torch.manual_seed(0)
        nope = DecoderLM(model_cfg, positions.PositionConfig(kind="nope"), train_length=16).eval()
        nope.load_state_dict(model.state_dict())
        ids = torch.randint(0, 200, (2, 24))
        with torch.no_grad():
            assert not torch.allclose(model(ids).logits, nope(ids).logits, atol=1e-4)
            model.slopes.zero_()
            torch.testing.assert_close(model(ids).logits, nope(ids).logits)
        with pytest.raises(ValueError, match="already registered"):
            positions.register_family(namespace["LogDistance"])
    finally:
        positions.FAMILIES.pop(name, None)
