"""retime export --chakra: Chakra ET protobuf files read back and checked against the trace."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from conftest import KINETO, ROOT, ingest_cached

from retime.collectors import EdgeKind, OpKind, TraceFormatError
from retime.collectors.chakra import (
    COLL_TYPES,
    NODE_TYPES,
    attr_value,
    chakra_messages,
    decode_stream,
    read_chakra,
    write_chakra,
)
from retime.replay.graph import build_graph

COMP, SEND, RECV, COLL = (NODE_TYPES[k] for k in ("COMP_NODE", "COMM_SEND_NODE",
                                                   "COMM_RECV_NODE", "COMM_COLL_NODE"))


def _attrs(node) -> dict:
    return {a.name: attr_value(a) for a in node.attr}


def _list_schedule(nodes) -> dict[int, int]:
    """Start (ns from the file's origin) of every node when each starts as soon as all its
    dependencies have ended (durations from the ``dur_ns`` attribute)."""
    by_id = {x.id: x for x in nodes}
    end: dict[int, int] = {}
    st: dict[int, int] = {}
    for i in by_id:
        stack = [i]
        while stack:
            j = stack[-1]
            if j in end:
                stack.pop()
                continue
            deps = list(by_id[j].ctrl_deps) + list(by_id[j].data_deps)
            todo = [d for d in deps if d not in end]
            if todo:
                stack.extend(todo)
                continue
            st[j] = max((end[d] for d in deps), default=0)
            end[j] = st[j] + _attrs(by_id[j])["dur_ns"]
            stack.pop()
    return st


def _recount(t, r: int) -> dict[str, int]:
    """Extra nodes of rank ``r`` recounted from the tables: a host gap per HOST_ORDER edge
    with a positive measured gap, a start offset per dependency (local edge or lane order)
    whose source the measurement shows still running, a delay per op the replay graph
    holds a release delay for."""
    o = t.ops
    rank = o["rank"].to_numpy()
    s = o["start_ns"].to_numpy()
    e_ = s + o["dur_ns"].to_numpy()
    ids = np.flatnonzero(rank == r)
    lane = o["lane"].to_numpy()
    order = ids[np.lexsort((ids, s[ids], lane[ids]))]
    pairs = [(int(a), int(b)) for a, b in zip(order[:-1], order[1:], strict=True)
             if lane[a] == lane[b]]
    gaps = 0
    for src, dst, k, lag in zip(t.edges["src"], t.edges["dst"], t.edges["kind"],
                                t.edges["lag_ns"], strict=True):
        if rank[src] != r or rank[dst] != r or k == EdgeKind.COLLECTIVE:
            continue
        if k == EdgeKind.HOST_ORDER and min(lag, s[dst] - e_[src]) > 0:
            gaps += 1
        else:
            pairs.append((int(src), int(dst)))
    offsets = len({p for p in pairs if s[p[1]] < e_[p[0]]})
    # release delays as the file defines them (the measured gaps kept as host-gap nodes,
    # not classified as waits the way the replay graph does, replay/gaps.py): an op starts
    # later than every dependency's measured end (a source that overlaps it counts from its
    # start plus the measured offset, i.e. it never delays), or than the rank's first start
    ready = {int(i): int(s[ids].min()) for i in ids}
    has_gap = set()
    for src, dst, k, lag in zip(t.edges["src"], t.edges["dst"], t.edges["kind"],
                                t.edges["lag_ns"], strict=True):
        if rank[src] == r and rank[dst] == r and k == EdgeKind.HOST_ORDER \
                and min(lag, s[dst] - e_[src]) > 0:
            has_gap.add(int(dst))
    for a, b in set(pairs):
        ready[b] = max(ready[b], int(s[b]) if s[b] < e_[a] else int(e_[a]))
    delays = sum(1 for i in ready if i not in has_gap and s[i] > ready[i])
    return {"retime:host_gap": gaps, "retime:start_offset": offsets, "retime:delay": delays,
            "ops": len(ids), "edges": len(set(pairs))}


def test_dlrm_nodes_edges_and_collectives(tmp_path):
    t = ingest_cached(KINETO / "dlrm-v100-8rank")
    files = write_chakra(t, tmp_path / "et")
    assert [f.name for f in files] == [f"et.{r}.et" for r in range(8)]
    o = t.ops
    for r, f in enumerate(files):
        meta, nodes = read_chakra(f)
        assert meta.version == "0.0.4"
        ma = {a.name: attr_value(a) for a in meta.attr}
        assert ma["rank"] == r and ma["world_size"] == 8
        rc = _recount(t, r)
        kinds = Counter(x.name for x in nodes if x.name.startswith("retime:"))
        assert {k: kinds.get(k, 0) for k in ("retime:host_gap", "retime:start_offset",
                                              "retime:delay")} == \
            {k: rc[k] for k in ("retime:host_gap", "retime:start_offset", "retime:delay")}
        assert len(nodes) == rc["ops"] + sum(kinds.values())
        ids = {x.id for x in nodes}
        assert all(d in ids for x in nodes for d in list(x.ctrl_deps) + list(x.data_deps))
        # every dependency between two ops is a direct edge unless a gap / offset node
        # stands between them
        direct = sum(1 for x in nodes if x.id < t.n_ops
                     for d in set(x.ctrl_deps) | set(x.data_deps) if d < t.n_ops)
        assert direct == rc["edges"] - kinds.get("retime:start_offset", 0)
        # list-scheduling the file gives back the measured starts of the rank's ops
        # (collectives excepted: they also wait for other ranks)
        st = _list_schedule(nodes)
        mine = np.flatnonzero((o["rank"] == r).to_numpy())
        meas = o["start_ns"].to_numpy() - ma["time_origin_ns"] - ma["rank_start_ns"]
        before_coll = mine[o["start_ns"].to_numpy()[mine] <= o["start_ns"].to_numpy()[
            mine[(o["kind"].to_numpy()[mine] == OpKind.COLLECTIVE)]].min()]
        assert all(st[int(i)] == meas[i] for i in before_coll)
        # collectives: one COMM_COLL_NODE per NCCL kernel of the rank, sizes as ingested
        coll = [x for x in nodes if x.type == COLL]
        mine = o[(o["rank"] == r) & (o["kind"] == OpKind.COLLECTIVE)]
        assert len(coll) == len(mine)
        assert sorted(_attrs(x)["comm_size"] for x in coll) == sorted(mine["bytes"].tolist())
        types = Counter(_attrs(x)["comm_type"] for x in coll)
        assert set(types) <= {COLL_TYPES["ALL_REDUCE"], COLL_TYPES["ALL_TO_ALL"]}
        # durations: us in the schema's fields, ns in the attribute
        for x in nodes[:50]:
            a = _attrs(x)
            assert x.duration_micros == round(a["dur_ns"] / 1000)


def test_collective_sizes_against_the_raw_trace(tmp_path):
    path = KINETO / "a100-ddp-nccl"
    t = ingest_cached(path)
    (f,) = write_chakra(t, tmp_path / "et")
    _, nodes = read_chakra(f)
    coll = [_attrs(x) for x in nodes if x.type == COLL]
    with gzip.open(next(path.glob("*.json.gz")), "rt") as fh:
        ev = json.load(fh)["traceEvents"]
    raw = [e["args"] for e in ev if e.get("cat") == "kernel" and e["name"].startswith("nccl")]
    assert len(coll) == len(raw) == 21
    width = {"Float": 4, "Long": 8}
    assert sorted(a["comm_size"] for a in coll) == sorted(
        a["In msg nelems"] * width[a["dtype"]] for a in raw)
    by_name = {"allreduce": "ALL_REDUCE", "broadcast": "BROADCAST"}
    assert Counter(a["comm_type"] for a in coll) == Counter(
        COLL_TYPES[by_name[a["Collective name"]]] for a in raw)
    assert all(a["comm_group_ranks"] == [0, 1] for a in coll)


def test_single_gpu_timeline_replays_from_the_file(tmp_path):
    """List-scheduling the ET gives back the measured start of every op (host gaps, delays
    and overlapping starts are nodes of their own)."""
    t = ingest_cached(KINETO / "h100-vgg13" / "profiler_vgg13-iter41.json.gz")
    (f,) = write_chakra(t, tmp_path / "et")
    _, nodes = read_chakra(f)
    st = _list_schedule(nodes)
    o = t.ops
    meas = o["start_ns"].to_numpy() - o["start_ns"].min()
    assert [st[i] for i in range(len(o))] == meas.tolist()
    g = build_graph(t)
    kinds = Counter(x.name for x in nodes if x.name.startswith("retime:"))
    assert kinds["retime:start_offset"] >= g.stats["start_edges"] >= 1


def test_synthesized_pipeline_send_recv_pairs(tmp_path):
    from retime.collectors.synth import synthesize
    t = synthesize("gpt3-125m", "a100-80gb", dict(tp=2, pp=2, dp=2, global_batch=8,
                                                   micro_batch=1))
    files = write_chakra(t, tmp_path / "et")
    assert len(files) == 8
    sends, recvs = {}, {}
    for f in files:
        meta, nodes = read_chakra(f)
        r = {a.name: attr_value(a) for a in meta.attr}["rank"]
        for x in nodes:
            a = _attrs(x)
            if x.type == SEND:
                sends[(r, a["comm_dst"], a["comm_tag"])] = a["comm_size"]
            elif x.type == RECV:
                recvs[(a["comm_src"], r, a["comm_tag"])] = a["comm_size"]
            elif x.type == COLL:
                assert a["pg_name"][:2] in ("tp", "dp", "pp", "em", "mp")
        assert sum(x.type == COLL for x in nodes) == int(
            ((t.ops["rank"] == r) & (t.ops["kind"] == OpKind.COLLECTIVE)).sum())
    assert sends and sends == recvs  # every send meets its receive, same size


def test_framing_and_bad_files(tmp_path):
    m = chakra_messages()
    a = m["GlobalMetadata"](version="x")
    b = m["Node"](id=300, name="n")
    data = b"".join([bytes([len(a.SerializeToString())]), a.SerializeToString()]) \
        + bytes([len(b.SerializeToString())]) + b.SerializeToString()
    assert [len(x) for x in decode_stream(data)] == [len(a.SerializeToString()),
                                                     len(b.SerializeToString())]
    bad = tmp_path / "bad.et"
    bad.write_bytes(data[:-2])
    with pytest.raises(TraceFormatError, match="truncated"):
        read_chakra(bad)
    t = ingest_cached(KINETO / "a100-ddp-nccl")
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(TraceFormatError, match="other files"):
        write_chakra(t, other, overwrite=True)
    assert (other / "notes.txt").read_text() == "keep me"


def test_cli_export_chakra(tmp_path):
    t = ingest_cached(KINETO / "a100-ddp-nccl")
    d = tmp_path / "run.retime"
    t.save(d)
    out = tmp_path / "chakra"
    cmd = [sys.executable, "-m", "retime", "export", str(d), "--chakra", str(out), "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    js = json.loads(r.stdout)
    assert js["ranks"] == 1 and (out / "et.0.et").is_file()
    r2 = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert r2.returncode == 2 and "--force" in json.loads(r2.stdout)["error"] + json.loads(
        r2.stdout).get("hint", "")
    r3 = subprocess.run(cmd[:-1] + ["--force"], capture_output=True, text=True, cwd=ROOT)
    assert r3.returncode == 0
    r4 = subprocess.run([sys.executable, "-m", "retime", "export", str(d)],
                        capture_output=True, text=True, cwd=ROOT)
    assert r4.returncode == 2 and "exactly one" in r4.stderr
