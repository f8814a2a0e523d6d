"""``lenbench-harness``: lm-eval's own CLI with the ``lenbench`` model and lenbench's tasks.

lm-eval 0.4 has no plugin discovery, so this imports the package (which registers the model),
adds ``--include_path`` for our task YAMLs and hands over to ``lm_eval.__main__``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any

import bench.harness.model  # noqa: F401  (registers the lenbench model with lm-eval)
from bench.harness.tasks import TASKS_DIR, split_tasks, task_names

logger = logging.getLogger(__name__)

_SUBCOMMANDS = ("run", "ls", "validate")
_HELP = ("-h", "--help")


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

    from bench.cache import DONE_FILE, _resolve
    from bench.harness.tasks import training_template

    if _option_value(argv, "--model") != "lenbench":
        return argv
    given = _option_value(argv, "--metadata")
    try:
        metadata = json.loads(given) if given else {}
        ref = _model_arg(argv, "pretrained")
        if not isinstance(metadata, dict) or "template" in metadata or not ref:
            return argv
        root = _model_arg(argv, "cache_root")
        record = json.loads((_resolve(ref, root) / DONE_FILE).read_text(encoding="utf-8"))
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


def _check_checkpoint(ref: str, cache_root: str | None) -> None:
    from bench.cache import DONE_FILE, MODEL_FILE, CheckpointError, _resolve

    try:
        directory = _resolve(ref, cache_root)
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
    args = _with_training_template(args)
    _skip_builtin_index_if_possible(args)
    sys.argv = ["lenbench-harness", *args]
    try:
        cli_evaluate()
    except ValueError as err:  # e.g. a model argument's value, checked when the model is built
        message = " ".join(str(err).split()) or type(err).__name__
        print(f"lenbench-harness: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
