"""The decoder-only language model that every position family plugs into.

Pre-norm blocks, attention from :mod:`models.attention`, explicit position ids everywhere
(so KV caching, padding and shift probes are correct by construction) and a KV cache that stores
keys already rotated at their own positions. A scaling method that needs a sequence length takes
each row's own (its largest real position id + 1), never the padded width of the batch.

Shapes: N batch, L new tokens, S keys (cached + new), H query heads, G key/value heads, d head dim,
D model width, V vocabulary.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.attention import Attention, logn_query_scale
from models.attention_inputs import AttentionInputs, pair_inputs
from models.designs.registry import Design, active_designs, attention_layers, check_designs
from models.mixers.cached import is_stateful, mix_cached
from models.model_config import ModelConfig
from models.positions import PositionConfig, RotaryTable, position_ids_from_attention_mask
from models.resolved_scaling import resolve_scaling, resolved_scaling
from models.scaling_config import ScalingConfig
from models.scoring import chunked_token_nll

__all__ = ["DecoderLM", "KVCache", "LMOutput", "ModelConfig", "ScalingConfig"]
__all__ += ["logn_query_scale", "resolve_scaling", "resolved_scaling"]  # re-exported


@dataclass
class KVCache:
    # per layer its cache entry: an attention layer's keys [N, G, S, d] (rotated at their own
    # positions) and values [N, G, S, d], then what a design's kernel hook keeps (FoX: its keys'
    # running sum of log forget gates [N, H, S]); a mixer layer's its state (models.mixers:
    # the conv's last inputs [N, size - 1, C], the recurrence's [N, H, dk, dv]; not growing with
    # S) or, for a mixer without one, its normed inputs [N, S, D] (models.mixers.cached)
    layers: list[tuple[torch.Tensor, ...]]
    positions: torch.Tensor  # [N, S] position id of every cached key
    valid: torch.Tensor  # [N, S] bool, False for padding
    row_lengths: torch.Tensor  # [N] each row's length for length-dependent scaling, at prefill

    @property
    def length(self) -> int:
        return self.positions.shape[1]

    def next_positions(self) -> torch.Tensor:
        """[N] the position id after each row's last real token."""
        return torch.where(self.valid, self.positions, -1).max(dim=-1).values + 1


@dataclass
class _Positions:
    position_ids: torch.Tensor  # [N, L] of the new tokens
    row_lengths: torch.Tensor  # [N] each row's length for length-dependent scaling
    k_pos: torch.Tensor  # [N, S] of every key, cached + new
    k_valid: torch.Tensor  # [N, S] bool, False for padding
    past_len: int


def _with_sink_token(positions: _Positions) -> _Positions:
    """``positions`` of a prefill with a sink token before every row, at the position of the
    row's first real token, so that every token keeps its position and each row its length."""
    valid = positions.k_valid  # [N, L]
    first = torch.where(valid, positions.position_ids, positions.position_ids.max() + 1)
    sink_pos = first.min(dim=1, keepdim=True).values  # [N, 1]
    position_ids = torch.cat((sink_pos, positions.position_ids), dim=1)  # [N, L + 1]
    k_valid = torch.cat((torch.ones_like(valid[:, :1]), valid), dim=1)
    return _Positions(position_ids, positions.row_lengths, position_ids, k_valid, 0)


