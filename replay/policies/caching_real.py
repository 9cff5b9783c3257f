"""Caching what-ifs on measured (ingested) traces: what each trace format can support.

:class:`~replay.policies.caching.Cache` calls :func:`configure_measured` /
:func:`apply_measured` when the trace is not synthesized. What is modeled, per format:

* **Op-level timelines** (Megatron timers, ``meta["source_format"] == "oplevel"``, measured
  or re-laid out by ``parallel.*``): one ``forward-compute`` / ``backward-compute`` op per
  (rank, step, micro-batch, model chunk). ``cache.recompute=full`` precedes every
  backward-compute by a re-run of *its own* forward (the forward op of the same rank, step,
  micro-batch and chunk, at its measured — or policy-modified — duration): Megatron times
  the recompute inside its backward timer, so the backward op grows by that forward. The
  engine replays the pipeline's dependencies, so the extra time propagates through the
  schedule (with uniform ``F`` per virtual stage, a 1F1B / GPipe step grows by
  ``(m + p - 1) * F``, an interleaved one by ``(m * v + p - 1) * F`` per chunk).
  Whether the trace already recomputes is not recorded; it is inferred from the median
  backward / forward ratio of the matched pairs (about 2 without recompute: a backward does
  twice a forward's FLOPs; about 3 with full recompute), threshold 2.5. ``full`` on a trace
  that already recomputes and ``none`` on one that does not change nothing (said in the
  result); ``none`` on a recomputing trace subtracts the forward from each backward.
  ``selective`` needs the attention-core share of a forward, which an op-level trace does
  not have (PolicyError). Memory: the trace has no tensor sizes, so the activation memory
  change is reported as unknown.
* **Kineto traces** of a model with non-reentrant activation checkpointing
  (``torch.utils.checkpoint``, recorded with ``with_stack=True``, so the Python frames
  ``torch/utils/checkpoint.py(N): recompute_fn`` / ``pack_hook`` / ``unpack_hook`` are in
  the trace's ranges): ``cache.recompute=none`` removes what checkpointing added: the host
  time inside the checkpoint's saved-tensor hooks (``unpack_hook`` spans, which hold the
  ``recompute_fn`` re-running the segment's forward, and the forward ``pack_hook`` spans),
  and the GPU kernels / copies launched from them. Removed ops keep their dependencies with
  zero duration, lag and delay, and the measured gaps between host ops lose the part that
  lay inside a removed span, so the rest of the thread runs that much earlier where the host
  bounds the step; the engine replays the GPU streams and collectives, so the step shrinks
  by at most the removed host span plus the removed GPU time. Memory: the activations that
  checkpointing freed are estimated from ``[memory]`` events when the trace has them;
  otherwise (e.g. the shared MI300X ResNet trace) the change is reported as unknown.
  ``full`` / ``selective`` on a Kineto trace: which forward ops a recompute would re-run,
  and where in the backward, is not in a trace without checkpointing (PolicyError).
* **Kineto traces with GPU ``[memory]`` events and forward / backward phases** (e.g. the
  shared H100 VGG13 trace): ``cache.offload_activations`` sends what the forward leaves
  allocated for the backward to host memory and back over PCIe, hidden behind each phase's
  GPU work where it can be (:func:`_offload_activations_kineto` states the model; without
  layers in the trace it is a lower bound on the time). Without those events or phases:
  PolicyError naming which is missing.
* **Kineto DDP traces with sized gradient all-reduces and an ``Optimizer.step#NAME.step``
  range** (the shared A100 and MI300X DDP traces): ``cache.offload_optimizer`` replaces the
  optimizer's GPU kernels by the PCIe and host-memory time of the parameter bytes (the
  step's gradient all-reduce bytes) and the optimizer's states
  (:func:`_offload_optimizer_kineto`); GPU memory drops by the states.
* Everything else on a measured trace raises PolicyError naming what is missing:
  ``fcdp`` / ``keep_params`` need ZeRO-3 / FSDP per-layer parameter all-gathers (none of
  the shared real traces has them; an op-level ``params-all-gather`` is the distributed
  optimizer's once-per-step gather); ``offload_optimizer`` without sized all-reduces (the
  parameter bytes) or a known optimizer, and on op-level traces.

The effect of each what-if (what was added or removed, the memory estimate or why there is
none) is recorded in the policy's entry of ``ReplayResult.meta["scenario"]``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np

from retime.collectors.enums import CommOp, EdgeKind, OpKind, Phase
from retime.collectors.errors import PolicyError

from .base import WhatIfState
from .recompute_measured import checkpoint_spans, recompute_full_kineto, uncheckpoint_kineto

if TYPE_CHECKING:
    from .caching import Cache

__all__ = ["configure_measured", "apply_measured", "checkpoint_spans", "forward_of_backward",
           "RECOMPUTE_RATIO"]

#: backward / forward ratio above which an op-level trace is taken to recompute already
RECOMPUTE_RATIO = 2.5


def _fmt(state: WhatIfState) -> str:
    m = state.trace.meta if isinstance(state.trace.meta, dict) else {}
    return str(m.get("source_format") or "unknown")


def configure_measured(cache: Cache, state: WhatIfState) -> None:
    """Phase 1 on a measured trace: refuse what the trace lacks the information for."""
    fmt = _fmt(state)
    if cache.fcdp or cache.keep_params:
        what = "fcdp" if cache.fcdp else "keep_params"
        raise PolicyError(f"cache.{what} on a measured ({fmt}) trace: " + _gather_gap(state)
                          + "; FCDP / keep_params re-time ZeRO-3 gathers: synthesize the job "
                          "with `retime synth --zero 3` (or --fsdp) and apply it there")
    if cache.offload_activations:
        missing = _offload_gap(state)
        if missing:
            raise PolicyError(
                f"cache.offload_activations on a measured ({fmt}) trace: the offload time is "
                "the activation bytes the forward leaves for the backward, over PCIe, but "
                f"{missing}; synthesize the job with `retime synth` and apply it there")
    if cache.offload_optimizer:
        missing = "an op-level trace has no parameter or optimizer state sizes" \
            if fmt == "oplevel" else _optimizer_gap(state)
        if missing:
            raise PolicyError(
                f"cache.offload_optimizer on a measured ({fmt}) trace: the host step and the "
                "PCIe traffic scale with the parameter bytes and the optimizer state per "
                f"parameter, but {missing}; synthesize the job with `retime synth` and apply "
                "it there")
    if cache.recompute is None:
        return
    if fmt == "oplevel":
        if cache.recompute == "selective":
            raise PolicyError(
                "cache.recompute=selective on an op-level trace: selective recompute re-runs "
                "only the attention core (QK^T, softmax, dropout, AV), but the trace has one "
                "forward-compute op per micro-batch and chunk, without the attention core's "
                "share of it; use cache.recompute=full, or a kernel-level trace / `retime synth`")
        return
    if fmt in ("kineto", "nsys"):
        if cache.recompute == "full":  # recompute_measured.py (module ranges needed)
            return
        if cache.recompute != "none":
            raise PolicyError(
                f"cache.recompute={cache.recompute} on a measured {fmt} trace: which ops a "
                "selective recompute re-runs (the attention core) is not in a kernel trace; "
                "only cache.recompute=none (removes the trace's own checkpoint recompute) "
                "and full (re-runs each layer's forward, from the module ranges) are "
                "supported; synthesize the job with `retime synth` for selective recompute")
        return
    raise PolicyError(f"cache.recompute on a {fmt} trace: neither op-level forward/backward "
                      "compute ops nor Kineto checkpoint frames to work from")


def _gather_gap(state: WhatIfState) -> str:
    """Why a measured trace has nothing for FCDP / keep_params to cache."""
    t = state.trace
    if _fmt(state) == "oplevel":
        return ("the trace has no ZeRO-3/FSDP parameter all-gathers (its params-all-gather "
                "is the distributed optimizer's once-per-step gather of updated parameters, "
                "not a per-layer gather in forward and backward)")
    o = t.ops
    ag = (o["comm_op"].to_numpy() == CommOp.ALL_GATHER) & np.isin(
        o["kind"].to_numpy(), [OpKind.COLLECTIVE, OpKind.KERNEL])
    ph = o["phase"].to_numpy()
    if not (ag & (ph == Phase.FWD)).any() or not (ag & (ph == Phase.BWD)).any():
        return ("the trace has no ZeRO-3/FSDP parameter all-gathers (no all-gather in both "
                "the forward and the backward phase)")
    return ("the trace has all-gathers in forward and backward, but their per-layer parameter "
            "bytes and node placement are not modeled on measured traces yet")


def apply_measured(cache: Cache, state: WhatIfState) -> dict[str, Any]:
    """Phase 2 on a measured trace; returns the effect recorded in the scenario entry."""
    eff: dict[str, Any] = {}
    if cache.recompute is not None:
        if _fmt(state) == "oplevel":
            eff = _recompute_oplevel(state, cache.recompute)
        elif cache.recompute == "full":
            eff = recompute_full_kineto(state)
        else:
            eff = uncheckpoint_kineto(state)
    from retime.collectors.synth.hardware import match_hardware

    from .caching import DEFAULT_HOST_GBPS, DEFAULT_PCIE_GBPS
    # the host link of the trace's GPU where a profile names it (GB200: NVLink-C2C to Grace),
    # else PCIe Gen4's 25 GB/s and 100 GB/s of host memory
    hw = match_hardware(str(state.trace.meta.get("devices", "")))
    pcie = float(cache.pcie_gbps or (hw.host_bytes_per_ns if hw else DEFAULT_PCIE_GBPS))
    host = float(cache.host_gbps or (hw.host_memory_gbps if hw else DEFAULT_HOST_GBPS))
    if cache.offload_activations:
        eff["offload_activations_effect"] = _offload_activations_kineto(state, pcie)
    if cache.offload_optimizer:
        eff["offload_optimizer_effect"] = _offload_optimizer_kineto(state, pcie, host)
    return eff


def _offload_gap(state: WhatIfState) -> str:
    """What a measured trace lacks for ``offload_activations`` ('' when nothing)."""
    t = state.trace
    if _fmt(state) == "oplevel":
        return "an op-level trace has no tensor sizes (no activation bytes)"
    mem = t.memory
    if len(mem) == 0 or not ((mem["device"].to_numpy() >= 0)
                             & (mem["allocated_bytes"].to_numpy() >= 0)).any():
        return ("the trace has no GPU [memory] allocator events (record with "
                "torch.profiler.profile(profile_memory=True)), so the activation bytes are "
                "unknown")
    ph = t.ops["phase"].to_numpy()
    gpu = np.isin(t.ops["kind"].to_numpy(), [OpKind.KERNEL, OpKind.MEMCPY, OpKind.MEMSET])
    if not (gpu & (ph == Phase.FWD)).any() or not (gpu & (ph == Phase.BWD)).any():
        return ("the trace's GPU ops are not attributed to a forward and a backward phase (no "
                "*forward* / *backward* ranges), so what the forward leaves for the backward "
                "is unknown")
    return ""


# ---------------------------------------------------------------------------- op-level
def forward_of_backward(trace) -> tuple[np.ndarray, np.ndarray]:
    """(backward-compute op ids, the forward-compute op id of each): the forward of the same
    rank, step, micro-batch and model chunk. PolicyError when one has no forward."""
    o = trace.ops
    names = trace.names().astype(str)
    key = np.stack([o[c].to_numpy().astype(np.int64) for c in
                    ("rank", "step", "microbatch", "chunk")], axis=1)
    fw = np.flatnonzero(names == "forward-compute")
    bw = np.flatnonzero(names == "backward-compute")
    if len(bw) == 0 or len(fw) == 0:
        raise PolicyError("cache.recompute on an op-level trace without forward-compute / "
                          "backward-compute ops: nothing to recompute")
    kf = {tuple(k): int(i) for k, i in zip(key[fw].tolist(), fw.tolist(), strict=True)}
    match = np.asarray([kf.get(tuple(k), -1) for k in key[bw].tolist()], np.int64)
    if (match < 0).any():
        i = int(bw[np.flatnonzero(match < 0)[0]])
        r, s, mb, c = key[i].tolist()
        raise PolicyError(f"cache.recompute: backward-compute op {i} (rank {r}, step {s}, "
                          f"micro-batch {mb}, chunk {c}) has no forward-compute op of the same "
                          "rank, step, micro-batch and chunk; its recompute time is unknown")
    return bw, match


def _recompute_oplevel(state: WhatIfState, mode: str) -> dict[str, Any]:
    bw, fw = forward_of_backward(state.trace)
    meas = state.trace.ops["dur_ns"].to_numpy().astype(np.float64)
    pos = (meas[fw] > 0) & (meas[bw] > 0)
    ratio = float(np.median(meas[bw][pos] / meas[fw][pos])) if pos.any() else float("nan")
    already = bool(ratio >= RECOMPUTE_RATIO)
    eff: dict[str, Any] = {
        "trace": "oplevel", "backward_ops": int(len(bw)),
        "backward_forward_ratio": round(ratio, 3),
        "trace_recompute": "full" if already else "none",
        "memory": "unknown: an op-level trace has no tensor sizes (activation memory not "
                  "modeled)"}
    add = state.dur[fw].copy()
    if mode == "full" and not already:
        state.dur[bw] += add
        eff["added_ns"] = int(round(add.sum()))
    elif mode == "none" and already:
        cut = np.minimum(add, state.dur[bw])
        state.dur[bw] -= cut
        eff["removed_ns"] = int(round(cut.sum()))
    else:
        eff["unchanged"] = (f"the trace already runs recompute={mode} (median backward / "
                            f"forward = {ratio:.2f}; threshold {RECOMPUTE_RATIO})")
    return eff


# ---------------------------------------------------------------------------- Kineto
def _offload_activations_kineto(state: WhatIfState, pcie_gbps: float) -> dict[str, Any]:
    """Activation offload on a Kineto trace with ``[memory]`` events, per (rank, step).

    ``A`` = GPU bytes allocated over the forward's host span (allocated at its last host
    op's end minus at its first op's start: what the forward leaves for the backward). The
    copies run on a copy engine alongside compute: the forward's GPU work ``T_f`` and the
    backward's ``T_b`` (summed kernel / copy time of each phase) hide ``A / pcie_gbps`` each
    way, so the last forward GPU op grows by ``max(0, A / pcie - T_f)`` (offload tail) and
    the first backward GPU op by ``max(0, A / pcie - T_b)`` (prefetch not hidden). That is
    the per-layer model of the synthesized case summed over one phase; with no layers in the
    trace it cannot see a layer whose copy outlasts its own compute while others hide
    theirs, so it is a lower bound. GPU memory keeps two "layers" in flight instead of
    ``A``: the largest single allocation of the forward stands in for one layer.
    """
    t = state.trace
    o = t.ops
    rank = o["rank"].to_numpy()
    step = o["step"].to_numpy()
    ph = o["phase"].to_numpy()
    kind = o["kind"].to_numpy()
    s = o["start_ns"].to_numpy().astype(np.int64)
    e = s + o["dur_ns"].to_numpy().astype(np.int64)
    gpu = np.isin(kind, [OpKind.KERNEL, OpKind.MEMCPY, OpKind.MEMSET])
    host = np.isin(kind, [OpKind.CPU_OP, OpKind.RUNTIME])
    mem = t.memory
    mem = mem[(mem["device"].to_numpy() >= 0) & (mem["allocated_bytes"].to_numpy() >= 0)]
    mem = mem.sort_values("ts_ns", kind="stable")
    rows = []
    for r, st in sorted({(int(a), int(b)) for a, b in zip(rank[gpu & (ph == Phase.FWD)],
                                                          step[gpu & (ph == Phase.FWD)],
                                                          strict=True)}):
        on = (rank == r) & (step == st)
        hf = np.flatnonzero(on & host & (ph == Phase.FWD))
        gf = np.flatnonzero(on & gpu & (ph == Phase.FWD))
        gb = np.flatnonzero(on & gpu & (ph == Phase.BWD))
        if len(hf) == 0 or len(gb) == 0:
            continue
        m = mem[mem["rank"].to_numpy() == r]
        ts = m["ts_ns"].to_numpy()
        al = m["allocated_bytes"].to_numpy()
        hs, he = int(s[hf].min()), int(e[hf].max())
        i0 = np.searchsorted(ts, hs, side="right") - 1
        i1 = np.searchsorted(ts, he, side="right") - 1
        if i1 < 0:
            continue
        act = int(al[i1] - (al[i0] if i0 >= 0 else 0))
        inside = (ts >= hs) & (ts <= he)
        biggest = int(max(0, m["bytes_delta"].to_numpy()[inside].max())) if inside.any() else 0
        copy_ns = max(act, 0) / pcie_gbps  # bytes / (GB/s) = ns
        t_f = float(state.dur[gf].sum())
        t_b = float(state.dur[gb].sum())
        x_f, x_b = max(0.0, copy_ns - t_f), max(0.0, copy_ns - t_b)
        state.dur[gf[np.argmax(e[gf])]] += x_f
        state.dur[gb[np.argmin(s[gb])]] += x_b
        rows.append((r, st, act, biggest, copy_ns, t_f, t_b, x_f + x_b))
    if not rows:
        raise PolicyError("cache.offload_activations: no (rank, step) has forward host ops, "
                          "forward and backward GPU ops and [memory] samples together")
    a = np.asarray(rows, np.float64)
    worst = int(np.argmax(a[:, 2]))
    saved = max(0.0, a[worst, 2] - 2 * a[worst, 3])
    return {"activation_bytes": int(a[worst, 2]), "largest_allocation_bytes": int(a[worst, 3]),
            "copy_ns": int(round(a[worst, 4])), "forward_gpu_ns": int(round(a[worst, 5])),
            "backward_gpu_ns": int(round(a[worst, 6])),
            "added_ns": int(round(a[:, 7].sum())), "steps": int(len(rows)),
            "pcie_gbps": pcie_gbps, "memory_delta_bytes": -int(saved),
            "memory": "activation bytes from [memory] events over the forward; two of the "
                      "forward's largest allocations stay resident"}


# ---------------------------------------------------------------------------- optimizer
_OPT_STEP = re.compile(r"^Optimizer\.step#(\w+)\.step$")
#: optimizer states per parameter (in the parameters' dtype)
_STATES = {"adam": 2, "adamw": 2, "nadam": 2, "radam": 2, "adamax": 2, "sgd": None}
_MOMENTUM = re.compile(r"^aten::(_foreach_mul_|mul_)$")


def _optimizer_steps(trace) -> list[dict[str, Any]]:
    """The ``Optimizer.step#NAME.step`` host ranges (rank, lane, span, family, states/param)."""
    names = np.asarray(trace.strings, dtype=object).astype(str)
    r = trace.ranges
    rn = names[r["name_id"].to_numpy()]
    rl, rs, re_ = (r[c].to_numpy() for c in ("lane", "start_ns", "end_ns"))
    rr = r["rank"].to_numpy()
    out = []
    for i in np.flatnonzero([bool(_OPT_STEP.match(x)) for x in rn]):
        if int(rl[i]) < 0:
            continue
        fam = _OPT_STEP.match(rn[i]).group(1)
        k = _STATES.get(fam.lower(), -1)
        if k is None:  # SGD: one momentum buffer when the step scales it
            inside = (rl == rl[i]) & (rr == rr[i]) & (rs >= rs[i]) & (re_ <= re_[i])
            k = int(any(_MOMENTUM.match(x) for x in rn[inside]))
        out.append({"rank": int(rr[i]), "lane": int(rl[i]), "start": int(rs[i]),
                    "end": int(re_[i]), "optimizer": fam, "states": int(k)})
    return out


