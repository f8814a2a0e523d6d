"""FoX's forget gate (Lin et al., ICLR 2025), on every attention layer of a position family that
declares ``forget_gate`` (``position=fox``): log f_t = log sigmoid(w_h . x_t + b_h) per head, the
logit of pair (i, j) plus F_i - F_j, F the running sum of log f; the bias starts at the family's
``gate_bias(cfg)``. No switch of its own: the family selects it, and the position column names it."""

from __future__ import annotations

from models.designs.registry import Design, register_design
from models.lazy import F, nn, torch


def forget_decay(attn, x, inputs, past):
    """FoX's F of every key [N, H, S] float32: the running sum of log f_t over the tokens x
    [N, L, D], continuing the cached keys' ``past`` [N, H, S - L]; a padding token forgets
    nothing (log f = 0), so it moves no pair of real tokens apart."""
    log_f = F.logsigmoid(attn.fgate(x).float()).transpose(1, 2)  # [N, H, L]
    if inputs.k_valid is not None:
        log_f = log_f * inputs.k_valid[:, None, -x.shape[1] :]
    running = log_f.cumsum(dim=-1)
    if past is None:
        return running
    return torch.cat((past, running + past[:, :, -1:]), dim=-1)


@register_design
class ForgetGate(Design):
    name, switch = "forget_gate", ""
    hooks = ("kernel",)
    order = 4
    reference = "x-transformers `DataDependentAlibi` (the position family fox's row)"
    test = "tests/models/test_fox.py::test_fox_equals_x_transformers_data_dependent_alibi"

    def selected(self, model_cfg, position_cfg):
        return position_cfg is not None and position_cfg.family.forget_gate

    def attach(self, attn, model_cfg, position_cfg, layer):
        attn.fgate = nn.Linear(model_cfg.d_model, attn.n_heads, bias=True)
        nn.init.constant_(attn.fgate.bias, position_cfg.family.gate_bias(position_cfg))

    def kernel(self, attn, x, inputs, cached, queries):
        """The decay (F of the queries [N, H, L], F of the keys [N, H, S]) and, as ``keep``, the
        keys' F for the cache (its third entry)."""
        past = cached[2] if cached is not None else None
        decay_k = forget_decay(attn, x, inputs, past)  # [N, H, S]
        return {"decay": (decay_k[:, :, decay_k.shape[2] - queries :], decay_k), "keep": decay_k}
