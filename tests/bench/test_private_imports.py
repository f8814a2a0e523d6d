"""No private helper is imported across modules (issue #52 item 4): a name that another module
needs is public (no leading underscore), so a module's private names are its own to change."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def private_imports(source: str) -> list[str]:
    """``module.name`` of every ``from bench|models... import _name`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in ("bench", "models"):
                found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_no_module_imports_another_modules_private_name():
    offenders = {}
    for path in sorted([*(ROOT / "bench").rglob("*.py"), *(ROOT / "models").rglob("*.py")]):
        names = private_imports(path.read_text(encoding="utf-8"))
        if names:
            offenders[str(path.relative_to(ROOT))] = names
    assert offenders == {}


def test_the_check_finds_a_private_import():
    """Negative control: a private name is found, inside a function too; a public one is not."""
    code = "def f():\n    from bench.train.checkpoints import DONE_FILE, _resolve\n"
    assert private_imports(code) == ["bench.train.checkpoints._resolve"]
    public = "from bench.train.checkpoints import load_model\nfrom os import _exit\n"
    assert private_imports(public) == []
