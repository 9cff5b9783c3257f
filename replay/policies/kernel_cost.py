"""Kernels of a measured GPU trace re-priced by the one cost layer (``collectors/costs``).

A what-if on a measured trace is "transform, then price": ``hardware.gpu`` moves every kernel
to another GPU, ``parallel.micro_batch`` changes the shapes it runs on. Each kernel launched
by an operator whose shapes were recorded (torch.profiler ``record_shapes=True``; read back by
:func:`collectors.costs.ops.shaped_calls`) is re-timed as

    measured time x model(new) / model(old)

where ``model`` is the cost layer's price of the *operator call* (roofline x efficiency
curve by class and size: k-depth, tiles and waves over the SMs, split-K, the streaming size
curve, one launch floor per kernel the call launched; :func:`collectors.costs.ops.price_op`)
with the fitted curves of :data:`KERNEL_CURVES`. The ratio keeps the measured kernel's own
inefficiency (what the model misses about this kernel is assumed to carry over) and applies
what the model knows about how the change moves it: a small GEMM far from peak gains little
from a faster GPU, a latency-bound kernel nothing, a large one up to the ratio of the
published ceilings.

Kernels no shaped call owns keep the caller's fallback (a class ratio, or linear scaling)
and the what-if says how many there are and what share of GPU time they hold.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from retime.collectors.costs.kernels import FITTED_CURVES
from retime.collectors.enums import OpKind
from retime.collectors.errors import ConfigError, PolicyError, RetimeError
from retime.collectors.trace import Trace

from .base import frozen, trace_memo

__all__ = ["KERNEL_CURVES", "ShapedKernels", "shaped_kernels", "trace_gpu", "gpu_ratio", "twin_ratios",
           "kernel_intensity",
           "batch_ratio", "KernelRatio", "describe_fallback", "floor_scaled"]

#: the efficiency curves the what-ifs price with (fitted: collectors/costs/kernels.py)
KERNEL_CURVES = FITTED_CURVES

# family tokens of device names, for GPUs whose board name differs from the profile's
# (e.g. "NVIDIA A100-PG509-200"): the profile of that family closest in memory size
_FAMILIES = ("a100", "h100", "h200", "b200", "gb200", "b300", "gb300", "v100", "mi250x",
             "mi300x", "mi325x", "mi355x")


@dataclass(frozen=True)
class ShapedKernels:
    """The shaped operator calls of a trace and the device ops each launched.

    ``op_ids``: int64 op ids of the device ops (kernels, memsets) owned by a call;
    ``call_of``: int32 index into the call lists for each of them; per call ``names``,
    ``dims``, ``types``, ``concrete``, ``work`` ((flops, bytes, dtype)), ``launches``
    (int64: kernels it launched), ``kernels`` (their names: convolutions price their layout
    kernels by them) and ``rank``.
    """

    op_ids: np.ndarray
    call_of: np.ndarray
    names: list
    dims: list
    types: list
    concrete: list
    work: list
    launches: np.ndarray
    rank: np.ndarray
    kernels: list | None = None


@dataclass(frozen=True)
class KernelRatio:
    """Per-op duration multipliers for the ops a model priced (``op_ids`` / ``ratio``), and
    what it covered: ``info`` holds ``calls``, ``kernels``, ``covered_ns``, ``gpu_ns`` (all
    device time considered) and ``notes`` (assumed lines)."""

    op_ids: np.ndarray
    ratio: np.ndarray
    info: dict


def shaped_kernels(trace: Trace) -> ShapedKernels | None:
    """The trace's shaped calls (memoized per trace), or None when it has no Kineto sources
    with shapes (the what-if then falls back and says why)."""
    memo = trace_memo(trace)
    if "shaped_kernels" in memo:
        return memo["shaped_kernels"]
    from retime.collectors.costs.ops import shaped_calls

    kind = trace.ops["kind"].to_numpy()
    dev = (kind == OpKind.KERNEL) | (kind == OpKind.MEMSET)
    out = None
    names = trace.names()
    try:
        rows = list(shaped_calls(trace, dev))
    except RetimeError:
        rows = []
    if rows:
        ids = [r[-1] for r in rows]
        out = ShapedKernels(
            op_ids=frozen(np.concatenate(ids).astype(np.int64)),
            call_of=frozen(np.repeat(np.arange(len(rows), dtype=np.int32),
                                     [len(i) for i in ids])),
            names=[r[1] for r in rows], dims=[r[2] for r in rows], types=[r[3] for r in rows],
            concrete=[r[4] for r in rows], work=[r[5] for r in rows],
            launches=frozen(np.asarray([len(i) for i in ids], np.int64)),
            rank=frozen(np.asarray([r[0] for r in rows], np.int64)),
            kernels=[[str(n) for n in names[i]] for i in ids])
    memo["shaped_kernels"] = out
    return out


def trace_gpu(trace: Trace, from_gpu: str | None = None):
    """The built-in hardware profile of the trace's GPU (``from_gpu`` overrides), or None:
    the profile whose GPU name the trace's ``meta["devices"]`` holds, else the profile of
    the same family (``A100``, ``V100``, ...) closest in memory size."""
    from retime.collectors.synth import hardware_names, load_hardware
    if from_gpu is not None:
        try:
            return load_hardware(from_gpu)
        except ConfigError as exc:
            raise PolicyError(f"hardware.from_gpu: {exc}") from exc
    from retime.collectors.synth.hardware import match_hardware
    dev = trace.meta.get("devices") if isinstance(trace.meta, dict) else None
    text = str(dev).lower()
    best = match_hardware(text)  # the longest profile GPU name in the device names
    for n in hardware_names() if best is None else ():
        hw = load_hardware(n)
        if hw.name.replace("-", " ") in text:
            best = hw
    if best is not None or not isinstance(dev, dict):
        return best
    mem = [float(w.get("memory_bytes", 0)) for v in dev.values() if isinstance(v, dict)
           for w in v.values() if isinstance(w, dict)]
    gib = max(mem) / 2**30 if mem else 0.0
    tokens = set(re.split(r"[^a-z0-9]+", text))
    for fam in _FAMILIES:
        if fam in tokens:
            cands = [load_hardware(n) for n in hardware_names()
                     if load_hardware(n).name.startswith(fam)]
            if cands:
                return min(cands, key=lambda h: abs(h.memory_gib - gib))
    return None


def _gpu_ns(trace: Trace, mask: np.ndarray) -> float:
    return float(trace.ops["dur_ns"].to_numpy()[mask].sum())


def _prices(sk: ShapedKernels, g, calls: np.ndarray, dims: list | None = None,
            work: list | None = None) -> tuple[np.ndarray, list]:
    """Cost-layer time (us) of each call in ``calls`` on GPU spec ``g`` (NaN: no price),
    and per call its time per kernel role (``OpCost.parts``; empty when one kind)."""
    from retime.collectors.costs.ops import price_op
    out = np.full(len(calls), np.nan)
    parts: list = [()] * len(calls)
    for j, c in enumerate(calls.tolist()):
        d = sk.dims[c] if dims is None else dims[j]
        w = sk.work[c] if work is None else work[j]
        if w is None:
            continue
        try:
            pc = price_op(g, sk.names[c], d, sk.types[c], w, KERNEL_CURVES,
                          launches=int(sk.launches[c]),
                          kernels=None if sk.kernels is None else sk.kernels[c])
        except (RetimeError, ValueError, IndexError, ZeroDivisionError, TypeError):
            continue
        out[j], parts[j] = pc.time_us, pc.parts
    return out, parts


def _spread(sk: ShapedKernels, calls: np.ndarray, old: tuple, new: tuple,
            mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ratios new / old on the ops the calls own that ``mask`` keeps: per call, or per
    kernel role where both prices split the call by role (a convolution's GEMM kernels
    move with the compute ceiling, its layout copies with HBM, its launch floors not)."""
    from retime.collectors.costs.conv import kernel_role
    rc = np.full(len(sk.names), np.nan)
    rc[calls] = new[0] / old[0]
    r = rc[sk.call_of]
    if sk.kernels is not None:
        role_r: dict[int, dict] = {}
        for j, c in enumerate(calls.tolist()):
            po, pn = dict(old[1][j]), dict(new[1][j])
            if po and po.keys() == pn.keys():
                role_r[c] = {k: pn[k] / po[k] for k in po if po[k] > 0}
        if role_r:
            start = np.concatenate([[0], np.cumsum(sk.launches)])
            for c, rr in role_r.items():
                for i, kname in enumerate(sk.kernels[c]):
                    role = kernel_role(kname)
                    if role in rr:
                        r[start[c] + i] = rr[role]
    keep = np.isfinite(r) & (r > 0) & mask[sk.op_ids]
    ids = sk.op_ids[keep]
    ids, first = np.unique(ids, return_index=True)  # an op owned twice: the first call
    return ids, r[keep][first]


