"""Kineto ingest on the real shared traces: accounting, ops, edges, collectives, attribution.

Expected values are derived independently from the raw JSON with the standard library.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import KINETO, ingest_cached, kineto_trace_files

from retime.collectors import (
    CommOp,
    EdgeKind,
    LaneKind,
    OpKind,
    Phase,
    TraceFormatError,
    read_trace,
)
from retime.collectors.ingest import read
from retime.collectors.kineto import read_kineto

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def raw_events(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


FILES = kineto_trace_files()


def test_all_shared_kineto_files_found():
    assert len(FILES) >= 12  # 8 dlrm + a100 x3 + gloo + edge x3 + vgg + mi300x + v100


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.name[:24]}" for p in FILES])
def test_accounting_every_event(path):
    """events_read == kept + dropped, and equals the raw count from plain json."""
    t = ingest_cached(path)
    ev = raw_events(path)
    acc = t.meta["accounting"][str(path)]
    assert acc["events_read"] == len(ev)
    assert sum(acc["kept"].values()) + sum(acc["dropped"].values()) == len(ev)
    # GPU ops: one op per kernel/memcpy/memset event
    n_gpu = sum(1 for e in ev if e.get("ph") == "X" and e.get("cat") in GPU_CATS)
    gpu_kinds = [OpKind.KERNEL, OpKind.MEMCPY, OpKind.MEMSET, OpKind.COLLECTIVE, OpKind.P2P]
    gl = t.lanes.set_index("lane")["lane_kind"]
    on_gpu = gl.reindex(t.ops["lane"]).to_numpy() == LaneKind.GPU_STREAM
    assert int(on_gpu.sum()) == n_gpu
    assert np.isin(t.ops["kind"].to_numpy()[on_gpu], gpu_kinds).all()
    # runtime calls: every cuda_runtime event is a RUNTIME op
    n_rt = sum(1 for e in ev if e.get("ph") == "X" and e.get("cat") == "cuda_runtime")
    assert int((t.ops["kind"] == OpKind.RUNTIME).sum()) == n_rt
    # memory events
    n_mem = sum(1 for e in ev if e.get("ph") in ("i", "I") and e.get("name") == "[memory]")
    assert len(t.memory) == n_mem


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.name[:24]}" for p in FILES])
def test_launch_edges_follow_correlation(path):
    t = ingest_cached(path)
    ev = raw_events(path)
    rt_corr = {e["args"]["correlation"] for e in ev
               if e.get("ph") == "X" and e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    expected = sum(1 for e in ev if e.get("ph") == "X" and e.get("cat") in GPU_CATS
                   and e.get("args", {}).get("correlation") in rt_corr)
    e = t.edges
    launch = e[e["kind"] == EdgeKind.LAUNCH]
    assert len(launch) == expected
    o = t.ops
    src, dst = launch["src"].to_numpy(), launch["dst"].to_numpy()
    assert (o["correlation"].to_numpy()[src] == o["correlation"].to_numpy()[dst]).all()
    assert (o["kind"].to_numpy()[src] == OpKind.RUNTIME).all()
    # lag never lets an identity replay start a kernel later than measured
    end = o["start_ns"].to_numpy() + o["dur_ns"].to_numpy()
    assert (end[src] + launch["lag_ns"].to_numpy() <= o["start_ns"].to_numpy()[dst]).all()


def test_edges_consistent_with_measured_times():
    """No inferred edge contradicts the measured timeline (dst.start >= src.end + lag)."""
    for path in FILES:
        t = ingest_cached(path)
        o, e = t.ops, t.edges
        end = o["start_ns"].to_numpy() + o["dur_ns"].to_numpy()
        s, d = e["src"].to_numpy(), e["dst"].to_numpy()
        assert (end[s] + e["lag_ns"].to_numpy() <= o["start_ns"].to_numpy()[d]).all(), path


def test_dlrm_every_nccl_kernel_in_an_8_rank_instance(dlrm_trace):
    t = dlrm_trace
    assert list(t.ranks) == list(range(8))
    expected = Counter()
    for f in sorted((KINETO / "dlrm-v100-8rank").glob("*.json.gz")):
        for e in raw_events(f):
            if e.get("cat") == "kernel" and e["name"].startswith("nccl"):
                expected[e["name"].split("_")[1]] += 1
    o = t.ops
    comm = o[o["kind"] == OpKind.COLLECTIVE]
    assert len(comm) == sum(expected.values()) == 64
    assert (comm["coll_id"] >= 0).all()
    members = comm.groupby("coll_id")["rank"].agg(["size", "nunique"])
    assert len(members) == 8
    assert (members["size"] == 8).all() and (members["nunique"] == 8).all()
    assert t.meta["collectives"]["matched"] == 8 and t.meta["collectives"]["unmatched"] == 0
    ops = Counter(CommOp(c).name for c in comm["comm_op"])
    # SendRecv kernels launched under nccl:all_to_all are all-to-alls
    assert ops == {"ALL_TO_ALL": expected["SendRecv"], "ALL_REDUCE": expected["AllReduce"]}
    # members of an instance agree on the type
    assert (comm.groupby("coll_id")["comm_op"].nunique() == 1).all()


def test_timestamps_relative_and_absolute():
    # relative to baseTimeNanoseconds
    p = KINETO / "a100-ddp-nccl" / "nccl_data.json.gz"
    with gzip.open(p, "rt") as fh:
        doc = json.load(fh)
    base = doc["baseTimeNanoseconds"]
    k = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    t = ingest_cached(p)
    assert (np.abs(t.ops["start_ns"].to_numpy() - (base + round(k["ts"] * 1000))) <= 1).any()
    assert t.ops["start_ns"].min() > base
    # absolute epoch microseconds
    p2 = KINETO / "dlrm-v100-8rank" / "worker0_step_12.1694128201545.pt.trace.json.gz"
    k2 = next(e for e in raw_events(p2) if e.get("cat") == "kernel")
    t2 = read_kineto([p2])
    assert int(k2["ts"]) * 1000 in set(t2.ops["start_ns"].tolist())


def test_steps_phases_and_memory_v100():
    t = ingest_cached(KINETO / "v100-ddp-sgd" / "df_index_resolver.json.gz")
    steps = set(t.ops["step"].tolist()) - {-1}
    assert steps == {2, 3, 4, 5, 6}
    phases = Counter(Phase(p).name for p in t.ops["phase"])
    assert phases["BWD"] > 0 and phases["OPT"] > 0
    # optimizer kernels are launched from inside Optimizer.step
    o = t.ops_frame()
    assert (o.loc[o["phase"] == Phase.OPT, "kind"] == OpKind.KERNEL).any()
    assert len(t.memory) == 28010
    assert t.meta["world_size"] == 2 and list(t.ranks) == [1]


def test_rocm_and_gloo():
    t = ingest_cached(KINETO / "mi300x-resnet-ddp" / "resnet_act_checkpoint.json.gz")
    comm = t.ops[t.ops["kind"] == OpKind.COLLECTIVE]
    assert len(comm) == 17  # ncclDevKernel_Generic kernels (RCCL)
    assert t.meta["devices"]["0"]["2"]["name"] == "AMD Instinct MI300X"
    assert t.meta["devices"]["0"]["2"]["peak_flops"] > 1e15
    g = ingest_cached(KINETO / "cpu-gloo-rank34" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    assert list(g.ranks) == [34] and g.world_size == 300
    gl = g.ops[g.ops["kind"] == OpKind.COLLECTIVE]
    assert len(gl) == 10 and set(gl["comm_op"]) == {CommOp.ALL_REDUCE}
    assert set(gl["bytes"]) == {321271 * 4, 2082411 * 4}
    # partial instance (1 of 300 ranks): kept with a coll_id, counted unmatched with the reason
    assert (gl["coll_id"] >= 0).all()
    assert g.meta["collectives"]["unmatched"] == 10
    assert "ranks missing" in next(iter(g.meta["collectives"]["unmatched_reasons"]))


def test_cuda_event_sync_edges():
    t = ingest_cached(KINETO / "a100-event-sync" / "multi_stream.json.gz")
    sync = t.edges[t.edges["kind"] == EdgeKind.SYNC]
    assert len(sync) >= 2
    o = t.ops
    lanes = o["lane"].to_numpy()
    # a Stream Wait Event links ops on two different GPU streams
    cross = sync[lanes[sync["src"]] != lanes[sync["dst"]]]
    assert len(cross) >= 1


def test_host_nesting_leaves_are_ops_and_containers_ranges():
    t = ingest_cached(KINETO / "h100-vgg13" / "profiler_vgg13-iter41.json.gz")
    o = t.ops
    # ops on one CPU thread never overlap (leaves of the nesting)
    host = o[o["kind"].isin([OpKind.CPU_OP, OpKind.RUNTIME])].sort_values(["lane", "start_ns"])
    end = (host["start_ns"] + host["dur_ns"]).to_numpy()
    same = host["lane"].to_numpy()[1:] == host["lane"].to_numpy()[:-1]
    assert (host["start_ns"].to_numpy()[1:][same] >= end[:-1][same]).all()
    assert (t.ranges["depth"] >= 0).all() and len(t.ranges) > 0


def test_folder_skips_execution_traces():
    t = read([KINETO / "h100-vgg13"])
    assert any("graph_vgg13" in k for k in t.meta["skipped_files"])
    with pytest.raises(TraceFormatError, match="execution trace"):
        read([KINETO / "dlrm-v100-8rank-et"])


def test_duplicate_ranks_name_both_files():
    with pytest.raises(TraceFormatError) as ei:
        read([KINETO / "edge-cases"])
    msg = str(ei.value)
    assert "rank 0" in msg and "distributed_info_not_found" in msg and "rank_non_gpu" in msg


def test_rank_from_file_name(tmp_path):
    src = KINETO / "edge-cases" / "distributed_info_not_found.json.gz"
    for r in (3, 5):
        (tmp_path / f"rank-{r}.json.gz").write_bytes(src.read_bytes())
    t = read([tmp_path])
    assert list(t.ranks) == [3, 5]
    assert {s["rank_source"] for s in t.meta["sources"]} == {"file name"}


def test_save_read_roundtrip(tmp_path, dlrm_trace):
    p = dlrm_trace.save(tmp_path / "d.retime")
    t2 = read_trace(p)
    for name in ("ops", "lanes", "edges", "ranges", "memory"):
        a, b = getattr(dlrm_trace, name), getattr(t2, name)
        assert list(a.columns) == list(b.columns)
        for c in a.columns:
            assert np.array_equal(a[c].to_numpy(), b[c].to_numpy(), equal_nan=a[c].dtype.kind == "f"), (name, c)
    assert t2.strings == dlrm_trace.strings
    assert t2.meta["accounting"] == dlrm_trace.meta["accounting"]
    assert t2.groups["ranks"].tolist() == dlrm_trace.groups["ranks"].tolist()
    cat = t2.ops_frame()["name"]
    assert str(cat.dtype) == "category" and cat.iloc[0] == t2.strings[t2.ops["name_id"].iloc[0]]


def test_parallel_jobs_identical(dlrm_trace):
    t2 = read_kineto([KINETO / "dlrm-v100-8rank"], jobs=2)
    pd.testing.assert_frame_equal(t2.ops, dlrm_trace.ops)
    pd.testing.assert_frame_equal(t2.edges, dlrm_trace.edges)
    assert t2.meta["collectives"] == dlrm_trace.meta["collectives"]


def test_nccl_kernels_wait_on_compute_stream(dlrm_trace):
    """Without cuda_sync events, cudaStreamWaitEvent still orders each NCCL kernel after the
    compute-stream op issued before the wait (DDP's NCCL stream waits on compute)."""
    o, e = dlrm_trace.ops, dlrm_trace.edges
    coll = set(o.index[o["kind"] == OpKind.COLLECTIVE])
    sync = e[(e["kind"] == EdgeKind.SYNC) & e["dst"].isin(coll)]
    assert set(sync["dst"]) == coll
    lanes = o["lane"].to_numpy()
    assert (lanes[sync["src"]] != lanes[sync["dst"]]).all()
    assert np.isin(o["kind"].to_numpy()[sync["src"]], [OpKind.KERNEL, OpKind.MEMCPY]).all()


def test_piecewise_decoding_is_identical(monkeypatch):
    """Large files are decoded in pieces; the Trace must not depend on the piece size."""
    import retime.collectors.kineto.events as kev
    import retime.collectors.kineto.reader as kin

    paths = [KINETO / "v100-ddp-sgd" / "df_index_resolver.json.gz", KINETO / "dlrm-v100-8rank"]
    for p in paths:
        monkeypatch.setattr(kin, "CHUNKED_MIN_BYTES", 1 << 62)
        whole = read_kineto([p])
        monkeypatch.setattr(kin, "CHUNKED_MIN_BYTES", 1)
        monkeypatch.setattr(kev, "PIECE_BYTES", 1 << 16)
        pieces = read_kineto([p])
        for name in ("ops", "edges", "ranges", "memory"):
            pd.testing.assert_frame_equal(getattr(whole, name), getattr(pieces, name))
        assert whole.strings == pieces.strings
        assert whole.meta["accounting"] == pieces.meta["accounting"]
        assert whole.meta["collectives"] == pieces.meta["collectives"]


def test_piecewise_error_names_the_global_event_index(monkeypatch, tmp_path):
    import retime.collectors.kineto.events as kev
    import retime.collectors.kineto.reader as kin

    evs = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": float(i), "dur": 0.5}
           for i in range(3000)]
    evs[2500]["ts"] = "later"
    f = tmp_path / "big.json"
    f.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": evs}))
    monkeypatch.setattr(kin, "CHUNKED_MIN_BYTES", 1)
    monkeypatch.setattr(kev, "PIECE_BYTES", 4096)
    with pytest.raises(TraceFormatError, match=r"event 2500: field 'ts'"):
        read_kineto([f])


