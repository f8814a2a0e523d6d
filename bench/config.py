"""Turning Hydra's OmegaConf containers (or any nested mappings) into plain Python data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf


def plain(cfg: Any) -> Any:
    """A plain dict/list/scalar copy of a DictConfig, ListConfig or nested mappings, resolved.

    Missing values (``???``) stay as the string so that the code reading them can say which
    setting is missing in its own words.
    """
    if isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    if isinstance(cfg, Mapping):
        return {str(k): plain(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [plain(v) for v in cfg]
    return cfg
