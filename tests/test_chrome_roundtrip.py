"""`retime export --chrome` then `retime ingest` gives the run back: every op (all its
columns), steps, collective instances (ids and pairing), edges, groups, ranges and the run's
meta, on the real shared traces; and `--chrome` refuses a file name ingest would not read."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest
from conftest import SHARED, ingest_cached

from retime.cli import run
from retime.collectors.chrome import write_chrome
from retime.collectors.ingest import ingest
from retime.collectors.steps import step_windows
from retime.collectors.trace import read_trace

CASES = {
    "megatron-ST-8rank": SHARED / "oplevel" / "megatron-ST-8rank",
    "dlrm-v100-8rank": SHARED / "kineto" / "dlrm-v100-8rank",
    "a100-ddp-nccl": SHARED / "kineto" / "a100-ddp-nccl",
}


def _lane_names(t) -> np.ndarray:
    return t.lanes.set_index("lane").loc[t.ops["lane"], "name"].to_numpy()


def _ranges(t) -> list:
    r = t.ranges
    nm = np.asarray(t.strings, object)[r["name_id"].to_numpy()]
    return sorted(zip(r["rank"], r["start_ns"], r["end_ns"], r["depth"], nm, strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_round_trip_keeps_the_run(name, tmp_path):
    src = ingest_cached(CASES[name])
    f = tmp_path / "x.json.gz"
    write_chrome(src, f)
    ingest(f, tmp_path / "x.retime", progress=False)  # what `retime ingest x.json.gz` runs
    back = read_trace(tmp_path / "x.retime")
    a, b = src.ops, back.ops
    assert len(b) == len(a)
    for c in a.columns:
        if c in ("lane", "name_id"):  # renumbered: compared by what they name
            continue
        np.testing.assert_array_equal(b[c].to_numpy(), a[c].to_numpy(), err_msg=c)
    assert (back.names() == src.names()).all()
    assert (_lane_names(back) == _lane_names(src)).all()
    pd.testing.assert_frame_equal(back.edges.reset_index(drop=True),
                                  src.edges.reset_index(drop=True))
    assert back.groups["name"].tolist() == src.groups["name"].tolist()
    assert back.groups["ranks"].tolist() == src.groups["ranks"].tolist()
    assert _ranges(back) == _ranges(src)
    assert back.meta["collectives"] == src.meta["collectives"]
    assert back.meta["source_format"] == src.meta["source_format"]
    assert back.meta["exported_from"]["via"] == "retime export --chrome"
    for k in ("job", "oplevel", "world_size"):
        assert back.meta.get(k) == src.meta.get(k), k
    sa, sb = step_windows(src), step_windows(back)
    pd.testing.assert_frame_equal(sb.reset_index(drop=True), sa.reset_index(drop=True))


def test_megatron_round_trip_figures(tmp_path):
    """The user's report: 32 steps of ~2.2 s (not one 70.86 s step) and 2,144 collective
    instances matched over its 4,224 communication ops, after the round trip."""
    src = ingest_cached(CASES["megatron-ST-8rank"])
    f = tmp_path / "m.json"
    write_chrome(src, f)
    ingest(f, tmp_path / "m.retime", progress=False)
    back = read_trace(tmp_path / "m.retime")
    w = step_windows(back)
    assert w["step"].nunique() == 32
    dur = (w["end_ns"] - w["start_ns"]).to_numpy()
    assert 2.0e9 < dur.min() and dur.max() < 2.4e9
    assert back.meta["collectives"]["matched"] == 2144
    assert int((back.ops["coll_id"] >= 0).sum()) == 4224


def test_an_older_export_still_reads(tmp_path):
    """A schema-2 export (no retimeExport tables) reads as before: ops and ranks."""
    src = ingest_cached(CASES["dlrm-v100-8rank"])
    f = tmp_path / "old.json"
    write_chrome(src, f)
    doc = json.loads(f.read_text())
    doc["retimeExport"] = {"schema_version": 2, "world_size": src.world_size}
    f.write_text(json.dumps(doc))
    ingest(f, tmp_path / "old.retime", progress=False)
    back = read_trace(tmp_path / "old.retime")
    assert len(back.ops) == len(src.ops) and back.world_size == src.world_size


@pytest.mark.parametrize("out", ["x.txt", "x.gz", "x.json.txt", "x"])
def test_chrome_refuses_what_ingest_would_not_read(out, tmp_path, capsys):
    src = ingest_cached(CASES["a100-ddp-nccl"]).save(tmp_path / "a.retime")
    assert run(["export", str(src), "--chrome", str(tmp_path / out)]) == 2
    err = capsys.readouterr().err
    assert ".json or .json.gz" in err and "Traceback" not in err
    assert not (tmp_path / out).exists()


def test_round_trip_keeps_the_memory_table(tmp_path):
    src = ingest_cached(SHARED / "kineto" / "v100-ddp-sgd")
    assert len(src.memory) > 0
    f = tmp_path / "v.json.gz"
    write_chrome(src, f)
    ingest(f, tmp_path / "v.retime", progress=False)
    back = read_trace(tmp_path / "v.retime")
    pd.testing.assert_frame_equal(back.memory.reset_index(drop=True),
                                  src.memory.reset_index(drop=True))


def test_an_export_is_ingested_alone(tmp_path, capsys):
    src = ingest_cached(CASES["a100-ddp-nccl"])
    d = tmp_path / "in"
    d.mkdir()
    write_chrome(src, d / "x.json")
    (d / "y.json").write_bytes(gzip.decompress(
        (CASES["a100-ddp-nccl"] / "nccl_data.json.gz").read_bytes()))
    assert run(["ingest", str(d), "-o", str(tmp_path / "o.retime")]) == 2
    err = capsys.readouterr().err
    assert "ingest it alone" in err and "Traceback" not in err
