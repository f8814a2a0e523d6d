"""The design registry: every model switch beyond the position family, declared once.

A *switch* is a ``model.<name>`` field that selects one design (or none: its default); a
*design* is one registered class (one file in ``models/designs/``) that says which switch value
selects it, which further fields it reads, what it combines with, its result column and report
label, its reference, and the *hooks* it fills at fixed points of a layer:

* ``"model"``       ``init_model(model)`` / ``attention_inputs(model, inputs, at)`` /
                    ``layer_inputs(model, layer_inputs)``: parameters and per-pass inputs of the
                    whole model (a sink token, Llama 4's query temperature, SSMax's key counts);
* ``"qk"``          ``qk(attn, q, k)``: each head's queries and keys, before the rotation;
* ``"query"``       ``query(attn, q, inputs, query_from)``: the queries after the rotation and
                    log-n (SSMax's s_h log n);
* ``"kernel"``      ``kernel(attn, x, inputs, cached, queries)``: what the kernel adds to the
                    logits or puts in place of the softmax (a sink logit, FoX's decay,
                    stick-breaking), and what the layer's cache keeps for it;
* ``"heads"``       ``values(attn, v)`` and ``heads(attn, out)``: the values each head reads and
                    its output before the heads merge (differential attention);
* ``"output"``      ``output(attn, out, x, query_from)``: the merged heads before ``o_proj``;
* ``"mixer"``       ``build(cfg, layer) -> nn.Module``: a whole token mixer in place of attention
                    (``forward(x)``: x [N, L, D] -> [N, L, D], causal, no positions).

Every hook but ``"mixer"`` acts on attention layers (``models.attention.Attention`` calls the
active designs' hooks in :attr:`Design.order`). From the declarations come the schema checks
(:func:`check_model`, :func:`check_designs`), the result columns (:func:`design_columns`,
:data:`SWITCHES`), the report labels (:func:`design_mark`) and the conformance rows
(``tests/conformance.py``). This module loads no torch: a config is checked before it loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from models.discovery import import_package

# ``models.model_config.ModelConfig`` and ``models.positions.PositionConfig``, not imported:
# model_config imports this module (its fields' checks), and this one loads no torch
ModelConfig = PositionConfig = Any

__all__ = [
    "DESIGNS",
    "HOOKS",
    "SWITCHES",
    "Design",
    "DesignField",
    "Switch",
    "active_designs",
    "attention_layers",
    "check_designs",
    "check_model",
    "designs",
    "design_columns",
    "design_column_names",
    "design_mark",
    "register_design",
    "switch_values",
]

HOOKS = ("model", "qk", "query", "kernel", "heads", "output", "mixer")


@dataclass(frozen=True)
class DesignField:
    """A ``model.<name>`` field a switch or a design reads: its type, default and allowed values
    (None: any value of the type that ``check`` accepts); it enters the checkpoint key only when
    set to another value than the default (``models.model_config.ModelConfig``'s metadata)."""

    name: str
    type: type | tuple[type, ...]
    default: Any
    allowed: tuple[Any, ...] | None = None
    doc: str = ""


@dataclass(frozen=True)
class Switch:
    """A ``model.<name>`` field that selects at most one design: off at ``default``; the other
    allowed values are the designs registered for it. Its result column (same name) holds the
    selected design's ``variant`` on the rows of a model with it on; ``fields`` are further
    fields every design of the switch reads (``model.hybrid_every`` for any mixer)."""

    name: str
    type: type
    default: Any
    doc: str
    fields: tuple[DesignField, ...] = ()


#: The switches, in the order of their result columns and of their marks in a report's position
#: label. ``attention_sink`` is told apart by the Findings' scopes (``sinks``), so it is no member
#: of ``bench.core.series.SWITCH_COLUMNS``.
SWITCHES: dict[str, Switch] = {
    s.name: s
    for s in (
        Switch("attention_sink", str, "none", "where attention may put its leftover mass"),
        Switch("qk_norm", bool, False, "per-head RMS norm of queries and keys"),
        Switch("output_gate", bool, False, "elementwise gate on the attention output"),
        Switch("attn_scale", str, "none", "a query scale that grows with the keys or position"),
        Switch("attention", str, "softmax", "what replaces one softmax"),
        Switch(
            "mixer",
            str,
            "attention",
            "the token mixer of each layer",
            fields=(
                DesignField(
                    "hybrid_every",
                    int,
                    0,
                    doc="0: every layer is the mixer; k >= 2: full attention on layers i with "
                    "(i + 1) % k == 0, the mixer elsewhere (k = 4: Qwen3-Next's 3 : 1)",
                ),
            ),
        ),
    )
}


class Design:
    """One model switch's variant. Subclass, set the class attributes, override the hooks you
    declare in :attr:`hooks`, and decorate with :func:`register_design`."""

    #: the registry key and the value of :attr:`switch` that selects it (a bool switch: True)
    name: str = ""
    switch: str = ""
    #: the value in the switch's result column (default: ``name``)
    variant: str = ""
    #: the mark a report adds to the position label (default: `` +<name>``)
    label: str = ""
    hooks: tuple[str, ...] = ()
    #: further ``model.*`` fields it reads (its own parameters)
    fields: tuple[DesignField, ...] = ()
    #: where its parameters are created among a layer's (fixed: a seeded model's init stream)
    order: int = 100
    #: its preset ``conf/design/<yaml>.yaml`` (``+design=<yaml>``; default: ``name``)
    yaml: str = ""
    #: the independent implementation its test compares it with (docs/conformance.md)
    reference: str = ""
    #: the test that makes the comparison (path::name)
    test: str = ""

    def selected(self, model_cfg: ModelConfig, position_cfg: PositionConfig | None) -> bool:
        """Whether this design is on for the model (its switch holds its value)."""
        value = getattr(model_cfg, self.switch)
        return bool(value) if SWITCHES[self.switch].type is bool else value == self.name

    def check(self, model_cfg: ModelConfig, position_cfg: PositionConfig) -> str | None:
        """Why the design does not combine with the rest of the model, one sentence, or None."""
        return None

    def check_fields(self, model_cfg: ModelConfig) -> str | None:
        """Why one of its :attr:`fields` holds a value it cannot use, one sentence, or None."""
        return None

    # -- hooks (see the module docstring); the defaults change nothing
    def init_model(self, model: Any) -> None: ...

    def attention_inputs(self, model: Any, inputs: Any, at: Any) -> Any:
        return inputs

    def layer_inputs(self, model: Any, layer_inputs: list) -> list:
        return layer_inputs

    def attach(self, attn: Any, model_cfg: ModelConfig, position_cfg: Any, layer: int) -> None:
        """Create its parameters on one attention layer (their names are state-dict keys)."""

    def qk(self, attn: Any, q: Any, k: Any) -> tuple[Any, Any]:
        return q, k

    def query(self, attn: Any, q: Any, inputs: Any, query_from: int) -> Any:
        return q

    def kernel(self, attn: Any, x: Any, inputs: Any, cached: Any, queries: int) -> dict:
        return {}

    def values(self, attn: Any, v: Any) -> Any:
        return v

    def heads(self, attn: Any, out: Any) -> Any:
        return out

    def output(self, attn: Any, out: Any, x: Any, query_from: int) -> Any:
        return out

    def build(self, cfg: ModelConfig, layer: int) -> Any:
        raise NotImplementedError(f"design {self.name!r} is no token mixer.")


#: registered designs by (switch, name), in registration order (built-ins first); complete once
#: :func:`designs` has run
DESIGNS: dict[tuple[str, str], Design] = {}
#: the package whose modules register designs (``models.discovery``: one module per design)
DESIGN_PACKAGE = "models.designs"


def register_design(cls: type[Design]) -> type[Design]:
    """Class decorator: register one instance of ``cls`` under (its switch, its name)."""
    design = cls()
    if design.switch and design.switch not in SWITCHES:  # "": selected otherwise (selected())
        raise ValueError(
            f"design {cls.__name__} names switch {design.switch!r}; allowed: {', '.join(SWITCHES)}."
        )
    unknown = set(design.hooks) - set(HOOKS)
    if unknown or not design.name:
        raise ValueError(
            f"design {cls.__name__} declares hooks {sorted(unknown)} or no name; allowed "
            f"hooks: {', '.join(HOOKS)}."
        )
    design.variant = design.variant or design.name
    design.yaml = design.yaml or design.name
    design.label = design.label or f" +{design.name}"
    key = (design.switch, design.name)
    if key in DESIGNS and type(DESIGNS[key]) is not cls:
        raise ValueError(f"design {design.name!r} of model.{design.switch} is already registered.")
    DESIGNS[(design.switch, design.name)] = design
    return cls


def designs() -> dict[tuple[str, str], Design]:
    """Every registered design, every module of :data:`DESIGN_PACKAGE` loaded (built-ins first)."""
    import_package(DESIGN_PACKAGE)
    return DESIGNS


def switch_values(switch: str, load: bool = True) -> tuple[Any, ...]:
    """The values ``model.<switch>`` allows: its default, then its designs' (a bool: False, True);
    ``load=False``: the designs registered so far (the built-ins, at import time)."""
    spec = SWITCHES[switch]
    if load:
        designs()
    if spec.type is bool:
        return (False, True)
    return (spec.default, *(name for (s, name) in DESIGNS if s == switch))


def active_designs(model_cfg: ModelConfig, position_cfg: PositionConfig | None) -> list[Design]:
    """The designs on for a model, in :attr:`Design.order` (where their parameters are made)."""
    on = [d for d in designs().values() if d.selected(model_cfg, position_cfg)]
    return sorted(on, key=lambda d: d.order)


def attention_layers(model_cfg: ModelConfig) -> list[bool]:
    """Per layer, whether it is attention (else ``model.mixer``'s layer)."""
    k = model_cfg.hybrid_every
    if model_cfg.mixer == SWITCHES["mixer"].default:
        return [True] * model_cfg.n_layers
    return [bool(k) and (i + 1) % k == 0 for i in range(model_cfg.n_layers)]


def check_model(model_cfg: ModelConfig) -> None:
    """ValueError (one sentence, starting with the field's name) for a switch value no design
    declares, or a design field it cannot use."""
    for name, spec in SWITCHES.items():
        value = getattr(model_cfg, name)
        allowed = switch_values(name)
        if spec.type is not bool and value not in allowed:
            raise ValueError(
                f"{name} {value!r} is unknown; allowed: {', '.join(map(str, allowed))}."
            )
    k = model_cfg.hybrid_every
    if isinstance(k, bool) or not isinstance(k, int) or k < 0 or k == 1:
        raise ValueError(
            f"hybrid_every {k!r} is invalid; allowed: 0 (every layer model.mixer) or an integer "
            ">= 2 (full attention every k-th layer)."
        )
    for design in designs().values():  # every design's fields, set or not (each is typed once)
        problem = design.check_fields(model_cfg)
        if problem:
            raise ValueError(problem)


def check_designs(model_cfg: ModelConfig, position_cfg: PositionConfig) -> None:
    """ValueError (one sentence) for designs that do not combine with the position family or
    with each other; needs no model, so a job checks it before anything trains."""
    designs = active_designs(model_cfg, position_cfg)
    layers = attention_layers(model_cfg)
    if model_cfg.hybrid_every and model_cfg.mixer == SWITCHES["mixer"].default:
        raise ValueError(
            f"model.hybrid_every={model_cfg.hybrid_every} interleaves attention with a mixer, but "
            "model.mixer=attention; allowed: hybrid_every 0, or a mixer "
            f"({', '.join(map(str, switch_values('mixer')[1:])) or 'none registered'})."
        )
    if model_cfg.hybrid_every and not any(layers):
        raise ValueError(
            f"model.hybrid_every={model_cfg.hybrid_every} puts no attention layer in "
            f"model.n_layers={model_cfg.n_layers}; allowed: hybrid_every <= n_layers."
        )
    if model_cfg.mixer != SWITCHES["mixer"].default:
        _check_mixer_positions(model_cfg, position_cfg, any(layers))
    for design in designs:
        if not any(layers) and set(design.hooks) - {"mixer", "model"}:
            raise ValueError(
                f"model.{design.switch}={design.name} acts on attention layers, and "
                f"model.mixer={model_cfg.mixer} has none; allowed: model.hybrid_every >= 2 "
                f"or {design.switch} {SWITCHES[design.switch].default}."
            )
        problem = design.check(model_cfg, position_cfg)
        if problem:
            raise ValueError(problem)


def _check_mixer_positions(model_cfg: ModelConfig, position_cfg: Any, hybrid: bool) -> None:
    """A position family acts on attention layers only: a model without one takes none (its
    rows would name a family it does not have), and a hybrid's family may not add to the
    embeddings, which every mixer layer would read too."""
    kind = position_cfg.kind
    if not hybrid and kind != "nope":
        raise ValueError(
            f"model.mixer={model_cfg.mixer} without attention layers uses no positions, so "
            f"position={kind} would name an encoding the model does not have; allowed: "
            "position=nope, or model.hybrid_every >= 2 for attention layers with a family."
        )
    if hybrid and position_cfg.acts_on == "input":
        raise ValueError(
            f"position={kind} adds to the embeddings, which model.mixer={model_cfg.mixer}'s "
            "layers would read too (a family acts on a hybrid's attention layers only); "
            "allowed: a family acting on queries and keys or on the scores (rope, alibi, nope, ...)."
        )


def design_columns(model_cfg: ModelConfig, position_cfg: PositionConfig | None = None) -> dict:
    """The result columns of the switches that are on, each holding its design's variant
    (``model.hybrid_every``: its k as text), in :data:`SWITCHES` order."""
    on = {d.switch: d.variant for d in active_designs(model_cfg, position_cfg) if d.switch}
    out = {name: on[name] for name in SWITCHES if name in on}
    if model_cfg.hybrid_every:
        out["hybrid_every"] = str(model_cfg.hybrid_every)
    return out


def design_column_names() -> list[str]:
    """Every result column a design may fill: each switch's, then its fields' that name a
    variant of the model (``hybrid_every``), in :data:`SWITCHES` order."""
    names = []
    for name, spec in SWITCHES.items():
        names += [name, *(f.name for f in spec.fields)]
    return names


def design_mark(column: str, value: Any) -> str:
    """The report's mark of a design column's value in a position label: the design's label
    (" +QK-norm"), ``hybrid_every`` k " (attention every k)", an unknown variant " +<value>"."""
    if column == "hybrid_every":
        return f" (attention every {value})"
    for design in designs().values():
        if design.switch == column and design.variant == value:
            return design.label
    return f" +{value}"
