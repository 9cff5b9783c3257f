"""How a CPU rank's gloo transfers and its training thread overlapped, read from the trace
(used by :mod:`.bucketing_cpu`): overlap of intervals, isolated transfer times under a
given slowdown, and the fits of the slowdown the trace itself shows."""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["FIT_COMM_TOL", "HANDOFFS_PER_RING_STEP", "SCHED_SLICE_NS", "alone_mask",
           "fit_comm_slowdown", "fit_interference", "isolated_transfer", "overlap_ns",
           "turn_delay_ns"]


def overlap_ns(lo: np.ndarray, hi: np.ndarray, ilo: np.ndarray, ihi: np.ndarray) -> np.ndarray:
    """Per interval ``[lo, hi)``: total overlap with the disjoint sorted intervals ``ilo/ihi``."""
    if len(ilo) == 0:
        return np.zeros(len(lo))
    cum = np.concatenate([[0.0], np.cumsum((ihi - ilo).astype(np.float64))])

    def covered(t):  # measure of the union below t
        k = np.searchsorted(ilo, t, side="right")
        part = np.clip(t - ilo[np.maximum(k - 1, 0)], 0, (ihi - ilo)[np.maximum(k - 1, 0)])
        return np.where(k > 0, cum[np.maximum(k - 1, 0)] + part, 0.0)

    return np.maximum(covered(hi.astype(np.float64)) - covered(lo.astype(np.float64)), 0.0)


def isolated_transfer(lo, hi, blo, bhi, interference) -> np.ndarray:
    """Isolated transfer time of each of a rank's all-reduces ``[lo, hi)``: at every instant
    the ``k`` running ones share the communication thread's rate, which is ``1 / (1 + i)``
    while the training thread is busy (``blo/bhi``) and 1 otherwise (``i`` one value or
    one per all-reduce)."""
    cuts = np.unique(np.concatenate([lo, hi, blo, bhi]))
    if len(cuts) < 2:
        return np.zeros(len(lo))
    a, b = cuts[:-1], cuts[1:]
    mid = (a + b) / 2.0
    busy = overlap_ns(a, b, blo, bhi) > 0
    on = (lo[:, None] <= mid[None, :]) & (mid[None, :] < hi[:, None])  # ops x segments
    k = np.maximum(on.sum(axis=0), 1)
    i = np.broadcast_to(np.asarray(interference, np.float64), (len(lo),))[:, None]
    rate = np.where(busy[None, :], 1.0 / (1.0 + i), 1.0) / k[None, :]
    return (on * (b - a)[None, :] * rate).sum(axis=1)


