"""DroPE (issue 54 item 9): ``scaling=drope`` drops every rotation (inverse frequencies 0) and
``extend=drope`` recalibrates the dropped model at its training length. Reference: a NoPE model
carrying the same weights gives the same logits (RoPE, p-RoPE, HoPE; PoPE against its own
position-free form); control: the raw model differs. Families whose position signal is more than
a rotation (xPos's scales, ALiBi's bias, the hybrids' spans) are refused in one sentence."""

from __future__ import annotations

import pytest
import torch

from bench.schema import JobConfig
from models.positions import PositionConfig
from models.scaling import applicable_methods
from models.scaling_config import ScalingConfig
from models.transformer import DecoderLM, ModelConfig

DROPE = ScalingConfig(name="drope", method="drope")
CFG = ModelConfig(n_layers=2, d_model=32, n_heads=4)


@pytest.mark.parametrize("kind", ["rope", "p_rope", "hope"])
def test_a_dropped_rotary_model_is_nope_with_the_same_weights(kind):
    torch.manual_seed(0)
    model = DecoderLM(CFG, PositionConfig(kind=kind), 16).eval()
    with torch.no_grad():  # logits of order 1, so that the rotation shows
        for block in model.blocks:
            block.attn.q_proj.weight.normal_(0.0, 0.5)
            block.attn.kv_proj.weight.normal_(0.0, 0.5)
    nope = DecoderLM(CFG, PositionConfig(kind="nope"), 16).eval()
    nope.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        raw = model(tokens).logits
        model.set_scaling(DROPE)
        dropped = model(tokens).logits
        reference = nope(tokens).logits
    torch.testing.assert_close(dropped, reference, atol=1e-5, rtol=1e-5)
    assert (raw - reference).abs().max() > 1e-3  # control: the rotation mattered


def test_dropped_pope_reads_no_position():
    """PoPE keeps its magnitudes and key phase bias; without frequencies, shifting every position
    id changes nothing (and with them it does)."""
    torch.manual_seed(0)
    model = DecoderLM(CFG, PositionConfig(kind="pope"), 16).eval()
    with torch.no_grad():
        model.pope_bias.uniform_(-3.0, 0.0)
    tokens = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(2))
    pos = torch.arange(12)[None]
    with torch.no_grad():
        raw_gap = (
            (model(tokens, position_ids=pos).logits - model(tokens, position_ids=pos * 3).logits)
            .abs()
            .max()
        )
        model.set_scaling(DROPE)
        gap = (
            (model(tokens, position_ids=pos).logits - model(tokens, position_ids=pos * 3).logits)
            .abs()
            .max()
        )
    assert gap < 1e-5 < raw_gap


def test_drope_applies_only_where_the_rotation_is_the_whole_signal():
    for kind in ("rope", "p_rope", "hope", "pope"):
        assert "drope" in applicable_methods(kind)
    for kind in ("xpos", "alibi", "nope", "rnope_swa", "irope", "sinusoidal", "t5"):
        assert "drope" not in applicable_methods(kind)
    alibi = DecoderLM(CFG, PositionConfig(kind="alibi"), 16)
    with pytest.raises(ValueError, match=r"drope") as refused:
        alibi.set_scaling(DROPE)
    assert "\n" not in str(refused.value)


def test_extend_drope_recalibrates_at_the_training_length():
    from bench.train.extend import finetune_recipe, finetune_scaling

    job = JobConfig.from_hydra(
        {
            "train": {"length": 64},
            "extend": {"name": "drope", "method": "drope", "length": "1x", "steps": 100},
        }
    )
    assert finetune_recipe(job).length == 64 and finetune_recipe(job).steps == 100
    assert finetune_scaling(job).method == "drope"
