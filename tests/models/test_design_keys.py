"""Moving the model switches onto the design registry (issue 75 Part A) changes no checkpoint.

The expected values below were computed from the code BEFORE the refactor (main at cc94fc2, with
``ModelConfig``'s switch fields, ``check_combination`` and ``Attention.__init__``'s arguments) by
building each config with ``tests.fixtures.jobs.raw_cfg`` and printing, per config: its checkpoint
key ``weights_key(job, "fp")``, its ``recipe_id(job, "fp")``, and the sha256 (first 16 hex) of the
seeded model's state dict (``torch.manual_seed(0)``, every name and tensor's bytes in sorted name
order: same parameter names, shapes and random init stream), and its result columns
(``ModelConfig.switches()`` plus ``attention_sink`` as ``bench.trained_source`` wrote them). They
are frozen here on purpose: the refactor must reproduce them, so a checkpoint cached before it
loads under the same key and trains to the same weights. The configs cover every switch value.
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from bench.schema import JobConfig
from bench.train.cache import recipe_id, weights_key
from bench.train.trainer import make_model

from fixtures.jobs import raw_cfg

#: name -> (model fields, position section)
CASES = {
    "default": ({}, {"kind": "rope"}),
    "qk_norm": ({"qk_norm": True}, {"kind": "rope"}),
    "output_gate": ({"output_gate": True}, {"kind": "rope"}),
    "ssmax": ({"attn_scale": "ssmax"}, {"kind": "rope"}),
    "ssmax_rnope_swa": ({"attn_scale": "ssmax"}, {"kind": "rnope_swa"}),
    "llama4": ({"attn_scale": "llama4"}, {"kind": "rope"}),
    "llama4_floor": (
        {"attn_scale": "llama4", "attn_floor": 8, "attn_temperature": 0.2},
        {"kind": "nope"},
    ),
    "stick_breaking": ({"attention": "stick_breaking"}, {"kind": "nope"}),
    "differential": ({"attention": "differential"}, {"kind": "rope"}),
    "sink_learned": ({"attention_sink": "learned"}, {"kind": "rope"}),
    "sink_token": ({"attention_sink": "token"}, {"kind": "alibi"}),
    "fox": ({}, {"kind": "fox"}),
    "combined": ({"qk_norm": True, "output_gate": True, "attn_scale": "ssmax"}, {"kind": "rope"}),
}

#: name -> (weights_key, recipe_id, state-dict digest), printed by the code before the refactor
FROZEN = {
    "default": ("689a0600ce7d55ad", "a0ef08afc371b396", "1604fab5beb5daba"),
    "qk_norm": ("d48656f90328c25f", "a0ef08afc371b396", "e07f57b6c03f931c"),
    "output_gate": ("1e8c03170e2e6033", "a0ef08afc371b396", "80d0084bbb2ed649"),
    "ssmax": ("1100cd29385c93a5", "a0ef08afc371b396", "59fedafa8aa22b79"),
    "ssmax_rnope_swa": ("0b78b9756c85c93a", "667343d316328e49", "59fedafa8aa22b79"),
    "llama4": ("66c5cacf9021c732", "a0ef08afc371b396", "1604fab5beb5daba"),
    "llama4_floor": ("8da787b532c5a532", "5c23ceb7d187d3ba", "1604fab5beb5daba"),
    "stick_breaking": ("0564da9d210f200e", "a0ef08afc371b396", "1604fab5beb5daba"),
    "differential": ("481a606648dd5f28", "a0ef08afc371b396", "40657981ecfdd008"),
    "sink_learned": ("31f4abab709a153f", "a0ef08afc371b396", "2b74ceef86ff2b3e"),
    "sink_token": ("1021d2e37c77ef6f", "a0ef08afc371b396", "37ee3457c73390d8"),
    "fox": ("084dcb69444c119d", "a0ef08afc371b396", "63f6cdcd78a97e77"),
    "combined": ("28a95246f7caccae", "a0ef08afc371b396", "58a0025f268e464b"),
}

#: name -> the result columns of the model's switches, as written before the refactor
FROZEN_COLUMNS = {
    "default": {},
    "qk_norm": {"qk_norm": "rms"},
    "output_gate": {"output_gate": "sigmoid"},
    "ssmax": {"attn_scale": "ssmax"},
    "ssmax_rnope_swa": {"attn_scale": "ssmax"},
    "llama4": {"attn_scale": "llama4"},
    "llama4_floor": {"attn_scale": "llama4"},
    "stick_breaking": {"attention": "stick_breaking"},
    "differential": {"attention": "differential"},
    "sink_learned": {"attention_sink": "learned"},
    "sink_token": {"attention_sink": "token"},
    "fox": {},
    "combined": {"qk_norm": "rms", "output_gate": "sigmoid", "attn_scale": "ssmax"},
}


def _job(name: str) -> JobConfig:
    model, position = CASES[name]
    raw = raw_cfg()
    raw["model"].update(model)
    raw["position"] = position
    return JobConfig.from_hydra(raw)


def _state_digest(job: JobConfig) -> str:
    torch.manual_seed(0)
    state = make_model(job).state_dict()
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].numpy().tobytes())
    return digest.hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(CASES))
def test_checkpoint_keys_recipes_and_weights_are_those_before_the_registry(name):
    job = _job(name)
    assert (weights_key(job, "fp"), recipe_id(job, "fp"), _state_digest(job)) == FROZEN[name]


def test_the_frozen_keys_tell_every_switch_apart():
    """Control: the comparison above can fail. Every case has its own key (a switch that did not
    reach the key would collide with the default), and a changed field changes it."""
    keys = [FROZEN[name][0] for name in CASES]
    assert len(set(keys)) == len(keys)
    raw = raw_cfg()
    raw["model"]["attn_temperature"] = 0.3
    raw["model"]["attn_scale"] = "llama4"
    assert weights_key(JobConfig.from_hydra(raw), "fp") != FROZEN["llama4"][0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_result_columns_are_those_before_the_registry(name):
    model = _job(name).model
    columns = dict(model.switches())
    if model.attention_sink != "none":
        columns["attention_sink"] = model.attention_sink
    assert columns == FROZEN_COLUMNS[name]
