"""Compute-communication interference of NCCL kernels on a GPU (``overlap.sm_share``).

While an NCCL/RCCL kernel overlaps compute kernels on its GPU, both slow down by
``i(p)`` (:func:`collectors.costs.interference.interference`: the SMs NCCL holds, ``p`` =
channels / SMs, and the HBM bandwidth both use; calibrated on C3's published overlap
fractions). ``overlap.sm_share = p'`` asks what NCCL holding ``p'`` of the SMs would give:
0 = collectives offloaded to DMA engines (C3's ConCCL), a smaller share = fewer channels
(``NCCL_MAX_NCHANNELS`` / ``NCCL_MAX_CTAS``).

A measured trace already ran with the interference of its own share ``p0``: its NCCL
kernels' launch grid (one block per channel; Kineto's ``grid``, kept by the reader as
``meta["devices"][rank][device]["nccl_blocks"]``) over its SM count, measured; without a
grid, the model's channels for the trace's GPU, platform and group size (assumed). Each compute kernel's isolated time is its measured time
less ``i0 / (1 + i0)`` of its overlap with communication on its device (and each
communication kernel's likewise with compute); the replay runs on the contention path,
where overlapped kernels progress at ``1 / (1 + i')`` of their rate wherever they overlap
now. ``p' = p0`` reproduces the measured overlap; a synthesized run's kernels are isolated
times already. CPU (gloo) collectives are not NCCL kernels and are refused
(``overlap.interference`` covers them).

A kernel spinning for late peers holds its SMs but moves no data: the memory part of the
slowdown is scaled by the share of the trace's NCCL kernel time the model's transfer
explains (``active``; partially traced DDP ranks spin most of it), the same before and
after. ``overlap.bucket_mb`` on a GPU trace applies the trace's own share to the new
overlap (the new buckets' kernels slow the compute they now run beside, and back).
"""

from __future__ import annotations

import numpy as np

from retime.collectors.costs.interference import interference
from retime.collectors.enums import CommOp
from retime.collectors.errors import PolicyError
from retime.collectors.intervals import interval_union

from ..engine import ContentionModel
from ..graph_data import RES_COMM, RES_COMPUTE
from .base import WhatIfState, by_op, ranks_per_node_of

__all__ = ["apply_sm_share", "measured_interference_ns", "measured_sm_share"]


def measured_sm_share(trace, graph, ranks_per_node: int | None
                      ) -> tuple[float, float, str, float]:
    """(share of the SMs the trace's NCCL kernels held, share of their time spent moving
    data, where the figures came from, the NCCL model's bus rate in GB/s for the trace's
    median collective: what its HBM traffic follows)."""
    from .link_fit import collective_table
    from .nccl_trace import NcclPricer, gpu_collectives, measured_channels, trace_cluster

    tab = collective_table(trace, graph, ranks_per_node)
    if not len(tab["op"]):
        raise PolicyError("overlap.sm_share: the trace has no collective or p2p ops")
    if not gpu_collectives(trace, tab["op"]):
        raise PolicyError("overlap.sm_share: the trace's collectives run on CPU threads "
                          "(gloo), not as NCCL kernels on a GPU; give overlap.interference "
                          "for how they share the CPU with compute")
    world = int(max(np.max(tab["n"]), trace.meta.get("world_size") or 0, 2))
    cl, src = trace_cluster(trace, ranks_per_node_of(trace, ranks_per_node), world)
    sized = tab["bytes"] > 0
    nbytes = float(np.median(tab["bytes"][sized])) if sized.any() else 1e6
    n = int(np.median(tab["n"])) if len(tab["n"]) else world
    blocks = measured_channels(trace)
    pricer = NcclPricer(cl, channels=blocks)
    c = pricer.cost(CommOp.ALL_REDUCE, nbytes, max(n, 2))
    sms = int(src["sms"]) or 1
    if blocks:  # measured: the collective kernels' launch grid, one block per channel
        channels = float(blocks)
        how = (f"{channels:g} channels (the trace's NCCL kernels' median launch grid: "
               f"measured) of {sms} SMs")
    else:
        channels = float(c.channels)
        how = (f"{c.channels} channels ({c.algorithm}/{c.protocol} at {nbytes / 1e6:.3g} MB, "
               f"the NCCL model's count on {src['platform']}: assumed; the trace records no "
               f"kernel grid) of {sms} SMs")
    share = min(1.0, channels / sms)
    # the share of the kernels' measured time that moves data (the model's transfer); the
    # rest is spinning for peers (unknown without sizes: all of it moves data)
    meas = np.asarray(graph.meas_dur_ns, np.float64)[tab["op"]]
    active = 1.0
    if sized.any():
        model = pricer.times_ns(tab["comm_op"][sized], tab["bytes"][sized], tab["n"][sized])
        active = float(min(1.0, model.sum() / max(meas[sized].sum(), 1.0)))
    return share, active, (f"{how}; {active:.0%} of their time moves data (the model's "
                           "transfer over their measured time), the rest spins for peers, "
                           "holding SMs but not memory bandwidth"), float(c.busbw_gbps)


