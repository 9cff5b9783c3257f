"""CLI: ``retime synth`` (a modeled training step written as a trace)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from retime.cli import FORCE_HELP, app, check_output, emit_json, say
from retime.collectors.errors import ConfigError


class Schedule(str, Enum):
    gpipe = "gpipe"
    one_f_one_b = "1f1b"
    interleaved = "interleaved"
    bfs = "bfs"
    zb_h1 = "zb-h1"
    dualpipe = "dualpipe"


class Fp8Scaling(str, Enum):
    fused = "fused"
    tensorwise = "tensorwise"


class CpAttention(str, Enum):
    fused = "fused"
    torch = "torch"


class FsdpImpl(str, Enum):
    megatron = "megatron"
    fsdp2 = "fsdp2"


class FsdpReduceDtype(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"


class MomentDtype(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"


class GradReduceDtype(str, Enum):
    auto = "auto"
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class P2p(str, Enum):
    sync = "sync"
    async_ = "async"
    serial = "serial"


class ZeroReduce(str, Enum):
    reduce_scatter = "reduce_scatter"
    reduce = "reduce"


class Recompute(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"
    op = "op"


class Dtype(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    fp4 = "fp4"


class HighDtype(str, Enum):
    bf16 = "bf16"
    fp8 = "fp8"


def parse_fp4_high(text: str) -> tuple[int, int]:
    """``--fp4-high-layers FIRST,LAST`` -> (first, last) layer counts."""
    parts = text.split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        first, last = (int(p) for p in parts)
        if first < 0 or last < 0:
            raise ValueError
    except ValueError:
        raise ConfigError(f"--fp4-high-layers {text!r}: give FIRST,LAST (layers at the start "
                          "and end kept out of FP4, integers >= 0), e.g. 1,1 or 0,0") from None
    return first, last


def synth_summary(trace) -> dict:
    """The `retime synth --json` object (DESIGN.md §6)."""
    s = trace.meta["synth"]
    out = {
        "step_time_ns": int(s["step_time_ns"]),
        "tokens_per_s": float(s["tokens_per_s"]),
        "tokens_per_s_per_gpu": float(s["tokens_per_s"]) / int(s["world_size"]),
        "mfu": float(s["mfu"]),
        "hfu": float(s["hfu"]),
        "peak_memory_bytes": int(s["peak_memory_bytes"]),
        "oom": bool(s["oom"]),
        "world_size": int(s["world_size"]),
        "model": s["model"]["name"],
        "hardware": s["hardware"]["name"],
        "nvlink_domain": int(s.get("nvlink_domain") or s["hardware"]["gpus_per_node"]),
        "parallel": s["parallel"],
        "compute_idle_fraction": max(s["compute_idle_fraction"]),
        "memory": [{k: r[k] for k in ("stage", "total_bytes", "weights_bytes", "grads_bytes",
                                      "optimizer_bytes", "activation_bytes",
                                      "in_flight_microbatches")} for r in s["memory"]],
        "op_class_ns": s["op_class_ns"],
        "ops": trace.n_ops,
        "ranks_emitted": int(s["ranks_emitted"]),
        "expand": s["expand"],
        "stage_layers": s.get("stage_layers"),
        "params": int(s.get("params", 0)),
        "active_params": int(s.get("active_params", 0)),
    }
    for k in ("moe", "stage_split"):
        if k in s:
            out[k] = s[k]
    return out


def parse_stage_layers(text: str | None):
    """``--stage-layers``: ``10,12,12,10`` (layers per stage) or ``even`` / ``time`` /
    ``memory``."""
    if text is None:
        return ()
    t = text.strip()
    if t in ("even", "time", "memory"):
        return t
    try:
        vals = tuple(int(x) for x in t.split(","))
    except ValueError:
        raise ConfigError(f"--stage-layers {text!r}: give layer counts per stage separated by "
                          "commas (e.g. 10,12,12,10) or one of even, time, memory") from None
    return vals


@app.command()
def synth(
    output: Annotated[Path, typer.Option("-o", "--output", help="Output NAME.retime directory.")],
    tp: Annotated[int | None, typer.Option("--tp", min=1, help="Tensor-parallel size (required).")] = None,
    pp: Annotated[int | None, typer.Option("--pp", min=1, help="Pipeline-parallel size (required).")] = None,
    dp: Annotated[int | None, typer.Option("--dp", min=1, help="Data-parallel size (required).")] = None,
    global_batch: Annotated[int | None, typer.Option(
        "--global-batch", min=1, help="Sequences per optimizer step (required).")] = None,
    micro_batch: Annotated[int | None, typer.Option(
        "--micro-batch", min=1, help="Sequences per micro-batch (required).")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Built-in model, e.g. gpt3-175b, "
                                              "megatron-22b, llama3-70b.")] = None,
    model_file: Annotated[Path | None, typer.Option(
        "--model-file", exists=True, dir_okay=False,
        help="TOML with hidden, ffn, heads, kv_heads (optional), layers, seq, vocab.")] = None,
    hardware: Annotated[str | None, typer.Option(
        "--hardware", help="Built-in profile: a100-40gb, a100-80gb, h100-sxm, h100-pcie, h200, "
        "b200, b300, gb200 and gb300 (a GPU of an NVL72 rack: 4 per tray, 72 in one NVLink "
        "domain, Grace over NVLink-C2C), mi300x, mi325x, mi355x.")] = None,
    hardware_file: Annotated[Path | None, typer.Option(
        "--hardware-file", exists=True, dir_okay=False,
        help="Hardware profile TOML (copy collectors/synth/hardware/*.toml).")] = None,
    cluster: Annotated[Path | None, typer.Option(
        "--cluster", exists=True, dir_okay=False,
        help="Cluster TOML (`retime cost cluster --preset NAME --nodes N -o F.toml`) instead "
        "of --hardware: its GPU profile, GPUs per node (the NVLink domain), intra-node GB/s, "
        "inter-node GB/s per GPU (NICs per node x Gbit/s per NIC / 8 / GPUs per node) and its "
        "nodes, which must hold exactly tp*pp*dp*cp GPUs.")] = None,
    calibration: Annotated[Path | None, typer.Option(
        "--calibration", exists=True, dir_okay=False,
        help="With --cluster: a calibration file from `retime calibrate --cluster F` "
        "measured on that cluster (same name, else exit 2); its measured efficiency (bus "
        "bandwidth / nominal GB/s, 0-1) replaces the model's for the level it measured, as "
        "in `retime replay --cluster F --calibration C` (nccl calibrations only; a gloo "
        "one is reported and not used).")] = None,
    cp: Annotated[int, typer.Option("--cp", min=1, help="Context-parallel size.")] = 1,
    sequence_parallel: Annotated[bool, typer.Option("--sequence-parallel",
                                                    help="Megatron sequence parallelism.")] = False,
    zero: Annotated[int, typer.Option("--zero", min=0, max=3, help="ZeRO stage 0-3.")] = 0,
    fsdp: Annotated[bool, typer.Option("--fsdp", help="FSDP (ZeRO-3, per-layer units).")] = False,
    fsdp_impl: Annotated[FsdpImpl, typer.Option(
        "--fsdp-impl", help="With --fsdp: megatron (default, Megatron-Core's FSDP: gathers "
        "and reductions in the parameters' own buffers, gradients in --grad-reduce-dtype) or "
        "fsdp2 (PyTorch "
        "FSDP2 as torchtitan runs it: all-gather copy-out and reduce-scatter copy-in on the "
        "compute stream, gradients reduced and accumulated in --fsdp-reduce-dtype).")]
        = FsdpImpl.megatron,
    fsdp_reduce_dtype: Annotated[FsdpReduceDtype, typer.Option(
        "--fsdp-reduce-dtype", help="With --fsdp-impl fsdp2: dtype of the gradient "
        "reduce-scatter and accumulator; fp32 (default: torchtitan's "
        "--training.mixed_precision_reduce) or bf16.")] = FsdpReduceDtype.fp32,
    grad_reduce_dtype: Annotated[GradReduceDtype, typer.Option(
        "--grad-reduce-dtype", help="Dtype of the main gradients and of their data-parallel "
        "reduction (all-reduce, ZeRO reduce-scatter or reduce; FSDP2 uses "
        "--fsdp-reduce-dtype). auto (default): Megatron-LM's rule, fp32 for bf16 / fp8 / fp4 "
        "runs (--bf16 sets --accumulate-allreduce-grads-in-fp32 unless "
        "--grad-reduce-in-bf16), the 16-bit gradients for fp16 runs.")]
        = GradReduceDtype.auto,
    moment_dtype: Annotated[MomentDtype, typer.Option(
        "--moment-dtype", help="Dtype of Adam's two moments: fp32 (default, Megatron-LM's) or "
        "bf16 (DeepSeek-V3's; Megatron-LM's --use-precision-aware-optimizer --exp-avg-dtype "
        "bf16 --exp-avg-sq-dtype bf16): 8 instead of 12 optimizer bytes per parameter, fp32 "
        "master weights kept.")] = MomentDtype.fp32,
    schedule: Annotated[Schedule, typer.Option("--schedule", help="Pipeline schedule.")] = Schedule.one_f_one_b,
    chunks: Annotated[int, typer.Option("--chunks", min=1,
                                        help="Model chunks per pipeline rank (interleaved, bfs).")] = 1,
    recompute: Annotated[Recompute, typer.Option(
        "--recompute", help="Activation recompute: none; selective (Megatron-LM: the "
        "attention core; DeepSeek's norms, MLA up-projections and routed experts' SwiGLU "
        "output with latent attention); "
        "full (the whole layer); op (torchtitan's op-level selective checkpointing: every "
        "second matmul of a layer, its norms, rotary and SwiGLU products).")] = Recompute.none,
    dtype: Annotated[Dtype, typer.Option("--dtype", help="Compute dtype (fp8: FP8 GEMMs where "
                                         "the GPU has an FP8 peak; fp4: NVFP4/MXFP4 linear "
                                         "GEMMs on GPUs with FP4 tensor cores, the attention "
                                         "core and output head in BF16, see "
                                         "--fp4-high-layers).")] = Dtype.bf16,
    fp4_high_layers: Annotated[str, typer.Option(
        "--fp4-high-layers", help="With --dtype fp4: FIRST,LAST transformer layers whose "
        "linear GEMMs stay in --fp4-high-dtype (Megatron-LM's --first-last-layers-bf16 "
        "default: 1,1; 0,0 = every layer in FP4).")] = "1,1",
    fp4_high_dtype: Annotated[HighDtype, typer.Option(
        "--fp4-high-dtype", help="Dtype of the layers --fp4-high-layers keeps out of FP4.")
    ] = HighDtype.bf16,
    nvlink_domain: Annotated[int | None, typer.Option(
        "--nvlink-domain", min=1, help="The job's GPUs per NVLink domain (default: the "
        "hardware's, e.g. 72 on gb200/gb300; when that does not divide the job, the largest "
        "whole number of trays per rack that does, e.g. 64 for 256 GPUs). Collectives inside "
        "a domain run on NVLink whatever trays they span; must divide the GPUs and be at "
        "least --tp.")] = None,
    ep: Annotated[int, typer.Option("--ep", min=1, help="Expert-parallel size (MoE models; "
                                    "divides dp).")] = 1,
    moe_imbalance: Annotated[float, typer.Option(
        "--moe-imbalance", min=1.0, help="Most loaded expert's tokens over the mean.")] = 1.0,
    capacity_factor: Annotated[float, typer.Option(
        "--capacity-factor", min=0.0, help="Expert capacity over the mean load, padded and "
        "dropped beyond (0 = dropless).")] = 0.0,
    stage_layers: Annotated[str | None, typer.Option(
        "--stage-layers", help="Layers per pipeline stage, e.g. 10,12,12,10, or even / time "
        "/ memory (balanced time; least peak memory within --stage-slack of the fastest).")
    ] = None,
    stage_slack: Annotated[float, typer.Option(
        "--stage-slack", min=0.0, help="Step-time slack of --stage-layers memory.")] = 0.05,
    p2p: Annotated[P2p, typer.Option("--p2p", help="Pipeline send/receive: sync (blocking, "
                                     "batched: Megatron default), async (overlapped) or serial "
                                     "(DeepSpeed's pipeline engine: send and receive as two "
                                     "blocking calls, one after the other; 1f1b only).")] = P2p.sync,
    odc: Annotated[bool, typer.Option("--odc", help="ZeRO-3/FSDP with on-demand point-to-point "
                                      "transfers, one sync per step.")] = False,
    seq_imbalance: Annotated[float, typer.Option(
        "--seq-imbalance", min=1.0, help="Most loaded data-parallel rank's work over the mean "
        "(varying sequence lengths).")] = 1.0,
    grad_overlap: Annotated[bool, typer.Option(
        "--grad-overlap", help="Reduce gradient buckets during the last backward (DDP; "
        "ZeRO-2: during every backward); default: after it, as Megatron-LM does.")] = False,
    grad_accum_fusion: Annotated[bool, typer.Option(
        "--grad-accum-fusion/--no-grad-accum-fusion",
        help="Weight-gradient GEMMs accumulate into the fp32 main gradient (Megatron-LM's "
        "default); --no-grad-accum-fusion: autograd adds each micro-batch's 16-bit gradient "
        "into param.grad with a separate kernel (DeepSpeed's engine, plain PyTorch).")] = True,
    tp_async_allreduce: Annotated[bool, typer.Option(
        "--tp-async-allreduce/--no-tp-async-allreduce",
        help="The backward's TP all-reduce runs beside the weight-gradient GEMM (Megatron-LM's "
        "default since late 2021); --no-tp-async-allreduce: after it, alone (the 2021 code, "
        "Megatron-DeepSpeed).")] = True,
    offload_layers: Annotated[int, typer.Option(
        "--offload-layers", min=0,
        help="Offload the activations of the first N layers to host memory over the "
        "hardware's host link (Megatron-Core cpu_offloading_num_layers; pp 1 only); "
        "default 0.")] = 0,
    launch_blocking_us: Annotated[float, typer.Option(
        "--launch-blocking-us", min=0.0,
        help="CUDA_LAUNCH_BLOCKING=1: microseconds of host time between every two ops "
        "(each launch waits for its kernel, so no collective overlaps a GEMM); default 0, "
        "asynchronous launches.")] = 0.0,
    zero_reduce: Annotated[ZeroReduce, typer.Option(
        "--zero-reduce", help="ZeRO-1/2 gradient reduction: reduce_scatter (Megatron-LM's "
        "distributed optimizer, default) or reduce (DeepSpeed's ZeRO stage 1/2: one reduce "
        "per owning rank's slice of each 5e8-element bucket, all-gather in 5e8-element "
        "shards).")] = ZeroReduce.reduce_scatter,
    eager: Annotated[bool, typer.Option(
        "--eager", help="PyTorch eager mode (torchtitan without --training.compile): norms, "
        "rotary embeddings, SwiGLU products and the loss run as one kernel per elementwise "
        "op, norms and loss in fp32; default: fused kernels, as Megatron-LM (Transformer "
        "Engine) or torch.compile run them.")] = False,
    compile_blocks: Annotated[bool, typer.Option(
        "--compile-blocks", help="torch.compile as torchtitan applied it in its 2024 "
        "benchmarks (per transformer block): the complex-number rotary embedding stays in "
        "eager kernels (Inductor generates no complex code) and the final norm and the fp32 "
        "loss run uncompiled; default: every elementwise op fused.")] = False,
    tp_comm_overlap: Annotated[bool, typer.Option(
        "--tp-comm-overlap", help="With --sequence-parallel: split each TP all-gather / "
        "reduce-scatter into per-peer pieces overlapped with its GEMM (torchtitan's AsyncTP, "
        "Megatron-LM's --tp-comm-overlap); default off, as in Megatron-LM.")] = False,
    fp8_scaling: Annotated[Fp8Scaling, typer.Option(
        "--fp8-scaling", help="With --dtype fp8: how the linear layers' FP8 casts are "
        "scaled. fused (default, Transformer Engine as Megatron-LM runs it): the activation "
        "input cast in one pass; tensorwise (torchao Float8, torchtitan): every GEMM casts "
        "both operands from 16 bits, an amax pass then a cast pass, and the 16-bit input is "
        "kept for the backward.")] = Fp8Scaling.fused,
    cp_attention: Annotated[CpAttention, typer.Option(
        "--cp-attention", help="With --cp > 1: how ring attention is priced. fused "
        "(default): one flash kernel per layer over the whole key range beside the K/V "
        "all-gather (a lower bound for Megatron-LM's Transformer Engine ring attention); "
        "torch (PyTorch's context_parallel, torchtitan): cp flash calls per layer on "
        "half blocks and fp32 eager merges of each step's output and log-sum-exp.")]
        = CpAttention.fused,
    seq: Annotated[int | None, typer.Option(
        "--seq", min=1, help="Sequence length in tokens (default: the model's, e.g. 8192 "
        "for llama3-*); must be divisible by --cp.")] = None,
    check_memory: Annotated[bool, typer.Option(
        "--check-memory", help="Fail (exit 2) when a rank's modeled memory exceeds the GPU's "
        "instead of reporting oom.")] = False,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Synthesize one training step of a modeled transformer run as a trace.

    Kernel times come from a roofline with size-dependent efficiency, collectives from an
    alpha-beta model per link level; the trace has every rank's compute and communication
    streams, collectives with cross-rank ids and pipeline sends/receives.
    """
    # every missing or conflicting option in one message (click would stop at the first)
    missing = [f"--{n.replace('_', '-')}" for n, v in (
        ("tp", tp), ("pp", pp), ("dp", dp), ("global_batch", global_batch),
        ("micro_batch", micro_batch)) if v is None]
    problems = [f"missing {', '.join(missing)}"] if missing else []
    if (model is None) == (model_file is None):
        problems.append("give exactly one of --model NAME or --model-file F.toml")
    if sum(x is not None for x in (hardware, hardware_file, cluster)) != 1:
        problems.append("give exactly one of --hardware NAME, --hardware-file F.toml or "
                        "--cluster F.toml")
    if calibration is not None and cluster is None:
        problems.append("--calibration needs --cluster F.toml (the cluster it was measured on)")
    if fsdp and zero:
        problems.append(f"--fsdp with --zero {zero}: FSDP is ZeRO-3, give one of them")
    if problems:
        raise ConfigError("; ".join(problems))
    hw = hardware if hardware is not None else hardware_file
    if cluster is not None:
        from retime.collectors.costs import check_cluster_world, read_cluster
        hw = read_cluster(cluster)
        check_cluster_world(hw, tp * pp * dp * cp, f"tp*pp*dp*cp = {tp}*{pp}*{dp}*{cp}")
    ref = None
    if calibration is not None:
        from retime.collectors.calibrate import read_calibration
        from retime.replay.policies.cluster_cal import refine

        ref = refine(hw, read_calibration(calibration))  # another cluster's: refused here
        hw = ref.cluster  # the measured efficiency as the cluster's stated one
    first_high, last_high = parse_fp4_high(fp4_high_layers)
    check_output(output, force, store=True)
    from retime.collectors.synth import resolve_model, synthesize

    mc = resolve_model(model if model is not None else model_file)
    if seq is not None:
        import dataclasses

        mc = dataclasses.replace(mc, seq=seq)
    trace = synthesize(
        mc, hw,
        tp=tp, pp=pp, dp=dp, cp=cp, sequence_parallel=sequence_parallel, zero=zero, fsdp=fsdp,
        schedule=schedule.value, chunks=chunks, global_batch=global_batch,
        micro_batch=micro_batch, recompute=recompute.value, dtype=dtype.value, ep=ep,
        moe_imbalance=moe_imbalance, capacity_factor=capacity_factor,
        stage_layers=parse_stage_layers(stage_layers), stage_slack=stage_slack,
        p2p=p2p.value, odc=odc, seq_imbalance=seq_imbalance, grad_overlap=grad_overlap,
        grad_accum_fusion=grad_accum_fusion, launch_blocking_us=launch_blocking_us,
        tp_async_allreduce=tp_async_allreduce,
        zero_reduce=zero_reduce.value, eager=eager, compile_blocks=compile_blocks,
        tp_comm_overlap=tp_comm_overlap,
        offload_layers=offload_layers,
        fp8_scaling=fp8_scaling.value, cp_attention=cp_attention.value,
        fsdp_impl=fsdp_impl.value, fsdp_reduce_dtype=fsdp_reduce_dtype.value,
        grad_reduce_dtype=grad_reduce_dtype.value, moment_dtype=moment_dtype.value,
        nvlink_domain=nvlink_domain or 0,
        fp4_first_high=first_high, fp4_last_high=last_high,
        fp4_high_dtype=fp4_high_dtype.value, check_memory=check_memory)
    trace.save(output)
    s = synth_summary(trace)
    if cluster is not None:
        s["cluster"] = {"name": hw.name, "file": str(cluster), "nodes": hw.nodes,
                        "gpus_per_node": hw.gpus_per_node}
        if ref is not None:
            s["cluster"]["calibration"] = {"file": str(calibration), "level": ref.level,
                                           "lines": list(ref.lines)}
    s["output"] = str(output)
    if s["oom"]:
        worst = max(s["memory"], key=lambda r: r["total_bytes"])
        typer.echo(f"warning: modeled memory exceeds the GPU: stage {worst['stage']} needs "
                   f"{worst['total_bytes'] / 2**30:.1f} GiB (oom: true; --check-memory makes "
                   "this an error)", err=True)
    if json_out:
        emit_json(s)
        return
    on = f" ({cluster}: {hw.nodes} x {hw.gpus_per_node})" if cluster is not None else ""
    hwd = trace.meta["synth"]["hardware"]
    if s["nvlink_domain"] > int(hwd["gpus_per_node"]):  # a rack: say how the job was placed
        on += f" in NVLink domains of {s['nvlink_domain']} GPUs"
    say(f"wrote {output}: {s['model']} on {s['world_size']} x {s['hardware']}{on} "
        f"(tp={tp} pp={pp} dp={dp} cp={cp}); step {s['step_time_ns'] / 1e9:.3f} s, "
        f"{s['tokens_per_s']:,.0f} tokens/s, MFU {100 * s['mfu']:.1f}%, peak memory "
        f"{s['peak_memory_bytes'] / 2**30:.1f} GiB per GPU; {s['ops']} ops "
        f"({s['ranks_emitted']} rank(s) emitted)")
    for line in (ref.lines if ref is not None else ()):
        say(f"  {line}")
