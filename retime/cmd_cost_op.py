"""CLI: ``retime cost op KIND``: one kernel's time from its shape on a GPU
(:mod:`retime.collectors.costs.kernels`)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from retime.cli import emit_json, say
from retime.cmd_cost import ClusterOpt, GpuOpt, JsonOpt, PresetOpt, cost_app
from retime.cmd_synth import Fp8Scaling  # one choice list for both commands
from retime.collectors.errors import ConfigError


class OpKind(str, Enum):
    matmul = "matmul"
    bmm = "bmm"
    conv2d = "conv2d"
    attention = "attention"
    norm = "norm"
    elementwise = "elementwise"
    embedding = "embedding"
    optimizer = "optimizer"


_NEEDS = {
    "matmul": ("m", "n", "k"), "bmm": ("m", "n", "k", "batch"),
    "conv2d": ("batch", "in_channels", "height", "width", "out_channels"),
    "attention": ("batch", "heads", "seq", "head_dim"), "norm": ("elements",),
    "elementwise": ("elements",), "embedding": ("tokens", "dim"), "optimizer": ("params",),
}

_Int = Annotated[int | None, typer.Option(min=1)]


@cost_app.command("op")
def op_cmd(
    kind: Annotated[OpKind | None, typer.Argument(
        help="Kernel class (omit with --trace).")] = None,
    gpu: GpuOpt = None, preset: PresetOpt = None, cluster: ClusterOpt = None,
    trace: Annotated[Path | None, typer.Option(
        "--trace", exists=True, file_okay=False,
        help="A NAME.retime store recorded with shapes: its heaviest operators, measured "
             "against the model on the trace's own GPU (and on --gpu when given).")] = None,
    top: Annotated[int, typer.Option("--top", min=1,
                                     help="--trace: operator groups to show.")] = 10,
    dtype: Annotated[str, typer.Option(
        "--dtype", help="Element type: bf16, fp16, fp8, fp4, fp32, tf32.")] = "bf16",
    m: Annotated[int | None, typer.Option(
        "--m", min=1, help="matmul / bmm: rows of A and C (elements; tokens for a linear layer).")] = None,
    n: Annotated[int | None, typer.Option(
        "--n", min=1, help="matmul / bmm: columns of B and C (elements; output features).")] = None,
    k: Annotated[int | None, typer.Option(
        "--k", min=1, help="matmul / bmm: reduction depth (elements; input features).")] = None,
    batch: Annotated[int | None, typer.Option(
        "--batch", min=1, help="bmm: matrices; conv2d / attention: samples.")] = None,
    in_channels: Annotated[int | None, typer.Option("--in-channels", min=1,
                                                    help="conv2d: input channels.")] = None,
    out_channels: Annotated[int | None, typer.Option("--out-channels", min=1,
                                                     help="conv2d: filters.")] = None,
    height: Annotated[int | None, typer.Option("--height", min=1,
                                               help="conv2d: input height (pixels).")] = None,
    width: Annotated[int | None, typer.Option("--width", min=1,
                                              help="conv2d: input width (pixels).")] = None,
    kernel: Annotated[int, typer.Option("--kernel", min=1,
                                        help="conv2d: filter size (kernel x kernel).")] = 3,
    stride: Annotated[int, typer.Option("--stride", min=1, help="conv2d: stride.")] = 1,
    padding: Annotated[int | None, typer.Option(
        "--padding", min=0, help="conv2d: zero padding (default kernel // 2).")] = None,
    heads: Annotated[int | None, typer.Option("--heads", min=1,
                                              help="attention: query heads.")] = None,
    kv_heads: Annotated[int | None, typer.Option(
        "--kv-heads", min=1, help="attention: key/value heads (GQA; default = heads).")] = None,
    seq: Annotated[int | None, typer.Option("--seq", min=1,
                                            help="attention: sequence length (tokens).")] = None,
    head_dim: Annotated[int | None, typer.Option("--head-dim", min=1,
                                                 help="attention: dimension per head.")] = None,
    causal: Annotated[bool, typer.Option("--causal", help="attention: causal mask.")] = False,
    backward: Annotated[bool, typer.Option("--backward",
                                           help="attention / conv2d: the backward pass.")] = False,
    channels_last: Annotated[bool, typer.Option(
        "--channels-last", help="conv2d: the model's activations are NHWC (channels_last): "
        "no NCHW <-> NHWC layout kernels around the convolution's GEMMs.")] = False,
    elements: Annotated[int | None, typer.Option(
        "--elements", min=1, help="norm / elementwise: elements per tensor.")] = None,
    reads: Annotated[int, typer.Option("--reads", min=0,
                                       help="norm / elementwise: tensors read.")] = 1,
    writes: Annotated[int, typer.Option("--writes", min=0,
                                        help="norm / elementwise: tensors written.")] = 1,
    tokens: Annotated[int | None, typer.Option("--tokens", min=1,
                                               help="embedding: rows looked up.")] = None,
    dim: Annotated[int | None, typer.Option("--dim", min=1,
                                            help="embedding: row width (elements).")] = None,
    params: Annotated[int | None, typer.Option("--params", min=1,
                                               help="optimizer: parameters updated.")] = None,
    optimizer: Annotated[str, typer.Option(
        "--optimizer", help="optimizer: adam, adamw, sgd (momentum) or adafactor.")] = "adam",
    training: Annotated[bool, typer.Option(
        "--training", help="matmul / bmm / attention: price as inside a training step, as "
        "`retime synth` does: the GPU's sustained training GEMM rate (the profile's "
        "gemm_max, never above the published single-GPU maximum) instead of that maximum; "
        "fp8 / fp4 GEMMs also quantize their [m, k] input; attention is priced the same "
        "either way (the one flash model: the GPU's published flash-attention rate, with a "
        "head-dim term where its exponential rate is known).")] = False,
    fp8_scaling: Annotated[Fp8Scaling, typer.Option(
        "--fp8-scaling", help="matmul / bmm --training --dtype fp8: fused (default, "
        "Transformer Engine: the [m, k] input cast in one pass) or tensorwise (torchao "
        "Float8: both operands cast, each an amax pass then a cast pass), as `retime synth "
        "--fp8-scaling`.")] = Fp8Scaling.fused,
    attn_kernel: Annotated[str, typer.Option(
        "--attn-kernel", help="attention: the kernel family, flash2 (default: FlashAttention-2's "
        "published rate) or cudnn (cuDNN's Hopper fused attention, what PyTorch's SDPA runs on "
        "an H100 / H200; Hopper GPUs only).")] = "flash2",
    json_out: JsonOpt = False,
) -> None:
    """Price one kernel from its shape: time (us), FLOPs, bytes, achieved TFLOP/s and GB/s,
    the bound that holds (compute, memory, latency), the efficiency used and its source, and
    a range. The GPU comes from --gpu, else the --preset / --cluster's GPU (default h100-sxm)."""
    from retime.collectors.costs import kernels as K
    from retime.collectors.costs import resolve_cluster
    from retime.collectors.costs.gpus import gpu_spec

    if trace is not None:
        if kind is not None:
            raise ConfigError("retime cost op: give a KIND with its shape, or --trace, not both")
        _trace_check(trace, gpu, top, json_out)
        return
    if kind is None:
        raise ConfigError("retime cost op: missing KIND (matmul, bmm, conv2d, attention, norm, "
                          "elementwise, embedding, optimizer) or --trace; see "
                          "'retime cost op --help'")
    values = dict(m=m, n=n, k=k, batch=batch, in_channels=in_channels, height=height,
                  width=width, out_channels=out_channels, heads=heads, seq=seq,
                  head_dim=head_dim, elements=elements, tokens=tokens, dim=dim, params=params)
    missing = [x for x in _NEEDS[kind.value] if values[x] is None]
    if missing:
        raise ConfigError(f"retime cost op {kind.value}: missing "
                          f"{', '.join('--' + x.replace('_', '-') for x in missing)}; "
                          f"see 'retime cost op --help'")
    if gpu is None:
        gpu = resolve_cluster(preset, cluster).gpu if (preset or cluster) else "h100-sxm"
    g = gpu_spec(gpu)
    kv = kind.value
    if fp8_scaling is not Fp8Scaling.fused and not (training and kv in ("matmul", "bmm")):
        raise ConfigError(f"retime cost op {kv} --fp8-scaling {fp8_scaling.value}: it prices "
                          "the casts of a training GEMM; give matmul or bmm with --training "
                          "--dtype fp8, or drop it")
    if training and kv not in ("matmul", "bmm", "attention"):
        raise ConfigError(f"retime cost op {kv} --training: --training prices matmul, bmm "
                          "and attention only; drop it")
    if kv in ("matmul", "bmm"):
        if training:
            r = K.matmul(g, m, n, k, batch or 1, dtype, ceiling=g.training_ceiling(dtype),
                         quantize=dtype in K.QUANT_BYTES, scaling=fp8_scaling.value)
        else:
            r = K.matmul(g, m, n, k, batch or 1, dtype)
    elif kv == "conv2d":
        # what a replay what-if charges for the same call of a trace: its implicit-GEMM
        # passes and layout kernels, on the fitted curves
        from retime.collectors.costs.conv import conv2d_call
        r = conv2d_call(g, batch, in_channels, height, width, out_channels, kernel, stride,
                        padding, dtype, backward, channels_last)
    elif kv == "attention":
        r = K.attention(g, batch, heads, seq, head_dim, kv_heads, causal, backward, dtype,
                        kernel=attn_kernel)
    elif kv in ("norm", "elementwise"):
        r = K.streaming(g, elements, dtype, reads + (1 if kv == "norm" else 0), writes,
                        8.0 if kv == "norm" else 1.0, kv)
    elif kv == "embedding":
        r = K.embedding(g, tokens, dim, dtype)
    else:
        r = K.optimizer_step(g, params, optimizer, dtype)
    d = r.to_dict()
    if json_out:
        emit_json(d)
        return
    say(f"{r.kind} on {g.name} ({g.hw.gpu}), {dtype}")
    say(f"  time      {r.time_us:.2f} us   (range {r.range_us[0]:.2f} - {r.range_us[1]:.2f} us)")
    say(f"  work      {r.flops / 1e9:.3f} GFLOP, {r.bytes / 1e6:.3f} MB")
    say(f"  achieved  {r.tflops:.1f} TFLOP/s, {r.gbps:.0f} GB/s")
    say(f"  bound     {r.bound}")
    if r.parts:
        say("  kernels   " + ", ".join(f"{role} {us:.2f} us" for role, us in r.parts))
    say(f"assumed: efficiency {r.efficiency:.3f} of the datasheet peak"
        f"{' (compute)' if r.bound == 'compute' else ' (HBM)' if r.bound == 'memory' else ''}:"
        f" {r.efficiency_source}")


