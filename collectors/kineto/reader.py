"""Kineto reader: files -> per-rank :class:`RankPart` -> one Trace.

:func:`parse_kineto_file` turns one file into a RankPart (the streaming scanner,
:mod:`.scan`, or the general path, :mod:`.events` + :mod:`.links`); :func:`read_kineto`
parses every rank (in worker processes with ``jobs > 1``) and merges them (:mod:`.merge`).
"""

from __future__ import annotations

import gc
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from ..errors import TraceFormatError
from ..progress import progress_bar
from .events import (
    RawControlCharacters,
    decode,
    decode_pieces,
    escape_control_chars,
    kineto_files,
    load_bytes,
)
from .schema import RankPart, TraceFile

__all__ = ["read_kineto", "parse_kineto_file", "file_progress", "warm_scanner"]

#: read with the streaming numba scanner (collectors.kineto.scan): True always, False never,
#: None (default) when it pays: its kernel is compiled and cached already, or a file is large
#: enough that compiling it once (~5 s of CPU, announced) soon pays back the general path's
#: extra time (~10 ms per MB of JSON, every ingest). Files it cannot read exactly (and every damaged file,
#: so that the error is worded here) take the general path below either way.
STREAMING: bool | None = None
#: decompressed JSON bytes from which compiling the scanner on first use pays off
SCANNER_MIN_BYTES = 32 << 20
#: files at least this large (decompressed) are decoded piece by piece
CHUNKED_MIN_BYTES = 8 << 20


def parse_kineto_file(path: str | os.PathLike[str], on_stage=None, on_bytes=None,
                      mapped: bool = False) -> RankPart:
    """Parse one Kineto JSON(.gz) file into a :class:`RankPart` (picklable, for workers).

    ``on_stage(name)`` is called as each stage (read, decode, build) finishes;
    ``on_bytes(n)`` as the streaming reader reads ``n`` more bytes of the file.
    ``mapped``: the streaming reader maps a plain file instead of reading it (no copy; a
    file truncated meanwhile kills the process with SIGBUS: for worker processes only).
    """
    path = Path(path)
    if STREAMING or (STREAMING is None and use_scanner(path)):
        from .scan import parse_fast
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            part = parse_fast(path, on_stage, on_bytes, mapped)
        finally:
            if was_enabled:
                gc.enable()
        if part is not None:
            if on_stage:
                on_stage("build")
            return part
    raw = load_bytes(path)
    if on_stage:
        on_stage("read")
    try:
        return _parse_general(path, raw, on_stage)
    except RawControlCharacters:
        # Kineto left control characters unescaped in some names: the text is clear, so
        # escape them, read it again, and count what was repaired.
        raw, n = escape_control_chars(raw)
        part = _parse_general(path, raw, on_stage)
        coerced = part.accounting.setdefault("coerced", {})
        coerced["raw control characters in strings (escaped)"] = n
        return part


def _parse_general(path: Path, raw: bytes, on_stage) -> RankPart:
    # Millions of small objects: the cyclic GC would rescan them again and again (and the
    # structs hold no cycles), so it is paused while decoding and building columns.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        chunked = decode_pieces(path, raw) if len(raw) >= CHUNKED_MIN_BYTES else None
        if chunked is None:
            doc = decode(path, raw)
            del raw
            if on_stage:
                on_stage("decode")
            part = _build(path, doc)
        else:
            doc, pieces = chunked
            if on_stage:
                on_stage("decode")
            from .links import build_rank_part
            part = build_rank_part(path, doc, pieces)
        if on_stage:
            on_stage("build")
        return part
    finally:
        if was_enabled:
            gc.enable()


def _build(path: Path, doc: TraceFile) -> RankPart:
    from .links import build_rank_part  # dependency inference lives there

    if doc.traceEvents is None:
        if len(doc.nodes):
            raise TraceFormatError(
                f"{path}: is a PyTorch execution trace (ET), not a profiler trace; ingest the "
                "matching Kineto file (torch.profiler output) instead")
        raise TraceFormatError(f"{path}: no 'traceEvents' array; is this a PyTorch profiler "
                               "trace (torch.profiler export_chrome_trace)?")
    return build_rank_part(path, doc)


