"""M1-M3 (the recurrent and hybrid mixers, bench/findings/mixers.py) on hand-built rows with the
``mixer`` and ``hybrid_every`` columns: each holds where its claim is built in, does not hold in
the mirror case (negative control), is not decided where its premise is missing (M2: no
retrieval at L; M3: the pure model retrieves everywhere), and is not measured without its rows
(and out of scope without a mixer series)."""

from __future__ import annotations

import pandas as pd
import pytest

from bench.core.rows import normalize_results
from bench.findings import check_findings
from bench.findings.registry import FAILS, HOLDS, NOT_DECIDED, NOT_MEASURED, out_of_scope

from fixtures.rows import row

L = 64
SEEDS = (4, 5, 6)
MIXERS = ("gated_deltanet", "mamba2", "kda")


def metric_rows(
    position: str,
    metric: str,
    values: dict[int, float],
    n: int,
    ci: float | None = None,
    **switches,
) -> list[dict]:
    """One row per seed and eval length of ``metric`` (``values``: eval length -> value; seed
    noise +-0.01), a stored CI of +-``ci`` where given; ``switches``: mixer=..., hybrid_every=..."""
    tag = "-".join(f"{k}{v}" for k, v in switches.items())
    out = []
    for i, seed in enumerate(SEEDS):
        for length, value in values.items():
            v = min(1.0, max(0.0, value + 0.01 * (i - 1))) if metric == "passkey_acc" else (
                value + 0.01 * (i - 1)
            )  # fmt: skip
            bounds = {} if ci is None else {"ci_lo": v - ci, "ci_hi": v + ci}
            out.append(
                row(
                    experiment="mixers",
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
                )  # fmt: skip
            )
    return out


def nll_rows(position: str, nll_l: float, nll_4l: float, **switches) -> list[dict]:
    return metric_rows(position, "nll", {L: nll_l, 4 * L: nll_4l}, 1024, ci=0.02, **switches)


def passkey_rows(position: str, accs: dict[int, float], **switches) -> list[dict]:
    return metric_rows(position, "passkey_acc", accs, 200, **switches)


def statuses(rows: list[dict]) -> dict[str, str]:
    results = check_findings(normalize_results(pd.DataFrame(rows)))
    return {r.key: r.status for r in results if r.key.startswith("M")}


def result(rows: list[dict], key: str):
    return next(r for r in check_findings(normalize_results(pd.DataFrame(rows))) if r.key == key)


ROPE = nll_rows("rope", 2.0, 2.8)  # raw RoPE's ppl ratio 4L/L = e^0.8


@pytest.mark.parametrize("mixer", MIXERS)
def test_m1_holds_for_a_flat_recurrent_model_and_fails_where_it_collapses(mixer):
    flat = nll_rows("nope", 2.0, 2.05, mixer=mixer)  # ratio e^0.05 ~ 1.05
    assert statuses(ROPE + flat)["M1"] == HOLDS
    collapsed = nll_rows("nope", 2.0, 2.6, mixer=mixer)  # e^0.6: Stuffed Mamba's collapse
    assert statuses(ROPE + collapsed)["M1"] == FAILS
    assert any("Stuffed Mamba" in note for note in result(ROPE + collapsed, "M1").notes)


def test_m1_needs_raw_rope_on_the_same_recipe_and_every_mixer_to_hold():
    flat = nll_rows("nope", 2.0, 2.05, mixer="gated_deltanet")
    assert statuses(flat)["M1"] == NOT_MEASURED  # no RoPE to contrast with
    other_recipe = [dict(r, corpus_fingerprint="fp2") for r in ROPE]
    assert statuses(other_recipe + flat)["M1"] == NOT_MEASURED
    # flat, but so is RoPE: its ratio over RoPE's is 1.000 (CI [1.000, 1.000]), not below 1,
    # so "where RoPE's does not" fails
    flat_rope = nll_rows("rope", 2.0, 2.05)
    assert statuses(flat_rope + flat)["M1"] == FAILS
    # one mixer collapsing fails the finding though another is flat
    both = ROPE + flat + nll_rows("nope", 2.0, 2.6, mixer="mamba2")
    assert statuses(both)["M1"] == FAILS


def test_m1_reads_no_hybrid_as_a_recurrent_model():
    """A hybrid's attention layers make it no pure recurrent model: its rows are not M1's."""
    hybrid = nll_rows("rope", 2.0, 2.6, mixer="gated_deltanet", hybrid_every="4")
    assert "M1" not in statuses(ROPE + hybrid)
    assert "M1" in out_of_scope(normalize_results(pd.DataFrame(ROPE + hybrid)))


@pytest.mark.parametrize("mixer", MIXERS)
def test_m2_holds_when_retrieval_stops_beyond_l_and_fails_when_it_goes_on(mixer):
    stops = passkey_rows("nope", {L: 0.97, 2 * L: 0.01, 4 * L: 0.01}, mixer=mixer)
    assert statuses(stops)["M2"] == HOLDS
    goes_on = passkey_rows("nope", {L: 0.97, 2 * L: 0.9, 4 * L: 0.01}, mixer=mixer)
    assert statuses(goes_on)["M2"] == FAILS


def test_m2_is_not_decided_for_a_model_that_does_not_retrieve_at_l():
    never = passkey_rows("nope", {L: 0.2, 2 * L: 0.01}, mixer="mamba2")
    assert statuses(never)["M2"] == NOT_DECIDED
    assert any("does not retrieve at L" in n for n in result(never, "M2").notes)
    at_l_only = passkey_rows("nope", {L: 0.97}, mixer="mamba2")
    assert statuses(at_l_only)["M2"] == NOT_MEASURED


PURE_FAILS_BEYOND = passkey_rows("nope", {L: 0.97, 2 * L: 0.01}, mixer="gated_deltanet")


def test_m3_holds_when_the_hybrid_retrieves_where_the_pure_model_does_not():
    hybrid = passkey_rows("rope", {L: 0.98, 2 * L: 0.95}, mixer="gated_deltanet", hybrid_every="4")
    assert statuses(PURE_FAILS_BEYOND + hybrid)["M3"] == HOLDS
    failing = passkey_rows("rope", {L: 0.98, 2 * L: 0.02}, mixer="gated_deltanet", hybrid_every="4")
    assert statuses(PURE_FAILS_BEYOND + failing)["M3"] == FAILS


def test_m3_pairs_the_same_mixer_and_is_not_decided_where_the_pure_model_retrieves():
    hybrid = passkey_rows("rope", {L: 0.98, 2 * L: 0.95}, mixer="gated_deltanet", hybrid_every="4")
    retrieves = passkey_rows("nope", {L: 0.97, 2 * L: 0.95}, mixer="gated_deltanet")
    assert statuses(retrieves + hybrid)["M3"] == NOT_DECIDED
    other_mixer = passkey_rows("nope", {L: 0.97, 2 * L: 0.01}, mixer="mamba2")
    assert statuses(other_mixer + hybrid)["M3"] == NOT_MEASURED
    other_k = passkey_rows("rope", {L: 0.98, 2 * L: 0.95}, mixer="gated_deltanet", hybrid_every="2")
    assert statuses(PURE_FAILS_BEYOND + other_k)["M3"] == NOT_MEASURED  # not a 3 : 1 hybrid


def test_no_mixer_series_puts_every_m_finding_out_of_scope():
    rows = ROPE + passkey_rows("rope", {L: 0.97, 2 * L: 0.01})
    assert not statuses(rows)
    assert {"M1", "M2", "M3"} <= set(out_of_scope(normalize_results(pd.DataFrame(rows))))
