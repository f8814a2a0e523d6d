"""The metric registry: the README's "Adding a metric" example, run end to end, and its controls."""

import dataclasses
import math
import re

import pytest
import torch
from omegaconf import OmegaConf

from bench.core.checks import integer
from bench.eval.evaluate import evaluate_model
from bench.eval.metrics import (
    METRICS,
    EvalConfigBase,
    MetricConfig,
    as_eval_config,
    eval_config_class,
    register_metric,
    select_documents,
)
from bench.eval.metrics.context import first_windows, make_row

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------- the README's worked example


@dataclasses.dataclass
class LogitEntropyConfig(MetricConfig):
    max_docs: int = 4  # test documents per length

    def __post_init__(self) -> None:
        super().__post_init__()
        self.max_docs = integer(self.key("max_docs"), self.max_docs, 1)


def logit_entropy(ctx, cfg, docs, length):
    """Mean entropy (nats) of the next-token distribution over windows of ``length`` tokens."""
    selected, _ = select_documents(docs, length, cfg.max_docs)
    if not selected:
        return []
    logits = ctx.forward(first_windows(selected, length)).logits.float()  # [D, L, V]
    entropy = torch.distributions.Categorical(logits=logits).entropy()  # [D, L]
    return [make_row("logit_entropy", entropy.mean(), entropy.numel(), length)]


@pytest.fixture
def registered():
    """The example metric registered for one test; the registry is restored afterwards."""
    before = dict(METRICS)
    register_metric("logit_entropy", config=LogitEntropyConfig)(logit_entropy)
    yield
    METRICS.clear()
    METRICS.update(before)
    LogitEntropyConfig.section = ""


def only_logit_entropy(**section):
    cfg = {name: {"enabled": False} for name in METRICS if name != "logit_entropy"}
    return cfg | {"lengths": ["1x", "2x"], "logit_entropy": section}


def test_a_registered_metric_runs_through_evaluate_model(registered, tiny_model, random_docs):
    assert list(METRICS)[-1] == "logit_entropy"  # runs after the built-in metrics
    model, docs = tiny_model(), random_docs([80] * 3)
    rows = evaluate_model(
        model, only_logit_entropy(max_docs=2), docs, train_length=32, progress=False
    )
    assert [(r["metric"], r["eval_length"], r["n"]) for r in rows] == [
        ("logit_entropy", 32, 2 * 32),
        ("logit_entropy", 64, 2 * 64),
    ]
    # an independent computation of the same number
    with torch.no_grad():
        logp = model(torch.stack([d.tensor(0, 64) for d in docs[:2]])).logits.log_softmax(-1)
    expected = -(logp.exp() * logp).sum(-1).mean().item()
    assert rows[1]["value"] == pytest.approx(expected, abs=1e-5)
    assert 0 < rows[0]["value"] <= math.log(259)
    # the section's own keys work: disabled, or restricted to one length
    assert (
        evaluate_model(
            model, only_logit_entropy(enabled=False), docs, train_length=32, progress=False
        )
        == []
    )
    one = evaluate_model(
        model, only_logit_entropy(lengths=["2x"]), docs, train_length=32, progress=False
    )
    assert [r["eval_length"] for r in one] == [64]


def test_a_registered_metric_rejects_unknown_keys_and_bad_values(registered):
    fields = {f.name for f in dataclasses.fields(eval_config_class())}
    assert "logit_entropy" in fields
    for bad, message in [
        (
            {"max_doc": 2},
            "eval.logit_entropy.max_doc is an unknown key; allowed keys: enabled, "
            "lengths, max_docs.",
        ),
        ({"max_docs": 0}, "eval.logit_entropy.max_docs must be an integer >= 1, got 0."),
        ({"enabled": "yes"}, "eval.logit_entropy.enabled must be true or false, got 'yes'."),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            as_eval_config({"logit_entropy": bad})


def test_without_registration_the_section_is_unknown():
    assert "logit_entropy" not in METRICS
    with pytest.raises(ValueError, match=re.escape("eval.logit_entropy is an unknown key")):
        as_eval_config({"logit_entropy": {"max_docs": 2}})


def test_registration_errors():
    with pytest.raises(ValueError, match="'nll' is already registered"):
        register_metric("nll", config=LogitEntropyConfig)(logit_entropy)
    with pytest.raises(ValueError, match="metric name 'precision' is invalid"):
        register_metric("precision", config=LogitEntropyConfig)(logit_entropy)

    with pytest.raises(ValueError, match="must be a dataclass subclassing MetricConfig"):
        register_metric("plain", config=dict)(logit_entropy)
    assert "plain" not in METRICS and "precision" not in METRICS
    assert LogitEntropyConfig.section == ""  # a refused registration leaves the config alone


# ---------------------------------------------------------------- EvalConfig as a structured config


def test_eval_config_is_an_omegaconf_structured_config(registered):
    cls = eval_config_class()
    schema = OmegaConf.structured(cls)
    assert list(schema) == [f.name for f in dataclasses.fields(cls)]
    merged = OmegaConf.merge(
        schema,
        {"lengths": ["1x", 96], "nll": {"max_docs": 3}, "logit_entropy": {"max_docs": 2}},
    )
    typed = OmegaConf.to_object(merged)
    assert isinstance(typed, EvalConfigBase) and typed.logit_entropy.max_docs == 2
    assert (
        as_eval_config(merged).resolve(32).to_dict()
        == as_eval_config(
            {"lengths": ["1x", 96], "nll": {"max_docs": 3}, "logit_entropy": {"max_docs": 2}}
        )
        .resolve(32)
        .to_dict()
    )
    # range checks run when OmegaConf builds the object
    bad = OmegaConf.merge(schema, {"nll": {"max_docs": -1}})
    with pytest.raises(ValueError, match=re.escape("eval.nll.max_docs must be an integer >= 1")):
        OmegaConf.to_object(bad)


def test_metric_lengths_outside_the_eval_lengths_are_warned_once(caplog):
    """eval.passkey.lengths=[2x, 8x] with eval lengths up to 4x: 8x is not run, and a warning
    names it (it once vanished without a word); a sweep's every job resolving the same section
    warns once. Controls: lengths that are all eval lengths, and a section's default lengths,
    warn nothing."""
    from bench.eval.metrics import registry
    from bench.eval.metrics.passkey import PasskeyConfig
    from bench.eval.metrics.probes import AttnEntropyConfig

    registry._WARNED.clear()
    eval_lengths = [64, 128, 256]
    with caplog.at_level("WARNING", logger=registry.logger.name):
        for _ in range(3):  # three jobs of a sweep
            got = PasskeyConfig(lengths=["2x", "8x"]).resolve(64, eval_lengths)
            assert got.lengths == [128]
    warned = [r.getMessage() for r in caplog.records if "passkey" in r.getMessage()]
    assert warned == [
        "eval metric passkey is enabled but its lengths [512] are not an eval length "
        "[64, 128, 256]; it will not run there."
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger=registry.logger.name):
        assert PasskeyConfig(lengths=["1x", "4x"]).resolve(64, eval_lengths).lengths == [64, 256]
        # a section's default lengths (attn_entropy: 1x, 4x, 16x) mean "where evaluated": silent
        assert AttnEntropyConfig().resolve(64, eval_lengths).lengths == [64, 256]
    assert not caplog.records
