"""The ``data`` group: which corpus a job reads (``DataConfig``) and the split constants.

``name`` picks the kind (pycorpus, text, hf; ``bench.data.corpora`` reads it); a field marked with
kinds belongs to those kinds only and must keep its default under another. Every field of the
kind enters the checkpoint key (``as_dict``), so two configs that read the same text are one
corpus.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from bench.core.checks import (
    KINDS,
    WEIGHTS,
    boolean,
    choice,
    field_default,
    integer,
    kind_field,
    parse_section,
    weights_dict,
)

__all__ = [
    "CORPUS_KINDS",
    "DEFAULT_SPLIT_FRACTIONS",
    "SPLITS",
    "DataConfig",
    "normalize_fractions",
]

SPLITS = ("train", "validation", "test")
DEFAULT_SPLIT_FRACTIONS = {"train": 0.90, "validation": 0.05, "test": 0.05}
CORPUS_KINDS = ("pycorpus", "text", "hf")


def normalize_fractions(fractions: object) -> tuple[float, float, float]:
    """(train, validation, test) fractions from a mapping or a 3-sequence; they must sum to 1."""
    if fractions is None:
        fractions = DEFAULT_SPLIT_FRACTIONS
    if isinstance(fractions, Mapping):
        unknown = set(fractions) - set(SPLITS)
        if unknown:
            raise ValueError(
                f"split_fractions has unknown keys {sorted(unknown)}; allowed keys are {', '.join(SPLITS)}."
            )
        values = tuple(float(fractions.get(s, 0.0)) for s in SPLITS)
    elif isinstance(fractions, Sequence) and not isinstance(fractions, str) and len(fractions) == 3:
        values = tuple(float(x) for x in fractions)
    else:
        raise ValueError(
            f"split_fractions {fractions!r} is invalid; give a mapping with keys "
            "train/validation/test or a list of three numbers."
        )
    if any(not (v >= 0.0) for v in values) or not math.isclose(sum(values), 1.0, abs_tol=1e-6):
        raise ValueError(
            f"split_fractions {values} are invalid; they must be non-negative and sum to 1."
        )
    return values  # type: ignore[return-value]


@dataclass
class DataConfig:
    """The ``data`` group: where text comes from (``name``: pycorpus, text or hf).

    Caps (``max_files``/``max_bytes``) are deterministic; a field marked with kinds belongs to
    those kinds only and must keep its default under another.
    """

    name: str = "pycorpus"
    split_fractions: dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_SPLIT_FRACTIONS),
        metadata={WEIGHTS: lambda data: list(normalize_fractions(data.split_fractions))},
    )
    max_files: int | None = None
    max_bytes: int | None = None
    include_tests: bool = kind_field("pycorpus", default=False)  # the stdlib's test suites too
    paths: Any = kind_field("text", default=None)  # files, directories or glob patterns
    suffixes: Any = kind_field("text", default_factory=lambda: [".txt"])  # taken from directories
    root: str | None = kind_field(
        "text", default=None
    )  # ids are relative to it (None: common parent)
    path: str | None = kind_field("hf", default=None)  # dataset name, or a saved copy's directory
    config_name: str | None = kind_field("hf", default=None)
    data_files: Any = kind_field("hf", default=None)
    # one HF split, divided by hash (None: "train" unless splits is set) ...
    split: str | None = field(
        default=None,
        metadata={KINDS: ("hf",), WEIGHTS: lambda data: data.hf_split},
    )
    splits: dict[str, str] | None = kind_field("hf", default=None)  # ... or ours -> HF split names
    text_field: str = kind_field("hf", default="text")
    load_from_disk: bool = kind_field("hf", default=False)
    cache_dir: str | None = kind_field("hf", default=None)
    revision: str | None = kind_field("hf", default=None)
    load_kwargs: dict[str, Any] = kind_field("hf", default_factory=dict)

    def __post_init__(self) -> None:
        choice("data.name", self.name, CORPUS_KINDS)
        for f in fields(self):
            kinds = f.metadata.get(KINDS)
            value = getattr(self, f.name)
            if kinds and self.name not in kinds and value != field_default(f):
                raise ValueError(
                    f"data.{f.name} is a setting of data={'/'.join(kinds)}, not of "
                    f"data={self.name}, got {value!r}."
                )
        self.max_files = integer("data.max_files", self.max_files, 1, optional=True)
        self.max_bytes = integer("data.max_bytes", self.max_bytes, 1, optional=True)
        self.include_tests = boolean("data.include_tests", self.include_tests)
        normalize_fractions(self.split_fractions)
        if self.name == "text":
            if self.paths in (None, "", "???", []):
                raise ValueError(
                    "data.paths is required for data=text; give files, directories or glob patterns."
                )
            self.paths = [self.paths] if isinstance(self.paths, str) else list(self.paths)
            self.suffixes = (
                [self.suffixes] if isinstance(self.suffixes, str) else list(self.suffixes)
            )
        if self.name == "hf":
            self._check_hf()

    def _check_hf(self) -> None:
        if self.path in (None, "", "???"):
            raise ValueError(
                "data.path is required for data=hf; give a dataset name or a local path."
            )
        if self.split is not None and self.splits is not None:
            raise ValueError(
                "data.split and data.splits are both set for data=hf; set split (one HF split, "
                "divided by hash) or splits (a train/validation/test -> HF split mapping), not both."
            )
        if self.splits is not None:
            splits = self.splits
            if not isinstance(splits, Mapping) or not splits or not set(splits) <= set(SPLITS):
                raise ValueError(
                    f"data.splits must map some of {', '.join(SPLITS)} to HF split names, "
                    f"got {splits!r}."
                )
            self.splits = dict(splits)

    @property
    def hf_split(self) -> str | None:
        """The one HF split to divide by hash: ``split``, or "train" when no ``splits`` mapping."""
        return self.split if self.split is not None or self.splits is not None else "train"

    def as_dict(self) -> dict[str, Any]:
        """This kind's settings as plain values (every one of them changes the corpus)."""
        return weights_dict(self)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> DataConfig:
        """The config from plain data (or a DictConfig), checked as Hydra checks the group."""
        return parse_section(cls, values, "data")
