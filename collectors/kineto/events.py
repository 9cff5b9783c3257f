"""Kineto files -> decoded events (the general msgspec path).

Lists the trace files of the inputs, reads and inflates them, and decodes them whole or, for
large files, piece by piece; every decode error is worded here (file, event index, field).
"""

from __future__ import annotations

import gzip
import re
import zlib
from pathlib import Path

import msgspec
import numpy as np

from ..errors import TraceFormatError
from .drift import invalid_field
from .schema import FILE_DECODER, LIST_DECODER, Event, TraceFile


def kineto_files(paths: list[Path]) -> tuple[list[Path], dict[str, str]]:
    """Expand folders into Kineto files; return (files, skipped {path: reason})."""
    files: list[Path] = []
    skipped: dict[str, str] = {}
    for p in paths:
        if p.is_dir():
            cand = sorted(q for q in p.rglob("*") if q.is_file() and
                          (q.name.endswith((".json", ".json.gz"))))
            for q in cand:
                if is_execution_trace(q):
                    skipped[str(q)] = "PyTorch execution trace (ET), not a profiler trace"
                elif not has_trace_events(q):
                    skipped[str(q)] = ("JSON without trace events (a run's config or other "
                                       "data), not a profiler trace")
                else:
                    files.append(q)
        else:
            files.append(p)
    if not files:
        where = ", ".join(str(p) for p in paths)
        if skipped and all("(ET)" in why for why in skipped.values()):
            raise TraceFormatError(
                f"{where}: holds only PyTorch execution traces (ET: host op graphs without GPU "
                f"timings, {len(skipped)} file(s)); ingest the matching Kineto profiler JSON "
                "(torch.profiler output) instead")
        if skipped:
            raise TraceFormatError(
                f"{where}: no PyTorch profiler traces among its {len(skipped)} JSON file(s) "
                f"(e.g. {Path(next(iter(skipped))).name}: {next(iter(skipped.values()))}); "
                "point at the files written by torch.profiler")
        raise TraceFormatError(
            f"{where}: no PyTorch profiler traces found (*.json / *.json.gz with traceEvents); "
            "point at the files written by torch.profiler or a folder holding them")
    return files, skipped


#: how much decompressed text :func:`has_trace_events` reads at most
SNIFF_BYTES = 64 << 20


def has_trace_events(path: Path) -> bool:
    """Whether a JSON(.gz) file found in a folder is a profiler trace: an object with a
    ``traceEvents`` key or an array of events (``ph``). Reads until the key shows up (the
    first kilobytes of a real trace), at most :data:`SNIFF_BYTES`; an unreadable file counts
    as a trace, so that reading it words the error."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as fh:
            tail, n, first = b"", 0, True
            while n < SNIFF_BYTES:
                chunk = fh.read(1 << 16)
                if not chunk:
                    return False
                if first:
                    s = chunk.lstrip()
                    if s[:1] == b"[":
                        return b'"ph"' in chunk or len(s.strip()) <= 2
                    if s[:1] != b"{":
                        return True  # not JSON at all: the reader says so
                    first = False
                if b'"traceEvents"' in tail + chunk:
                    return True
                tail, n = chunk[-16:], n + len(chunk)
    except (OSError, EOFError, zlib.error):
        return True
    return True


def is_execution_trace(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as fh:
            h = fh.read(2048)
    except (OSError, EOFError):
        return False
    return b'"nodes"' in h and b'"schema"' in h and b"traceEvents" not in h


def load_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read ({exc.strerror}); check the path and permissions") from exc
    if not raw.strip():
        raise TraceFormatError(f"{path}: empty file; it holds no trace events (re-export the trace)")
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(
                f"{path}: corrupt or truncated gzip ({exc}); re-copy the file or decompress it "
                "with `gzip -t` to check") from exc
        if not raw.strip():
            raise TraceFormatError(f"{path}: empty file inside gzip; re-export the trace")
    return raw


class RawControlCharacters(TraceFormatError):
    """The JSON holds raw control characters (U+0000..U+001F) inside strings.

    Kineto writes some names (Python frames, thread names, user annotations) without
    escaping them; the text is otherwise clear, so readers repair it with
    :func:`escape_control_chars` and count what they escaped.
    """


def escape_control_chars(raw: bytes) -> tuple[bytes, int]:
    """Escape raw control characters inside JSON strings as ``\\u00XX``.

    Returns the repaired text and how many characters were escaped. Whitespace between
    tokens is untouched, so the document means exactly what its writer meant. Vectorized:
    a quote opens or closes a string unless an odd run of backslashes precedes it, and a
    control byte is inside a string when an odd number of such quotes precede it.
    """
    a = np.frombuffer(raw, np.uint8)
    ctrl = np.flatnonzero(a < 0x20)
    if len(ctrl) == 0:
        return raw, 0
    q = np.flatnonzero(a == 0x22)
    escaped = np.zeros(len(q), bool)
    for i in np.flatnonzero((q > 0) & (a[np.maximum(q - 1, 0)] == 0x5C)).tolist():
        k = int(q[i]) - 1  # a quote after a backslash (rare): count the run
        while k >= 0 and a[k] == 0x5C:
            k -= 1
        escaped[i] = (int(q[i]) - 1 - k) % 2 == 1
    real = q[~escaped]
    inside = ctrl[np.searchsorted(real, ctrl) % 2 == 1]
    if len(inside) == 0:
        return raw, 0
    parts, prev = [], 0
    for k in inside.tolist():
        parts.append(raw[prev:k])
        parts.append(b"\\u%04x" % raw[k])
        prev = k + 1
    parts.append(raw[prev:])
    return b"".join(parts), len(inside)


_BYTE_RE = re.compile(r"\(byte (\d+)\)")


def _is_control_error(msg: str, raw: bytes, base: int = 0) -> bool:
    """Whether a decoder's complaint is a raw control character (msgspec names the byte)."""
    if "control character" in msg.lower():
        return True
    m = _BYTE_RE.search(msg)
    if m is None:
        return False
    at = int(m.group(1)) - base
    return 0 <= at < len(raw) and raw[at] < 0x20