def gpu_ratio(trace: Trace, old_name: str, new_name: str,
              allow_tf32: bool | None = None,
              batch: tuple[int, int] | None = None) -> KernelRatio:
    """Model ratio new / old for every shaped kernel of ``trace`` (GPU ``old_name`` ->
    ``new_name``, built-in profile names). ``allow_tf32`` (``hardware.allow_tf32``, None:
    PyTorch's defaults, as :func:`collectors.costs.ops.op_cost` prices: float GEMMs FP32,
    float convolutions TF32) sets the math of FP32-operand calls on the new GPU. ``batch``
    ``(b, b2)``: both GPUs priced at the shapes of per-rank batch ``b2`` (``parallel.micro_batch``
    changed it first: :func:`scaled_dims`), so the swap's ratio is the one of the shapes that
    run, not of the recorded ones (a GEMM compute-bound at batch 512 can be memory-bound at
    12, where the GPUs differ by their HBM, not their FLOP/s)."""
    memo = trace_memo(trace)
    key = ("gpu_ratio", old_name, new_name, allow_tf32, batch)
    if key not in memo:  # a sweep asks the same swap of one trace many times
        memo[key] = _gpu_ratio(trace, old_name, new_name, allow_tf32, batch)
    return memo[key]


def _batch_shapes(sk: ShapedKernels, b: int, b2: int) -> tuple[list, list]:
    """(dims, work) of every shaped call at per-rank batch ``b2`` instead of ``b``."""
    from retime.collectors.costs.ops import op_cost
    weights = _weight_shapes(sk)
    tokens = token_rows(sk, b, weights)
    dims, work = [], []
    for c in range(len(sk.names)):
        d = scaled_dims(sk.names[c], sk.dims[c], b, b2, weights, tokens)
        try:
            w = op_cost(sk.names[c], d, sk.types[c], sk.concrete[c])
        except (RetimeError, ValueError, IndexError, ZeroDivisionError, TypeError):
            w = None
        dims.append(d)
        work.append(w)
    return dims, work


