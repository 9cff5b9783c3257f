"""Hardware what-ifs: speed kernel classes up or down, or swap the GPU through the roofline.

Kernel classes (see :func:`kernel_class`), from the one table of
:mod:`collectors.kernel_classes` that analysis uses too: ``gemm`` (matrix multiplies and
convolutions: cuBLAS/CUTLASS/hipBLASLt/Triton GEMMs, implicit-GEMM convs, linear layers),
``attention`` (flash/fused attention, attention scores/softmax/context), ``elementwise``
(every memory-bound class: pointwise, norms, reductions, layout changes, pooling,
embeddings, optimizer steps), ``memcpy`` (memcpy/memset), ``comm`` (collectives and p2p;
their *transfer* time is scaled, waiting for late ranks is re-derived by the replay),
``other`` (host ops) and ``unclassified`` (device ops whose name the table does not know:
``compute_speedup`` applies to them, no class-specific factor; the GPU swap re-times them
by the HBM ratio, the usual bound of an unrecognised fused kernel).

``gpu`` swaps the GPU profile: on a synthesized trace the run is re-synthesized on the new
profile (roofline with its peaks, HBM bandwidth, links). On a measured trace each kernel
launched by an operator with recorded shapes is re-timed as measured x model(new) /
model(old) by the cost layer (:mod:`.kernel_cost`); the others by the flat roofline ratio of
the two GPUs: GEMM and convolution kernels by the ratio of the dense peaks of their own math
mode, read from the kernel name (FP32 SIMT, TF32, 16-bit, FP8: :mod:`.math_modes`; split-K
and epilogue helpers by HBM), attention kernels and GEMMs whose mode the name does not tell
by the ratio of dense 16-bit tensor peaks, the other kernels by the ratio of HBM bandwidth,
each ratio on the kernel's time above its launch floor (the profiles' ``kernel_overhead_us``:
the floor becomes the new GPU's, as the cost layer prices a kernel;
:func:`.kernel_cost.floor_scaled`); every kernel with ``kernel_pricing = "flat"`` (the
range's other end) takes its plain ratio.
``allow_tf32`` says whether FP32 GEMMs/convolutions run on TF32 tensor cores on the target
(unset: as the trace shows, else PyTorch's defaults, bounded). Host ops never change;
a trace without GPU kernels is refused; the measured GPU must be recognisable from
``meta["devices"]`` (else PolicyError: give ``hardware.from_gpu``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from retime.collectors.enums import EdgeKind, OpKind
from retime.collectors.errors import ConfigError, PolicyError
from retime.collectors.kernel_classes import KernelClass, op_classes
from retime.collectors.trace import Trace

from .base import (
    Policy,
    WhatIfState,
    check_choice,
    check_positive,
    frozen,
    layout_of,
    trace_memo,
)

__all__ = ["Hardware", "kernel_class", "CLASSES"]

#: how measured kernels are re-timed by hardware.gpu and parallel.micro_batch: from their
#: recorded shapes through the cost layer (default), or by the flat rule (class ratio of
#: peaks; linear in the batch) -- the other end of the what-if's range
PRICINGS = ("shapes", "flat")

CLASSES = ("gemm", "attention", "elementwise", "memcpy", "comm", "other", "unclassified")

# the what-if class of each class of the one kernel table (collectors.kernel_classes):
# convolutions are implicit GEMMs (tensor cores, FLOP-bound); every memory-bound class is
# "elementwise" (re-timed by HBM bandwidth); names no rule knows stay "unclassified"
_OF_TABLE = np.full(len(KernelClass), 2, np.int8)
_OF_TABLE[KernelClass.GEMM] = _OF_TABLE[KernelClass.CONV] = 0
_OF_TABLE[KernelClass.ATTENTION] = 1
_OF_TABLE[KernelClass.MEMORY] = 3
_OF_TABLE[KernelClass.COMMUNICATION] = 4
_OF_TABLE[KernelClass.OTHER] = 6


def kernel_class(trace: Trace) -> np.ndarray:
    """Class index (into :data:`CLASSES`) of every op of ``trace``, from the kernel-class
    table of :mod:`collectors.kernel_classes` (host ops: ``other``)."""
    o = trace.ops
    kind = o["kind"].to_numpy()
    cls = _OF_TABLE[op_classes(kind, o["name_id"].to_numpy(), trace.strings)]
    cls[(kind == OpKind.CPU_OP) | (kind == OpKind.RUNTIME) | (kind == OpKind.SYNC)] = 5
    return cls


@dataclass(frozen=True)
class Hardware(Policy):
    """Kernel-class speedups (factors > 1 are faster) and GPU swap.

    ``compute_speedup`` applies to every compute class (gemm, attention, elementwise) and
    multiplies with the class-specific factors. ``slow_ranks`` with ``rank_slowdown``
    injects a slower GPU: those ranks' compute and memcpy take ``rank_slowdown`` times as
    long (the same as ``stragglers.slow_ranks`` / ``stragglers.slowdown``). ``host_speedup``
    makes the host (CPU) faster: host ops, the gaps between them and their unexplained
    delays shrink by that factor (for host-bound traces).
    """

    compute_speedup: float | None = None
    gemm_speedup: float | None = None
    attention_speedup: float | None = None
    elementwise_speedup: float | None = None
    memcpy_speedup: float | None = None
    comm_speedup: float | None = None
    gpu: str | None = None
    from_gpu: str | None = None
    kernel_pricing: str | None = None
    allow_tf32: bool | None = None
    slow_ranks: tuple[int, ...] | None = None
    rank_slowdown: float | None = None
    host_speedup: float | None = None
    # CUDA graphs (replay/policies/graphs.py)
    cuda_graphs: str | bool | None = None
    graph_launch_us: float | None = None
    graph_node_us: float | None = None
    table: ClassVar[str] = "hardware"

    @classmethod
    def columns_for(cls, fields: frozenset[str]) -> tuple[str, ...] | None:
        """Re-pricing by kernel class or GPU profile reads names, kinds, times and the
        collectives' (:data:`replay.footprint.WHATIF_COLUMNS`) and the ops' flops; slow
        ranks (kinds and ranks) and host speed (kinds and the graph's host gaps) read
        nothing more; CUDA graphs add the ops' phase (forward/backward regions, captured
        kernels). ``kernel_pricing`` and ``allow_tf32`` are not audited (every column)."""
        reprice = {"compute_speedup", "gemm_speedup", "attention_speedup",
                   "elementwise_speedup", "memcpy_speedup", "comm_speedup", "gpu", "from_gpu"}
        graphs = {"cuda_graphs", "graph_launch_us", "graph_node_us"}
        if not fields <= reprice | graphs | {"slow_ranks", "rank_slowdown", "host_speedup"}:
            return None
        return (("phase",) if fields & graphs else ()) + (("flops",) if fields & reprice else ())

    @classmethod
    def synth_columns_for(cls, fields: frozenset[str]) -> tuple[str, ...] | None:
        """The same columns on a synthesized store (the same code reads them)."""
        return cls.columns_for(fields)

    def __post_init__(self) -> None:
        for f in ("compute_speedup", "gemm_speedup", "attention_speedup",
                  "elementwise_speedup", "memcpy_speedup", "comm_speedup", "host_speedup"):
            check_positive("hardware", f, getattr(self, f))
        check_choice("hardware", "kernel_pricing", self.kernel_pricing, PRICINGS)
        if self.allow_tf32 is not None and not isinstance(self.allow_tf32, bool):
            raise PolicyError(f"hardware.allow_tf32={self.allow_tf32!r} must be true or false "
                              "(PyTorch's torch.backends.cuda.matmul.allow_tf32 and "
                              "torch.backends.cudnn.allow_tf32 on the target GPU)")
        for f in ("gpu", "from_gpu"):
            v = getattr(self, f)
            if v is not None:
                if not isinstance(v, str):
                    raise PolicyError(f"hardware.{f}={v!r} must be a profile name")
                _profile(v, f)  # fail early on an unknown profile
        if self.slow_ranks is not None or self.rank_slowdown is not None:
            from .stragglers import Stragglers
            s = Stragglers(slow_ranks=self.slow_ranks, slowdown=self.rank_slowdown)
            object.__setattr__(self, "slow_ranks", s.slow_ranks)
        _check_graphs(self)

    def factors(self) -> np.ndarray:
        """Duration multiplier per class (1 / speedup)."""
        c = self.compute_speedup or 1.0
        sp = [c * (self.gemm_speedup or 1.0), c * (self.attention_speedup or 1.0),
              c * (self.elementwise_speedup or 1.0), self.memcpy_speedup or 1.0,
              self.comm_speedup or 1.0, 1.0, c]
        return 1.0 / np.asarray(sp)

    def configure(self, state: WhatIfState) -> None:
        if self.allow_tf32 is not None and (state.is_synth or self.gpu is None):
            raise PolicyError(
                f"hardware.allow_tf32={str(self.allow_tf32).lower()} "
                + ("on a synthesized run: its math is its --dtype (re-synthesize with "
                   "another --dtype)" if state.is_synth else "needs hardware.gpu: it says "
                   "how the measured FP32 GEMMs/convolutions run on the target GPU (give "
                   "hardware.gpu = the trace's own GPU to change the math alone)"))
        if self.kernel_pricing is not None:
            state.notes["kernel_pricing"] = self.kernel_pricing  # parallel.micro_batch reads it
        if self.gpu is not None and not state.is_synth and state.notes.get("tp", 1) > 1:
            # parallel configures first: its split GEMMs and TP all-reduces are priced on the
            # trace's own GPU and fabric (tp_measured.py)
            raise PolicyError(f"hardware.gpu={self.gpu} with parallel.tp={state.notes['tp']} "
                              "on a measured trace: the TP split is priced on the trace's own "
                              "GPU and NVLink; change one of them per what-if")
        if self.gpu is not None and state.is_synth:
            new = _profile(self.gpu, "gpu")
            # keep the run's network and node shape: only the GPU changes
            old = state.synth.hardware
            import dataclasses as dc
            hw = dc.replace(new, intra=old.intra, inter=old.inter, cross_dc=old.cross_dc,
                            gpus_per_node=old.gpus_per_node, nics=old.nics,
                            nic_gbps=old.nic_gbps, nodes_per_dc=old.nodes_per_dc,
                            dc_km=old.dc_km, nvlink_domain=old.nvlink_domain)
            state.synth.set_hardware(hw)

    def apply(self, state: WhatIfState) -> None:
        memo = trace_memo(state.trace)
        cls = memo.get("kernel_class")
        if cls is None:  # a per-trace constant: computed once per trace
            cls = memo["kernel_class"] = frozen(kernel_class(state.trace))
        f = self.factors()
        if self.gpu is not None and not state.is_synth:
            swap = _gpu_swap(self, state, cls, f)
        else:
            state.scale_by_class(cls, f)  # deferred: fused into the layout durations
            swap = None
        if self.host_speedup:
            scale_host_work(state, 1.0 / self.host_speedup)
        if self.slow_ranks:
            from .stragglers import inject_slowdown
            inject_slowdown(state, self.slow_ranks, self.rank_slowdown)
        d = self.describe()
        if swap is not None:
            d["gpu_effect"] = swap
        if self.cuda_graphs:
            d["cuda_graphs_effect"] = _apply_graphs(self, state)
        state.applied.append(d)


# ---------------------------------------------------------------------------- CUDA graphs
def _check_graphs(h: Hardware) -> None:
    from .graphs import check_graph_mode
    mode = check_graph_mode(h.cuda_graphs)
    given = h.cuda_graphs is not None
    # an explicit false stays False (a sweep's "off" row; graph_*_us then have no effect)
    object.__setattr__(h, "cuda_graphs", mode if mode is not None or not given else False)
    check_positive("hardware", "graph_launch_us", h.graph_launch_us, strict=False)
    check_positive("hardware", "graph_node_us", h.graph_node_us, strict=False)
    if not given and (h.graph_launch_us is not None or h.graph_node_us is not None):
        raise PolicyError("hardware.graph_launch_us / graph_node_us need "
                          "hardware.cuda_graphs (\"step\" or \"forward_backward\")")


def _apply_graphs(h: Hardware, state: WhatIfState) -> dict:
    from .graphs import DEFAULT_GRAPH_LAUNCH_US, DEFAULT_GRAPH_NODE_US, apply_cuda_graphs
    launch = DEFAULT_GRAPH_LAUNCH_US if h.graph_launch_us is None else h.graph_launch_us
    node = DEFAULT_GRAPH_NODE_US if h.graph_node_us is None else h.graph_node_us
    return apply_cuda_graphs(state, h.cuda_graphs, launch, node)


def scale_host_work(state: WhatIfState, factor, fixed_ns=0.0, gap_fixed_ns=None) -> None:
    """Host (CPU) work takes ``factor`` times as long (a scalar, or one factor per op in
    op-id order: per rank): host ops (operators, runtime calls), the measured gaps before
    them (HOST_ORDER lags: framework and Python time between traced ops; gaps classified as
    waiting are 0 already, replay/gaps.py) and their unexplained delays. Blocking calls keep
    waiting for the GPU (only their own part changes); GPU work and CPU collectives (gloo:
    mostly waiting on the link) are unchanged. ``hardware.host_speedup = s`` is ``1 / s``.
    ``fixed_ns`` (scalar or per op): a part of each op and gap that does not scale (a
    framework's per-op dispatch): ``t -> fixed + (t - fixed) * factor`` where ``t > fixed``;
    ``gap_fixed_ns`` (per op, default ``fixed_ns``): that part for the gap before each op."""
    kind = state.kinds()
    host = (kind == OpKind.CPU_OP) | (kind == OpKind.RUNTIME)
    f_op = np.broadcast_to(np.asarray(factor, np.float64), host.shape)
    x_op = np.broadcast_to(np.asarray(fixed_ns, np.float64), host.shape)

    def sc(v, f, x):
        return np.where(v > x, x + (v - x) * f, v)

    d = state.dur
    d[host] = sc(d[host], f_op[host], x_op[host])
    g = state.graph
    f_pos = layout_of(g, f_op)
    x_pos = layout_of(g, x_op if gap_fixed_ns is None else
                      np.broadcast_to(np.asarray(gap_fixed_ns, np.float64), host.shape))
    lag = g.pred_lag_ns.copy()
    ho = (g.pred_kind == EdgeKind.HOST_ORDER) & (lag > 0)
    dst = np.repeat(np.arange(g.n_ops), np.diff(g.pred_ptr))
    lag[ho] = np.rint(sc(lag[ho], f_pos[dst[ho]], x_pos[dst[ho]])).astype(lag.dtype)
    delay = g.delay_ns.copy()
    hpos = layout_of(g, host)
    delay[hpos] = np.rint(delay[hpos] * f_pos[hpos]).astype(delay.dtype)
    state.graph = dataclasses.replace(g, pred_lag_ns=lag, delay_ns=delay)


def _profile(name: str, field: str):
    from retime.collectors.synth import load_hardware
    try:
        return load_hardware(name)
    except ConfigError as exc:
        raise PolicyError(f"hardware.{field}: {exc}") from exc


def _roofline_ratio(trace: Trace, gpu: str, from_gpu: str | None):
    """(duration multiplier per class when moving the measured kernels to ``gpu`` by the
    flat ratio of peaks, the two profiles)."""
    from .kernel_cost import trace_gpu
    new = _profile(gpu, "gpu")
    old = trace_gpu(trace, from_gpu)
    if old is None:
        dev = str(trace.meta.get("devices", "")) if isinstance(trace.meta, dict) else ""
        raise PolicyError(
            "hardware.gpu on a measured trace needs the measured GPU: meta['devices'] "
            f"({'names no built-in profile' if dev else 'not recorded'}); set "
            "hardware.from_gpu (e.g. 'a100-80gb')")
    dtype = "bf16" if "bf16" in old.peak_tflops and "bf16" in new.peak_tflops else "fp16"
    flops = old.peak_flops(dtype) / new.peak_flops(dtype)
    hbm = old.hbm_gbps / new.hbm_gbps
    return np.asarray([flops, flops, hbm, hbm, 1.0, 1.0, hbm]), old, new, dtype


def _gpu_swap(h: Hardware, state: WhatIfState, cls: np.ndarray, f: np.ndarray) -> dict:
    """``hardware.gpu`` on a measured trace: shaped kernels re-priced by the cost layer
    (:mod:`.kernel_cost`), the rest by the flat class ratio; host work unchanged."""
    from .kernel_cost import describe_fallback, gpu_ratio, summary
    t = state.trace
    kind = state.kinds()
    dev = (kind == OpKind.KERNEL) | (kind == OpKind.MEMSET)
    if not (dev | (kind == OpKind.MEMCPY) | (kind == OpKind.COMPUTE)).any():
        raise PolicyError(f"hardware.gpu={h.gpu!r}: the trace has no GPU kernels (a CPU-only "
                          "run); nothing runs on a GPU to re-time (hardware.host_speedup "
                          "changes the host)")
    flat, old, new, dt = _roofline_ratio(t, h.gpu, h.from_gpu)
    before = state.dur.copy() if h.kernel_pricing != "flat" else None
    state.scale_by_class(cls, f * flat)
    if h.kernel_pricing == "flat":
        state.assume(f"hardware.gpu {old.name} -> {new.name}: every kernel scaled by the flat "
                     f"class ratio (hardware.kernel_pricing = \"flat\"): GEMM/conv by their "
                     f"math mode's peaks, attention x{flat[0]:.2f} ({dt} peaks), others "
                     f"x{flat[2]:.2f} (HBM)", bounded=True)
        modes = _price_by_mode(h, state, cls, flat, old.name, new.name, None, set())
        return {"from": old.name, "to": new.name, "pricing": "flat", **modes}
    # parallel.micro_batch (applied first) changed the shapes: price the swap at them
    kr = gpu_ratio(t, old.name, new.name, h.allow_tf32, state.notes.get("batch_dims"))
    if len(kr.op_ids):
        d = state.dur
        d[kr.op_ids] *= kr.ratio / flat[cls[kr.op_ids]]
    modes = _price_by_mode(h, state, cls, flat, old.name, new.name, kr.op_ids,
                           set(kr.info.get("fp32_calls", ())))
    twins = _price_twins(state, cls, kr, before, f)
    n_floor = _hold_floors(state, cls, dev, kr.op_ids, before, old, new)
    i = kr.info
    sm = summary(kr)
    dur = t.ops["dur_ns"].to_numpy()
    n_fb = int(dev.sum()) - len(kr.op_ids)
    fb_ns = float(dur[dev].sum()) - i["covered_ns"]
    # the range: the same what-if with every kernel at the flat ratio (the rule of thumb the
    # per-kernel model refines) bounds what the model's per-kernel curves decide
    bounds = [{"hardware.kernel_pricing": "flat"}] if len(kr.op_ids) else None
    if len(kr.op_ids):
        state.assume(
            f"hardware.gpu {old.name} -> {new.name}: {len(kr.op_ids)} kernel(s) of "
            f"{i['calls']} operator call(s) with recorded shapes ({sm['shaped_share']:.1%} of "
            "GPU time) re-timed as measured x model(new) / model(old) (cost layer: roofline "
            "x efficiency by class and size, published ceilings, fitted curves; median "
            f"ratio {sm['ratio_median']:.2f}, {sm['ratio_min']:.2f}-{sm['ratio_max']:.2f}); "
            "the range reaches the flat class ratio", bounds=bounds)
    why = "" if len(kr.op_ids) else (
        " (the trace holds no operator shapes: record with torch.profiler("
        "record_shapes=True) for per-kernel pricing)")
    if not dev.any():  # op-level compute (Megatron timers): no kernels, the flat ratio
        dev = kind == OpKind.COMPUTE
        n_fb = int(dev.sum())
        fb_ns = float(dur[dev].sum())
    by_mode = "GEMM/conv by their math mode (below), attention" if modes.get("mode_priced") \
        else "GEMM/attention"
    line = describe_fallback(
        "hardware.gpu", n_fb, fb_ns, float(dur[dev].sum()),
        f"scaled by the flat class ratio: {by_mode} x{flat[0]:.2f} ({dt} peak "
        f"{old.peak_tflops.get(dt, 0):g} -> {new.peak_tflops.get(dt, 0):g} TFLOP/s), others "
        f"x{flat[2]:.2f} (HBM {old.hbm_gbps:g} -> {new.hbm_gbps:g} GB/s)"
        + (f", above their launch floor, which becomes the new GPU's "
           f"({old.kernel_overhead_us:g} -> {new.kernel_overhead_us:g} us, as the cost layer "
           f"prices a kernel; {n_floor} kernel(s) at or below the old floor move by the "
           f"floors' ratio)" if dev.any() and n_floor >= 0 else ""), why)
    if line:
        state.assume(line)
    for line in modes.pop("lines", []):
        state.assume(line)
    if twins[0]:
        state.assume(f"hardware.gpu: {twins[0]} of those GEMM kernels ({twins[1]:.1%} of GPU "
                     "time) share their kernel name with shaped ones: re-timed at their shaped "
                     "namesakes' cost-layer ratio instead (duration-weighted mean; median "
                     f"x{twins[2]:.2f})")
    tf = modes.pop("tf32_line", None)
    if tf is not None:
        state.assume(tf[0], bounded=True, bounds=tf[1] or None)
    for note in i["notes"]:
        state.assume(f"hardware.gpu: {note}")
    state.assume("hardware.gpu: host (CPU) ops, launch calls and the gaps between them keep "
                 "their measured times (a GPU change does not move the host); collectives "
                 "keep their measured transfer times (network.* keys change the links)"
                 + profiler_note(state.trace), bounded=True)
    return {"from": old.name, "to": new.name, **sm, "fallback_kernels": n_fb,
            "fallback_share": round(fb_ns / float(dur[dev].sum()), 4), **modes}


def _price_twins(state: WhatIfState, cls: np.ndarray, kr, before: np.ndarray,
                 f: np.ndarray) -> tuple[int, float, float]:
    """GEMM kernels without a recorded shape whose kernel name a shaped call's kernel has
    (:func:`kernel_cost.twin_ratios`): re-timed at that ratio (times the class factor
    ``f``) instead of their math mode's datasheet ratio. Returns (kernels, share of GPU
    time, median ratio)."""
    from .kernel_cost import twin_ratios
    kind = state.kinds()
    cand = (kind == OpKind.KERNEL) & (cls == 0)
    cand[kr.op_ids] = False
    ids, r = twin_ratios(state.trace, kr, cand)
    if not len(ids):
        return 0, 0.0, 1.0
    state.dur[ids] = before[ids] * f[cls[ids]] * r
    dur = state.trace.ops["dur_ns"].to_numpy()
    gpu = float(dur[(kind == OpKind.KERNEL) | (kind == OpKind.MEMSET)].sum())
    return int(len(ids)), float(dur[ids].sum()) / max(gpu, 1.0), float(np.median(r))


def profiler_note(trace) -> str:
    """``; ...`` naming the profiler features the trace shows were on while it was recorded
    (``profile_memory``: its memory events; ``with_stack``: Python-function ranges,
    ``file.py(line): func``), whose per-event bookkeeping ran on the host and is in the
    measured host times an unprofiled run does not pay (the h100-vgg13 trace was recorded
    with both and an execution-trace observer); empty when none."""
    o = trace.memory
    mem = 0 if o is None else len(o)
    r = trace.ranges
    py = 0
    if r is not None and len(r):
        ids, counts = np.unique(r["name_id"].to_numpy(), return_counts=True)
        py = int(sum(c for i, c in zip(ids.tolist(), counts.tolist())
                     if _PYFRAME.search(str(trace.strings[i]))))
    parts = ([f"profile_memory ({mem} memory events)"] if mem else []) + \
        ([f"with_stack ({py} Python-function ranges)"] if py else [])
    if not parts:
        return ""
    return (f"; the trace was recorded with torch.profiler's {' and '.join(parts)} on: its "
            "host times include the profiler's per-event bookkeeping, which an unprofiled run "
            "does not pay, so where the host bounds the new step it is an upper bound")


_PYFRAME = re.compile(r"\.py\(\d+\): ")


def _hold_floors(state: WhatIfState, cls: np.ndarray, dev: np.ndarray, shaped: np.ndarray,
                 before: np.ndarray | None, old, new) -> int:
    """Kernels the cost layer did not price (no recorded shape): the ratio they were given
    (class or math-mode ratio, ``state.dur`` over ``before``) applies to their work above
    the launch floor only, the floor becomes the new GPU's (:func:`kernel_cost.floor_scaled`).
    Collectives, copies and host ops keep what they were given. Returns how many of them
    sat at or below the old floor (-1: nothing done)."""
    from .kernel_cost import floor_scaled
    if before is None or not dev.any():
        return -1
    ids = dev & np.isin(cls, (0, 1, 2, 6))  # gemm, attention, elementwise, unclassified
    if len(shaped):
        ids[shaped] = False
    ids = np.flatnonzero(ids)
    d = state.dur
    b = before[ids]
    ok = b > 0
    ids, b = ids[ok], b[ok]
    d[ids] = floor_scaled(b, d[ids] / b, old.kernel_overhead_us, new.kernel_overhead_us)
    return int((b <= old.kernel_overhead_us * 1e3).sum())


def _price_by_mode(h: Hardware, state: WhatIfState, cls: np.ndarray, flat: np.ndarray,
                   old: str, new: str, shaped: np.ndarray | None, shaped_fp32: set) -> dict:
    """GEMM/conv kernels no shaped call owns, re-timed by the ratio of their math mode's
    peaks (:mod:`.math_modes`; ``state.dur`` holds them at the flat ratio ``flat[0]``).
    Returns the figures for ``meta['scenario']`` with the ``assumed:`` lines under
    ``lines`` / ``tf32_line`` (the caller prints them after its own; in the flat pricing
    they are printed here). ``shaped_fp32``: kinds (``gemm`` / ``conv``) of the shaped calls
    with FP32 operands (``hardware.allow_tf32`` decides their math on the target too)."""
    from retime.collectors.costs.gpus import gpu_spec

    from .math_modes import describe, describe_tf32, mode_ratios, tf32_capable
    t = state.trace
    kind = state.kinds()
    cand = (kind == OpKind.KERNEL) & (cls == 0)
    if shaped is not None and len(shaped):
        cand[shaped] = False
    memo = trace_memo(t)
    kc = memo.get("op_classes")
    if kc is None:
        o = t.ops
        kc = memo["op_classes"] = frozen(op_classes(kind, o["name_id"].to_numpy(), t.strings))
    mr = mode_ratios(t, cand, kc == KernelClass.CONV, old, new, h.allow_tf32, float(flat[2]))
    if len(mr.op_ids):
        d = state.dur
        d[mr.op_ids] *= mr.ratio / flat[0]
    dur = t.ops["dur_ns"].to_numpy()
    gpu_ns = float(dur[(kind == OpKind.KERNEL) | (kind == OpKind.MEMSET)].sum())
    info = dict(mr.info)
    if shaped_fp32:  # shaped calls: the trace shows the setting where the GPU had TF32
        if h.allow_tf32 is None and not tf32_capable(gpu_spec(old)) \
                and tf32_capable(gpu_spec(new)):
            info["defaulted"] = sorted(set(info["defaulted"]) | shaped_fp32)
        info["rows"] = list(info["rows"]) + [("fp32", "fp32", 0, 0.0, 1.0, "", "", "")]
    lines = describe(mr, gpu_ns, "hardware.gpu")
    tf = describe_tf32(h.allow_tf32, info, "hardware.gpu")
    out = {"mode_priced": int(len(mr.op_ids)),
           "mode_priced_share": round(float(dur[mr.op_ids].sum()) / max(gpu_ns, 1.0), 4),
           "modes": [{"from": r[0], "to": r[1], "kernels": r[2],
                      "share": round(r[3] / max(gpu_ns, 1.0), 4), "ratio": round(r[4], 4),
                      "kind": r[6] if len(r) > 6 else "helper",
                      "decided_by": r[7] if len(r) > 7 else "name"}
                     for r in mr.info["rows"]]}
    if h.kernel_pricing == "flat":
        for line in lines:
            state.assume(line)
        if tf[0] is not None:
            state.assume(tf[0], bounded=True, bounds=tf[1] or None)
        return out
    out["lines"] = lines
    if tf[0] is not None:
        out["tf32_line"] = tf
    return out
