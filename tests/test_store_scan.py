"""Lazy scans of a stored trace (collectors/store.py): a 2,048-rank store and the real DLRM
store; every scan equals the same computation on the fully loaded trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from retime.collectors.errors import TraceFormatError
from retime.collectors.ingest import read
from retime.collectors.store import iter_ops, op_totals, rank_spans, scan_ops
from retime.collectors.trace import Trace, read_trace

ROOT = Path(__file__).resolve().parents[1]
DLRM = ROOT.parent / "shared" / "traces" / "kineto" / "dlrm-v100-8rank"


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    """2,048 ranks x 2 lanes x 60 ops, random durations and kinds, rank-major rows."""
    rng = np.random.default_rng(7)
    R, L, K = 2048, 2, 30
    n = R * L * K
    rank = np.repeat(np.arange(R, dtype=np.int32), L * K)
    lane = (rank * L + np.tile(np.repeat(np.arange(L), K), R)).astype(np.int32)
    dur = rng.integers(1_000, 50_000, n)
    start = (np.cumsum(dur.reshape(R * L, K) + rng.integers(0, 9_000, (R * L, K)), axis=1)
             - dur.reshape(R * L, K)).ravel() + rng.integers(0, 10**6, R * L).repeat(K)
    t = Trace.build(
        ops={"rank": rank, "lane": lane, "kind": rng.choice([0, 3, 5], n).astype(np.int8),
             "name_id": rng.integers(0, 5, n).astype(np.int32), "start_ns": start,
             "dur_ns": dur, "step": rng.integers(0, 3, n).astype(np.int32),
             "bytes": rng.integers(0, 1 << 20, n), "flops": rng.random(n) * 1e9},
        lanes={"lane": np.arange(R * L, dtype=np.int32),
               "rank": np.repeat(np.arange(R, dtype=np.int32), L),
               "lane_kind": np.ones(R * L, np.int8)},
        strings=[f"op{i}" for i in range(5)], meta={"world_size": R})
    p = tmp_path_factory.mktemp("store") / "big.retime"
    t.save(p)
    return p, t


def test_scan_selected_ranks_and_columns(big_store):
    p, t = big_store
    want = [5, 6, 7, 1999]
    df = scan_ops(p, ranks=want, columns=["op_id", "rank", "start_ns", "dur_ns"])
    ref = t.ops[t.ops["rank"].isin(want)][["op_id", "rank", "start_ns", "dur_ns"]]
    pd.testing.assert_frame_equal(df.reset_index(drop=True), ref.reset_index(drop=True))
    assert sorted(df["rank"].unique()) == want
    one = scan_ops(p, ranks=range(100, 104))  # contiguous range filter, every column
    assert len(one) == 4 * 2 * 30 and list(one.columns) == list(t.ops.columns)
    assert one["rank"].dtype == np.int32 and one["flops"].dtype == np.float64


def test_streaming_aggregations_equal_the_loaded_trace(big_store):
    p, t = big_store
    spans = rank_spans(p, batch_rows=50_000)  # many batches, ranks cut across them
    pd.testing.assert_frame_equal(spans, t.step_times_ns().astype(spans.dtypes.to_dict()))
    tot = op_totals(p, by=["rank", "kind"], batch_rows=33_333)
    ref = t.ops.groupby(["rank", "kind"]).agg(ops=("dur_ns", "size"), dur_ns=("dur_ns", "sum"),
                                              bytes=("bytes", "sum"), flops=("flops", "sum"))
    ref = ref.reset_index()
    assert len(tot) == len(ref)
    np.testing.assert_array_equal(tot["ops"].to_numpy(), ref["ops"].to_numpy())
    np.testing.assert_array_equal(tot["dur_ns"].to_numpy(), ref["dur_ns"].to_numpy())
    np.testing.assert_array_equal(tot["bytes"].to_numpy(), ref["bytes"].to_numpy())
    np.testing.assert_allclose(tot["flops"].to_numpy(), ref["flops"].to_numpy(), rtol=1e-12)
    n = sum(len(b) for b in iter_ops(p, columns=["rank"], batch_rows=10_000))
    assert n == t.n_ops


def test_scans_of_the_real_dlrm_store(tmp_path):
    t = read(DLRM)
    p = t.save(tmp_path / "dlrm.retime")
    pd.testing.assert_frame_equal(rank_spans(p), read_trace(p).step_times_ns()
                                  .astype({"rank": np.int32}))
    r3 = scan_ops(p, ranks=[3])
    pd.testing.assert_frame_equal(r3.reset_index(drop=True),
                                  t.ops[t.ops["rank"] == 3].reset_index(drop=True))
    tot = op_totals(p, by=["kind"])
    assert tot["ops"].sum() == t.n_ops
    assert dict(zip(tot["kind"], tot["ops"], strict=True)) == \
        t.ops["kind"].value_counts().to_dict()


def test_scan_errors(tmp_path, big_store):
    with pytest.raises(TraceFormatError, match="not a retime trace directory"):
        scan_ops(tmp_path)
    with pytest.raises(TraceFormatError, match="no column"):
        scan_ops(big_store[0], columns=["rank", "nosuch"])
