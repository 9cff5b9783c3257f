"""The ``retime`` command line (typer). Commands are short shims over library functions.

Contract (DESIGN.md §6): every command accepts ``--json`` and then prints exactly one JSON
object on stdout; exit 0 on success, 2 on bad input (one line: what, where, how to fix, no
traceback), 1 on internal errors. ``RetimeError`` is turned into that one line here, in
:func:`main`, and nowhere else. Set ``RETIME_DEBUG=1`` to see tracebacks of internal errors.

Command modules register themselves on :data:`app`; each lives in ``retime/cmd_*.py`` and is
imported at the bottom of this file.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click
import orjson
import typer

from retime.collectors.errors import RetimeError

__all__ = ["app", "main", "emit_json", "say"]

app = typer.Typer(
    name="retime",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help=(
        "retime: trace-driven profiler and replay analyzer for distributed GPU training.\n\n"
        "Typical flow: `retime ingest TRACES -o run.retime`, `retime info run.retime`, "
        "`retime replay run.retime --set network.inter_node_gbps=25`, "
        "`retime report run.retime -o reports/run.html`. Every command takes --json."
    ),
)


def emit_json(obj: Any) -> None:
    """Print exactly one JSON object on stdout (numpy scalars/arrays allowed)."""
    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY
                                  | orjson.OPT_NON_STR_KEYS).decode() + "\n")
    sys.stdout.flush()


def say(msg: str, *, quiet: bool = False) -> None:
    """Human-readable output: stdout normally, suppressed with ``--json`` (quiet=True)."""
    if not quiet:
        typer.echo(msg)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns (and exits with) the exit code."""
    code = run(argv)
    if argv is None:
        sys.exit(code)
    return code


try:  # typer >= 0.20 raises its vendored click's exceptions (e.g. for exists=True)
    from typer._click.exceptions import ClickException as _VendoredClickException
    _CLICK_ERRORS: tuple = (click.ClickException, _VendoredClickException)
except ImportError:  # pragma: no cover - older typer uses click itself
    _CLICK_ERRORS = (click.ClickException,)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI with ``argv`` and return the exit code (used by tests)."""
    cmd = typer.main.get_command(app)
    try:
        rv = cmd.main(args=argv, prog_name="retime", standalone_mode=False)
        if isinstance(rv, int) and not isinstance(rv, bool) and rv:
            # typer.Exit(n) (and typer's Ctrl-C -> Exit(130)) comes back as a return value
            # when standalone_mode=False
            if rv == 130:
                typer.echo("retime: interrupted", err=True)
            return rv
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except _CLICK_ERRORS as exc:  # usage errors: one line, like every other bad input
        msg = " ".join(exc.format_message().split())
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "retime"
        typer.echo(f"retime: error: {msg} (see '{where} --help')", err=True)
        return 2
    except click.exceptions.Abort:
        typer.echo("retime: aborted", err=True)
        return 130
    except KeyboardInterrupt:
        typer.echo("retime: interrupted", err=True)
        return 130
    except RetimeError as exc:
        msg = " ".join(str(exc).split("\n"))
        typer.echo(f"retime: error: {msg}", err=True)
        return 2
    except BrokenPipeError:
        return 0
    except Exception as exc:  # internal error: one line unless debugging
        if os.environ.get("RETIME_DEBUG"):
            raise
        typer.echo(f"retime: internal error: {type(exc).__name__}: {exc} "
                   "(this is a bug; rerun with RETIME_DEBUG=1 for a traceback and report it)",
                   err=True)
        return 1
    return 0


# Command modules (each registers its commands on `app`). Keep one import per module.
from retime import cmd_trace  # noqa: E402,F401  ingest, info, export
from retime import cmd_capture  # noqa: E402,F401  capture
from retime import cmd_report  # noqa: E402,F401  report
from retime import cmd_replay  # noqa: E402,F401  replay
from retime import cmd_synth  # noqa: E402,F401  synth
from retime import cmd_demo  # noqa: E402,F401  demo
from retime import cmd_stragglers  # noqa: E402,F401  stragglers
from retime import cmd_sweep  # noqa: E402,F401  sweep
from retime import cmd_analyze  # noqa: E402,F401  analyze
