"""``output_attn_entropy`` also reports each query's attention on the window's first token
(``LMOutput.attn_first_mass``, the ``attn_first_mass`` metric that finding N5 reads). Reference: the
softmax of q.k / sqrt(d) written out for a one-layer NoPE model; control: the entropy channel is
not the mass channel. The metric is off unless a study enables it."""

from __future__ import annotations

import math

import torch

from bench.eval.metrics import eval_config_class
from models.positions import PositionConfig
from models.transformer import DecoderLM, ModelConfig

WIDTH, HEADS = 32, 4
D = WIDTH // HEADS


def test_first_mass_is_the_softmax_column_of_the_first_key():
    torch.manual_seed(0)
    model = DecoderLM(
        ModelConfig(n_layers=1, d_model=WIDTH, n_heads=HEADS), PositionConfig(kind="nope"), 16
    ).eval()
    with torch.no_grad():
        attn = model.blocks[0].attn
        attn.q_proj.weight.normal_(0.0, 0.5)
        attn.kv_proj.weight.normal_(0.0, 0.5)
        tokens = torch.randint(0, 256, (2, 11), generator=torch.Generator().manual_seed(1))
        out = model(tokens, output_attn_entropy=True)
        x = model.blocks[0].attn_norm(model.tok_emb(tokens)).double()
        q = (x @ attn.q_proj.weight.double().T).view(2, 11, HEADS, D).transpose(1, 2)
        k = (x @ attn.kv_proj.weight.double().T).view(2, 11, 2, HEADS, D)[:, :, 0].transpose(1, 2)
        logits = q @ k.transpose(-1, -2) / math.sqrt(D)
        probs = logits.masked_fill(torch.ones(11, 11).triu(1).bool(), -math.inf).softmax(-1)
    torch.testing.assert_close(out.attn_first_mass[0].double(), probs[..., 0], atol=1e-5, rtol=1e-4)
    entropy = -torch.special.xlogy(probs, probs).sum(-1)
    torch.testing.assert_close(out.attn_entropy[0].double(), entropy, atol=1e-5, rtol=1e-4)
    assert (out.attn_entropy[0] - out.attn_first_mass[0]).abs().max() > 0.1  # control


def test_the_metric_is_off_by_default():
    cfg = eval_config_class()()
    assert cfg.attn_first_mass.enabled is False and cfg.attn_entropy.enabled is True
