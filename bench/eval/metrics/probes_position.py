"""``position_probe_r2``: how well a linear probe reads absolute position from hidden states.

A ridge probe is fitted on one layer's hidden states at positions inside the training length and
scored (R^2) on other documents inside (axis_value "inside") and beyond it ("beyond"), so the
rows show whether a model keeps an absolute position signal past its trained range. The documents
come from the run's document set (``bench.eval.evaluate``), so they are the same at every eval length.
Its windows are the inputs of the nll metric's first windows: inside ``EvalContext.reuse_forwards``
it announces the hidden states it needs before the metrics of a length run (``prepare``), and
takes them from the nll forward passes instead of running the windows again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.core.checks import integer, number
from bench.data.corpora import Document
from bench.eval.metrics.context import EvalContext, first_windows, make_row, select_documents
from bench.eval.metrics.registry import MetricConfig, register_metric
from models.lazy import torch

__all__ = [
    "PositionProbeConfig",
    "position_probe_rows",
    "r2_score",
    "ridge_fit",
    "ridge_predict",
]

logger = logging.getLogger(__name__)


@dataclass
class PositionProbeConfig(MetricConfig):
    """``eval.position_probe_r2``: R^2 of a ridge probe from hidden states to position, inside /
    beyond L (the "beyond" row needs an eval length > the training length)."""

    lengths: Any = field(default_factory=lambda: ["1x", "4x", "16x"])  # eval lengths to run at
    # hidden-state index: 0 = embeddings, i = after block i; null = n_layers // 2
    layer: int | None = None
    fit_docs: int = 8  # documents the probe is fitted on
    test_docs: int = 8  # other documents it is scored on
    positions_per_doc: int = 256  # evenly spaced positions per document and region
    ridge: float = 0.001  # ridge penalty relative to the mean feature variance

    def __post_init__(self) -> None:
        super().__post_init__()
        self.layer = integer(self.key("layer"), self.layer, 0, optional=True)
        for key in ("fit_docs", "test_docs"):
            setattr(self, key, integer(self.key(key), getattr(self, key), 1))
        # an R^2 needs two positions per region, else the metric writes no row
        self.positions_per_doc = integer(self.key("positions_per_doc"), self.positions_per_doc, 2)
        self.ridge = number(self.key("ridge"), self.ridge, 0.0, interval="(]")


def _prepare(ctx: EvalContext, cfg: PositionProbeConfig, docs: Sequence[Document], length: int):
    plan = _probe_plan(
        ctx,
        docs,
        length,
        ctx.train_length,
        cfg.layer,
        cfg.fit_docs,
        cfg.test_docs,
        cfg.positions_per_doc,
        warn=False,
    )
    if plan is not None:
        layer, windows, _n_fit, inside, beyond = plan
        ctx.want_hidden(windows, layer, np.concatenate([inside, beyond]))


@register_metric("position_probe_r2", config=PositionProbeConfig, prepare=_prepare)
def position_probe_metric(
    ctx: EvalContext, cfg: PositionProbeConfig, docs: Sequence[Document], length: int
) -> list[dict]:
    return position_probe_rows(
        ctx,
        docs,
        length,
        ctx.train_length,
        layer=cfg.layer,
        fit_docs=cfg.fit_docs,
        test_docs=cfg.test_docs,
        positions_per_doc=cfg.positions_per_doc,
        ridge=cfg.ridge,
    )


def ridge_fit(x: np.ndarray, y: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Closed-form ridge regression y ~ x: returns (weights [D], feature mean [D], target mean).

    The penalty is ``alpha * trace(X'X) / D`` on centred features, so ``alpha`` does not depend
    on the scale of the hidden states; the intercept is not penalised.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    x_mean, y_mean = x.mean(axis=0), float(y.mean())
    xc = x - x_mean
    gram = xc.T @ xc
    dim = gram.shape[0]
    penalty = float(alpha) * (np.trace(gram) / dim if np.trace(gram) > 0 else 1.0)
    weights = np.linalg.solve(gram + penalty * np.eye(dim), xc.T @ (y - y_mean))
    return weights, x_mean, y_mean


def ridge_predict(model: tuple[np.ndarray, np.ndarray, float], x: np.ndarray) -> np.ndarray:
    weights, x_mean, y_mean = model
    return (np.asarray(x, dtype=np.float64) - x_mean) @ weights + y_mean


def r2_score(y: np.ndarray, prediction: np.ndarray) -> float:
    """1 - SSE / SST around the mean of ``y`` itself (NaN if y is constant)."""
    y = np.asarray(y, dtype=np.float64)
    sst = float(((y - y.mean()) ** 2).sum())
    if sst == 0:
        return float("nan")
    return 1.0 - float(((y - prediction) ** 2).sum()) / sst


def _spread_positions(lo: int, hi: int, count: int) -> np.ndarray:
    """Up to ``count`` evenly spaced integer positions in [lo, hi)."""
    if hi <= lo:
        return np.empty(0, dtype=np.int64)
    if hi - lo <= count:
        return np.arange(lo, hi)
    return np.unique(np.linspace(lo, hi - 1, count).round().astype(np.int64))


def _hidden_at(
    ctx: EvalContext, windows: torch.Tensor, layer: int, positions: np.ndarray, desc: str
) -> np.ndarray:
    """Hidden states of ``layer`` at ``positions`` for every window: [D * P, width] float64."""
    hidden = ctx.hidden_at(windows, layer, positions, desc)  # [D, P, width], kept ones reused
    return hidden.double().reshape(-1, hidden.shape[-1]).numpy()


def _probe_plan(
    ctx: EvalContext,
    docs: Sequence[Document],
    length: int,
    train_length: int,
    layer: int | None,
    fit_docs: int,
    test_docs: int,
    positions_per_doc: int,
    warn: bool = True,
) -> tuple[int, torch.Tensor, int, np.ndarray, np.ndarray] | None:
    """(layer, windows [fit + test, L], n_fit, inside positions, beyond positions), or None when
    there are fewer than two documents. Raises ValueError for a layer out of range."""
    n_layers = int(ctx.model.model_cfg.n_layers)
    layer = n_layers // 2 if layer is None else int(layer)
    if not 0 <= layer <= n_layers:
        if not warn:
            return None  # the metric itself raises
        raise ValueError(
            f"position probe layer {layer} is out of range; allowed: 0..{n_layers} (0 = embeddings)."
        )
    selected, _ = select_documents(docs, length, int(fit_docs) + int(test_docs))
    if len(selected) < 2:
        if warn:
            logger.warning(
                "position_probe_r2 at eval length %d skipped: needs two documents with %d tokens, "
                "found %d.",
                length,
                length,
                len(selected),
            )
        return None
    n_fit = min(len(selected) - 1, max(1, round(len(selected) * fit_docs / (fit_docs + test_docs))))
    windows = first_windows(selected, length)
    inside = _spread_positions(0, min(train_length, length), positions_per_doc)
    beyond = _spread_positions(train_length, length, positions_per_doc)
    return layer, windows, n_fit, inside, beyond


def position_probe_rows(
    ctx: EvalContext,
    docs: Sequence[Document],
    length: int,
    train_length: int,
    *,
    layer: int | None,
    fit_docs: int,
    test_docs: int,
    positions_per_doc: int,
    ridge: float,
) -> list[dict]:
    """``position_probe_r2``: R^2 of a ridge probe from one layer's hidden states to position.

    The probe is fitted on positions inside the training length of ``fit_docs`` documents and
    scored on other documents at positions inside (axis_value "inside") and, when
    length > train_length, beyond it ("beyond"). R^2 is computed around each region's own mean.
    ``layer`` indexes ``hidden_states`` (0 = embeddings output, i = after block i; None = middle).
    """
    plan = _probe_plan(
        ctx, docs, length, train_length, layer, fit_docs, test_docs, positions_per_doc
    )
    if plan is None:
        return []
    layer, windows, n_fit, inside, beyond = plan
    x_fit = _hidden_at(ctx, windows[:n_fit], layer, inside, f"probe fit L={length}")
    y_fit = np.tile(inside, n_fit).astype(np.float64)
    probe = ridge_fit(x_fit, y_fit, ridge)
    n_test = windows.shape[0] - n_fit
    both = np.concatenate([inside, beyond])
    x_test = _hidden_at(ctx, windows[n_fit:], layer, both, f"probe test L={length}")
    x_test = x_test.reshape(n_test, both.size, -1)
    rows = []
    for region, part in (("inside", slice(0, inside.size)), ("beyond", slice(inside.size, None))):
        positions = both[part]
        if positions.size < 2:
            continue
        x = x_test[:, part].reshape(-1, x_test.shape[-1])
        y = np.tile(positions, n_test).astype(np.float64)
        rows.append(
            make_row(
                "position_probe_r2",
                r2_score(y, ridge_predict(probe, x)),
                y.size,
                length,
                axis="region",
                axis_value=region,
                layer=layer,
            )
        )
    return rows
