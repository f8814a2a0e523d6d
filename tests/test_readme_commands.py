"""Every ``lenbench`` command the README (and the READMEs its measurements moved to) shows
composes and validates as a job; every script they name exists and every relative link resolves;
the README's scaling-method example registers and runs, and its preset composes from a user's
config directory (each with a negative control).

The documents' code blocks are parsed; each ``lenbench ...`` line (with ``\\`` continuations, and
the ``VAR=value`` assignments it may start with) is split into words by bash itself (brace
expansion, globbing, quotes and ``$VARS`` as a reader's shell does them), parsed as lenbench's
command line (Hydra's flags, then the overrides: an override before ``--config-dir`` is an
error), then composed by Hydra with its overrides (the first value of a sweep list, hydra.* keys
with the Hydra config; its PYTHONPATH on the path and its --config-dir searched, with
docs/extending.md's ``~/my_code`` built in a temporary ``$HOME``) and parsed into a typed
JobConfig, which is what every job does first: a command that would stop with an error (a key
that does not exist, two options that exclude each other) fails here. Every command (``lenbench-harness`` and ``lenbench-report`` too,
the command examples in conf/ comments) and every Hydra list or dict override the prose shows
must reach the program as written: an unquoted ``key=[a,b]`` (a glob pattern: bash keeps it only
while no file matches, zsh refuses it) or ``key=[{a:1,b:[x,y]}]`` (brace-expanded into several
words) fails. Placeholders in angle brackets are filled with a plausible value.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.schema import JobConfig

from fixtures import ROOT
from fixtures.jobs import compose_config, compose_job
from fixtures.user_code import METRIC

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


#: a leading environment assignment of a command line: ``PYTHONPATH=~/my_code lenbench ...``
ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=(?:'[^']*'|\"[^\"]*\"|[^\s'\"])*")


def program_of(line: str) -> str:
    """The program a command line runs: its first word after any ``VAR=value`` assignments."""
    rest = line.strip()
    while (match := ASSIGNMENT.match(rest)) and rest[match.end() : match.end() + 1].isspace():
        rest = rest[match.end() :].lstrip()
    return rest.split(" ")[0]


def readme_commands(path: Path = README, programs: tuple[str, ...] = ("lenbench",)) -> list[str]:
    """The command lines of ``path``'s bash blocks that run one of ``programs``, with the
    environment assignments they start with (``VAR=value lenbench ...``)."""
    text = path.read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split("  #")[0].strip()
            if program_of(line) in programs:
                commands.append(line)
    return commands


# ------------------------------------------------------------------- what bash makes of a command

#: what a command line must not hold to be handed to bash here: it is one simple command
UNSAFE = re.compile(r"[;&|<>`\n]|\$\(")
#: the environment bash expands ``$VARS`` from (the documents use $HOME)
BASH_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.path.expanduser("~")}


def _fill_placeholders(text: str) -> str:
    return re.sub(r"<[^>]+>", "placeholder", text)


def bash_words(
    command: str, setup: str = "shopt -s failglob", home: Path | None = None
) -> list[str]:
    """The words bash makes of ``command`` (placeholders filled), in an empty folder.

    ``setup`` runs first: by default ``failglob``, so that an unquoted glob pattern such as a
    Hydra list ``key=[a,b]`` is an error rather than kept only while no file matches. ``home``:
    the ``$HOME`` (and ``~``) it expands, the user's by default.
    """
    command = _fill_placeholders(command)
    if UNSAFE.search(command):
        raise ValueError(f"{command!r} is not one simple command (; & | < > ` $( or a newline).")
    with tempfile.TemporaryDirectory() as empty:
        proc = subprocess.run(
            ["bash", "--norc", "--noprofile", "-c", f"{setup}\nprintf '%s\\0' {command}"],
            cwd=empty,
            env=BASH_ENV if home is None else {**BASH_ENV, "HOME": str(home)},
            capture_output=True,
            text=True,
            timeout=30,
        )
    if proc.returncode != 0:
        raise ValueError(f"bash refuses {command!r}: {proc.stderr.strip()}")
    return proc.stdout.split("\0")[:-1]


def pasted_words(command: str, home: Path | None = None) -> list[str]:
    """The words ``command`` reaches its program with when pasted into bash (its leading
    ``VAR=value`` assignments first); a ValueError when bash's brace expansion or globbing
    changes them (the words differ from bash's with both turned off) or an unquoted glob pattern
    matches no file."""
    words = bash_words(command, home=home)
    literal = bash_words(command, setup="set +B -f", home=home)  # no brace expansion, no globbing
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


def split_environment(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """(the leading ``VAR=value`` assignments of a command's words, the program and its
    arguments): what bash puts in the program's environment and what it passes it."""
    env = {}
    while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0], flags=re.S):
        key, _, value = words[0].partition("=")
        env[key], words = value, words[1:]
    return env, words


