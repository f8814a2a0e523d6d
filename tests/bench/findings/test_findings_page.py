"""The findings are declared once (bench/findings/): the page reports/FINDINGS.md is the
registry rendered, and the README points to it instead of restating the claims."""

from __future__ import annotations

import re
from pathlib import Path

from bench.findings import FINDINGS_PAGE, findings, findings_markdown
from bench.findings.__main__ import main

ROOT = Path(__file__).resolve().parents[3]


def test_the_committed_findings_page_is_the_registry() -> None:
    page = (ROOT / FINDINGS_PAGE).read_text(encoding="utf-8")
    assert page == findings_markdown(), "run: python -m bench.findings"
    for key, f in findings().items():
        assert f"## {key}\n\n**Claim.** {f.claim}\n" in page
        assert f.scope.describe() in page and f.source in page


def test_the_page_command_writes_and_checks(tmp_path: Path) -> None:
    out = tmp_path / "FINDINGS.md"
    assert main(["--out", str(out), "--check"]) == 1  # negative control: no page yet
    assert main(["--out", str(out)]) == 0 and out.read_text() == findings_markdown()
    assert main(["--out", str(out), "--check"]) == 0
    out.write_text(out.read_text().replace("## F1", "## F0"))
    assert main(["--out", str(out), "--check"]) == 1


def test_every_finding_is_declared_once_with_claim_source_and_a_study_module() -> None:
    registered = findings()
    assert list(registered)[:6] == ["F1", "F2", "F3", "F4", "F5", "F6"]
    assert [k[0] for k in registered] == sorted((k[0] for k in registered), key="FZTLRPN".index)
    for key, f in registered.items():
        assert f.claim and f.source, key
        assert f.module.startswith("bench.findings."), key


def test_the_readme_points_to_the_page_and_restates_no_claim() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Findings\n", 1)[1].split("\n## ", 1)[0]
    assert f"]({FINDINGS_PAGE})" in section
    # no bullet list of claims: a claim lives in its declaration only
    assert not re.search(r"^- \*\*[FZTLRP]\d\*\*", section, re.M)


#: "Findings X1-X3 (bench/findings/<module>.py)" or "Findings X1 and X2 (...)" in a comment
NAMED = re.compile(
    r"Findings ([A-Z])(\d)(?:-[A-Z](\d)| and [A-Z](\d)) \(bench/findings/(\w+)\.py\)"
)


def test_each_experiment_names_the_findings_its_module_registers() -> None:
    """A study's config comment names its findings and their module as the registry has them
    (the train-for-length config once named T1-T3 for L1-L3)."""
    by_module: dict[str, set[str]] = {}
    for key, f in findings().items():
        by_module.setdefault(f.module.rsplit(".", 1)[1], set()).add(key)
    named = {}
    for path in sorted((ROOT / "conf" / "experiment").glob("*.yaml")):
        comment = " ".join(
            line.lstrip("# ").strip() for line in path.read_text().splitlines() if line[:1] == "#"
        )
        for letter, first, last, second, module in NAMED.findall(comment):
            keys = {f"{letter}{i}" for i in range(int(first), int(last or second) + 1)}
            named[path.stem] = module
            assert by_module.get(module) == keys, (path.name, module, sorted(keys))
    assert set(named.values()) == {"zoo", "training_free", "train_for_length", "ruler", "zoo_2025"}
    # negative control: the old comment's keys are not what the module registers
    assert by_module["train_for_length"] != {"T1", "T2", "T3"}
