"""``parallel.tp`` (the tensor-parallel degree) on a measured GPU trace recorded at TP=1.

The trace must hold what Megatron's layout needs, read from its recorded shapes
(torch.profiler ``record_shapes=True``; :func:`.kernel_cost.shaped_kernels`):

* **the layout**: per rank, the forward's 2-D GEMM calls (``aten::addmm`` / ``aten::linear``
  / ``aten::mm``) in issue order form chains of linear layers where one layer's output width
  is the next one's input width over the same rows (an MLP: ``x W1 -> act -> W2 ...``). Each
  chain is split as Megatron-LM splits a transformer's MLP (Shoeybi et al. 2019, REFERENCES
  K23): layers in pairs, the first **column**-parallel (its ``N`` outputs split by ``t``), the
  second **row**-parallel (its ``K`` inputs split by ``t``); an odd chain's last layer, a
  lone linear layer, a pair whose split width ``t`` does not divide, convolutions and the
  other kernels stay **replicated** (every TP rank runs them whole, at their measured time);
* **attention blocks** (:mod:`.tp_attention`): a QKV projection (one linear of ``3 H d``
  outputs, or ``q``, ``k``, ``v`` of ``H d`` each), an attention core with a ``[b, H, s, d]``
  query (``scaled_dot_product_attention`` and its flash / efficient / cuDNN / CPU kernels'
  operators) and the out-projection (``H d`` inputs) split as Megatron splits them by heads:
  QKV column-parallel, the core (forward and backward) on ``H / t`` heads, the
  out-projection row-parallel; ``t`` must divide ``H`` (refused otherwise). An attention
  GEMM ends an MLP chain;
* **the backward GEMMs** of each split layer, matched by shape: the input gradient
  (``M x N x K``) and the weight gradient (``N x M x K`` or ``K x M x N``), the layer's split
  dimension divided by ``t`` in each (so each split layer's FLOPs are exactly ``1/t`` of the
  measured ones);
* on a trace without GPU kernels (a CPU run) the layout is read from its ``cpu_op`` shapes
  (checked against a measured TP=2 run, ``traces/tp``) and re-timed by :mod:`.tp_cpu`
  (host compute 1/t, gloo all-reduces from a calibration);
* **the TP all-reduces** Megatron adds per pair: the row layer's output (``M x N_row``
  elements) after its forward GEMM, and the column layer's input gradient (``M x K_col``)
  after its input-gradient GEMM (none when the trace has no input-gradient GEMM for it: the
  chain's input needs no gradient), in the GEMMs' dtype, priced by the cost layer's NCCL
  model (:mod:`collectors.costs.nccl`) for ``t`` GPUs of the trace's platform in one node
  (:func:`.nccl_trace.trace_cluster`).

Re-timing, on each rank: the split GEMM calls' kernels take measured x model(split shapes) /
model(measured shapes) (the cost layer's price: a GEMM far below peak gains less than
``t``; :func:`.kernel_cost._prices`); with ``hardware.kernel_pricing = "flat"`` they take
exactly ``1/t`` (the range's optimistic end, with the NCCL model's low end). Each TP
all-reduce is serialized after the GEMM that feeds it (Megatron without
``tp_comm_overlap``): its modeled time is added to that call's last kernel, so the next
kernel on the stream waits for it. Host work (dispatch, launches) keeps its measured time:
each TP rank launches the same kernels; each TP all-reduce adds one launch call on the host,
at the median of the trace's own NCCL launch calls (none where it launches no NCCL kernel:
a lower bound either way, the c10d work around a launch is not in Kineto's runtime rows). Each measured rank stands for a TP group of ``t``
GPUs (the per-replica batch and the data-parallel degree unchanged). Data-parallel gradient
all-reduces whose bytes are exactly the linear layers' gradients (:func:`dp_buckets`) lose
the NCCL model's saving on their smaller message; the others keep their measured time (an
upper bound). With ``parallel.dp`` too (``tp x dp`` = the trace's ranks: the same GPUs, fewer
replicas; :mod:`.tp_dp`) every gradient all-reduce is re-priced for the smaller group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from retime.collectors.enums import CommOp, LaneKind, OpKind, Phase
from retime.collectors.errors import PolicyError
from retime.collectors.trace import Trace

from .base import WhatIfState, trace_memo

#: the kinds of op a GPU lane runs (GPU time, for the shares the what-if states)
_GPU_KINDS = [int(k) for k in (OpKind.KERNEL, OpKind.MEMCPY, OpKind.MEMSET, OpKind.COLLECTIVE,
                               OpKind.P2P)]

__all__ = ["TpLayout", "tp_layout", "split_dims", "scale_tp", "same_gpus_dp", "dp_buckets",
           "MAX_TP"]

#: TP groups this model prices: one node's NVLink / xGMI domain (8 GPUs on the platforms
#: :func:`.nccl_trace.trace_cluster` knows)
MAX_TP = 8
_FWD_GEMM = ("addmm", "linear", "mm")
_BWD_GEMM = ("mm", "addmm", "linear")
_ES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp64": 8, "fp8": 1}
# which of the call's (m, k, n) holds the split dimension, by role and split kind
_AXIS = {("fwd", "column"): "n", ("fwd", "row"): "k",
         ("dgrad", "column"): "k", ("dgrad", "row"): "n",
         ("wgrad_nmk", "column"): "m", ("wgrad_nmk", "row"): "n",
         ("wgrad_kmn", "column"): "n", ("wgrad_kmn", "row"): "m"}


@dataclass(frozen=True)
class TpLayout:
    """What ``parallel.tp=t`` splits on a trace.

    ``calls`` (int64): shaped-call indices (:class:`.kernel_cost.ShapedKernels`) split by
    ``t``; ``axis``: per split call, which of its GEMM dimensions (``m``/``k``/``n``) is
    divided (``h``: an attention core's heads); ``layers``: per linear layer found, a dict
    (rank, m, k, n, kind: column / row / replicated, why, attn: its attention block's index
    or None); ``allreduces``: (call index the all-reduce follows, bytes, phase name) per TP
    all-reduce; ``gemm_calls``: every 2-D GEMM call of the trace; ``attention``: the
    attention blocks (:func:`.tp_attention.attention_blocks`); ``device``: whether the calls
    own GPU kernels (False: a CPU run, layout only).
    """

    t: int
    calls: np.ndarray
    axis: tuple[str, ...]
    layers: tuple[dict, ...]
    allreduces: tuple[tuple[int, int, str], ...]
    gemm_calls: int
    attention: tuple[dict, ...] = ()
    device: bool = True


def _mkn(name: str, dims: list, types: list) -> tuple[int, int, int] | None:
    from retime.collectors.costs.ops import base_name, gemm_dims, tensors
    try:
        bt, m, n, k = gemm_dims(base_name(name), tensors(dims, types))
    except (IndexError, TypeError, ValueError):
        return None
    return (int(m), int(k), int(n)) if bt == 1 else None


def _has_bias(name: str, dims: list) -> bool:
    from retime.collectors.costs.ops import base_name
    b = base_name(name)
    ts = [d for d in dims if isinstance(d, list) and d]
    return b == "addmm" or (b == "linear" and len(ts) > 2)


def dp_buckets(trace: Trace, lay: TpLayout) -> list[tuple[int, int, int]]:
    """:func:`.tp_dp.dp_buckets` (the data-parallel buckets of the split layers)."""
    from .tp_dp import dp_buckets as _b
    return _b(trace, lay)


def same_gpus_dp(trace: Trace, t: int, dp: int) -> int:
    """:func:`.tp_dp.same_gpus_dp`: ``parallel.dp`` with ``parallel.tp`` on a measured
    trace, checked."""
    from .tp_dp import same_gpus_dp as _s
    return _s(trace, t, dp)


def split_dims(name: str, dims: list, axis: str, t: int) -> list:
    """``dims`` of a 2-D GEMM call (``aten::mm`` / ``addmm`` / ``linear``) with its ``axis``
    (``m``, ``k`` or ``n`` of ``C[m, n] = A[m, k] B[k, n]``) divided by ``t``: every operand
    extent that is that dimension (the bias of a column split too)."""
    from retime.collectors.costs.ops import base_name
    if axis in ("h", "b"):  # an attention core: its heads (SDPA) or batch b H (bmm)
        from .tp_attention import kv_heads, split_batch, split_heads
        return split_heads(dims, t, kv_heads(name, dims)) if axis == "h" \
            else split_batch(dims, t)
    b = base_name(name)
    new = [list(d) if isinstance(d, list) else d for d in dims]
    pos = [i for i, d in enumerate(new) if isinstance(d, list) and d]
    if b == "linear":  # x [.., k], w [n, k], bias [n]
        x, w = new[pos[0]], new[pos[1]]
        bias = new[pos[2]] if len(pos) > 2 else None
        if axis == "m":
            x[0] //= t
        elif axis == "k":
            x[-1] //= t
            w[1] //= t
        else:
            w[0] //= t
            if bias is not None:
                bias[-1] //= t
        return new
    bias = None
    if b == "addmm":
        bias, pos = new[pos[0]], pos[1:]
    a, c = new[pos[0]], new[pos[1]]
    if axis == "m":
        a[0] //= t
        if bias is not None and len(bias) == 2:
            bias[0] //= t
    elif axis == "k":
        a[1] //= t
        c[0] //= t
    else:
        c[1] //= t
        if bias is not None and bias[-1] == c[1] * t:
            bias[-1] //= t
    return new


def tp_layout(trace: Trace, t: int) -> TpLayout:
    """The split :data:`TpLayout` of ``parallel.tp=t`` (module docstring); PolicyError naming
    what is missing when the trace holds no column/row pair to split."""
    memo = trace_memo(trace)
    key = ("tp_layout", int(t))
    if key not in memo:
        memo[key] = _tp_layout(trace, int(t))
    return memo[key]


def _call_times(trace: Trace, sk) -> tuple[np.ndarray, np.ndarray]:
    """Per shaped call: the start of its first device op and that op's phase."""
    st = trace.ops["start_ns"].to_numpy()[sk.op_ids]
    ph = trace.ops["phase"].to_numpy()[sk.op_ids]
    n = len(sk.names)
    first = np.full(n, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, sk.call_of, st)
    phase = np.full(n, -1, np.int64)
    order = np.lexsort((st, sk.call_of))
    c_sorted = sk.call_of[order]
    head = np.ones(len(order), bool)
    head[1:] = c_sorted[1:] != c_sorted[:-1]
    phase[c_sorted[head]] = ph[order][head]
    return first, phase


def _refuse(t: int, why: str) -> PolicyError:
    return PolicyError(f"parallel.tp={t} on a measured trace: {why}; synthesize the model with "
                       f"`retime synth --tp {t}` and apply the scenario to that")


def _tp_layout(trace: Trace, t: int) -> TpLayout:
    from retime.collectors.costs.ops import base_name

    from .kernel_cost import shaped_kernels
    from .tp_attention import (
        attention_backward,
        attention_blocks,
        cpu_calls,
        gpu_calls,
        has_device_ops,
        is_core,
    )
    if t > MAX_TP:
        raise _refuse(t, f"a TP group larger than one node's {MAX_TP} GPUs would cross the "
                      "inter-node network, which this model does not place TP groups on")
    sk = shaped_kernels(trace)
    c = None
    if sk is not None:
        c = gpu_calls(trace, sk, *_call_times(trace, sk))
    elif not has_device_ops(trace):
        c = cpu_calls(trace)  # a CPU run: the layout from its cpu_op shapes
    if c is None:
        raise _refuse(t, "it holds no operator shapes (record the trace with "
                      "torch.profiler's record_shapes=True) to split its GEMMs by")
    first, phase, es = c.first, c.phase, c.es
    mkn = [(_mkn(n, d, ty) if base_name(n) in _FWD_GEMM else None)
           for n, d, ty in zip(c.names, c.dims, c.types)]
    gemm = np.asarray([x is not None for x in mkn])
    if not gemm.any():
        raise _refuse(t, "it holds no 2-D GEMM call (aten::addmm / linear / mm) with recorded "
                      "shapes: nothing a tensor-parallel layout splits")
    attn = np.asarray([is_core(n) for n in c.names])
    layers: list[dict] = []
    split_calls: list[int] = []
    axes: list[str] = []
    ars: list[tuple[int, int, str]] = []
    blocks_all: list[dict] = []
    for r in np.unique(c.rank).tolist():
        mine = gemm & (c.rank == r)
        seq = np.flatnonzero((mine | attn) & (c.rank == r) & (phase == Phase.FWD))
        seq = seq[np.argsort(first[seq], kind="stable")].tolist()
        blocks = attention_blocks(c, seq, mkn, t)
        blocks_all += blocks
        role = {}
        for bi, blk in enumerate(blocks):
            for x in blk["qkv"]:
                role[x] = ("column", bi)
            role[blk["out"]] = ("row", bi)
        # MLP chains among the other forward GEMMs; an attention GEMM ends a chain
        chains: list[list[int]] = []
        for x in seq:
            if mkn[x] is None:
                continue
            if x in role:
                chains.append([])
                continue
            m, k, _n = mkn[x]
            last = mkn[chains[-1][-1]] if chains and chains[-1] else None
            if last is not None and last[0] == m and last[2] == k:
                chains[-1].append(x)
            else:
                chains.append([x])
        kind_of: dict[int, tuple[str, str]] = {x: (k, "") for x, (k, _b) in role.items()}
        for ch in chains:
            for i, x in enumerate(ch):
                kind = ("column" if i % 2 == 0 and i + 1 < len(ch) else
                        "row" if i % 2 == 1 else "replicated")
                kind_of[x] = (kind, "" if kind != "replicated" else
                              "unpaired (a lone layer or an odd chain's last)")
            # a pair splits only where t divides its split widths (Megatron's rule)
            for i in range(0, len(ch) - 1, 2):
                if mkn[ch[i]][2] % t or mkn[ch[i + 1]][1] % t:
                    why = f"width {mkn[ch[i]][2]} not divisible by {t}"
                    kind_of[ch[i]] = kind_of[ch[i + 1]] = ("replicated", why)
        mine_layers = []
        for x in seq:
            if mkn[x] is None:
                continue
            m, k, n = mkn[x]
            kind, why = kind_of[x]
            mine_layers.append({"rank": int(r), "m": m, "k": k, "n": n, "kind": kind,
                                "bias": _has_bias(c.names[x], c.dims[x]), "es": es[x],
                                "why": why, "fwd": x, "dgrad": None, "wgrad": None,
                                "wrole": None, "attn": role.get(x, (None, None))[1],
                                "ar": True})
        layers += mine_layers
        # backward GEMMs by shape, latest forward layer first (backward runs in reverse)
        bwd = np.flatnonzero((c.rank == r) & (phase == Phase.BWD))
        bwd = bwd[np.argsort(first[bwd], kind="stable")].tolist()
        attention_backward(c, blocks, bwd)
        for x in bwd:
            if base_name(c.names[x]) not in _BWD_GEMM or mkn[x] is None:
                continue
            got = mkn[x]
            for L in reversed(mine_layers):
                m, k, n = L["m"], L["k"], L["n"]
                if L["dgrad"] is None and got == (m, n, k):
                    L["dgrad"] = x
                    break
                if L["wgrad"] is None and got in ((n, m, k), (k, m, n)):
                    L["wgrad"], L["wrole"] = x, ("wgrad_nmk" if got == (n, m, k)
                                                 else "wgrad_kmn")
                    break
        for bi in range(len(blocks)):  # q, k, v: one all-reduce of the summed gradient
            qkv = [L for L in mine_layers if L["attn"] == bi and L["kind"] == "column"]
            if len(qkv) > 1:
                last = max((L for L in qkv if L["dgrad"] is not None),
                           key=lambda L: first[L["dgrad"]], default=None)
                for L in qkv:
                    L["ar"] = L is last
        for L in mine_layers:
            if L["kind"] == "replicated":
                continue
            for rl, x in (("fwd", L["fwd"]), ("dgrad", L["dgrad"]), (L["wrole"], L["wgrad"])):
                if x is not None:
                    split_calls.append(x)
                    axes.append(_AXIS[(rl, L["kind"])])
            if L["kind"] == "column":
                if L["dgrad"] is not None and L["ar"]:
                    ars.append((L["dgrad"], L["m"] * L["k"] * es[L["fwd"]], "backward"))
            else:
                ars.append((L["fwd"], L["m"] * L["n"] * es[L["fwd"]], "forward"))
        for blk in blocks:
            split_calls += blk["core"] + blk["core_bwd"]
            axes += blk["axes"] + blk["axes_bwd"]
    if not split_calls:
        n_l = len(layers)
        raise _refuse(t, f"of its {n_l} linear layer(s) (2-D GEMMs of its forward) none forms "
                      "a column/row pair (two consecutive layers where the first's output "
                      "width is the second's input width over the same rows) that "
                      f"{t} divides, no attention block (QKV projection, attention core, "
                      "out-projection) is recognized, and the trace records no other layout "
                      "(meta['synth']['parallel'])")
    return TpLayout(t=t, calls=np.asarray(split_calls, np.int64), axis=tuple(axes),
                    layers=tuple(layers), allreduces=tuple(ars), gemm_calls=int(gemm.sum()),
                    attention=tuple(blocks_all), device=c.device)


def _split_ratio(trace: Trace, lay: TpLayout, dev: np.ndarray, flat: bool, hw
                 ) -> tuple[np.ndarray, np.ndarray, dict]:
    """(op ids, duration multipliers, info) of the split calls' device ops."""
    from retime.collectors.costs.ops import op_cost

    from .kernel_cost import _prices, _spread, shaped_kernels
    sk = shaped_kernels(trace)
    calls, first = np.unique(lay.calls, return_index=True)
    axis = [lay.axis[i] for i in first]
    dims2 = [split_dims(sk.names[c], sk.dims[c], a, lay.t) for c, a in zip(calls, axis)]
    work2 = [op_cost(sk.names[c], d, sk.types[c], sk.concrete[c]) for c, d in
             zip(calls.tolist(), dims2)]
    f_old = float(sum(sk.work[c][0] for c in calls.tolist()))
    f_new = float(sum(w[0] for w in work2 if w is not None))
    info = {"split_calls": int(len(calls)), "flops_old": f_old, "flops_new": f_new}
    if flat or hw is None:
        keep = np.isin(sk.call_of, calls) & dev[sk.op_ids]
        ids = np.unique(sk.op_ids[keep])
        return ids, np.full(len(ids), 1.0 / lay.t), info
    from retime.collectors.costs.gpus import gpu_spec
    g = gpu_spec(hw.name)
    old_p = _prices(sk, g, calls)
    new_p = _prices(sk, g, calls, dims2, work2)
    ids, ratio = _spread(sk, calls, old_p, new_p, dev)
    return ids, ratio, info


def _attn_line(lay: TpLayout) -> str:
    if not lay.attention:
        return "no attention block recognized"
    hs = sorted({b["heads"] for b in lay.attention})
    fused = sum(len(b["qkv"]) == 1 for b in lay.attention)
    bwd = sum(len(b["core_bwd"]) for b in lay.attention)
    bmm = sum(b["axis"] == "b" for b in lay.attention)
    kvs = sorted({b.get("kv_heads", b["heads"]) for b in lay.attention
                  if b.get("kv_heads", b["heads"]) != b["heads"]})
    gqa = (f" (grouped-query: {'/'.join(map(str, kvs))} -> "
           f"{'/'.join(str(h // lay.t) for h in kvs)} key/value heads per rank, each rank "
           "keeping its query heads' groups)" if kvs else "")
    return (f"{len(lay.attention)} attention block(s): QKV {fused} fused, "
            f"{len(lay.attention) - fused} as q, k, v; {'/'.join(map(str, hs))} -> "
            f"{'/'.join(str(h // lay.t) for h in hs)} heads per rank in the attention core"
            f"{gqa}, "
            f"{bmm} of them as batched GEMMs (Q K^T, softmax, P V; masking and dropout "
            "replicated), "
            f"{bwd} core backward call(s) matched")


def _launches(trace: Trace) -> tuple[dict, float | None, int]:
    """((rank, correlation) -> op id of the runtime call that launched it, for device ops;
    the median duration (ns) of the calls that launched the trace's collective kernels, or
    None without any; how many)."""
    o = trace.ops
    kind, rank, cor = o["kind"].to_numpy(), o["rank"].to_numpy(), o["correlation"].to_numpy()
    rt = np.flatnonzero((kind == OpKind.RUNTIME) & (cor >= 0))
    key = dict(zip(zip(rank[rt].tolist(), cor[rt].tolist()), rt.tolist()))
    coll = np.flatnonzero(kind == OpKind.COLLECTIVE)
    hit = [key.get(x) for x in zip(rank[coll].tolist(), cor[coll].tolist())]
    hit = [h for h in hit if h is not None]
    dur = o["dur_ns"].to_numpy()
    return key, (float(np.median(dur[hit])) if hit else None), len(hit)


def scale_tp(state: WhatIfState, t: int, cost_bound: str | None = None) -> dict[str, Any]:
    """Phase 2 of ``parallel.tp=t`` on a measured trace (module docstring): re-times the split
    GEMMs' kernels and adds the TP all-reduces after the GEMMs that feed them."""
    from .kernel_cost import shaped_kernels, trace_gpu
    from .nccl_trace import NcclPricer, measured_channels, trace_cluster
    tr = state.trace
    lay = tp_layout(tr, t)
    if not lay.device:  # a CPU run: host gaps and gloo (tp_cpu.py)
        from .tp_cpu import scale_tp_cpu
        return scale_tp_cpu(state, lay, t)
    sk = shaped_kernels(tr)
    kind = tr.ops["kind"].to_numpy()
    dev = (kind == OpKind.KERNEL) | (kind == OpKind.MEMSET)
    dur0 = tr.ops["dur_ns"].to_numpy().astype(np.float64)
    flat = state.notes.get("kernel_pricing") == "flat"
    hw = trace_gpu(tr)
    ids, ratio, info = _split_ratio(tr, lay, dev, flat, hw)
    d = state.dur
    before = float(d[ids].sum())
    d[ids] *= ratio
    saved_ns = before - float(d[ids].sum())
    stated = state.notes.get("intra_node_gbps")  # network.intra_node_gbps: the new NVLink
    cluster, src = trace_cluster(tr, ranks_per_node=t, world=t, measured_intra_gbps=stated)
    bound = "low" if flat and cost_bound is None else cost_bound
    pricer = NcclPricer(cluster, bound=bound, channels=measured_channels(tr))
    st = tr.ops["start_ns"].to_numpy()
    ar_ns = 0.0
    ar_bytes = 0
    launch_of, launch_ns, n_launch = _launches(tr)
    rank_c, cor_c = tr.ops["rank"].to_numpy(), tr.ops["correlation"].to_numpy()
    host_ns = 0.0
    for c, nbytes, _ph in lay.allreduces:
        own = sk.op_ids[sk.call_of == c]
        own = own[dev[own]]
        if not len(own):
            continue
        last = own[np.argmax(st[own] + dur0[own])]
        x = pricer.time_ns(int(CommOp.ALL_REDUCE), float(nbytes), t)
        d[last] += x
        ar_ns += x
        ar_bytes += int(nbytes)
        # the host launches the all-reduce after the GEMM: its launch call, as the trace's
        # own NCCL launches took, rides on the GEMM's launch call
        h = launch_of.get((int(rank_c[last]), int(cor_c[last])))
        if launch_ns is not None and h is not None:
            d[h] += launch_ns
            host_ns += launch_ns
    ranks = max(1, len(np.unique(sk.rank)))
    from .tp_dp import resize_dp
    dp = resize_dp(state, lay, cost_bound)
    gemm = np.asarray([_mkn(n, dd, ty) is not None for n, dd, ty in
                       zip(sk.names, sk.dims, sk.types)])
    gemm_ns = float(dur0[sk.op_ids[gemm[sk.call_of]]].sum())
    split_ns = float(dur0[ids].sum())
    g_ns = float(dur0[dev].sum())
    # every op on a GPU lane (NCCL kernels and copies too): what "GPU time" recounts to
    lk = dict(zip(tr.lanes["lane"].tolist(), tr.lanes["lane_kind"].tolist()))
    on_gpu = (np.asarray([lk.get(x, -1) for x in tr.ops["lane"].tolist()])
              != int(LaneKind.CPU_THREAD)) & np.isin(kind, _GPU_KINDS)
    all_ns = float(dur0[on_gpu].sum())
    n_rep = sum(L["kind"] == "replicated" for L in lay.layers)
    n_split = len(lay.layers) - n_rep
    why_rep = sorted({L["why"] for L in lay.layers if L["kind"] == "replicated"})
    gpu = hw.name if hw is not None else "the trace's GPU (no built-in profile)"
    how = (f"exactly 1/{t} of their measured time (" + ("hardware.kernel_pricing = \"flat\")"
           if flat else "the trace's GPU has no built-in profile to price them on)")
           if flat or hw is None or not len(ratio) else
           f"measured x model(split shapes) / model(measured shapes) on {gpu} (small GEMMs "
           f"gain less than {t}x: median ratio {np.median(ratio):.2f}, "
           f"{ratio.min():.2f}-{ratio.max():.2f}, linear would be {1 / t:.2f})")
    state.assume(
        f"parallel.tp 1 -> {t} on a measured trace (taken as TP=1: it names no tensor-parallel "
        f"group): {n_split} of its {len(lay.layers)} linear layer(s) split as Megatron-LM's "
        "column/row pairs (consecutive layers, first by output columns, second by input "
        f"rows) or Megatron's attention split by heads ({_attn_line(lay)}), found from the "
        f"forward's recorded shapes; their {info['split_calls']} forward/backward GEMM and "
        f"attention call(s) ({split_ns / all_ns if all_ns else 0:.1%} of all GPU time, "
        f"{split_ns / g_ns if g_ns else 0:.1%} of the compute kernels' (no NCCL, no copies); "
        f"FLOPs {info['flops_old'] / 1e9:.3g} -> {info['flops_new'] / 1e9:.3g} GFLOP) take "
        f"{how}; {n_rep} layer(s) stay replicated ({'; '.join(why_rep) or 'none'}), as do "
        "convolutions, unrecognized attention and every other kernel (their measured time on "
        "each TP rank)",
        bounds=None if flat else [{"hardware.kernel_pricing": "flat"}])
    state.assume(
        f"parallel.tp={t}: {len(lay.allreduces)} TP all-reduce(s) added ({ar_bytes / 1e6:.3g} "
        f"MB over {ranks} rank(s): each split pair's output in forward, its input gradient in "
        f"backward), priced by the NCCL model for {t} GPUs of one node ({src['platform']}, "
        f"{src['fabric']}, {src['nominal_intra_gbps']:g} GB/s per GPU "
        f"{'stated: network.intra_node_gbps' if stated else 'nominal'}): {ar_ns / 1e6:.3g} ms "
        "in all, serialized after the GEMM that feeds "
        "each (no tp_comm_overlap); host launches of the kernels keep their measured times, "
        + (f"and each all-reduce's launch call takes {launch_ns / 1e3:.3g} us on the host "
           f"(the median of the trace's {n_launch} NCCL launch calls; PyTorch's c10d work "
           "around it is not in the trace: a lower bound)" if launch_ns is not None else
           "and the all-reduces' own launch calls are not charged (the trace launches no "
           "NCCL kernel to measure one by: a lower bound)"),
        bounds=None if cost_bound is not None or flat else [{"overlap.cost_bound": "high"}])
    state.assume(dp["line"], bounded=True)
    return {"tp": t, "split_layers": n_split, "dp_buckets_resized": dp["buckets"],
            "dp_bytes_old": dp["old"], "dp_bytes_new": dp["new"], "dp_saved_ns": dp["saved_ns"],
            "dp_ranks": dp["dp_ranks"], "replicated_layers": n_rep,
            "split_calls": info["split_calls"], "flops_old": info["flops_old"],
            "flops_new": info["flops_new"], "gemm_share": round(gemm_ns / g_ns, 4) if g_ns
            else 0.0, "split_share": round(split_ns / g_ns, 4) if g_ns else 0.0,
            "split_share_gpu": round(split_ns / all_ns, 4) if all_ns else 0.0,
            "gemm_saved_ns": round(saved_ns), "tp_allreduces": len(lay.allreduces),
            "tp_allreduce_bytes": ar_bytes, "tp_allreduce_ns": round(ar_ns),
            "tp_launch_host_ns": round(host_ns)}
