"""The measured links of a trace: collective calibration and token-bucket shaping.

What the network what-ifs (:mod:`.network`) and the re-bucketing (:mod:`.bucketing`,
:mod:`.bucketing_cpu`) know of a measured trace's links:

* :func:`collective_table`: every communication op with its bus bytes, group size and level
  (intra-node, inter-node, cross-DC) before and after a topology change;
* :func:`calibrate`: an alpha-beta fit per level on the last arrivers' transfer times, which
  says when the sizes cannot separate latency from bandwidth and then falls back on the
  transport's prior latency (or a calibration file's measured one,
  :func:`calibration_alpha_ns`);
* a token-bucket link (``tc tbf``, cloud burst credits): declared by a kit capture
  (:func:`shaped_link`) or inferred from transfers that beat the link's stated rate
  (:func:`inferred_shaper`); :func:`link_credits` and :func:`spend_tokens` say how many bytes
  each transfer sent on saved tokens.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from retime.collectors.enums import CommOp, OpKind
from retime.collectors.trace import Trace

from .base import by_op, ranks_per_node_of

__all__ = ["LEVELS", "TCP_GOODPUT", "DEFAULT_BUS_EFFICIENCY", "DEFAULT_ALPHA_US",
           "IDENTIFIABLE_SIZE_RATIO", "MAX_ALPHA_SHARE", "bus_factor", "collective_table",
           "calibrate", "calibration_alpha_ns", "fit_alpha_beta", "shaped_link", "inferred_shaper",
           "link_credits", "spend_tokens", "kit_burst_bytes", "bound_by_stated_rate"]

LEVELS = ("intra", "inter", "cross_dc")
_LEVEL_KEY = {0: "intra_node_gbps", 1: "inter_node_gbps", 2: "cross_dc_gbps"}
#: achieved fraction of a GPU link's bandwidth (NCCL over NVLink / InfiniBand), when the
#: scenario gives none
DEFAULT_BUS_EFFICIENCY = 0.8
#: achieved fraction of an Ethernet link's rate for a CPU collective over TCP (gloo): the
#: payload of a full frame, 1448 of 1514 bytes at MTU 1500 (14 Ethernet + 20 IP + 32 TCP
#: header bytes with timestamps). ``network.*_gbps`` of such a trace is the link rate.
TCP_GOODPUT = 1448 / 1514
#: per-step latency assumed for measured traces when the scenario gives none (us)
DEFAULT_ALPHA_US = {0: 1.0, 1: 5.0, 2: 5.0}


def bus_factor(comm_op: np.ndarray, n: np.ndarray) -> np.ndarray:
    """nccl-tests bus factor ``f`` (bus bytes = S * f) per op."""
    comm_op = np.asarray(comm_op)
    n = np.maximum(np.asarray(n, np.float64), 1.0)
    f = np.ones(len(comm_op))
    ar = comm_op == CommOp.ALL_REDUCE
    f[ar] = 2 * (n[ar] - 1) / n[ar]
    ag = np.isin(comm_op, [CommOp.ALL_GATHER, CommOp.REDUCE_SCATTER, CommOp.ALL_TO_ALL])
    f[ag] = (n[ag] - 1) / n[ag]
    return f


def shaped_link(trace: Trace) -> tuple[float, float] | None:
    """The token-bucket shaper of the inter-host link a capture declares, as ``(rate, tau)``:
    the rate in wire bytes per ns and the bucket in ns of that rate, or None.

    A link shaped with ``tc ... tbf rate R burst B`` (``examples/pairs``: the capture's job
    record holds ``rate_mbit`` and ``tbf_burst_bytes``; a kit capture without the bucket
    had :func:`kit_burst_bytes`) lets a transfer that starts
    with a full bucket send its first ``B`` bytes at the device's own speed, the rest at
    ``R``; the bucket refills at ``R`` while the link is idle. On a kernel whose tbf releases
    tokens per timer tick the bucket must hold at least one tick of ``R`` to reach ``R`` at
    all, so it is set as a time of the rate (``tau = B / R``: 8 ms, two ticks at 250 Hz) and
    a link at another rate keeps that ``tau``. Real links have no such allowance: a trace
    without the declaration gets none."""
    job = _capture_job(trace)
    try:
        rate_mbit = float(job["rate_mbit"])
        # the kit's rule where an older kit capture did not record its bucket
        burst = float(job["tbf_burst_bytes"]) if job.get("tbf_burst_bytes") is not None \
            else kit_burst_bytes(rate_mbit)
    except (KeyError, TypeError, ValueError):
        return None
    rate = rate_mbit / 8000.0  # Mbit/s -> bytes per ns
    if not (rate > 0 and burst > 0):
        return None
    return rate, burst / rate


#: the kit's timer tick (CONFIG_HZ) and smallest tbf bucket (examples/pairs/hosts.py)
KIT_HZ = 250
KIT_MIN_BURST_BYTES = 65536


def kit_burst_bytes(rate_mbit: float) -> int:
    """tbf bucket of an examples/pairs link: two timer ticks of the rate, at least 64 KiB
    (hosts.py ``burst_bytes``; kit captures record it as ``tbf_burst_bytes`` since then)."""
    return max(KIT_MIN_BURST_BYTES, int(2 * rate_mbit * 1e6 / 8 / KIT_HZ))


def _capture_job(trace: Trace) -> dict:
    """The job record of a kit capture: ``meta["job"]`` (bench/pairs.py lifts it there) or
    the ``job`` block that the capture wrote into each rank's file (``meta["capture"]``)."""
    m = trace.meta if isinstance(trace.meta, dict) else {}
    if isinstance(m.get("job"), dict) and "rate_mbit" in m["job"]:
        return m["job"]
    for block in (m.get("capture") or {}).values():
        if isinstance(block, dict) and isinstance(block.get("job"), dict):
            return block["job"]
    return {}


