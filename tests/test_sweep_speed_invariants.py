"""What the sweep's speed-ups must not change (replay/policies/base.py memo, graph memo,
replay/sweep_metrics.py kernels, replay/sweep.py per-worker group queues).

Every cached value is checked against a computation from scratch on a fresh copy: results are
identical, a trace edited in place is never answered from a stale cache, shared cached arrays
are read-only, and local workers that each take whole re-synthesizing groups give the serial
sweep's rows.
"""

from __future__ import annotations

import copy
import pickle
from collections import Counter

import numpy as np
import pytest
from test_sweep_overhead import _union

from retime.collectors.synth import synthesize
from retime.replay import build_graph, simulate, whatif
from retime.replay.engine import ContentionModel
from retime.replay.graph_data import RES_COMM, RES_COMPUTE
from retime.replay.policies import base
from retime.replay.sweep import _split_groups, _steal, _work_order, scenario_metrics, sweep


def _job():
    # two nodes (16 ranks of 8 per node): an inter-node bandwidth re-times the DP all-reduce
    return synthesize("gpt3-125m", "a100-80gb", tp=2, pp=2, dp=4, global_batch=16,
                      micro_batch=2)


@pytest.fixture(scope="module")
def job():
    return _job()


def _same(a, b):
    np.testing.assert_array_equal(a.start_ns, b.start_ns)
    np.testing.assert_array_equal(a.end_ns, b.end_ns)
    np.testing.assert_array_equal(a.crit_pred, b.crit_pred)


def _fresh(trace):
    """A deep copy: no cache knows it."""
    return copy.deepcopy(trace)


SCENARIOS = [
    {"hardware.compute_speedup": 1.6},
    {"overlap.mode": "serial"},
    {"overlap.interference": 0.4},
    {"hardware.compute_speedup": 0.8, "overlap.interference": 0.7},
    {"network.inter_node_gbps": 12.5, "overlap.mode": "serial"},
]


@pytest.mark.parametrize("sc", SCENARIOS)
def test_repeated_whatifs_equal_a_fresh_trace(job, sc):
    a = whatif(job, sc)
    b = whatif(job, sc)  # every per-trace / per-graph cache warm now
    c = whatif(_fresh(job), sc)
    _same(a, b)
    _same(a, c)
    assert scenario_metrics(a) == scenario_metrics(c)
    assert a.meta["whatif"] == c.meta["whatif"]


def test_trace_edited_in_place_gets_fresh_derived_values():
    t = _job()
    sc = {"hardware.compute_speedup": 2.0}
    before = whatif(t, sc)
    # edit in place: slower kernels everywhere and other names (kernel classes change)
    t.ops["dur_ns"] = t.ops["dur_ns"] * 2
    names = t.names()
    gemm = np.flatnonzero(np.char.find(names.astype(str), ".fc1.") >= 0)
    assert len(gemm)
    t.ops.loc[gemm, "name_id"] = int(t.ops["name_id"].iloc[0])
    after = whatif(t, sc)
    ref = whatif(_fresh(t), sc)
    _same(after, ref)
    assert after.meta["whatif"]["baseline_measured_step_time_ns"] == \
        ref.meta["whatif"]["baseline_measured_step_time_ns"] > \
        before.meta["whatif"]["baseline_measured_step_time_ns"]
    assert not np.array_equal(after.end_ns, before.end_ns)


def test_sweep_fingerprints_each_trace_once_and_a_new_sweep_sees_edits(monkeypatch):
    t = _job()
    scs = [{"hardware.compute_speedup": f} for f in (1.0, 1.5, 2.0)]
    calls = Counter()
    real = base._fingerprint

    def counted(trace):
        before = len(base._FP_SCOPE[-1]) if base._FP_SCOPE else -1
        fp = real(trace)
        if base._FP_SCOPE and len(base._FP_SCOPE[-1]) > before:
            calls[id(trace)] += 1  # computed, not answered from the scope
        return fp
    monkeypatch.setattr(base, "_fingerprint", counted)
    first = sweep(t, scs, workers=1, progress=False)
    assert calls[id(t)] == 1  # once for the three scenarios
    # an edit between two sweeps is seen: rows equal those of a fresh copy
    t.ops["dur_ns"] = t.ops["dur_ns"] * 2
    second = sweep(t, scs, workers=1, progress=False)
    ref = sweep(_fresh(t), scs, workers=1, progress=False)
    assert calls[id(t)] == 2
    assert second["step_time_ns"].tolist() == ref["step_time_ns"].tolist()
    assert (second["step_time_ns"] > first["step_time_ns"]).all()


def test_cached_arrays_are_read_only(job):
    whatif(job, {"hardware.compute_speedup": 1.5, "overlap.mode": "serial"})
    g = base.cached_graph(job)
    assert not base.by_op(g, "dur_ns").flags.writeable
    memo = base.trace_memo(job)
    assert not memo["kernel_class"].flags.writeable
    src, dst = g.memo()["serialize_edges"]
    assert not src.flags.writeable and not dst.flags.writeable
    with pytest.raises(ValueError):
        base.by_op(g, "coll_of")[0] = 5


