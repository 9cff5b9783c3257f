"""The contention path's kernel (replay/_fluid.py, _fluid_jobs.py, _fluid_queues.py) against the pure-Python
reference on the cases its speed-ups rely on: many events at the same time (the start FIFO
behind the start heap, heap ties broken by sequence), interference switching on and off at
once on several devices, and lane links repeated by edges (left out of the constraint
lists)."""

from __future__ import annotations

import numpy as np
import pytest
from naive_replay import naive_fluid, random_trace

from retime.collectors.synth import synthesize
from retime.replay import ContentionModel, build_graph, simulate
from retime.replay._succ import _succ_lists

MODELS = [ContentionModel(slowdown=f, share_compute=sc, share_links=sl)
          for f in (0.5, 1.0) for sc in (False, True) for sl in (False, True)]


def _same_as_reference(g, d, cm):
    r = simulate(g, durations_ns=d, mode="contention", contention=cm)
    s, e, c, clamped = naive_fluid(g, d, cm.slowdown, cm.share_compute, cm.share_links)
    np.testing.assert_array_equal(r.start_ns, s)
    np.testing.assert_array_equal(r.end_ns, e)
    np.testing.assert_array_equal(r.crit_pred, c)
    assert r.meta["contention"]["clamped_starts"] == clamped
    return r


def _coarse(g, unit):
    """Durations rounded to a coarse unit: many ops end (and start) at the same time."""
    d = (np.round(g.op_dur_ns / unit) * unit).astype(np.int64)
    return np.where(g.by_op(g.coll_of) >= 0, d, np.maximum(d, 0))


@pytest.mark.parametrize("seed", range(12))
def test_ties_and_concurrent_flows_match_reference(seed):
    tr = random_trace(seed, n_ranks=4, steps=6, gpu_lanes=3, p_coll=0.7, p_p2p=0.3,
                      p_sync=0.2)
    g = build_graph(tr, ideal=bool(seed % 2))
    d = _coarse(g, 5_000)
    # the rounding makes equal event times common: the check below is about ties
    r = simulate(g, durations_ns=d, mode="contention", contention=MODELS[0])
    ends = np.concatenate([r.start_ns, r.end_ns])
    assert ends.size - np.unique(ends).size > 0.15 * ends.size
    for cm in MODELS:
        _same_as_reference(g, d, cm)


def test_synthesized_run_with_repeated_lane_links_matches_reference():
    tr = synthesize("gpt3-125m", "a100-80gb", tp=2, pp=2, dp=2, global_batch=4, micro_batch=2)
    g = build_graph(tr)
    lists = _succ_lists(g.lane_prev, g.lane_lag_ns, g.lane_s2s, g.pred_ptr, g.pred_src,
                        g.pred_lag_ns, g.pred_s2s)
    n_lane = int((g.lane_prev >= 0).sum())
    # the synthesized run repeats most lane links with an edge: they are left out
    assert lists[1].size < n_lane + g.pred_src.size
    rng = np.random.default_rng(5)
    d = np.maximum((g.op_dur_ns * rng.uniform(0.5, 1.5, g.n_ops)).astype(np.int64), 0)
    for cm in MODELS[:4]:
        _same_as_reference(g, None, cm)
        _same_as_reference(g, d, cm)


