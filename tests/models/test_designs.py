"""The design registry (issue 75 Part A) and its token-mixer hook.

A design declares its switch value, fields, hooks, combination checks, column and label once
(``models.designs``); the model config's fields, the schema's refusals, the result columns and
the report marks come from there. The mixer hook is proved with a mixer of a user's package
(one file, ``tests/fixtures/user_code.MIXER``, plus its YAML): config -> model -> forward, the KV
cache, ``logits_from``, left padding, a hybrid whose position scaling reaches only its attention
layers, the checkpoint key, and the one-sentence refusals; each with a control.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from bench.core.checks import weights_dict
from bench.schema import JobConfig
from bench.train.cache import weights_key
from models.designs.registry import (
    DESIGNS,
    SWITCHES,
    attention_layers,
    design_columns,
    design_mark,
    designs,
    switch_values,
)
from models.model_config import ModelConfig
from models.positions import PositionConfig
from models.scaling_config import ScalingConfig
from models.transformer import DecoderLM

from fixtures.decoding import full_pass_greedy
from fixtures.jobs import raw_cfg
from fixtures.user_code import MIXER, MIXER_YAML

NAME = "decayed_sum"


@pytest.fixture
def user_mixer(tmp_path, monkeypatch):
    """A user's package ``my_mixers`` (outside the repo) whose one file registers the mixer
    ``decayed_sum``, loaded as ``extensions: [my_mixers]`` loads it; unregistered afterwards."""
    package = tmp_path / "my_mixers"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "decayed_sum.py").write_text(MIXER.replace("{name}", NAME))
    conf = tmp_path / "conf" / "design"
    conf.mkdir(parents=True)
    (conf / f"{NAME}.yaml").write_text(MIXER_YAML.format(name=NAME))
    monkeypatch.syspath_prepend(str(tmp_path))
    from models.discovery import load_extensions

    load_extensions(["my_mixers"])
    yield tmp_path
    DESIGNS.pop(("mixer", NAME), None)
    for module in [m for m in sys.modules if m.startswith("my_mixers")]:
        del sys.modules[module]


def _model(kind="nope", seed=0, **fields) -> DecoderLM:
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layers=4, d_model=32, n_heads=2, **fields)
    return DecoderLM(cfg, PositionConfig(kind=kind), 16).eval()


def _decayed_sum(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The mixer written out as its recurrence, float64: s_t = 0.5 s_(t-1) + x_t, y_t = W s_t + b."""
    state, out = torch.zeros_like(x[:, 0]).double(), []
    for t in range(x.shape[1]):
        state = 0.5 * state + x[:, t].double()
        out.append(state @ weight.double().T + bias.double())
    return torch.stack(out, dim=1)


def test_a_user_mixer_is_one_file_config_model_forward(user_mixer):
    assert NAME in switch_values("mixer")
    model = _model(mixer=NAME)
    assert all(b.attn is None and b.mixer is not None for b in model.blocks)
    block = model.blocks[0]
    x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = block.mixer(x)
    proj = block.mixer.proj
    torch.testing.assert_close(ours.double(), _decayed_sum(x, proj.weight, proj.bias))
    # control: other weights are not the mixer's
    assert (ours.double() - _decayed_sum(x, 2 * proj.weight, proj.bias)).abs().max() > 1e-3
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    assert model(ids).logits.shape == (2, 12, 259)


