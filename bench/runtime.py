"""Where and how a model runs: device resolution and mixed-precision autocast, one of each.

Training, evaluation and the lm-eval adapter all call these, so ``device=auto`` and
``precision=bf16`` mean the same thing everywhere.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

__all__ = ["PRECISIONS", "autocast", "resolve_device"]

PRECISIONS = ("fp32", "bf16")


def resolve_device(requested: Any) -> str:
    """``auto`` (or None) -> cuda if available else cpu; an unavailable device is a config error."""
    name = "auto" if requested is None or str(requested).strip() == "" else str(requested).strip()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(
            f"device {name!r} is unknown; allowed: auto, cpu, cuda, cuda:<index>, mps."
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device {name!r} is not available on this machine; use device=cpu or auto."
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(
            f"device {name!r} is not available on this machine; use device=cpu or auto."
        )
    return name


def autocast(device: str | torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast for ``precision="bf16"``, nothing for fp32.

    Weights, optimizer state, RoPE angles and softmax statistics stay float32 either way.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is unknown; allowed: {', '.join(PRECISIONS)}.")
    if precision == "bf16":
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
