"""Streamed analysis (analysis/stream.py) of stored traces: the results equal the in-memory
analysis on real shared traces (both layouts, batches cutting the ranks), `retime analyze`
(in process and as a subprocess), and a store of 1,024 ranks analyzed with memory bounded by
the batch, not the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from retime.analysis import breakdown, collectives, comm_summary, kernel_stats, rank_wait
from retime.analysis._util import step_windows
from retime.analysis.stream import (
    rank_batches,
    should_stream,
    store_analysis,
    stream_breakdown,
    stream_collectives,
    stream_comm_summary,
    stream_kernel_stats,
    stream_rank_wait,
    stream_step_times,
)
from retime.collectors.enums import LaneKind, OpKind
from retime.collectors.ingest import read
from retime.collectors.store import write_store_by_rank
from retime.collectors.trace import read_trace

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
DLRM = TRACES / "kineto" / "dlrm-v100-8rank"
REAL = [DLRM, TRACES / "kineto" / "mi300x-resnet-ddp", TRACES / "nsys" /
        "h100-2gpu-fastvideo.sqlite", TRACES / "oplevel" / "megatron-ST-8rank" /
        "trace-ST.parquet"]


def check_equal(p, tr, batch_rows):
    for by in ("step", "rank"):
        pd.testing.assert_frame_equal(stream_breakdown(p, by=by, batch_rows=batch_rows),
                                      breakdown(tr, by=by))
    w = step_windows(tr)
    w["step_ns"] = w["end_ns"] - w["start_ns"]
    pd.testing.assert_frame_equal(stream_step_times(p, batch_rows=batch_rows), w)
    for top in (5, None):
        a, b = stream_kernel_stats(p, top=top, batch_rows=batch_rows), kernel_stats(tr, top=top)
        pd.testing.assert_frame_equal(a.drop(columns="mean_ns"), b.drop(columns="mean_ns"))
        np.testing.assert_allclose(a["mean_ns"], b["mean_ns"], rtol=1e-12)
    pd.testing.assert_frame_equal(stream_collectives(p), collectives(tr))
    pd.testing.assert_frame_equal(stream_comm_summary(p), comm_summary(tr))
    pd.testing.assert_frame_equal(stream_rank_wait(p), rank_wait(tr))


@pytest.mark.parametrize("src", REAL, ids=lambda p: p.name)
def test_stream_equals_in_memory_on_real_traces(src, tmp_path):
    t = read(src)
    for layout in ("rank", "single") if src == DLRM else ("rank",):
        p = t.save(tmp_path / f"{layout}.retime", layout=layout)
        tr = read_trace(p)
        rows = tr.ops.groupby("rank").size()
        small = int(rows.min())  # about one rank per batch: batches cut the ranks
        assert len(rank_batches(p, batch_rows=small)) == len(rows)
        check_equal(p, tr, small)
    check_equal(p, tr, 1 << 30)  # one batch


def test_dlrm_figures_derived_independently(tmp_path):
    """The streamed breakdown's parts add up, and the top op's total equals the sum of that
    kernel's durations over every rank in the raw ops table."""
    t = read(DLRM)
    p = t.save(tmp_path / "d.retime", layout="rank")
    bd = stream_breakdown(p, batch_rows=2000)
    parts = ["compute_ns", "overlapped_comm_ns", "exposed_comm_ns", "memcpy_ns",
             "host_bound_ns", "idle_ns"]
    assert (bd[parts].sum(axis=1) == bd["step_ns"]).all() and set(bd["rank"]) == set(range(8))
    top = stream_kernel_stats(p, top=1, batch_rows=2000).iloc[0]
    names = t.names()
    gpu = np.isin(t.ops["lane"], t.lanes["lane"][t.lanes["lane_kind"] == LaneKind.GPU_STREAM])
    m = gpu & (names == top["name"])
    assert top["total_ns"] == t.ops["dur_ns"][m].sum() and top["count"] == m.sum()
    c = stream_collectives(p)
    comm = np.isin(t.ops["kind"], [OpKind.COLLECTIVE, OpKind.P2P])
    assert c["members"].sum() == comm.sum()