def _optimizer_gap(state: WhatIfState) -> str:
    t = state.trace
    steps = _optimizer_steps(t)
    if not steps:
        return "the trace has no 'Optimizer.step#NAME.step' range (the optimizer is unknown)"
    bad = sorted({s["optimizer"] for s in steps if s["states"] < 0})
    if bad:
        return (f"the state per parameter of optimizer {', '.join(bad)} is not known (known: "
                "SGD with or without momentum, Adam, AdamW, NAdam, RAdam, Adamax)")
    o = t.ops
    ar = (o["kind"].to_numpy() == OpKind.COLLECTIVE) & (o["comm_op"].to_numpy()
                                                         == CommOp.ALL_REDUCE)
    if not (ar & (o["phase"].to_numpy() == Phase.BWD) & (o["bytes"].to_numpy() > 0)).any():
        return ("the trace has no sized gradient all-reduce in the backward phase, so the "
                "parameter bytes are unknown (a DDP trace whose NCCL kernels carry their "
                "message sizes has them)")
    return ""


def _offload_optimizer_kineto(state: WhatIfState, pcie_gbps: float,
                              host_gbps: float) -> dict[str, Any]:
    """ZeRO-Offload style optimizer offload on a Kineto DDP trace, per (rank, step).

    ``P`` = the bytes of the step's backward gradient all-reduces on that rank (DDP
    all-reduces every gradient once: the parameter bytes, in the gradients' dtype). The
    optimizer family comes from the ``Optimizer.step#NAME.step`` range and its state count
    ``k`` per parameter (Adam-type 2; SGD 1 when the step scales a momentum buffer
    (``_foreach_mul_`` / ``mul_``), else 0). Offloaded, the step sends the gradients to the
    host and the updated parameters back (``2 P`` over PCIe) and the CPU streams parameters,
    gradients and states (read ``2 + k``, write ``1 + k`` arrays: ``(3 + 2k) P`` bytes at
    ``host_gbps``; Adam: 28 bytes per fp32 parameter, as in the synthesized model). The GPU
    kernels launched inside the optimizer step take that time together (on the last of
    them: the next forward waits for the parameters on the same stream); GPU memory drops by
    the states, ``k P``.
    """
    t = state.trace
    o = t.ops
    kind = o["kind"].to_numpy()
    rank = o["rank"].to_numpy()
    lane = o["lane"].to_numpy()
    step = o["step"].to_numpy()
    s = o["start_ns"].to_numpy()
    host = np.isin(kind, [OpKind.CPU_OP, OpKind.RUNTIME])
    ar = (kind == OpKind.COLLECTIVE) & (o["comm_op"].to_numpy() == CommOp.ALL_REDUCE) \
        & (o["phase"].to_numpy() == Phase.BWD)
    nbytes = o["bytes"].to_numpy()
    ed = t.edges
    src, dst = ed["src"].to_numpy(), ed["dst"].to_numpy()
    launch = (ed["kind"].to_numpy() == EdgeKind.LAUNCH) & host[src] & ~host[dst]
    rows = []
    for x in _optimizer_steps(t):
        inside = host & (rank == x["rank"]) & (lane == x["lane"]) & (s >= x["start"]) \
            & (s < x["end"])
        gpu = np.unique(dst[launch & inside[src]])
        if len(gpu) == 0:
            continue
        st = int(np.bincount(np.maximum(step[gpu], 0)).argmax()) if (step[gpu] >= 0).any() else -1
        p_bytes = float(nbytes[ar & (rank == x["rank"]) & (step == st)].sum())
        if p_bytes <= 0:
            continue
        k = x["states"]
        new = 2.0 * p_bytes / pcie_gbps + (3 + 2 * k) * p_bytes / host_gbps
        old = float(state.dur[gpu].sum())
        state.dur[gpu] = 0.0
        state.dur[gpu[np.argmax(s[gpu])]] = new
        rows.append((x["rank"], st, p_bytes, k, old, new, x["optimizer"]))
    if not rows:
        raise PolicyError("cache.offload_optimizer: no optimizer step launches GPU work in a "
                          "step with a sized gradient all-reduce; nothing to offload")
    worst = max(rows, key=lambda r: r[2])
    return {"optimizer": worst[6], "states_per_param": worst[3], "param_bytes": int(worst[2]),
            "gpu_optimizer_ns": int(round(worst[4])), "offloaded_ns": int(round(worst[5])),
            "added_ns": int(round(sum(r[5] - r[4] for r in rows))), "steps": len(rows),
            "pcie_gbps": pcie_gbps, "host_gbps": host_gbps,
            "memory_delta_bytes": -int(worst[3] * worst[2]),
            "memory": "optimizer states (k x the gradient all-reduce bytes) leave the GPU"}