def test_constraint_lists_leave_out_only_repeated_lane_links():
    # ops 0..5; lanes: 0 -> 1 -> 2 -> 3 -> 4 -> 5 (op 3's lane link counts from the start)
    lane_prev = np.array([-1, 0, 1, 2, 3, 4], np.int32)
    lane_lag = np.array([0, 0, 5, 0, 0, 0], np.int64)
    lane_s2s = np.array([False, False, False, True, False, False])
    # edges by destination: 1 <- 0 (repeats the lane link), 2 <- 1 (lag 7 > lane lag 5:
    # its term may win, kept), 3 <- 2 end-to-start (another kind than the lane link),
    # 4 <- 3 lag -2 and 4 <- 0, 5 <- 4 twice
    pred_ptr = np.array([0, 0, 1, 2, 3, 5, 7], np.int32)
    pred_src = np.array([0, 1, 2, 3, 0, 4, 4], np.int32)
    pred_lag = np.array([0, 7, 0, -2, 0, 0, 0], np.int64)
    pred_s2s = np.zeros(7, np.bool_)
    sptr, succ, cnt0, smid, pptr, pent = _succ_lists(lane_prev, lane_lag, lane_s2s, pred_ptr,
                                                     pred_src, pred_lag, pred_s2s)
    # lane links of 1, 2, 4, 5 are repeated by an edge of the same kind: left out
    assert cnt0.tolist() == [0, 1, 1, 2, 2, 2]
    lists = [(succ[sptr[i]:smid[i]].tolist(), succ[smid[i]:sptr[i + 1]].tolist())
             for i in range(6)]
    assert lists == [([], [1, 4]), ([], [2]), ([3], [3]), ([], [4]), ([], [5, 5]), ([], [])]
    terms = [[(int(pent[2 * k] >> 1), bool(pent[2 * k] & 1), int(pent[2 * k + 1]))
              for k in range(pptr[i], pptr[i + 1])] for i in range(6)]
    assert terms == [[], [(0, False, 0)], [(1, False, 5), (1, False, 7)],
                     [(2, True, 0), (2, False, 0)], [(3, False, 0), (0, False, 0)],
                     [(4, False, 0)]]


@pytest.mark.parametrize("seed", range(3))
def test_job_list_turns_into_a_heap_past_its_limit(seed):
    """Without rate sharing the running jobs start as a sorted list and become a heap once
    more than _LMAX of them run (replay._fluid_queues): the switch keeps the order
    (ties included) and the heap form matches the reference too."""
    from retime.replay._fluid_queues import _LMAX

    tr = random_trace(100 + seed, n_ranks=32, steps=3, gpu_lanes=3, p_coll=0.5, p_p2p=0.3,
                      p_sync=0.1)
    g = build_graph(tr)
    d = _coarse(g, 5_000)
    for cm in (MODELS[0], MODELS[4]):  # interference 0.5 / 1.0, no sharing: list first
        r = _same_as_reference(g, d, cm)
    # the switch happened: more than _LMAX single-op jobs ran at once
    res = g.by_op(g.resource)
    job = (res > 0) & (g.by_op(g.coll_of) < 0) & (r.end_ns > r.start_ns)
    t = np.concatenate([r.start_ns[job], r.end_ns[job]])
    step = np.concatenate([np.ones(job.sum(), np.int64), -np.ones(job.sum(), np.int64)])
    o = np.lexsort((step, t))  # ends before starts at equal times
    assert np.cumsum(step[o]).max() > _LMAX


def test_job_list_to_heap_keeps_the_event_order():
    """The list -> heap switch (replay._fluid_queues._jto_heap): positions, heap order and the
    order of equal times (the list's: the oldest key next) are kept, below the sequence
    numbers keys get later."""
    from retime.replay._fluid_jobs import _NI
    from retime.replay._fluid_queues import _I_POS, _jto_heap

    rng = np.random.default_rng(3)
    size, seq = 101, 5_000
    t = np.sort(rng.integers(0, 12, size).astype(np.float64))[::-1].copy()  # many ties
    js = rng.permutation(size).astype(np.int64)
    next_first = js[::-1].copy()  # the list's events, next first: from its end
    jt, jq, si = t.copy(), np.empty(size + 2, np.int64), np.full((size, _NI), -7, np.int64)
    _jto_heap(jt, jq, js, si, size, seq)
    assert (jq[:size] < seq).all() and np.unique(jq[:size]).size == size
    np.testing.assert_array_equal(si[js, _I_POS], np.arange(size))
    for c in range(1, size):  # (time, sequence) heap order
        p = (c - 1) // 2
        assert (jt[p], jq[p]) < (jt[c], jq[c])
    np.testing.assert_array_equal(js[np.lexsort((jq[:size], jt))], next_first)


