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
from pathlib import Path
from typing import Any

import typer

from retime.collectors.errors import RetimeError

__all__ = ["app", "main", "emit_json", "say", "check_output", "FORCE_HELP"]

# Start-up budget: `retime --help` imports typer and this package's light modules only (no
# numpy, pandas or numba); every command imports what it needs when it runs. Help text is
# plain (rich_markup_mode=None): brackets such as [grid] or [[scenario]] print as written.
app = typer.Typer(
    name="retime",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help=(
        "retime: trace-driven profiler and replay analyzer for distributed GPU training.\n\n"
        "Typical flow: `retime ingest TRACES -o run.retime`, `retime info run.retime`, "
        "`retime replay run.retime --set network.inter_node_gbps=25`, "
        "`retime report run.retime -o reports/run.html`. `retime keys` lists every what-if "
        "key. Every command takes --json (one JSON object on stdout, errors included); exit "
        "codes: 0 ok, 2 bad input, 1 internal error, 3 regression (`retime compare`)."
    ),
)

FORCE_HELP = "Replace the output if it exists (a store is replaced only by another store)."


def check_output(path: Path, force: bool, *, store: bool = False) -> None:
    """Refuse to write over an existing output unless ``force`` (a user's own directory is
    never replaced: only a retime store, holding ``meta.json``, can stand in for a store),
    and fail before any work when the output cannot be written at all."""
    if not os.path.lexists(path):
        parent = Path(os.path.abspath(path)).parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir():
            raise RetimeError(f"{path}: {parent} is not a folder; choose another -o path")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise RetimeError(f"{path}: cannot create it (no write permission in {parent}); "
                              "choose a path you can write")
        return
    if store:
        if not path.is_dir():
            raise RetimeError(f"{path}: exists and is not a NAME.retime directory; choose "
                              "another -o path")
        if not (path / "meta.json").is_file():
            raise RetimeError(f"{path}: exists and is not a retime store (no meta.json); retime "
                              "replaces only its own stores, so choose another -o path")
    elif path.is_dir():
        raise RetimeError(f"{path}: is a directory; -o takes a file path")
    if not force:
        raise RetimeError(f"{path}: already exists; pass --force to replace it, or choose "
                          "another -o path")


def emit_json(obj: Any) -> None:
    """Print exactly one JSON object on stdout (numpy scalars/arrays allowed)."""
    import orjson

    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY
                                  | orjson.OPT_NON_STR_KEYS).decode() + "\n")
    sys.stdout.flush()


def say(msg: str, *, quiet: bool = False) -> None:
    """Human-readable output: stdout normally, suppressed with ``--json`` (quiet=True)."""
    if not quiet:
        typer.echo(msg)