def _json_bytes(path: Path) -> int:
    """Decompressed size of a JSON(.gz) file (a gzip member's ISIZE trailer: mod 2**32, so a
    larger ratio can only under-state it; such files are rare and still read correctly)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            if fh.read(2) != b"\x1f\x8b":
                return size
            fh.seek(-4, os.SEEK_END)
            isize = int.from_bytes(fh.read(4), "little")
        return max(isize, size)
    except OSError:
        return 0


def use_scanner(path: Path, total_bytes: int | None = None) -> bool:
    """Whether the numba scanner pays for ``path`` (see :data:`STREAMING`)."""
    from .scan import scanner_cached

    if scanner_cached():
        return True
    return (total_bytes if total_bytes is not None else _json_bytes(path)) >= SCANNER_MIN_BYTES


#: a tiny valid Kineto document whose parse runs every compiled kernel the scanner uses
_WARM_DOC = b"""{"schemaVersion": 1, "traceEvents": [
{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 10, "dur": 10, "args": {"External id": 1}},
{"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": 11, "dur": 5, "args": {"External id": 2}},
{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 12, "dur": 2,
 "args": {"External id": 2, "correlation": 3}},
{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 20, "dur": 3,
 "args": {"External id": 2, "device": 0, "stream": 7, "correlation": 3}}]}"""


def warm_scanner(path: Path, folder: Path) -> bool:
    """Load (or compile, once) the scanner's kernels in this process when ``path`` will be
    read with them, by parsing a tiny document written to ``folder``; True if it did.

    Called before worker processes are forked, so that they inherit the loaded machine code
    instead of each loading it from numba's cache (~0.3 s of CPU per worker) or, the first
    time, compiling it (~5 s each)."""
    if not (STREAMING or (STREAMING is None and use_scanner(path))):
        return False
    from .scan import parse_fast

    f = folder / "warm-up.json"
    f.write_bytes(_WARM_DOC)
    try:
        parse_fast(f)
    finally:
        f.unlink()
    return True


def file_progress(path: Path, progress: bool | None):
    """The progress bar of one (possibly huge) file's ingest: MB read, then the three build
    stages (``on_bytes`` / ``on_stage`` of :func:`parse_kineto_file` advance it)."""
    try:
        size_mb = path.stat().st_size / 1e6
    except OSError:
        size_mb = 0.0
    return progress_bar(round(size_mb + 3, 1), f"ingesting {path.name} (MB)", progress)


def read_kineto(paths: list[str | os.PathLike[str]] | str | os.PathLike[str], *, jobs: int = 1,
                progress: bool | None = None):
    """Read Kineto traces (files and/or folders, one file per rank) into one Trace.

    Parameters
    ----------
    paths : file(s) or folder(s); folders are searched for ``*.json`` / ``*.json.gz``
    jobs : parse files in this many worker processes
    progress : show a progress bar on stderr (default: when stderr is a terminal)
    """
    from .merge import merge_parts

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files, skipped = kineto_files([Path(p) for p in paths])
    parts: list[RankPart] = []
    if len(files) == 1:
        with file_progress(files[0], progress) as bar:
            parts.append(parse_kineto_file(files[0], on_stage=lambda _s: bar.advance(),
                                           on_bytes=lambda n: bar.advance(n / 1e6)))
        return merge_parts(parts, skipped)
    with progress_bar(len(files), "parsing traces", progress) as bar:
        if jobs > 1 and len(files) > 1:
            with ProcessPoolExecutor(max_workers=min(jobs, len(files))) as ex:
                for part in ex.map(parse_kineto_file, [str(f) for f in files]):
                    parts.append(part)
                    bar.advance()
        else:
            for f in files:
                parts.append(parse_kineto_file(f))
                bar.advance()
    return merge_parts(parts, skipped)