def alone_mask(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Mask of the intervals that overlap no other one."""
    o = np.argsort(lo, kind="stable")
    a, b = lo[o], hi[o]
    prev_hi = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(b)[:-1]])
    next_lo = np.concatenate([a[1:], [np.iinfo(np.int64).max]])
    ok = (a >= prev_hi) & (b <= next_lo)
    out = np.zeros(len(lo), bool)
    out[o] = ok
    return out


def fit_interference(pts: np.ndarray) -> float | None:
    """The interference ``i`` the trace itself shows, for checking the model's value: an
    all-reduce running alone on its rank's gloo thread lasts ``a + S b`` less ``i / (1 + i)``
    of its overlap ``O`` with training-thread work (it progresses at ``1 / (1 + i)`` then),
    so its non-overlapped time is ``a + S b - O / (1 + i)``: a least-squares fit over the
    trace's all-reduces. None without enough of them (8) or of a spread in ``O``."""
    if len(pts) < 8:
        return None
    nb, ov, dur = pts.T
    if ov.max() - ov.min() < 0.25 * np.median(dur):
        return None
    cols = [np.ones(len(nb)), ov]
    if nb.max() >= 1.5 * nb.min():
        cols.append(nb)
    sol, *_ = np.linalg.lstsq(np.stack(cols, axis=1), dur - ov, rcond=None)
    slope = -float(sol[1])  # = 1 / (1 + i)
    return float(1.0 / slope - 1.0) if slope > 0 else None


#: how far from the best spread a comm slowdown still explains the trace's transfers (the
#: range's bounds of :func:`fit_comm_slowdown`): 5% more log-spread
FIT_COMM_TOL = 1.05


def fit_comm_slowdown(parts, bound: str | None = None) -> tuple[float, dict] | None:
    """The communication side's own slowdown next to compute, from the trace's own transfers.

    A gloo transfer overlapping the training thread waits for the CPU at each hand-off, so
    it can last several times its isolated time (the pair kit's probe: 1 MiB at 1600 Mbit/s
    in 18-27 ms next to compute, 1-5 ms alone) while compute loses little. ``parts``: per
    rank ``(start, end, payload bytes)`` of its transfers and the training thread's busy
    intervals ``(blo, bhi)``. Transfers are compared within a size class (sizes within
    ~1.5x): where a class holds transfers that ran mostly under compute (>= 50% of their
    time) and some that ran mostly not (<= 20%), at least 3 of each over the classes, the
    ``i`` (rate ``1 / (1 + i)`` under compute) whose isolated times
    (:func:`isolated_transfer`: concurrent transfers share the link) agree best within
    their classes (least spread of log time) separates the two; ``bound`` ``"low"`` /
    ``"high"``: the smallest / largest ``i`` within :data:`FIT_COMM_TOL` of that spread (the
    range). None (the trace cannot tell: sizes confounded with overlap, or too few)
    otherwise, or when the spread does not single out a value (both ends of the grid fit)."""
    if not parts:
        return None
    fr = np.concatenate([overlap_ns(lo, hi, blo, bhi) / np.maximum(hi - lo, 1)
                         for lo, hi, _s, blo, bhi in parts])
    size = np.concatenate([np.asarray(s_, np.float64) for _l, _h, s_, _b, _e in parts])
    cls = np.rint(np.log(np.maximum(size, 1.0)) / np.log(1.5)).astype(np.int64)
    under, free = fr >= 0.5, fr <= 0.2
    both = np.intersect1d(cls[under], cls[free])
    use = np.isin(cls, both) & (under | free)
    n_under, n_free = int((use & under).sum()), int((use & free).sum())
    if n_under < 3 or n_free < 3:
        return None
    grid = np.concatenate([[0.0], np.geomspace(0.05, 40.0, 60)])
    sd = []
    for i in grid:
        y = np.log(np.maximum(np.concatenate([isolated_transfer(lo, hi, blo, bhi, i)
                                              for lo, hi, _s, blo, bhi in parts]), 1.0))[use]
        c = cls[use]
        mean = pd.Series(y).groupby(c).transform("mean").to_numpy()
        sd.append(float(np.sqrt(np.mean((y - mean) ** 2))))
    sd = np.asarray(sd)
    ok = grid[sd <= FIT_COMM_TOL * sd.min()]
    if ok.min() == grid[0] and ok.max() == grid[-1]:
        return None
    best = float(grid[int(np.argmin(sd))])
    pick = {None: best, "low": float(ok.min()), "high": float(ok.max())}[bound]
    return pick, {"comm_slowdown_fit": best, "comm_slowdown_bounds": [float(ok.min()),
                                                                       float(ok.max())],
                  "transfers_under_compute": n_under, "transfers_free": n_free}


#: a scheduler turn (ns): Linux's default base slice for a normal task, 0.75 ms scaled by
#: ``1 + log2(min(cpus, 8))`` (kernel/sched/fair.c, ``sysctl_sched_base_slice``, EEVDF since
#: 6.6): 3 ms on a host of 8 or more CPUs (collectors/costs/REFERENCES.md H12)
SCHED_SLICE_NS = 3_000_000
#: thread hand-offs of one gloo ring step: the socket's data wakes gloo's device loop
#: thread, which wakes the collective's worker thread
HANDOFFS_PER_RING_STEP = 2


def turn_delay_ns(n_ranks: int, bound: str | None = None) -> float:
    """What a gloo ring all-reduce of ``n_ranks`` loses next to a busy training thread on its
    core, when the trace cannot show it (no transfer of it ran both under compute and not):
    each of its ``2 (n - 1)`` ring steps hands off :data:`HANDOFFS_PER_RING_STEP` times, and
    a thread woken next to a running one waits up to a scheduler turn
    (:data:`SCHED_SLICE_NS`) for the core. A fixed cost on top of the transfer's bytes, not a
    rate: the pair kit's probe measured 1 MiB 13-24 ms and 4 MiB 11-14 ms slower next to
    compute at 400-1600 Mbit/s. ``bound`` ``"low"``: one hand-off per ring step (the loop
    thread's wake-up found the core free); ``"high"``: twice the hand-offs (each one waited
    a full turn on both ranks)."""
    steps = 2 * max(int(n_ranks) - 1, 1)
    per = {None: HANDOFFS_PER_RING_STEP, "low": 1, "high": 2 * HANDOFFS_PER_RING_STEP}[bound]
    return float(steps * per * SCHED_SLICE_NS)
