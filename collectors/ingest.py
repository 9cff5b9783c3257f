"""Format detection and dispatch: one entry point that turns input paths into a Trace.

Detection looks at content, not only extensions: gzip/JSON with ``traceEvents`` is Kineto
(or Chrome JSON written by ``retime export``), a SQLite file with nsys tables is Nsight
Systems, a folder with ``trace-*.parquet`` is an op-level timeline.
"""

from __future__ import annotations

import gzip
import os
import sqlite3
import zlib
from pathlib import Path

from .errors import TraceFormatError
from .trace import Trace

__all__ = ["FORMATS", "detect_format", "read", "ingest", "expand_inputs"]

FORMATS = ("auto", "kineto", "nsys", "oplevel")

_SQLITE_MAGIC = b"SQLite format 3\x00"
_GZIP_MAGIC = b"\x1f\x8b"


def _head(path: Path, n: int = 4096) -> bytes:
    with open(path, "rb") as fh:
        head = fh.read(n)
    if head[:2] == _GZIP_MAGIC:
        try:
            with gzip.open(path, "rb") as fh:
                return fh.read(n)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(f"{path}: corrupt gzip ({exc}); re-copy or re-compress the file") from exc
    return head


def detect_format(path: str | os.PathLike[str]) -> str:
    """Return ``kineto``, ``nsys``, ``oplevel`` or ``execution_trace`` for one path."""
    p = Path(path)
    if p.is_dir():
        if (p / "meta.json").is_file() and ((p / "ops.parquet").is_file()
                                             or (p / "ops").is_dir()):  # rank-partitioned
            raise TraceFormatError(
                f"{p}: is already a retime trace directory; open it with `retime info {p}` or "
                "retime.load(), there is nothing to ingest")
        if any(p.glob("trace-*.parquet")) or any(p.glob("*.parquet")):
            return "oplevel"
        sqlite = sorted(p.glob("*.sqlite"))
        js = sorted(q for q in p.glob("*.json*") if q.name.endswith((".json", ".json.gz")))
        if sqlite and not js:
            for f in sqlite:
                detect_format(f)  # raises naming missing tables
            return "nsys"
        if sqlite:  # the Kineto reader would leave the exports out without a word
            raise TraceFormatError(
                f"{p}: mixes {len(js)} JSON file(s) (PyTorch profiler) and {len(sqlite)} "
                f"SQLite file(s) (nsys exports, e.g. {sqlite[0].name}); ingest one format at "
                "a time: pass the files themselves, or move one kind to its own folder")
        return "kineto"
    if not p.exists():
        raise TraceFormatError(f"{p}: no such file or directory")
    if p.suffix == ".parquet":
        return "oplevel"
    with open(p, "rb") as fh:
        magic = fh.read(16)
    if magic == _SQLITE_MAGIC:
        _check_nsys_sqlite(p)
        return "nsys"
    if not magic:
        raise TraceFormatError(f"{p}: empty file; it holds no trace (re-export it from the profiler)")
    head = _head(p)
    s = head.lstrip()
    if s[:1] in (b"{", b"["):
        if b'"schema"' in head and b'"nodes"' in head and b"traceEvents" not in head:
            return "execution_trace"
        return "kineto"
    raise TraceFormatError(
        f"{p}: not a known trace format (expected PyTorch profiler JSON[.gz], an nsys SQLite "
        "export from `nsys export --type sqlite`, or an op-level Parquet folder); "
        "pass --format to force one")