@pytest.mark.parametrize("seed", range(6))
def test_asymmetric_interference_matches_reference(seed):
    """Compute and communication slowed by different amounts (the gloo CPU model: compute
    barely slowed, transfers waiting for the scheduler), per op on the communication side."""
    tr = random_trace(seed, n_ranks=4, steps=5, gpu_lanes=3, p_coll=0.7, p_p2p=0.3,
                      p_sync=0.2)
    g = build_graph(tr, ideal=bool(seed % 2))
    d = _coarse(g, 5_000)
    rng = np.random.default_rng(seed)
    per_op = rng.uniform(0.0, 3.0, g.n_ops)
    for slow, comm, cap in ((0.0, 2.0, False), (0.25, per_op, False), (0.0, per_op, False),
                            (0.0, per_op, True), (0.25, 0.5, True)):
        for sc, sl in ((False, False), (False, True), (True, False), (True, True)):
            cm = ContentionModel(slowdown=slow, share_compute=sc, share_links=sl,
                                 comm_slowdown=comm, comm_cap=cap)
            r = simulate(g, durations_ns=d, mode="contention", contention=cm)
            s, e, c, clamped = naive_fluid(g, d, slow, sc, sl, comm_interference=comm,
                                           comm_cap=cap)
            np.testing.assert_array_equal(r.start_ns, s)
            np.testing.assert_array_equal(r.end_ns, e)
            assert r.meta["contention"]["clamped_starts"] == clamped
    # a comm-only slowdown stretches the run, and not as much as slowing both sides
    base = simulate(g, durations_ns=d, mode="contention",
                    contention=ContentionModel(share_links=False))
    one = simulate(g, durations_ns=d, mode="contention",
                   contention=ContentionModel(share_links=False, comm_slowdown=2.0))
    both = simulate(g, durations_ns=d, mode="contention",
                    contention=ContentionModel(slowdown=2.0, share_links=False))
    assert base.end_ns.max() <= one.end_ns.max() <= both.end_ns.max()
    # a cap keeps concurrent transfers' own rates: never slower than the product
    shared = dict(share_links=True, comm_slowdown=2.0)
    prod = simulate(g, durations_ns=d, mode="contention", contention=ContentionModel(**shared))
    capd = simulate(g, durations_ns=d, mode="contention",
                    contention=ContentionModel(**shared, comm_cap=True))
    assert capd.end_ns.max() <= prod.end_ns.max()


@pytest.mark.parametrize("seed", range(4))
def test_per_kernel_compute_slowdown_matches_reference(seed):
    """Compute slowed per kernel (a memory-bound kernel more than a compute-bound one next
    to NCCL), alone and with a per-op communication slowdown: the kernel matches the
    reference, and slowing one compute op more never finishes the run earlier."""
    tr = random_trace(seed, n_ranks=4, steps=4, gpu_lanes=3, p_coll=0.7, p_p2p=0.3,
                      p_sync=0.2)
    g = build_graph(tr, ideal=bool(seed % 2))
    d = _coarse(g, 5_000)
    rng = np.random.default_rng(100 + seed)
    comp = rng.uniform(0.0, 1.5, g.n_ops)
    comm = rng.uniform(0.0, 1.0, g.n_ops)
    for slow, cm_c, cm_m in ((0.0, comp, None), (0.3, comp, comm), (0.0, comp, 0.5)):
        for sc, sl in ((False, False), (True, True), (False, True)):
            cm = ContentionModel(slowdown=slow, share_compute=sc, share_links=sl,
                                 comm_slowdown=cm_m, compute_slowdown=cm_c)
            r = simulate(g, durations_ns=d, mode="contention", contention=cm)
            s, e, _c, clamped = naive_fluid(g, d, slow, sc, sl, comm_interference=cm_m,
                                            compute_interference=cm_c)
            np.testing.assert_array_equal(r.start_ns, s)
            np.testing.assert_array_equal(r.end_ns, e)
            assert r.meta["contention"]["clamped_starts"] == clamped
    # a uniform per-op array is the scalar
    flat = ContentionModel(slowdown=0.4, share_links=False)
    arr = ContentionModel(slowdown=0.4, share_links=False,
                          compute_slowdown=np.full(g.n_ops, 0.4))
    a = simulate(g, durations_ns=d, mode="contention", contention=flat)
    b = simulate(g, durations_ns=d, mode="contention", contention=arr)
    np.testing.assert_array_equal(a.end_ns, b.end_ns)
    with pytest.raises(Exception, match="compute_slowdown has 3 values"):
        simulate(g, durations_ns=d, mode="contention",
                 contention=ContentionModel(compute_slowdown=np.ones(3)))
