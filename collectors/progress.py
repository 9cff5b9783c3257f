"""Progress bars on stderr for long work (rich, which typer already depends on).

Shown only when stderr is a terminal or ``RETIME_PROGRESS=1``; ``RETIME_PROGRESS=0``
silences them. Library callers pass ``progress=False`` to silence them as well.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["progress_bar", "progress_enabled", "watch_compiles", "announce_compiles"]


def progress_enabled(requested: bool | None = None) -> bool:
    env = os.environ.get("RETIME_PROGRESS")
    if env is not None:
        return env not in ("0", "", "false", "no")
    if requested is not None:
        return requested
    return sys.stderr.isatty()


class _Bar:
    def __init__(self, prog, task) -> None:
        self._prog, self._task = prog, task

    def advance(self, n: float = 1) -> None:
        if self._prog is not None:
            self._prog.advance(self._task, n)

    def update(self, **kw) -> None:
        if self._prog is not None:
            self._prog.update(self._task, **kw)


@contextmanager
def progress_bar(total: float | None, desc: str, enabled: bool | None = None) -> Iterator[_Bar]:
    """``with progress_bar(n, "parsing") as bar: ... bar.advance()`` (no-op when disabled)."""
    if not progress_enabled(enabled):
        yield _Bar(None, None)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    prog = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(),
                    console=Console(stderr=True), transient=False)
    with prog:
        task = prog.add_task(desc, total=total)
        yield _Bar(prog, task)


# ---------------------------------------------------------------- first-use compilation
# numba compiles a kernel on its first call and caches it on disk (cache=True); a fresh
# install compiles every kernel a command uses once, which takes seconds. Users are told on
# stderr: a line when the first kernel starts compiling, and a summary when the process
# ends. Shown by the CLI (announce_compiles()), when stderr is a terminal, or with
# RETIME_PROGRESS=1; RETIME_PROGRESS=0 silences it.
_COMPILES = {"watching": False, "announce": False, "n": 0, "depth": 0, "t0": 0.0, "s": 0.0,
             "last": ""}


def announce_compiles(on: bool = True) -> None:
    """Tell the user about first-use kernel compilation in this process (the CLI does)."""
    _COMPILES["announce"] = on


def _compile_notice_on() -> bool:
    env = os.environ.get("RETIME_PROGRESS")
    if env is not None:
        return env not in ("0", "", "false", "no")
    return bool(_COMPILES["announce"]) or sys.stderr.isatty()


class _CompileListener:
    """numba event listener: counts our kernels' compiles (nested callees included in their
    caller's time) and reports them."""

    def on_start(self, event) -> None:
        import time

        c = _COMPILES
        if c["depth"] == 0:
            c["t0"] = time.perf_counter()
            if c["n"] == 0 and _compile_notice_on():
                sys.stderr.write("retime: compiling numba kernels on first use (once: later "
                                 "runs load them from the cache)...\n")
                sys.stderr.flush()
        c["depth"] += 1

    def on_end(self, event) -> None:
        import time

        c = _COMPILES
        c["depth"] -= 1
        if c["depth"] > 0:
            return
        c["n"] += 1
        c["s"] += time.perf_counter() - c["t0"]
        disp = event.data.get("dispatcher") if isinstance(event.data, dict) else None
        c["last"] = getattr(getattr(disp, "py_func", None), "__name__", "")
        if _compile_notice_on() and sys.stderr.isatty():
            sys.stderr.write(f"\r  compiled {c['n']} kernel(s) in {c['s']:.1f} s "
                             f"({c['last']})\x1b[K")
            sys.stderr.flush()


def _compile_summary() -> None:
    c = _COMPILES
    if c["n"] and _compile_notice_on():
        end = "\n" if sys.stderr.isatty() else ""
        sys.stderr.write(f"{end}retime: compiled {c['n']} kernel(s) in {c['s']:.1f} s; "
                         "cached for later runs\n")
        sys.stderr.flush()


def watch_compiles() -> None:
    """Report first-use compilation of numba kernels (called by every kernel module; the
    first call registers the listener)."""
    if _COMPILES["watching"]:
        return
    import atexit

    from numba.core import event

    _COMPILES["watching"] = True
    listener = _CompileListener()

    class _L(event.Listener):
        def on_start(self, ev) -> None:
            listener.on_start(ev)

        def on_end(self, ev) -> None:
            listener.on_end(ev)

    event.register("numba:compile", _L())
    atexit.register(_compile_summary)
