"""Recurrent token mixers: each maps x [N, L, D] -> [N, L, D] causally, with no positions, and
equals its reference layer on the same weights (tests/models/test_mixers_*.py). The designs in
``models/designs/`` build them by name (``model.mixer``); one chunked recurrence serves all
(``models.mixers.recurrence``). Each also runs from a state (``step``: the conv's last inputs and
the recurrence's state), which a model's KV cache keeps, so decoding costs O(1) per token
(``models.mixers.cached``)."""

from models.mixers.gated_deltanet import GatedDeltaNet
from models.mixers.kda import KimiDeltaAttention
from models.mixers.mamba2 import Mamba2

__all__ = ["GatedDeltaNet", "KimiDeltaAttention", "Mamba2"]
