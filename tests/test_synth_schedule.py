"""Pipeline schedules of the synthesizer against the closed forms (PUBLISHED.md §2)."""

from __future__ import annotations

import numpy as np
import pytest

from retime.collectors.synth import (
    LANES,
    CommModel,
    LayerTemplate,
    OpTemplate,
    ParallelConfig,
    StepTemplate,
    bubble_fraction,
    build_trace,
    load_hardware,
    max_in_flight,
    stage_order,
)

HW = load_hardware("a100-80gb")


def _uniform(sched: str, p: int, m: int, v: int, f_ns: int, b_ns: int):
    """A pipeline of identical layers, free communication, no optimizer."""
    layer = LayerTemplate((OpTemplate("f", "compute", f_ns),), (OpTemplate("b", "compute", b_ns),))
    tpl = StepTemplate(layers=(layer,) * (2 * p * v), optimizer_kernels=())
    par = ParallelConfig(pp=p, global_batch=m, schedule=sched, chunks=v)
    return build_trace(tpl, par, CommModel(HW, par), p2p_ns=0, recv_ns=0), par


@pytest.mark.parametrize("sched,p,m,v", [
    ("gpipe", 4, 8, 1), ("gpipe", 2, 1, 1), ("1f1b", 4, 8, 1), ("1f1b", 8, 3, 1),
    ("1f1b", 8, 32, 1), ("interleaved", 4, 8, 2), ("interleaved", 4, 4, 3),
    ("interleaved", 8, 16, 4), ("interleaved", 16, 16, 8), ("bfs", 4, 8, 2), ("bfs", 4, 4, 2), ("bfs", 2, 6, 3),
])
@pytest.mark.parametrize("f_ns,b_ns", [(1000, 2000), (1500, 1500)])
def test_bubble_equals_closed_form(sched, p, m, v, f_ns, b_ns):
    tr, par = _uniform(sched, p, m, v, f_ns, b_ns)
    o = tr.ops
    step = (o["start_ns"] + o["dur_ns"]).max() - o["start_ns"].min()
    busy_per_stage = m * v * 2 * (f_ns + b_ns)  # 2 layers per chunk
    idle = 1 - busy_per_stage / step
    assert idle == pytest.approx(bubble_fraction(sched, p, m, v), abs=1e-12)
    # every stage's compute stream is idle for the same fraction
    assert np.allclose(tr.meta["synth"]["compute_idle_fraction"], idle)


@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 3, 8, 16])
def test_in_flight_microbatches(p, m):
    for i in range(p):
        assert max_in_flight(stage_order("1f1b", p, m, 1, i)) == min(p - i, m)
        assert max_in_flight(stage_order("gpipe", p, m, 1, i)) == m


def test_in_flight_from_scheduled_trace():
    """The timed trace keeps at most min(p-i, m) micro-batches alive on stage i (1F1B)."""
    p, m = 4, 6
    tr, _ = _uniform("1f1b", p, m, 1, 1000, 2000)
    o = tr.ops
    for i in range(p):
        # compute ops only: a received input may arrive early and wait in its buffer
        s = o[(o["stage"] == i) & (o["rank"] == i) & (o["lane"] % len(LANES) == 0)]
        first_f = s[s["phase"] == 0].groupby("microbatch")["start_ns"].min()
        last_b = (s[s["phase"] == 1].assign(end=lambda d: d["start_ns"] + d["dur_ns"])
                  .groupby("microbatch")["end"].max())
        events = sorted([(t, 1) for t in first_f] + [(t, -1) for t in last_b])
        live = peak = 0
        for _, d in events:
            live += d
            peak = max(peak, live)
        assert peak == min(p - i, m)


def test_every_item_once_and_causal():
    for sched, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("bfs", 3)):
        p, m = 4, 8
        for i in range(p):
            order = stage_order(sched, p, m, v, i)
            assert sorted(order) == sorted({(b, mb, c) for b in (False, True)
                                            for mb in range(m) for c in range(v)})
            pos = {it: k for k, it in enumerate(order)}
            assert all(pos[(False, mb, c)] < pos[(True, mb, c)]
                       for mb in range(m) for c in range(v))


def test_interleaved_needs_multiple_of_p():
    from retime.collectors.errors import ConfigError
    with pytest.raises(ConfigError, match="multiple of pp=4"):
        ParallelConfig(pp=4, global_batch=6, schedule="interleaved", chunks=2)


