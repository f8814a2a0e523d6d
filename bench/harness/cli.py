"""``lenbench-harness``: lm-eval's own CLI with the ``lenbench`` model and lenbench's tasks.

lm-eval 0.4 has no plugin discovery, so this imports the package (which registers the model),
adds ``--include_path`` for our task YAMLs and hands over to ``lm_eval.__main__``.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench.harness.model  # noqa: F401  (registers the lenbench model with lm-eval)
from bench.core.progress import adopt_bars
from bench.harness.tasks import TASKS_DIR, split_tasks, task_names

logger = logging.getLogger(__name__)

_SUBCOMMANDS = ("run", "ls", "validate")
_HELP = ("-h", "--help")
#: lm-eval's modules whose loops draw a tqdm bar (``from tqdm import tqdm``)
LM_EVAL_BAR_MODULES = ("lm_eval.api.task", "lm_eval.api.model")


def _option_value(argv: Sequence[str], option: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(option + "="):
            return arg[len(option) + 1 :]
    return None


def _with_include_path(argv: list[str]) -> list[str]:
    """``argv`` plus ``--include_path TASKS_DIR`` unless given, or unless nothing would run."""
    if not argv or all(a in _HELP for a in argv):
        return argv
    if argv[0] not in _SUBCOMMANDS and not argv[0].startswith("-"):
        return argv  # lm-eval reports the unknown command itself
    if argv[0] == "run" and len(argv) == 1:
        return argv
    if _option_value(argv, "--include_path") is not None:
        return argv
    return [*argv, "--include_path", str(TASKS_DIR)]


def _skip_builtin_index_if_possible(argv: Sequence[str]) -> None:
    """When every requested task is ours, skip indexing lm-eval's built-in tasks (slow).

    The CLI builds its TaskManager through ``lm_eval.tasks.TaskManager``; this swaps in a subclass
    whose ``include_defaults`` defaults to False, for this process only. Any other task name (or a
    user's own ``--include_path``) leaves lm-eval untouched.
    """
    if _option_value(argv, "--include_path") != str(TASKS_DIR):
        return
    requested = _option_value(argv, "--tasks")
    if not requested:
        return
    names = split_tasks(requested)
    try:
        import lm_eval.tasks as tasks_module

        if not names or not set(names) <= set(task_names()):
            return
        base = tasks_module.TaskManager

        class _OwnTasksOnly(base):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs.setdefault("include_defaults", False)
                super().__init__(*args, **kwargs)

        tasks_module.TaskManager = _OwnTasksOnly
    except Exception as err:  # an lm-eval layout we do not know: just index everything
        logger.debug("not skipping lm-eval's task index: %s", err)


def _model_arg(argv: Sequence[str], name: str) -> str | None:
    for item in (_option_value(argv, "--model_args") or "").split(","):
        key, _, value = item.partition("=")
        if key.strip() == name:
            return value.strip()
    return None


def _with_training_template(argv: list[str]) -> list[str]:
    """``argv`` with ``template`` in ``--metadata``: the passkey template the ``lenbench``
    checkpoint trained with (its DONE record), as the native passkey metric uses, unless the
    metadata names one or the checkpoint cannot be read here (the model then reports it)."""
    import json

    from bench.harness.tasks import training_template
    from bench.train.checkpoints import DONE_FILE, checkpoint_ref_dir

    if _option_value(argv, "--model") != "lenbench":
        return argv
    given = _option_value(argv, "--metadata")
    try:
        metadata = json.loads(given) if given else {}
        ref = _model_arg(argv, "pretrained")
        if not isinstance(metadata, dict) or "template" in metadata or not ref:
            return argv
        root = _model_arg(argv, "cache_root")
        record = json.loads((checkpoint_ref_dir(ref, root) / DONE_FILE).read_text(encoding="utf-8"))
    except (ValueError, OSError):
        return argv
    template = training_template(record)
    if template is None:
        return argv
    metadata = json.dumps({**metadata, "template": template})
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--metadata" and i + 1 < len(out):
            out[i + 1] = metadata
            return out
        if arg.startswith("--metadata="):
            out[i] = f"--metadata={metadata}"
            return out
    return [*out, "--metadata", metadata]


class HarnessArgError(ValueError):
    """A ``lenbench-harness`` argument that cannot work; its message is one sentence."""


def _device_asked(argv: Sequence[str]) -> tuple[str, str] | None:
    """(where, device) of the device the user asked for: the ``lenbench`` model argument
    ``device``, ``--device``, or a ``--config`` file's ``device``; None when none names one (lm-eval
    then passes its own default, cuda:0)."""
    if _model_arg(argv, "device"):
        return "model argument device", str(_model_arg(argv, "device"))
    given = _option_value(argv, "--device")
    if given is not None:
        return "--device", given
    config = _option_value(argv, "--config")
    if config:
        import yaml

        try:
            values = yaml.safe_load(Path(config).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            return None  # lm-eval reports its own config file
        if isinstance(values, dict) and values.get("device") is not None:
            return f"device in {config}", str(values["device"])
    return None


def _check_device(argv: Sequence[str]) -> None:
    """An explicit CUDA device on a machine without CUDA: one sentence, before any model loads."""
    import torch

    asked = _device_asked(argv)
    if asked is None or torch.cuda.is_available():
        return
    where, device = asked
    if device.strip().lower().startswith("cuda"):
        raise HarnessArgError(
            f"{where} {device!r} asks for CUDA, which this machine does not have; use "
            f"{'device=cpu' if where.startswith('model') else '--device cpu'}, or give no device "
            "(cpu is then used)."
        )


def _with_default_device(argv: list[str]) -> list[str]:
    """``argv`` plus ``--device cpu`` for the ``lenbench`` model when no device was asked for and
    CUDA is not available (lm-eval would pass its default cuda:0), said in one line."""
    import torch

    if (
        _option_value(argv, "--model") != "lenbench"
        or _device_asked(argv) is not None
        or torch.cuda.is_available()
    ):
        return argv
    print(
        "lenbench-harness: no --device given and CUDA is not available: running on cpu.",
        file=sys.stderr,
    )
    return [*argv, "--device", "cpu"]


def check_arguments(argv: Sequence[str]) -> None:
    """Refuse, before any model loads, what cannot work: unknown ``--model_args`` keys of the
    ``lenbench`` model, a ``pretrained`` that is not a finished checkpoint, a task name that is
    neither ours nor lm-eval's (ours are checked at once; others need lm-eval's task index)."""
    from bench.harness.args import MODEL_ARGS, scaling_presets
    from models.scaling import SCALING_METHODS

    if _option_value(argv, "--model") == "lenbench":
        args = {}
        for item in (_option_value(argv, "--model_args") or "").split(","):
            if not item.strip():
                continue
            key, sep, value = item.partition("=")
            if not sep:
                raise HarnessArgError(
                    f"model argument {item.strip()!r} has no value; write key=value "
                    f"(keys: {', '.join(MODEL_ARGS)}, or a scaling method's parameters)."
                )
            args[key.strip()] = value.strip()
        scaling = args.get("scaling", "none")
        try:
            presets = scaling_presets(args.get("config_dir"))
        except ValueError as err:
            raise HarnessArgError(str(err)) from None
        if scaling not in presets and scaling not in SCALING_METHODS:
            allowed = sorted(set(presets) | set(SCALING_METHODS))
            raise HarnessArgError(
                f"model argument scaling={scaling!r} is unknown; allowed: {', '.join(allowed)}."
            )
        method = presets[scaling]["method"] if scaling in presets else scaling
        allowed = set(MODEL_ARGS) | set(SCALING_METHODS[method].parameters)
        unknown = sorted(set(args) - allowed)
        if unknown:
            raise HarnessArgError(
                f"model argument(s) {', '.join(unknown)} are unknown for the lenbench model with "
                f"scaling {scaling!r}; allowed: {', '.join(sorted(allowed))}."
            )
        if not args.get("pretrained"):
            raise HarnessArgError(
                "model argument pretrained is missing; give a checkpoint cache key or path."
            )
        _check_checkpoint(args["pretrained"], args.get("cache_root"))
        _check_device(argv)
    requested = _option_value(argv, "--tasks")
    if requested:
        names = split_tasks(requested)
        ours = set(task_names())
        foreign = [n for n in names if n not in ours]
        if foreign and all(n.startswith("lenbench") for n in foreign):
            raise HarnessArgError(
                f"task(s) {', '.join(foreign)} are not lenbench tasks; ours: "
                f"{', '.join(sorted(ours))}."
            )
        _check_named_lengths([n for n in names if n in ours], _option_value(argv, "--metadata"))


def _check_named_lengths(names: Sequence[str], metadata: str | None) -> None:
    """A task named for its length (``lenbench_passkey_1024``) keeps it: a ``length`` in
    ``--metadata`` would run it at another length under that name (lm-eval merges the metadata
    over the task's own)."""
    try:
        given = json.loads(metadata) if metadata else {}
    except json.JSONDecodeError:
        return  # lm-eval refuses it in its own words
    length = given.get("length") if isinstance(given, dict) else None
    if length is None:
        return
    named = {n: int(m.group(1)) for n in names if (m := re.search(r"_(\d+)$", n))}
    clash = [n for n, x in named.items() if str(x) != str(length)]
    if clash:
        bare = sorted({re.sub(r"_\d+$", "", n) for n in clash})
        raise HarnessArgError(
            f"--metadata length {length!r} would run {', '.join(clash)} (named for "
            f"{', '.join(str(named[n]) for n in clash)} tokens) at another length under the same "
            f"name; allowed: the task of that length, or {', '.join(bare)} with the length in "
            "--metadata."
        )


def _check_checkpoint(ref: str, cache_root: str | None) -> None:
    from bench.train.checkpoints import DONE_FILE, MODEL_FILE, CheckpointError, checkpoint_ref_dir

    try:
        directory = checkpoint_ref_dir(ref, cache_root)
    except CheckpointError as err:
        raise HarnessArgError(str(err)) from None
    if not (directory / MODEL_FILE).exists():
        raise HarnessArgError(
            f"pretrained={ref!r}: {directory} is not a lenbench checkpoint (it has no {MODEL_FILE})."
        )
    if not (directory / DONE_FILE).exists():
        raise HarnessArgError(
            f"pretrained={ref!r}: checkpoint {directory} is incomplete (no {DONE_FILE}): its "
            "training was interrupted."
        )


def main(argv: Sequence[str] | None = None) -> None:
    """``lenbench-harness``: lm-eval's CLI with the ``lenbench`` model and our tasks available."""
    from lm_eval.__main__ import cli_evaluate

    args = _with_include_path(list(sys.argv[1:] if argv is None else argv))
    try:
        check_arguments(args)
    except ValueError as err:
        print(f"lenbench-harness: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    args = _with_default_device(_with_training_template(args))
    _skip_builtin_index_if_possible(args)
    sys.argv = ["lenbench-harness", *args]
    adopt_bars(*LM_EVAL_BAR_MODULES)  # in a log, lm-eval's bars write plain lines too
    try:
        cli_evaluate()
    except ValueError as err:  # e.g. a model argument's value, checked when the model is built
        message = " ".join(str(err).split()) or type(err).__name__
        print(f"lenbench-harness: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