def _measured_math(kernels: list[str] | None) -> str | None:
    """``tf32`` / ``fp32``: the math mode every main (GEMM / convolution) kernel of a call
    shows in its name (:mod:`collectors.kernel_math`), None when they disagree or none
    tells."""
    if not kernels:
        return None
    from retime.collectors.costs.conv import kernel_role
    from retime.collectors.kernel_math import MathMode, math_mode
    seen = {math_mode(k) for k in kernels if kernel_role(k) == "main"}
    seen &= {MathMode.FP32, MathMode.TF32}
    if len(seen) != 1:
        return None
    return "tf32" if seen.pop() == MathMode.TF32 else "fp32"


def _tf32_work(sk: ShapedKernels, allow_tf32: bool | None, old_tf32: bool, new_tf32: bool,
               base: list | None = None) -> tuple[list | None, list | None, set]:
    """(per call ``work`` on the measured GPU, on the new one -- None when unchanged --, the
    kinds of shaped calls with FP32 operands). A call's FP32-operand GEMM / convolution runs
    on the measured GPU in the math its kernels' names show (``op_cost``'s dtype -- PyTorch's
    defaults -- where they do not tell or the GPU has no TF32 units); on a new GPU with TF32
    units in TF32 or FP32 as ``allow_tf32`` says, else as measured where the measured GPU had
    TF32 units, else by ``op_cost``'s defaults (:mod:`.math_modes`)."""
    from retime.collectors.costs.ops import op_class
    kinds = set()
    base = sk.work if base is None else base  # the work at other shapes (``gpu_ratio``'s batch)
    w_old, w_new = list(base), list(base)
    c_old = c_new = False
    for j, (w, name) in enumerate(zip(base, sk.names)):
        if w is None or w[2] not in ("fp32", "tf32"):
            continue
        c = op_class(name)
        if c not in ("gemm", "conv"):
            continue
        kinds.add(c)
        seen = _measured_math(None if sk.kernels is None else sk.kernels[j]) if old_tf32 \
            else None
        if seen is not None and seen != w[2]:
            w_old[j] = (w[0], w[1], seen)
            c_old = True
        if not new_tf32:  # no TF32 units PyTorch uses there: FP32 operands run FP32
            if w[2] == "tf32":  # (not at a TF32 peak the profile may list: MI300X's XF32)
                w_new[j] = (w[0], w[1], "fp32")
                c_new = True
            continue
        dt = ("tf32" if allow_tf32 else "fp32") if allow_tf32 is not None else (seen or w[2])
        if dt != w[2]:
            w_new[j] = (w[0], w[1], dt)
            c_new = True
    return (w_old if c_old else None), (w_new if c_new else None), kinds


