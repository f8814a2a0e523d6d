"""N1-N6 (the 2025 zoo, bench/findings/zoo_2025.py) on hand-built rows: each holds where its claim
is built in, fails in the mirror case (negative control), and is not measured without its rows."""

from __future__ import annotations

import pandas as pd
import pytest

from bench.core.rows import normalize_results
from bench.findings import check_findings
from bench.findings.registry import FAILS, HOLDS, NOT_DECIDED, NOT_MEASURED

from fixtures.rows import row

L = 64
SEEDS = (4, 5, 6)


def nll_rows(position: str, nll_l: float, nll_4l: float, **switches) -> list[dict]:
    """Whole-window NLL at L and 4L of one model per seed (seed noise +-0.01), with stored CIs."""
    return metric_rows(position, "nll", {L: nll_l, 4 * L: nll_4l}, 1024, ci=0.02, **switches)


def metric_rows(
    position: str,
    metric: str,
    values: dict[int, float],
    n: int,
    ci: float | None = None,
    **switches,
) -> list[dict]:
    """One row per seed and eval length of ``metric`` (``values``: eval length -> value; seed
    noise +-0.01), with a stored CI of +-``ci`` where given."""
    tag = "-".join(f"{k}{v}" for k, v in switches.items())
    out = []
    for i, seed in enumerate(SEEDS):
        for length, value in values.items():
            v = value + 0.01 * (i - 1)
            bounds = {} if ci is None else {"ci_lo": v - ci, "ci_hi": v + ci}
            out.append(
                row(
                    experiment="zoo_2025",
                    run_id=f"{position}{tag}-{metric}-s{seed}",
                    model_id=f"m-{position}{tag}-s{seed}",
                    position=position,
                    position_params={},
                    train_length=L,
                    eval_length=length,
                    seed=seed,
                    metric=metric,
                    value=v,
                    n=n,
                    **bounds,
                    **switches,
                )
            )
    return out


def statuses(rows: list[dict]) -> dict[str, str]:
    results = check_findings(normalize_results(pd.DataFrame(rows)))
    return {r.key: r.status for r in results if r.key.startswith("N")}


ROPE = nll_rows("rope", 2.0, 2.8)  # ppl ratio 4L/L = e^0.8
FLAT = (2.0, 2.05)  # ppl ratio e^0.05 ~ 1.05: below RoPE's and below 1.1


@pytest.mark.parametrize(
    ("key", "treated", "mirror"),
    [
        ("N1", nll_rows("fox", *FLAT), nll_rows("fox", 2.0, 3.5)),
        ("N2", nll_rows("pope", *FLAT), nll_rows("pope", 2.0, 3.5)),
        (
            "N3",
            nll_rows("nope", *FLAT, attention="stick_breaking"),
            nll_rows("nope", 2.0, 2.3, attention="stick_breaking"),
        ),
        (
            "N4",
            nll_rows("rope", *FLAT, attn_scale="ssmax"),
            nll_rows("rope", 2.0, 3.5, attn_scale="ssmax"),
        ),
    ],
)
def test_the_perplexity_findings_hold_and_fail_in_the_mirror_case(key, treated, mirror):
    assert statuses(ROPE + treated)[key] == HOLDS
    assert statuses(ROPE + mirror)[key] == FAILS


def test_n5_needs_less_first_token_mass_and_no_worse_perplexity():
    plain = ROPE + metric_rows("rope", "attn_first_mass", {L: 0.6}, 1000)
    gate = nll_rows("rope", 2.0, 2.8, output_gate="sigmoid")
    low = metric_rows("rope", "attn_first_mass", {L: 0.1}, 1000, output_gate="sigmoid")
    assert statuses(plain + gate + low)["N5"] == HOLDS
    high = metric_rows("rope", "attn_first_mass", {L: 0.9}, 1000, output_gate="sigmoid")
    assert statuses(plain + gate + high)["N5"] == FAILS
    worse = nll_rows("rope", 2.1, 2.9, output_gate="sigmoid")  # ppl(L) up by e^0.1 ~ 10%
    assert statuses(plain + worse + low)["N5"] == FAILS
    # the mass unmeasured: not decided on it, so never holds
    assert statuses(ROPE + gate)["N5"] != HOLDS