@pytest.mark.parametrize("every", [0, 2])
def test_the_cache_logits_from_and_left_padding_equal_the_full_pass(user_mixer, every):
    """A mixer layer reads its whole prefix again from the cache: cached greedy decoding equals
    full passes, ``logits_from`` equals the full pass's suffix, a left-padded row the unpadded
    (the mixer has a bias: padding read as zeros would move its state)."""
    model = _model("rope" if every else "nope", mixer=NAME, hybrid_every=every)
    ids = torch.randint(0, 256, (2, 14), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        generated = model.generate_greedy(ids[:, :9], max_new_tokens=5)
        assert torch.equal(generated, full_pass_greedy(model, ids[:, :9], 5))
        full = model(ids).logits
        torch.testing.assert_close(model(ids, logits_from=10).logits, full[:, 10:])
        padded = torch.cat((torch.zeros(1, 3, dtype=torch.long), ids[:1]), dim=1)
        mask = torch.ones_like(padded, dtype=torch.bool)
        mask[:, :3] = False
        left = model(padded, attention_mask=mask).logits[:, 3:]
        torch.testing.assert_close(left, full[:1], atol=1e-5, rtol=1e-4)
        generated_left = model.generate_greedy(padded[:, :12], 5, attention_mask=mask[:, :12])
        assert torch.equal(generated_left, generated[:1])  # the cache keeps the padding out
        # control: the padding read as tokens changes the row
        assert (model(padded).logits[:, 3:] - full[:1]).abs().max() > 1e-3
        # a mixer layer has no attention map: the model reports no entropy
        assert model(ids, output_attn_entropy=True).attn_entropy is None


def test_a_hybrid_puts_attention_every_k_th_layer_and_scaling_reaches_only_it(user_mixer):
    cfg = ModelConfig(n_layers=8, mixer=NAME, hybrid_every=4)
    assert attention_layers(cfg) == [False, False, False, True] * 2  # Qwen3-Next's 3 : 1
    model = _model("rope", mixer=NAME, hybrid_every=2)
    assert [b.attn is not None for b in model.blocks] == [False, True, False, True]
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        for block in model.blocks:  # logits of order 1, so that a rotation shows
            if block.attn is not None:
                block.attn.q_proj.weight.normal_(0.0, 0.5)
                block.attn.kv_proj.weight.normal_(0.0, 0.5)
        raw = model(ids, output_hidden_states=True).hidden_states
        with model.scaled(ScalingConfig(name="linear", method="linear", params={"factor": 4})):
            pi = model(ids, output_hidden_states=True).hidden_states
    torch.testing.assert_close(pi[1], raw[1])  # after the mixer layer: untouched
    assert (pi[2] - raw[2]).abs().max() > 1e-4  # after the attention layer: interpolated


def test_a_mixer_changes_the_checkpoint_key_and_the_default_does_not(user_mixer):
    def key(**model):
        raw = raw_cfg()
        raw["model"].update(model, n_layers=2)
        raw["position"] = {"kind": "nope"}
        return weights_key(JobConfig.from_hydra(raw), "fp")

    assert "mixer" not in weights_dict(ModelConfig()) and "hybrid_every" not in weights_dict(
        ModelConfig()
    )
    assert key() == key(mixer="attention", hybrid_every=0)
    assert len({key(), key(mixer=NAME), key(mixer=NAME, hybrid_every=2)}) == 3


def test_bad_mixer_settings_are_one_sentence(user_mixer):
    def refused(match, kind="nope", **model):
        raw = raw_cfg()
        raw["model"].update({"n_layers": 2, **model})
        raw["position"] = {"kind": kind}
        with pytest.raises(ValueError, match=match):
            JobConfig.from_hydra(raw)

    refused(r"^model\.mixer 'gdn' is unknown; allowed: attention, .*decayed_sum", mixer="gdn")
    refused(r"^model\.hybrid_every 1 is invalid", mixer=NAME, hybrid_every=1)
    refused(r"^model\.hybrid_every=2 interleaves attention with a mixer", hybrid_every=2)
    refused(r"^model\.mixer=decayed_sum without attention layers uses no positions", "rope",
            mixer=NAME)  # fmt: skip
    refused(r"^model\.qk_norm=qk_norm acts on attention layers", mixer=NAME, qk_norm=True)
    refused(r"^position=sinusoidal adds to the embeddings", "sinusoidal", mixer=NAME,
            hybrid_every=2)  # fmt: skip
    refused(r"^model\.hybrid_every=8 puts no attention layer", mixer=NAME, hybrid_every=8,
            n_layers=1)  # fmt: skip
    # controls: the same switches where they apply
    for model, kind in (({"mixer": NAME}, "nope"), ({"mixer": NAME, "hybrid_every": 2}, "rope"),
                        ({"mixer": NAME, "hybrid_every": 2, "qk_norm": True}, "alibi")):  # fmt: skip
        raw = raw_cfg()
        raw["model"].update(model, n_layers=2)
        raw["position"] = {"kind": kind}
        JobConfig.from_hydra(raw)


def test_the_mixer_s_columns_and_label_come_from_its_declaration(user_mixer):
    cfg = ModelConfig(mixer=NAME, hybrid_every=4)
    assert design_columns(cfg) == {"mixer": NAME, "hybrid_every": "4"}
    assert cfg.switches() == {"mixer": NAME, "hybrid_every": "4"}
    assert design_mark("mixer", NAME) == f" +{NAME}"
    assert design_mark("hybrid_every", "4") == " (attention every 4)"
    assert design_columns(ModelConfig()) == {}


def test_the_user_yaml_composes_the_mixer(user_mixer):
    """``+design=<name>`` from the user's config dir (``--config-dir``) selects the mixer."""
    from hydra import compose, initialize_config_dir

    from bench.core.config_dir import CONFIG_DIR

    overrides = ["extensions=[my_mixers]", f"+design={NAME}", "position=nope"]
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            "config", overrides=[f"hydra.searchpath=[file://{user_mixer / 'conf'}]", *overrides]
        )
    assert JobConfig.from_hydra(cfg).model.mixer == NAME


