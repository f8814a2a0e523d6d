"""A transformers causal LM seen through the interface lenbench's metrics use on a ``DecoderLM``.

:class:`PretrainedLM` gives ``forward(input_ids, position_ids, attention_mask,
output_hidden_states, output_attn_entropy) -> LMOutput``, ``scaled(scaling, eval_length)``,
``position_range_error``, ``generate_greedy`` and ``model_cfg.n_layers``. Scaling methods that
transformers implements (linear, dynamic, yarn, llama3, longrope) are applied through the model's
own rope parameters: a rotary module is rebuilt from a copy of the config with lenbench's
parameters and swapped in, and the original comes back on exit; static NTK-aware (``ntk``) is
the default rope type with the NTK base (:func:`models.scaling.ntk_base`). Log-n scales each
query by its position's factor in a registered attention function wrapped around the model's
own; a training-free method (Self-Extend, ReRoPE, StreamingLLM) runs in its own registered
attention function, which rotates far pairs on from the shipped rope. Attention entropy runs through a
registered attention function that computes it in query tiles (memory linear in length) on models
that use transformers' attention interface, and through ``output_attentions`` on the others.
The registered attention functions are :mod:`bench.pretrained.attention`'s.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
from torch import nn

from bench.core.checks import NotApplicable, check_method
from bench.core.runtime import forward_takes
from bench.pretrained.attention import (
    ENTROPY_ATTENTION,
    PAIR_ATTENTION,
    register_entropy_attention,
    register_logn_attention,
    register_pair_attention,
    rotates_half,
    uses_attention_interface,
)
from bench.pretrained.config import position_family, rope_geometry
from models.scaling import SCALING_METHODS, ntk_base, pair_positions, rope_parameters
from models.scaling_config import ScalingConfig, resolve_params
from models.scoring import chunked_token_nll
from models.transformer import LMOutput

__all__ = [
    "PAIR_METHODS",
    "TRANSFORMERS_METHODS",
    "PretrainedLM",
    "check_pretrained_scaling",
    "check_scaling_params",
    "pretrained_methods",
    "rope_for",
]

#: lenbench scaling methods that transformers implements as a rope type of the same name.
TRANSFORMERS_METHODS = ("linear", "dynamic", "yarn", "llama3", "longrope")
#: ... and those applied through transformers' default rope type with another base.
BASE_METHODS = ("ntk",)
#: training-free methods (``models.scaling``'s pair methods), applied in a registered attention
#: function on the shipped rope
PAIR_METHODS = tuple(name for name, m in SCALING_METHODS.items() if m.pair_method)
#: config attributes of models whose logits are more than ``lm_head(hidden)`` (softcapping,
#: scales): such a model's targets are scored from its own full logits, not by chunks
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def pretrained_methods(family: str) -> tuple[str, ...]:
    """Scaling methods a pretrained model of ``family`` accepts ("default" = as shipped)."""
    if family != "rope":
        return ("default",)
    return ("default", *TRANSFORMERS_METHODS, *BASE_METHODS, *PAIR_METHODS)


def check_pretrained_scaling(
    family: str, scaling: ScalingConfig | None, model_class: type | None = None
) -> None:
    """Raise :class:`NotApplicable` (one line) when ``scaling`` cannot run on a ``family`` model
    (of ``model_class``, where known: log-n needs transformers' attention interface)."""
    if scaling is None:
        return
    if scaling.logn and model_class is not None and not uses_attention_interface(model_class):
        raise NotApplicable(
            f"scaling {scaling.name} is not applicable to {model_class.__name__}: log-n needs a "
            "model that dispatches attention through transformers' AttentionInterface."
        )
    if scaling.method in PAIR_METHODS and model_class is not None:
        if not uses_attention_interface(model_class) or not rotates_half(model_class):
            raise NotApplicable(
                f"scaling {scaling.name} is not applicable to {model_class.__name__}: a "
                "training-free method needs a model that dispatches attention through "
                "transformers' AttentionInterface and rotates with rotate_half (Llama-style)."
            )
    check_method(
        "scaling",
        scaling.name,
        scaling.method,
        family,
        pretrained_methods(family),
        owner=f"a pretrained {family} model",
    )


def check_scaling_params(
    config, train_length: int, scaling: ScalingConfig, eval_length: int | None
) -> None:
    """Raise ValueError (one sentence) for parameters ``scaling`` rejects on this rope model at
    ``eval_length``: a training-free method's pair positions, else its rope parameters."""
    if scaling.method in PAIR_METHODS:
        params = resolve_params(
            scaling, train_length=train_length, eval_length=eval_length, rotary_pairs=0
        )
        pair_positions(scaling.method, train_length=train_length, **params)
    else:
        rope_for(config, train_length, scaling, eval_length)


def rope_for(
    config, train_length: int, scaling: ScalingConfig, eval_length: int | None
) -> tuple[dict, dict]:
    """(transformers rope parameters, lenbench params) that apply ``scaling`` to a rope model.

    The parameters are lenbench's (``factor: auto`` resolved for ``eval_length`` or the scaling's
    target), checked by ``models.scaling.rope_parameters`` (one sentence each) before transformers
    sees them; ``original_max_position_embeddings`` is the model's training length.
    """
    geometry = rope_geometry(config)
    pairs = int(geometry["head_dim"] * geometry["rotary_fraction"]) // 2
    params = resolve_params(
        scaling, train_length=train_length, eval_length=eval_length, rotary_pairs=pairs
    )
    rope_parameters(
        scaling.method,
        head_dim=geometry["head_dim"],
        base=geometry["base"],
        original_length=train_length,
        seq_len=eval_length or train_length,
        rotary_fraction=geometry["rotary_fraction"],
        **params,
    )
    if scaling.method == "ntk":
        rotary_dim = 2 * pairs
        rope = {
            "rope_type": "default",
            "rope_theta": ntk_base(geometry["base"], **params, rotary_dim=rotary_dim),
        }
    else:
        rope = {"rope_type": scaling.method, "rope_theta": geometry["base"], **params}
    if geometry["rotary_fraction"] != 1.0:
        rope["partial_rotary_factor"] = geometry["rotary_fraction"]
    if scaling.method in ("yarn", "llama3", "longrope"):
        rope["original_max_position_embeddings"] = int(train_length)
    return rope, params


@dataclass(frozen=True)
class PretrainedGeometry:
    """The dimensions metrics read off ``model.model_cfg``."""

    n_layers: int
    d_model: int
    vocab_size: int


# --------------------------------------------------------------------------- the adapter


@contextlib.contextmanager
def _held_head_inputs(head: nn.Module) -> Iterator[list[torch.Tensor]]:
    """While open, ``head`` gets none of its input's positions (it returns [N, 0, V]); each input
    it was called with is appended to the yielded list for the caller to score by chunks."""
    inputs: list[torch.Tensor] = []

    def hold(module, args):
        inputs.append(args[0])
        return (args[0][:, :0],)

    handle = head.register_forward_pre_hook(hold)
    try:
        yield inputs
    finally:
        handle.remove()


class PretrainedLM(nn.Module):
    """A transformers causal LM with the DecoderLM interface lenbench's metrics use (module doc)."""

    def __init__(self, model: nn.Module, tokenizer, train_length: int, family: str | None = None):
        super().__init__()
        self.hf = model
        self.tokenizer = tokenizer
        self.train_length = int(train_length)
        self.family = family or position_family(model.config, model)
        config = model.config
        layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
        width = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
        self.model_cfg = PretrainedGeometry(int(layers), int(width), int(config.vocab_size))
        forward_args = inspect.signature(model.forward).parameters
        self.accepts_position_ids = self.family != "alibi" and "position_ids" in forward_args
        self.scaling = ScalingConfig()

    def chunked_head(self) -> nn.Linear | None:
        """The LM head that chunked scoring applies itself; None where the model's logits are more
        than the head's output (``LOGIT_TRANSFORMS``) or the head is not a linear layer."""
        head = self.hf.get_output_embeddings()
        if any(getattr(self.hf.config, a, None) is not None for a in LOGIT_TRANSFORMS):
            return None
        return head if isinstance(head, nn.Linear) else None

    # ------------------------------------------------------------------ positions and scaling

    def position_ids_error(self) -> str | None:
        """Why this model cannot take explicit position ids, or None."""
        if self.accepts_position_ids:
            return None
        return (
            f"this pretrained {self.family} model ({type(self.hf).__name__}) computes its positions "
            "itself and takes no position ids"
        )

    def position_range_error(self, max_position: int, seq_len: int) -> str | None:
        """Why positions up to ``max_position`` cannot be embedded (a learned table's end), or None."""
        if self.family != "learned":
            return None
        rows = next(
            (
                m.num_embeddings
                for name, m in self.hf.named_modules()
                if isinstance(m, nn.Embedding)
                and name.rsplit(".", 1)[-1] in ("wpe", "embed_positions", "position_embeddings")
            ),
            None,
        )
        if rows is None or max_position < rows:
            return None
        return f"position {max_position} is beyond the learned position table ({rows} rows)"

    def _rotary_modules(self) -> list[tuple[nn.Module, str, nn.Module]]:
        """(parent, attribute, module) of every rotary embedding module."""
        found = []
        for _, parent in self.hf.named_modules():
            for attr, child in parent.named_children():
                if type(child).__name__.endswith("RotaryEmbedding") and hasattr(child, "rope_type"):
                    found.append((parent, attr, child))
        return found

    @contextlib.contextmanager
    def scaled(
        self, scaling: ScalingConfig | None, eval_length: int | None = None
    ) -> Iterator[PretrainedLM]:
        """``with model.scaled(scaling, eval_length):`` the scaling applied, the shipped rope after.

        Method ``default`` is the model as shipped (its own rope parameters, scaled or not); any
        other replaces them. ``logn`` scales the queries (models that dispatch attention through
        transformers' AttentionInterface). Raises NotApplicable (see
        :func:`check_pretrained_scaling`).
        """
        check_pretrained_scaling(self.family, scaling, type(self.hf))
        if scaling is None:
            yield self
            return
        previous = self.scaling
        try:
            if scaling.method == "default":
                self.scaling = scaling
                yield self
            elif scaling.method in PAIR_METHODS:  # the shipped rope; pairs moved in attention
                pairs = int(self._inv_freq().numel())
                params = resolve_params(
                    scaling,
                    train_length=self.train_length,
                    eval_length=eval_length,
                    rotary_pairs=pairs,
                )
                pair_positions(scaling.method, train_length=self.train_length, **params)
                self.scaling = replace(scaling, params=params)
                yield self
            else:
                with self._swapped_rope(scaling, eval_length) as params:
                    self.scaling = replace(scaling, params=params)
                    yield self
        finally:
            self.scaling = previous

    @contextlib.contextmanager
    def _swapped_rope(self, scaling: ScalingConfig, eval_length: int | None) -> Iterator[dict]:
        """Every rotary module rebuilt with ``scaling``'s rope parameters (yields lenbench's
        resolved parameters); the shipped modules come back on exit."""
        rope, params = rope_for(self.hf.config, self.train_length, scaling, eval_length)
        if any(isinstance(v, dict) for v in (self.hf.config.rope_parameters or {}).values()):
            raise ValueError("models with per-layer rope parameters are not supported for scaling.")
        config = copy.deepcopy(self.hf.config)
        config.rope_parameters = rope
        if scaling.method == "dynamic":  # transformers' dynamic reads the original length here
            config.max_position_embeddings = self.train_length
        swapped = []
        try:
            for parent, attr, old in self._rotary_modules():
                new = type(old)(config).to(old.inv_freq.device)
                setattr(parent, attr, new)
                swapped.append((parent, attr, old))
            if not swapped:
                raise ValueError(f"no rotary embedding module found in {type(self.hf).__name__}.")
            yield params
        finally:
            for parent, attr, old in swapped:
                setattr(parent, attr, old)

    def _inv_freq(self) -> torch.Tensor:
        """The rotary module's current inverse frequencies [r/2] (one module for all layers)."""
        modules = self._rotary_modules()
        if not modules:
            raise ValueError(f"no rotary embedding module found in {type(self.hf).__name__}.")
        return modules[0][2].inv_freq

    @contextlib.contextmanager
    def _attention_implementation(self, entropy: bool) -> Iterator[None]:
        """The attention function of one forward pass: the model's own, the entropy one, or the
        log-n wrapper around either when the active scaling has ``logn``; a training-free method's
        own (which does log-n and entropy itself)."""
        config = self.hf.config
        before = config._attn_implementation
        if self.scaling is not None and self.scaling.method in PAIR_METHODS:
            spec = pair_positions(
                self.scaling.method, train_length=self.train_length, **self.scaling.params
            )
            register_pair_attention()
            config._lenbench_pairs = (
                spec,
                self._inv_freq().float(),
                self.train_length,
                self.scaling.logn,
                entropy,
            )
            config._attn_implementation = PAIR_ATTENTION
            try:
                yield
            finally:
                config._attn_implementation = before
                config.__dict__.pop("_lenbench_pairs", None)
            return
        inner = before
        if entropy:
            register_entropy_attention()
            inner = ENTROPY_ATTENTION
        logn = self.scaling is not None and self.scaling.logn
        try:
            if logn:
                config._lenbench_logn = (self.train_length, inner)
                config._attn_implementation = register_logn_attention(inner)
            else:
                config._attn_implementation = inner
            yield
        finally:
            config._attn_implementation = before
            config.__dict__.pop("_lenbench_logn", None)

    def _reset_dynamic(self) -> None:
        """Make dynamic rope stateless: frequencies follow this forward pass's length only."""
        for _, _, rotary in self._rotary_modules():
            if "dynamic" in str(rotary.rope_type):
                rotary.register_buffer(
                    "inv_freq", rotary.original_inv_freq.clone(), persistent=False
                )
                rotary.max_seq_len_cached = rotary.original_max_seq_len

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attn_entropy: bool = False,
        logits_from: int = 0,
        targets: torch.Tensor | None = None,
        return_logits: bool = True,
    ) -> LMOutput:
        """input_ids [N, L] -> LMOutput(logits [N, L - logits_from, V] float32, hidden_states,
        attn_entropy); transformers computes only those logits (``logits_to_keep``) where the
        model takes it, which matters for a large vocabulary at long lengths.

        ``targets`` [N, L - logits_from]: the output holds their NLL (``token_nll``) instead of
        logits; the model's LM head is then held back (it gets no positions) and applied here in
        chunks of positions to its input (:func:`models.scoring.chunked_token_nll`), so no
        [N, L, V] tensor is made, except for models listed by ``LOGIT_TRANSFORMS``.
        ``return_logits=False``: the LM head gets no positions (for hidden states or attention
        entropy); the output's logits are None."""
        n, length = input_ids.shape
        if not 0 <= logits_from < length:
            raise ValueError(
                f"logits_from must be in [0, {length}) for {length} tokens, got {logits_from}."
            )
        kwargs = {
            "attention_mask": attention_mask,
            "output_hidden_states": output_hidden_states,
            "use_cache": False,
        }
        keep = logits_from and forward_takes(type(self.hf), "logits_to_keep")
        if keep:
            kwargs["logits_to_keep"] = length - logits_from
        if position_ids is not None:
            problem = self.position_ids_error()
            if problem is not None:
                raise ValueError(f"{problem}.")
            kwargs["position_ids"] = position_ids.to(input_ids.device).long().expand(n, length)
        self._reset_dynamic()
        # the LM head held back: to score targets by chunks, or because no logits are wanted
        head = self.chunked_head() if targets is not None else None
        hold = self.hf.get_output_embeddings() if targets is None and not return_logits else head
        held = _held_head_inputs(hold) if hold is not None else contextlib.nullcontext([])
        with held as head_inputs:
            if not output_attn_entropy:
                with self._attention_implementation(entropy=False):
                    out = self.hf(input_ids, **kwargs)
                entropy = None
            elif uses_attention_interface(self.hf):
                out, entropy = self._entropy_forward(input_ids, kwargs)
            else:  # e.g. BLOOM: its own attention code; the probabilities come back per layer
                out = self.hf(input_ids, output_attentions=True, **kwargs)
                entropy = [
                    -torch.special.xlogy(a.float(), a.float()).sum(-1) for a in out.attentions
                ]
        hidden = list(out.hidden_states) if output_hidden_states else None
        if head is not None:
            head_input = head_inputs[-1]  # [N, L, D] or [N, L - logits_from, D] (kept)
            if head_input.shape[1] != targets.shape[1]:
                head_input = head_input[:, logits_from:]
            nll = chunked_token_nll(head, head_input, targets, head.out_features)
            return LMOutput(None, None, hidden, entropy, nll)
        if targets is None and not return_logits:
            return LMOutput(None, None, hidden, entropy)
        logits = out.logits if keep or not logits_from else out.logits[:, logits_from:]
        if targets is None:
            return LMOutput(logits.float(), None, hidden, entropy)
        nll = torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), targets.to(logits.device).flatten(), reduction="none"
        ).view(targets.shape)
        return LMOutput(None, None, hidden, entropy, nll)

    def _entropy_forward(self, input_ids: torch.Tensor, kwargs: dict):
        with self._attention_implementation(entropy=True):
            out = self.hf(input_ids, **kwargs)
        entropy = []
        for module in self.hf.modules():
            value = module.__dict__.pop("_lenbench_entropy", None)
            if value is not None:
                entropy.append(value)
        return out, entropy

    @torch.no_grad()
    def generate_greedy(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy decoding with the model's KV cache -> [N, max_new_tokens] (no early stop)."""
        self._reset_dynamic()
        # transformers >= 5.24 names the KV cache ``cache``; older model code ``past_key_values``
        name = "cache" if forward_takes(type(self.hf), "cache") else "past_key_values"
        generated = []
        # the prompt's last logits only where the model can: no [N, L, V] tensor for a long prompt
        last = {"logits_to_keep": 1} if forward_takes(type(self.hf), "logits_to_keep") else {}
        with self._attention_implementation(entropy=False):
            out = self.hf(input_ids, use_cache=True, **last)
            for _ in range(int(max_new_tokens)):
                next_token = out.logits[:, -1].argmax(dim=-1, keepdim=True)  # [N, 1]
                generated.append(next_token)
                if len(generated) == max_new_tokens:
                    break
                out = self.hf(next_token, use_cache=True, **{name: getattr(out, name)})
        return torch.cat(generated, dim=1)
