"""Synthesized traces of modeled transformer training runs (DESIGN.md §3).

``synthesize(model=..., hardware=..., parallel=...)`` returns an ordinary :class:`Trace`:
per-rank GPU-stream lanes (compute, TP, CP, DP, pipeline send/receive), kernels with FLOPs
and bytes, collectives with a ``coll_id`` shared across ranks, pipeline sends/receives with
``peer``, DATA and P2P edges, step/phase/layer/microbatch/stage/chunk tags, and
``meta["synth"]`` with the step time, throughput, MFU, per-rank memory and the configs.

The layout machinery is reusable: :func:`build_trace` takes a :class:`StepTemplate` of
per-layer op sequences (modeled by :func:`model_template`, or measured) plus a
:class:`ParallelConfig` and a :class:`CommModel`.

Calibration uses physical parameters only (hardware profiles: peak FLOP/s, GEMM tile
efficiency, HBM bandwidth, link bandwidths and latencies, kernel overheads, the fraction of
ideal comm/compute overlap); ``bench/synth_validation.py`` compares with published figures.

Models: dense and mixture-of-experts transformers (expert parallelism, grouped expert GEMMs,
all-to-all dispatch / combine, routing imbalance, capacity; :mod:`.moe`), multi-head latent
attention, FP8 GEMMs. Schedules: GPipe, 1F1B, interleaved, breadth-first, ZB-H1, DualPipe
(:mod:`.schedule`), even or uneven stages (:mod:`.stages`), blocking or overlapped pipeline
communication, ZeRO / FSDP with on-demand (ODC) transfers and sequence-length imbalance.

Not modeled (yet): a CPU launch thread (kernels are assumed to be launched ahead of the
GPU), slow-down of compute by overlapping data-parallel communication (only tensor-parallel
and DualPipe's paired chunks overlap inside a stream; the replay engine's contention mode
covers the rest), and more than one step per trace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..trace import MEMORY_SCHEMA, Trace, _frame
from .builder import LANES, LayerTemplate, OpTemplate, StepTemplate, build_trace, stage_params
from .costs import CommModel, gemm, grouped_gemm, streaming
from .expand import no_hugepages
from .hardware import (
    HardwareConfig,
    hardware_names,
    load_hardware,
    read_hardware_file,
    resolve_hardware,
)
from .layers import model_template, padded_vocab
from .memory import (
    korthikanti_layer_bytes,
    layer_activation_bytes,
    memory_per_stage,
    memory_timeline,
)
from .models import ModelConfig, load_model, model_names, read_model_file, resolve_model
from .moe import moe_load
from .parallel import ParallelConfig, resolve_parallel
from .schedule import SCHEDULES, bubble_fraction, bubble_time, max_in_flight, stage_order
from .stages import balanced_splits, pipeline_layout

__all__ = [
    "synthesize", "check_config", "model_flops_per_step",
    "ModelConfig", "model_names", "load_model", "read_model_file",
    "HardwareConfig", "hardware_names", "load_hardware", "read_hardware_file",
    "ParallelConfig", "CommModel", "gemm", "grouped_gemm", "streaming", "imbalance_scale",
    "OpTemplate", "LayerTemplate", "StepTemplate", "LANES", "build_trace", "model_template",
    "padded_vocab", "layer_activation_bytes", "korthikanti_layer_bytes", "memory_per_stage",
    "stage_order", "bubble_fraction", "bubble_time", "max_in_flight", "memory_timeline",
    "resolve_model", "resolve_hardware", "resolve_parallel", "SCHEDULES", "moe_load",
    "pipeline_layout", "stage_params",
]


def check_config(model: ModelConfig, parallel: ParallelConfig,
                 world_size: int | None = None) -> None:
    """Raise ConfigError naming the values when the model cannot be split this way."""
    P, m = parallel, model
    if world_size is not None and world_size != P.world_size:
        raise ConfigError(
            f"dp*tp*pp*cp = {P.dp}*{P.tp}*{P.pp}*{P.cp} = {P.world_size} does not equal "
            f"world_size={world_size}; choose degrees whose product is the world size")
    if m.heads % P.tp:
        raise ConfigError(f"tp={P.tp} does not divide heads={m.heads} of model {m.name!r}; "
                          "choose a tensor-parallel size that divides the head count")
    if P.ep > 1 and not m.moe:
        raise ConfigError(f"ep={P.ep} but model {m.name!r} has no routed experts; expert "
                          "parallelism needs a mixture-of-experts model (experts > 1)")
    if m.moe and m.experts % P.ep:
        raise ConfigError(f"ep={P.ep} does not divide experts={m.experts} of model "
                          f"{m.name!r}; choose an expert-parallel size dividing it")
    if m.moe and m.expert_ffn % P.tp:
        raise ConfigError(f"tp={P.tp} does not divide expert_ffn={m.expert_ffn} of model "
                          f"{m.name!r}")
    if m.mla and m.attention != "flash":
        raise ConfigError(f"model {m.name!r}: latent attention is modeled with flash "
                          "attention only; set attention = \"flash\"")
    if m.kv_heads % P.tp:
        raise ConfigError(f"tp={P.tp} does not divide kv_heads={m.kv_heads} of model "
                          f"{m.name!r}; choose tp <= kv_heads dividing it")
    if m.ffn % P.tp:
        raise ConfigError(f"tp={P.tp} does not divide ffn={m.ffn} of model {m.name!r}")
    if m.seq % P.cp:
        raise ConfigError(f"cp={P.cp} does not divide seq={m.seq} of model {m.name!r}")
    if P.sequence_parallel and (m.seq // P.cp * P.micro_batch) % P.tp:
        raise ConfigError(f"sequence parallelism: tokens per micro-batch "
                          f"{m.seq // P.cp * P.micro_batch} not divisible by tp={P.tp}")
    sl = P.stage_layers
    if isinstance(sl, tuple) and sl:
        pipeline_layout(P, m.layers)  # raises naming the mismatch
    elif sl in ("time", "memory"):
        n = P.pp if P.schedule == "dualpipe" else P.virtual_stages
        if P.chunks > 1 or P.schedule == "dualpipe":
            raise ConfigError(f"stage_layers={sl!r} balances one chunk per pipeline rank; "
                              f"with chunks={P.chunks} / schedule={P.schedule} give the "
                              "layers per stage as a list")
        if m.layers < n:
            raise ConfigError(f"layers={m.layers} cannot fill pp={P.pp} stages")
    elif m.layers < P.virtual_stages:
        raise ConfigError(f"layers={m.layers} of model {m.name!r} cannot fill "
                          f"pp*chunks={P.pp}*{P.chunks}={P.virtual_stages} stages; lower pp "
                          "or chunks")


def model_flops_per_step(model: ModelConfig, global_batch: int) -> float:
    """Model FLOPs of one step (3x forward; no recompute), Narayanan et al. SC21 counting:
    GEMMs of the weights a token goes through (a MoE layer's router, shared and top-k routed
    experts), full (non-causal) ``QK^T`` and ``AV``, and the logits GEMM (once per
    multi-token-prediction module too)."""
    m = model
    h, s = m.hidden, m.seq
    attn_core = 2 * s * m.heads * (m.qk_head_dim + m.v_head_dim)

    def layer(i: int) -> float:
        if m.is_moe_layer(i):
            mlp = (m.top_k + m.shared_experts) * m.mlp_params(m.expert_ffn) + h * m.experts
        else:
            mlp = m.mlp_params(m.ffn)
        return 2 * (m.attention_params() + mlp) + attn_core

    per_token = sum(layer(i) for i in range(m.layers)) + 2 * h * m.vocab
    per_token += m.mtp_depth * (layer(m.layers - 1) + 2 * 2 * h * h + 2 * h * m.vocab)
    return 3.0 * per_token * global_batch * s


def imbalance_scale(par: ParallelConfig) -> float:
    """Compute-time factor of the representative rank under sequence-length imbalance
    ``r = seq_imbalance`` (the most loaded data-parallel rank's work over the mean, per
    micro-batch): ZeRO-3 / FSDP collectives synchronize every layer, so every micro-batch
    runs at the most loaded rank's pace (``r``); with one synchronization per step (ODC, or
    DDP / ZeRO-1/2, whose gradient reduction waits only for the last backward, or FSDP under
    a pipeline, which gathers in the first forward and reduces after the last backward)
    work balances over the minibatch and only one micro-batch's excess remains:
    ``(m + r - 1) / m``."""
    r = float(par.seq_imbalance)
    if r == 1.0 or par.dp * par.cp == 1:
        return 1.0
    if par.zero_stage == 3 and not par.odc and par.pp == 1:
        return r
    m = par.num_microbatches
    return (m + r - 1) / m


def _choose_split(mc: ModelConfig, par: ParallelConfig, tpl: StepTemplate, memory_of) -> dict:
    """Layers per stage for ``stage_layers = "time" | "memory"`` (:func:`stages.
    balanced_splits`), from the template's per-layer times and the memory model."""
    from .memory import layer_activation_bytes

    def busy(ops) -> float:
        return float(sum(o.dur_ns for o in ops if o.lane == "compute"))
    layer_ns = [busy(lt.fwd) + busy(lt.bwd) + busy(lt.wgrad) for lt in tpl.layers]
    first = busy(tpl.embed.fwd) + busy(tpl.embed.bwd) if tpl.embed else 0.0
    last = busy(tpl.head.fwd) + busy(tpl.head.bwd) + busy(tpl.head.wgrad) if tpl.head else 0.0
    n = par.pp
    # memory of stage i: its static part (embedding / head states, buffers, logits) plus
    # per-layer states and in-flight activations, read off the memory model at one layer per
    # stage (states are linear in the layers held)
    probe = tuple([1] * (n - 1) + [mc.layers - (n - 1)])
    lay = pipeline_layout(par, mc.layers, probe)
    mem = memory_of(lay)
    dpg, edp, z = par.dp * par.cp, par.edp, par.zero_stage
    bpp_d = 2 / (dpg if z >= 3 else 1) + 2 / (dpg if z >= 2 else 1) + 12 / (dpg if z >= 1 else 1)
    bpp_e = 2 / (edp if z >= 3 else 1) + 2 / (edp if z >= 2 else 1) + 12 / (edp if z >= 1 else 1)
    state = [lt.params * bpp_d + lt.expert_params * bpp_e for lt in tpl.layers]
    act = [layer_activation_bytes(mc, par, layer=i) for i in range(mc.layers)]
    in_flight = [r["in_flight_microbatches"] for r in mem]
    static = []
    for i, r in enumerate(mem):
        held = list(lay.vstages[i].layers)
        static.append(r["total_bytes"] - sum(state[j] for j in held)
                      - in_flight[i] * sum(act[j] for j in held))
    out = balanced_splits(layer_ns, first, last, par.num_microbatches, n, state, act, static,
                          in_flight, par.stage_slack)
    return out