def test_analyze_cli(tmp_path, capsys):
    from retime.cli import run

    t = read(DLRM)
    part = t.save(tmp_path / "p.retime", layout="rank")
    single = t.save(tmp_path / "s.retime")
    assert should_stream(part) and not should_stream(single)
    out = {}
    for name, args in (("auto", [str(part)]), ("memory", [str(part), "--no-stream"]),
                       ("stream1", [str(single), "--stream", "--batch-rows", "1000"])):
        assert run(["analyze", *args, "--json", "--top", "5"]) == 0
        out[name] = json.loads(capsys.readouterr().out)
    assert out["auto"]["mode"] == "stream" and out["memory"]["mode"] == "memory"
    for k in ("step_time_ns", "per_rank", "breakdown", "comm", "rank_wait"):
        assert out["auto"][k] == out["memory"][k] == out["stream1"][k], k
    assert [r["name"] for r in out["auto"]["top_ops"]] == \
        [r["name"] for r in out["memory"]["top_ops"]]
    bd = breakdown(t)
    assert out["auto"]["breakdown"]["total_ns"]["idle_ns"] == int(bd["idle_ns"].sum())
    assert out["auto"]["ranks"] == 8 and len(out["auto"]["top_ops"]) == 5
    # human output and the real console entry point
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "retime", "analyze", str(part), "--top", "3"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "8 rank(s), analyzed streamed" in proc.stdout and "top 3 ops" in proc.stdout
    assert run(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not a retime trace directory" in err and len(err.strip().splitlines()) == 1


# -- scale: 1,024 ranks, memory bounded by the batch --------------------------------------
R, K, L = 1024, 640, 3  # ranks, ops per rank, lanes per rank (CPU thread + 2 streams)
PER_LANE = (160, 440, 40)  # host ops, kernels, all-reduces per rank
B = 40_000  # ops per batch of ranks


def _rank(r: int) -> dict[str, dict[str, np.ndarray]]:  # noqa: D401
    """Rank r of a synthetic run: a CPU thread launching kernels on a compute stream and
    all-reduces on a comm stream, 4 steps, collectives shared by every rank."""
    rng = np.random.default_rng(r)
    lane = np.repeat(np.arange(L, dtype=np.int32), PER_LANE) + r * L
    kind = np.where(lane == r * L, int(OpKind.CPU_OP),
                    np.where(lane == r * L + 1, int(OpKind.KERNEL), int(OpKind.COLLECTIVE)))
    dur = rng.integers(2_000, 40_000, K)
    gap = rng.integers(0, 5_000, K)
    start = np.zeros(K, np.int64)
    for ln in range(L):
        m = lane == r * L + ln
        start[m] = np.cumsum(dur[m] + gap[m]) - dur[m] + ln * 1_000 + r * 50
    step = np.concatenate([np.arange(n) * 4 // n for n in PER_LANE])
    is_c = kind == int(OpKind.COLLECTIVE)
    coll = np.where(is_c, np.cumsum(is_c) - 1, -1)
    return {"ops": {"op_id": np.arange(r * K, (r + 1) * K, dtype=np.int64),
                    "rank": np.full(K, r, np.int32), "lane": lane, "kind": kind.astype(np.int8),
                    "name_id": rng.integers(0, 6, K).astype(np.int32) + 6 * is_c,
                    "start_ns": start, "dur_ns": dur, "step": step.astype(np.int32), "coll_id": coll,
                    "comm_op": np.where(is_c, 1, 0).astype(np.int8),
                    "group_id": np.where(is_c, 0, -1).astype(np.int32),
                    "bytes": np.where(is_c, 1 << 22, 0)}}


@pytest.fixture(scope="module")
def scale_store(tmp_path_factory):
    p = tmp_path_factory.mktemp("scale") / "scale.retime"
    lanes = pd.DataFrame({"lane": np.arange(R * L, dtype=np.int32),
                          "rank": np.repeat(np.arange(R, dtype=np.int32), L),
                          "lane_kind": np.tile([int(LaneKind.CPU_THREAD), int(LaneKind.GPU_STREAM),
                                                int(LaneKind.GPU_STREAM)], R).astype(np.int8)})
    groups = pd.DataFrame({"group_id": [0], "name": ["0:default_pg"], "ranks": [list(range(R))]})
    strings = [f"kernel_{i}" for i in range(6)] + [f"ncclAllReduce_{i}" for i in range(6)]
    write_store_by_rank(p, ((r, _rank(r)) for r in range(R)),
                        lanes=lanes, groups=groups, strings=strings, meta={"world_size": R})
    return p


def test_scale_store_streamed_with_bounded_memory(scale_store):
    """1,024 ranks x 640 ops: the streamed analysis (batches of ~40k ops) allocates a small
    fraction of what the loaded ops table alone takes (numpy/pandas via tracemalloc, Arrow via
    its memory pool), and its results equal the in-memory analysis. What remains is mostly
    the collective statistics, which hold the communication ops (6% of the ops here)."""
    p = scale_store
    assert len(rank_batches(p, batch_rows=B)) == -(-R // (B // K))  # 62 ranks each
    # measured in a fresh process: tracemalloc and Arrow's pool are process-wide, and other
    # tests' threads and allocations would be counted too
    code = f"""
import gc, json, sys, tracemalloc
import pyarrow as pa
sys.path.insert(0, {str(ROOT)!r})
from retime.analysis.stream import store_analysis, stream_step_times
stream_step_times({str(p)!r}, batch_rows={B})  # warm-up: numba kernels, lazy imports
pool = pa.default_memory_pool()
before = pool.max_memory()  # Arrow's high-water mark is checked over both analyses
store_analysis({str(p)!r}, stream=True, batch_rows={B}, top=5)
gc.collect()
tracemalloc.start()
store_analysis({str(p)!r}, stream=True, batch_rows={B}, top=5)
_, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
print(json.dumps({{"py_peak": peak, "arrow_before": before, "arrow_peak": pool.max_memory()}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True)
    m = json.loads(out.stdout.strip().splitlines()[-1])
    py_peak, arrow_before, arrow_peak = m["py_peak"], m["arrow_before"], m["arrow_peak"]
    res = store_analysis(p, stream=True, batch_rows=B, top=5)
    tr = read_trace(p)  # the whole store, for reference (after the measurement)
    whole = int(tr.ops.memory_usage(index=False).sum())
    assert whole > 60 * 2**20
    assert py_peak < whole / 4, (py_peak, whole)
    print(f"streamed peak {py_peak / 2**20:.1f} MiB (numpy/pandas), Arrow +{(arrow_peak - arrow_before) / 2**20:.1f} MiB; ops table {whole / 2**20:.1f} MiB")
    assert arrow_peak < max(arrow_before, 1) + whole / 4, (arrow_peak, arrow_before, whole)
    ref = store_analysis(p, stream=False, top=5)
    for k in ("step_times", "breakdown", "comm", "rank_wait", "breakdown_summary"):
        pd.testing.assert_frame_equal(res[k], ref[k], obj=k)
    pd.testing.assert_frame_equal(res["top_ops"].drop(columns="mean_ns"),
                                  ref["top_ops"].drop(columns="mean_ns"))
    assert len(res["breakdown"]) == R * 4 and res["comm"]["instances"].sum() == PER_LANE[2]
    assert res["rank_wait"]["collectives"].sum() == R * PER_LANE[2]