def _gpu_ratio(trace: Trace, old_name: str, new_name: str,
               allow_tf32: bool | None = None,
               batch: tuple[int, int] | None = None) -> KernelRatio:
    from retime.collectors.costs.gpus import gpu_spec
    g_old, g_new = gpu_spec(old_name), gpu_spec(new_name)
    kind = trace.ops["kind"].to_numpy()
    dev = (kind == OpKind.KERNEL) | (kind == OpKind.MEMSET)
    sk = shaped_kernels(trace)
    notes: list[str] = []
    if sk is None:
        return KernelRatio(np.zeros(0, np.int64), np.zeros(0), {
            "calls": 0, "kernels": 0, "covered_ns": 0.0, "gpu_ns": _gpu_ns(trace, dev),
            "notes": notes})
    calls = np.arange(len(sk.names))
    from .math_modes import tf32_capable
    dims = work = None
    if batch is not None and batch[0] != batch[1]:
        dims, work = _batch_shapes(sk, *batch)
    work_old, work_new, fp32_calls = _tf32_work(sk, allow_tf32, tf32_capable(g_old),
                                                tf32_capable(g_new), work)
    old_p = _prices(sk, g_old, calls, dims, work_old if work_old is not None else work)
    new_p = _prices(sk, g_new, calls, dims, work_new if work_new is not None else work)
    old, new = old_p[0], new_p[0]
    dts = {w[2] for w in sk.work}
    for dt in sorted(dts):
        if dt not in g_new.hw.peak_tflops and dt not in ("fp16", "bf16"):
            alt = "fp32" if "fp32" in g_new.hw.peak_tflops else "bf16"
            notes.append(f"{g_new.name} has no {dt} units: the trace's {dt} kernels are "
                         f"priced at its {alt} rate there")
        if dt == "bf16" and "bf16" not in g_new.hw.peak_tflops:
            notes.append(f"{g_new.name} has no bf16 units: bf16 kernels priced at its fp16 "
                         "rate (emulated bf16 would be slower)")
    ids, ratio = _spread(sk, calls, old_p, new_p, dev)
    dur = trace.ops["dur_ns"].to_numpy()
    return KernelRatio(frozen(ids), frozen(ratio), {
        "calls": int(np.isfinite(new / old).sum()), "kernels": int(len(ids)),
        "covered_ns": float(dur[ids].sum()), "gpu_ns": _gpu_ns(trace, dev), "notes": notes,
        "model_ns_old": float(np.nansum(old) * 1e3), "model_ns_new": float(np.nansum(new) * 1e3),
        "fp32_calls": sorted(fp32_calls)})