def lenbench_arguments(args: list[str]):
    """``lenbench``'s arguments parsed as it parses them (Hydra's command line: flags, then the
    overrides); a ValueError with argparse's message where it would stop (an override before
    ``--config-dir`` leaves the overrides after it ``unrecognized arguments``)."""
    import io

    from hydra._internal.utils import get_args_parser

    parser, err = get_args_parser(), io.StringIO()
    parser.prog = "lenbench"
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(args)
    except SystemExit:
        message = err.getvalue().strip().splitlines()[-1:] or ["refused"]
        raise ValueError(f"lenbench {' '.join(args)!r}: {message[0]}") from None


def _overrides(command: str, home: Path | None = None) -> tuple[list[str], list[str], Command]:
    """(job overrides, hydra overrides, what else it sets) of one command line; ``home`` is the
    ``$HOME`` bash expands."""
    env, argv = split_environment(pasted_words(command, home))  # what the program gets from bash
    args = lenbench_arguments(argv[1:])
    assert args.config_name is None and args.config_path is None, command  # config.yaml only
    hydra_overrides(args.overrides)
    job, hydra = [], []
    for arg in args.overrides:
        key, _, value = arg.partition("=")
        arg = f"{key}={_first(value)}" if value else arg
        (hydra if key.startswith("hydra") else job).append(arg)
    return job, hydra, Command(env, args.config_dir, args.overrides)


@dataclass
class Command:
    """What a command line sets besides its overrides: its environment and ``--config-dir``."""

    env: dict[str, str]
    config_dir: str | None
    overrides: list[str]

    def folders(self) -> list[str]:
        """The folders it names for the user's code: PYTHONPATH's entries, --config-dir."""
        path = [p for p in self.env.get("PYTHONPATH", "").split(os.pathsep) if p]
        return [*path, *([self.config_dir] if self.config_dir else [])]


COMMANDS = [c for doc in DOCS if doc.exists() for c in readme_commands(doc)]


def test_the_readme_shows_commands():
    assert len(readme_commands()) >= 15, readme_commands()
    assert all(doc.exists() for doc in DOCS), [d for d in DOCS if not d.exists()]


def write_user_code(home: Path) -> None:
    """The user's code that docs/extending.md's commands name (``~/my_code``), in ``home`` (the
    ``$HOME`` the commands are expanded in): a package with a metric and a config folder with a
    scaling preset."""
    code = home / "my_code"
    (code / "my_pkg").mkdir(parents=True)
    (code / "my_pkg" / "__init__.py").write_text("")
    (code / "my_pkg" / "metrics.py").write_text(METRIC.format(name="my_metric"))
    (code / "conf" / "scaling").mkdir(parents=True)
    (code / "conf" / "scaling" / "my_pi.yaml").write_text(
        "name: my_pi\nmethod: linear\nparams: {factor: auto}\n"
    )