def test_n6_reads_passkey_beyond_l_only():
    rope = metric_rows("rope", "passkey_acc", {L: 0.95, 2 * L: 0.8, 4 * L: 0.6}, 200)
    lower = metric_rows(
        "rope", "passkey_acc", {L: 0.95, 2 * L: 0.3, 4 * L: 0.1}, 200, qk_norm="rms"
    )
    assert statuses(rope + lower)["N6"] == HOLDS
    higher = metric_rows(
        "rope", "passkey_acc", {L: 0.2, 2 * L: 0.95, 4 * L: 0.9}, 200, qk_norm="rms"
    )
    assert statuses(rope + higher)["N6"] == FAILS  # worse at L only: beyond L it is better


def test_n6_is_not_decided_where_raw_rope_retrieves_nothing_beyond_l():
    """Raw RoPE at 0-2% beyond L (its accuracy's upper end below 0.1): nothing for QK-norm to lower, so
    not decided with a note, whatever QK-norm scores; at 15% the same equal scores fail."""
    floor = metric_rows("rope", "passkey_acc", {L: 0.95, 2 * L: 0.01, 4 * L: 0.01}, 200)
    for beyond in (0.01, 0.5):
        normed = metric_rows(
            "rope", "passkey_acc", {L: 0.95, 2 * L: beyond, 4 * L: beyond}, 200, qk_norm="rms"
        )
        result = n6(floor + normed)
        assert result.status == NOT_DECIDED
        assert any("nothing for QK-norm to lower" in note for note in result.notes)
    above = metric_rows("rope", "passkey_acc", {L: 0.95, 2 * L: 0.15, 4 * L: 0.15}, 200)
    same = metric_rows(
        "rope", "passkey_acc", {L: 0.95, 2 * L: 0.15, 4 * L: 0.15}, 200, qk_norm="rms"
    )
    assert n6(above + same).status == FAILS and not n6(above + same).notes


def test_n6_counts_each_passkey_trial_once():
    """A run writes per-template rows and per-depth rows of the same trials: N6 reads the
    per-template ones only, so adding the per-depth copies changes no estimate (control: read
    together, the trial count doubles and the floor's Wilson interval, 20 trials a row, narrows)."""
    floor = metric_rows("rope", "passkey_acc", {L: 0.95, 2 * L: 0.01, 4 * L: 0.01}, 20)
    normed = metric_rows(
        "rope", "passkey_acc", {L: 0.95, 2 * L: 0.3, 4 * L: 0.3}, 20, qk_norm="rms"
    )
    per_template = [{**r, "axis": "template", "axis_value": "standard"} for r in floor + normed]
    per_depth = [{**r, "axis": "depth", "axis_value": 0.5} for r in floor + normed]
    alone, both = n6(per_template), n6(per_template + per_depth)
    assert [(e.value, e.lo, e.hi) for e in both.estimates] == [
        (e.value, e.lo, e.hi) for e in alone.estimates
    ]
    doubled = n6([{**r, "axis": "template"} for r in per_depth] + per_template)  # control
    assert doubled.estimates[1].hi < alone.estimates[1].hi


def n6(rows: list[dict]):
    results = check_findings(normalize_results(pd.DataFrame(rows)))
    return next(r for r in results if r.key == "N6")


def test_a_finding_about_a_switch_is_out_of_scope_without_it():
    got = statuses(ROPE + nll_rows("nope", 2.0, 2.1))
    assert "N3" not in got and "N4" not in got and "N5" not in got and "N6" not in got
    assert statuses(ROPE + nll_rows("fox", *FLAT))["N1"] == HOLDS
    assert statuses(nll_rows("fox", *FLAT))["N1"] == NOT_MEASURED  # no RoPE to compare with