def synthesize(model: str | Path | ModelConfig | dict[str, Any],
               hardware: Any,
               parallel: ParallelConfig | dict[str, Any] | None = None, *,
               world_size: int | None = None, expand: str = "auto",
               max_ops: int = 12_000_000, check_memory: bool = True, step: int = 0,
               **parallel_kw: Any) -> Trace:
    """Synthesize one training step of a modeled run as a Trace.

    Parameters
    ----------
    model : str, path, dict or ModelConfig
        Zoo name (``"gpt3-175b"``, ``"megatron-22b"``, ``"llama3-70b"``, ...), a TOML/JSON
        file of dimensions, or a dict of them.
    hardware : str, path, HardwareConfig or Cluster
        Built-in profile (``"a100-80gb"``, ``"h100-sxm"``, ...), a TOML profile, or a cluster
        description (``retime.collectors.costs.read_cluster``; its GPU profile and links).
    parallel : ParallelConfig or dict, optional
        Degrees and options; keyword arguments (``tp=8, pp=2, global_batch=...``) are merged.
    world_size : int, optional
        When given, must equal ``dp * tp * pp * cp``.
    expand : {"auto", "all", "unique"}
        Emit every rank, or one representative rank per pipeline stage (see
        :func:`build_trace`).
    check_memory : bool
        Raise ConfigError when a rank's modeled peak memory exceeds the GPU's capacity
        (otherwise the trace is returned with ``meta["synth"]["oom"] = True``).

    Returns
    -------
    Trace
        ``meta["synth"]`` holds ``step_time_ns``, ``tokens_per_s``, ``mfu``, ``hfu``,
        ``peak_memory_bytes``, ``memory`` (per stage), ``oom``, ``world_size``, ``model``,
        ``hardware``, ``parallel`` and per-op-class totals.
    """
    mc = resolve_model(model)
    hw = resolve_hardware(hardware)
    par = resolve_parallel(parallel, **parallel_kw)
    check_config(mc, par, world_size)
    _check_dtype(hw, par)
    comm = CommModel(hw, par)
    if par.tp > comm.domain:
        raise ConfigError(f"tp={par.tp} is larger than the NVLink domain ({comm.domain} GPUs "
                          f"of {hw.name} per domain for this {par.world_size}-GPU job): a "
                          "tensor-parallel group must share NVLink; use tp <= "
                          f"{comm.domain}, or a larger --nvlink-domain if the hardware has one")
    tpl = model_template(mc, hw, par, comm)
    reserve = int(hw.framework_reserve_gib * 2**30)
    vocab_p = padded_vocab(mc, par.tp)
    biggest = max(tpl.layers, key=lambda lt: lt.params + lt.expert_params)
    lp = (biggest.params, biggest.expert_params)

    def memory_of(layout):
        sp = [stage_params(tpl, layout, s) for s in range(par.pp)]
        return memory_per_stage(mc, par, sp, hw.memory_bytes, reserve, vocab_p, lp, layout,
                                comm)
    split_info = None
    counts = None
    if par.stage_layers in ("time", "memory"):
        split_info = _choose_split(mc, par, tpl, memory_of)
        counts = tuple(split_info[par.stage_layers])
    layout = pipeline_layout(par, mc.layers, counts)
    mem = memory_of(layout)
    peak = max(r["total_bytes"] for r in mem)
    oom = any(r["oom"] for r in mem)
    if oom and check_memory:
        worst = max(mem, key=lambda r: r["total_bytes"])
        raise ConfigError(
            f"model {mc.name!r} does not fit: stage {worst['stage']} needs "
            f"{worst['total_bytes'] / 2**30:.1f} GiB per GPU (weights "
            f"{worst['weights_bytes'] / 2**30:.1f}, grads {worst['grads_bytes'] / 2**30:.1f}, "
            f"optimizer {worst['optimizer_bytes'] / 2**30:.1f}, activations "
            f"{worst['activation_bytes'] / 2**30:.1f}, buffers "
            f"{worst['buffer_bytes'] / 2**30:.1f}) but {hw.name} has {hw.memory_gib:g} GiB "
            f"with tp={par.tp} pp={par.pp} dp={par.dp} micro_batch={par.micro_batch} "
            f"recompute={par.recompute}; raise tp/pp, use ZeRO or recompute, or lower "
            "the micro-batch")
    scale = imbalance_scale(par)
    trace = build_trace(tpl, par, comm, step=step, expand=expand, max_ops=max_ops,
                        stage_layers=layout.counts, scale=scale)
    syn = trace.meta["synth"]
    step_ns = syn["step_time_ns"]
    step_s = step_ns / 1e9
    mflops = model_flops_per_step(mc, par.global_batch)
    peak_flops = hw.peak_flops(par.dtype) * par.world_size
    hw_flops = syn["flops_per_step"]
    syn.update({
        "model": mc.to_dict(),
        "hardware": hw.to_dict(),
        "dtype": par.dtype,
        "nvlink_domain": comm.domain,
        "tokens_per_step": par.global_batch * mc.seq,
        "tokens_per_s": par.global_batch * mc.seq / step_s if step_s else 0.0,
        "model_flops_per_step": mflops,
        "mfu": mflops / (step_s * peak_flops) if step_s else 0.0,
        "hfu": hw_flops / (step_s * peak_flops) if step_s else 0.0,
        "memory": mem,
        "peak_memory_bytes": int(peak),
        "oom": bool(oom),
        "padded_vocab": vocab_p,
        "params": mc.params(),
        "active_params": mc.active_params(),
        "imbalance_scale": scale,
    })
    if split_info is not None:
        syn["stage_split"] = {k: (list(v) if isinstance(v, tuple) else v)
                              for k, v in split_info.items()}
    if mc.moe:
        ld = moe_load(mc, par)
        from .moe import dispatch_bytes
        intra, inter, total = dispatch_bytes(mc, par, comm, 1 if par.dtype == "fp8" else 2)
        syn["moe"] = {"tokens_routed": ld["tokens"], "load": ld["load"],
                      "local_experts": ld["local_experts"],
                      "tokens_per_expert_mean": ld["mean_per_expert"],
                      "tokens_per_expert": ld["per_expert"], "dropped_fraction": ld["dropped"],
                      "dispatch_bytes": total, "dispatch_intra_bytes": intra,
                      "dispatch_inter_bytes": inter,
                      "ep_nodes": comm.geometry["ep"].nodes}
    R = par.dp * par.cp * par.tp
    from .memory import chunk_activation_bytes
    by_vs = chunk_activation_bytes(mc, par, layout)
    n_chunks = 2 if par.schedule == "dualpipe" else par.chunks
    chunk_act = [[by_vs[layout.vs_of(par.schedule, par.pp, c, s)] for c in range(n_chunks)]
                 for s in range(par.pp)]
    rep_ops = trace.ops.iloc[:syn["ops_per_replica"]]
    names = np.asarray(trace.strings, dtype=object)
    wgrad = np.char.endswith(names.astype(str), ".bwd_wgrad")[rep_ops["name_id"].to_numpy()]
    emitted = (np.arange(par.world_size) if syn["expand"] == "all"
               else np.arange(par.pp) * R)
    with no_hugepages():
        trace.memory = _frame(MEMORY_SCHEMA, memory_timeline(rep_ops, par, mem, chunk_act, R,
                                                             emitted, wgrad), "memory")
    trace.meta["devices"] = {"gpu": hw.gpu, "peak_flops": hw.peak_flops(par.dtype),
                             "memory_bandwidth_gbps": hw.hbm_gbps,
                             "memory_bytes": hw.memory_bytes}
    return trace


def _check_dtype(hw, par) -> None:
    """ConfigError when the GPU lacks the run's dtype (or the one FP4 runs keep layers in)."""
    if par.dtype == "fp4" and not hw.peak_tflops.get("fp4"):
        raise ConfigError(f"--dtype fp4: {hw.name} ({hw.gpu}) has no FP4 tensor cores (peaks: "
                          f"{', '.join(sorted(hw.peak_tflops))}); use --dtype fp8 or bf16, or "
                          "a GPU with FP4 (gb200, gb300, b300, mi355x)")
    hw.peak_flops(par.dtype)  # fails early when the GPU lacks the dtype
    if par.dtype == "fp4" and (par.fp4_first_high or par.fp4_last_high):
        hw.peak_flops(par.fp4_high_dtype)
