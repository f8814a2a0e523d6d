"""The ``lenbench`` command: a Hydra app over the packaged ``conf/`` tree (:data:`CONFIG_DIR`).

Every job runs :func:`bench.job.run_job`. A bad override or config stops before anything trains
with one line ``lenbench: error: <sentence>`` (exit status 2); in a sweep, an error every cell
shares is reported once before any job starts, and a job that fails is recorded while the sweep
goes on. :class:`ReportCallback` prints the sweep summary and writes the report.
``HYDRA_FULL_ERROR=1`` shows full tracebacks instead.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from bench.core.checks import NotApplicable
from bench.core.config_dir import CONFIG_DIR  # lenbench's conf/, never a user's conf/ module
from bench.schema import JobConfig  # registers the config schema; imports no torch (models.lazy)

log = logging.getLogger("lenbench")

CONFIG_NAME = "config"
DEFAULT_EXPERIMENT = "quickstart"
STATUS_FILE = "lenbench_job.json"
ERROR_PREFIX = "lenbench: error: "
FAILED_STATUSES = ("invalid", "failed")
SWEEPERS = (".BasicSweeper", ".ApplicableSweeper")  # sweepers whose cells sweep_errors checks

# Set by ReportCallback.on_multirun_end / on_run_end in the launching process; read by main().
_OUTCOME: dict[str, Any] = {}


# --------------------------------------------------------------------------- the task


def _write_status(summary: dict[str, Any]) -> None:
    try:
        out = Path(HydraConfig.get().runtime.output_dir)
    except ValueError:  # pragma: no cover - not inside a Hydra job
        return
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{STATUS_FILE}.tmp"
    tmp.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    tmp.replace(out / STATUS_FILE)


def io_sentence(exc: OSError) -> str:
    """An I/O error as one sentence naming the path and the errno."""
    where = exc.filename if exc.filename is not None else "a file"
    reason = exc.strerror or str(exc) or type(exc).__name__
    errno = f" (errno {exc.errno})" if exc.errno is not None else ""
    return f"cannot write {str(where)!r}: {reason}{errno}; check that the directory exists, is a directory and is writable, and that the disk has space."


def task(cfg: DictConfig) -> dict[str, Any]:
    """One Hydra job: :func:`bench.job.run_job` plus status reporting.

    Single run: an invalid config, a scaling that does not apply, or a failed training is
    recorded for main(), which prints it as one line and exits non-zero. Multirun: the job logs
    one line, records its status and returns, so the sweep continues; unexpected exceptions are
    logged with their traceback and recorded as failures too (one buggy cell must not cost a
    40-job sweep).
    """
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    failed = None
    if multirun:  # a model that failed to train in this sweep is not trained again
        hydra_cfg = HydraConfig.get()
        failed = FailedModels(Path(hydra_cfg.sweep.dir), hydra_cfg.job.override_dirname)
    from bench.job import run_job  # torch: only once a job runs

    try:
        summary = run_job(cfg, failed)
    except OSError as exc:  # an unwritable or full results/cache directory: one sentence
        message = io_sentence(exc) if exc.filename is not None else one_line(exc)
        summary = {"status": "failed", "message": message}
    except Exception as exc:
        if not multirun:
            raise
        log.error("%sunexpected %s: %s", ERROR_PREFIX, type(exc).__name__, exc)
        log.error("%s", traceback.format_exc())
        summary = {"status": "failed", "message": f"unexpected {type(exc).__name__}: {exc}"}
    summary.setdefault("job", HydraConfig.get().job.override_dirname)
    _write_status(summary)
    status, message = summary["status"], summary.get("message", "")
    if not multirun and status in ("not_applicable", *FAILED_STATUSES):
        # Reported by main() as one line after Hydra returns (raising here would make Hydra
        # print "Error executing job with overrides ..." first).
        if status == "not_applicable":
            message = message.removesuffix(" skipped.").rstrip("; ") + "."
        _OUTCOME.update(error=message, exit=1 if status == "failed" else 2)
    elif status == "not_applicable":
        log.info("lenbench: %s", message)
    elif status in FAILED_STATUSES:
        log.error("%s%s", ERROR_PREFIX, message)
    else:
        log.info("lenbench: %s", message)
    return summary


class FailedModels:
    """The checkpoint keys whose training failed (diverged, out of memory) in this sweep: one
    file per key under ``<sweep dir>/.failed_models``, emptied when the sweep starts
    (:class:`ReportCallback`), so that a later cell needing the same model reports the failure
    in one sentence instead of training it again (jobs in other processes see it too)."""

    DIR = ".failed_models"

    def __init__(self, sweep_dir: Path, job: str) -> None:
        self.root, self.job = sweep_dir / self.DIR, job

    def earlier(self, keys: Sequence[str]) -> str | None:
        for key in keys:
            try:
                job = (self.root / key).read_text().strip()
            except OSError:
                continue
            return (
                f"model {key} already failed to train earlier in this sweep (job "
                f"[{job}]), so it is not trained again; that job's error says why."
            )
        return None

    def record(self, key: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(self.job + "\n")
        tmp.replace(self.root / key)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name=CONFIG_NAME)
def _hydra_app(cfg: DictConfig) -> dict[str, Any]:
    return task(cfg)


# --------------------------------------------------------------------------- sweep end: summary + report


def _status_files(sweep_dir: Path) -> dict[Path, int]:
    """The job status files under a sweep dir, with their modification times (ns)."""
    return {path: path.stat().st_mtime_ns for path in sorted(sweep_dir.glob(f"*/{STATUS_FILE}"))}


def _read_statuses(sweep_dir: Path, before: dict[Path, int] | None = None) -> list[dict[str, Any]]:
    """The statuses this sweep wrote: files not in ``before`` (the sweep dir at its start) or
    rewritten since, so that a sweep dir reused by an earlier sweep adds no stale jobs."""
    out = []
    for path, mtime in _status_files(sweep_dir).items():
        if before is not None and before.get(path) == mtime:
            continue
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            out.append({"status": "failed", "message": f"unreadable job status {path}"})
    return out


def summarize(statuses: Sequence[dict[str, Any]]) -> tuple[str, list[str]]:
    """(one summary line, one line per failed job)."""
    counts = {s: 0 for s in ("done", "cached", "not_applicable", "invalid", "failed")}
    trained = resumed = 0
    failures = []
    for st in statuses:
        status = st.get("status", "failed")
        counts[status] = counts.get(status, 0) + 1
        trained += bool(st.get("trained"))
        resumed += bool(st.get("resumed"))
        if status in FAILED_STATUSES:
            label = f"{st.get('position')}/{st.get('scaling')}"
            failures.append(f"  {label} [{st.get('job', '')}]: {st.get('message', '')}")
    line = (
        f"lenbench: {len(statuses)} jobs: {counts['done']} evaluated ({trained} trained a model"
        + (f", {resumed} of them resumed from a saved state" if resumed else "")
        + "), "
        + f"{counts['cached']} already had results, {counts['not_applicable']} not applicable "
        f"(skipped), {counts['invalid'] + counts['failed']} failed."
    )
    return line, failures


class ReportCallback(Callback):
    """At the end of a run or sweep: print the job summary, then write and print the report.

    The report covers every result of the experiment (``<paths.results>/<experiment_name>``),
    so a resumed or extended sweep reports everything measured so far.
    """

    def __init__(self, enabled: bool = True, note: str = "") -> None:
        self.enabled = bool(enabled)
        self.note = str(note)  # printed instead of a report where ``enabled`` is false
        self._sweep_dir: Path | None = None
        self._stale: dict[Path, int] = {}  # status files of an earlier sweep in the same dir

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._sweep_dir = Path(str(config.hydra.sweep.dir))
        self._stale = _status_files(self._sweep_dir)
        # failures of an earlier sweep in the same dir do not stop this one's trainings
        shutil.rmtree(self._sweep_dir / FailedModels.DIR, ignore_errors=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = self._sweep_dir or Path(str(config.hydra.sweep.dir))
        statuses = _read_statuses(sweep_dir, self._stale)
        line, failures = summarize(statuses)
        print(line, flush=True)
        for failure in failures:
            print(failure, flush=True)
        from bench.job_rows import checkpoint_line

        if (checkpoints := checkpoint_line(statuses)) is not None:
            print(checkpoints, flush=True)
        _OUTCOME.update(failed=len(failures), statuses=statuses, sweep_dir=str(sweep_dir))
        if any(st.get("status") in ("done", "cached") for st in statuses):
            self._report(config)
        else:
            print("lenbench: no job of this sweep ran; no report written.", flush=True)

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        out = Path(str(config.hydra.runtime.output_dir)) / STATUS_FILE
        statuses = _read_statuses_file(out)
        _OUTCOME.update(statuses=statuses)
        from bench.job_rows import checkpoint_line

        if (checkpoints := checkpoint_line(statuses)) is not None:
            print(checkpoints, flush=True)
        if statuses and statuses[0].get("status") in ("done", "cached"):
            self._report(config)

    def _report(self, config: DictConfig) -> None:
        if not self.enabled:
            if self.note:
                print(f"lenbench: {self.note}", flush=True)
            return
        from bench.report import generate_report

        base = Path(str(config.hydra.runtime.cwd))
        name = str(config.experiment_name)
        results = _absolute(config.paths.results, base) / name
        if not results.is_dir() or not any(results.glob("*.parquet")):
            print(f"lenbench: no results under {results}; no report written.", flush=True)
            return
        reports = _absolute(config.paths.reports, base) / name
        try:
            path = generate_report([results], reports)
        except ValueError as exc:  # e.g. a refused result file: the run did not succeed
            print(f"{ERROR_PREFIX}report not written: {exc}", file=sys.stderr, flush=True)
            _OUTCOME.update(report_failed=True)
            return
        except OSError as exc:  # the results are kept; the run must not look like a success
            print(
                f"{ERROR_PREFIX}report not written: {io_sentence(exc)}", file=sys.stderr, flush=True
            )
            _OUTCOME.update(report_failed=True)
            return
        _OUTCOME.update(report=str(path))
        print(f"lenbench: report written to {path}", flush=True)


def _read_statuses_file(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(path.read_text())]
    except (OSError, json.JSONDecodeError):
        return []


def _absolute(value: Any, base: Path) -> Path:
    path = Path(os.path.expandvars(os.path.expanduser(str(value))))
    return path if path.is_absolute() else base / path


# --------------------------------------------------------------------------- entry point


def with_default_experiment(argv: Sequence[str]) -> list[str]:
    """``argv`` plus ``+experiment=quickstart`` when it holds no override and no --config-name.

    Flags such as --cfg, --info, -m or --config-dir keep the default, so ``lenbench --cfg hydra``
    shows the quickstart sweep; any ``key=value`` override means "the default config".
    """
    from hydra._internal.utils import get_args_parser

    argv = list(argv)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = get_args_parser().parse_args(argv)
    except SystemExit:  # a bad flag: Hydra reports it itself
        return argv
    if (
        args.overrides
        or args.config_name is not None
        or args.help
        or args.hydra_help
        or args.shell_completion
        or args.experimental_rerun is not None
    ):
        return argv
    return [*argv, f"+experiment={DEFAULT_EXPERIMENT}"]


def sweep_errors(argv: Sequence[str]) -> list[str]:
    """Compose and check the config, or the cells of a sweep, before any job starts (as its
    launcher would).

    The config check (:meth:`bench.schema.JobConfig.from_hydra`: types, keys, ranges, choices,
    cross-field rules) loads no torch, so a bad setting is answered in about a second; what needs
    the model code (a scaling method's parameters at the model's geometry, the corpus) is checked
    after it. Returns one line per distinct error when no cell can run (every cell is invalid or
    not applicable); otherwise an empty list, and the jobs report their own errors. --cfg/--help
    and sweepers other than Hydra's basic one are left to Hydra.
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_automatic_config_search_path, get_args_parser
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = get_args_parser().parse_args(list(argv))
    except SystemExit:  # a bad flag: Hydra reports it itself
        return []
    if (
        any((args.cfg, args.info, args.help, args.hydra_help, args.shell_completion))
        or args.config_path is not None
        or args.experimental_rerun is not None
    ):
        return []
    search_path = create_automatic_config_search_path(None, None, str(CONFIG_DIR))
    if args.config_dir is not None:
        search_path.prepend(
            provider="command-line",
            path=f"file://{os.path.abspath(args.config_dir)}",
            anchor=SearchPathQuery(provider="schema"),
        )
    config_name = args.config_name or CONFIG_NAME
    hydra_app = Hydra.create_main_hydra2(task_name="lenbench", config_search_path=search_path)
    try:
        mode = hydra_app.get_mode(config_name=config_name, overrides=args.overrides)
        if not (args.multirun or mode == RunMode.MULTIRUN):
            cfg = hydra_app.compose_config(
                config_name, args.overrides, run_mode=RunMode.RUN, with_log_configuration=False
            )
            return _single_run_errors(cfg)
        master = hydra_app.compose_config(
            config_name, args.overrides, run_mode=RunMode.MULTIRUN, with_log_configuration=False
        )
        if not str(master.hydra.sweeper.get("_target_", "")).endswith(SWEEPERS):
            return []
        params = [f"{k}={v}" for k, v in (master.hydra.sweeper.get("params") or {}).items()]
        parser = OverridesParser.create(config_loader=hydra_app.config_loader)
        overrides = parser.parse_overrides([*params, *master.hydra.overrides.task])
        from bench.job import validate_job  # imports no torch; a check that needs it loads it

        errors: dict[str, list[str]] = {}
        for batch in BasicSweeper.split_arguments(overrides, None):
            for cell in batch:  # until the first cell that runs (composing one takes ~0.1 s)
                cfg = hydra_app.config_loader.load_sweep_config(master, list(cell))
                try:
                    spec = validate_job(JobConfig.from_hydra(cfg))
                except NotApplicable:
                    continue
                except ValueError as exc:
                    errors.setdefault(str(exc), list(cell))
                    continue
                # a cell runs: errors that depend on the swept value are its jobs'; its data
                # source is checked once here (every job of the sweep would fail alike)
                problem = data_problem(spec.job)
                return [] if problem is None else [problem]
    finally:
        GlobalHydra.instance().clear()
    if len(errors) == 1:
        return list(errors)
    return [f"{' '.join(cell)}: {message}" for message, cell in errors.items()]


