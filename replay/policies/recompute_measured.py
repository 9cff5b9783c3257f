"""``cache.recompute = "full"`` on a measured Kineto trace recorded without checkpointing.

Full activation recomputation (``torch.utils.checkpoint`` around every layer) keeps only each
layer's input from the forward and runs the layer's forward again in the backward, just
before the layer's own backward. The extra work is therefore the forward of the checkpointed
layers, once more per step, on the same threads and streams that ran it.

Which ops are a layer's forward comes from the trace's module ranges (``nn.Module: NAME_k``,
recorded by the profiler with ``with_stack`` / ``with_modules``): the layers are the
repeated sibling modules of one class (``Sequential_0`` .. ``Sequential_3``,
``TransformerEncoderLayer_0`` .. ``_5``) that cover the most forward time; the model's head,
embedding and loss stay un-checkpointed, as in the usual per-layer checkpointing.

Per step and rank, the recompute of layer ``k`` costs, on the host thread that ran its
forward, the layer range's wall time (host work included: on a CPU job that is the compute),
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

from .base import WhatIfState

__all__ = ["recompute_full_kineto", "layer_ranges"]

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
    """Phase 2: add each layer's forward again before its backward (module docstring)."""
    t = state.trace
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
            # cost per layer and lane: the range on its thread, launched GPU work per stream
            costs: list[dict[int, float]] = []
            for k in sel.tolist():
                c = {int(rl[k]): float(re_[k] - rs[k])}
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