class _NoBlasForNumba:
    """Import hook of the console script: numba's CPU target, when it loads its first
    kernel, imports ``scipy.linalg`` (~0.2 s of CPU) only to find BLAS for ``np.dot`` and
    ``np.linalg`` in jitted code, which retime's kernels never use. A command-line process
    runs no one else's jitted code, so there that probe is answered "no BLAS". Only imports
    made from numba's own BLAS/LAPACK probe are refused; library users (notebooks) never
    get this hook."""

    _PROBES = frozenset({"ensure_blas", "ensure_lapack"})

    def find_spec(self, name, path=None, target=None):
        if name != "scipy" and not name.startswith("scipy."):
            return None
        f = sys._getframe(1)
        while f is not None:
            if f.f_code.co_name in self._PROBES and \
                    f.f_globals.get("__name__") == "numba.np.linalg":
                raise ModuleNotFoundError(f"{name}: not loaded for numba's BLAS probe in the "
                                          "retime command line", name=name)
            f = f.f_back
        return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns (and exits with) the exit code."""
    if not any(isinstance(f, _NoBlasForNumba) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoBlasForNumba())
    # Arrow's default pool (mimalloc) keeps the buffers of Parquet decoding: reading a store
    # peaked at ~2.4x its tables (1.3x with the system allocator; 8 ranks of the V100 trace).
    # Read when pyarrow is first imported, so set before; a user's own choice wins.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    _PROCESS["own"] = True  # the process ends with the command (keep_freed_memory)
    code = run(argv)
    if argv is None:
        sys.exit(code)
    return code


def _click_errors() -> tuple[tuple, tuple, tuple]:
    """(usage-error, exit, abort) exception classes of the click that typer runs on: its
    vendored copy (typer >= 0.20: typer.Exit / typer.Abort) and click itself where installed
    (older typer)."""
    usage: list[type] = []
    exits: list[type] = [typer.Exit]
    aborts: list[type] = [typer.Abort]
    try:
        from typer._click.exceptions import ClickException
        usage.append(ClickException)
    except ImportError:  # pragma: no cover - typer before 0.20
        pass
    try:
        from click.exceptions import Abort, ClickException, Exit
        usage.append(ClickException)
        exits.append(Exit)
        aborts.append(Abort)
    except ImportError:  # pragma: no cover - a vendoring typer without click installed
        pass
    return tuple(usage), tuple(exits), tuple(aborts)


def _wants_json(argv: list[str]) -> bool:
    """``--json`` among the options (not among a wrapped script's arguments after ``--``)."""
    args = argv[:argv.index("--")] if "--" in argv else argv
    return "--json" in args


def _fail(msg: str, code: int, as_json: bool) -> int:
    """Report an error: one line on stderr, and with --json one JSON object on stdout
    (``{"error": what and where, "hint": how to fix}``)."""
    msg = " ".join(msg.split())
    typer.echo(f"retime: {'internal ' if code == 1 else ''}error: {msg}", err=True)
    if as_json:
        what, sep, hint = msg.rpartition("; ")
        if not sep or code == 1:
            what, hint = msg, ("rerun with RETIME_DEBUG=1 for a traceback and report it"
                               if code == 1 else "see `retime --help`")
        emit_json({"error": what, "hint": hint, "exit_code": code})
    return code


def _raw_trace_given(msg: str) -> str | None:
    """The line for a file given where a folder is wanted: where a NAME.retime store is
    wanted (every folder-only argument of the CLI, and ``--trace``), most often a raw trace
    not yet ingested; where an output folder is (``-o`` of demo and capture, ``--chakra``),
    a file in the way."""
    import re

    m = re.search(r"(?:dir|[Dd]irectory) '(.+)' is a file", msg)
    if m is None:
        return None
    path = m.group(1)
    # an output folder option (-o DIR of demo/capture, --chakra DIR) that names a file: the
    # file is in the way of what the command writes, not a trace to ingest
    opt = re.match(r"Invalid value for ('-[^']*'(?: / '-[^']*')*)", msg)
    if opt is not None and "--trace" not in opt.group(1):
        return (f"{opt.group(1).replace(chr(39), '')} {path}: is a file, and this command "
                "writes a folder there; choose a folder path (a file is never replaced)")
    low = path.lower()
    if low.endswith((".html", ".pdf", ".csv")):  # an output of retime report
        return (f"{path}: is a file (a report or its table), not a NAME.retime store; pass "
                "the NAME.retime the report was made from")
    if low.endswith(".parquet"):  # `retime sweep` writes one; a store is a folder of them
        return (f"{path}: is a file, not a NAME.retime store; a sweep table goes to `retime "
                f"report {path} -o NAME.html`, a trace to `retime ingest` (an op-level "
                "timeline: its folder) and then pass NAME.retime")
    return (f"{path}: is a file, not a NAME.retime store; ingest it first "
            f"(`retime ingest {path} -o NAME.retime`) and pass NAME.retime")


def _os_error(exc: OSError) -> str:
    """An operating-system error (missing folder, permission, disk full) as one line."""
    where = exc.filename if exc.filename is not None else "the output"
    what = exc.strerror or type(exc).__name__
    fix = {"ENOSPC": "free disk space or write elsewhere",
           "EACCES": "choose a path you can write, or fix its permissions",
           "EPERM": "choose a path you can write, or fix its permissions",
           "EROFS": "the file system is read-only; write elsewhere",
           "ENOENT": "check that the path and its folder exist"}
    import errno
    code = errno.errorcode.get(exc.errno or 0, "")
    return f"{where}: {what}; {fix.get(code, 'check the path and try again')}"


#: whether this process is the command line's own (main()), not a test's or a notebook's
_PROCESS = {"own": False}


def keep_freed_memory() -> None:
    """Let this process reuse the memory it frees instead of handing it back to the system.

    glibc gives each array of more than a few MB its own mapping and returns it when freed,
    so an analysis that makes many temporaries of millions of ops page-faults them all in
    again: on a 2-core VM, 3.5 s of system time out of 11.5 s CPU for the report of a
    128-rank run (2.2 M ops); with arrays up to 32 MB served from the heap and the heap
    kept, 2 s. Peak memory is the same high-water mark (+3% measured). A no-op off glibc.
    The CLI's report calls it, only in the command line's own process (its :func:`main`:
    the process ends with the command), never in a test's or notebook's. The replay calls it
    only for a store read a window at a time (:mod:`replay.window_store`: at 128 ranks minor
    page faults 898 K -> 261 K, peak 0.88 -> 0.95 GB); not for a loaded trace: on 128 ranks
    (9.8 M ops) it saved 4 s of system time but its peak grew 5.2 -> 5.9 GB.
    """
    if not _PROCESS["own"]:
        return
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
    except OSError:
        mallopt = None
    if mallopt is None:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 1 << 30)


