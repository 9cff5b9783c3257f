"""Transfer times of a CPU (gloo) DDP trace's all-reduces (used by :mod:`.bucketing_cpu`).

The alpha-beta fit ``t = a + S f / B`` of the old buckets' isolated transfer times
(:func:`_fit_cpu`, with the link's aggregate rate when the sizes are too alike or the
buckets ran concurrently on gloo's worker threads, :func:`_ran_concurrently`), the bytes a
shaped link's saved tokens carry for each new bucket (:func:`_new_credits`), and the floor a
capture's overlap probe puts on a new bucket's alone time (:func:`_probe_alone_ns`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from retime.collectors.enums import CommOp
from retime.collectors.errors import PolicyError
from retime.collectors.intervals import interval_union

from .host_cpu import OverlapProbe
from .link_fit import TCP_GOODPUT, bus_factor, spend_tokens

__all__ = ["GLOO_STEP_US", "DISTURBED_X", "CONCURRENT_SHARE"]

#: fixed cost of one gloo ring step over TCP on one host (us): a socket round trip and a
#: worker-thread wake-up. Used only when the trace's bucket sizes are too alike to fit the
#: intercept (2-rank all-reduces of 4 KB take 0.3-0.6 ms on a 2-core VM: 2 ring steps).
GLOO_STEP_US = 100.0
#: a rank's step whose transfers took over this many times the median time per byte was
#: disturbed (its threads descheduled) and is left out of the bandwidth fit
DISTURBED_X = 2.0
#: a rank's transfers ran concurrently when the time two of them were in flight at once
#: (their summed durations less the union of their intervals) is at least this share of the
#: time its link was busy; below it the equal split of the shared time moves under a tenth
#: of the fitted time
CONCURRENT_SHARE = 0.1


def _probe_alone_ns(probe: OverlapProbe, nbytes: np.ndarray, f: float,
                    own_link: tuple[float, float] | None) -> np.ndarray:
    """Alone time (ns) of new buckets of ``nbytes`` payload bytes on an undeclared link with
    a calibration file: the longer of the probe's line and the link as the trace's own
    buckets showed it (``own_link``: ``(alpha_ns, ns per bus byte)``, the plain trace's fit).

    The probe times each size once after an idle link, so a token bucket's burst is in its
    times (1 MiB in 1-3 ms on a 1600 Mbit/s link that paces it in 5), and its line through
    two sizes (1 and 4 MiB) mixes saved tokens with paced bytes. A step's buckets follow one
    another and drain the burst: they cannot beat the rate the link sustained for the trace's
    own buckets during training. The probe adds what that rate does not show (a fixed cost
    per transfer where it is slower)."""
    t = probe.alone_ns(nbytes)
    if own_link is None or not (own_link[1] > 0):
        return t
    return np.maximum(t, own_link[0] + nbytes * f * own_link[1])


def _ran_concurrently(spans: dict, a_start: np.ndarray, end: np.ndarray) -> bool:
    """Whether some rank's old buckets ran at the same time for at least
    :data:`CONCURRENT_SHARE` of the time its link was busy (gloo's worker threads take a
    rank's buckets in turn: the emb pair's six buckets ran two at a time)."""
    for tr, _blo, _bhi in spans.values():
        if len(tr) < 2:
            continue
        lo, hi = a_start[tr].astype(np.float64), end[tr].astype(np.float64)
        ulo, uhi = interval_union(lo, hi)
        busy = float((uhi - ulo).sum())
        if busy > 0 and float((hi - lo).sum()) - busy >= CONCURRENT_SHARE * busy:
            return True
    return False


def _new_credits(new_rows: list[dict], alpha: float, inv_b: float, f: float,
                 shaper: tuple[float, float]) -> np.ndarray:
    """Payload bytes each new bucket's transfer sends on tokens the shaped link saved
    (:func:`link_fit.spend_tokens`): each rank's new buckets in order, issued at their ready
    times, lasting ``a + (S f - c) / B``; the bucket is full before a step's first one."""
    out = np.zeros(len(new_rows))
    by_rank: dict[int, list[int]] = {}
    for i, row in enumerate(new_rows):
        by_rank.setdefault(int(row["rank"]), []).append(i)
    for rows in by_rank.values():
        rows.sort(key=lambda i: (new_rows[i]["step"], new_rows[i]["coll_j"]))
        x = np.asarray([new_rows[i]["bytes"] * f for i in rows], np.float64)
        out[rows] = spend_tokens(
            np.asarray([new_rows[i]["start_ns"] for i in rows], np.float64), x / TCP_GOODPUT,
            *shaper, refill=np.asarray([new_rows[i]["coll_j"] == 0 for i in rows]),
            dur_of=lambda k, c, x=x: alpha + max(x[k] - c, 0.0) * inv_b)
    return out


def _fit_cpu(trace, is_ar, nbytes, y, ranks_per_node, concurrent: bool = False):
    """Alpha-beta fit ``t = a + S f / B`` of the old buckets' isolated transfer times.

    ``concurrent``: a rank's old buckets ran at the same time (on gloo's worker threads)
    over its one link. Their isolated times (:func:`cpu_overlap.isolated_transfer`) split
    each shared instant equally, so per transfer they do not say how much of its time was
    latency while the other's bytes used the link (an 83 KB bucket running 11 ms next to a
    2 MB one is given half the link): a line through them can put that time into the
    intercept and leave a slope faster than the link ever ran. The link's rate is then the
    aggregate, the bytes over the time the link was busy (the sum of the isolated times,
    which counts each shared instant once), as for sizes too alike to fit an intercept."""
    idx = np.flatnonzero(is_ar & (y > 0))
    if len(idx) == 0:
        raise PolicyError("overlap.bucket_mb: no measured all-reduce has a positive transfer "
                          "time to calibrate the re-bucketed transfers on")
    coll = trace.ops["coll_id"].to_numpy()
    n = max(2, int(np.median(pd.Series(coll[idx]).map(pd.Series(coll[idx]).value_counts()))))
    f = float(bus_factor(np.array([CommOp.ALL_REDUCE]), np.array([n]))[0])
    x = nbytes[idx].astype(np.float64) * f
    ys = y[idx]
    alpha = 2 * (n - 1) * GLOO_STEP_US * 1e3
    if not concurrent and len(np.unique(x)) >= 3 and x.max() >= 1.5 * x.min():
        sol, *_ = np.linalg.lstsq(np.stack([np.ones(len(x)), x], axis=1), ys, rcond=None)
        if sol[0] >= 0 and sol[1] > 0:
            return float(sol[0]), float(sol[1]), f
    return alpha, _aggregate_inv_b(trace, idx, x, ys, alpha), f


def _aggregate_inv_b(trace, idx, x, ys, alpha) -> float:
    """ns per bus byte of the link's aggregate: the transfers' isolated time (less ``alpha``
    each) over their bus bytes ``x``, summed over the (rank, step)s.

    The total, not a median (isolated times of overlapped transfers are noisy but not
    biased), less the disturbed steps of a rank: over DISTURBED_X times the median time per
    byte of a (rank, step) (descheduled on a shared machine: not the link)."""
    o = trace.ops
    key = pd.MultiIndex.from_arrays([o["rank"].to_numpy()[idx], o["step"].to_numpy()[idx]])
    t_ns = pd.Series(np.maximum(ys - alpha, 0.0), index=key).groupby(level=[0, 1]).sum()
    b = pd.Series(x, index=key).groupby(level=[0, 1]).sum()
    per = t_ns / b
    ok = per <= DISTURBED_X * float(np.median(per))
    return float(t_ns[ok].sum() / b[ok].sum())