_PATH_RE = re.compile(r"\$\.traceEvents\[(\d+)\]((?:\.[\w ]+|\[\d+\])*)")


def decode(path: Path, raw: bytes) -> TraceFile:
    try:
        if raw.lstrip()[:1] == b"[":
            return TraceFile(traceEvents=LIST_DECODER.decode(raw))
        return FILE_DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        m = _PATH_RE.search(msg)
        if m:
            raise invalid_field(path, m.group(1), m.group(2), msg.split(" - at ")[0]) from exc
        raise TraceFormatError(f"{path}: unexpected structure ({msg}); is this a PyTorch "
                               "profiler trace?") from exc
    except msgspec.DecodeError as exc:
        msg = str(exc)
        if _is_control_error(msg, raw):
            raise RawControlCharacters(f"{path}: raw control character in a JSON string "
                                       f"({msg})") from exc
        if "UTF-8" in msg or "utf-8" in msg:
            raise TraceFormatError(f"{path}: invalid UTF-8 in JSON ({msg}); re-export the trace "
                                   "or fix the encoding") from exc
        if "truncated" in msg.lower():
            raise TraceFormatError(
                f"{path}: truncated JSON ({msg}); the file was cut off while writing — "
                "re-copy it or re-run the profiler export") from exc
        raise TraceFormatError(f"{path}: invalid JSON ({msg}); the file is damaged — re-export it") from exc


PIECE_BYTES = 4 << 20
_DEC_PIECE = msgspec.json.Decoder(list[Event])
_PIECE_IDX = re.compile(r"^\$\[(\d+)\]((?:\.[\w ]+|\[\d+\])*)")


def decode_pieces(path: Path, raw: bytes):
    """Large files: decode the metadata, then yield the events in pieces of ~4 MB.

    Only one piece of event objects is alive at a time, which bounds memory by the columns
    rather than by millions of Python objects. Returns None when the text is not a JSON
    object with a balanced top-level ``traceEvents`` array (the whole-file decoder then
    reports what is wrong).
    """
    from .._kernels import scan_json_array

    if raw.lstrip()[:1] != b"{":
        return None
    a, b, cuts = scan_json_array(np.frombuffer(raw, np.uint8), b"traceEvents", PIECE_BYTES)
    if a < 0 or b < 0:
        return None
    doc = decode(path, raw[:a] + b"[]" + raw[b + 1:])
    if doc.retimeExport is not None:
        return None

    def pieces():
        start, off = a + 1, 0
        for cut in [*cuts.tolist(), b]:
            try:
                evs = _DEC_PIECE.decode(b"[" + raw[start:cut] + b"]")
            except msgspec.ValidationError as exc:
                m = _PIECE_IDX.search(str(exc).split(" - at `")[-1].rstrip("`"))
                idx = off + int(m.group(1)) if m else off
                raise invalid_field(path, idx, (m.group(2) if m else None) or "?",
                               str(exc).split(" - at ")[0]) from exc
            except msgspec.DecodeError as exc:
                if _is_control_error(str(exc), raw[start:cut], 1):
                    raise RawControlCharacters(f"{path}: raw control character in a JSON "
                                               f"string after event {off}") from exc
                raise TraceFormatError(f"{path}: invalid JSON after event {off} ({exc}); the "
                                       "file is damaged — re-export it") from exc
            yield off, evs
            off += len(evs)
            start = cut + 1

    return doc, pieces()