#: a stated link's transfers must beat its goodput by this share of their bytes (median)
#: before the trace is taken to show a token bucket
BURST_MIN_SHARE = 0.05


def inferred_shaper(graph, tab: dict[str, np.ndarray], gbps: float
                    ) -> tuple[float, float] | None:
    """A token bucket on the inter-host link, inferred from the trace and the link's stated
    nominal rate ``gbps`` (GB/s: bytes per ns), as ``(rate, tau)`` like :func:`shaped_link`.

    Paced at the rate, a last arriver's transfer of ``x`` bus bytes takes at least
    ``x / (rate * TCP_GOODPUT)``; one that took ``t`` less sent ``x - t rate g`` bytes on
    saved tokens. The bucket is the median of those credits over the transfers that started
    on an idle link (each rank's first of a step: the bucket refilled during the compute),
    in wire bytes. None when the transfers do not beat the rate by :data:`BURST_MIN_SHARE`
    (no bucket: a plain link)."""
    rate = float(gbps)
    ops = tab["op"]
    x = tab["bytes"] * tab["factor"]
    on = (tab["old_level"] == 1) & tab["last"] & (x > 0)
    if not on.any() or rate <= 0:
        return None
    start = np.asarray(graph.meas_start_ns, np.float64)[ops]
    dur = np.asarray(graph.meas_dur_ns, np.float64)[ops]
    rank = np.asarray(graph.rank)[ops]
    first = np.zeros(len(ops), bool)
    for r in np.unique(rank[on]).tolist():  # a rank's first transfer after an idle link
        rows = np.flatnonzero(on & (rank == r))
        rows = rows[np.argsort(start[rows], kind="stable")]
        prev_end = -math.inf
        for k in rows:
            first[k] = start[k] - prev_end > dur[k]  # idle for longer than it takes
            prev_end = start[k] + dur[k]
    pick = on & first
    if not pick.any():
        return None
    credit = x[pick] - dur[pick] * rate * TCP_GOODPUT
    if float(np.median(credit / x[pick])) < BURST_MIN_SHARE:
        return None
    burst = float(np.median(credit)) / TCP_GOODPUT  # wire bytes
    return rate, burst / rate


