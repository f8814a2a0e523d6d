"""Progress of long loops: a tqdm bar on a terminal, plain lines in a log.

tqdm redraws its bar with carriage returns (and, for nested bars, ANSI cursor codes); written to
a file (``lenbench ... > run.log 2>&1``, a SLURM or submitit log) that is one unreadable line.
:func:`progress_bar` takes tqdm's arguments and returns a tqdm bar when its stream is a terminal
(or a notebook's widget), else a :class:`PlainProgress`: one plain line every
``PLAIN_INTERVAL_S`` seconds and one when the loop ends (if it took ``PLAIN_DELAY_S`` or more),
each with the count, the rate and the bar's postfix (the training loss), and no control
characters.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

from tqdm.auto import tqdm

__all__ = ["PLAIN_DELAY_S", "PLAIN_INTERVAL_S", "PlainProgress", "adopt_bars", "progress_bar"]

#: Seconds between two plain progress lines of one loop (the last line comes when it ends).
PLAIN_INTERVAL_S = 30.0
#: A loop that ends sooner than this (and wrote no line before) writes none: a log is not a list
#: of every 4-window metric.
PLAIN_DELAY_S = 1.0


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _in_notebook() -> bool:
    """Whether tqdm.auto picked Jupyter's widget bar (it draws no control characters)."""
    import tqdm.std

    try:
        from tqdm.autonotebook import tqdm as auto
    except Exception:  # a broken IPython install: no widget
        return False
    return auto is not tqdm.std.tqdm


def progress_bar(iterable: Iterable | None = None, **kwargs: Any) -> Any:
    """``tqdm(iterable, **kwargs)`` on a terminal or in a notebook, else a :class:`PlainProgress`
    with the same arguments (``total``, ``desc``, ``unit``, ``initial``, ``disable``, ``file``,
    ``delay``; the others only shape a drawn bar)."""
    stream = kwargs.get("file") or sys.stderr
    if kwargs.get("disable") or _is_terminal(stream) or _in_notebook():
        return tqdm(iterable, **kwargs)
    return PlainProgress(iterable, **kwargs)


def adopt_bars(*module_names: str) -> list[str]:
    """When stderr is not a terminal, make the tqdm bars of these modules ours (plain lines):
    each module's global ``tqdm`` (``from tqdm import tqdm``) becomes :func:`progress_bar`, for
    this process. For a library's own loops in a log, e.g. lm-eval's request building; tqdm's
    ``TQDM_DISABLE`` cannot do it once tqdm is imported. Returns the modules changed."""
    import importlib

    import tqdm.std

    if _is_terminal(sys.stderr) or _in_notebook():
        return []
    changed = []
    for name in module_names:
        try:
            module = importlib.import_module(name)
        except ImportError:  # another version of the library: its bars stay
            continue
        bar = getattr(module, "tqdm", None)
        if isinstance(bar, type) and issubclass(bar, tqdm.std.tqdm):
            module.tqdm = progress_bar  # type: ignore[attr-defined]
            changed.append(name)
    return changed


class PlainProgress:
    """tqdm's interface as used here (``update``, ``set_postfix``, ``set_description``, ``close``,
    ``total``, iteration, ``with``) writing plain lines: ``desc: n/total unit (p%), elapsed, rate,
    postfix``, at most one every ``interval`` seconds while the loop runs and one at its end,
    none in its first ``delay`` seconds (at least ``PLAIN_DELAY_S``; tqdm's ``delay`` hides a
    quick bar the same way)."""

    def __init__(
        self,
        iterable: Iterable | None = None,
        desc: str | None = None,
        total: float | None = None,
        *,
        unit: str = "it",
        initial: float = 0,
        disable: bool = False,
        file: IO | None = None,
        delay: float = 0.0,
        interval: float | None = None,
        postfix: Any = None,
        **_: Any,  # leave, dynamic_ncols, mininterval, ...: the look of a drawn bar
    ) -> None:
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except (TypeError, AttributeError):
                total = None
        self.iterable = iterable
        self.desc = desc or ""
        self.total = total
        self.unit = unit
        self.n = self.initial = initial
        self.disable = disable
        self.file = file
        self.delay = max(float(delay or 0.0), PLAIN_DELAY_S)
        self.interval = PLAIN_INTERVAL_S if interval is None else float(interval)
        self.postfix = ""
        if postfix:
            self.set_postfix(postfix)
        self.start = self.last_line = time.monotonic()
        self.closed = False
        self.lines = 0  # written so far
        self.written_n: float | None = None  # the count the last line showed

    # -- tqdm's interface -------------------------------------------------------------

    def update(self, n: float = 1) -> None:
        self.n += n
        if self.disable:
            return
        now = time.monotonic()
        if now - self.last_line >= self.interval and now - self.start >= self.delay:
            self._write(now)

    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
        items = dict(ordered_dict or {}, **kwargs)
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = str(s)

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def refresh(self, *_: Any, **__: Any) -> None:
        """Nothing to redraw: a line is written on its own schedule."""

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        now = time.monotonic()
        if self.disable or (self.lines and self.n == self.written_n):
            return  # nothing to show, or the last line already says it
        if self.lines or now - self.start >= self.delay:
            self._write(now)

    def __iter__(self) -> Iterator:
        if self.iterable is None:
            raise TypeError("PlainProgress without an iterable cannot be iterated.")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __len__(self) -> int:
        return int(self.total or 0)

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    # -- the line ---------------------------------------------------------------------

    def line(self, now: float | None = None) -> str:
        """The progress line for time ``now`` (monotonic; default: now)."""
        elapsed = (time.monotonic() if now is None else now) - self.start
        n = _number(self.n)
        count = f"{n}/{_number(self.total)} {self.unit}" if self.total else f"{n} {self.unit}"
        parts = [f"{self.desc}: {count}" if self.desc else count]
        if self.total:
            parts[0] += f" ({100.0 * self.n / self.total:.0f}%)"
        parts.append(f"{tqdm.format_interval(elapsed)} elapsed")
        done = self.n - self.initial
        if elapsed > 0 and done > 0:
            rate = done / elapsed
            if rate >= 100:
                parts.append(f"{rate:,.0f} {self.unit}/s")
            else:
                parts.append(
                    f"{rate:.3g} {self.unit}/s" if rate >= 1 else f"{1 / rate:.3g} s/{self.unit}"
                )
            if self.total and self.n < self.total:
                parts.append(f"{tqdm.format_interval((self.total - self.n) / rate)} left")
        if self.postfix:
            parts.append(self.postfix)
        return ", ".join(parts)

    def _write(self, now: float) -> None:
        stream = self.file or sys.stderr
        text = self.line(now).replace("\r", " ").replace("\x1b", " ")
        try:
            stream.write(text + "\n")
            stream.flush()
        except (AttributeError, OSError, ValueError):  # no stream, a closed or broken one
            pass
        self.last_line, self.written_n = now, self.n
        self.lines += 1


def _number(value: float | None) -> str:
    if value is None:
        return "?"
    return str(int(value)) if float(value).is_integer() else f"{value:.3g}"
