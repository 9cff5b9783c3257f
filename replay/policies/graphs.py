"""CUDA graphs what-if (``hardware.cuda_graphs``): capture regions of the step as graphs.

Physics. Launching a kernel costs host time twice over: the runtime call itself and the
framework work that only exists to issue it (Python, operator dispatch, allocator and
view bookkeeping). A CUDA graph replays a captured sequence of GPU work with one
``cudaGraphLaunch``: inside a captured region that host work disappears and the GPU runs
the kernels back to back, paying a small front-end cost per kernel node instead of the
stream launch latency. Work the graph cannot hold stays where it was.

Regions (``mode``):

* ``"step"`` — every host op attributed to a step (``ProfilerStep#N``; a trace without step
  marks is one region), the optimizer included;
* ``"forward_backward"`` — the forward and the backward phase of each step, one graph
  each (``torch.cuda.make_graphed_callables``); the loss, the optimizer and everything
  else run eagerly as measured.

Ops inside ranges whose name says data loading (``DataLoader``, ``copy_batch``...) are
never captured.

Measured traces (Kineto, nsys). On each CPU thread a region's host ops form *segments*:
runs of ops of one region, cut at host synchronizations (``*Synchronize``, blocking
``cudaMemcpy``: a graph cannot contain them; the code after them depends on the host
waiting) and at host-side collectives (gloo). Per segment:

* its first op becomes the graph launch (``graph_launch_us``) when the segment launches
  GPU work; every other host op of the segment takes no time, and the measured host gaps
  between its ops (Python and framework time, ``HOST_ORDER`` lags) vanish;
* except *host compute*: a leaf operator that launched nothing and is not pure tensor
  metadata (``aten::view``, ``aten::empty``, ... see :data:`METADATA_OPS`), or an operator
  range that launched nothing and is not metadata, keeps its measured time (its part of the
  gaps too). Graph replay cannot run CPU math.
* GPU ops launched from the segment start no later than their stream allows plus
  ``min(measured release delay, graph_node_us)``: the measured gap before a kernel is its
  stream launch latency, replaced by the graph's per-node front-end cost where that is
  smaller.

Threads hand work to each other (the autograd engine thread runs the backward while the
main thread waits in ``backward()``); the recorded edges do not say so, so the gaps are
fixed delays in the identity replay. Here they are made dependencies (on the measured
trace the times are unchanged): a host op whose measured gap (an unexplained release
delay, or the ``HOST_ORDER`` gap after the previous op of its thread) saw another thread of
the rank run ops waits for the last of those ops instead, with the measured gap after it
as lag, unless both lie in one region (then the gap is capturable Python and vanishes).

Refused, with the reason, where the trace cannot tell launch-only host work apart: no
launch calls correlated with GPU ops; a launching thread without operator events or
ranges (runtime calls only: the gaps between them could be anything);
``forward_backward`` on a trace without forward/backward phases.

Synthesized runs model no host thread (kernels are launched ahead of the GPU); each
captured compute kernel's per-kernel overhead (``kernel_overhead_us`` of the hardware
profile: stream launch and ramp) becomes ``graph_node_us`` where that is smaller.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from retime.collectors.enums import EdgeKind, LaneKind, OpKind, Phase
from retime.collectors.errors import PolicyError

from ..graph import BLOCKING_CALL_PATTERN
from .base import WhatIfState, layout_of

__all__ = ["GRAPH_MODES", "DEFAULT_GRAPH_LAUNCH_US", "DEFAULT_GRAPH_NODE_US",
           "METADATA_OPS", "check_graph_mode", "apply_cuda_graphs", "capture_plan"]

GRAPH_MODES = ("step", "forward_backward")
#: runtime calls that replay a captured graph (CUDA driver/runtime, HIP)
_GRAPH_LAUNCH = re.compile(r"graphlaunch", re.I)
#: host cost of one ``cudaGraphLaunch`` plus the framework's replay call (us)
DEFAULT_GRAPH_LAUNCH_US = 10.0
#: GPU front-end time per kernel node of a replayed graph (us)
DEFAULT_GRAPH_NODE_US = 1.0

#: operators that only create, view or describe tensors (no device work of their own)
METADATA_OPS = frozenset("""
empty empty_strided empty_like new_empty new_empty_strided as_strided view _reshape_alias
reshape _unsafe_view view_as alias detach detach_ lift_fresh lift t transpose permute expand
expand_as squeeze unsqueeze squeeze_ unsqueeze_ slice select narrow split split_with_sizes
chunk unbind resolve_conj resolve_neg set_ resize_ record_stream contiguous to result_type
size stride numel dim is_contiguous _has_compatible_shallow_copy_type flatten unflatten
movedim numpy_T _nested_tensor_from_mask_left_aligned zero_ fill_ requires_grad_
AccumulateGrad
""".split())

_UNCAPTURABLE = re.compile(r"dataloader|data_load|copy_batch|batch_to_(gpu|device)", re.I)
_NS = re.compile(r"^[A-Za-z_][\w.]*::")


def check_graph_mode(v: Any) -> str | None:
    """``"step"`` / ``"forward_backward"``; ``False`` (or "false"/"none"/"off") is None."""
    if v is None or v is False:
        return None
    if isinstance(v, str) and v.lower() in ("false", "none", "off", "no"):
        return None
    if isinstance(v, str) and v in GRAPH_MODES:
        return v
    raise PolicyError(f"hardware.cuda_graphs={v!r}; choose \"step\", \"forward_backward\" "
                      "or false")


def _base_name(s: str) -> str:
    s = s.rsplit("::", 1)[-1] if "::" in s else s
    return s.strip()


def _is_metadata(s: str) -> bool:
    return _base_name(s) in METADATA_OPS or s.startswith(("autograd::", "torch::autograd::"))


def _is_operator(s: str) -> bool:
    """An operator range (``ns::op``), as opposed to an annotation or a Python frame."""
    return bool(_NS.match(s)) and not s.startswith(("autograd::", "torch::autograd::",
                                                     "ProfilerStep"))


# ---------------------------------------------------------------------------- plan
def capture_plan(trace, mode: str) -> dict[str, Any]:
    """Which host ops of a measured trace a CUDA-graph capture of ``mode`` replaces.

    Returns a dict of op-id-ordered arrays: ``segment`` (int64, -1 for ops that stay),
    ``first`` (bool: the op that becomes the graph launch), ``compute`` (bool: host compute
    that keeps its time), ``launched`` (bool: GPU ops launched from a segment), ``region``
    (int64) and the interval union of host compute per lane (``hc_lane``, ``hc_start``,
    ``hc_end``), plus counts. Raises PolicyError where the trace cannot tell launch-only
    host work apart.
    """
    o = trace.ops
    n = len(o)
    kind = o["kind"].to_numpy()
    lane = o["lane"].to_numpy().astype(np.int64)
    rank = o["rank"].to_numpy()
    start = o["start_ns"].to_numpy().astype(np.int64)
    end = start + o["dur_ns"].to_numpy().astype(np.int64)
    names = np.asarray(trace.strings, dtype=object)
    nid = o["name_id"].to_numpy()
    lanes = trace.lanes
    lk = np.full(int(lanes["lane"].max()) + 1 if len(lanes) else 0, -1, np.int64)
    lk[lanes["lane"].to_numpy()] = lanes["lane_kind"].to_numpy()
    on_cpu = lk[lane] == LaneKind.CPU_THREAD if n else np.zeros(0, bool)
    host = on_cpu & ((kind == OpKind.CPU_OP) | (kind == OpKind.RUNTIME))
    e = trace.edges
    es, ed, ek = e["src"].to_numpy(), e["dst"].to_numpy(), e["kind"].to_numpy()
    lmask = (ek == EdgeKind.LAUNCH) & host[es] & ~on_cpu[ed]
    is_launch = np.zeros(n, bool)
    is_launch[es[lmask]] = True
    if not is_launch.any():
        raise PolicyError("hardware.cuda_graphs: the trace records no runtime launch calls "
                          "linked to GPU ops (correlation ids), so it cannot tell which host "
                          "work only issues GPU work; record the run with the PyTorch "
                          "profiler (CPU and CUDA activities) or nsys with CUDA API tracing")
    # a trace whose every launch is already a graph replay has no per-kernel launch work
    glaunch = np.fromiter((bool(_GRAPH_LAUNCH.search(str(x))) for x in names), bool,
                          count=len(names))[nid] & is_launch
    if glaunch.sum() == is_launch.sum():
        ran = int(np.isin(es[lmask], np.flatnonzero(glaunch)).sum())
        raise PolicyError(f"hardware.cuda_graphs: the trace already runs CUDA graphs: all "
                          f"{int(glaunch.sum()):,} of its launch calls are graph launches "
                          f"(cudaGraphLaunch), running {ran:,} GPU ops; no per-kernel launch "
                          "work is left to capture")
    # a launching thread must carry operator events or ranges, else its gaps are unknown
    r = trace.ranges
    r_lane = r["lane"].to_numpy().astype(np.int64)
    launching = np.unique(lane[is_launch])
    described = np.union1d(np.unique(lane[on_cpu & (kind == OpKind.CPU_OP)]), np.unique(r_lane))
    bare = np.setdiff1d(launching, described)
    if len(bare):
        lr = lanes.set_index("lane")
        ex = ", ".join(f"rank {int(lr.loc[x, 'rank'])} {lr.loc[x, 'name']}" for x in bare[:3])
        raise PolicyError(f"hardware.cuda_graphs: thread(s) {ex} launch GPU work but the trace "
                          "records only runtime calls there (no operator events or ranges), "
                          "so the time between launches cannot be split into launch-only work "
                          "and other host work; record operator events (PyTorch profiler) or "
                          "NVTX ranges (torch.autograd.profiler.emit_nvtx)")
    step = o["step"].to_numpy().astype(np.int64)
    phase = o["phase"].to_numpy().astype(np.int64)
    region = np.full(n, -1, np.int64)
    if mode == "step":
        if (step[host] >= 0).any():
            region[host & (step >= 0)] = step[host & (step >= 0)]
            regions_of = "ProfilerStep windows"
        else:
            region[host] = 0
            regions_of = "the whole trace (no step marks)"
    else:
        fb = host & ((phase == Phase.FWD) | (phase == Phase.BWD))
        if not fb.any():
            raise PolicyError("hardware.cuda_graphs='forward_backward': the trace has no "
                              "host ops in forward/backward phases (ranges named *forward* / "
                              "*backward*); use hardware.cuda_graphs='step'")
        region[fb] = (step[fb] + 1) * 4 + phase[fb]
        regions_of = "forward and backward phase of each step"
    # ranges: data loading (never captured) and host-compute operator ranges
    rs = r["start_ns"].to_numpy().astype(np.int64)
    re_ = r["end_ns"].to_numpy().astype(np.int64)
    u_names = np.unique(r["name_id"].to_numpy()) if len(r) else np.zeros(0, np.int64)
    dl_name = np.zeros(len(names), bool)
    op_name = np.zeros(len(names), bool)
    meta_name = np.zeros(len(names), bool)
    for i in np.union1d(u_names, np.unique(nid)).tolist():
        s = str(names[i])
        dl_name[i] = bool(_UNCAPTURABLE.search(s))
        op_name[i] = _is_operator(s)
        meta_name[i] = _is_metadata(s)
    if len(r):
        dl = dl_name[r["name_id"].to_numpy()]
        for j in np.flatnonzero(dl).tolist():
            inside = host & (lane == r_lane[j]) & (start >= rs[j]) & (start < re_[j])
            region[inside] = -1
    # host compute: leaf operators that launched nothing, operator ranges that contain no
    # launch call (both: not metadata)
    compute = host & (kind == OpKind.CPU_OP) & op_name[nid] & ~meta_name[nid] & ~is_launch
    hc = []
    if len(r):
        cand = op_name[r["name_id"].to_numpy()] & ~meta_name[r["name_id"].to_numpy()]
        for ln in np.unique(r_lane[cand]).tolist():
            li = np.flatnonzero(is_launch & (lane == ln))
            ls = np.sort(start[li])
            j = np.flatnonzero(cand & (r_lane == ln))
            a = np.searchsorted(ls, rs[j], side="left")
            b = np.searchsorted(ls, re_[j], side="left")
            k = j[a == b]  # no launch call starts inside the range
            hc.append(np.stack([np.full(len(k), ln), rs[k], re_[k]], axis=1))
    lc = np.flatnonzero(compute)
    hc.append(np.stack([lane[lc], start[lc], end[lc]], axis=1))
    hc_lane, hc_s, hc_e = _union_by_lane(np.concatenate(hc) if hc else np.zeros((0, 3), np.int64))
    # segments per thread: cut at region changes, syncs and host-side collectives
    blocking_name = np.fromiter((bool(BLOCKING_CALL_PATTERN.search(str(s))) for s in names),
                                bool, count=len(names))
    brk = on_cpu & ((host & blocking_name[nid]) | (kind == OpKind.COLLECTIVE)
                    | (kind == OpKind.P2P))
    cand_ops = np.flatnonzero(host | brk)
    cand_ops = cand_ops[np.lexsort((cand_ops, start[cand_ops], lane[cand_ops]))]
    reg = region[cand_ops]
    stop = brk[cand_ops] | (reg < 0)
    prev_stop = np.r_[True, stop[:-1]]
    new = np.r_[True, (lane[cand_ops][1:] != lane[cand_ops][:-1])
                | (reg[1:] != reg[:-1])] | prev_stop | stop
    seg_c = np.cumsum(new) - 1
    seg_c[stop] = -1
    segment = np.full(n, -1, np.int64)
    segment[cand_ops] = seg_c
    first = np.zeros(n, bool)
    first[cand_ops[new & ~stop]] = True
    # segments that launch GPU work get a graph launch; GPU ops they launch are captured
    seg_launches = np.zeros(int(seg_c.max()) + 1 if len(seg_c) else 0, np.int64)
    inseg = is_launch & (segment >= 0)
    np.add.at(seg_launches, segment[inseg], 1)
    first &= (segment >= 0)
    graph_launch = first & (seg_launches[np.maximum(segment, 0)] > 0)
    launched = np.zeros(n, bool)
    lsrc, ldst = es[lmask], ed[lmask]
    launched[ldst[segment[lsrc] >= 0]] = True
    return {"segment": segment, "first": graph_launch, "compute": compute,
            "launched": launched, "region": region, "is_launch": is_launch,
            "hc_lane": hc_lane, "hc_start": hc_s, "hc_end": hc_e, "regions_of": regions_of,
            "graphs": int(graph_launch.sum()),
            "captured_launches": int(inseg.sum()),
            "launches": int(is_launch.sum()),
            "breaks": int((brk & (region >= 0)).sum()),
            "host_compute_ops": int((compute & (segment >= 0)).sum()),
            "ranks": int(len(np.unique(rank[segment >= 0])))}


def _union_by_lane(iv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Disjoint union of ``[start, end)`` intervals per lane (sorted by lane, start)."""
    if len(iv) == 0:
        z = np.zeros(0, np.int64)
        return z, z, z
    iv = iv[np.lexsort((iv[:, 1], iv[:, 0]))]
    ln, s, e = iv[:, 0], iv[:, 1], iv[:, 2]
    out_l, out_s, out_e = [], [], []
    cl, cs, ce = int(ln[0]), int(s[0]), int(e[0])
    for a, b, c in zip(ln[1:].tolist(), s[1:].tolist(), e[1:].tolist(), strict=True):
        if a == cl and b <= ce:
            ce = max(ce, c)
            continue
        out_l.append(cl)
        out_s.append(cs)
        out_e.append(ce)
        cl, cs, ce = a, b, c
    out_l.append(cl)
    out_s.append(cs)
    out_e.append(ce)
    return (np.asarray(out_l, np.int64), np.asarray(out_s, np.int64),
            np.asarray(out_e, np.int64))