def test_merge_groups_from_comm_ops_in_order_of_appearance():
    """Groups that only the collective ops name get ids in order of first appearance (ranks
    in order, then ops), their ranks from that first op's record (else its size, else the
    world), and every collective/p2p op the id of its group's name."""
    from retime.collectors.kineto import merge_parts, parse_kineto_file

    files = sorted((KINETO / "dlrm-v100-8rank").glob("*.json*"))[:3]
    parts = [parse_kineto_file(f) for f in files]
    seen = []  # reference: (name, ranks) in order of first appearance
    world = max(max(p.world_size or 0, p.rank + 1) for p in parts)
    for p in sorted(parts, key=lambda p: p.rank):
        k = len(p.comm["op"])
        assert k >= 3
        names = [f"g{(p.rank + j) % 3}" for j in range(k)]
        sizes = np.where(np.arange(k) % 4 == 0, 2, -1).astype(np.int64)
        ranks = [[p.rank, 9] if j == 1 else None for j in range(k)]
        p.comm.update(group=names, group_size=sizes, pg_ranks=ranks)
        p.pg_config = []
        for j, g in enumerate(names):
            if g not in [s[0] for s in seen]:
                want = ranks[j] if ranks[j] else list(range(sizes[j] if sizes[j] > 0 else world))
                seen.append((g, list(want)))
    t = merge_parts(parts)
    grp = t.groups
    got = list(zip(list(grp["name"]), [list(r) for r in grp["ranks"]], strict=True))
    assert got[0][0].startswith("0") and got[1:] == seen
    gid = t.ops["group_id"].to_numpy()
    comm = gid >= 0
    name_of = np.asarray(list(grp["name"]), object)
    flat_names = [n for p in sorted(parts, key=lambda p: p.rank) for n in p.comm["group"]]
    assert list(name_of[gid[comm]]) == flat_names
