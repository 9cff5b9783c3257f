"""Operator shapes from the Kineto files a trace was ingested from.

The stored Trace keeps names, times and dependencies, not the operators' argument shapes.
:func:`read_op_shapes` reads them back from the trace's own sources (``meta["sources"]``,
Kineto JSON ``.json`` / ``.json.gz``): every ``cpu_op`` event carrying ``Input Dims`` whose
name is one of ``names`` becomes a row, with the correlation ids of the GPU ops launched
inside it that no inner such operator claims (a kernel belongs to the innermost operator of
interest around its launch call, e.g. ``aten::addmm`` rather than ``aten::linear``).
GPU ops are then found in the trace by ``(rank, correlation)``.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pandas as pd

from .errors import TraceFormatError
from .trace import Trace

__all__ = ["read_op_shapes"]

_RUNTIME = {"cuda_runtime", "cuda_driver", "runtime", "driver", "hip_runtime"}
_GPU = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "concurrent kernel"}


class _Args(msgspec.Struct, gc=False):
    correlation: Any = None
    dims: Any = msgspec.field(default=msgspec.UNSET, name="Input Dims")
    types: Any = msgspec.field(default=None, name="Input type")
    concrete: Any = msgspec.field(default=None, name="Concrete Inputs")


class _Event(msgspec.Struct, gc=False):
    """The fields :func:`_file_rows` reads (the others are skipped by the decoder, never
    built: 2.6x faster than a whole ``orjson.loads`` and 0.4x its memory on a 54 MB file)."""
    ph: Any = None
    cat: Any = None
    name: Any = ""
    pid: Any = None
    tid: Any = None
    ts: Any = 0
    dur: Any = 0
    args: _Args | None = None


class _Doc(msgspec.Struct, gc=False):
    traceEvents: list[_Event] = []


_DECODER = msgspec.json.Decoder(_Doc | list[_Event])


def _read(path: Path) -> bytes:
    try:
        return gzip.open(path, "rb").read() if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError) as exc:
        raise TraceFormatError(f"{path}: cannot read the Kineto file for operator shapes "
                               f"({exc})") from exc


def _load(path: Path, raw: bytes | None = None) -> list[dict]:
    """Every event as a dict (the general reader: any JSON the typed one refuses)."""
    try:
        doc = orjson.loads(_read(path) if raw is None else raw)
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(f"{path}: cannot read the Kineto file for operator shapes "
                               f"({exc})") from exc
    ev = doc.get("traceEvents") if isinstance(doc, dict) else doc
    return ev if isinstance(ev, list) else []


def _rank_rows(path: Path, rank: int, wanted: Callable[[str], bool]) -> list[tuple]:
    """:func:`_file_rows` of one file, decoded into only the fields it reads; a file those
    types do not fit (an event that is not an object, ``args`` that are not one, broken
    JSON) goes through :func:`_load`, which gives the same rows or the same error."""
    raw = _read(path)
    if b"Input Dims" not in raw and (b"\\" not in raw or b"\\u" not in raw):
        # no operator recorded shapes (the key can only be spelled otherwise escaped; a
        # one-byte search first, 7x faster than the two-byte one)
        return []
    try:
        doc = _DECODER.decode(raw)
    except msgspec.DecodeError:
        return _file_rows(_load(path, raw), rank, wanted)
    ev = doc.traceEvents if isinstance(doc, _Doc) else doc
    del raw
    return _collect(((e.ph, e.cat, e.name, e.pid, e.tid, e.ts, e.dur, e.args) for e in ev),
                    rank, wanted)


def read_op_shapes(trace: Trace, wanted: Callable[[str], bool]) -> pd.DataFrame:
    """Operators with recorded shapes (``wanted(name)`` true) and the GPU ops they launched.

    Returns a DataFrame with ``rank``, ``name``, ``input_dims``, ``input_types``,
    ``concrete`` (``Concrete Inputs``, or an empty list) and ``correlations`` (list of the
    GPU ops' correlation ids). Raises TraceFormatError when the trace has no Kineto sources
    or they cannot be read (moved or deleted since the ingest).
    """
    srcs = [s for s in trace.meta.get("sources", []) or []
            if isinstance(s, dict) and s.get("format") == "kineto" and "rank" in s]
    if not srcs:
        raise TraceFormatError("the trace records no Kineto source files (operator shapes "
                               "come from their 'Input Dims'); ingest PyTorch profiler traces "
                               "recorded with record_shapes=True")
    rows = []
    for s in srcs:
        p = Path(s["path"])
        if not p.is_file():
            raise TraceFormatError(f"{p}: the trace's Kineto source is gone (operator shapes are "
                                   "read from it); restore it or re-ingest from where it is now")
        rows.extend(_rank_rows(p, int(s["rank"]), wanted))
    return pd.DataFrame(rows, columns=["rank", "name", "input_dims", "input_types", "concrete",
                                       "correlations"])


def _file_rows(ev: list[dict], rank: int, wanted: Callable[[str], bool]) -> list[tuple]:
    def fields():
        for e in ev:
            if not isinstance(e, dict) or e.get("ph") != "X":
                continue
            a = e.get("args") or {}
            yield (e.get("ph"), e.get("cat"), e.get("name", ""), e.get("pid"), e.get("tid"),
                   e.get("ts", 0), e.get("dur", 0),
                   _Args(a.get("correlation"), a["Input Dims"] if "Input Dims" in a
                         else msgspec.UNSET, a.get("Input type"), a.get("Concrete Inputs")))
    return _collect(fields(), rank, wanted)


def _collect(events, rank: int, wanted: Callable[[str], bool]) -> list[tuple]:
    """The rows of one rank from its events' ``(ph, cat, name, pid, tid, ts, dur, args)``
    (``args``: an :class:`_Args`, or None)."""
    gpu_corr = set()
    ops: dict[tuple, list] = {}  # (pid, tid) -> [(ts, end, idx)]
    calls: dict[tuple, list] = {}
    info = []
    for ph, cat, name, pid, tid, ts, dur, a in events:
        if ph != "X":
            continue
        if cat in _GPU:
            c = a.correlation if a is not None else None
            if c is not None:
                gpu_corr.add(c)
        elif cat in _RUNTIME:
            c = a.correlation if a is not None else None
            if c is not None:
                calls.setdefault((pid, tid), []).append((float(ts), c))
        elif (cat == "cpu_op" and a is not None and a.dims is not msgspec.UNSET
              and wanted(str(name))):
            t0 = float(ts)
            ops.setdefault((pid, tid), []).append((t0, t0 + float(dur), len(info)))
            info.append((str(name), a.dims or [], a.types or [], a.concrete or []))
    claimed: list[list] = [[] for _ in info]
    for key, cl in calls.items():
        sp = sorted(ops.get(key, []), key=lambda x: (x[0], -x[1]))
        cl.sort()
        stack: list[tuple] = []
        j = 0
        for ts, c in cl:
            while j < len(sp) and sp[j][0] <= ts:
                while stack and stack[-1][1] <= sp[j][0]:
                    stack.pop()
                stack.append(sp[j])
                j += 1
            while stack and stack[-1][1] <= ts:
                stack.pop()
            if stack and c in gpu_corr:
                claimed[stack[-1][2]].append(c)
    return [(rank, nm, d, t, k, claimed[i]) for i, (nm, d, t, k) in enumerate(info)
            if claimed[i]]
