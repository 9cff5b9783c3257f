"""Nsight Systems SQLite reader: counts checked against plain SQL on the real export."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from retime.cli import run
from retime.collectors.enums import CommOp, EdgeKind, LaneKind, OpKind
from retime.collectors.errors import TraceFormatError
from retime.collectors.nsys import read_nsys
from retime.collectors.trace import read_trace

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
NSYS = TRACES / "nsys" / "h100-2gpu-fastvideo.sqlite"
GPU_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
              "CUPTI_ACTIVITY_KIND_MEMSET")


def sql(q: str, path: Path = NSYS) -> list[tuple]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return con.execute(q).fetchall()


@pytest.fixture(scope="module")
def trace():
    return read_nsys(NSYS, progress=False)


def test_ranks_are_process_device_pairs(trace):
    pairs = sql(" union ".join(f"select distinct globalPid, deviceId from {t}" for t in GPU_TABLES)
                + " order by 2, 1")
    assert list(trace.ranks) == list(range(len(pairs))) == [0, 1]
    assert trace.meta["world_size"] == 2
    for rank, (gpid, dev) in enumerate(pairs):
        d = trace.meta["devices"][str(rank)][str(dev)]
        assert d["pid"] == (gpid >> 24) & 0xFFFFFF
        for t, kinds in (("CUPTI_ACTIVITY_KIND_KERNEL", (OpKind.KERNEL, OpKind.COLLECTIVE)),
                         ("CUPTI_ACTIVITY_KIND_MEMCPY", (OpKind.MEMCPY,)),
                         ("CUPTI_ACTIVITY_KIND_MEMSET", (OpKind.MEMSET,))):
            (n, total, first), = sql(f"select count(*), sum(end - start), min(start) from {t} "
                                     f"where globalPid = {gpid} and deviceId = {dev}")
            o = trace.ops[(trace.ops["rank"] == rank) & trace.ops["kind"].isin([int(k) for k in kinds])]
            assert len(o) == n
            assert int(o["dur_ns"].sum()) == total  # exact integer ns
            assert int(o["start_ns"].min()) == first


def test_runtime_ranges_and_lanes(trace):
    (n_rt,), = sql("select count(*) from CUPTI_ACTIVITY_KIND_RUNTIME where (globalTid & ~16777215) "
                   "in (select globalPid from CUPTI_ACTIVITY_KIND_KERNEL)")
    assert (trace.ops["kind"] == OpKind.RUNTIME).sum() == n_rt == 7466
    (n_nv,), = sql("select count(*) from NVTX_EVENTS where eventType in (59, 60) and end >= start")
    assert len(trace.ranges) == n_nv
    threads = sql("select count(distinct globalTid) from CUPTI_ACTIVITY_KIND_RUNTIME")[0][0]
    lk = trace.lanes["lane_kind"].to_numpy()
    assert (lk == LaneKind.CPU_THREAD).sum() == threads
    streams = sql(" union ".join(f"select distinct globalPid, deviceId, streamId from {t}"
                                 for t in GPU_TABLES))
    assert (lk == LaneKind.GPU_STREAM).sum() == len(streams)
    gl = trace.lanes[lk == LaneKind.GPU_STREAM]
    assert sorted(gl["native_id"]) == sorted(s[2] for s in streams)
    # runtime names lose their _vNNNN suffix, like Kineto's
    names = set(trace.names()[trace.ops["kind"].to_numpy() == OpKind.RUNTIME])
    assert "cudaLaunchKernel" in names and not any(n.endswith("_v7000") for n in names)


def test_nvtx_names(trace):
    names = np.asarray(trace.strings, dtype=object)[trace.ranges["name_id"].to_numpy()]
    # registered strings (textId) resolve through StringIds
    (n_send,), = sql("select count(*) from NVTX_EVENTS e join StringIds s on s.id = e.textId "
                     "where s.value = 'ncclSend'")
    assert (names == "ncclSend").sum() == n_send == 132
    # torch emit_nvtx labels "op, op_id = N" keep the op name, like Kineto's names
    (n_a2a,), = sql("select count(*) from NVTX_EVENTS where text like 'nccl:all_to_all, op_id = %'")
    assert (names == "nccl:all_to_all").sum() == n_a2a > 0
    assert not any(", op_id = " in n for n in names)
    assert len(set(trace.strings)) == len(trace.strings)


def test_nvtx_depth_matches_a_stack_walk(trace):
    rows = sql("select globalTid, start, end from NVTX_EVENTS where eventType = 59 "
               "order by globalTid, start, end desc")
    expect = {}
    stack: list[int] = []
    cur = None
    for tid, s, e in rows:
        if tid != cur:
            stack, cur = [], tid
        while stack and stack[-1] <= s:
            stack.pop()
        expect[(tid & 0xFFFFFF, s, e)] = len(stack)
        stack.append(e)
    r = trace.ranges
    tid = trace.lanes.set_index("lane")["native_id"].reindex(r["lane"]).to_numpy()
    got = {(int(t), int(s), int(e)): int(d) for t, s, e, d in
           zip(tid, r["start_ns"], r["end_ns"], r["depth"], strict=True)}
    assert got == expect
    assert max(expect.values()) >= 3


def test_edges_against_sql(trace):
    e = trace.edges
    k = e["kind"].to_numpy()
    counts = [f"(select count(*) from {t} g join CUPTI_ACTIVITY_KIND_RUNTIME r on "
              f"r.correlationId = g.correlationId and (r.globalTid & ~16777215) = g.globalPid)"
              for t in GPU_TABLES]
    (n_launch,), = sql("select " + " + ".join(counts))
    assert (k == EdgeKind.LAUNCH).sum() == n_launch
    (n_rt,), = sql("select count(*) from CUPTI_ACTIVITY_KIND_RUNTIME")
    (n_thr,), = sql("select count(distinct globalTid) from CUPTI_ACTIVITY_KIND_RUNTIME")
    assert (k == EdgeKind.HOST_ORDER).sum() == n_rt - n_thr
    # 33 cudaStreamSynchronize calls, each followed by another call on its thread
    (n_ss,), = sql("select count(*) from CUPTI_ACTIVITY_KIND_SYNCHRONIZATION where syncType = 3")
    assert (k == EdgeKind.SYNC).sum() == n_ss == 33
    # every edge is consistent with the measured times: identity replay keeps them
    o = trace.ops
    st, en = o["start_ns"].to_numpy(), (o["start_ns"] + o["dur_ns"]).to_numpy()
    s, d, lag = e["src"].to_numpy(), e["dst"].to_numpy(), e["lag_ns"].to_numpy()
    assert (st[d] >= en[s] + lag).all()
    assert (lag[k == EdgeKind.LAUNCH] <= 0).all() and (lag[k == EdgeKind.HOST_ORDER] >= 0).all()
    kinds = o["kind"].to_numpy()
    assert (kinds[s[k == EdgeKind.LAUNCH]] == OpKind.RUNTIME).all()
    assert (kinds[d[k == EdgeKind.SYNC]] == OpKind.RUNTIME).all()
    assert (kinds[s[k == EdgeKind.SYNC]] != OpKind.RUNTIME).all()


def test_nccl_collectives_matched(trace):
    rows = sql("select globalPid, count(*) from CUPTI_ACTIVITY_KIND_KERNEL k join StringIds s "
               "on s.id = k.demangledName where s.value like 'ncclDevKernel_SendRecv%' group by 1")
    assert [n for _, n in rows] == [33, 33]
    c = trace.ops[trace.ops["kind"] == OpKind.COLLECTIVE]
    # 32 per rank run c10d::alltoall_base_ (> nccl:all_to_all, their NVTX range): all-to-alls;
    # the first of each rank, launched before the capture, takes its 32 peers' label
    # (tests/test_comm_labels.py recounts both)
    assert len(c) == 66 and (c["comm_op"] == CommOp.ALL_TO_ALL).sum() == 66
    per = c.groupby("coll_id")["rank"].agg(sorted)
    assert len(per) == 33 and all(r == [0, 1] for r in per)
    assert (c.groupby("coll_id")["comm_op"].nunique() == 1).all()
    assert trace.meta["collectives"] == {"matched": 33, "unmatched": 0, "unmatched_reasons": {},
                                         "ops_matched": 66, "ops_unmatched": 0,
                                         "primitive_from_nvtx": 64,
                                         "primitive_from_peers": 2}
    assert list(trace.groups["ranks"].iloc[0]) == [0, 1]
    # instance k is the k-th SendRecv on each rank
    for cid in (0, 17, 32):
        m = c[c["coll_id"] == cid]
        ks = [int((c[(c["rank"] == r)]["start_ns"] < s).sum()) for r, s in
              zip(m["rank"], m["start_ns"], strict=True)]
        assert ks == [cid, cid]


def test_accounting_covers_every_row(trace):
    acc = trace.meta["accounting"][str(NSYS)]
    tables = ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
              "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS",
              "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_CUDA_EVENT"]
    total = sum(sql(f"select count(*) from {t}")[0][0] for t in tables)
    assert acc["events_read"] == total
    assert acc["events_read"] == sum(acc["kept"].values()) + sum(acc["dropped"].values())
    (n_query,), = sql("select count(*) from CUPTI_ACTIVITY_KIND_SYNCHRONIZATION where syncType = 1")
    assert acc["dropped"]["sync_nonblocking_event_query"] == n_query
    assert trace.meta["source_format"] == "nsys"
    assert trace.meta["sources"] == [{"path": str(NSYS), "format": "nsys"}]


def test_lazily_created_tables_may_be_missing(tmp_path):
    p = tmp_path / "lean.sqlite"
    shutil.copy(NSYS, p)
    with sqlite3.connect(p) as con:
        for t in ("CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS",
                  "CUPTI_ACTIVITY_KIND_CUDA_EVENT", "ThreadNames", "TARGET_INFO_SESSION_START_TIME"):
            con.execute(f"drop table {t}")
    t = read_nsys(p, progress=False)
    assert (t.ops["kind"] == OpKind.MEMSET).sum() == 0 and len(t.ranges) == 0
    assert (t.edges["kind"] == EdgeKind.SYNC).sum() == 0
    assert (t.ops["kind"] == OpKind.KERNEL).sum() + 66 == 4010
    acc = t.meta["accounting"][str(p)]
    assert acc["events_read"] == 4010 + 1020 + 7466


def test_missing_kernel_table_names_it_and_the_export_command(tmp_path):
    p = tmp_path / "nokernels.sqlite"
    shutil.copy(NSYS, p)
    with sqlite3.connect(p) as con:
        con.execute("drop table CUPTI_ACTIVITY_KIND_KERNEL")
    with pytest.raises(TraceFormatError, match="CUPTI_ACTIVITY_KIND_KERNEL.*nsys export --type sqlite"):
        read_nsys(p, progress=False)


def test_two_files_concatenate_ranks(tmp_path):
    b = tmp_path / "node1.sqlite"
    shutil.copy(NSYS, b)
    t = read_nsys([NSYS, b], progress=False)
    assert list(t.ranks) == [0, 1, 2, 3]
    per = t.ops[t.ops["coll_id"] >= 0].groupby("coll_id")["rank"].agg(sorted)
    assert len(per) == 33 and all(r == [0, 1, 2, 3] for r in per)
    assert t.meta["clock_offsets_ns"] == {str(NSYS): 0, str(b): 0}
    assert len(t.meta["accounting"]) == 2


def _crafted(tmp_path: Path) -> Path:
    """A tiny export (real schema) with an event record, a stream wait and a stream sync."""
    p = tmp_path / "crafted.sqlite"
    shutil.copy(NSYS, p)
    gpid = (1 << 48) | (100 << 24)
    tid = gpid | 100
    with sqlite3.connect(p) as con:
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                  "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS",
                  "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_CUDA_EVENT"):
            con.execute(f"delete from {t}")
        con.execute("insert into StringIds values (9000001, 'cudaLaunchKernel_v7000'), "
                    "(9000002, 'cudaEventRecord_v3020'), (9000003, 'cudaStreamWaitEvent_v3020'), "
                    "(9000004, 'cudaStreamSynchronize_v3020'), (9000005, 'gemm_kernel')")
        api = [(0, 10, 1, 9000001), (20, 25, 2, 9000002), (30, 35, 3, 9000003),
               (40, 50, 4, 9000001), (60, 200, 5, 9000004), (210, 220, 6, 9000001)]
        con.executemany("insert into CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, "
                        "correlationId, nameId, returnValue) values (?, ?, 0, ?, ?, ?, 0)",
                        [(s, e, tid, c, n) for s, e, c, n in api])
        kern = [(15, 100, 7, 1), (100, 150, 8, 4), (230, 260, 7, 6)]
        con.executemany(
            "insert into CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, "
            "correlationId, globalPid, demangledName, shortName, registersPerThread, gridX, gridY, "
            "gridZ, blockX, blockY, blockZ, staticSharedMemory, dynamicSharedMemory, "
            "localMemoryPerThread, localMemoryTotal, gridId, tensorSizeMinusOneElements) values "
            "(?, ?, 3, 1, ?, ?, ?, 9000005, 9000005, 32, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, '')",
            [(s, e, st, c, gpid) for s, e, st, c in kern])
        con.execute("insert into CUPTI_ACTIVITY_KIND_CUDA_EVENT (timestamp, deviceId, contextId, "
                    "streamId, correlationId, globalPid, eventId) values (0, 3, 1, 7, 2, ?, 9)",
                    (gpid,))
        con.executemany("insert into CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start, end, deviceId, "
                        "contextId, streamId, correlationId, globalPid, syncType, eventId) values "
                        "(?, ?, 3, 1, 8, ?, ?, ?, ?)",
                        [(30, 35, 3, gpid, 2, 9), (60, 200, 5, gpid, 3, 4294967295)])
        con.execute("create table TARGET_INFO_GPU (vmId INTEGER, id INTEGER, name TEXT, "
                    "totalMemory INTEGER, smCount INTEGER, clockRate INTEGER, "
                    "memoryBandwidth INTEGER, computeMajor INTEGER, computeMinor INTEGER)")
        con.execute("insert into TARGET_INFO_GPU values (0, 3, 'NVIDIA H100 80GB HBM3', "
                    "85045395456, 132, 1980000000, 3352320000000, 9, 0)")
    return p


def test_event_wait_stream_sync_and_gpu_info(tmp_path):
    t = read_nsys(_crafted(tmp_path), progress=False)
    o = t.ops
    names = t.names()
    kern = {int(s): i for i, s in zip(o.index, o["start_ns"], strict=True)
            if names[i] == "gemm_kernel"}
    api = {int(s): i for i, s in zip(o.index, o["start_ns"], strict=True)
           if o["kind"][i] == OpKind.RUNTIME}
    e = {(int(s), int(d)): int(k) for s, d, k in zip(t.edges["src"], t.edges["dst"],
                                                       t.edges["kind"], strict=True)}
    # kernel A (stream 7, before the record) -> kernel B (first on stream 8 after the wait)
    assert e[(kern[15], kern[100])] == EdgeKind.SYNC
    # stream 8 synchronize: kernel B -> the launch call after cudaStreamSynchronize
    assert e[(kern[100], api[210])] == EdgeKind.SYNC
    assert sum(k == EdgeKind.SYNC for k in e.values()) == 2
    assert sum(k == EdgeKind.LAUNCH for k in e.values()) == 3
    assert sum(k == EdgeKind.HOST_ORDER for k in e.values()) == 5
    dev = t.meta["devices"]["0"]["3"]
    assert dev["name"] == "NVIDIA H100 80GB HBM3" and dev["sm_count"] == 132
    assert dev["compute_capability"] == "9.0" and dev["peak_flops"] == 989e12
    acc = t.meta["accounting"][str(tmp_path / "crafted.sqlite")]
    assert acc == {"events_read": 12, "dropped": {},
                   "kept": {"CUPTI_ACTIVITY_KIND_KERNEL": 3, "CUPTI_ACTIVITY_KIND_RUNTIME": 6,
                            "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": 2,
                            "CUPTI_ACTIVITY_KIND_CUDA_EVENT": 1}}


def test_cli_ingest_json_and_subprocess(tmp_path, capsys):
    out = tmp_path / "run.retime"
    assert run(["ingest", str(NSYS), "-o", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["ranks"] == [0, 1] and s["collectives"]["matched"] == 33
    t = read_trace(out)
    assert t.meta["source_format"] == "nsys" and t.n_ops == 12765
    out2 = tmp_path / "run2.retime"
    r = subprocess.run([sys.executable, "-m", "retime", "ingest", str(NSYS), "-o", str(out2),
                        "--format", "nsys", "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    s2 = json.loads(r.stdout)
    assert s2["events_read"] == s["events_read"] == 32249
    assert s2["ops"] == 12765 and s2["dropped"] == s["dropped"]


def test_stdlib_sqlite_path_gives_the_same_trace(trace, monkeypatch):
    import retime.collectors.nsys_sql as nsys_sql

    monkeypatch.setattr(nsys_sql, "_adbc", None)  # as on an install without adbc-driver-sqlite
    t = read_nsys(NSYS, progress=False)
    for table in ("ops", "lanes", "edges", "ranges"):
        a, b = getattr(t, table), getattr(trace, table)
        assert a.shape == b.shape
        for c in a.columns:
            assert np.array_equal(a[c].to_numpy(), b[c].to_numpy(),
                                  equal_nan=a[c].dtype.kind == "f"), (table, c)
    assert t.strings == trace.strings and t.meta["accounting"] == trace.meta["accounting"]