@contextlib.contextmanager
def user_code(command: Command):
    """The command's PYTHONPATH on sys.path while it composes (its ``--config-dir`` is searched
    by the caller); the registries and modules its extensions add are removed afterwards."""
    import sys

    from bench.eval.metrics import METRICS
    from models.positions import FAMILIES
    from models.scaling import SCALING_METHODS

    missing = [f for f in command.folders() if not Path(f).is_dir()]
    assert not missing, f"the command names {missing}: build them in write_user_code"
    registries = (METRICS, FAMILIES, SCALING_METHODS)
    before = [set(r) for r in registries]
    modules, path = set(sys.modules), list(sys.path)
    sys.path[:0] = [f for f in command.env.get("PYTHONPATH", "").split(os.pathsep) if f]
    try:
        yield
    finally:
        sys.path[:] = path
        for registry, names in zip(registries, before, strict=True):
            for name in set(registry) - names:
                registry.pop(name)
        for name in set(sys.modules) - modules:
            sys.modules.pop(name)


def compose_command(command: str, home: Path) -> None:
    """Compose and check one document command as ``lenbench`` would (its environment's
    PYTHONPATH and ``--config-dir`` included), with the user's code of the documents in
    ``home``."""
    job, hydra, parsed = _overrides(command, home)
    if not parsed.overrides and program_of(command) == command.strip():
        job = ["+experiment=quickstart"]  # what lenbench with no arguments runs
    if parsed.config_dir:  # what --config-dir does: the folder searched before lenbench's
        job = [f"hydra.searchpath=[file://{os.path.abspath(parsed.config_dir)}]", *job]
    with user_code(parsed):
        compose_job(*job)
        if hydra:
            compose_config(*job, *hydra, hydra=True)


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_composes_and_validates(command: str, tmp_path):
    write_user_code(tmp_path)
    compose_command(command, tmp_path)


def test_a_command_with_an_environment_is_checked(tmp_path):
    """Issue #75: a command that starts ``VAR=value`` is one of the documents' commands and is
    checked like the others; docs/extending.md's former line (overrides before --config-dir,
    its list unquoted) is caught, and so is its order once quoted; the fixed line composes with
    the user's preset and metric (control), and without its --config-dir it does not."""
    write_user_code(tmp_path)
    fixed = (
        "PYTHONPATH=~/my_code lenbench --config-dir ~/my_code/conf 'extensions=[my_pkg]' "
        "scaling=my_pi +eval.my_metric.enabled=true"
    )
    assert fixed in [" ".join(c.split()) for c in COMMANDS]  # the documented command is checked
    compose_command(fixed, tmp_path)  # control
    old = (
        "PYTHONPATH=~/my_code lenbench extensions=[my_pkg] --config-dir ~/my_code/conf "
        "scaling=my_pi +eval.my_metric.enabled=true"
    )
    assert program_of(old) == "lenbench"  # found as a command (it was skipped as PYTHONPATH=...)
    with pytest.raises(ValueError, match="no match"):  # a glob pattern to bash
        compose_command(old, tmp_path)
    quoted = old.replace("extensions=[my_pkg]", "'extensions=[my_pkg]'")
    with pytest.raises(ValueError, match="unrecognized arguments: scaling=my_pi"):
        compose_command(quoted, tmp_path)
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException, match="scaling/my_pi"):  # the user's preset
        compose_command(fixed.replace(" --config-dir ~/my_code/conf", ""), tmp_path)
    env, words = split_environment(pasted_words(fixed, tmp_path))
    assert env == {"PYTHONPATH": str(tmp_path / "my_code")} and words[0] == "lenbench"


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
    assert {program_of(c) for c in ALL_COMMANDS} == set(PROGRAMS), ALL_COMMANDS
    assert any(c.startswith("lenbench") for c in conf_commands())
    assert len(prose_overrides()) >= 5, prose_overrides()


@pytest.mark.parametrize("command", ALL_COMMANDS)
def test_every_command_reaches_its_program_as_written(command: str):
    """Pasted into bash, a command gives its program the words it shows (nothing brace-expanded,
    no glob pattern left to chance), and each Hydra override among them parses."""
    _, words = split_environment(pasted_words(command))
    assert words[0] in PROGRAMS
    if words[0] == "lenbench":
        hydra_overrides(lenbench_arguments(words[1:]).overrides)


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