def _covered(hl, hs, he, lane: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Length of ``[a, b)`` covered by the (disjoint, per-lane sorted) intervals of ``lane``:
    cumulative coverage differences, vectorized over queries."""
    out = np.zeros(len(a), np.int64)
    if len(hl) == 0 or len(a) == 0:
        return out
    for ln in np.unique(lane).tolist():
        q = np.flatnonzero(lane == ln)
        m = hl == ln
        if not m.any():
            continue
        s, e = hs[m], he[m]
        cum = np.r_[0, np.cumsum(e - s)]

        def upto(t, s=s, e=e, cum=cum):
            i = np.searchsorted(s, t, side="right")  # intervals starting at or before t
            full = cum[np.maximum(i - 1, 0)]
            part = np.where(i > 0, np.minimum(t, e[np.maximum(i - 1, 0)])
                            - s[np.maximum(i - 1, 0)], 0)
            return np.where(i > 0, full + np.maximum(part, 0), 0)
        out[q] = np.maximum(upto(b[q]) - upto(a[q]), 0)
    return out


# ---------------------------------------------------------------------------- apply
def apply_cuda_graphs(state: WhatIfState, mode: str, launch_us: float,
                      node_us: float) -> dict[str, Any]:
    """Re-time ``state`` as if ``mode`` regions were captured; returns what it did."""
    if state.is_synth:
        return _apply_synth(state, mode, node_us)
    return _apply_measured(state, mode, launch_us, node_us)


def _apply_synth(state: WhatIfState, mode: str, node_us: float) -> dict[str, Any]:
    o = state.trace.ops
    kind = o["kind"].to_numpy()
    phase = o["phase"].to_numpy()
    cap = (kind == OpKind.KERNEL) | (kind == OpKind.COMPUTE)
    if mode == "forward_backward":
        cap &= (phase == Phase.FWD) | (phase == Phase.BWD)
    oh_ns = float(state.synth.hardware.kernel_overhead_us) * 1e3
    saved = max(0.0, oh_ns - float(node_us) * 1e3)
    d = state.dur
    cut = np.minimum(saved, np.maximum(d[cap], 0.0))
    d[cap] -= cut
    return {"captured_kernels": int(cap.sum()), "saved_per_kernel_ns": saved,
            "kernel_overhead_us": oh_ns / 1e3,
            "model": "synthesized: each captured kernel's overhead becomes graph_node_us"}


def _apply_measured(state: WhatIfState, mode: str, launch_us: float,
                    node_us: float) -> dict[str, Any]:
    t = state.trace
    plan = capture_plan(t, mode)
    g = state.graph
    o = t.ops
    lane = o["lane"].to_numpy().astype(np.int64)
    start = o["start_ns"].to_numpy().astype(np.int64)
    end = start + o["dur_ns"].to_numpy().astype(np.int64)
    seg = plan["segment"]
    insg = seg >= 0
    d = state.dur
    keep = insg & plan["compute"]
    removed_ops = float(d[insg & ~keep].sum())
    d[insg & ~keep] = 0.0
    d[plan["first"]] += float(launch_us) * 1e3
    # host gaps inside a segment: only the host compute they contain stays
    pk, pl = g.pred_kind, g.pred_lag_ns.copy()
    dst_pos = np.repeat(np.arange(g.n_ops, dtype=np.int64), np.diff(g.pred_ptr))
    src_op = g.perm[g.pred_src].astype(np.int64)
    dst_op = g.perm[dst_pos].astype(np.int64)
    ho = (pk == EdgeKind.HOST_ORDER) & (seg[src_op] >= 0) & (seg[src_op] == seg[dst_op])
    hi = np.flatnonzero(ho)
    new_lag = _covered(plan["hc_lane"], plan["hc_start"], plan["hc_end"], lane[dst_op[hi]],
                       end[src_op[hi]], start[dst_op[hi]])
    new_lag = np.minimum(new_lag, np.maximum(pl[hi], 0))
    removed_gaps = int(np.maximum(pl[hi], 0).sum() - new_lag.sum())
    pl[hi] = new_lag
    # lane links that overlap (s2s) inside a segment keep no offset either
    lane_prev = g.by_op(g.lane_prev)
    lp_ok = lane_prev >= 0
    lp_op = np.where(lp_ok, g.perm[np.maximum(lane_prev, 0)], -1)
    same = lp_ok & insg & (seg[np.maximum(lp_op, 0)] == seg)
    llag = g.lane_lag_ns.copy()
    llag[layout_of(g, same) & g.lane_s2s] = 0
    # captured GPU ops: stream launch latency -> graph node cost
    delay = g.delay_ns.copy()
    lp = layout_of(g, plan["launched"])
    delay[lp] = np.minimum(delay[lp], int(round(node_us * 1e3)))
    # thread hand-offs and joins become dependencies
    src, dst, lag, hand_pos = _thread_links(t, g, plan, start, end, pl, dst_op, src_op)
    delay[g.pos[hand_pos]] = 0
    g = dataclasses.replace(g, pred_lag_ns=pl, lane_lag_ns=llag, delay_ns=delay)
    if len(src):
        g = g.with_edges(src, dst, lag, kind=int(EdgeKind.SYNC))
    state.graph = g
    return {"regions": plan["regions_of"], "graphs": plan["graphs"],
            "captured_launches": plan["captured_launches"], "launches": plan["launches"],
            "sync_breaks": plan["breaks"], "host_compute_ops_kept": plan["host_compute_ops"],
            "host_ops_removed_ns": int(round(removed_ops)), "host_gaps_removed_ns": removed_gaps,
            "thread_links": int(len(src)), "captured_gpu_ops": int(plan["launched"].sum())}


def _thread_links(t, g, plan, start, end, pl, dst_op, src_op):
    """Hand-off and join edges between the CPU threads of a rank (module docstring).

    For every host op of a rank with captured work whose measured gap before it (its
    release delay, or the ``HOST_ORDER`` gap after its thread's previous op) saw an op of
    another thread of the rank end: an edge from the last such op, lag = the measured gap
    after it (0 when both ops lie in one region: capturable Python). The op's delay is
    dropped and its ``HOST_ORDER`` lag zeroed (``pl`` is edited in place): on the measured
    trace the edge alone gives its measured start. Returns (src, dst, lag, dst) arrays.
    """
    o = t.ops
    seg = plan["segment"]
    region = plan["region"]
    rank = o["rank"].to_numpy()
    lane = o["lane"].to_numpy().astype(np.int64)
    kind = o["kind"].to_numpy()
    lanes = t.lanes
    lk = np.full(int(lanes["lane"].max()) + 1, -1, np.int64)
    lk[lanes["lane"].to_numpy()] = lanes["lane_kind"].to_numpy()
    cpu = (lk[lane] == LaneKind.CPU_THREAD) & np.isin(kind, [OpKind.CPU_OP, OpKind.RUNTIME])
    cpu &= np.isin(rank, np.unique(rank[seg >= 0]))
    mdelay = g.measured_delay_ns
    gap_from = np.full(len(o), -1, np.int64)
    has_delay = cpu & (mdelay > 0)
    gap_from[has_delay] = start[has_delay] - mdelay[has_delay]
    ho = np.flatnonzero((g.pred_kind == EdgeKind.HOST_ORDER) & cpu[dst_op]
                        & (end[src_op] < start[dst_op]))
    x_ho = dst_op[ho]
    gap_from[x_ho] = np.where(gap_from[x_ho] >= 0, np.minimum(gap_from[x_ho], end[src_op[ho]]),
                              end[src_op[ho]])
    z = np.zeros(0, np.int64)
    out_s, out_d = [z], [z]
    for ln in np.unique(lane[gap_from >= 0]).tolist():
        xs = np.flatnonzero((gap_from >= 0) & (lane == ln))
        r = rank[xs[0]]
        other = np.flatnonzero(cpu & (rank == r) & (lane != ln))
        if len(other) == 0:
            continue
        other = other[np.argsort(end[other], kind="stable")]
        oe = end[other]
        hi = np.searchsorted(oe, start[xs], side="left")  # ends strictly before x starts
        ok = hi > 0
        y = other[np.maximum(hi - 1, 0)]
        ok &= end[y] >= gap_from[xs]
        out_s.append(y[ok])
        out_d.append(xs[ok])
    src = np.concatenate(out_s)
    dst = np.concatenate(out_d)
    same = (region[src] >= 0) & (region[src] == region[dst])
    lag = np.where(same, 0, start[dst] - end[src]).astype(np.int64)
    joined = np.zeros(len(o), bool)
    joined[dst] = True
    j = ho[joined[x_ho]]
    in_seg = (seg[src_op[j]] >= 0) & (seg[src_op[j]] == seg[dst_op[j]])
    pl[j] = np.where(in_seg, pl[j], 0)  # a segment's gap keeps only its host compute
    return src, dst, lag, dst