def test_every_switch_field_is_a_model_config_field_in_the_key_only_when_set():
    """The switches' and designs' declared fields are ModelConfig's, with the declared default
    and the checkpoint key's ``if_set`` rule (so a new design's default never moves old keys)."""
    declared = {s.name: s.default for s in SWITCHES.values()}
    for spec in SWITCHES.values():
        declared.update({f.name: f.default for f in spec.fields})
    for design in designs().values():
        declared.update({f.name: f.default for f in design.fields})
    model_fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
    for name, default in declared.items():
        assert model_fields[name].default == default, name
        assert model_fields[name].metadata.get("weights") == "if_set", name
    assert weights_dict(ModelConfig()).keys().isdisjoint(declared)
    # control: a field set away from its default enters the key
    assert weights_dict(ModelConfig(attn_temperature=0.2))["attn_temperature"] == 0.2


def test_every_built_in_design_has_its_yaml_selecting_exactly_it():
    import yaml

    from bench.core.config_dir import CONFIG_DIR

    for (switch, name), design in designs().items():
        if not switch:  # selected by its family (FoX's gate): no switch to set
            continue
        path = CONFIG_DIR / "design" / f"{design.yaml}.yaml"
        values = yaml.safe_load(path.read_text())
        cfg = ModelConfig(**values)
        assert [d.name for d in _on(cfg)] == [name], path
        assert path.read_text().startswith("# @package model"), path


def _on(cfg):
    from models.designs.registry import active_designs

    return active_designs(cfg, None)


def test_a_lenbench_run_trains_and_labels_a_hybrid_of_the_users_mixer(tmp_path):
    """End to end, as a user runs it: ``lenbench --config-dir <theirs> extensions=[...]
    +experiment=smoke +design=<mixer> model.hybrid_every=2`` trains, evaluates and reports; the
    rows carry the mixer's columns, the report's labels its mark (about 25-50 s on 2 cores)."""
    import os
    import subprocess

    import pandas as pd

    from fixtures import ROOT

    package = tmp_path / "e2e_mixers"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "decayed_sum.py").write_text(MIXER.replace("{name}", NAME))
    (tmp_path / "conf" / "design").mkdir(parents=True)
    (tmp_path / "conf" / "design" / f"{NAME}.yaml").write_text(MIXER_YAML.format(name=NAME))
    cli = "import sys; from bench.cli import main; sys.argv[0] = 'lenbench'; sys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-c", cli, "--config-dir", str(tmp_path / "conf"),
         "extensions=[e2e_mixers]", "+experiment=smoke", f"+design={NAME}", "model.n_layers=2",
         "model.hybrid_every=2", f"paths.results={tmp_path}/res", f"paths.reports={tmp_path}/rep",
         f"paths.cache={tmp_path}/cache", "threads=1"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = pd.concat(pd.read_parquet(p) for p in (tmp_path / "res" / "smoke").glob("*.parquet"))
    assert set(rows["mixer"]) == {NAME} and set(rows["hybrid_every"]) == {"2"}
    report = (tmp_path / "rep" / "smoke" / "report.md").read_text()
    assert f"rope +{NAME} (attention every 2) / none" in report
