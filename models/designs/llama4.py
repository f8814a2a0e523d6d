"""``model.attn_scale=llama4``: Llama 4's query temperature
log1p(floor((p + 1) / attn_floor)) * attn_temperature + 1 at every layer, for any family
(transformers' ``attn_temperature_tuning``; iRoPE has it on its NoPE layers already), in training
and evaluation."""

from __future__ import annotations

from dataclasses import replace

from models.designs.registry import Design, DesignField, register_design


@register_design
class Llama4Temperature(Design):
    name, switch, label = "llama4", "attn_scale", " +Llama 4 temperature"
    hooks = ("model",)
    fields = (
        DesignField("attn_floor", (int, type(None)), None,
                    doc="the floor (Llama 4: 8192; null = the training length)"),
        DesignField("attn_temperature", (int, float), 0.1, doc="the scale (Llama 4: 0.1)"),
    )  # fmt: skip
    reference = "transformers Llama4TextAttention's attn_temperature_tuning"
    test = "tests/models/test_hybrid.py (llama4_query_temperature against Llama4TextAttention)"

    def check(self, model_cfg, position_cfg):
        if position_cfg.kind == "irope":
            return (
                "model.attn_scale=llama4 does not combine with position=irope, which applies Llama "
                "4's query temperature on its NoPE layers itself (position.temperature_scale); "
                "allowed: attn_scale none or ssmax."
            )
        return None

    def check_fields(self, model_cfg):
        floor, temperature = model_cfg.attn_floor, model_cfg.attn_temperature
        if floor is not None and (
            isinstance(floor, bool) or not isinstance(floor, int) or floor < 1
        ):
            return f"attn_floor {floor!r} is invalid; allowed: an integer >= 1 or null."
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or not (temperature > 0)
        ):
            return f"attn_temperature {temperature!r} is invalid; allowed: a number > 0."
        return None

    def attention_inputs(self, model, inputs, at):
        from models.positions import llama4_query_temperature

        cfg = model.model_cfg  # at each query's position, as log-n's
        floor = cfg.attn_floor or model.train_length
        factor = llama4_query_temperature(at, floor, cfg.attn_temperature)[:, None, :, None]
        q_scale = factor if inputs.q_scale is None else inputs.q_scale * factor  # [N, 1, L, 1]
        return replace(inputs, q_scale=q_scale)