def link_credits(graph, tab: dict[str, np.ndarray], on_link: np.ndarray, rate: float,
                 tau: float) -> np.ndarray:
    """Per row of ``tab``: the payload bytes its transfer sends on tokens saved in the
    shaper's bucket (:func:`shaped_link`), rows on the shaped link (``on_link``) only.

    Each rank's transfers in start order: a transfer starts when issued or when the one
    before it ends, whichever is later; the bucket (``rate * tau`` wire bytes, full before
    the first) refills at ``rate`` from the previous transfer's end to that start; the
    transfer spends ``min(bucket, its wire bytes)`` of it; transfers take their measured
    times (:func:`spend_tokens`)."""
    out = np.zeros(len(tab["op"]))
    ops = tab["op"]
    x = tab["bytes"] * tab["factor"] / TCP_GOODPUT  # wire bytes of each row's stream
    start = np.asarray(graph.meas_start_ns, np.float64)[ops]
    dur = np.asarray(graph.meas_dur_ns, np.float64)[ops]
    rank = np.asarray(graph.rank)[ops]
    for r in np.unique(rank[on_link]).tolist():
        rows = np.flatnonzero(on_link & (rank == r) & (x > 0))
        rows = rows[np.argsort(start[rows], kind="stable")]
        out[rows] = spend_tokens(start[rows], x[rows], rate, tau,
                                 ends=start[rows] + dur[rows])
    return out


def spend_tokens(start: np.ndarray, wire: np.ndarray, rate: float, tau: float, *,
                 ends: np.ndarray | None = None, dur_of=None,
                 refill: np.ndarray | None = None) -> np.ndarray:
    """Payload bytes each of one link's transfers (in order) sends on saved tokens.

    A transfer starts at ``max(start, previous end)``; the bucket (``rate * tau`` wire
    bytes, full before the first and where ``refill`` is True) refills at ``rate`` from the
    previous end to that start; the transfer spends ``min(bucket, its wire bytes)``. It ends
    at ``ends[k]`` (measured) or lasts ``dur_of(k, credit)`` (modeled)."""
    cap = rate * tau
    out = np.zeros(len(start))
    tokens, prev_end = cap, -math.inf
    for k in range(len(start)):
        t0 = max(float(start[k]), prev_end)
        if refill is not None and refill[k]:
            tokens = cap
        elif prev_end > -math.inf:
            tokens = min(cap, tokens + rate * (t0 - prev_end))
        used = min(tokens, float(wire[k]))
        tokens -= used
        out[k] = used * TCP_GOODPUT
        prev_end = max(prev_end, float(ends[k])) if ends is not None \
            else t0 + dur_of(k, out[k])
    return out


def collective_table(trace: Trace, graph, ranks_per_node: int | None = None,
                     nodes_per_dc: int | None = None) -> dict[str, np.ndarray]:
    """Per communication op: op id, comm op, bytes, group size ``n``, bus factor, level
    under the new topology (``level``) and the measured one (``old_level``), last-arriver
    flag."""
    o = trace.ops
    kind = o["kind"].to_numpy()
    sel = np.flatnonzero((kind == OpKind.COLLECTIVE) | (kind == OpKind.P2P))
    rank = o["rank"].to_numpy().astype(np.int64)
    coll = o["coll_id"].to_numpy()
    gid = o["group_id"].to_numpy()
    peer = o["peer"].to_numpy()
    comm_op = o["comm_op"].to_numpy()[sel]
    nbytes = o["bytes"].to_numpy()[sel].astype(np.float64)
    rpn_meas = ranks_per_node_of(trace)
    rpn = ranks_per_node or rpn_meas
    groups = {int(g): np.asarray(r, np.int64) for g, r in
              zip(trace.groups["group_id"].to_numpy(), trace.groups["ranks"], strict=True)} \
        if len(trace.groups) else {}
    members: dict[int, list[int]] = {}
    for i in sel[coll[sel] >= 0].tolist():
        members.setdefault(int(coll[i]), []).append(int(rank[i]))
    world = np.unique(rank)
    n = np.ones(len(sel))
    lv_new = np.zeros(len(sel), np.int8)
    lv_old = np.zeros(len(sel), np.int8)
    last = np.zeros(len(sel), bool)
    partial = np.zeros(len(sel), bool)
    gstart = graph.meas_start_ns
    coll_max: dict[int, int] = {}
    for i in sel[coll[sel] >= 0].tolist():
        c = int(coll[i])
        if c not in coll_max or gstart[i] > gstart[coll_max[c]]:
            coll_max[c] = i
    for j, i in enumerate(sel.tolist()):
        c = int(coll[i])
        if c >= 0:
            rs = np.asarray(members[c])
            last[j] = coll_max[c] == i
            if kind[i] == OpKind.COLLECTIVE and int(gid[i]) in groups:
                rs = np.union1d(rs, groups[int(gid[i])])
        elif kind[i] == OpKind.P2P and peer[i] >= 0:
            rs = np.asarray([rank[i], peer[i]])
            last[j] = True
        elif int(gid[i]) in groups:
            rs = groups[int(gid[i])]
            last[j] = True
        else:
            rs = world
            last[j] = True
        n[j] = len(np.unique(rs))
        if c >= 0 and len(set(members[c])) < n[j]:
            partial[j] = True  # untraced members: the traced ones may have waited for them
        lv_new[j] = _level(rs, rpn, nodes_per_dc)
        lv_old[j] = _level(rs, rpn_meas, None)
    return {"op": sel, "comm_op": comm_op, "bytes": nbytes, "n": n,
            "factor": bus_factor(comm_op, n), "level": lv_new, "old_level": lv_old,
            "last": last, "partial": partial}