def skip_exit_collection() -> None:
    """Let this process end without the interpreter's last garbage collections.

    At exit CPython tears its modules down with full collections over every object still
    alive (numba's type system, pandas, pyarrow): after a `retime ingest`, 0.4-1.8 s between
    its last line and the end of the process on the shared 2-core host, against 0.13-0.18 s
    with this (0.03-0.07 s with no teardown at all). ``gc.freeze()`` moves every live object
    out of the collector's view: objects are still freed by reference counting and atexit
    handlers still run; only reference cycles alive at exit are left to the OS. So call it
    once the command has closed its files (a cycle holding an open, unflushed file would lose
    its buffer), and only in the command line's own process (its :func:`main`), never in a
    test's or a notebook's.
    """
    if not _PROCESS["own"]:
        return
    import gc

    gc.disable()
    gc.freeze()


def run(argv: list[str] | None = None) -> int:
    """Run the CLI with ``argv`` and return the exit code (used by tests)."""
    from retime.collectors.progress import announce_compiles

    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = _wants_json(argv)
    announce_compiles()
    usage_errors, click_exit, click_abort = _click_errors()
    cmd = typer.main.get_command(app)
    try:
        rv = cmd.main(args=argv, prog_name="retime", standalone_mode=False)
        if isinstance(rv, int) and not isinstance(rv, bool) and rv:
            # typer.Exit(n) (and typer's Ctrl-C -> Exit(130)) comes back as a return value
            # when standalone_mode=False
            if rv == 130:
                typer.echo("retime: interrupted", err=True)
            return rv
    except click_exit as exc:
        return int(getattr(exc, "exit_code", 0) or 0)
    except usage_errors as exc:  # usage errors: one line, like every other bad input
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError":  # `retime` alone: the help, exit 0
            typer.echo(exc.format_message())
            return 0
        where = ctx.command_path if ctx is not None else "retime"
        raw = _raw_trace_given(exc.format_message())
        if raw:
            return _fail(raw, 2, as_json)
        return _fail(f"{exc.format_message().rstrip('.')}; see '{where} --help'", 2, as_json)
    except click_abort:
        typer.echo("retime: aborted", err=True)
        return 130
    except KeyboardInterrupt:
        typer.echo("retime: interrupted", err=True)
        return 130
    except RetimeError as exc:
        return _fail(str(exc), 2, as_json)
    except BrokenPipeError:
        return 0
    except OSError as exc:  # the file system said no: a user's path, permission or disk
        if os.environ.get("RETIME_DEBUG"):
            raise
        if exc.filename is None and exc.errno is None:
            return _fail(f"{type(exc).__name__}: {exc}", 1, as_json)
        return _fail(_os_error(exc), 2, as_json)
    except Exception as exc:  # internal error: one line unless debugging
        if os.environ.get("RETIME_DEBUG"):
            raise
        return _fail(f"{type(exc).__name__}: {exc} (this is a bug; rerun with RETIME_DEBUG=1 "
                     "for a traceback and report it)", 1, as_json)
    return 0


# Command modules (each registers its commands on `app`). Keep one import per module.
from retime import cmd_trace  # noqa: E402,F401  ingest, info, export
from retime import cmd_capture  # noqa: E402,F401  capture
from retime import cmd_report  # noqa: E402,F401  report, compare
from retime import cmd_replay  # noqa: E402,F401  replay
from retime import cmd_synth  # noqa: E402,F401  synth
from retime import cmd_demo  # noqa: E402,F401  demo
from retime import cmd_stragglers  # noqa: E402,F401  stragglers
from retime import cmd_sweep  # noqa: E402,F401  sweep
from retime import cmd_analyze  # noqa: E402,F401  analyze
from retime import cmd_keys  # noqa: E402,F401  keys
from retime import cmd_calibrate  # noqa: E402,F401  calibrate
from retime import cmd_cost  # noqa: E402,F401  cost cluster, collective, op
