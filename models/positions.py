"""Position encodings: one registered :class:`Family` per kind, and the pure functions they use.

A family says where it acts, and the transformer asks it only there (``Family.acts_on``):

- ``"input"``: adds a vector to the token embeddings (``sinusoidal``, ``learned``);
- ``"qk"``: rotates every layer's queries and keys after projection, never the values (``rope``);
- ``"scores"``: adds a bias b_h(i, j) of query position i and key position j to the attention
  logits (``alibi``), through one score hook that every attention kernel applies (:class:`ScoreBias`);
- ``"contextual"``: adds a term computed from each layer's own logits row, positions counted by
  the content (``cope``), through a second hook that the explicit attention path applies
  (:class:`ContextualBias`; no fused kernel can, so such a family always takes that path);
- ``"none"``: adds nothing; the causal mask is the only order signal (``nope``).

The families themselves are the modules of :mod:`models.families` (classic, zoo, hybrid), found
by the one discovery rule. Adding a family is one subclass of :class:`Family` decorated with
:func:`register_family` (its fields, checks and hook) in a module there or in a package named in
``extensions``, one ``conf/position/<kind>.yaml`` and tests; README, "Adding a position
encoding". Which scaling methods apply follows from what each method acts on
(``models.scaling.register_scaling(applies_to=...)``) and what the family has (``capabilities``).

Angles, frequencies and interpolation weights are computed in float32 whatever the model dtype:
in bf16, position 1995 rounds to 2000.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from models.discovery import import_package
from models.lazy import torch

ROPE_LAYOUTS = ("interleaved", "half")
OUT_OF_RANGE_POLICIES = ("error", "clamp", "interpolate")
ACTS_ON = ("input", "qk", "scores", "contextual", "none")


@dataclass(frozen=True)
class ScoreBias:
    """An additive attention-logit bias b_h(i, j) of query position i and key position j.

    ``fn(head, q_pos, k_pos, *args) -> float32 bias`` is a module-level function written with
    broadcasting tensor ops only; ``args`` are what it reads (slopes, bias tables: parameters keep
    their gradients; Python numbers for constants). The tiled kernel calls it with head
    [1, H, 1, 1], q_pos [N, 1, T, 1] and k_pos [N, 1, 1, S] and adds the [N, H, T, S] result to
    the scaled logits; flex attention calls the same function per entry (0-d tensors) inside its
    ``score_mod``. Positions are position ids, never indices; entries with j > i are masked
    afterwards but must stay finite.
    """

    fn: Callable[..., torch.Tensor]
    args: tuple[Any, ...] = ()

    def __call__(
        self, head: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> torch.Tensor:
        return self.fn(head, q_pos, k_pos, *self.args)


@dataclass(frozen=True)
class ContextualBias:
    """An additive attention-logit term that reads the logits themselves (CoPE's positions are
    counts of gates sigma(q . k) over the row).

    ``fn(layer, q, logits, scale, *args) -> [N, H, T, S] float32``: ``layer`` the block index,
    ``q`` [N, H, T, d] float32 the queries as the logits use them (rotated, log-n scaled),
    ``logits`` [N, H, T, S] float32 the scaled logits q . k x scale with -inf where masked
    (causal, padding), ``scale`` the attention scale. Applied in query tiles, so every row is
    complete; the result is added to ``logits`` before the softmax.
    """

    fn: Callable[..., torch.Tensor]
    args: tuple[Any, ...] = ()

    def __call__(
        self, layer: int, q: torch.Tensor, logits: torch.Tensor, scale: float
    ) -> torch.Tensor:
        return self.fn(layer, q, logits, scale, *self.args)


@dataclass
class PositionConfig:
    """The ``position`` section: the family's name, and through the family's own dataclass
    (``Family.config``, a subclass declared beside the family) the fields that family reads.

    ``PositionConfig(kind=k, **fields)`` builds family ``k``'s dataclass; a field that dataclass
    does not declare (another family's) is one sentence naming what ``k`` accepts. A family
    without fields uses :class:`PlainConfig`; this class itself is never instantiated.
    """

    kind: str = "rope"

    def __new__(cls, *args: Any, **kwargs: Any) -> PositionConfig:
        if cls is not PositionConfig:  # a family's own class (copies, replace, OmegaConf)
            return super().__new__(cls)
        kind = kwargs.get("kind", args[0] if args else "rope")
        refuse_foreign_fields(kind, kwargs)
        return super().__new__(family(kind).config)

    def validate(self, head_dim: int, d_model: int) -> None:
        owner = family(self.kind)
        if type(self) is not owner.config:  # exact: another family's class may subclass it
            raise ValueError(
                f"position.kind {self.kind!r} does not match the fields of "
                f"{type(self).__name__}; select a family with position={self.kind}, not by "
                "overriding position.kind."
            )
        owner.check(self, head_dim, d_model)

    @classmethod
    def from_stored(cls, values: dict[str, Any]) -> PositionConfig:
        """The config of a stored checkpoint. Checkpoints written while the section was one flat
        dataclass hold every family's fields: those of other families never entered the
        checkpoint key (nor the weights) and are dropped."""
        target = family(values.get("kind", "rope")).config
        return PositionConfig(
            **{k: v for k, v in values.items() if k in target.__dataclass_fields__}
        )

    @property
    def family(self) -> Family:
        return family(self.kind)

    def params(self) -> dict[str, Any]:
        """The fields the family reads (the ``position_params`` column; kind is its own)."""
        return {name: getattr(self, name) for name in family(self.kind).fields}

    def range_error(
        self,
        max_position: int,
        seq_len: int,
        train_length: int,
        position_factor: float | None = None,
    ) -> str | None:
        """Why positions 0..max_position of a seq_len-token sequence cannot be used, or None.

        ``position_factor`` is the active scaling's position transform
        (``models.resolved_scaling.ResolvedScaling.position_factor``; None: none). Needs no model:
        the same rule as the model's lookup.
        """
        return family(self.kind).range_error(
            self, int(max_position), int(seq_len), int(train_length), position_factor
        )

    @property
    def acts_on(self) -> str:
        return family(self.kind).acts_on


NO_VALUE = object()  # a setting whose value an error cannot know (Hydra's override errors)

#: Fields that entered every family's checkpoint key while the section was one flat dataclass
#: (before each family owned its fields): a family without them keys these values, so that the
#: models cached before the split are still found.
LEGACY_KEYED: dict[str, Any] = {
    "base": 10000.0,
    "layout": "half",
    "rotary_fraction": 1.0,
    "max_positions": 0,
}


def refuse_foreign_fields(kind: str, values: Any) -> None:
    """Raise ValueError (:func:`foreign_field_error`) for the first key of ``values`` (a mapping
    of field names) that family ``kind``'s dataclass does not declare."""
    own = family(kind).config.__dataclass_fields__
    for name in values:
        if name not in own:
            raise ValueError(foreign_field_error(kind, str(name), values[name]))


def foreign_field_error(kind: str, name: str, value: Any = NO_VALUE) -> str:
    """One sentence: ``position.<name>`` (set to ``value``, where known) is not a field of family
    ``kind``; what it accepts."""
    read = family(kind).fields
    accepts = (
        "accepts: " + ", ".join(f"position.{n}" for n in read)
        if read
        else "accepts no position.* field"
    )
    setting = f"position.{name}" if value is NO_VALUE else f"position.{name}={value!r}"
    return (
        f"{setting} means nothing for position={kind} (not one of its fields; another family's, "
        f"or none); position={kind} {accepts}."
    )


@dataclass
class PlainConfig(PositionConfig):
    """A family that reads no field (ALiBi, NoPE, KERPLE, Sandwich)."""


@dataclass
class FrequencyConfig(PositionConfig):
    """Families built on inverse frequencies base^(-2i/d) (sinusoidal, PoPE; RoPE's below)."""

    base: float = 10000.0

    def validate(self, head_dim: int, d_model: int) -> None:
        if self.base <= 1:
            raise ValueError(f"position.base must be greater than 1, got {self.base}.")
        super().validate(head_dim, d_model)


@dataclass
class RotaryConfig(FrequencyConfig):
    """Rotary families: how channels pair into rotations (``ROPE_LAYOUTS``)."""

    layout: str = "half"

    @property
    def rotary_fraction(self) -> float:
        """The fraction of each head's channels rotated: all of them (RoPE's config sets it)."""
        return 1.0


class Family:
    """A position encoding: its fields, its checks, where it acts and how.

    ``model`` in the hooks is the ``DecoderLM``; a family reads ``model.position_cfg``,
    ``model.model_cfg``, the active scaling's resolved facts ``model.resolved_scaling``
    (``models.resolved_scaling.ResolvedScaling``: its position transform, pair spec and caches;
    never a method's name), its ``model.frequencies(seq_len)`` / ``model.rotary_table(seq_len)``,
    and what its own :meth:`init` registered on the model.
    ``seq_len`` is the length a length-dependent signal is built for (each row's own length).
    """

    name: str = ""
    acts_on: str = "none"
    #: the family's own dataclass (a :class:`PositionConfig` subclass declared beside it)
    config: type[PositionConfig] = PlainConfig
    #: the fields it reads, its ``position_params``: ``config``'s fields but ``kind`` (set by
    #: :func:`register_family`)
    fields: tuple[str, ...] = ()
    #: what eval-time scaling methods can act on (``models.scaling.CAPABILITIES``); a method
    #: applies when the family has everything it acts on
    capabilities: tuple[str, ...] = ()
    #: whether the model reads the position ids at all (False: only the causal mask, or the
    #: content, orders tokens); training on sampled position ids then trains the same model
    reads_position_ids: bool = True
    #: how a ``"qk"`` family's cos/sin act on q and k (``models.positions.rotate``); None: the
    #: config's ``layout`` (RoPE's pairing), "polar": PoPE's magnitudes and phases
    qk_layout: str | None = None
    #: whether every layer's attention has FoX's data-dependent forget gate (``models.attention``:
    #: log f_t = log sigmoid(w_h . x_t + b_h) per head, the logit of pair (i, j) plus
    #: sum_{t=j+1..i} log f_t); its bias initialisation is the family's ``gate_bias(cfg)``
    forget_gate: bool = False
    #: bump when a code change alters the weights this family trains to (its initialisation, how
    #: its parameters learn): it enters the checkpoint key when > 0 (``bench.train.cache``), so that
    #: this family's cached checkpoints are retrained and every other family's are kept
    weights_revision: int = 0
    #: some layers attend within a window or chunks (hybrids): SSMax's n there is its span's
    layer_spans: bool = False

    def check(self, cfg: PositionConfig, head_dim: int, d_model: int) -> None:
        """Raise ValueError (one sentence) for fields this family cannot use with this geometry."""

    def check_row_span(self, cfg: PositionConfig, span: int, what: str) -> None:
        """One sentence (ValueError) if a row spanning ``span`` positions (``what``) is beyond it."""

    def gate_bias(self, cfg: PositionConfig) -> float:
        """The initial bias of the forget gate (families with :attr:`forget_gate` only)."""
        raise NotImplementedError(f"position family {self.name!r} has no forget gate.")

    def init(self, model: Any) -> None:
        """Register the family's parameters and buffers on the model (called once, after the
        token embedding and before the blocks, so the random stream stays in that order)."""

    def frequency_dims(
        self, cfg: PositionConfig, head_dim: int, d_model: int
    ) -> tuple[int, float] | None:
        """(dim, rotary_fraction) whose inverse frequencies the scaling methods rewrite, or None
        for a family without frequencies."""
        return None

    def length_dependent(self, cfg: PositionConfig, scaling: Any) -> bool:
        """Whether the signal depends on the sequence length under ``scaling`` (the active
        ``models.resolved_scaling.ResolvedScaling``; ``scaling.method`` its registered method)."""
        return False

    def embed(self, model: Any, position_ids: torch.Tensor, seq_len: int) -> torch.Tensor:
        """``"input"`` families: what is added to the token embeddings, [N, L, D] float32."""
        raise NotImplementedError(f"position family {self.name!r} adds nothing to the embeddings.")

    def rotary(
        self, model: Any, position_ids: torch.Tensor, seq_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``"qk"`` families: cos and sin [N, L, r/2] float32 of the rotation at ``position_ids``,
        or (q cos, q sin, k cos, k sin) where keys rotate or scale differently (xPos)."""
        raise NotImplementedError(f"position family {self.name!r} rotates nothing.")

    def score_bias(self, model: Any, length: int) -> ScoreBias | None:
        """``"scores"`` families: the additive logit bias (:class:`ScoreBias`) for this forward,
        whose position ids are all below ``length``."""
        return None

    def contextual_bias(self, model: Any) -> ContextualBias | None:
        """``"contextual"`` families: the logit term computed from each layer's logits row
        (:class:`ContextualBias`) for this forward."""
        return None

    def layer_inputs(self, model: Any, inputs: Any) -> list[Any]:
        """Each block's ``models.attention_inputs.AttentionInputs``, from the forward pass's ``inputs``
        (the same for every block here; a hybrid family varies rotation, span and temperature
        by layer, ``models.families.hybrid``)."""
        return [inputs] * model.model_cfg.n_layers

    def adjust_frequencies(
        self, cfg: PositionConfig, inv_freq: torch.Tensor, train_length: int
    ) -> torch.Tensor:
        """The inverse frequencies the family uses, from the scaling method's (identity here)."""
        return inv_freq

    def range_error(
        self,
        cfg: PositionConfig,
        max_position: int,
        seq_len: int,
        train_length: int,
        position_factor: float | None,
    ) -> str | None:
        """Why position ``max_position`` cannot be encoded (a finite table), or None, under the
        active scaling's position transform ``position_factor`` (None: none)."""
        return None


FAMILIES: dict[str, Family] = {}
"""Registered position families by ``PositionConfig.kind``, in registration order (complete once
:func:`families` or :func:`family` has run)."""

#: Modules whose import registers more families (loaded on the first lookup, by name, so that
#: they can import this module without an import cycle).
FAMILY_PACKAGE = "models.families"  # one module per group of families (models.discovery)


def register_family(cls: type[Family]) -> type[Family]:
    """Class decorator: register one instance of a :class:`Family` subclass under ``cls.name``."""
    if not cls.name or cls.name in FAMILIES:
        raise ValueError(f"position family name {cls.name!r} is empty or already registered.")
    if cls.acts_on not in ACTS_ON:
        raise ValueError(
            f"position family {cls.name!r} acts on {cls.acts_on!r}; allowed: {', '.join(ACTS_ON)}."
        )
    if not (isinstance(cls.config, type) and issubclass(cls.config, PositionConfig)):
        raise ValueError(
            f"position family {cls.name!r} has config {cls.config!r}; allowed: a dataclass "
            "subclass of models.positions.PositionConfig."
        )
    cls.fields = tuple(f.name for f in fields(cls.config) if f.name != "kind")
    FAMILIES[cls.name] = cls()
    return cls


def families() -> dict[str, Family]:
    """Every registered family by kind, every module of :data:`FAMILY_PACKAGE` loaded."""
    import_package(FAMILY_PACKAGE)
    return FAMILIES


def family(kind: str) -> Family:
    """The registered family ``kind``; an unknown kind is one sentence listing the registered ones."""
    if kind not in FAMILIES:
        families()
    if kind not in FAMILIES:
        raise ValueError(f"position.kind {kind!r} is unknown; allowed: {', '.join(FAMILIES)}.")
    return FAMILIES[kind]


def rope_cos_sin(
    position_ids: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every (position, frequency) angle, float32, shape [*position_ids.shape, r/2].

    ``attention_factor`` multiplies both, so the q.k logits scale by its square (YaRN's temperature).
    """
    angles = position_ids.to(torch.float32)[..., None] * inv_freq.to(torch.float32)
    return angles.cos() * attention_factor, angles.sin() * attention_factor


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """Rotate the first 2 * cos.shape[-1] channels of x [N, H, L, d]; cos/sin broadcast as [N|1, 1|H, L, r/2].

    ``interleaved`` pairs channels (0,1),(2,3),... (the seeds, Meta's complex form);
    ``half`` pairs (i, i + r/2) (GPT-NeoX, transformers' rotate_half). The rotation runs in float32.
    ``polar`` (PoPE, ``models.families.pope``): each of the d channels becomes a magnitude
    softplus(x) at the phase whose cos/sin [.., L, d] are given: [mu cos, mu sin], [N, H, L, 2d].
    """
    if layout == "polar":
        magnitude = torch.nn.functional.softplus(x.float())
        return torch.cat((magnitude * cos, magnitude * sin), dim=-1).to(x.dtype)
    half_r = cos.shape[-1]
    x_rot, x_pass = x[..., : 2 * half_r].float(), x[..., 2 * half_r :]
    if layout == "interleaved":
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
        rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    elif layout == "half":
        x1, x2 = x_rot[..., :half_r], x_rot[..., half_r:]
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        raise ValueError(f"rope layout {layout!r} is unknown; allowed: {', '.join(ROPE_LAYOUTS)}.")
    if x_pass.shape[-1] == 0:  # full rotation: skip a copy of q and k
        return rotated.to(x.dtype)
    return torch.cat((rotated.to(x.dtype), x_pass), dim=-1)


def apply_rope(
    x: torch.Tensor,
    position_ids: torch.Tensor,
    inv_freq: torch.Tensor,
    layout: str = "interleaved",
    attention_factor: float = 1.0,
) -> torch.Tensor:
    """Rotary position embedding of x [N, H, L, d] at position_ids [L] or [N, L] (public API)."""
    if 2 * inv_freq.numel() > x.shape[-1]:
        raise ValueError(
            f"inv_freq has {inv_freq.numel()} frequencies, which need {2 * inv_freq.numel()} channels, "
            f"but x has only {x.shape[-1]}."
        )
    cos, sin = rope_cos_sin(position_ids, inv_freq, attention_factor)  # [L, r/2] or [N, L, r/2]
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]  # [N, 1, L, r/2]: one rotation shared by all heads
    return rotate(x, cos, sin, layout)


class RotaryTable:
    """cos/sin for positions 0..length-1 of one inv_freq, built once per needed length and reused.

    Every layer of a forward pass gathers from the same table instead of recomputing angles.
    """

    def __init__(self, inv_freq: torch.Tensor, attention_factor: float):
        self.inv_freq = inv_freq.to(torch.float32)
        self.attention_factor = attention_factor
        self._cos = self._sin = torch.empty(0, inv_freq.numel())

    def __call__(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        needed = int(position_ids.max()) + 1 if position_ids.numel() else 0
        if needed > self._cos.shape[0] or self._cos.device != position_ids.device:
            length = max(needed, 2 * self._cos.shape[0], 64)
            positions = torch.arange(length, device=position_ids.device)
            self._cos, self._sin = rope_cos_sin(
                positions, self.inv_freq.to(position_ids.device), self.attention_factor
            )
        return self._cos[position_ids], self._sin[position_ids]  # [N, L, r/2]


# --------------------------------------------------------------------------- ALiBi


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Per-head slopes of Press et al. 2022: geometric from 2^(-8/n) with that ratio.

    For a head count that is not a power of two: the slopes of the largest power of two m <= n,
    then every other slope of the 2m sequence for the remaining n - m heads.
    """
    if n_heads < 1:
        raise ValueError(f"ALiBi needs at least one head, got {n_heads}.")

    def power_of_two_slopes(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    m = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two_slopes(m)
    if m < n_heads:
        slopes += power_of_two_slopes(2 * m)[0::2][: n_heads - m]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: torch.Tensor) -> ScoreBias:
    """ALiBi's :class:`ScoreBias`: -slopes[h] * (i - j) for query position i and key position j."""
    return ScoreBias(_alibi, (slopes.float(),))


def _alibi(
    head: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, slopes: torch.Tensor
) -> torch.Tensor:
    return -(slopes[head] * (q_pos - k_pos).to(torch.float32))


# --------------------------------------------------------------------------- padding


def llama4_query_temperature(position_ids: torch.Tensor, floor: int, scale: float) -> torch.Tensor:
    """Llama 4's query factor log1p(floor((p + 1) / floor)) * scale + 1 at position ids p,
    float32, same shape (transformers' ``Llama4TextAttention``, ``attn_temperature_tuning``)."""
    p = position_ids.to(torch.float32)
    return torch.log1p(torch.floor((p + 1.0) / floor)) * scale + 1.0


def position_ids_from_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, so left and right padding give the same positions.

    attention_mask [N, L] (1 = real token) -> LongTensor [N, L]; padding slots get 0 only to keep
    indices legal: the attention mask, not the position, is what keeps them out.
    """
    mask = attention_mask.long()
    return ((mask.cumsum(-1) - 1) * mask).clamp(min=0)
