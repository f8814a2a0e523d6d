"""bench/ is grouped by stage, in the order data flows (issue #52 item 6): a module imports only
its own stage and the stages before it. Checked on the source, so a lazy import inside a function
counts; only an import under ``if TYPE_CHECKING:`` (never run) may name a later stage."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The stages, bottom first; ``bench.cli``, ``bench.job``, ``bench.schema`` and
#: ``bench.trained_source`` (the job pipeline) sit on top and may import every stage.
STAGES = ("core", "data", "tasks", "eval", "train", "findings", "report", "pretrained", "harness")
TOP = len(STAGES)


def floor(module: str) -> int:
    """The stage index of a dotted ``bench`` module name (``TOP`` for the pipeline on top)."""
    parts = module.split(".")
    return STAGES.index(parts[1]) if len(parts) > 1 and parts[1] in STAGES else TOP


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def run_time_imports(source: str) -> list[str]:
    """The ``bench`` modules ``source`` imports when it runs (anywhere but a TYPE_CHECKING block)."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend(a.name for a in node.names if a.name.split(".")[0] == "bench")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "bench":
                found.append(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def backward_imports(module: str, source: str) -> list[str]:
    """The imports of ``module`` that run against the stage order."""
    own = floor(module)
    return [name for name in run_time_imports(source) if floor(name) > own]


def test_every_stage_imports_only_stages_before_it():
    paths = sorted((ROOT / "bench").rglob("*.py"))
    seen = {floor(module_name(p)) for p in paths}
    assert seen == set(range(TOP + 1))  # the scan saw every stage and the pipeline
    offenders = {
        module_name(p): backward_imports(module_name(p), p.read_text(encoding="utf-8"))
        for p in paths
    }
    assert {m: names for m, names in offenders.items() if names} == {}


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_says_what_it_owns_and_may_import(stage):
    doc = ast.get_docstring(ast.parse((ROOT / "bench" / stage / "__init__.py").read_text()))
    assert doc and "import" in doc.lower()


def test_the_check_finds_a_backward_import():
    """Negative controls: a lazy import of a later stage is found, a type-only one is not, and
    the top of the pipeline may import anything."""
    lazy = "def f():\n    from bench.train.checkpoints import load_model\n"
    assert backward_imports("bench.eval.metrics.nll", lazy) == ["bench.train.checkpoints"]
    assert backward_imports("bench.core.results", "import bench.data.corpora\n") == [
        "bench.data.corpora"
    ]
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from bench.schema import J\n"
    assert backward_imports("bench.train.trainer", typed) == []
    assert backward_imports("bench.job", lazy) == []
    assert backward_imports("bench.train.trainer", "from bench.eval.metrics import x\n") == []
