"""CLI: ``retime synth`` (a modeled training step written as a trace)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from retime.cli import app, emit_json, say
from retime.collectors.errors import ConfigError, RetimeError


class Schedule(str, Enum):
    gpipe = "gpipe"
    one_f_one_b = "1f1b"
    interleaved = "interleaved"
    bfs = "bfs"


class Recompute(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"


class Dtype(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"


def synth_summary(trace) -> dict:
    """The `retime synth --json` object (DESIGN.md §6)."""
    s = trace.meta["synth"]
    return {
        "step_time_ns": int(s["step_time_ns"]),
        "tokens_per_s": float(s["tokens_per_s"]),
        "mfu": float(s["mfu"]),
        "hfu": float(s["hfu"]),
        "peak_memory_bytes": int(s["peak_memory_bytes"]),
        "oom": bool(s["oom"]),
        "world_size": int(s["world_size"]),
        "model": s["model"]["name"],
        "hardware": s["hardware"]["name"],
        "parallel": s["parallel"],
        "compute_idle_fraction": max(s["compute_idle_fraction"]),
        "memory": [{k: r[k] for k in ("stage", "total_bytes", "weights_bytes", "grads_bytes",
                                      "optimizer_bytes", "activation_bytes",
                                      "in_flight_microbatches")} for r in s["memory"]],
        "op_class_ns": s["op_class_ns"],
        "ops": trace.n_ops,
        "ranks_emitted": int(s["ranks_emitted"]),
        "expand": s["expand"],
    }


@app.command()
def synth(
    output: Annotated[Path, typer.Option("-o", "--output", help="Output NAME.retime directory.")],
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel size.")],
    pp: Annotated[int, typer.Option("--pp", min=1, help="Pipeline-parallel size.")],
    dp: Annotated[int, typer.Option("--dp", min=1, help="Data-parallel size.")],
    global_batch: Annotated[int, typer.Option("--global-batch", min=1,
                                              help="Sequences per optimizer step.")],
    micro_batch: Annotated[int, typer.Option("--micro-batch", min=1,
                                             help="Sequences per micro-batch.")],
    model: Annotated[str | None, typer.Option("--model", help="Built-in model, e.g. gpt3-175b, "
                                              "megatron-22b, llama3-70b.")] = None,
    model_file: Annotated[Path | None, typer.Option(
        "--model-file", exists=True, dir_okay=False,
        help="TOML with hidden, ffn, heads, kv_heads (optional), layers, seq, vocab.")] = None,
    hardware: Annotated[str | None, typer.Option(
        "--hardware", help="Built-in profile: a100-40gb, a100-80gb, h100-sxm, h200, b200, "
        "mi300x.")] = None,
    hardware_file: Annotated[Path | None, typer.Option(
        "--hardware-file", exists=True, dir_okay=False,
        help="Hardware profile TOML (copy collectors/synth/hardware/*.toml).")] = None,
    cp: Annotated[int, typer.Option("--cp", min=1, help="Context-parallel size.")] = 1,
    sequence_parallel: Annotated[bool, typer.Option("--sequence-parallel",
                                                    help="Megatron sequence parallelism.")] = False,
    zero: Annotated[int, typer.Option("--zero", min=0, max=3, help="ZeRO stage 0-3.")] = 0,
    fsdp: Annotated[bool, typer.Option("--fsdp", help="FSDP (ZeRO-3, per-layer units).")] = False,
    schedule: Annotated[Schedule, typer.Option("--schedule", help="Pipeline schedule.")] = Schedule.one_f_one_b,
    chunks: Annotated[int, typer.Option("--chunks", min=1,
                                        help="Model chunks per pipeline rank (interleaved, bfs).")] = 1,
    recompute: Annotated[Recompute, typer.Option("--recompute", help="Activation recompute.")] = Recompute.none,
    dtype: Annotated[Dtype, typer.Option("--dtype", help="Compute dtype.")] = Dtype.bf16,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Synthesize one training step of a modeled transformer run as a trace.

    Kernel times come from a roofline with size-dependent efficiency, collectives from an
    alpha-beta model per link level; the trace has every rank's compute and communication
    streams, collectives with cross-rank ids and pipeline sends/receives.
    """
    from retime.collectors.synth import synthesize

    if (model is None) == (model_file is None):
        raise ConfigError("give exactly one of --model NAME or --model-file F.toml")
    if (hardware is None) == (hardware_file is None):
        raise ConfigError("give exactly one of --hardware NAME or --hardware-file F.toml")
    if fsdp and zero:
        raise ConfigError(f"--fsdp with --zero {zero}: FSDP is ZeRO-3; give one of them")
    if output.exists() and not output.is_dir():
        raise RetimeError(f"{output}: exists and is not a directory; choose another -o path")
    trace = synthesize(
        model if model is not None else model_file,
        hardware if hardware is not None else hardware_file,
        tp=tp, pp=pp, dp=dp, cp=cp, sequence_parallel=sequence_parallel, zero=zero, fsdp=fsdp,
        schedule=schedule.value, chunks=chunks, global_batch=global_batch,
        micro_batch=micro_batch, recompute=recompute.value, dtype=dtype.value)
    trace.save(output)
    s = synth_summary(trace)
    s["output"] = str(output)
    if json_out:
        emit_json(s)
        return
    say(f"wrote {output}: {s['model']} on {s['world_size']} x {s['hardware']} "
        f"(tp={tp} pp={pp} dp={dp} cp={cp}); step {s['step_time_ns'] / 1e9:.3f} s, "
        f"{s['tokens_per_s']:,.0f} tokens/s, MFU {100 * s['mfu']:.1f}%, peak memory "
        f"{s['peak_memory_bytes'] / 2**30:.1f} GiB per GPU; {s['ops']} ops "
        f"({s['ranks_emitted']} rank(s) emitted)")
