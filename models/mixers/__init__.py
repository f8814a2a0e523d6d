"""Recurrent token mixers: each maps x [N, L, D] -> [N, L, D] causally, with no positions, and
equals its reference layer on the same weights (tests/models/test_mixers_*.py). The designs in
``models/designs/`` build them by name (``model.mixer``); one chunked recurrence serves all
(``models.mixers.recurrence``)."""

from models.mixers.gated_deltanet import GatedDeltaNet
from models.mixers.kda import KimiDeltaAttention
from models.mixers.mamba2 import Mamba2

__all__ = ["GatedDeltaNet", "KimiDeltaAttention", "Mamba2"]