def _trace_check(path: Path, gpu: str | None, top: int, json_out: bool) -> None:
    import math

    from retime.analysis.cost_check import op_check
    from retime.collectors.trace import read_trace

    df = op_check(read_trace(path), gpu=gpu, top=top)
    own = df.attrs["trace_gpu"]
    if json_out:
        recs = [{k: (None if isinstance(v, float) and math.isnan(v) else v)
                 for k, v in r.items()} for r in df.to_dict("records")]
        emit_json({"trace_gpu": own, "gpu": gpu, "median_abs_error":
                   df.attrs["median_abs_error"], "ops": recs})
        return
    say(f"{path}: top {len(df)} operator groups by device time; model on {own} (the trace's "
        f"GPU){f' and on {gpu}' if gpu else ''}")
    say(f"  {'op':<34} {'dtype':>5} {'calls':>6} {'measured':>10} {'model':>10} {'error':>7}"
        f"  {'bound':<8}" + (f" {'on ' + gpu:>12}" if gpu else ""))
    for r in df.to_dict("records"):
        say(f"  {r['op'][:34]:<34} {r['dtype']:>5} {r['count']:>6} {r['measured_us']:>8.1f}us "
            f"{r['model_us']:>8.1f}us {100 * r['error']:>+6.1f}%  {r['bound']:<8}"
            + (f" {r['other_us']:>10.1f}us" if gpu else ""))
    say(f"median |error| on {own}: {100 * df.attrs['median_abs_error']:.1f}% (shapes: "
        "`retime analyze --by roofline` lists them)")
