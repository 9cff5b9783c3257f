"""Activation recomputation on measured Kineto traces, both ways.

``cache.recompute = "none"`` on a trace of ``torch.utils.checkpoint`` models recorded with
Python stacks removes the checkpoint frames and the work they launched
(:func:`uncheckpoint_kineto`; see :mod:`.caching_real` for the physics);
``cache.recompute = "full"`` on a trace recorded without checkpointing is below.

Full activation recomputation (``torch.utils.checkpoint`` around every layer) keeps only each
layer's input from the forward and runs the layer's forward again in the backward, just
before the layer's own backward. The extra work is therefore the forward of the checkpointed
layers, once more per step, on the same threads and streams that ran it.

Which ops are a layer's forward comes from the trace's module ranges (``nn.Module: NAME_k``,
recorded by the profiler with ``with_stack`` / ``with_modules``): the layers are the
repeated sibling modules of one class (``Sequential_0`` .. ``Sequential_3``,
``TransformerEncoderLayer_0`` .. ``_5``) that cover the most forward time; the model's head,
embedding and loss stay un-checkpointed, as in the usual per-layer checkpointing.

Per step and rank, the recompute of layer ``k`` costs, on the host thread that runs the
backward (the autograd engine's device thread on a GPU job; the forward's own thread on a CPU
job), the layer range's wall time (host work included: on a CPU job that is the compute),
and on each GPU stream the GPU ops launched from inside the range. Each cost is added to the
first backward op of that layer on that lane: the backward ops of a step run the layers in
reverse order, so the step's backward ops on a lane are cut into as many consecutive groups
as there are layers, in proportion to the layers' forward work, and layer ``k`` is recomputed
at the start of its group. Refused, naming what is missing, without module ranges or
forward/backward phases.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from retime.collectors.enums import EdgeKind, OpKind, Phase
from retime.collectors.errors import PolicyError
from retime.collectors.intervals import interval_union

from .base import WhatIfState, by_op, layout_of

__all__ = ["recompute_full_kineto", "uncheckpoint_kineto", "checkpoint_spans", "layer_ranges"]

_CKPT_HOOK = re.compile(r"torch/utils/checkpoint\.py\(\d+\): (unpack_hook|pack_hook)$")
_CKPT_RECOMPUTE = re.compile(r"torch/utils/checkpoint\.py\(\d+\): recompute_fn$")
#: lag of a voided edge: the constraint ``dst.start >= src.end + lag`` never binds
_VOID_LAG_NS = -(1 << 62)

_MODULE = re.compile(r"^nn\.Module: (.+)_(\d+)$")


def layer_ranges(trace) -> tuple[str, np.ndarray]:
    """The checkpointable layers: (their module class, indices of their forward ranges in
    ``trace.ranges``), the repeated sibling modules covering the most forward time."""
    names = np.asarray(trace.strings, dtype=object)
    r = trace.ranges
    nid = r["name_id"].to_numpy()
    cls = np.full(len(names), None, dtype=object)
    for i, s in enumerate(names):
        m = _MODULE.match(str(s))
        if m:
            cls[i] = m.group(1)
    rc = cls[nid] if len(nid) else np.zeros(0, object)
    has = np.flatnonzero(rc != None)  # noqa: E711 - object array
    if len(has) == 0:
        raise PolicyError("cache.recompute=full on a measured trace needs the model's module "
                          "ranges (nn.Module: ...), which this trace lacks; record it with "
                          "torch.profiler(with_stack=True) (retime's Capture does), or "
                          "synthesize the job with `retime synth`")
    span = (r["end_ns"].to_numpy() - r["start_ns"].to_numpy()).astype(np.float64)
    best, best_t = None, -1.0
    for c in {rc[i] for i in has}:
        m = has[rc[has] == c]
        idx = {int(str(names[nid[i]]).rsplit("_", 1)[1]) for i in m}
        if len(idx) < 2:
            continue
        t = float(span[m].sum())
        if t > best_t:
            best, best_t = c, t
    if best is None:
        raise PolicyError("cache.recompute=full on a measured trace: no module class repeats "
                          "(no layers to checkpoint) among the trace's module ranges")
    return best, has[rc[has] == best]


def recompute_full_kineto(state: WhatIfState) -> dict[str, Any]:
    """Phase 2: add each layer's forward again before its backward (module docstring); a
    trace that already checkpoints (``recompute_fn`` frames) is left as it is."""
    t = state.trace
    if checkpoint_spans(t)["n_recompute"]:
        return {"unchanged": "the trace already recomputes (torch.utils.checkpoint)"}
    o = t.ops
    phase = o["phase"].to_numpy()
    if not ((phase == Phase.FWD).any() and (phase == Phase.BWD).any()):
        raise PolicyError("cache.recompute=full on a measured trace needs forward and backward "
                          "phases (record_function('forward') / 'backward' ranges, or "
                          "autograd's); this trace has none to place the recompute in")
    cls, lr = layer_ranges(t)
    r = t.ranges
    rr, rl = r["rank"].to_numpy()[lr], r["lane"].to_numpy()[lr]
    rs, re_ = r["start_ns"].to_numpy()[lr], r["end_ns"].to_numpy()[lr]
    rank, lane = o["rank"].to_numpy(), o["lane"].to_numpy()
    start = o["start_ns"].to_numpy()
    end = start + o["dur_ns"].to_numpy()
    step = o["step"].to_numpy()
    kind = o["kind"].to_numpy()
    e = t.edges
    launch = e["kind"].to_numpy() == EdgeKind.LAUNCH
    l_src, l_dst = e["src"].to_numpy()[launch], e["dst"].to_numpy()[launch]
    host_kind = (kind == OpKind.CPU_OP) | (kind == OpKind.RUNTIME)
    dur = state.dur
    added = 0.0
    layers_seen = 0
    for rk in np.unique(rr).tolist():
        for st in np.unique(step[(rank == rk) & (phase == Phase.FWD)]).tolist():
            if st < 0:
                continue
            on_rank = (rank == rk) & (step == st)
            fwd = on_rank & (phase == Phase.FWD)
            lo, hi = start[fwd].min(), end[fwd].max()
            sel = np.flatnonzero((rr == rk) & (rs >= lo) & (re_ <= hi))
            if len(sel) == 0:
                continue
            sel = sel[np.argsort(rs[sel])]
            layers_seen = max(layers_seen, len(sel))
            # the recompute runs inside the backward, on the thread that runs the backward
            # ops (the autograd engine's device thread on a GPU job, the forward's own thread
            # on a CPU job): the host thread with the most backward host ops of this step
            bh = np.flatnonzero(on_rank & (phase == Phase.BWD) & host_kind)
            bwd_thread = None
            if len(bh):
                lv, lc = np.unique(lane[bh], return_counts=True)
                bwd_thread = int(lv[np.argmax(lc)])
            # cost per layer and lane: the range on its thread, launched GPU work per stream
            costs: list[dict[int, float]] = []
            for k in sel.tolist():
                c = {int(rl[k]) if bwd_thread is None else bwd_thread: float(re_[k] - rs[k])}
                inside = on_rank & host_kind & (lane == rl[k]) & (start >= rs[k]) & (end <= re_[k])
                ids = np.flatnonzero(inside)
                if len(ids):
                    gpu = l_dst[np.isin(l_src, ids)]
                    for g in gpu.tolist():
                        c[int(lane[g])] = c.get(int(lane[g]), 0.0) + float(end[g] - start[g])
                costs.append(c)
            # place layer k's recompute at the start of its group of backward ops per lane
            for ln in sorted({x for c in costs for x in c}):
                bwd = np.flatnonzero(on_rank & (phase == Phase.BWD) & (lane == ln))
                if len(bwd) == 0:
                    continue
                bwd = bwd[np.argsort(start[bwd], kind="stable")]
                w = np.asarray([c.get(ln, 0.0) for c in costs])[::-1]  # backward: last first
                if w.sum() <= 0:
                    continue
                cut = np.floor(np.concatenate([[0.0], np.cumsum(w)[:-1]]) / w.sum()
                               * len(bwd)).astype(int)
                for j, first in enumerate(cut.tolist()):
                    if w[j] > 0:
                        dur[bwd[min(first, len(bwd) - 1)]] += w[j]
                        added += w[j]
    if layers_seen == 0:
        raise PolicyError(f"cache.recompute=full: the {cls} module ranges lie outside the "
                          "trace's forward phases; nothing to recompute")
    return {"recompute": "full", "layers": f"{layers_seen} x {cls}",
            "added_ns": int(round(added))}


# ------------------------------------------------ recompute = none: drop the checkpoints
def checkpoint_spans(trace) -> dict[str, Any]:
    """Host spans of activation checkpointing in a Kineto trace (non-reentrant
    ``torch.utils.checkpoint`` with Python stacks).

    Returns
    -------
    dict
        ``spans``: {(rank, lane): (start_ns int64[k], end_ns int64[k])}, the merged
        ``pack_hook`` / ``unpack_hook`` / ``recompute_fn`` frames per host thread;
        ``recompute``: the same for ``recompute_fn`` frames only; ``n_recompute``: number of
        ``recompute_fn`` frames.
    """
    names = np.asarray(trace.strings, dtype=object)
    hook = np.asarray([bool(_CKPT_HOOK.search(str(s))) for s in names])
    rec = np.asarray([bool(_CKPT_RECOMPUTE.search(str(s))) for s in names])
    r = trace.ranges
    o = trace.ops
    parts = []
    for frame, e_col in ((r, "end_ns"), (o, None)):
        nid = frame["name_id"].to_numpy()
        s = frame["start_ns"].to_numpy().astype(np.int64)
        e = frame[e_col].to_numpy().astype(np.int64) if e_col else \
            s + frame["dur_ns"].to_numpy().astype(np.int64)
        parts.append((frame["rank"].to_numpy(), frame["lane"].to_numpy(), s, e, hook[nid] | rec[nid],
                      rec[nid]))
    wrap = _wrapper_spans(trace, names)
    out: dict[str, Any] = {"spans": {}, "recompute": {}, "n_recompute": 0}
    for which, col in (("spans", 4), ("recompute", 5)):
        rk = np.concatenate([p[0][p[col]] for p in parts] + ([wrap[0]] if col == 4 else []))
        ln = np.concatenate([p[1][p[col]] for p in parts] + ([wrap[1]] if col == 4 else []))
        s = np.concatenate([p[2][p[col]] for p in parts] + ([wrap[2]] if col == 4 else []))
        e = np.concatenate([p[3][p[col]] for p in parts] + ([wrap[3]] if col == 4 else []))
        if which == "recompute":
            out["n_recompute"] = int(len(s))
        for key in sorted({(int(a), int(b)) for a, b in zip(rk, ln, strict=True)}):
            m = (rk == key[0]) & (ln == key[1])
            out[which][key] = interval_union(s[m], e[m])
    return out


def _wrapper_spans(trace, names: np.ndarray) -> tuple[np.ndarray, ...]:
    """The checkpoint's own frames around the checkpointed module's call: the time inside
    ``torch/utils/checkpoint.py`` frames (the ``checkpoint`` call, its generator and context
    managers) that is not inside an ``nn.Module`` range nested in them, on the threads where such a frame
    contains a module range (a checkpointed plain function is left whole: its work is not
    told apart from the wrapper's). Returns (rank, lane, start, end) arrays."""
    r = trace.ranges
    nid = r["name_id"].to_numpy()
    ck = np.asarray(["torch/utils/checkpoint.py(" in str(x) for x in names], bool)
    mod = np.asarray([bool(_MODULE.match(str(x))) for x in names], bool)
    rk, ln = r["rank"].to_numpy(), r["lane"].to_numpy()
    s, e = r["start_ns"].to_numpy().astype(np.int64), r["end_ns"].to_numpy().astype(np.int64)
    out: list[list] = [[], [], [], []]
    for key in sorted({(int(a), int(b)) for a, b in zip(rk[ck[nid]], ln[ck[nid]], strict=True)}):
        on = (rk == key[0]) & (ln == key[1])
        fs, fe = interval_union(s[on & ck[nid]], e[on & ck[nid]])
        m = np.flatnonzero(on & mod[nid])  # module calls inside a checkpoint frame only
        k = np.searchsorted(fs, s[m], side="right") - 1
        m = m[(k >= 0) & (e[m] <= fe[np.maximum(k, 0)])]
        ms, me = interval_union(s[m], e[m])
        for a, b in zip(fs.tolist(), fe.tolist(), strict=True):
            k0, k1 = np.searchsorted(me, a, side="right"), np.searchsorted(ms, b, side="left")
            if k1 <= k0:
                continue  # no module call inside: left whole
            cur = a
            for u, v in zip(ms[k0:k1].tolist(), me[k0:k1].tolist(), strict=True):
                if u > cur:
                    for j, x in enumerate((key[0], key[1], cur, u)):
                        out[j].append(x)
                cur = max(cur, v)
            if cur < b:
                for j, x in enumerate((key[0], key[1], cur, b)):
                    out[j].append(x)
    return tuple(np.asarray(x, np.int64) for x in out)


def _covered(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Measure of the union of disjoint sorted [starts, ends) up to each time ``t``."""
    if len(starts) == 0:
        return np.zeros(len(t), np.int64)
    cum = np.concatenate([[0], np.cumsum(ends - starts)])
    k = np.searchsorted(starts, t, side="right")  # spans starting at or before t
    full = cum[np.maximum(k - 1, 0)]
    last = np.where(k > 0, np.minimum(t, ends[np.maximum(k - 1, 0)]) - starts[np.maximum(k - 1, 0)], 0)
    return np.where(k > 0, full + np.maximum(last, 0), 0)


def uncheckpoint_kineto(state: WhatIfState) -> dict[str, Any]:
    t = state.trace
    cs = checkpoint_spans(t)
    if cs["n_recompute"] == 0:
        raise PolicyError(
            "cache.recompute=none: the trace shows no activation-checkpoint recompute (no "
            "'torch/utils/checkpoint.py(N): recompute_fn' Python frame); it needs a trace of a "
            "model using torch.utils.checkpoint (non-reentrant), recorded with "
            "torch.profiler.profile(with_stack=True)")
    o = t.ops
    n = len(o)
    rank = o["rank"].to_numpy()
    lane = o["lane"].to_numpy()
    kind = o["kind"].to_numpy()
    s = o["start_ns"].to_numpy().astype(np.int64)
    e = s + o["dur_ns"].to_numpy().astype(np.int64)
    host = np.isin(kind, [OpKind.CPU_OP, OpKind.RUNTIME])
    gone = np.zeros(n, bool)
    in_rec = np.zeros(n, bool)
    host_span_ns = rec_span_ns = 0
    for (r, ln), (ss, se) in cs["spans"].items():
        on = np.flatnonzero(host & (rank == r) & (lane == ln))
        k = np.searchsorted(ss, s[on], side="right") - 1
        ok = k >= 0
        ok[ok] = e[on][ok] <= se[k[ok]]
        gone[on[ok]] = True
        host_span_ns += int((se - ss).sum())
        rs, re_ = cs["recompute"].get((r, ln), (np.zeros(0, np.int64),) * 2)
        rec_span_ns += int((re_ - rs).sum())
        k = np.searchsorted(rs, s[on], side="right") - 1
        ok = k >= 0
        ok[ok] = e[on][ok] <= re_[k[ok]]
        in_rec[on[ok]] = True
    ed = t.edges
    src = ed["src"].to_numpy()
    dst = ed["dst"].to_numpy()
    launch = (ed["kind"].to_numpy() == EdgeKind.LAUNCH) & gone[src] & ~host[dst]
    coll = o["coll_id"].to_numpy() >= 0
    gpu = np.zeros(n, bool)
    gpu[dst[launch]] = True
    kept_coll = int((gpu & coll).sum())
    gpu &= ~coll  # a collective member cannot leave its rendezvous
    gpu_rec = np.zeros(n, bool)
    gpu_rec[dst[launch & in_rec[src]]] = True
    gpu_rec &= gpu
    gone |= gpu
    voided = _drop_ops(state, gone, cs["spans"], host, rank, lane, s, e)
    gdur = o["dur_ns"].to_numpy()
    eff: dict[str, Any] = {
        "trace": "kineto", "checkpoint_segments": cs["n_recompute"],
        "removed_host_ops": int((gone & host).sum()), "removed_gpu_ops": int(gpu.sum()),
        "removed_host_span_ns": host_span_ns, "recompute_host_span_ns": rec_span_ns,
        "removed_gpu_ns": int(gdur[gpu].sum()), "recompute_gpu_ops": int(gpu_rec.sum()),
        "recompute_gpu_ns": int(gdur[gpu_rec].sum())}
    if kept_coll:
        eff["kept_collectives"] = kept_coll
    if voided:
        eff["voided_edges"] = voided
    eff.update(_checkpoint_memory(t, cs))
    return eff


def _drop_ops(state: WhatIfState, gone: np.ndarray, spans: dict, host: np.ndarray,
              rank: np.ndarray, lane: np.ndarray, s: np.ndarray, e: np.ndarray) -> int:
    """Removed ops stay in the graph as zero-time pass-throughs (their dependencies kept, so
    stream and thread order hold); the measured host gaps (HOST_ORDER lags after an op's end)
    and release delays of every host op on a thread with removed spans lose exactly the part
    that lay inside a removed span; GPU ops removed lose their delay and launch lag; a removed
    host op no longer waits for another lane (such edges are voided; their count is
    returned)."""
    import dataclasses
    g = state.graph
    state.dur[gone] = 0.0
    lay_gone = layout_of(g, gone)
    lag = g.pred_lag_ns.copy()
    dst_l = np.repeat(np.arange(g.n_ops), np.diff(g.pred_ptr))
    perm = g.perm.astype(np.int64)
    s_op, d_op = perm[g.pred_src.astype(np.int64)], perm[dst_l]
    same = host[s_op] & host[d_op] & (rank[s_op] == rank[d_op]) & (lane[s_op] == lane[d_op])
    into = gone[d_op] & ~same
    lag[into & ~host[d_op]] = 0  # launch lag of a removed kernel / copy
    void = into & host[d_op]
    lag[void] = _VOID_LAG_NS
    g_pred_s2s = g.pred_s2s.copy()
    g_pred_s2s[void] = False
    cand = np.flatnonzero(same & ~g.pred_s2s & (lag > 0))
    delay = g.delay_ns.copy()
    delay[lay_gone & ~layout_of(g, host)] = 0
    dly = by_op(g, "delay_ns")
    for (r, ln), (ss, se) in spans.items():
        c = cand[(rank[s_op[cand]] == r) & (lane[s_op[cand]] == ln)]
        a = e[s_op[c]]
        lag[c] -= _covered(ss, se, a + lag[c]) - _covered(ss, se, a)
        on = np.flatnonzero(host & (rank == r) & (lane == ln) & (dly > 0))
        cut = _covered(ss, se, s[on]) - _covered(ss, se, s[on] - dly[on])
        delay[g.pos[on]] -= cut
    ll = g.lane_lag_ns.copy()
    ll[lay_gone & ~layout_of(g, host)] = 0
    state.graph = dataclasses.replace(g, pred_lag_ns=lag, pred_s2s=g_pred_s2s,
                                      delay_ns=np.maximum(delay, 0), lane_lag_ns=ll)
    return int(void.sum())


def _checkpoint_memory(trace, cs: dict) -> dict[str, Any]:
    """Activation memory checkpointing saved, from ``[memory]`` events: per recompute frame,
    the bytes allocated inside it and still held at its end (the segment's activations a
    non-checkpointed run keeps from forward to backward), summed over the frames of one step
    (all segments' activations are alive at the start of the backward)."""
    mem = trace.memory
    if len(mem) == 0:
        return {"memory": "unknown: the trace has no [memory] allocator events (record with "
                          "torch.profiler.profile(profile_memory=True)); the activation memory "
                          "checkpointing saved is not estimated",
                "memory_delta_bytes": None}
    ts = mem["ts_ns"].to_numpy()
    dlt = mem["bytes_delta"].to_numpy()
    mr = mem["rank"].to_numpy()
    per_rank: dict[int, float] = {}
    o = trace.ops
    st = o["step"].to_numpy()
    for (r, _ln), (ss, se) in cs["recompute"].items():
        on = mr == r
        cum = np.concatenate([[0], np.cumsum(dlt[on][np.argsort(ts[on], kind="stable")])])
        tt = np.sort(ts[on])
        held = cum[np.searchsorted(tt, se, side="right")] - cum[np.searchsorted(tt, ss, side="left")]
        n_steps = max(1, len(np.unique(st[(o["rank"].to_numpy() == r) & (st >= 0)])))
        per_rank[r] = per_rank.get(r, 0.0) + float(np.maximum(held, 0).sum()) / n_steps
    worst = int(max(per_rank.values())) if per_rank else 0
    return {"memory": "estimated from [memory] events: bytes allocated inside each recompute "
                      "frame and still held at its end, summed over a step's segments",
            "memory_delta_bytes": worst}


# ---------------------------------------------------------------------------- offload
