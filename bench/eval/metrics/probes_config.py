"""The analysis probes' config sections (``eval.shift_dnll``, ``eval.order_dnll``,
``eval.context_nll``, ``eval.attn_entropy``); the probes themselves: :mod:`bench.eval.metrics.probes`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.core.checks import integer
from bench.eval.metrics.registry import BootstrapConfig, MetricConfig, grid_field

__all__ = [
    "AttentionProbeConfig",
    "AttnEntropyConfig",
    "ContextNllConfig",
    "OrderDnllConfig",
    "ShiftDnllConfig",
    "context_top",
    "grid_within",
    "order_budget",
]


def grid_within(values: Any, bound: int) -> list[int]:
    """The grid's values in 0..``bound``, sorted, each once (the probe drops the others)."""
    return sorted({int(v) for v in values if 0 <= int(v) <= bound})


def order_budget(length: int, block: int, shuffle_block: int) -> int:
    """order_dnll's largest distance that still leaves two shuffle blocks before the final block."""
    return length - block - 2 * shuffle_block


def context_top(length: int, block: int) -> int:
    """context_nll's largest context: the whole window before the final block."""
    return length - block


@dataclass
class ShiftDnllConfig(BootstrapConfig):
    """``eval.shift_dnll``: NLL change when every position id is offset by delta (same tokens,
    same window); its bootstrap is paired over documents."""

    lengths: Any = field(default_factory=lambda: ["1x"])  # window lengths
    # offsets added to the position ids (0 is dropped)
    deltas: Any = grid_field([16, "0.25x", "1x", "2x", "4x", "8x", "16x"])

    def check_resolved(self) -> None:
        if not any(int(d) > 0 for d in self.deltas):
            raise ValueError(
                f"{self.key('deltas')} {list(self.deltas)} has no offset above 0, so the metric "
                "would write no row; allowed: offsets > 0 (tokens or '<m>x')."
            )


@dataclass
class OrderDnllConfig(BootstrapConfig):
    """``eval.order_dnll``: NLL change on the final block when the context farther than d tokens
    is shuffled; its bootstrap is paired over documents."""

    block: int = 32  # size of the scored final block (tokens)
    shuffle_block: int | None = None  # size of the shuffled blocks (null = block)
    distances: Any = grid_field("auto")  # d grid: auto = 0 and powers of two from block, or a list

    def __post_init__(self) -> None:
        super().__post_init__()
        self.block = integer(self.key("block"), self.block, 1)
        self.shuffle_block = integer(
            self.key("shuffle_block"), self.shuffle_block, 1, optional=True
        )

    def check_resolved(self) -> None:
        if self.distances is None:  # auto: the grid follows each length
            return
        for length in self.lengths:
            budget = order_budget(length, self.block, self.shuffle_block or self.block)
            if budget >= 0 and not grid_within(self.distances, budget):
                raise ValueError(
                    f"{self.key('distances')} {list(self.distances)} has no distance that leaves "
                    f"two blocks to shuffle at eval length {length} (at most {budget}), so the "
                    f"metric would write no row there; allowed: distances 0..{budget} or auto."
                )


@dataclass
class ContextNllConfig(BootstrapConfig):
    """``eval.context_nll``: NLL of the fixed final block given c tokens of visible context before
    it."""

    block: int = 32  # size of the scored final block (tokens)
    # c grid: auto = 0, powers of two and eval_length - block, or a list (values > length - block
    # are dropped)
    contexts: Any = grid_field("auto")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.block = integer(self.key("block"), self.block, 1)

    def check_resolved(self) -> None:
        if self.contexts is None:  # auto: the grid follows each length
            return
        for length in self.lengths:
            top = context_top(length, self.block)
            if top >= 0 and not grid_within(self.contexts, top):
                raise ValueError(
                    f"{self.key('contexts')} {list(self.contexts)} has no context of at most "
                    f"{top} tokens (eval length {length} - block {self.block}), so the metric "
                    f"would write no row there; allowed: contexts 0..{top} or auto."
                )


@dataclass
class AttentionProbeConfig(MetricConfig):
    """The keys of a per-layer, per-query-bucket attention probe (its metric's class sets the
    defaults); registered through its subclasses only."""

    buckets: Any = grid_field("auto")  # bucket edges, as for nll
    max_docs: int = 4  # test documents

    def __post_init__(self) -> None:
        super().__post_init__()
        self.max_docs = integer(self.key("max_docs"), self.max_docs, 1)


@dataclass
class AttnEntropyConfig(AttentionProbeConfig):
    """``eval.attn_entropy``: mean attention entropy (nats) per layer and query-position bucket."""

    lengths: Any = field(default_factory=lambda: ["1x", "4x", "16x"])  # eval lengths to run at