def _overlap_with(lo, hi, ulo, uhi) -> np.ndarray:
    """Per interval [lo, hi): its overlap with the disjoint sorted intervals [ulo, uhi)."""
    if len(ulo) == 0 or len(lo) == 0:
        return np.zeros(len(lo))
    cum = np.concatenate([[0.0], np.cumsum((uhi - ulo).astype(np.float64))])

    def below(t):
        k = np.searchsorted(ulo, t, side="right")
        km = np.maximum(k - 1, 0)
        part = np.clip(t - ulo[km], 0, (uhi - ulo)[km])
        return np.where(k > 0, cum[km] + part, 0.0)

    return np.maximum(below(hi.astype(np.float64)) - below(lo.astype(np.float64)), 0.0)


def overlap_cut(graph, slowdown: float, compute: np.ndarray | None = None) -> np.ndarray:
    """Per op (op-id order): the share of its measured time that was the slowdown of its
    overlap with the other kind (compute vs communication) on its device; ``compute``: the
    compute side's slowdown per op (op-id order; per kernel), else ``slowdown``."""
    dev = by_op(graph, "device")
    res = by_op(graph, "resource")
    s = np.asarray(graph.meas_start_ns, np.int64)
    e = s + np.asarray(graph.meas_dur_ns, np.int64)
    cut = np.zeros(len(s))
    f = slowdown / (1.0 + slowdown)
    for d in np.unique(dev[dev >= 0]).tolist():
        comp = np.flatnonzero((dev == d) & (res == RES_COMPUTE))
        comm = np.flatnonzero((dev == d) & (res == RES_COMM))
        if not len(comp) or not len(comm):
            continue
        for mine, other in ((comp, comm), (comm, comp)):
            ulo, uhi = interval_union(s[other], e[other])
            fm = f if compute is None or mine is comm else compute[mine] / (1.0 + compute[mine])
            cut[mine] = fm * _overlap_with(s[mine], e[mine], ulo, uhi)
    return cut


def apply_sm_share(state: WhatIfState, sm_share: float | None, bound: str | None = None,
                   base: tuple | None = None) -> dict:
    """Re-time ``state`` for NCCL holding ``sm_share`` of the SMs (None: the trace's own;
    module docstring); ``base`` = (measured trace, its op ids kept as this trace's first
    ops) when a policy rebuilt the trace (re-bucketed: the slowdown the measured kernels
    carried is taken from where they overlapped as measured). Returns what it used."""
    g = state.graph
    compute_slowdown = None
    if state.is_synth and sm_share is None:
        return {}
    new = interference(sm_share if sm_share is not None else 0.0, bound=bound)
    active = 1.0
    out = {"sm_share": None if sm_share is None else float(sm_share),
           "slowdown_used": round(new.slowdown, 4),
           "overlap_fraction": round(new.overlap_fraction, 4)}
    if state.is_synth:
        state.assume(f"overlapped compute and NCCL kernels slowed by {new.slowdown:.2f} "
                     f"(C3's {new.overlap_fraction:.0%} of the ideal overlap at "
                     f"{sm_share:.0%} of the SMs)",
                     bounds=None if bound else [{"overlap.cost_bound": "low"},
                                                {"overlap.cost_bound": "high"}])
    else:
        from .base import cached_graph
        trace0, kept = base if base is not None else (state.trace, None)
        g0 = cached_graph(trace0) if base is not None else g
        p0, active, why, busbw = measured_sm_share(trace0, g0, state.ranks_per_node)
        # the same bound and waiting share both ways: p' = p0 is the identity
        old = interference(p0, bound=bound, active=active)
        new = interference(sm_share if sm_share is not None else p0, bound=bound,
                           active=active)
        out.update({"slowdown_used": round(new.slowdown, 4),
                    "overlap_fraction": round(new.overlap_fraction, 4),
                    "active_share": round(active, 4)})
        if sm_share is None:
            sm_share, new = p0, old
            out.update({"sm_share": round(p0, 4), "slowdown_used": round(new.slowdown, 4),
                        "overlap_fraction": round(new.overlap_fraction, 4)})
        out.update({"measured_sm_share": round(p0, 4), "measured_slowdown": round(old.slowdown, 4)})
        per = _per_kernel(trace0, busbw, old, new, active)
        if per is not None and len(per[0]) != len(by_op(g0, "device")):
            per = None  # a graph whose ops are not the trace's one for one: C3's figure
        cut = overlap_cut(g0, old.slowdown, None if per is None else per[0])
        pos = np.arange(len(cut)) if kept is None else np.arange(len(kept))
        cut = cut if kept is None else cut[kept]
        if per is not None:
            comp_new = np.full(g.n_ops, new.slowdown)
            comp_new[pos] = per[1] if kept is None else per[1][kept]
            compute_slowdown = comp_new
            info, calls, gname, hbm = per[2], per[3], per[4], per[5]
            out.update(info)
            med = info["slowdown_memory_bound_median"]
            state.assume(
                f"{info['shaped_kernels']} kernels of {calls} calls with recorded shapes are "
                f"slowed by their arithmetic intensity against {gname}'s ridge point: NCCL at "
                f"{busbw:.0f} GB/s bus rate takes {info['nccl_hbm_share']:.0%} of the "
                f"{hbm:.0f} GB/s HBM (3 HBM bytes per byte on the wire, assumed); "
                f"{info['memory_bound_kernels']} memory-bound ones"
                + (f" slowed {med:.2f} (median) at {sm_share:.0%}" if med is not None else "")
                + f", compute-bound ones C3's {new.slowdown:.2f}; kernels without shapes "
                "keep C3's figure")
        dur = state.dur
        dur[pos] = np.maximum(dur[pos] - cut, 0.0)
        state.assume(
            f"the trace's NCCL kernels held {p0:.0%} of the SMs ({why}): overlapped compute "
            f"and communication ran {old.slowdown:.2f} slower (C3: {old.overlap_fraction:.0%} "
            f"of the ideal overlap), removed from their measured times; at {sm_share:.0%}: "
            f"{new.slowdown:.2f} ({new.overlap_fraction:.0%}; C3's DMA offload at 0%: 72%)",
            bounds=None if bound else [{"overlap.cost_bound": "low"},
                                       {"overlap.cost_bound": "high"}])
    src = {"slowdown": f"{new.source} (C3's published fractions; the SM share of its naive "
                       "runs assumed)"}
    if "measured_sm_share" in out:
        src["measured_share"] = ("measured (kernel grid)" if "measured)" in why
                                 else "assumed (the NCCL model's channels)")
    out["interference_sources"] = src
    state.mode = "contention"
    state.contention = ContentionModel(slowdown=new.slowdown, share_links=False,
                                       compute_slowdown=compute_slowdown)
    return out


