"""PyTorch profiler (Kineto) JSON reader: one Trace for one or many rank files.

Reading is two-stage: :func:`parse_kineto_file` turns one file into a :class:`RankPart`
(columns of one rank, local ids; runs in worker processes with ``jobs > 1``), then
:func:`merge_parts` assigns global lane / op / string ids, matches collectives across
ranks and writes the accounting.

How events are used (every event is counted in ``meta["accounting"][file]``):

``X`` kernel / gpu_memcpy / gpu_memset      -> ops on GPU_STREAM lanes (NCCL/RCCL kernels
                                               become COLLECTIVE ops)
``X`` cuda_runtime / cuda_driver            -> RUNTIME ops on CPU_THREAD lanes
``X`` cpu_op / python_function / operator   -> leaf events become CPU_OP ops; events that
                                               enclose others on their thread become ranges
``X`` user_annotation / gpu_user_annotation -> ranges (``gloo:*`` on gloo threads -> COLLECTIVE ops)
``X`` cuda_sync                             -> SYNC edges (Stream Wait Event / Event Sync / Context Sync)
``X`` Trace                                 -> profiler window marker
``s``/``f``/``t`` flows (ac2g, fwdbwd)      -> flows (launches are linked by correlation id)
``i``/``I`` ``[memory]``                    -> memory table; other instants -> markers
``M``                                       -> lane/process names
``B``/``E``                                 -> paired into ranges
``C``, ``b``/``e``/``n``, ``O``/``N``/``D``, ``P``, ``R`` -> dropped, counted per phase
anything else                               -> error (unknown ``ph``)

Timestamps: ``ts``/``dur`` are microseconds (fractional ns). Files with
``baseTimeNanoseconds`` hold ``ts`` relative to it; absolute time = base + ts*1000.
"""

from __future__ import annotations

import gc
import gzip
import os
import re
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from .enums import OpKind
from .errors import TraceFormatError
from .progress import progress_bar

__all__ = ["read_kineto", "parse_kineto_file", "RankPart", "kineto_files"]


# ---------------------------------------------------------------- schema (msgspec)
class _Args(msgspec.Struct, omit_defaults=True, gc=False):
    correlation: int = -1
    external_id: int = msgspec.field(default=-1, name="External id")
    device: int | None = None
    stream: int | None = None
    bytes: int | float | str | None = None  # HIP traces write strings ('128')
    coll_name: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    pg_name: str | int | None = msgspec.field(default=None, name="Process Group Name")
    pg_ranks: str | list[int] | None = msgspec.field(default=None, name="Process Group Ranks")
    seq: int | str | None = msgspec.field(default=None, name="Seq")
    dtype: str | None = None
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    sync_kind: str | None = msgspec.field(default=None, name="cuda_sync_kind")
    wait_corr: int | None = msgspec.field(default=None, name="wait_on_cuda_event_record_corr_id")
    wait_stream: int | None = msgspec.field(default=None, name="wait_on_stream")
    mem_bytes: int | None = msgspec.field(default=None, name="Bytes")
    total_alloc: int | None = msgspec.field(default=None, name="Total Allocated")
    total_reserved: int | None = msgspec.field(default=None, name="Total Reserved")
    dev_id: int | None = msgspec.field(default=None, name="Device Id")
    dev_type: int | None = msgspec.field(default=None, name="Device Type")
    name: str | None = None
    labels: str | None = None
    # written by `retime export --chrome`
    rank: int | None = None
    lane: int | None = None
    kind: str | None = None
    lane_kind: str | None = None
    native_id: int | None = None