def _level(ranks: np.ndarray, rpn: int, nodes_per_dc: int | None) -> int:
    nodes = np.unique(np.asarray(ranks) // max(1, rpn))
    if len(nodes) <= 1:
        return 0
    if nodes_per_dc and len(np.unique(nodes // nodes_per_dc)) > 1:
        return 2
    return 1


#: sizes must span this ratio for a fit to tell a collective's latency from its bandwidth
IDENTIFIABLE_SIZE_RATIO = 1.5
#: a fitted per-collective latency above this share of a typical collective's time is not
#: physical (a LAN or NVLink collective's fixed cost is microseconds, not most of it)
MAX_ALPHA_SHARE = 0.25
#: the slowest plausible latency of one algorithm step per level (us): NVLink/PCIe a few us
#: (NCCL's tuning model: under 10 us per hop), a TCP/IP LAN hop well under 1 ms (kernel
#: socket path and a switch: tens to hundreds of us), across datacenters ~5 us per km of
#: fibre (DEFAULT_ALPHA_US's cross-DC rule) up to ~10,000 km
MAX_STEP_LATENCY_US = {0: 50.0, 1: 1000.0, 2: 50_000.0}


def _mb_span(xs: np.ndarray) -> str:
    lo, hi = float(xs.min()) / 1e6, float(xs.max()) / 1e6
    return f"{lo:.3g} MB of bus bytes" if hi <= lo * 1.001 else f"{lo:.3g}-{hi:.3g} MB of bus bytes"


def fit_alpha_beta(xs: np.ndarray, ys: np.ndarray) -> dict[str, Any]:
    """A line ``t = a + x / B`` through (bus bytes ``xs``, ns ``ys``) of one level's
    collectives, fitted only where the sizes can tell latency from bandwidth (at least 3
    sizes spanning :data:`IDENTIFIABLE_SIZE_RATIO`) and the line is physical (``a >= 0``,
    ``B > 0``). Otherwise ``identifiable`` is False, ``why`` says why, and all the time is
    bandwidth at the largest size (``a = 0``, ``B = x / t`` there: the size least bound by
    latency). Returns ``alpha_ns``,
    ``busbw_gbps`` (bytes per ns), ``identifiable`` and ``why``."""
    xs = np.asarray(xs, np.float64)
    ys = np.asarray(ys, np.float64)
    why = None
    if len(xs) < 3 or xs.max() < IDENTIFIABLE_SIZE_RATIO * xs.min():
        why = (f"{len(xs)} size(s) of {_mb_span(xs)}: fewer than 3 sizes spanning "
               f"{IDENTIFIABLE_SIZE_RATIO:g}x cannot separate latency from bandwidth")
    else:
        sol, *_ = np.linalg.lstsq(np.stack([np.ones(len(xs)), xs], axis=1), ys, rcond=None)
        if sol[1] > 0 and sol[0] >= 0:
            return {"alpha_ns": float(sol[0]), "busbw_gbps": 1.0 / float(sol[1]),
                    "identifiable": True, "why": None}
        why = (f"the fit over {len(xs)} sizes of {_mb_span(xs)} gave a latency of "
               f"{sol[0] / 1e3:.3g} us and a slope of {sol[1]:.3g} ns per byte, not physical")
    k = int(np.argmax(xs))
    return {"alpha_ns": 0.0, "busbw_gbps": float(xs[k] / ys[k]), "identifiable": False,
            "why": why}


def calibration_alpha_ns(trace: Trace, level: int, n_ranks) -> float | None:
    """Per-collective latency (ns) at ``level`` from a calibration file on the trace
    (``meta["calibration"]``, ``retime calibrate``): a line ``a + b x`` over its all-reduce
    sweep (x bus bytes; per size the median over repetitions of the slowest rank), ``a``
    scaled from the calibration's ring steps ``2 (n - 1)`` to the trace's. None without a
    calibration measured at that level (inter-host when it ran on several hosts)."""
    cal = trace.meta.get("calibration") if isinstance(trace.meta, dict) else None
    if not isinstance(cal, dict):
        return None
    world, per_host = int(cal.get("world_size", 0)), int(cal.get("ranks_per_host", 0))
    if world < 2 or (1 if per_host < world else 0) != level:
        return None
    rows = (cal.get("collectives") or {}).get("all_reduce") or []
    f = 2.0 * (world - 1) / world
    xs = np.asarray([r["bytes"] * f for r in rows], np.float64)
    ys = np.asarray([np.median(np.max(np.asarray(r["ns_by_rank"], np.float64), axis=0))
                     for r in rows])
    if len(xs) < 3 or xs.max() < IDENTIFIABLE_SIZE_RATIO * xs.min():
        return None
    sol, *_ = np.linalg.lstsq(np.stack([np.ones(len(xs)), xs], axis=1), ys, rcond=None)
    a = max(0.0, float(sol[0]))
    n = float(np.median(np.asarray(n_ranks, np.float64))) if len(n_ranks) else world
    return a * (n - 1) / (world - 1)


def calibrate(trace: Trace, graph, tab: dict[str, np.ndarray] | None = None,
              credit: np.ndarray | None = None, alpha_share: float | None = None
              ) -> dict[int, dict[str, Any]]:
    """Alpha-beta fit per measured level from the last arrivers' transfer times.

    ``credit`` (bus bytes per row of ``tab``) is what a shaped link let through on saved
    tokens (:func:`link_credits`): only the rest was paced by the link.
    Where the sizes cannot separate latency from bandwidth (``identifiable`` False, ``why``
    says why) all the time is bandwidth, or ``alpha_share`` of the median collective's time
    is latency (the range's other bound: at most :data:`MAX_ALPHA_SHARE`).
    Returns ``{level: {"alpha_ns", "busbw_gbps", "points"}}`` (levels with data only).
    """
    tab = tab if tab is not None else collective_table(trace, graph)
    x = tab["bytes"] * tab["factor"]
    if credit is not None:
        x = np.maximum(x - credit, 0.0)
    y = by_op(graph, "dur_ns")[tab["op"]].astype(np.float64)
    out: dict[int, dict[str, Any]] = {}
    partial = tab.get("partial", np.zeros(len(x), bool))
    for lv in np.unique(tab["old_level"]).tolist():
        ok = (tab["old_level"] == lv) & tab["last"] & (x > 0) & (y > 0)
        # a collective with untraced members has no known last arriver: its traced
        # members' time may be waiting for the others, not transfer. Fit on fully traced
        # ones; only where a level has none, on these, flagged (a lower bound on bandwidth)
        m = ok & ~partial
        rests_on_partial = not m.any()
        if rests_on_partial:
            m = ok
        if not m.any():
            continue
        xs, ys = x[m], y[m]
        a, inv_b = 0.0, float(np.median(ys / xs))
        why = None
        cal_a = calibration_alpha_ns(trace, int(lv), tab["n"][m])
        if cal_a is not None and (len(xs) < 3 or xs.max() < IDENTIFIABLE_SIZE_RATIO * xs.min()):
            # the trace alone cannot tell; the calibration's sweep measured the latency
            a = float(min(cal_a, MAX_ALPHA_SHARE * float(np.median(ys))))
            inv_b = float(np.median(np.maximum(ys - a, 1.0) / xs))
            out[int(lv)] = {"alpha_ns": a, "busbw_gbps": 1.0 / inv_b, "points": int(m.sum()),
                            "identifiable": True,
                            "source": "latency from the calibration file's size sweep, "
                                      "bandwidth from the trace"}
            continue
        if len(xs) < 3 or xs.max() < IDENTIFIABLE_SIZE_RATIO * xs.min():
            # latency and bandwidth cannot be told apart: all the time is bandwidth (the
            # latency steps come from the transport's published prior, DEFAULT_ALPHA_US)
            why = (f"{int(m.sum())} collective(s) of {_mb_span(xs)}: one size (or sizes "
                   f"within {IDENTIFIABLE_SIZE_RATIO:g}x) cannot separate latency from "
                   "bandwidth")
        else:
            A = np.stack([np.ones(len(xs)), xs], axis=1)
            sol, *_ = np.linalg.lstsq(A, ys, rcond=None)
            if sol[1] > 0 and 0.0 <= sol[0] <= MAX_ALPHA_SHARE * float(np.median(ys)):
                a, inv_b = float(sol[0]), float(sol[1])
            else:
                why = (f"the fit over {int(m.sum())} collectives of {_mb_span(xs)} gave a "
                       f"latency of {sol[0] / 1e6:.3g} ms and {1 / sol[1] if sol[1] > 0 else 0:.3g}"
                       " GB/s, outside physical bounds")
        if why is not None and alpha_share:
            # the range's other bound: a share of the collectives' time as latency, never
            # more than the transport's slowest plausible step latency over the ring's steps
            steps = 2.0 * max(float(np.median(tab["n"][m])) - 1.0, 1.0)
            a = min(float(alpha_share) * float(np.median(ys)),
                    MAX_STEP_LATENCY_US[int(lv)] * 1e3 * steps)
            inv_b = float(np.median(np.maximum(ys - a, 1.0) / xs))
        out[int(lv)] = {"alpha_ns": a, "busbw_gbps": 1.0 / inv_b if inv_b > 0 else math.inf,
                        "points": int(m.sum()), "identifiable": why is None}
        if why is not None:
            out[int(lv)]["why"] = why
        if rests_on_partial:
            out[int(lv)]["partial"] = True
    return out


def bound_by_stated_rate(bus_bytes: np.ndarray, model_ns: np.ndarray, alpha_ns: float,
                         inv_b: float, seen_bytes: float, stated_gbps: float | None
                         ) -> tuple[np.ndarray, dict[str, Any] | None]:
    """Transfer times of ``bus_bytes`` above the largest transfer a fit saw
    (``seen_bytes``), bounded by the link's stated nominal rate (GB/s: bytes per ns).

    A fit on transfers all smaller than a new one cannot say what the link does beyond them:
    on a token-bucket link (``tc tbf``, cloud burst credits) the fitted transfers may all
    have ridden the bucket, and the fit's rate is the burst, not the link. Bytes beyond
    what the fit saw move at most at the stated rate (as TCP goodput, :data:`TCP_GOODPUT`):
    ``alpha + seen / B + (x - seen) / (R g)``, where that is slower than the fit. Without
    a stated rate the fit is kept and the extrapolation is unbounded (reported). Returns
    the times and what was done (None when no transfer exceeds what the fit saw)."""
    x = np.asarray(bus_bytes, np.float64)
    t = np.asarray(model_ns, np.float64).copy()
    above = x > seen_bytes
    if not above.any() or not seen_bytes > 0:
        return t, None
    info: dict[str, Any] = {"seen_mb": seen_bytes / 1e6, "largest_new_mb": float(x.max()) / 1e6,
                            "fit_gbps": 1.0 / inv_b if inv_b > 0 else math.inf,
                            "stated_gbps": stated_gbps, "bounded": False}
    if stated_gbps is None or not stated_gbps > 0:
        return t, info
    paced = 1.0 / (float(stated_gbps) * TCP_GOODPUT)
    if inv_b >= paced:  # the fit is no faster than the stated link: nothing to bound
        return t, info
    capped = alpha_ns + seen_bytes * inv_b + (x - seen_bytes) * paced
    t[above] = np.maximum(t[above], capped[above])
    info["bounded"] = True
    return t, info
