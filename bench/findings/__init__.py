"""The field's known qualitative findings, checked against a results table.

A finding is one declaration (:func:`register_finding`): id, claim, source, thresholds fixed in
advance, :class:`Scope` (the series it is about) and a check ``(df) -> FindingResult`` whose
status is ``holds`` / ``does not hold`` / ``not decided`` (an interval straddles the threshold)
/ ``not measured`` (its rows are absent: never ``holds``), with the numbers and CIs it used.

Stage 5 of ``bench``. The package: :mod:`~bench.findings.rows` (which rows a finding reads), :mod:`~bench.findings.estimates`
(perplexity ratios, NLL differences, accuracies from rows), :mod:`~bench.findings.shift` (the
shift probe's checks, shared by F6 and Z1), :mod:`~bench.findings.registry`
(the registry, scope, results, and the registry as Markdown: ``python -m bench.findings``
writes ``reports/FINDINGS.md``), and one module per study, found by a scan of this folder:
:mod:`~bench.findings.core` (F1-F6), :mod:`~bench.findings.zoo` (Z1, Z2),
:mod:`~bench.findings.training_free` (T1-T3), :mod:`~bench.findings.train_for_length`
(L1-L3), :mod:`~bench.findings.ruler` (R1, R2). A new study is one more module here.

The statistics (estimates, intervals, :func:`decide`) are :mod:`bench.core.stats`. May import
``bench.core`` only (series, stats, results); the report imports it.
Every public name of the modules below is importable from ``bench.findings``.
"""

from bench.core.stats import (
    ACC_CI,
    BOOTSTRAP,
    CURVE_CI,
    DOC_CI,
    LEVEL,
    MAX_SEEDS_TO_DECIDE,
    NO_CI,
    RUN_CI,
    SEED_ACC_CI,
    SEED_CI,
    SEED_DOC_CI,
    UNDECIDED,
    Check,
    Estimate,
    decide,
    normal_half_width,
    se_from_ci,
    seed_doc_interval,
    seeds_to_decide,
    summarise,
    t_half_width,
    widened,
    wilson,
)
from bench.findings.core import (
    ALIBI_MAX_RATIO,
    F4_METHODS,
    IN_DISTRIBUTION_MIN_ACC,
    NEAR_ZERO_ACC,
    PAIR_COLUMNS,
    PARENT_MIN_ACC,
    PRESS,
    RETRIEVAL_MIN_ACC,
    Curve,
    check_raw_rope_beyond,
    f1_absolute_degrade,
    f2_alibi_flat,
    f3_rope_scaling,
    f4_finetune_retrieval,
    f5_rope_passkey_at_l,
    f6_shift_probe,
    parents_left_out,
    recovery_curves,
    without_parents,
)
from bench.findings.estimates import (
    FAR,
    Term,
    accuracy_estimate,
    difference_estimate,
    log_ratio_per_seed,
    nll_difference,
    ppl_ratio,
    ppl_ratios,
    ratio_of_ratios,
    seed_doc_bootstrap,
    seed_doc_bootstrap_terms,
)
from bench.findings.registry import (
    CONTIGUOUS,
    FAILS,
    FINDINGS,
    FINDINGS_PAGE,
    HOLDS,
    NO_SINK,
    NOT_DECIDED,
    NOT_MEASURED,
    PRETRAINED,
    PRETRAINED_RECIPE,
    SCOPE_DEFAULTS,
    TRAINED,
    Finding,
    FindingResult,
    Scope,
    all_of,
    any_failed,
    check_findings,
    findings,
    findings_markdown,
    findings_table,
    in_scope,
    model_source,
    out_of_scope,
    register_finding,
    status,
    study_modules,
)
from bench.findings.rows import (
    at,
    by_series,
    col,
    doc_sums,
    named,
    passkey,
    passkey_labels,
    passkey_series,
    per_seed,
    select,
    shift_rows,
    template,
    trials,
    window_nll,
    with_series,
)
from bench.findings.shift import SHIFT_ZERO_TOL, shift_invariant_checks, shift_sensitive_checks

__all__ = [
    "ACC_CI", "ALIBI_MAX_RATIO", "BOOTSTRAP", "CONTIGUOUS", "CURVE_CI", "DOC_CI", "F4_METHODS",
    "FAILS", "FAR", "FINDINGS", "FINDINGS_PAGE", "HOLDS", "IN_DISTRIBUTION_MIN_ACC", "LEVEL",
    "MAX_SEEDS_TO_DECIDE", "NEAR_ZERO_ACC", "NO_CI", "NO_SINK", "NOT_DECIDED", "NOT_MEASURED",
    "PAIR_COLUMNS", "PARENT_MIN_ACC", "PRESS", "PRETRAINED", "PRETRAINED_RECIPE",
    "RETRIEVAL_MIN_ACC", "RUN_CI", "SCOPE_DEFAULTS", "SEED_ACC_CI", "SEED_CI", "SEED_DOC_CI",
    "SHIFT_ZERO_TOL", "TRAINED", "UNDECIDED", "Check", "Curve",
    "Estimate", "Finding", "FindingResult", "Scope", "Term", "accuracy_estimate", "all_of",
    "any_failed", "at", "by_series", "check_findings", "check_raw_rope_beyond", "col", "decide",
    "difference_estimate", "doc_sums", "f1_absolute_degrade", "f2_alibi_flat", "f3_rope_scaling",
    "f4_finetune_retrieval", "f5_rope_passkey_at_l", "f6_shift_probe", "findings",
    "findings_markdown", "findings_table", "in_scope", "log_ratio_per_seed", "model_source",
    "named",
    "nll_difference", "normal_half_width", "out_of_scope", "parents_left_out", "passkey",
    "passkey_labels", "passkey_series", "per_seed", "ppl_ratio", "ppl_ratios", "ratio_of_ratios",
    "recovery_curves", "register_finding", "se_from_ci", "seed_doc_bootstrap",
    "seed_doc_bootstrap_terms", "seed_doc_interval", "seeds_to_decide", "select", "shift_rows",
    "shift_invariant_checks", "shift_sensitive_checks", "status", "study_modules", "summarise",
    "t_half_width", "template", "trials", "widened", "wilson", "window_nll", "with_series",
    "without_parents",
]  # fmt: skip