def _per_kernel(trace, busbw: float, old, new, active: float):
    """Per compute kernel (op-id order of ``trace``) its slowdown next to NCCL before
    (``old``: the trace's share) and after (``new``), by its arithmetic intensity against
    the GPU's ridge point (:func:`collectors.costs.interference.kernel_slowdowns`), and what
    to report; None when the trace records no shapes (C3's GEMM figure for every kernel)."""
    from retime.collectors.costs.gpus import spec_of
    from retime.collectors.costs.interference import kernel_slowdowns, nccl_hbm_share

    from .kernel_cost import kernel_intensity, trace_gpu

    hw = trace_gpu(trace)
    if hw is None:
        return None
    gpu = spec_of(hw)
    ai, ridge, calls = kernel_intensity(trace, gpu)
    known = np.isfinite(ai)
    if not known.any():
        return None
    hbm = gpu.hbm_gbps()[0]
    b = nccl_hbm_share(busbw, hbm)
    s_old = kernel_slowdowns(old, ai, ridge, b, active)
    s_new = kernel_slowdowns(new, ai, ridge, b, active)
    mem = known & (ai < ridge)
    info = {"memory_bound_kernels": int(mem.sum()), "shaped_kernels": int(known.sum()),
            "nccl_hbm_share": round(b, 4),
            "slowdown_memory_bound_median": (round(float(np.median(s_new[mem])), 4)
                                             if mem.any() else None)}
    return s_old, s_new, info, calls, gpu.name, hbm


def measured_interference_ns(trace, graph=None) -> np.ndarray:
    """Per op of a measured ``trace`` (op-id order): the part of its measured time (ns) that
    was its slowdown beside the NCCL kernels it overlapped on its device, as the contention
    path charges it (the trace's own SM share, :func:`measured_sm_share`; per compute kernel
    by its arithmetic intensity where the trace records shapes): what
    :func:`apply_sm_share` removes to get isolated times. Zero for a trace without GPU
    collectives. ``graph``: the trace's replay graph (built when None)."""
    from .base import cached_graph

    g = cached_graph(trace) if graph is None else graph
    try:
        p0, active, _why, busbw = measured_sm_share(trace, g, None)
    except PolicyError:
        return np.zeros(len(by_op(g, "device")))
    old = interference(p0, active=active)
    per = _per_kernel(trace, busbw, old, old, active)
    if per is not None and len(per[0]) != len(by_op(g, "device")):
        per = None
    return overlap_cut(g, old.slowdown, None if per is None else per[0])