def batch_ratio(trace: Trace, gpu_name: str, b: int, b2: int, mask: np.ndarray) -> KernelRatio:
    """Model ratio at per-rank batch ``b2`` over batch ``b`` for the shaped kernels in
    ``mask`` (batch dimensions of activations rewritten: :func:`scaled_dims`)."""
    from retime.collectors.costs.gpus import gpu_spec
    from retime.collectors.costs.ops import op_cost
    g = gpu_spec(gpu_name)
    sk = shaped_kernels(trace)
    dev = mask.copy()
    if sk is None:
        return KernelRatio(np.zeros(0, np.int64), np.zeros(0), {
            "calls": 0, "kernels": 0, "covered_ns": 0.0, "gpu_ns": _gpu_ns(trace, dev),
            "notes": []})
    owned = np.zeros(len(sk.names), bool)
    owned[sk.call_of[mask[sk.op_ids]]] = True
    calls = np.flatnonzero(owned)
    weights = _weight_shapes(sk)
    tokens = token_rows(sk, b, weights)
    dims2, work2 = [], []
    for c in calls.tolist():
        d = scaled_dims(sk.names[c], sk.dims[c], b, b2, weights, tokens)
        dims2.append(d)
        work2.append(op_cost(sk.names[c], d, sk.types[c], sk.concrete[c]))
    old_p = _prices(sk, g, calls)
    new_p = _prices(sk, g, calls, dims2, work2)
    old, new = old_p[0], new_p[0]
    ids, ratio = _spread(sk, calls, old_p, new_p, mask)
    dur = trace.ops["dur_ns"].to_numpy()
    return KernelRatio(ids, ratio, {
        "calls": int(np.isfinite(new / old).sum()), "kernels": int(len(ids)),
        "covered_ns": float(dur[ids].sum()), "gpu_ns": _gpu_ns(trace, dev), "notes": []})


# ---------------------------------------------------------------------------- batch dims
_CONV_FWD = {"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution",
             "miopen_convolution", "mkldnn_convolution"}


def _weight_shapes(sk: ShapedKernels) -> set:
    """Shapes of parameters (the weight operand of GEMM-like layers): tensors of these
    shapes are not batch-sized even when their first dimension equals the batch."""
    from retime.collectors.costs.ops import base_name
    out = set()
    for name, dims in zip(sk.names, sk.dims):
        b = base_name(name)
        ts = [d for d in dims if isinstance(d, list) and d]
        if (b in _CONV_FWD or b == "linear") and len(ts) > 1:
            out.add(tuple(ts[1]))
        elif b == "convolution_backward" and len(ts) > 2:
            out.add(tuple(ts[2]))
    return out


#: per-token ops whose activations are ``[b, s, ...]``: where the sequence length ``s`` is read
#: (not relu / silu: a convolution net's ``[b, c, h, w]`` would read its channels as ``s``)
_PER_TOKEN = {"native_layer_norm", "layer_norm", "linear", "gelu", "native_dropout", "dropout",
              "rms_norm", "_fused_rms_norm", "embedding"}


def token_rows(sk: ShapedKernels, b: int, weights: set) -> int | None:
    """The rows ``b * s`` of an activation whose batch is folded with its sequence.

    A transformer's per-token layers see ``[b, s, d]``, but its GEMMs run on the activation
    flattened to ``[b * s, d]`` (``linear`` on a 3-D input dispatches ``addmm`` / ``mm`` on
    the 2-D view; the backward's data and weight gradients, the loss's ``log_softmax`` and
    the bias gradients' ``sum`` likewise), so their rows are ``b * s``, not ``b``. ``s`` is
    the most common second dimension of the per-token ops' ``[b, s, d]`` inputs (exactly
    three dimensions; ``embedding``'s ``[b, s]`` indices); None when none shows it."""
    from retime.collectors.costs.ops import base_name
    seen: Counter = Counter()
    for name, dims in zip(sk.names, sk.dims):
        base = base_name(name)
        if base not in _PER_TOKEN:
            continue
        ts = [d for d in dims if isinstance(d, list) and d]
        if base == "embedding":
            ts = ts[1:2]
            ok = [t for t in ts if len(t) == 2 and t[0] == b]
        else:
            ok = [t for t in ts[:1] if len(t) == 3 and t[0] == b and tuple(t) not in weights]
        for t in ok:
            if t[1] > 1:
                seen[int(t[1])] += 1
    return b * seen.most_common(1)[0][0] if seen else None