def _naive_schedule(dur, lane, src, dst, lag, group=None):
    """Obvious reference: repeat relaxation until start times stop changing; members of a
    collective group start at the latest member's ready time."""
    group = group or [-1] * len(dur)
    n = len(dur)
    preds = [[] for _ in range(n)]
    for s, d, g in zip(src, dst, lag):
        preds[d].append((s, g))
    last = {}
    for i in range(n):  # FIFO lanes: previous op on the same lane
        if lane[i] in last:
            preds[i].append((last[lane[i]], 0))
        last[lane[i]] = i
    start = [0] * n
    for _ in range(2 * n + 2):
        ready = [max([start[p] + dur[p] + g for p, g in preds[i]], default=0)
                 for i in range(n)]
        together = {}
        for i in range(n):
            if group[i] >= 0:
                together[group[i]] = max(together.get(group[i], 0), ready[i])
        new = [together[group[i]] if group[i] >= 0 else ready[i] for i in range(n)]
        if new == start:
            return start
        start = new
    raise AssertionError("cycle")


@pytest.mark.parametrize("seed", range(20))
def test_list_schedule_matches_reference(seed):
    from retime.collectors.synth._kernels import _list_schedule
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 120))
    dur = rng.integers(0, 1000, n).astype(np.int64)
    lane = rng.integers(0, 5, n).astype(np.int32)
    e = int(rng.integers(0, 3 * n))
    a = rng.integers(0, n, e)
    b = rng.integers(0, n, e)
    keep = a != b
    src = np.minimum(a, b)[keep].astype(np.int64)  # forward edges only: a DAG
    dst = np.maximum(a, b)[keep].astype(np.int64)
    lag = rng.integers(0, 50, len(src)).astype(np.int64)
    group = np.full(n, -1, np.int64)
    start, done = _list_schedule(dur, lane, 5, src, dst, lag, group)
    assert done == n
    assert start.tolist() == _naive_schedule(dur.tolist(), lane.tolist(), src.tolist(),
                                             dst.tolist(), lag.tolist())
    # two ops on different lanes become one collective: they start together, or (when
    # one depends on the other through lanes and edges) the schedule has a cycle
    by_lane: dict[int, int] = {}
    for i in rng.permutation(n):
        by_lane.setdefault(int(lane[i]), int(i))
    pair = list(by_lane.values())[:2]
    if len(pair) == 2:
        group[pair] = 0
        start, done = _list_schedule(dur, lane, 5, src, dst, lag, group)
        try:
            ref = _naive_schedule(dur.tolist(), lane.tolist(), src.tolist(), dst.tolist(),
                                  lag.tolist(), group.tolist())
        except AssertionError:  # the reference found a cycle: the kernel must stop short
            assert done < n
        else:
            assert done == n and start.tolist() == ref
            assert start[pair[0]] == start[pair[1]]


def test_list_schedule_reports_cycles():
    from retime.collectors.synth._kernels import _list_schedule
    dur = np.ones(3, np.int64)
    lane = np.arange(3, dtype=np.int32)
    src = np.array([0, 1, 2], np.int64)
    dst = np.array([1, 2, 0], np.int64)
    _, done = _list_schedule(dur, lane, 3, src, dst, np.zeros(3, np.int64),
                             np.full(3, -1, np.int64))
    assert done == 0


def test_collective_members_start_together():
    from retime.collectors.synth._kernels import _list_schedule
    # op 0 (lane 0, 5 ns) -> op 1 (lane 0, member); op 2 (lane 1, member) has no preds;
    # op 3 follows op 2 on lane 1
    dur = np.array([5, 3, 2, 4], np.int64)
    lane = np.array([0, 0, 1, 1], np.int32)
    src, dst = np.array([0], np.int64), np.array([1], np.int64)
    group = np.array([-1, 0, 0, -1], np.int64)
    start, done = _list_schedule(dur, lane, 2, src, dst, np.zeros(1, np.int64), group)
    assert done == 4 and start.tolist() == [0, 5, 5, 7]


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (8, 3, 16), (4, 4, 12)])
def test_interleaved_first_stage_memory_matches_korthikanti(p, v, m):
    """First pipeline rank under interleaving holds L * (1 + (p-1)/(p v)) layers' activations
    (Korthikanti et al. 2022, section 4.2.3), L = layers of the whole model; chunks hold
    L/(p v) layers each."""
    L = p * v * 6
    chunks_alive = max_in_flight(stage_order("interleaved", p, m, v, 0))
    layers_alive = chunks_alive * L // (p * v)
    assert layers_alive == pytest.approx(L * (1 + (p - 1) / (p * v)))