def _single_run_errors(cfg: DictConfig) -> list[str]:
    """A single run's config check (the schema, then the job's own checks): its one sentence."""
    from bench.job import validate_job  # imports no torch; a check that needs it loads it

    try:
        validate_job(JobConfig.from_hydra(cfg))
    except NotApplicable as exc:
        return [str(exc).removesuffix(" skipped.").rstrip("; ") + "."]
    except ValueError as exc:
        return [one_line(exc)]
    return []


def data_problem(job: Any) -> str | None:
    """Why the job's corpus cannot be read or evaluated on (one sentence), else None. The corpus
    is cached in this process, so the jobs that follow reuse it."""
    from bench.data.corpora import load_corpus
    from bench.job import empty_test_split

    try:
        corpus = load_corpus(job.data)
    except ValueError as exc:
        return str(exc)
    return empty_test_split(corpus)


def one_line(exc: BaseException) -> str:
    """A Hydra/OmegaConf/ValueError error as one sentence."""
    from hydra.errors import MissingConfigException

    from bench.core.checks import config_error

    if isinstance(exc, MissingConfigException) and exc.options and exc.missing_cfg_file:
        group, _, option = str(exc.missing_cfg_file).rpartition("/")
        if group:
            return (
                f"{group} {option!r} is unknown; allowed: {', '.join(sorted(exc.options))} "
                f"(or add {group}/{option}.yaml to a --config-dir)."
            )
    sentence = config_error(exc)
    if sentence is not None:
        return sentence
    parts = [str(exc)]
    cause = exc.__cause__
    if cause is not None and str(cause) and str(cause) not in parts[0]:
        parts.append(str(cause).splitlines()[0])
    segments = [line.strip() for part in parts for line in part.splitlines() if line.strip()]
    text = ""
    for segment in segments:
        if text and text[-1] not in ".;:!?":
            text += "."
        text = f"{text} {segment}" if text else segment
    if text and text[-1] not in ".;:!?":
        text += "."
    return text or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of ``lenbench``; returns the exit status."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    argv = with_default_experiment(sys.argv[1:] if argv is None else argv)
    saved_full_error = os.environ.get("HYDRA_FULL_ERROR")
    user_full_error = saved_full_error == "1"
    saved_argv = sys.argv
    sys.argv = [saved_argv[0] if saved_argv else "lenbench", *argv]
    # Hydra prints errors itself (multi-line) unless HYDRA_FULL_ERROR is set; set it so that
    # they reach us and are reported as one line (unless the user asked for full tracebacks).
    os.environ["HYDRA_FULL_ERROR"] = "1"
    _OUTCOME.clear()
    try:
        errors = sweep_errors(argv)
        if not errors:
            _hydra_app()
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        if user_full_error:
            raise
        print(f"{ERROR_PREFIX}{one_line(exc)}", file=sys.stderr, flush=True)
        return 2
    except OSError as exc:  # Hydra's run directory under an unusable paths.results
        if user_full_error:
            raise
        print(f"{ERROR_PREFIX}{io_sentence(exc)}", file=sys.stderr, flush=True)
        return 1
    finally:
        sys.argv = saved_argv
        if saved_full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved_full_error
    if errors:
        for error in errors:
            print(f"{ERROR_PREFIX}{error}", file=sys.stderr, flush=True)
        return 2
    if "error" in _OUTCOME:
        print(f"{ERROR_PREFIX}{_OUTCOME['error']}", file=sys.stderr, flush=True)
        return int(_OUTCOME.get("exit", 2))
    return 1 if _OUTCOME.get("failed") or _OUTCOME.get("report_failed") else 0


if __name__ == "__main__":
    sys.exit(main())
