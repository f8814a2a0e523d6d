"""``model.attn_scale=llama4`` (issue 54 item 5, second half): Llama 4's query temperature
log1p(floor((p + 1) / attn_floor)) * attn_temperature + 1 for any family, in training and
evaluation. The factor is transformers' (tests/models/test_hybrid.py compares
``llama4_query_temperature`` with ``Llama4TextAttention``); here: the model applies it at each
query's position and nowhere else (equal logits before the first floor, other logits after;
control: a floor beyond the window changes nothing), the KV cache decodes as full passes do,
iRoPE (which has it already) refuses it, and the checkpoint key and series label carry it."""

from __future__ import annotations

import pytest
import torch

from models.designs.registry import design_mark
from models.model_config import check_combination
from models.positions import PositionConfig, families
from models.transformer import DecoderLM, ModelConfig

from fixtures.decoding import assert_trains_and_decodes


def _logits(kind: str, **switches) -> torch.Tensor:
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(n_layers=2, d_model=32, n_heads=2, **switches),
                      PositionConfig(kind=kind), 16).eval()  # fmt: skip
    with torch.no_grad():
        for block in model.blocks:  # logits of order 1, so that a query scale shows
            block.attn.q_proj.weight.normal_(0.0, 0.5)
            block.attn.kv_proj.weight.normal_(0.0, 0.5)
        ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
        return model(ids).logits


@pytest.mark.parametrize("kind", ["rope", "alibi", "nope"])
def test_the_temperature_acts_from_the_first_floor_on(kind):
    plain = _logits(kind)
    hot = _logits(kind, attn_scale="llama4", attn_floor=10, attn_temperature=0.5)
    # factor 1 while p + 1 < 10 (positions 0..8); log1p(1) * 0.5 + 1 from position 9
    torch.testing.assert_close(hot[:, :9], plain[:, :9])
    assert (hot[:, 9:] - plain[:, 9:]).abs().amax(-1).min() > 1e-4
    # control: a floor beyond the window leaves every factor at 1
    far = _logits(kind, attn_scale="llama4", attn_floor=64, attn_temperature=0.5)
    torch.testing.assert_close(far, plain)


@pytest.mark.parametrize("kind", [k for k in families() if k != "irope"])  # irope: refused
def test_every_family_decodes_with_the_cache_as_full_passes(kind):
    assert_trains_and_decodes(
        kind, lambda attn: [attn.q_proj.weight], attn_scale="llama4", attn_floor=4
    )


def test_irope_refuses_it_and_bad_values_are_one_sentence():
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2, attn_scale="llama4")
    with pytest.raises(ValueError, match="does not combine with position=irope"):
        check_combination(cfg, PositionConfig(kind="irope"))
    check_combination(cfg, PositionConfig(kind="rope"))  # control: another family combines
    with pytest.raises(ValueError, match="attn_floor 0 is invalid"):
        ModelConfig(attn_scale="llama4", attn_floor=0).validate()
    with pytest.raises(ValueError, match="attn_temperature -1 is invalid"):
        ModelConfig(attn_scale="llama4", attn_temperature=-1).validate()


def test_the_switch_is_in_the_key_and_the_label():
    from bench.core.checks import weights_dict

    on = weights_dict(ModelConfig(attn_scale="llama4", attn_floor=8))
    assert on["attn_scale"] == "llama4" and on["attn_floor"] == 8
    assert "attn_floor" not in weights_dict(ModelConfig())  # only when set
    assert ModelConfig(attn_scale="llama4").switches() == {"attn_scale": "llama4"}
    assert design_mark("attn_scale", "llama4") == " +Llama 4 temperature"
    assert design_mark("attn_scale", "llama4") != design_mark("attn_scale", "ssmax")
