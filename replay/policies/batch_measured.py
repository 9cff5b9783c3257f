"""``parallel.micro_batch`` (the per-rank batch) on a measured trace.

A rank's forward and backward do work in proportion to the samples it processes (every GEMM,
convolution, attention and elementwise op runs over the batch; the weight gradients reduce
over it), plus a fixed cost per op: the framework's dispatch of the op, which does not depend
on the tensor sizes. What does not scale with the batch: the gradient all-reduces and the
DDP reducer's copies (they move the parameters' gradients), the optimizer step, and GPU
launch latency.

On a GPU trace (it has kernels) the host keeps its measured time: the per-launch work does
not depend on the tensor sizes. Each forward/backward kernel launched by an operator with
recorded shapes is re-timed as measured x model(shapes at ``b'``) / model(shapes at ``b``)
by the cost layer (:mod:`.kernel_cost`); the other kernels and host<->device copies scale by
``b'/b`` (``assumed:`` lines say how many and their share of GPU time).

On a CPU job, with ``b`` the measured per-rank batch and ``b'`` the new one, the forward and
backward phases' host time is split by what it was (:mod:`.batch_cpu`): a leaf operator
(``aten::relu``, ...) takes ``d + (t - d) b'/b`` where ``d`` is the rank's dispatch cost (the
median duration of its trivial ops: views, strides, detach; a few microseconds); a host gap
(the time the profiler did not cover between two ops of a thread) scales the same way for
the part of it that lies inside an operator's span (the operator's compute: a GEMM's, an
attention's), less a GEMM's weight copy (one copy of its parameter operand at the trace's
own copy rate, measured on its large ``aten::copy_`` calls: the GEMM reads and packs the
weight whatever the batch), and keeps the rest (Python, the autograd engine's bookkeeping,
the DDP reducer's and AccumulateGrad's gradient handling); Python ops keep their time.
``hardware.kernel_pricing = "flat"`` (the range's other end) scales the GEMMs' weight copy
too. Every GPU op of those phases takes ``t b'/b``. Ops inside the DDP reducer's ranges and
every collective keep their times. Before this split (FREEZE-3) every host op and gap of the
phases scaled past the dispatch cost; on the MLP at batch 16 <-> 32 that predicted +17.9%
where the step did not move (traces/pairs/README.md, batch 3).

The measured batch ``b``: ``meta["capture"]`` metadata (``batch`` / ``micro_batch``, recorded
by the capture), else the most common leading dimension of the inputs of the forward's
``aten::linear`` / ``aten::conv*`` ops and of ``aten::embedding``'s indices (its first input is
the table; ``aten::embedding_bag``'s offsets may hold one extra entry, so it is not read), from
the trace's Kineto files (``record_shapes``); refused without either. Reading the table's rows
as the batch (4,000 on batch 4's recommender) was fixed after batch 4 was scored.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from retime.collectors.enums import OpKind, Phase
from retime.collectors.errors import PolicyError

from .base import WhatIfState

__all__ = ["measured_batch", "scale_batch"]

_TRIVIAL = {"aten::as_strided", "aten::view", "aten::t", "aten::transpose", "aten::reshape",
            "aten::expand", "aten::detach", "detach", "aten::resolve_conj", "aten::permute",
            "aten::unsqueeze", "aten::squeeze", "aten::slice", "aten::select", "aten::alias",
            "aten::_reshape_alias", "aten::empty", "aten::empty_strided"}
_BATCHED = ("aten::linear", "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::embedding",
            "aten::_convolution")


def _from_capture(meta: dict) -> int | None:
    for block in (meta.get("capture") or {}).values():
        if not isinstance(block, dict):
            continue
        for src in (block.get("metadata"), block.get("job"), block):
            if isinstance(src, dict):
                for k in ("micro_batch", "batch", "per_rank_batch"):
                    v = src.get(k)
                    if isinstance(v, int) and v > 0:
                        return v
    return None


def _batch_dim(name: str, dims) -> int | None:
    """The batch an op's recorded input dims show, or None where they do not tell it.

    ``aten::embedding(weight, indices)`` leads with the table, so its batch is the indices'
    leading dimension; ``aten::embedding_bag``'s offsets hold B or B + 1 entries (its
    ``include_last_offset``), so it casts no vote. Linear and convolution lead with the input.
    """
    if not isinstance(dims, list) or not dims:
        return None
    if name.startswith("aten::embedding_bag"):
        return None
    x = dims[1] if name.startswith("aten::embedding") and len(dims) > 1 else dims[0]
    return int(x[0]) if isinstance(x, list) and len(x) >= 2 and int(x[0]) > 0 else None


def _from_shapes(meta: dict) -> int | None:
    from .batch_cpu import kineto_cpu_ops

    lead: Counter = Counter()
    for _, ev in kineto_cpu_ops(meta):
        for e in ev:
            name = str(e.get("name", ""))
            if name.startswith(_BATCHED):
                b = _batch_dim(name, (e.get("args") or {}).get("Input Dims"))
                if b:
                    lead[b] += 1
    return lead.most_common(1)[0][0] if lead else None


def measured_batch(trace) -> int:
    """The per-rank batch the trace was recorded with (module docstring)."""
    meta = trace.meta if isinstance(trace.meta, dict) else {}
    b = _from_capture(meta) or _from_shapes(meta)
    if not b:
        raise PolicyError("parallel.micro_batch on a measured trace needs the measured per-rank "
                          "batch: record it in the capture (Capture(metadata={'batch': B})) or "
                          "record shapes (record_shapes=True) so the forward's linear / conv "
                          "inputs tell it")
    return int(b)


def _in_ranges(trace, rank, lane, start, pattern: str) -> np.ndarray:
    """Whether each op starts inside a range whose name contains ``pattern`` on its lane."""
    names = np.asarray(trace.strings, dtype=object)
    r = trace.ranges
    hit = np.asarray([pattern in str(s) for s in names], bool)
    sel = hit[r["name_id"].to_numpy()] if len(r) else np.zeros(0, bool)
    out = np.zeros(len(start), bool)
    if not sel.any():
        return out
    key_r = r["rank"].to_numpy()[sel].astype(np.int64) * (1 << 20) + r["lane"].to_numpy()[sel]
    rs, re_ = r["start_ns"].to_numpy()[sel], r["end_ns"].to_numpy()[sel]
    key_o = rank.astype(np.int64) * (1 << 20) + lane
    for k in np.unique(key_r).tolist():
        m = key_r == k
        s, e = rs[m], re_[m]
        o = np.sort(s)
        ends = np.maximum.accumulate(e[np.argsort(s)])
        ids = np.flatnonzero(key_o == k)
        j = np.searchsorted(o, start[ids], side="right") - 1
        out[ids] = (j >= 0) & (start[ids] < ends[np.maximum(j, 0)])
    return out


def scale_batch(state: WhatIfState, new_batch: int) -> dict[str, Any]:
    """Phase 2: the forward and backward work at ``new_batch`` samples per rank."""
    from .hardware import scale_host_work

    t = state.trace
    b = measured_batch(t)
    f = float(new_batch) / b
    o = t.ops
    kind, phase = o["kind"].to_numpy(), o["phase"].to_numpy()
    rank, lane = o["rank"].to_numpy(), o["lane"].to_numpy()
    start = o["start_ns"].to_numpy()
    if not ((phase == Phase.FWD) | (phase == Phase.BWD)).any():
        raise PolicyError("parallel.micro_batch on a measured trace needs forward and backward "
                          "phases (record_function('forward') / 'backward' ranges, or "
                          "autograd's) to tell batch-sized work from the rest")
    work = ((phase == Phase.FWD) | (phase == Phase.BWD)) & (kind != OpKind.COLLECTIVE) \
        & (kind != OpKind.P2P) & ~_in_ranges(t, rank, lane, start, "reducer")
    names = np.asarray(t.strings, dtype=object)[o["name_id"].to_numpy()]
    trivial = np.asarray([n in _TRIVIAL for n in names], bool)
    dur = o["dur_ns"].to_numpy().astype(np.float64)
    d_rank = {int(r): float(np.median(dur[trivial & (rank == r)]))
              if (trivial & (rank == r)).any() else 0.0 for r in np.unique(rank)}
    fixed = np.asarray([d_rank[int(r)] for r in rank])
    host = (kind == OpKind.CPU_OP) | (kind == OpKind.RUNTIME)
    gpu = work & ~host
    out = {"micro_batch": int(new_batch), "measured_batch": b, "work_ops": int(work.sum())}
    if (kind == OpKind.KERNEL).any():
        # a GPU job: the kernels change with their shapes, the host's per-launch work
        # (dispatch, launch calls) does not depend on the tensor sizes
        out.update(_scale_gpu_batch(state, b, int(new_batch), gpu))
        return out
    state.dur[gpu] *= f
    wh = work & host
    op_fixed, gap_fixed = _host_part(state, wh, fixed, b, int(new_batch), out)
    scale_host_work(state, np.where(wh, f, 1.0), fixed_ns=op_fixed, gap_fixed_ns=gap_fixed)
    out["dispatch_ns"] = {str(k): round(v) for k, v in d_rank.items()}
    return out


def _host_part(state: WhatIfState, wh: np.ndarray, dispatch: np.ndarray, b: int, b2: int,
               out: dict) -> tuple[np.ndarray, np.ndarray]:
    """A CPU trace's forward/backward host time at another batch (:mod:`.batch_cpu`): per
    op, the part of its own time and of the gap before it that stays fixed. An operator's
    time scales past its dispatch, less a GEMM's weight copy (not with
    ``hardware.kernel_pricing = "flat"``: the range's other end); Python's, the autograd
    engine's and the gradients' handling keep theirs."""
    from .batch_cpu import COPY_MIN_BYTES, host_split
    dur = state.trace.ops["dur_ns"].to_numpy().astype(np.float64)
    sp = host_split(state.trace, wh)
    i = sp.info
    op_fixed = np.where(wh, np.where(i["op_scales"], dispatch, dur), 0.0)
    flat = state.notes.get("kernel_pricing") == "flat"
    gap = sp.gap_fixed_ns if not flat else sp.gap_fixed_ns - sp.info["gemm_fixed"]
    gap_fixed = np.where(wh, gap + dispatch, 0.0)
    out["host_split"] = {k: (round(v) if isinstance(v, float) and k.endswith("_ns") else v)
                         for k, v in i.items() if k not in ("op_scales", "gemm_fixed")}
    state.assume(
        f"parallel.micro_batch {b} -> {b2} on a CPU trace: of the forward/backward host "
        f"gaps, {i['gap_scaled_ns'] / max(i['gap_ns'], 1):.0%} lie inside operators (their "
        f"compute: scales x{b2 / b:.3g} past the dispatch cost); the rest (Python, the "
        "autograd engine, the DDP reducer's and AccumulateGrad's gradient handling) and the "
        f"Python ops keep their times; {i['ops_scaled']} leaf operator(s) scale; "
        f"{i['param_fills']} zero-fill(s) of a parameter-shaped tensor (a gradient's zeroing: "
        f"{i['param_fill_ns'] / 1e6:.2f} ms) keep theirs", bounded=True)
    if flat:
        state.assume(f"parallel.micro_batch {b} -> {b2} on a CPU trace: GEMMs scale linearly "
                     "past their dispatch cost (hardware.kernel_pricing = \"flat\")",
                     bounded=True)
    elif i["copy_rate_gbps"] is None or not i["gemms_with_weight"]:
        why = (f"no aten::copy_ of >= {COPY_MIN_BYTES // 1024} KiB in the trace to measure "
               "the host's copy rate" if i["copy_rate_gbps"] is None else
               "no aten::addmm / aten::mm with a recorded parameter operand (record_shapes)")
        state.assume(f"parallel.micro_batch {b} -> {b2} on a CPU trace: {why}, so GEMMs "
                     "scale linearly past their dispatch cost (a GEMM's weight read does "
                     "not, so a small batch's change is overstated)")
    else:
        state.assume(
            f"parallel.micro_batch {b} -> {b2} on a CPU trace: {i['gemms_with_weight']} "
            "GEMM(s) (aten::addmm / aten::mm) keep one copy of their weight operand at the "
            f"trace's copy rate, {i['copy_rate_gbps']:.2f} GB/s (median of its "
            f"{i['copies']} aten::copy_ of >= {COPY_MIN_BYTES // 1024} KiB): "
            f"{i['fixed_ns'] / 1e6:.2f} of their {i['gemm_ns'] / 1e6:.2f} ms; the range "
            "reaches linear scaling", bounds=[{"hardware.kernel_pricing": "flat"}])
    return op_fixed, gap_fixed


def _scale_gpu_batch(state: WhatIfState, b: int, b2: int, gpu: np.ndarray) -> dict[str, Any]:
    """Forward/backward GPU ops of a GPU trace at batch ``b2``: kernels with recorded shapes
    by the cost layer's ratio at the new shapes (:func:`kernel_cost.batch_ratio`), the rest
    by ``b2 / b`` on their time above the GPU profile's launch floor
    (:func:`kernel_cost.floor_scaled`; linear where the trace's GPU has no profile),
    host<->device copies of the batch by ``b2 / b``; host ops unchanged."""
    from .kernel_cost import batch_ratio, describe_fallback, floor_scaled, summary, trace_gpu
    t = state.trace
    f = b2 / b
    kind = t.ops["kind"].to_numpy()
    dur = t.ops["dur_ns"].to_numpy()
    kern = gpu & ((kind == OpKind.KERNEL) | (kind == OpKind.MEMSET))
    hw = trace_gpu(t)
    d = state.dur
    d[gpu] *= f  # the fallback; shaped kernels are re-set below
    why = ""
    kr = None
    flat = state.notes.get("kernel_pricing") == "flat"
    if flat:
        hw = None
    elif hw is None:
        why = (" (the trace's GPU has no built-in profile to price them on; "
               "hardware.from_gpu does not apply here)")
    else:
        kr = batch_ratio(t, hw.name, b, b2, kern)
        state.notes["batch_dims"] = (int(b), int(b2))  # hardware.gpu prices its swap at them
        if len(kr.op_ids):
            d[kr.op_ids] *= kr.ratio / f
        elif not why:
            why = " (no recorded shapes in the trace's Kineto files)"
    n_sh = 0 if kr is None else len(kr.op_ids)
    sh_ns = 0.0 if kr is None else kr.info["covered_ns"]
    n_floor = -1
    if hw is not None:
        # kernels without shapes: their work scales with the batch, their launch floor
        # does not (as the cost layer prices a kernel: kernel_cost.floor_scaled)
        fb = kern.copy()
        if n_sh:
            fb[kr.op_ids] = False
        fb = np.flatnonzero(fb)
        base = d[fb] / f
        d[fb] = floor_scaled(base, f, hw.kernel_overhead_us, hw.kernel_overhead_us)
        n_floor = int((base <= hw.kernel_overhead_us * 1e3).sum())
    g_ns = float(dur[kern].sum())
    if n_sh:
        sm = summary(kr)
        # the range: the same what-if with every kernel linear in the batch (the rule the
        # model refines: small kernels sit on their launch floor, big ones scale)
        state.assume(
            f"parallel.micro_batch {b} -> {b2} on {hw.name}: {n_sh} forward/backward "
            f"kernel(s) with recorded shapes ({sh_ns / g_ns if g_ns else 0:.1%} of their GPU "
            "time) re-timed as measured x model(new shapes) / model(old shapes) (batch "
            "dimension of activations scaled; small kernels stay near their launch floor, "
            f"large ones scale with their work; median ratio {sm['ratio_median']:.2f}, "
            f"{sm['ratio_min']:.2f}-{sm['ratio_max']:.2f}, linear would be {f:.2f}); the "
            "range reaches linear scaling", bounds=[{"hardware.kernel_pricing": "flat"}])
    rule = (f"scale linearly (x{f:.3g}), as do host<->device copies" if n_floor < 0 else
            f"scale linearly (x{f:.3g}) above their launch floor ({hw.kernel_overhead_us:g} us "
            f"on {hw.name}, which a batch change does not move; {n_floor} kernel(s) at or below "
            "it keep their time); host<->device copies scale linearly")
    line = describe_fallback("parallel.micro_batch", int(kern.sum()) - n_sh, g_ns - sh_ns,
                             g_ns, rule, why) if not flat else (
        f"parallel.micro_batch {b} -> {b2}: every forward/backward kernel and host<->device "
        f"copy scales linearly (x{f:.3g}; hardware.kernel_pricing = \"flat\")")
    if line:
        state.assume(line, bounded=flat)
    state.assume("parallel.micro_batch: host (CPU) ops, launch calls and gaps keep their "
                 "measured times (per-launch work does not depend on the batch); "
                 "collectives and the optimizer step keep theirs (they move parameters)",
                 bounded=True)
    out = {"shaped_kernels": n_sh, "fallback_kernels": int(kern.sum()) - n_sh,
           "shaped_share": round(sh_ns / g_ns, 4) if g_ns else 0.0}
    if kr is not None and n_sh:
        out.update({k: v for k, v in summary(kr).items() if k.startswith("ratio")})
    return out
