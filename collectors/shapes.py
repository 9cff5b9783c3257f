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

import orjson
import pandas as pd

from .errors import TraceFormatError
from .trace import Trace

__all__ = ["read_op_shapes"]

_RUNTIME = {"cuda_runtime", "cuda_driver", "runtime", "driver", "hip_runtime"}
_GPU = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "concurrent kernel"}


def _load(path: Path) -> list[dict]:
    try:
        raw = gzip.open(path, "rb").read() if path.suffix == ".gz" else path.read_bytes()
        doc = orjson.loads(raw)
    except (OSError, orjson.JSONDecodeError, EOFError) as exc:
        raise TraceFormatError(f"{path}: cannot read the Kineto file for operator shapes "
                               f"({exc})") from exc
    ev = doc.get("traceEvents") if isinstance(doc, dict) else doc
    return ev if isinstance(ev, list) else []


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
        rows.extend(_file_rows(_load(p), int(s["rank"]), wanted))
    return pd.DataFrame(rows, columns=["rank", "name", "input_dims", "input_types", "concrete",
                                       "correlations"])


def _file_rows(ev: list[dict], rank: int, wanted: Callable[[str], bool]) -> list[tuple]:
    gpu_corr = set()
    ops: dict[tuple, list] = {}  # (pid, tid) -> [(ts, end, idx)]
    calls: dict[tuple, list] = {}
    info = []
    for e in ev:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat = e.get("cat")
        a = e.get("args") or {}
        if cat in _GPU:
            c = a.get("correlation")
            if c is not None:
                gpu_corr.add(c)
        elif cat in _RUNTIME:
            c = a.get("correlation")
            if c is not None:
                calls.setdefault((e.get("pid"), e.get("tid")), []).append(
                    (float(e.get("ts", 0)), c))
        elif cat == "cpu_op" and "Input Dims" in a and wanted(str(e.get("name", ""))):
            ts = float(e.get("ts", 0))
            ops.setdefault((e.get("pid"), e.get("tid")), []).append(
                (ts, ts + float(e.get("dur", 0)), len(info)))
            info.append((str(e["name"]), a.get("Input Dims") or [], a.get("Input type") or [],
                         a.get("Concrete Inputs") or []))
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
