"""models/ is the bottom layer (issue #52 item 6, its first rule): no module of models/ imports
anything of bench/, at any depth of a function or a type-checking block (checked on the source,
so a lazy import counts too)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def bench_imports(source: str) -> list[str]:
    """Every module name starting with ``bench`` that ``source`` imports, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "bench"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "bench":
                found.append(node.module)
    return found


def test_models_import_nothing_of_bench():
    offenders = {
        str(path.relative_to(ROOT)): bench_imports(path.read_text(encoding="utf-8"))
        for path in sorted((ROOT / "models").rglob("*.py"))
    }
    assert len(offenders) > 10  # the scan saw the package
    assert {p: names for p, names in offenders.items() if names} == {}


def test_the_check_finds_a_lazy_import():
    """Negative control: an import inside a function is found."""
    assert bench_imports("def f():\n    from bench.train.checkpoints import load_model\n") == [
        "bench.train.checkpoints"
    ]
    assert bench_imports("import benchmark\nfrom models import x\n") == []
