"""The findings are declared once (bench/findings/): the page reports/FINDINGS.md is the
registry rendered, and the README points to it instead of restating the claims."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.findings import FINDINGS_PAGE, findings, findings_markdown
from bench.findings.__main__ import main
from bench.findings.registry import (
    FINDINGS,
    Finding,
    FindingResult,
    Scope,
    register_finding,
)

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


def study_letters(registered: dict[str, Finding]) -> list[str]:
    """The key letters of the registered findings, one per study module in the registry's order
    (the modules' ``ORDER``), derived from the registry, with what makes a letter a study's:
    each module's findings share one letter, no two modules share one, and the findings of a
    letter are listed together."""
    by_module: dict[str, set[str]] = {}
    for key, f in registered.items():
        by_module.setdefault(f.module, set()).add(key[0])
    mixed = {m: sorted(letters) for m, letters in by_module.items() if len(letters) > 1}
    assert not mixed, f"a study module's findings share one key letter: {mixed}"
    letters = [min(module_letters) for module_letters in by_module.values()]
    shared = sorted({x for x in letters if letters.count(x) > 1})
    assert not shared, f"key letter(s) {shared} belong to more than one study module"
    keys = [k[0] for k in registered]
    assert keys == sorted(keys, key=letters.index), f"findings not grouped by study: {keys}"
    return letters


def test_every_finding_is_declared_once_with_claim_source_and_a_study_module() -> None:
    registered = findings()
    assert list(registered)[:6] == ["F1", "F2", "F3", "F4", "F5", "F6"]
    assert study_letters(registered)[0] == "F"  # the core study first (ORDER = 0)
    for key, f in registered.items():
        assert f.claim and f.source, key
        assert f.module.startswith("bench.findings."), key


def _registered_in(module: str, key: str) -> Finding:
    """A finding ``key`` registered as if declared in the study module ``module``."""

    def check(df):
        return FindingResult()

    check.__module__ = module
    return register_finding(key, Scope(), claim="a claim", source="a source")(check)


def test_a_new_studys_finding_needs_no_letter_list() -> None:
    """Issue #75: a finding of a new study (a new key letter) passes the registry's checks with
    no list to edit (against the former letters "FZTLRPN" it failed with a bare ``substring not
    found``); two letters in one study, or one letter in two studies, is one sentence
    (controls)."""
    try:
        _registered_in("bench.findings.x_study", "X1")
        assert study_letters(findings())[-1] == "X" and "## X1" in findings_markdown()
        _registered_in("bench.findings.x_study", "Q1")
        with pytest.raises(AssertionError, match=r"share one key letter: .*\['Q', 'X'\]"):
            study_letters(findings())
        FINDINGS.pop("Q1")
        _registered_in("bench.findings.y_study", "Z9")
        with pytest.raises(AssertionError, match=r"key letter\(s\) \['Z'\] belong to more than"):
            study_letters(findings())
    finally:
        for key in ("X1", "Q1", "Z9"):
            FINDINGS.pop(key, None)
    assert study_letters(findings())[-1] != "X"  # removed again


def test_the_readme_points_to_the_page_and_restates_no_claim() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Findings\n", 1)[1].split("\n## ", 1)[0]
    assert f"]({FINDINGS_PAGE})" in section
    # no bullet list of claims: a claim lives in its declaration only
    letters = "".join(study_letters(findings()))  # every study's, N too
    assert not re.search(rf"^- \*\*[{letters}]\d\*\*", section, re.M)


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
    # the comments were parsed (a new study's experiment may add its module; none is listed)
    assert {"zoo", "training_free", "train_for_length", "ruler", "zoo_2025"} <= set(named.values())
    # negative control: the old comment's keys are not what the module registers
    assert by_module["train_for_length"] != {"T1", "T2", "T3"}