def expand_inputs(paths: list[str | os.PathLike[str]]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise TraceFormatError(f"{p}: no such file or directory")
        out.append(p)
    if not out:
        raise TraceFormatError("no input paths given; pass trace files or a folder of them")
    return out


def _resolve_format(ps: list[Path], format: str) -> str:
    """The one input format of ``ps`` (``format``, or detected from content for ``auto``)."""
    if format not in FORMATS:
        raise TraceFormatError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    fmt = format
    if fmt == "auto":
        found = {detect_format(p) for p in ps}
        found.discard("execution_trace") if len(found) > 1 else None
        if len(found) > 1:
            raise TraceFormatError(
                f"inputs mix formats {sorted(found)}; ingest each format separately")
        fmt = found.pop()
    if fmt == "execution_trace":
        raise TraceFormatError(
            f"{ps[0]}: is a PyTorch execution trace (ET, host op graph without timings); "
            "ingest the matching Kineto profiler JSON instead (ET files in the same folder are "
            "skipped and counted)")
    return fmt


def read(paths: list[str | os.PathLike[str]] | str | os.PathLike[str], *, format: str = "auto",
         jobs: int = 1, progress: bool | None = None) -> Trace:
    """Read ``paths`` (files or folders) into one Trace, choosing the collector by content."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    ps = expand_inputs(list(paths))
    fmt = _resolve_format(ps, format)
    if fmt == "kineto":
        from .kineto import read_kineto
        return read_kineto(ps, jobs=jobs, progress=progress)
    if fmt == "nsys":
        from .nsys import read_nsys
        return read_nsys(ps, progress=progress)
    if fmt == "oplevel":
        from .oplevel import read_oplevel
        return read_oplevel(ps)
    raise TraceFormatError(f"unknown format {fmt!r}")  # pragma: no cover


def ingest(paths: list[str | os.PathLike[str]] | str | os.PathLike[str],
           output: str | os.PathLike[str], *, format: str = "auto", layout: str = "single",
           jobs: int | None = None, in_memory: bool = False,
           progress: bool | None = None) -> dict:
    """Read ``paths`` and write the store ``output`` (what ``retime ingest`` runs).

    Kineto files are ingested rank by rank (:mod:`collectors.rankwise`: memory bounded by a
    few ranks' parts, never the merged trace); other formats, and every format with
    ``in_memory=True``, are read whole (:func:`read`) and saved. ``jobs``: processes that
    parse (and write) ranks; default: the cores this process may use.

    Returns
    -------
    dict with ``meta`` (as :func:`collectors.trace.read_trace` returns it), ``ranks``,
    ``world_size``, ``ops``, ``edges``, ``ranges`` (row counts) and ``output``.
    """
    from .store import LAYOUTS

    if layout not in LAYOUTS:
        raise TraceFormatError(f"layout {layout!r} is not known; choose one of {LAYOUTS}")
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    ps = expand_inputs(list(paths))
    fmt = _resolve_format(ps, format)
    if fmt == "kineto" and not in_memory and not _any_export(ps):
        from .rankwise import ingest_kineto
        return ingest_kineto(ps, output, layout=layout, jobs=jobs, progress=progress)
    if jobs is None:
        from .rankwise import default_jobs
        jobs = default_jobs()
    from .rankwise import check_not_empty

    trace = read(ps, format=fmt, jobs=jobs, progress=progress)
    check_not_empty(ps, trace.n_ops, trace.meta)
    trace.save(output, layout=layout)
    meta = {k: v for k, v in trace.meta.items() if k not in ("layout", "partitions")}
    return {"meta": meta, "ranks": [int(r) for r in trace.ranks],
            "world_size": trace.world_size, "ops": trace.n_ops, "edges": len(trace.edges),
            "ranges": len(trace.ranges), "output": str(output)}


# tables every nsys export has (any one of them marks a file as an nsys export)
_NSYS_MARKERS = ("StringIds", "META_DATA_EXPORT", "TARGET_INFO_SESSION_START_TIME",
                 "ENUM_NSYS_EVENT_TYPE", "ThreadNames", "PROCESSES")


def _check_nsys_sqlite(path: Path) -> None:
    """Raise TraceFormatError unless ``path`` is an nsys export holding the tables we need."""
    from .nsys import EXPORT_COMMAND, REQUIRED_TABLES

    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
            have = {r[0] for r in con.execute(
                "select name from sqlite_master where type in ('table', 'view')")}
    except sqlite3.Error as exc:
        raise TraceFormatError(f"{path}: unreadable SQLite file ({exc}); re-export it with "
                               f"`{EXPORT_COMMAND}`") from exc
    missing = [t for t in REQUIRED_TABLES if t not in have]
    if not missing:
        return
    what = ("an nsys SQLite export without GPU activity" if any(t in have for t in _NSYS_MARKERS)
            else "a SQLite file that is not an Nsight Systems export")
    raise TraceFormatError(
        f"{path}: {what}: missing table(s) {', '.join(missing)}; profile with CUDA tracing "
        f"and export with `{EXPORT_COMMAND}`")


def _any_export(paths: list[Path]) -> bool:
    """Whether a file among ``paths`` (folders expanded) is a ``retime export --chrome``
    file: it holds the whole run and its op ids, so it is read whole, not rank by rank."""
    from .kineto.events import kineto_files
    from .kineto.export import is_export_file

    try:
        files, _ = kineto_files(list(paths))
    except TraceFormatError:
        return False
    return any(is_export_file(f) for f in files)