@dataclass
class LMOutput:
    logits: torch.Tensor | None  # [N, L, V] float32; None when the forward pass scored targets
    past: KVCache | None = None
    hidden_states: list[torch.Tensor] | None = None  # [N, L, D] each; 0 = embeddings
    attn_entropy: list[torch.Tensor] | None = None  # per layer [N, H, L] float32, nats
    token_nll: torch.Tensor | None = None  # [N, L] float32 NLL of the targets, when given
    # with attn_entropy: per layer [N, H, L] float32, each query's attention on the first token
    attn_first_mass: list[torch.Tensor] | None = None


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.swiglu = cfg.mlp == "swiglu"
        self.up = nn.Linear(cfg.d_model, (2 if self.swiglu else 1) * cfg.ff_width, bias=False)
        self.down = nn.Linear(cfg.ff_width, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            gate, up = self.up(x).chunk(2, dim=-1)
            return self.down(F.silu(gate) * up)
        return self.down(F.gelu(self.up(x)))


def _norm(cfg: ModelConfig) -> nn.Module:
    return nn.RMSNorm(cfg.d_model) if cfg.norm == "rms" else nn.LayerNorm(cfg.d_model)


class Block(nn.Module):
    """A pre-norm block: attention with the active designs, or (``model.mixer``) a token mixer
    on the layers ``models.designs.registry.attention_layers`` gives it; then the MLP."""

    def __init__(
        self,
        cfg: ModelConfig,
        layer: int = 0,
        designs: Sequence[Design] = (),
        position_cfg: PositionConfig | None = None,
        mixer: Design | None = None,
    ):
        super().__init__()
        self.attn_norm = _norm(cfg)
        self.attn, self.mixer = None, None
        if mixer is None:
            attention = [d for d in designs if "mixer" not in d.hooks]
            self.attn = Attention(
                cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.head_dim, layer, attention, cfg,
                position_cfg,
            )  # fmt: skip
        else:
            self.mixer = mixer.build(cfg, layer)
        self.stateful = self.mixer is not None and is_stateful(self.mixer)  # False: recompute
        self.mlp_norm, self.mlp = _norm(cfg), MLP(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, inputs, cached, query_from: int = 0):
        """x [N, L, D] -> (x [N, L - query_from, D], cache entry, entropy); see
        Attention.forward, and :meth:`mix` for a mixer layer."""
        if self.mixer is not None:
            out, kept, entropy = self.mix(self.attn_norm(x), inputs, cached, query_from)
        else:
            out, kept, entropy = self.attn(self.attn_norm(x), inputs, cached, query_from)
        x = x[:, query_from:] + self.dropout(out)
        x = x + self.dropout(self.mlp(self.mlp_norm(x)))
        return x, kept, entropy

    def mix(self, h, inputs, cached, query_from: int):
        """A mixer layer over its normed input h [N, L, D] -> (output [N, L - query_from, D],
        cache entry, None): from the mixer's cached state if it has one (``stateful``), else by
        reading the whole prefix again (``models.mixers.cached``); either way a cached step
        equals the full pass and a padded row the unpadded one."""
        out, kept = mix_cached(self.mixer, h, inputs.k_valid, cached, self.stateful)
        return out[:, query_from:], kept, None


class DecoderLM(nn.Module):
    def __init__(self, model_cfg: ModelConfig, position_cfg: PositionConfig, train_length: int):
        super().__init__()
        model_cfg.validate()
        position_cfg.validate(model_cfg.head_dim, model_cfg.d_model)
        check_designs(model_cfg, position_cfg)
        if train_length < 2:
            raise ValueError(f"train_length {train_length} must be at least 2.")
        self.model_cfg, self.position_cfg, self.train_length = model_cfg, position_cfg, train_length
        self.family = position_cfg.family
        self.tok_emb = nn.Embedding(model_cfg.vocab_size, model_cfg.d_model)
        self.family.init(self)  # the family's own parameters and buffers
        self.sink_embedding = None  # the sink token's input vector (attention_sink=token)
        self.designs = active_designs(model_cfg, position_cfg)
        for design in self.designs:
            design.init_model(self)
        mixer = next((d for d in self.designs if "mixer" in d.hooks), None)
        self.blocks = nn.ModuleList(
            Block(model_cfg, i, self.designs, position_cfg, None if attends else mixer)
            for i, attends in enumerate(attention_layers(model_cfg))
        )
        self.final_norm = _norm(model_cfg)
        self.lm_head = nn.Linear(model_cfg.d_model, model_cfg.vocab_size, bias=False)
        if model_cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self._init_weights()
        self.resolved_scaling = resolved_scaling(None, model_cfg, position_cfg, train_length)

    def _init_weights(self) -> None:
        # GPT-2 init: residual projections shrink with depth so the stream's variance stays O(1)
        for name, param in self.named_parameters():
            if name.endswith("weight") and param.dim() == 2:
                std = (
                    0.02 / math.sqrt(2 * self.model_cfg.n_layers)
                    if "o_proj" in name or "down" in name
                    else 0.02
                )
                nn.init.normal_(param, std=std)

    # ------------------------------------------------------------------ eval-time scaling

    def set_scaling(self, scaling: ScalingConfig | None, eval_length: int | None = None) -> None:
        """Switch the context-extension method used by later forward passes (None = raw model).

        ``factor: auto`` resolves to target / train_length (at least 1), the target being
        ``scaling.target_length`` if set, else ``eval_length``. A caller that measures several
        lengths fixes one factor for the run first (``models.scaling_config.run_scaling``), so that the
        length passed here changes only an oracle scaling.
        """
        self.resolved_scaling = resolved_scaling(
            scaling, self.model_cfg, self.position_cfg, self.train_length, eval_length
        )

    @property
    def scaling(self) -> ScalingConfig:
        """The active scaling setting, parameters concrete (its facts: ``resolved_scaling``)."""
        return self.resolved_scaling.config

    @contextlib.contextmanager
    def scaled(
        self, scaling: ScalingConfig | None, eval_length: int | None = None
    ) -> Iterator[DecoderLM]:
        """``with model.scaled(scaling, eval_length):`` the scaling at that length, restored after.

        The previous scaling comes back on exit, also when the block raises.
        """
        previous = self.resolved_scaling
        self.set_scaling(scaling, eval_length)
        try:
            yield self
        finally:
            self.resolved_scaling = previous

    def position_range_error(self, max_position: int, seq_len: int) -> str | None:
        """Why positions 0..max_position of a seq_len-token sequence cannot be embedded, or None.

        Follows the active scaling (a position transform stretches a learned table).
        """
        return self.position_cfg.range_error(
            max_position, seq_len, self.train_length, self.resolved_scaling.position_factor
        )

    def frequencies(self, seq_len: int) -> tuple[torch.Tensor, float]:
        """inv_freq and attention factor of the active scaling at ``seq_len`` (families with
        frequencies only), as the family uses them; computed once per scaling set (per length
        for a length-dependent method)."""
        return self.resolved_scaling.frequencies(seq_len)

    def rotary_table(self, seq_len: int) -> RotaryTable:
        """The cos/sin table of the active scaling: one per length if its method depends on the
        length (it declares so where it is registered), else one for every length."""
        return self.resolved_scaling.rotary_table(seq_len)

    def _length_dependent(self) -> bool:
        """Whether the position signal depends on the sequence length (and so on each row's)."""
        return self.resolved_scaling.length_dependent()

    def _per_row_length(
        self,
        fn: Callable[[torch.Tensor, int], tuple[torch.Tensor, ...]],
        position_ids: torch.Tensor,
        row_lengths: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """``fn(position_ids of some rows [n, L], their length)`` for every row at its own length.

        Rows of equal length are computed together; when nothing depends on the length, ``fn``
        runs once (with the training length, which it then ignores). Outputs are [N, L, ...].
        """
        if not self._length_dependent():
            return fn(position_ids, self.train_length)
        lengths = row_lengths.unique().tolist()
        if len(lengths) == 1:
            return fn(position_ids, int(lengths[0]))
        outputs: list[torch.Tensor] = []
        for length in lengths:
            rows = row_lengths == length
            for i, part in enumerate(fn(position_ids[rows], int(length))):
                if i == len(outputs):
                    outputs.append(part.new_empty((position_ids.shape[0], *part.shape[1:])))
                outputs[i][rows] = part
        return tuple(outputs)

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past: KVCache | None = None,
        use_cache: bool = False,
        output_hidden_states: bool = False,
        output_attn_entropy: bool = False,
        logits_from: int = 0,
        targets: torch.Tensor | None = None,
        return_logits: bool = True,
    ) -> LMOutput:
        """input_ids [N, L]; attention_mask [N, L] covers the new tokens only (the cache keeps the rest).

        ``logits_from`` = f > 0: logits only for the new tokens f..L-1 ([N, L - f, V]), equal to
        the full pass's ``logits[:, f:]``; the last layer then computes keys and values for every
        token but queries, attention output and MLP only for those (what a metric that scores a
        suffix needs). Not with hidden states or attention entropy, which need every token.

        ``targets`` [N, L - f] (the tokens that follow positions f..L-1): the output then holds
        their NLL (``token_nll``) instead of logits, the LM head applied in chunks of positions
        (:func:`models.scoring.chunked_token_nll`), so no [N, L, V] tensor is ever made.
        ``return_logits=False``: no LM head at all (for hidden states or attention entropy).
        """
        n, length = input_ids.shape
        if not 0 <= logits_from < length:
            raise ValueError(
                f"logits_from must be in [0, {length}) for {length} tokens, got {logits_from}."
            )
        if logits_from and (output_hidden_states or output_attn_entropy):
            raise ValueError(
                "logits_from > 0 leaves out the last layer's earlier tokens: it cannot be combined "
                "with output_hidden_states or output_attn_entropy."
            )
        positions = self._positions(input_ids, position_ids, attention_mask, past)
        x = self.tok_emb(input_ids)  # [N, L, D]
        # a sink token starts every sequence (not a cached one's continuation); dropped on output
        sunk = int(self.sink_embedding is not None and past is None)
        if sunk:
            positions = _with_sink_token(positions)
            x = torch.cat((self.sink_embedding.to(x.dtype).expand(n, 1, -1), x), dim=1)
        position_ids, row_lengths = positions.position_ids, positions.row_lengths
        family = self.family
        if family.acts_on == "input":
            (added,) = self._per_row_length(
                lambda pos, n: (family.embed(self, pos, n),), position_ids, row_lengths
            )
            x = x + added.to(x.dtype)
        inputs = self._attention_inputs(positions, output_attn_entropy)
        layer_inputs = family.layer_inputs(self, inputs)  # one per block: its own span, rotation
        for design in self.designs:  # SSMax: a layer's window or chunks, the keys in it
            layer_inputs = design.layer_inputs(self, layer_inputs)
        hidden_states = [x[:, sunk:]] if output_hidden_states else None
        x, kept, stats = self._blocks(
            x, layer_inputs, past, logits_from + sunk if logits_from else 0
        )
        if hidden_states is not None:
            hidden_states += [h[:, sunk:] for h in stats["hidden"]]
        # a mixer layer has no attention map: a model with one reports no entropy (None, as a
        # pretrained model without them; the probes then write no rows and say so)
        entropies = None
        if output_attn_entropy and all(attention_layers(self.model_cfg)):
            entropies = [e[:, :, sunk:] for e in stats["entropy"]]
        if sunk and not logits_from:
            x = x[:, 1:]  # the sink token predicts nothing
        hidden = self.final_norm(x)  # [N, L - f, D]
        logits, token_nll = None, None
        if targets is None:
            logits = self.lm_head(hidden).float() if return_logits else None
        else:
            token_nll = chunked_token_nll(self.lm_head, hidden, targets, self.model_cfg.vocab_size)
        cache = None
        if use_cache:
            cache = KVCache(kept, positions.k_pos, positions.k_valid, row_lengths)
        first_mass = None
        if entropies is not None:
            entropies, first_mass = [e[..., 0] for e in entropies], [e[..., 1] for e in entropies]
        return LMOutput(logits, cache, hidden_states, entropies, token_nll, first_mass)

    def _blocks(
        self, x: torch.Tensor, layer_inputs: list, past: KVCache | None, query_from: int
    ) -> tuple[torch.Tensor, list[tuple], dict[str, list]]:
        """Every block over x [N, L, D] -> (x, per layer its cache entry (``KVCache.layers``),
        {"hidden": each output, "entropy": [N, H, L, 2] entropy, first-key mass}); the last from
        ``query_from``."""
        kept = []
        stats: dict[str, list] = {"hidden": [], "entropy": []}
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            cached = past.layers[i] if past is not None else None
            start = query_from if i == last else 0
            x, entry, entropy = block(x, layer_inputs[i], cached, start)
            kept.append(entry)
            stats["hidden"].append(x)
            if entropy is not None:
                stats["entropy"].append(entropy)
        return x, kept, stats

    def _positions(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        past: KVCache | None,
    ) -> _Positions:
        """Position ids of the new tokens, each row's length and the keys' positions and validity."""
        n, length = input_ids.shape
        device = input_ids.device
        valid = (
            torch.ones(n, length, dtype=torch.bool, device=device)
            if attention_mask is None
            else attention_mask.to(device=device, dtype=torch.bool)
        )
        if position_ids is None:
            position_ids = position_ids_from_attention_mask(valid)
            if past is not None:
                position_ids = position_ids + past.next_positions()[:, None]
        position_ids = position_ids.to(device).long().expand(n, length)  # [N, L]
        if bool((position_ids < 0).any()):
            raise ValueError(f"position ids must be >= 0, got {int(position_ids.min())}.")
        if past is None:  # each row's own length: its largest real position id + 1
            row_lengths = (
                torch.where(valid, position_ids, -1).max(dim=-1).values.add(1).clamp(min=1)
            )
            return _Positions(position_ids, row_lengths, position_ids, valid, 0)
        return _Positions(
            position_ids,
            past.row_lengths,
            torch.cat((past.positions, position_ids), dim=1),  # [N, S]
            torch.cat((past.valid, valid), dim=1),
            past.length,
        )

    def _attention_inputs(self, positions: _Positions, want_entropy: bool) -> AttentionInputs:
        """What every layer's attention needs, once per forward pass: the family's rotation or
        score bias, log-n, the positions and the padding (a family may vary it per layer:
        ``Family.layer_inputs``)."""
        family = self.family
        cos = sin = k_cos = k_sin = None
        if family.acts_on == "qk":  # [N, L, r/2] each, once for all layers
            rotation = self._per_row_length(
                lambda pos, n: family.rotary(self, pos, n),
                positions.position_ids,
                positions.row_lengths,
            )
            # [N, 1, L, r/2] each; a family's per-head key table is [N, G, L, r/2] already
            cos, sin, *keys = (t if t.dim() == 4 else t[:, None] for t in rotation)
            if keys:  # the keys rotate (or scale) differently from the queries
                k_cos, k_sin = keys
        k_valid = positions.k_valid
        pairs = None
        spec = self.resolved_scaling.pairs  # checked once, when the scaling was set
        if spec is not None:  # a training-free method: RoPE moves far pairs by a rotation
            inv_freq = self.frequencies(self.train_length)[0] if family.acts_on == "qk" else None
            pairs = pair_inputs(
                spec, positions.position_ids, positions.k_pos, inv_freq, positions.k_valid
            )
        # each query's position, as a query scale reads it (StreamingLLM's: in its cache)
        at = (
            positions.position_ids
            if pairs is None
            else pairs.query_positions(positions.position_ids)
        )
        q_scale = None
        if self.scaling.logn:
            q_scale = logn_query_scale(at, self.train_length)[:, None, :, None]
        inputs = AttentionInputs(
            cos=cos,
            sin=sin,
            layout=family.qk_layout or getattr(self.position_cfg, "layout", "half"),  # none: unused
            score_bias=(
                family.score_bias(self, int(positions.k_pos.max()) + 1)
                if family.acts_on == "scores"
                else None
            ),
            q_scale=q_scale,
            q_pos=positions.position_ids,
            k_pos=positions.k_pos,
            k_valid=None if bool(k_valid.all()) else k_valid,
            past_len=positions.past_len,
            scale=1.0 / math.sqrt(self.model_cfg.head_dim),
            want_entropy=want_entropy,
            k_cos=k_cos,
            k_sin=k_sin,
            contextual_bias=(
                family.contextual_bias(self) if family.acts_on == "contextual" else None
            ),
            pairs=pairs,
        )
        for design in self.designs:  # Llama 4's temperature, SSMax's key counts
            inputs = design.attention_inputs(self, inputs, at)
        return inputs

    @torch.no_grad()
    def generate_greedy(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Greedy decoding with the KV cache: new tokens continue each row's own positions. -> [N, T]."""
        # the prompt's last logits only: a long prompt never makes [N, L, V] logits
        last = input_ids.shape[1] - 1
        out = self(input_ids, attention_mask=attention_mask, use_cache=True, logits_from=last)
        generated = []
        for _ in range(max_new_tokens):
            next_token = out.logits[:, -1].argmax(dim=-1, keepdim=True)  # [N, 1]
            generated.append(next_token)
            if len(generated) == max_new_tokens:
                break
            out = self(next_token, past=out.past, use_cache=True)
        return torch.cat(generated, dim=1)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
