"""collectors.shapes: the typed reader (only the fields it needs, skipping files without any
recorded shapes) gives the rows of the plain reference (every event decoded as a dict), on
every shared Kineto file and on hand-made edge cases."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import orjson
import pytest
from conftest import kineto_trace_files

from retime.collectors import shapes
from retime.collectors.costs.ops import MODELED_OPS, _base
from retime.collectors.errors import TraceFormatError

_RUNTIME = {"cuda_runtime", "cuda_driver", "runtime", "driver", "hip_runtime"}
_GPU = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "concurrent kernel"}


def _reference(path: Path, rank: int, wanted) -> list[tuple]:
    """The rows as the reader gave them before (whole orjson document, dict events)."""
    raw = gzip.open(path, "rb").read() if path.suffix == ".gz" else path.read_bytes()
    doc = orjson.loads(raw)
    ev = doc.get("traceEvents") if isinstance(doc, dict) else doc
    ev = ev if isinstance(ev, list) else []
    gpu, ops, calls, info = set(), {}, {}, []
    for e in ev:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat, a = e.get("cat"), e.get("args") or {}
        if cat in _GPU and a.get("correlation") is not None:
            gpu.add(a["correlation"])
        elif cat in _RUNTIME and a.get("correlation") is not None:
            calls.setdefault((e.get("pid"), e.get("tid")), []).append(
                (float(e.get("ts", 0)), a["correlation"]))
        elif cat == "cpu_op" and "Input Dims" in a and wanted(str(e.get("name", ""))):
            ts = float(e.get("ts", 0))
            ops.setdefault((e.get("pid"), e.get("tid")), []).append(
                (ts, ts + float(e.get("dur", 0)), len(info)))
            info.append((str(e["name"]), a.get("Input Dims") or [], a.get("Input type") or [],
                         a.get("Concrete Inputs") or []))
    claimed = [[] for _ in info]
    for key, cl in calls.items():
        for ts, c in sorted(cl):
            # the innermost operator open at the launch (latest start, then shortest)
            open_ = [o for o in ops.get(key, []) if o[0] <= ts < o[1]]
            if open_ and c in gpu:
                inner = max(open_, key=lambda o: (o[0], -o[1]))
                claimed[inner[2]].append(c)
    return [(rank, n, d, t, k, claimed[i]) for i, (n, d, t, k) in enumerate(info) if claimed[i]]


@pytest.mark.parametrize("path", kineto_trace_files(), ids=lambda p: p.name[:40])
def test_shared_files_equal_reference(path):
    for wanted in (lambda n: True, lambda n: _base(n) in MODELED_OPS):
        assert shapes._rank_rows(path, 5, wanted) == _reference(path, 5, wanted)


def _ev(**kw):
    e = {"ph": "X", "pid": 1, "tid": 1}
    e.update(kw)
    return e


_BASE = [
    _ev(cat="cpu_op", name="aten::mm", ts=10, dur=50,
        args={"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"]}),
    _ev(cat="cpu_op", name="aten::add", ts=20, dur=5,
        args={"Input Dims": None, "Concrete Inputs": ["", "1"]}),
    _ev(cat="cuda_runtime", name="cudaLaunchKernel", ts=22, dur=1, args={"correlation": 7}),
    _ev(cat="cuda_runtime", name="cudaLaunchKernel", ts=40, dur=1, args={"correlation": 8}),
    _ev(cat="kernel", name="k", ts=50, dur=3, pid=0, tid=7, args={"correlation": 7}),
    _ev(cat="kernel", name="k2", ts=60, dur=3, pid=0, tid=7, args={"correlation": 8}),
    _ev(cat="kernel", name="k3", ts=60, dur=3, pid=0, tid=7, args=None),
    {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "x"}},
]


@pytest.mark.parametrize("doc", [
    {"traceEvents": _BASE},
    _BASE,  # a bare event list
    {"traceEvents": _BASE + [3]},  # not an object: the general reader
    {"traceEvents": _BASE + [{"ph": "M", "args": "text"}]},  # args not an object
    {"traceEvents": _BASE, "deviceProperties": [{"name": "x"}]},
    {"traceEvents": "none"},
    {"other": 1},
], ids=["doc", "list", "non-object", "args-text", "extra-keys", "events-not-list", "no-events"])
def test_edge_cases_equal_reference(tmp_path, doc):
    p = tmp_path / "t.json"
    p.write_bytes(orjson.dumps(doc))
    got = shapes._rank_rows(p, 0, lambda n: True)
    assert got == _reference(p, 0, lambda n: True)
    if isinstance(doc, list) or isinstance(doc.get("traceEvents"), list):
        # aten::mm owns both launches except where aten::add (inner, null dims) is open
        assert [(r[1], r[5]) for r in got] == [("aten::mm", [8]), ("aten::add", [7])]


def test_escaped_key_is_not_skipped(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": _BASE}).replace("Input Dims", "Input\\u0020Dims"))
    got = shapes._rank_rows(p, 0, lambda n: True)
    assert len(got) == 2 and got == _reference(p, 0, lambda n: True)


def test_no_shapes_and_broken_file(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": _BASE}).replace("Input Dims", "Output Dims"))
    assert shapes._rank_rows(p, 0, lambda n: True) == []
    p.write_text('{"traceEvents": [{"ph": "X", "args": {"Input Dims": [')
    with pytest.raises(TraceFormatError, match="cannot read the Kineto file for operator"):
        shapes._rank_rows(p, 0, lambda n: True)
    g = tmp_path / "t.json.gz"
    g.write_bytes(b"not gzip")
    with pytest.raises(TraceFormatError, match="cannot read the Kineto file for operator"):
        shapes._rank_rows(g, 0, lambda n: True)
