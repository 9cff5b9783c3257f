"""Op-level (StragglerAnalysis layout) reader: accounting, schedule edges, and a reference
replay with StragglerAnalysis' semantics that must reproduce its published step times."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import defaultdict, deque
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from retime.cli import run
from retime.collectors.enums import CommOp, EdgeKind, LaneKind, OpKind, Phase
from retime.collectors.errors import TraceFormatError
from retime.collectors.oplevel import read_oplevel
from retime.collectors.trace import read_trace

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
DIR = TRACES / "oplevel" / "megatron-ST-8rank"
PARQUET = DIR / "trace-ST.parquet"


@pytest.fixture(scope="module")
def trace():
    return read_oplevel(DIR)


@pytest.fixture(scope="module")
def raw():
    d = pd.read_parquet(PARQUET)
    d["optype"] = d["optype"].astype(str)
    return d


def test_accounting_and_exact_times(trace, raw):
    acc = trace.meta["accounting"][str(PARQUET)]
    assert acc["events_read"] == len(raw) == trace.n_ops == 6784
    assert acc["kept"] == {k: int(v) for k, v in raw["optype"].value_counts().items() if v}
    assert acc["dropped"] == {}
    o = trace.ops
    row = o["external_id"].to_numpy()
    off = pd.Series(trace.meta["oplevel"]["step_offsets_ns"]).rename(int)
    rel = o["start_ns"].to_numpy() - off.reindex(o["step"].to_numpy()).to_numpy()
    assert (rel == np.rint(raw["start_ts"].to_numpy(np.float64)[row] * 1e9)).all()
    assert (o["dur_ns"].to_numpy() == np.rint(raw["duration"].to_numpy(np.float64)[row] * 1e9)).all()
    assert (o["step"].to_numpy() == raw["step"].to_numpy()[row]).all()
    assert (o["stage"].to_numpy() == raw["stage"].to_numpy()[row]).all()
    assert set(trace.meta["skipped_files"]) == {str(DIR / "result-ST.json"),
                                                str(DIR / "timeline-ST.json.gz")}


def test_ranks_lanes_groups(trace, raw):
    assert trace.world_size == 8 and list(trace.ranks) == list(range(8))
    assert trace.meta["job"]["pp_size"] == 4 and trace.meta["job"]["dp_size"] == 2
    ranks = {r["rank"]: (r["dp_rank"], r["stage"]) for r in trace.meta["oplevel"]["ranks"]}
    expect = raw.groupby("rank")[["dp_rank", "stage"]].first()
    assert ranks == {int(r): (int(a.dp_rank), int(a.stage)) for r, a in expect.iterrows()}
    assert (trace.lanes["lane_kind"] == LaneKind.OP_STREAM).all()
    # stage 0 / last have no fwd-recv / fwd-send lanes: 4 and 6 lanes per rank
    assert trace.lanes.groupby("rank").size().tolist() == [4, 4, 6, 6, 6, 6, 4, 4]
    g = {n: list(r) for n, r in zip(trace.groups["name"], trace.groups["ranks"], strict=True)}
    assert g["dp:stage1"] == [2, 3] and g["pp:dp0"] == [0, 2, 4, 6] and g["embedding:dp1"] == [1, 7]
    o = trace.ops
    k = o["kind"].to_numpy()
    n = trace.names()
    assert (k[n == "forward-compute"] == OpKind.COMPUTE).all()
    assert (o["phase"].to_numpy()[n == "backward-compute"] == Phase.BWD).all()
    assert (o["comm_op"].to_numpy()[n == "grads-reduce-scatter"] == CommOp.REDUCE_SCATTER).all()
    assert (k[np.char.endswith(n.astype(str), "send")] == OpKind.P2P).all()


def test_collective_instances(trace, raw):
    o = trace.ops
    n = trace.names()
    c = trace.meta["collectives"]
    assert c["unmatched"] == 0 and c["p2p_noops"] == 0
    assert c["ops_matched"] == int((o["coll_id"] >= 0).sum()) and c["ops_unmatched"] == 0
    assert c["matched"] == o.loc[o["coll_id"] >= 0, "coll_id"].nunique()
    size = o[o["coll_id"] >= 0].groupby("coll_id").size()
    steps = raw["step"].nunique()
    # params-all-gather: one instance per (step, stage) over the 2 DP ranks
    ag = o[n == "params-all-gather"]
    assert ag["coll_id"].nunique() == steps * 4 and (size[ag["coll_id"]] == 2).all()
    # clip: every rank of a step
    cl = o[n == "optimizer-clip-main-grad"]
    assert cl["coll_id"].nunique() == steps and (size[cl["coll_id"]] == 8).all()
    # embedding: stages 0 and 3 of one dp rank
    em = o[n == "embedding-grads-all-reduce"]
    assert set(em.groupby("coll_id")["stage"].agg(lambda s: tuple(sorted(s)))) == {(0, 3)}
    assert em["coll_id"].nunique() == steps * 2
    # p2p: send at stage s pairs with the recv at s+1 (forward) / s-1 (backward), same mb
    for send, recv, d in (("forward-send", "forward-recv", 1), ("backward-send", "backward-recv", -1)):
        s = o[n == send].set_index("coll_id")
        r = o[n == recv].set_index("coll_id")
        assert len(s) == len(r) == steps * 2 * 3 * 4
        r = r.reindex(s.index)
        assert (r["stage"].to_numpy() == s["stage"].to_numpy() + d).all()
        assert (r["microbatch"].to_numpy() == s["microbatch"].to_numpy()).all()
        assert (s["peer"].to_numpy() == r["rank"].to_numpy()).all()
        assert (r["peer"].to_numpy() == s["rank"].to_numpy()).all()


def _graph(trace, within_step: bool):
    o = trace.ops
    step, lane, start = o["step"].to_numpy(), o["lane"].to_numpy(), o["start_ns"].to_numpy()
    preds = defaultdict(list)
    for s, d in zip(trace.edges["src"].to_numpy(), trace.edges["dst"].to_numpy(), strict=True):
        if not within_step or step[s] == step[d]:
            preds[int(d)].append(int(s))
    order = np.lexsort((start, lane))
    for a, b in zip(order[:-1], order[1:], strict=True):
        if lane[a] == lane[b] and (not within_step or step[a] == step[b]):
            preds[int(b)].append(int(a))
    return preds


def test_dependency_graph_is_acyclic_across_steps(trace):
    preds = _graph(trace, within_step=False)
    n = trace.n_ops
    indeg = np.zeros(n, int)
    succ = defaultdict(list)
    for d, ps in preds.items():
        indeg[d] = len(ps)
        for p in ps:
            succ[p].append(d)
    q = deque(np.flatnonzero(indeg == 0).tolist())
    seen = 0
    while q:
        v = q.popleft()
        seen += 1
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                q.append(w)
    assert seen == n
    assert (trace.edges["kind"] == EdgeKind.DATA).all() and (trace.edges["lag_ns"] == 0).all()
    # measured times respect the edges up to float32 rounding of the timers (< 20 us)
    assert trace.meta["oplevel"]["max_negative_slack_ns"] < 20_000


def _simulate_like_stragglers(trace):
    """StragglerAnalysis' replay on our edges: an op starts when its predecessors (edges and
    lane order, within one step) end; members of a coll_id start together at the latest
    member's ready time and end after their transfer time (end - latest measured member
    start); each step starts at its measured start; step time = last optimizer end - start."""
    o = trace.ops
    start, dur = o["start_ns"].to_numpy(), o["dur_ns"].to_numpy()
    end, step, coll = start + dur, o["step"].to_numpy(), o["coll_id"].to_numpy()
    names = trace.names()
    preds = _graph(trace, within_step=True)
    members = defaultdict(list)
    for i in np.flatnonzero(coll >= 0):
        members[int(coll[i])].append(int(i))
    transfer = dur.copy()
    for m in members.values():
        latest = max(start[i] for i in m)
        for i in m:
            transfer[i] = end[i] - latest
    out = {}
    for k in np.unique(step):
        ids = np.flatnonzero(step == k).tolist()
        s0 = int(start[ids].min())
        indeg = {i: len(preds[i]) for i in ids}
        succ = defaultdict(list)
        for i in ids:
            for p in preds[i]:
                succ[p].append(i)
        ready, fin, started = {}, {}, defaultdict(int)
        q = deque(i for i in ids if indeg[i] == 0)
        while q:
            v = q.popleft()
            ready[v] = max((fin[p] for p in preds[v]), default=s0)
            done = []
            if coll[v] < 0:
                fin[v] = ready[v] + dur[v]
                done = [v]
            else:
                started[coll[v]] += 1
                if started[coll[v]] == len(members[coll[v]]):
                    gs = max(ready[u] for u in members[coll[v]])
                    for u in members[coll[v]]:
                        fin[u] = gs + transfer[u]
                        done.append(u)
            for u in done:
                for w in succ[u]:
                    indeg[w] -= 1
                    if indeg[w] == 0:
                        q.append(w)
        assert len(fin) == len(ids)
        out[int(k)] = max(fin[i] for i in ids if names[i] == "optimizer") - s0
    return out


def test_reproduces_stragglers_published_step_times(trace):
    ref = json.loads((DIR / "result-ST.json").read_text())
    sim = _simulate_like_stragglers(trace)
    assert sorted(sim) == sorted(int(s) for s in ref["step_t_nodelay"])
    for s, t_ns in sim.items():
        assert t_ns / 1e9 == pytest.approx(ref["step_t_nodelay"][str(s)], rel=1e-6)
    # measured step time (last optimizer end - first start) is their step_t_base
    o = trace.ops
    end = o["start_ns"] + o["dur_ns"]
    opt = trace.names() == "optimizer"
    for s, g in o.groupby("step"):
        base = (end[opt & (o["step"] == s).to_numpy()].max() - g["start_ns"].min()) / 1e9
        assert base == pytest.approx(ref["step_t_base"][str(s)], rel=1e-6)


def test_yaml_optional_and_errors(tmp_path):
    shutil.copy(PARQUET, tmp_path / "trace-X.parquet")
    t = read_oplevel(tmp_path)
    assert t.meta["job"]["dp_size"] == 2 and t.meta["job"]["pp_size"] == 4 and t.world_size == 8
    bad = tmp_path / "bad"
    bad.mkdir()
    pd.read_parquet(PARQUET).drop(columns=["seq_id"]).to_parquet(bad / "trace-B.parquet")
    with pytest.raises(TraceFormatError, match="missing column.*seq_id"):
        read_oplevel(bad)
    two = tmp_path / "two"
    two.mkdir()
    for n in ("A", "B"):
        shutil.copy(PARQUET, two / f"trace-{n}.parquet")
    with pytest.raises(TraceFormatError, match="one at a time"):
        read_oplevel(two)
    (tmp_path / "meta-X.yaml").write_text("dp_size: 1\npp_size: 4\n")
    with pytest.raises(TraceFormatError, match="dp_size=1"):
        read_oplevel(tmp_path)


def test_duplicates_are_dropped_and_counted(tmp_path):
    d = pd.read_parquet(PARQUET)
    pd.concat([d, d.iloc[:5]], ignore_index=True).to_parquet(tmp_path / "trace-D.parquet")
    t = read_oplevel(tmp_path / "trace-D.parquet")
    acc = t.meta["accounting"][str(tmp_path / "trace-D.parquet")]
    assert acc["events_read"] == len(d) + 5 and acc["dropped"] == {"duplicate_op": 5}
    assert t.n_ops == len(d)


def test_cli_ingest_folder(tmp_path, capsys):
    out = tmp_path / "st.retime"
    assert run(["ingest", str(DIR), "-o", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["ranks"] == list(range(8)) and s["events_read"] == 6784 and s["ops"] == 6784
    assert s["collectives"]["unmatched"] == 0
    t = read_trace(out)
    assert t.meta["source_format"] == "oplevel" and len(t.edges) == s["edges"]
    r = subprocess.run([sys.executable, "-m", "retime", "ingest", str(DIR), "-o",
                        str(tmp_path / "b.retime"), "--json"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["collectives"] == s["collectives"]