def scaled_dims(name: str, dims: list, b: int, b2: int, weights: set,
                tokens: int | None = None) -> list:
    """``dims`` of an operator call at per-rank batch ``b2`` instead of ``b``: the leading
    (batch) dimension of its activations. Convolutions: the input (and, backward, the
    output gradient); ``linear``: its input; ``mm``/``addmm``: the rows of A when A has
    ``b`` rows, else the reduction when it is ``b`` deep on both sides (a weight gradient,
    ``X^T dY``); ``bmm``: the batch of matrices; streaming ops: every tensor of two or
    more dimensions led by ``b`` that is not a parameter (``weights``). ``tokens``
    (:func:`token_rows`, ``b * s``): a leading dimension (or, for a weight gradient, a
    reduction) of ``b * s`` rows is the batch folded with the sequence and becomes
    ``b2 * s``. A size equal to the batch (or to ``b * s``) by coincidence is scaled too
    (the recorded shapes do not say which is which)."""
    from retime.collectors.costs.ops import base_name
    base = base_name(name)
    new = [list(d) if isinstance(d, list) else d for d in dims]
    pos = [i for i, d in enumerate(new) if isinstance(d, list) and d]
    rows = {b: b2}
    if tokens and tokens != b and tokens % b == 0:
        rows[tokens] = tokens // b * b2

    def lead(i: int) -> None:
        if i < len(pos):
            d = new[pos[i]]
            if len(d) >= 2 and d[0] in rows:
                d[0] = rows[d[0]]

    if base in _CONV_FWD or base == "linear":
        lead(0)
    elif base == "convolution_backward":
        lead(0)
        lead(1)
    elif base in ("mm", "addmm", "bmm", "baddbmm"):
        off = 1 if base in ("addmm", "baddbmm") else 0
        if len(pos) < off + 2:
            return new
        a, c = new[pos[off]], new[pos[off + 1]]
        if base in ("bmm", "baddbmm"):
            if a[0] == b and c[0] == b:
                a[0] = c[0] = b2
        elif a[0] in rows:
            a[0] = rows[a[0]]
        elif len(a) > 1 and a[1] in rows and c[0] == a[1]:
            a[1] = c[0] = rows[a[1]]
    else:
        for i in pos:
            d = new[i]
            if len(d) >= 2 and d[0] in rows and tuple(d) not in weights:
                d[0] = rows[d[0]]
    return new


def describe_fallback(what: str, n_fallback: int, fallback_ns: float, gpu_ns: float,
                      rule: str, why: str = "") -> str | None:
    """The ``assumed:`` line for kernels the model could not price (None when none)."""
    if n_fallback <= 0:
        return None
    share = fallback_ns / gpu_ns if gpu_ns > 0 else 0.0
    return (f"{what}: {n_fallback} kernel(s) without a recorded shape ({share:.1%} of GPU "
            f"time) {rule}{why}")


def floor_scaled(dur_ns: np.ndarray, ratio, floor_old_us: float, floor_new_us: float
                 ) -> np.ndarray:
    """Measured kernel durations (ns) moved by ``ratio`` (a class or batch ratio, per op or
    one) with the launch floor held apart, as the cost layer prices a kernel: its floor (the
    GPU profile's ``kernel_overhead_us``: launch, ramp-up and tail on the GPU timeline;
    ``collectors.costs.kernels._finish``) plus the work above it. The work scales by
    ``ratio``, the floor becomes the new GPU's (unchanged for a batch change). A kernel
    measured at or below the old floor is all floor (its work, if any, hides under it): it
    moves by ``floor_new / floor_old``. Without this a flat ratio takes a launch-bound
    kernel below any GPU's floor (V100 -> MI300X: x0.17 by HBM for a 3 us kernel, while the
    cost layer prices the same kernels x1.33 by the MI300X's longer floor)."""
    d = np.asarray(dur_ns, np.float64)
    fo, fn = floor_old_us * 1e3, floor_new_us * 1e3
    if fo <= 0 or fn <= 0:
        return d * ratio
    above = d - fo
    return np.where(above > 0, fn + above * ratio, d * (fn / fo))


