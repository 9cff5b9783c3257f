"""Replay's memory at scale (issue 30): an identity replay reads only the columns it needs
and says up front what memory it will take; the rank-partitioned read, the rank-batched step
windows and the streamed coverage counts equal their whole-trace forms."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from conftest import SHARED, ingest_cached

from retime.analysis.coverage import unseen_work, unseen_work_by_rank
from retime.cli import run
from retime.collectors.enums import EdgeKind
from retime.collectors.errors import ReplayError
from retime.collectors.steps import step_range_mask, step_windows, step_windows_by_rank
from retime.collectors.trace import OPS_SCHEMA, read_trace
from retime.replay import build_graph, simulate
from retime.replay.footprint import (
    GRAPH_BYTES_PER_EDGE,
    GRAPH_BYTES_PER_OP,
    IDENTITY_COLUMNS,
    check_footprint,
    footprint,
)
from retime.replay.gaps import gap_shares


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    tr = ingest_cached(SHARED / "kineto" / "dlrm-v100-8rank")
    d = tmp_path_factory.mktemp("replay-memory")
    return tr, tr.save(d / "single.retime"), tr.save(d / "rank.retime", layout="rank")


def test_identity_replay_of_a_rank_store_equals_the_full_replay(stores, capsys):
    tr, single, rank = stores
    full = simulate(build_graph(tr)).summary()
    for path in (single, rank):
        assert run(["replay", str(path), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["memory"]["columns"] == "identity"
        for k in ("step_time_ns", "per_rank", "unexplained_delays", "graph", "gaps"):
            assert out[k] == full[k], k
        assert all(r["replayed_ns"] == r["measured_ns"] for r in out["per_rank"])
    # the full load (every column) prints the same figures and notes
    assert run(["replay", str(rank), "--json", "--all-columns"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["memory"]["columns"] == "all"
    assert whole["memory"]["estimated_peak_bytes"] > out["memory"]["estimated_peak_bytes"]
    for k in set(whole) - {"memory", "output"}:
        assert out[k] == whole[k], k


def test_projected_read_holds_only_the_columns_asked_for(stores):
    tr, single, rank = stores
    for path in (single, rank):
        t = read_trace(path, columns=list(IDENTITY_COLUMNS), fill_defaults=False,
                       skip=("memory",))
        assert list(t.ops.columns) == [c for c in OPS_SCHEMA if c in IDENTITY_COLUMNS]
        assert len(t.memory) == 0
        assert len(read_trace(path, skip=("ranges",)).ranges) == 0 < len(tr.ranges)
        for c in IDENTITY_COLUMNS:
            assert t.ops[c].dtype == np.dtype(OPS_SCHEMA[c][0])
            assert np.array_equal(t.ops[c].to_numpy(), tr.ops[c].to_numpy()), c
        pd.testing.assert_frame_equal(t.edges, tr.edges)
        pd.testing.assert_frame_equal(t.ranges, tr.ranges)


def test_footprint_counts_rows_from_metadata_and_refuses_what_does_not_fit(stores):
    tr, single, rank = stores
    for path in (single, rank):
        fp = footprint(path)
        assert (fp.ops, fp.edges, fp.ranges) == (len(tr.ops), len(tr.edges), len(tr.ranges))
        assert fp.graph_bytes == fp.ops * GRAPH_BYTES_PER_OP + fp.edges * GRAPH_BYTES_PER_EDGE
        # the graph's own arrays: within 10% of the estimate
        nb = build_graph(tr).nbytes
        assert abs(nb - fp.graph_bytes) < 0.1 * fp.graph_bytes, (nb, fp.graph_bytes)
        assert footprint(path, full=True).trace_bytes > fp.trace_bytes
        with pytest.raises(ReplayError, match=r"needs about .* GB, and 0\.0 GB is available"):
            check_footprint(path, available=1000)
        _, line = check_footprint(path, available=10**12)
        assert line.startswith(f"replay: {len(tr.ops):,} ops") and "1000.0 GB available" in line


def test_replay_says_what_memory_it_needs(stores, capsys):
    _, _, rank = stores
    assert run(["replay", str(rank)]) == 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert f"replay: {footprint(rank).ops:,} ops" in text and "needs about" in text


def test_rank_batched_step_windows_equal_the_whole(stores):
    tr, _, _ = stores
    r = simulate(build_graph(tr))
    rng = np.random.default_rng(3)
    s = r.start_ns + rng.integers(0, 5000, len(r.start_ns))
    e = s + (r.end_ns - r.start_ns)
    per_rank = int(np.bincount(tr.ops["rank"].to_numpy()).max())
    for chunk in (1, per_rank, 3 * per_rank):  # one rank, one or two, three per batch
        for a, b in ((r.start_ns, r.end_ns), (s, e)):
            pd.testing.assert_frame_equal(step_windows_by_rank(tr, a, b, chunk_ops=chunk),
                                          step_windows(tr, a, b))
        # the measured windows (what a what-if compares with), and a replayed trace's own
        pd.testing.assert_frame_equal(step_windows_by_rank(tr, chunk_ops=chunk),
                                      step_windows(tr))
        rt = r.to_trace()
        assert "step_windows" in rt.meta
        pd.testing.assert_frame_equal(step_windows_by_rank(rt, chunk_ops=chunk),
                                      step_windows(rt))
    assert (np.diff(tr.ops["rank"].to_numpy()) >= 0).all()  # so the batches did run


def test_rank_batched_unseen_work_equals_the_whole(stores):
    tr, _, _ = stores
    whole = unseen_work(tr)
    assert whole["gpu_ops"] > 0 and whole["launches"] > 0
    w = simulate(build_graph(tr)).step_windows()
    mw = pd.DataFrame({"rank": w["rank"].to_numpy(), "step": w["step"].to_numpy(),
                       "start_ns": w["measured_start_ns"].to_numpy(),
                       "end_ns": w["measured_end_ns"].to_numpy()})
    for chunk in (1, 10**9):
        assert unseen_work_by_rank(tr, chunk_ops=chunk) == whole
        assert unseen_work_by_rank(tr, mw, chunk_ops=chunk) == whole


def test_step_windows_read_only_the_profiler_step_ranges(stores):
    tr, _, _ = stores
    keep = step_range_mask(tr.ranges, tr.strings)
    assert 0 < keep.sum() < len(tr.ranges)
    names = np.asarray(tr.strings, dtype=object)[tr.ranges["name_id"].to_numpy()]
    assert all(n.startswith("ProfilerStep#") for n in names[keep])
    assert not any(n.startswith("ProfilerStep#") for n in names[~keep])
    few = dataclasses.replace(tr, ranges=tr.ranges[keep].reset_index(drop=True))
    r = simulate(build_graph(tr))
    for a, b in ((None, None), (r.start_ns + 7, r.end_ns + 7)):
        pd.testing.assert_frame_equal(step_windows(few, a, b), step_windows(tr, a, b))


def test_gap_shares_per_rank_equal_a_plain_sum(stores):
    tr, _, _ = stores
    g = build_graph(tr)
    out = gap_shares(g)
    rank = g.rank
    delay = g.measured_delay_ns
    # HOST_ORDER lags kept, by destination op (op ids), summed in a plain loop
    dst = np.repeat(np.arange(g.n_ops), np.diff(g.pred_ptr))
    work = np.zeros(g.n_ops, np.int64)
    for j in np.flatnonzero((g.pred_kind == EdgeKind.HOST_ORDER) & (g.pred_lag_ns > 0)
                            & ~g.pred_s2s).tolist():
        work[g.perm[dst[j]]] += int(g.pred_lag_ns[j])
    for row in out["per_rank"]:
        m = rank == row["rank"]
        assert row["span_ns"] == int(g.meas_end_ns[m].max() - g.meas_start_ns[m].min())
        assert row["unexplained_ns"] == int(delay[m].sum())
        assert row["host_work_ns"] == int(work[m].sum())
    assert sum(r["host_work_ns"] for r in out["per_rank"]) > 0
