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

Not modeled (yet): uneven pipeline stages, mixture-of-experts layers, a CPU launch thread
(kernels are assumed to be launched ahead of the GPU), slow-down of compute by overlapping
data-parallel communication (only tensor-parallel overlap pays the ``overlap`` factor; the
replay engine's contention mode covers the rest), and more than one step per trace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..trace import MEMORY_SCHEMA, Trace, _frame
from .builder import LANES, LayerTemplate, OpTemplate, StepTemplate, build_trace
from .costs import CommModel, gemm, streaming
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
from .parallel import ParallelConfig, resolve_parallel
from .schedule import bubble_fraction, max_in_flight, stage_order

__all__ = [
    "synthesize", "check_config", "model_flops_per_step",
    "ModelConfig", "model_names", "load_model", "read_model_file",
    "HardwareConfig", "hardware_names", "load_hardware", "read_hardware_file",
    "ParallelConfig", "CommModel", "gemm", "streaming",
    "OpTemplate", "LayerTemplate", "StepTemplate", "LANES", "build_trace", "model_template",
    "padded_vocab", "layer_activation_bytes", "korthikanti_layer_bytes", "memory_per_stage",
    "stage_order", "bubble_fraction", "max_in_flight", "memory_timeline",
    "resolve_model", "resolve_hardware", "resolve_parallel",
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
    if m.layers % P.virtual_stages:
        raise ConfigError(f"layers={m.layers} of model {m.name!r} is not divisible by "
                          f"pp*chunks={P.pp}*{P.chunks}={P.virtual_stages}")


def model_flops_per_step(model: ModelConfig, global_batch: int) -> float:
    """Model FLOPs of one step (3x forward; no recompute), Narayanan et al. SC21 counting:
    dense GEMMs, full (non-causal) ``QK^T`` and ``AV``, and the logits GEMM."""
    m = model
    h, s = m.hidden, m.seq
    gate = 3 if m.gated_mlp else 2
    per_token_layer = 2 * (h * (h + 2 * m.kv_dim) + h * h + gate * h * m.ffn) + 4 * s * h
    per_token = m.layers * per_token_layer + 2 * h * m.vocab
    return 3.0 * per_token * global_batch * s


def synthesize(model: str | Path | ModelConfig | dict[str, Any],
               hardware: str | Path | HardwareConfig,
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
    hardware : str, path or HardwareConfig
        Built-in profile (``"a100-80gb"``, ``"h100-sxm"``, ...) or a TOML profile.
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
    hw.peak_flops(par.dtype)  # fails early when the GPU lacks the dtype
    comm = CommModel(hw, par)
    tpl = model_template(mc, hw, par, comm)
    per = mc.layers // par.virtual_stages
    from .builder import _stage_params
    stage_params = [_stage_params(tpl, par, s, per) for s in range(par.pp)]
    reserve = int(hw.framework_reserve_gib * 2**30)
    mem = memory_per_stage(mc, par, stage_params, hw.memory_bytes, reserve,
                           padded_vocab(mc, par.tp), tpl.layers[0].params)
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
    trace = build_trace(tpl, par, comm, step=step, expand=expand, max_ops=max_ops)
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
        "tokens_per_step": par.global_batch * mc.seq,
        "tokens_per_s": par.global_batch * mc.seq / step_s if step_s else 0.0,
        "model_flops_per_step": mflops,
        "mfu": mflops / (step_s * peak_flops) if step_s else 0.0,
        "hfu": hw_flops / (step_s * peak_flops) if step_s else 0.0,
        "memory": mem,
        "peak_memory_bytes": int(peak),
        "oom": bool(oom),
        "padded_vocab": padded_vocab(mc, par.tp),
    })
    R = par.dp * par.cp * par.tp
    chunk_act = (mc.layers // par.virtual_stages) * layer_activation_bytes(mc, par)
    rep_ops = trace.ops.iloc[:syn["ops_per_replica"]]
    emitted = (np.arange(par.world_size) if syn["expand"] == "all"
               else np.arange(par.pp) * R)
    with no_hugepages():
        trace.memory = _frame(MEMORY_SCHEMA, memory_timeline(rep_ops, par, mem, chunk_act, R,
                                                             emitted), "memory")
    trace.meta["devices"] = {"gpu": hw.gpu, "peak_flops": hw.peak_flops(par.dtype),
                             "memory_bandwidth_gbps": hw.hbm_gbps,
                             "memory_bytes": hw.memory_bytes}
    return trace
