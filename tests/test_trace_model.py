"""The Trace model: construction defaults, validation naming every problem, store I/O."""

from __future__ import annotations

import json

import numpy as np
import pytest

from retime.collectors import EdgeKind, Trace, TraceFormatError, TraceValidationError, read_trace
from retime.collectors.trace import OPS_SCHEMA, SCHEMA_VERSION


def _small(**over):
    kw = dict(
        ops={"rank": [0, 0, 1], "lane": [0, 0, 1], "kind": [0, 0, 3], "name_id": [0, 1, 1],
             "start_ns": [0, 10, 5], "dur_ns": [5, 5, 5], "coll_id": [-1, 0, 0]},
        lanes={"lane": [0, 1], "rank": [0, 1], "lane_kind": [1, 1], "name": ["s7", "s7"]},
        edges={"src": [0], "dst": [1], "kind": [EdgeKind.HOST_ORDER]},
        strings=["gemm", "nccl"], meta={"world_size": 2})
    kw.update(over)
    return Trace.build(**kw)


def test_defaults_and_dtypes():
    t = _small()
    assert list(t.ops.columns) == list(OPS_SCHEMA)
    for c, (dt, _default) in OPS_SCHEMA.items():
        assert str(t.ops[c].dtype) == dt
    assert t.ops["op_id"].tolist() == [0, 1, 2]
    assert t.ops["step"].tolist() == [-1, -1, -1] and np.isnan(t.ops["flops"]).all()
    assert t.meta["schema_version"] == SCHEMA_VERSION and t.world_size == 2
    st = t.step_times_ns()
    assert st["span_ns"].tolist() == [15, 5]


def test_missing_columns_all_named():
    with pytest.raises(TraceValidationError) as ei:
        Trace.build(ops={"rank": [0], "lane": [0]}, lanes={"lane": [0], "rank": [0], "lane_kind": [1]},
                    strings=["a"])
    msg = str(ei.value)
    for c in ("kind", "name_id", "start_ns", "dur_ns"):
        assert c in msg


def test_validation_names_every_problem():
    with pytest.raises(TraceValidationError) as ei:
        _small(edges={"src": [0, 7], "dst": [1, 1], "kind": [5, 5]},
               ops={"rank": [0, 0, 1], "lane": [0, 0, 9], "kind": [0, 0, 3], "name_id": [0, 1, 5],
                    "start_ns": [0, 10, 5], "dur_ns": [5, -5, 5]})
    msg = str(ei.value)
    assert "dangling" in msg and "negative" in msg and "unknown lane" in msg and "name_id" in msg


def test_store_errors(tmp_path):
    with pytest.raises(TraceFormatError, match="not a retime trace directory"):
        read_trace(tmp_path)
    p = _small().save(tmp_path / "a.retime")
    meta = json.loads((p / "meta.json").read_text())
    meta["schema_version"] = 99
    (p / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(TraceFormatError, match="schema_version 99"):
        read_trace(p)
    p2 = _small().save(tmp_path / "b.retime")
    (p2 / "edges.parquet").unlink()
    with pytest.raises(TraceFormatError, match="missing edges.parquet"):
        read_trace(p2)
    # save is atomic: no temp dirs left behind, overwrite replaces
    _small().save(tmp_path / "b.retime")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.retime", "b.retime"]