def summary(kr: KernelRatio) -> dict[str, Any]:
    """Plain figures of a :class:`KernelRatio` for ``meta['scenario']``."""
    i = kr.info
    w = np.asarray(kr.ratio, float)
    return {"shaped_calls": i["calls"], "shaped_kernels": i["kernels"],
            "shaped_share": round(i["covered_ns"] / i["gpu_ns"], 4) if i["gpu_ns"] else 0.0,
            "ratio_median": round(float(np.median(w)), 4) if len(w) else None,
            "ratio_min": round(float(w.min()), 4) if len(w) else None,
            "ratio_max": round(float(w.max()), 4) if len(w) else None}


def kernel_intensity(trace: Trace, gpu) -> tuple[np.ndarray, np.ndarray, int]:
    """Per op (op-id order): the FLOPs per HBM byte of the call that launched it (NaN where
    the trace records no shapes for it) and the ridge point of ``gpu`` (a GpuSpec) for the
    call's dtype (published matmul ceiling / HBM triad bandwidth: K1-K4); and how many
    calls were shaped. A call's kernels share its intensity (its layout copies and launch
    floors ride with its GEMM: one figure per call)."""
    n = len(trace.ops)
    ai = np.full(n, np.nan)
    ridge = np.zeros(n)
    sk = shaped_kernels(trace)
    if sk is None or gpu is None:
        return ai, ridge, 0
    from retime.collectors.costs.ops import _gpu_dtype

    bw = gpu.hbm_gbps()[0] * 1e9
    per_call_ai = np.array([f / b if b > 0 else np.nan for f, b, _d in sk.work])
    per_call_r = np.zeros(len(sk.work))
    for i, (_f, _b, d) in enumerate(sk.work):
        try:
            per_call_r[i] = gpu.mamf(_gpu_dtype(gpu, d))[0] * 1e12 / bw
        except ConfigError:  # a dtype without a peak on this GPU: unknown
            per_call_ai[i] = np.nan
    ai[sk.op_ids] = per_call_ai[sk.call_of]
    ridge[sk.op_ids] = per_call_r[sk.call_of]
    return ai, ridge, len(sk.work)


def twin_ratios(trace: Trace, kr: KernelRatio, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(op ids, ratios) of the kernels in ``cand`` (a boolean mask: GEMM kernels no shaped
    call owns) that share their kernel name with kernels the cost layer priced (``kr``):
    each at the duration-weighted mean ratio of its shaped namesakes. The same kernel (the
    same library, tile and layout, e.g. a step whose operators ran before the profiler
    recorded them) moves as the cost layer moves its shaped runs, not by the datasheet ratio
    of its math mode; a kernel without a shaped namesake keeps that ratio."""
    if not len(kr.op_ids) or not cand.any():
        return np.zeros(0, np.int64), np.zeros(0)
    nid = trace.ops["name_id"].to_numpy()
    dur = trace.ops["dur_ns"].to_numpy().astype(float)
    w = dur[kr.op_ids]
    names, inv = np.unique(nid[kr.op_ids], return_inverse=True)
    tot = np.bincount(inv, weights=w, minlength=len(names))
    acc = np.bincount(inv, weights=w * kr.ratio, minlength=len(names))
    ok = tot > 0
    names, mean = names[ok], acc[ok] / tot[ok]
    ids = np.flatnonzero(cand)
    pos = np.searchsorted(names, nid[ids])
    pos = np.minimum(pos, max(len(names) - 1, 0))
    hit = (len(names) > 0) & (names[pos] == nid[ids]) if len(names) else np.zeros(len(ids), bool)
    return ids[hit].astype(np.int64), mean[pos[hit]]