class _Ev(msgspec.Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: str | int | float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: _Args | None = None


class _PG(msgspec.Struct, gc=False):
    pg_name: str | int | None = None
    pg_desc: str | None = None
    pg_size: int | None = None
    ranks: list[int] | None = None


class _Dist(msgspec.Struct, gc=False):
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    pg_config: list[_PG] | None = None
    nccl_version: str | None = None


class _Dev(msgspec.Struct, gc=False):
    id: int | None = None
    name: str | None = None
    totalGlobalMem: int | None = None
    numSms: int | None = None
    computeMajor: int | None = None
    computeMinor: int | None = None


class _File(msgspec.Struct, gc=False):
    traceEvents: list[_Ev] | None = None
    distributedInfo: _Dist | None = None
    deviceProperties: list[_Dev] | None = None
    baseTimeNanoseconds: int | None = None
    retimeExport: dict[str, Any] | None = None
    host_name: str | None = None  # written by newer torch.profiler and by collectors.capture
    schema: Any = None
    nodes: msgspec.Raw = msgspec.Raw(b"")


_DEC_FILE = msgspec.json.Decoder(_File)
NOARGS = _Args()  # shared stand-in for events without args
_DEC_LIST = msgspec.json.Decoder(list[_Ev])

_KNOWN_PH = set("XBEiIsftMCbenONDPRpa")
_DROP_PH = {"C": "counter events (ph C) are not used", "b": "async events (ph b/e/n) are not used",
            "e": "async events (ph b/e/n) are not used", "n": "async events (ph b/e/n) are not used",
            "O": "object events (ph N/O/D) are not used", "N": "object events (ph N/O/D) are not used",
            "D": "object events (ph N/O/D) are not used", "P": "sample events (ph P) are not used",
            "R": "mark events (ph R) are not used", "p": "sample events (ph P) are not used",
            "a": "async events (ph b/e/n) are not used"}
_GPU_CATS = {"kernel": OpKind.KERNEL, "gpu_memcpy": OpKind.MEMCPY, "gpu_memset": OpKind.MEMSET,
             "memcpy": OpKind.MEMCPY, "memset": OpKind.MEMSET, "concurrent kernel": OpKind.KERNEL}
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver", "hip_runtime"}
_HOST_CATS = {"cpu_op", "operator", "python_function", "user_annotation", "cpu_instant_event"}
_COMM_KERNEL = re.compile(r"^(nccl|rccl|ncclDev|ncclKernel)", re.I)
_FILE_RANK = [re.compile(p) for p in (r"rank[-_]?(\d+)", r"worker[-_]?(\d+)", r"_r(\d+)[._]",
                                      r"(?:^|[^\d])(\d+)\.(?:pt\.)?trace\.json")]


# ---------------------------------------------------------------- per-rank result
@dataclass
class RankPart:
    """One rank's parsed columns with local ids (lanes, names, ops are file-local)."""

    path: str
    rank: int
    rank_source: str
    world_size: int | None
    backend: str | None
    pg_config: list[dict]
    devices: dict[int, dict]
    strings: list[str]
    lanes: list[tuple[int, int, int, int, str]]  # (lane_kind, device, native_id, pid, name)
    ops: dict[str, np.ndarray]
    edges: dict[str, np.ndarray]
    ranges: dict[str, np.ndarray]
    memory: dict[str, np.ndarray]
    comm: dict[str, Any]  # per collective op: local op index, group name, seq, ...
    accounting: dict[str, Any]
    window_ns: tuple[int, int] | None = None
    hostname: str | None = None
    export_rank_parts: list[RankPart] = field(default_factory=list)


def kineto_files(paths: list[Path]) -> tuple[list[Path], dict[str, str]]:
    """Expand folders into Kineto files; return (files, skipped {path: reason})."""
    files: list[Path] = []
    skipped: dict[str, str] = {}
    for p in paths:
        if p.is_dir():
            cand = sorted(q for q in p.rglob("*") if q.is_file() and
                          (q.name.endswith((".json", ".json.gz"))))
            for q in cand:
                if _is_execution_trace(q):
                    skipped[str(q)] = "PyTorch execution trace (ET), not a profiler trace"
                else:
                    files.append(q)
        else:
            files.append(p)
    if not files:
        where = ", ".join(str(p) for p in paths)
        if skipped:
            raise TraceFormatError(
                f"{where}: holds only PyTorch execution traces (ET: host op graphs without GPU "
                f"timings, {len(skipped)} file(s)); ingest the matching Kineto profiler JSON "
                "(torch.profiler output) instead")
        raise TraceFormatError(
            f"{where}: no PyTorch profiler traces found (*.json / *.json.gz with traceEvents); "
            "point at the files written by torch.profiler or a folder holding them")
    return files, skipped


def _is_execution_trace(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as fh:
            h = fh.read(2048)
    except (OSError, EOFError):
        return False
    return b'"nodes"' in h and b'"schema"' in h and b"traceEvents" not in h


def _load_bytes(path: Path) -> bytes:
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


_PATH_RE = re.compile(r"\$\.traceEvents\[(\d+)\](?:\.(\w+))?")


def _decode(path: Path, raw: bytes) -> _File:
    try:
        if raw.lstrip()[:1] == b"[":
            return _File(traceEvents=_DEC_LIST.decode(raw))
        return _DEC_FILE.decode(raw)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        m = _PATH_RE.search(msg)
        if m:
            idx, fld = m.group(1), m.group(2)
            what = msg.split(" - at ")[0]
            raise TraceFormatError(
                f"{path}: event {idx}: field '{fld}' is invalid ({what}); fix or remove that "
                "event (ts and dur must be numbers in microseconds)") from exc
        raise TraceFormatError(f"{path}: unexpected structure ({msg}); is this a PyTorch "
                               "profiler trace?") from exc
    except msgspec.DecodeError as exc:
        msg = str(exc)
        if "UTF-8" in msg or "utf-8" in msg:
            raise TraceFormatError(f"{path}: invalid UTF-8 in JSON ({msg}); re-export the trace "
                                   "or fix the encoding") from exc
        if "truncated" in msg.lower():
            raise TraceFormatError(
                f"{path}: truncated JSON ({msg}); the file was cut off while writing — "
                "re-copy it or re-run the profiler export") from exc
        raise TraceFormatError(f"{path}: invalid JSON ({msg}); the file is damaged — re-export it") from exc


def _rank_from_name(path: Path) -> int | None:
    for pat in _FILE_RANK:
        m = pat.search(path.name)
        if m:
            return int(m.group(1))
    return None


def _str(x: Any) -> str:
    return x if isinstance(x, str) else ("" if x is None else str(x))


def parse_kineto_file(path: str | os.PathLike[str], on_stage=None, on_bytes=None) -> RankPart:
    """Parse one Kineto JSON(.gz) file into a :class:`RankPart` (picklable, for workers).

    ``on_stage(name)`` is called as each stage (read, decode, build) finishes;
    ``on_bytes(n)`` as the streaming reader reads ``n`` more bytes of the file.
    """
    path = Path(path)
    if STREAMING:
        from .kineto_fast import parse_fast
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            part = parse_fast(path, on_stage, on_bytes)
        finally:
            if was_enabled:
                gc.enable()
        if part is not None:
            if on_stage:
                on_stage("build")
            return part
    raw = _load_bytes(path)
    if on_stage:
        on_stage("read")
    # Millions of small objects: the cyclic GC would rescan them again and again (and the
    # structs hold no cycles), so it is paused while decoding and building columns.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        chunked = _decode_pieces(path, raw) if len(raw) >= CHUNKED_MIN_BYTES else None
        if chunked is None:
            doc = _decode(path, raw)
            del raw
            if on_stage:
                on_stage("decode")
            part = _build(path, doc)
        else:
            doc, pieces = chunked
            if on_stage:
                on_stage("decode")
            from .kineto_links import build_rank_part
            part = build_rank_part(path, doc, pieces)
        if on_stage:
            on_stage("build")
        return part
    finally:
        if was_enabled:
            gc.enable()


#: read with the streaming numba scanner (collectors.kineto_fast); files it cannot read
#: exactly (and every damaged file, so that the error is worded here) take the path below
STREAMING = True
#: files at least this large (decompressed) are decoded piece by piece
CHUNKED_MIN_BYTES = 8 << 20
_PIECE_BYTES = 4 << 20
_DEC_PIECE = msgspec.json.Decoder(list[_Ev])
_PIECE_IDX = re.compile(r"^\$\[(\d+)\](?:\.(\w+))?")


def _decode_pieces(path: Path, raw: bytes):
    """Large files: decode the metadata, then yield the events in pieces of ~4 MB.

    Only one piece of event objects is alive at a time, which bounds memory by the columns
    rather than by millions of Python objects. Returns None when the text is not a JSON
    object with a balanced top-level ``traceEvents`` array (the whole-file decoder then
    reports what is wrong).
    """
    from ._kernels import scan_json_array

    if raw.lstrip()[:1] != b"{":
        return None
    a, b, cuts = scan_json_array(np.frombuffer(raw, np.uint8), b"traceEvents", _PIECE_BYTES)
    if a < 0 or b < 0:
        return None
    doc = _decode(path, raw[:a] + b"[]" + raw[b + 1:])
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
                fld = (m.group(2) if m else None) or "?"
                raise TraceFormatError(
                    f"{path}: event {idx}: field '{fld}' is invalid ({str(exc).split(' - at ')[0]}); "
                    "fix or remove that event (ts and dur must be numbers in microseconds)") from exc
            except msgspec.DecodeError as exc:
                raise TraceFormatError(f"{path}: invalid JSON after event {off} ({exc}); the "
                                       "file is damaged — re-export it") from exc
            yield off, evs
            off += len(evs)
            start = cut + 1

    return doc, pieces()


def _build(path: Path, doc: _File) -> RankPart:
    from .kineto_links import build_rank_part  # dependency inference lives there

    if doc.traceEvents is None:
        if len(doc.nodes):
            raise TraceFormatError(
                f"{path}: is a PyTorch execution trace (ET), not a profiler trace; ingest the "
                "matching Kineto file (torch.profiler output) instead")
        raise TraceFormatError(f"{path}: no 'traceEvents' array; is this a PyTorch profiler "
                               "trace (torch.profiler export_chrome_trace)?")
    return build_rank_part(path, doc)


def read_kineto(paths: list[str | os.PathLike[str]] | str | os.PathLike[str], *, jobs: int = 1,
                progress: bool | None = None):
    """Read Kineto traces (files and/or folders, one file per rank) into one Trace.

    Parameters
    ----------
    paths : file(s) or folder(s); folders are searched for ``*.json`` / ``*.json.gz``
    jobs : parse files in this many worker processes
    progress : show a progress bar on stderr (default: when stderr is a terminal)
    """
    from .kineto_merge import merge_parts

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files, skipped = kineto_files([Path(p) for p in paths])
    parts: list[RankPart] = []
    if len(files) == 1:  # one (possibly huge) file: MB read, then the build stages
        try:
            size_mb = files[0].stat().st_size / 1e6
        except OSError:
            size_mb = 0.0
        with progress_bar(round(size_mb + 3, 1), f"ingesting {files[0].name} (MB)",
                          progress) as bar:
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