def test_serial_graph_is_derived_once_and_equals_a_fresh_one(job):
    a = whatif(job, {"overlap.mode": "serial"})
    b = whatif(job, {"overlap.mode": "serial", "hardware.compute_speedup": 1.3})
    assert a.graph is b.graph  # the same extra edges on the same graph: reused
    ref = whatif(_fresh(job), {"overlap.mode": "serial", "hardware.compute_speedup": 1.3})
    _same(b, ref)
    assert a.graph.n_edges > base.cached_graph(job).n_edges


def test_contention_successor_lists_are_per_graph(job):
    g = build_graph(job)
    cm = ContentionModel(slowdown=0.5)
    a = simulate(g, mode="contention", contention=cm)
    assert "fluid_succ" in g.memo()
    b = simulate(g, mode="contention", contention=cm)
    c = simulate(build_graph(_fresh(job)), mode="contention", contention=cm)
    _same(a, b)
    _same(a, c)
    # a graph with other edges gets its own lists
    g2 = g.with_edges([0], [len(job.ops) - 1])
    assert "fluid_succ" not in g2.memo()
    d = simulate(g2, mode="contention", contention=cm)
    assert g2.memo()["fluid_succ"].succ.shape[0] == g.memo()["fluid_succ"].succ.shape[0] + 1
    assert d.end_ns.max() >= a.end_ns.max()
    # a pickled graph leaves its memo behind and replays the same
    g3 = pickle.loads(pickle.dumps(g))
    assert "_memo" not in g3.__dict__
    _same(a, simulate(g3, mode="contention", contention=cm))


def _naive_metrics(res):
    """Rank spans, exposed communication and bubble fraction by plain Python."""
    g = res.graph
    s, e = res.start_ns.tolist(), res.end_ns.tolist()
    resource = g.by_op(g.resource).tolist()
    per = {}
    for i, r in enumerate(g.rank.tolist()):
        d = per.setdefault(r, {"lo": s[i], "hi": e[i], "x": [], "cx": []})
        d["lo"], d["hi"] = min(d["lo"], s[i]), max(d["hi"], e[i])
        if resource[i] == RES_COMPUTE:
            d["x"].append((s[i], e[i]))
        if resource[i] in (RES_COMPUTE, RES_COMM):
            d["cx"].append((s[i], e[i]))

    union = _union  # the plain-Python interval union of test_sweep_overhead

    step = max(d["hi"] - d["lo"] for d in per.values())
    exposed = max(union(d["cx"]) - union(d["x"]) for d in per.values())
    bub = np.mean([1 - union(d["x"]) / (d["hi"] - d["lo"]) for d in per.values() if d["x"]])
    return step, exposed, bub


@pytest.mark.parametrize("sc", [{"overlap.interference": 0.3}, {"overlap.mode": "serial"},
                                {"hardware.compute_speedup": 2.5}])
def test_metric_kernels_match_plain_python(job, sc):
    res = whatif(job, sc)
    m = scenario_metrics(res)
    step, exposed, bub = _naive_metrics(res)
    assert m["step_time_ns"] == step == res.step_time_ns
    assert m["exposed_comm_ns"] == exposed
    assert m["bubble_fraction"] == pytest.approx(bub, rel=1e-12)


def test_groups_are_dealt_whole_and_stealing_moves_the_back_half():
    scs = [{"hardware.compute_speedup": c, "network.inter_node_gbps": b}
           for c in (1.0, 2.0, 3.0) for b in (10.0, 20.0, 30.0, 40.0, 50.0)]
    queues = _split_groups(scs, 2)
    got = [i for q in queues for i in q]
    assert sorted(got) == list(range(len(scs)))  # each scenario once
    for q in queues:  # a network setting lives on one queue only
        nets = [scs[i]["network.inter_node_gbps"] for i in q]
        for other in queues:
            if other is not q:
                assert not set(nets) & {scs[i]["network.inter_node_gbps"] for i in other}
    assert abs(len(queues[0]) - len(queues[1])) <= 3  # balanced by whole groups
    # worker order inside a queue is the work order
    order = _work_order(scs)
    for q in queues:
        assert list(q) == [i for i in order if i in set(q)]
    n0 = len(queues[0])
    queues[1].clear()
    _steal(1, queues)
    assert len(queues[1]) == (n0 + 1) // 2 and len(queues[0]) == n0 - (n0 + 1) // 2
    assert sorted([*queues[0], *queues[1]]) == sorted(got[:n0])


def test_local_workers_with_network_groups_equal_serial(job):
    scs = [{"hardware.compute_speedup": c, "network.inter_node_gbps": b, **o}
           for c in (1.0, 1.5) for b in (25.0, 100.0, 400.0)
           for o in ({}, {"overlap.interference": 0.5})]
    ser = sweep(job, scs, workers=1)
    par = sweep(job, scs, workers=2)
    assert par.equals(ser)
    assert ser["error"].isna().all()
    # the bandwidth matters on this two-node job, and rows keep the input order
    assert par["scenario_id"].tolist() == list(range(len(scs)))
    by_net = ser.groupby("network.inter_node_gbps")["step_time_ns"].max()
    assert by_net.loc[25.0] > by_net.loc[400.0]
    assert Counter(par["network.inter_node_gbps"]) == {25.0: 4, 100.0: 4, 400.0: 4}
