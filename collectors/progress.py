"""Progress bars on stderr for long work (rich, which typer already depends on).

Shown only when stderr is a terminal or ``RETIME_PROGRESS=1``; ``RETIME_PROGRESS=0``
silences them. Library callers pass ``progress=False`` to silence them as well.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["progress_bar", "progress_enabled"]


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
