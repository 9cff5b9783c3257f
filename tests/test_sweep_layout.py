"""Replay results kept in the kernels' layout order (replay/engine.py ReplayResult), the row
metrics computed from it (replay/_metric_kernels.py _metric_spans_layout) and the deferred
per-class duration scaling (WhatIfState.scale_by_class): each gives exactly what the
op-order path gives."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from test_sweep_overhead import _union

from retime.collectors.synth import synthesize
from retime.replay import whatif
from retime.replay._metric_kernels import _block_slots, _group_spans, _metric_spans_layout
from retime.replay.engine import ReplayResult
from retime.replay.policies.base import SynthSpec, WhatIfState
from retime.replay.policies.hardware import Hardware, kernel_class
from retime.replay.sweep import scenario_metrics

SCENARIOS = [
    ({}, None),
    ({}, "contention"),
    ({"hardware.compute_speedup": 1.3}, None),
    ({"hardware.compute_speedup": 1.3, "overlap.interference": 0.5}, None),
    ({"hardware.compute_speedup": 0.7, "overlap.mode": "serial"}, None),
    ({"network.inter_node_gbps": 12.5, "overlap.interference": 0.2}, None),
]


@pytest.fixture(scope="module")
def synth_trace():
    return synthesize("gpt3-125m", "a100-80gb", tp=2, pp=2, dp=2, global_batch=16,
                      micro_batch=2)


def _same(a: dict, b: dict) -> bool:
    return repr(a) == repr(b)  # NaN-safe, type-exact


@pytest.mark.parametrize("which", ["synth", "dlrm"])
def test_layout_results_and_metrics_equal_op_order(which, synth_trace, dlrm_trace):
    tr = synth_trace if which == "synth" else dlrm_trace
    scs = SCENARIOS if which == "synth" else [s for s in SCENARIOS if "network." not in
                                              next(iter(s[0]), "")]
    for sc, mode in scs:
        lazy = whatif(tr, sc, mode=mode)
        assert lazy._layout is not None  # nothing read yet: layout order only
        m_layout = scenario_metrics(lazy)
        if which == "synth":  # a Kineto trace's step windows need the op-order times
            assert lazy._layout is not None  # the row metrics did not map to op ids
        eager = whatif(tr, sc, mode=mode)
        s, e, c = eager.start_ns, eager.end_ns, eager.crit_pred
        assert eager._layout is None
        m_op = scenario_metrics(eager)
        assert _same(m_layout, m_op), (sc, mode)
        # the lazy result maps to the same op-order arrays, int64, aligned with the ops
        assert lazy.start_ns.dtype == np.int64 and len(lazy.start_ns) == tr.n_ops
        np.testing.assert_array_equal(lazy.start_ns, s)
        np.testing.assert_array_equal(lazy.end_ns, e)
        np.testing.assert_array_equal(lazy.crit_pred, c)
        assert lazy.step_time_ns == eager.step_time_ns == m_op["step_time_ns"]
        # independent check of the step time: the longest rank span of the op-order arrays
        # (synth: every op in the step) or of its step windows (Kineto: one profiler step)
        rank = tr.ops["rank"].to_numpy()
        spans = [e[rank == r].max() - s[rank == r].min() for r in np.unique(rank)]
        if which == "synth":
            assert m_layout["step_time_ns"] == max(spans)
        else:
            w = eager.step_windows()
            assert m_layout["step_time_ns"] == int(w["replayed_ns"].max()) < max(spans)


def test_lazy_result_pickles_and_is_read_only(synth_trace):
    r = whatif(synth_trace, {"overlap.interference": 0.4})
    r2 = pickle.loads(pickle.dumps(r))
    assert r2._layout is not None
    np.testing.assert_array_equal(r2.start_ns, r.start_ns)
    np.testing.assert_array_equal(r2.crit_pred, r.crit_pred)
    r3 = pickle.loads(pickle.dumps(r))  # after r's mapping: op-order arrays travel
    assert r3._layout is None and np.array_equal(r3.end_ns, r.end_ns)
    with pytest.raises(AttributeError):
        r.start_ns = r.end_ns
    with pytest.raises(TypeError):
        ReplayResult(r.trace, r.graph)
    df = r.to_frame()
    assert (df["replay_dur_ns"].to_numpy() == r.end_ns - r.start_ns).all()


def test_deferred_scaling_equals_materialized(synth_trace):
    f = Hardware(compute_speedup=1.7, comm_speedup=0.6).factors()
    cls = kernel_class(synth_trace)
    outs = []
    for touch in (False, True):
        st = WhatIfState(trace=synth_trace, synth=SynthSpec.from_trace(synth_trace))
        st.materialize([])
        st.scale_by_class(cls, f)
        if touch:
            assert st.dur is not None  # a policy reads the durations: made in op-id order
            assert st._scale is None
        outs.append(st.layout_durations(st.graph))
    (a, ca), (b, cb) = outs
    assert ca and cb
    np.testing.assert_array_equal(a, b)
    # against numpy in op-id order: rounded products, in layout order
    g = st.graph
    d = np.rint(g.op_dur_ns.astype(np.float64) * f[cls]).astype(np.int64)
    np.testing.assert_array_equal(a, d[g.perm])


@pytest.mark.parametrize("disorder", ["nearly", "shuffled", "ties"])
def test_metric_spans_layout_matches_plain_python(disorder):
    rng = np.random.default_rng(11)
    n_r, per = 4, 4000
    rank = np.repeat(np.arange(n_r), per)
    rng.shuffle(rank)  # ranks interleave in layout order
    n = len(rank)
    base = 10**15
    st = np.sort(rng.random(n) * 1e9)
    if disorder == "ties":
        st = np.floor(st / 1e7) * 1e7
    if disorder == "nearly":
        i = rng.integers(0, n - 1, 50)
        st[i], st[i + 1] = st[i + 1].copy(), st[i].copy()
    elif disorder == "shuffled":
        rng.shuffle(st)
    en = st + rng.random(n) * 1e6
    kind = np.where(rng.random(n) < 0.85, np.where(rng.random(n) < 0.6, 2, 1), 0).astype(np.int8)
    kind[rank == 2] = 0  # a rank without device ops
    pos = np.flatnonzero(kind > 0)
    slot = np.full(n, -1, np.int32)
    slot[pos[np.argsort(rank[pos], kind="stable")]] = np.arange(len(pos), dtype=np.int32)
    dev_ptr = np.searchsorted(np.sort(rank[pos]), np.arange(n_r + 1)).astype(np.int64)
    lo = np.full(n_r, np.iinfo(np.int64).max, np.int64)
    hi = np.full(n_r, np.iinfo(np.int64).min, np.int64)
    both, x, has_x = np.zeros(n_r, np.int64), np.zeros(n_r, np.int64), np.zeros(n_r, bool)
    nd = len(pos)
    _metric_spans_layout(st, en, np.int64(base), slot, kind, rank.astype(np.int64), dev_ptr,
                         lo, hi, both, x, has_x, np.empty(nd, np.int64), np.empty(nd, np.int64),
                         np.empty(nd, np.bool_))
    s = np.rint(st).astype(np.int64) + base
    e = np.rint(en).astype(np.int64) + base

    def union(sel):
        return _union(zip(s[sel].tolist(), e[sel].tolist(), strict=True))

    for r in range(n_r):
        mine = rank == r
        assert lo[r] == s[mine].min() and hi[r] == e[mine].max()
        assert both[r] == union(mine & (kind > 0))
        assert x[r] == union(mine & (kind == 2))
        assert has_x[r] == bool((mine & (kind == 2)).any())
    assert both[2] == 0 and not has_x[2]


def test_block_slots_and_group_spans_equal_numpy():
    rng = np.random.default_rng(5)
    n, n_r = 20_000, 6
    ridx = rng.integers(0, n_r, n).astype(np.int64)
    kind = rng.integers(0, 3, n).astype(np.int8)
    pos = np.flatnonzero(kind > 0)
    dev_ptr = np.searchsorted(np.sort(ridx[pos]), np.arange(n_r + 1)).astype(np.int64)
    slot = np.empty(n, np.int32)
    _block_slots(kind, ridx, dev_ptr, slot)
    want = np.full(n, -1, np.int32)
    want[pos[np.argsort(ridx[pos], kind="stable")]] = np.arange(len(pos))
    np.testing.assert_array_equal(slot, want)
    s = rng.integers(-10**12, 10**12, n)
    e = s + rng.integers(0, 10**6, n)
    lo = np.full(n_r, np.iinfo(np.int64).max, np.int64)
    hi = np.full(n_r, np.iinfo(np.int64).min, np.int64)
    _group_spans(ridx, s, e, lo, hi)
    for r in range(n_r):
        assert lo[r] == s[ridx == r].min() and hi[r] == e[ridx == r].max()
