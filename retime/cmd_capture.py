"""CLI: ``retime capture`` — run a training script under torchrun and profile chosen steps."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

import retime
from retime.cli import app, emit_json, say
from retime.collectors.capture import ENV_PREFIX, CaptureConfig
from retime.collectors.errors import RetimeError

_TRACE_GLOBS = ("rank-*.pt.trace.json", "rank-*.pt.trace.json.gz")


def _existing_traces(out: Path) -> list[Path]:
    found = [p for g in _TRACE_GLOBS for p in out.glob(g)]
    found += [p for p in out.glob("cycle-*") if p.is_dir()]
    return sorted(found)


def _stderr_target():
    """Where the script's stdout goes with --json: our stderr's fd, or a pipe we copy."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is a ValueError
        return subprocess.PIPE


def launch_command(script_args: list[str], nproc_per_node: int,
                   torchrun_args: list[str]) -> list[str]:
    """The torchrun command line that runs ``script_args`` with capture on every rank."""
    multi_node = any(a.split("=", 1)[0] in ("--nnodes", "--rdzv-endpoint", "--rdzv_endpoint",
                                             "--master-addr", "--master_addr")
                     for a in torchrun_args)
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if not multi_node:
        cmd.append("--standalone")  # single node: torchrun picks a free port itself
    cmd += [f"--nproc-per-node={nproc_per_node}", *torchrun_args, "-m", "retime.collectors.capture",
            *script_args]
    return cmd


@app.command(context_settings={"allow_interspersed_args": False})
def capture(
    script_args: Annotated[list[str], typer.Argument(
        metavar="SCRIPT [ARGS]...",
        help="The training script and its arguments (or `-m MODULE ARGS`). Put them after "
             "`--` when they contain options.")],
    output: Annotated[Path, typer.Option("-o", "--output", file_okay=False,
                                         help="Folder for the traces (one per rank).")],
    nproc_per_node: Annotated[int, typer.Option(
        "-n", "--nproc-per-node", min=1, help="Processes (ranks) on this node.")] = 1,
    wait: Annotated[int, typer.Option(min=0, help="Schedule: idle steps before warm-up.")] = 1,
    warmup: Annotated[int, typer.Option(min=0, help="Schedule: profiled but discarded steps.")] = 1,
    active: Annotated[int, typer.Option(min=1, help="Schedule: recorded steps.")] = 3,
    repeat: Annotated[int, typer.Option(min=0, help="Schedule: cycles (0 = until the end).")] = 1,
    skip_first: Annotated[int, typer.Option(min=0, help="Schedule: steps ignored first.")] = 0,
    profile_memory: Annotated[bool, typer.Option("--profile-memory",
                                                 help="Record allocator events too.")] = False,
    with_stack: Annotated[bool, typer.Option("--with-stack", help="Record Python stacks.")] = False,
    auto: Annotated[bool, typer.Option(
        "--auto/--no-auto",
        help="Count a step at every optimizer.step(). --no-auto: the script marks steps "
             "itself with retime.collectors.capture.Capture.")] = True,
    torchrun_arg: Annotated[list[str] | None, typer.Option(
        "--torchrun-arg", help="Extra torchrun argument, repeatable (e.g. "
                               "--torchrun-arg=--nnodes=2 --torchrun-arg=--node-rank=0).")] = None,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="Replace traces left in OUTPUT by an earlier capture.")] = False,
    ingest_to: Annotated[Path | None, typer.Option(
        "--ingest", file_okay=False, help="Also ingest the traces into this NAME.retime store.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Run a training script under torchrun and write one Kineto trace per rank.

    Example: `retime capture -n 2 -o traces/run1 -- train.py --epochs 1`, then `retime ingest traces/run1 -o run1.retime`.

    Every rank runs SCRIPT with torch.profiler on. A step ends at each optimizer.step(); with the default schedule (--wait 1 --warmup 1 --active 3) the 3rd to 5th steps are recorded. A script that opens `retime.collectors.capture.Capture(...)` itself keeps control: its own cap.step() marks win, and the arguments it leaves unset come from these options.

    Traces go to OUTPUT/rank-R.pt.trace.json.gz (OUTPUT/cycle-K/ when --repeat is not 1) with rank, world size and process groups (distributedInfo) and input shapes recorded. Works on CPU (gloo) and GPU (NCCL); needs the torch extra (`pip install "retime[torch]"`). The script's own output is passed through (to stderr with --json).
    """
    if importlib.util.find_spec("torch") is None:
        raise RetimeError('retime capture needs PyTorch, which is not installed here; '
                          'install it with `pip install "retime[torch]"`')
    script = script_args[0]
    if script != "-m" and not Path(script).is_file():
        raise RetimeError(f"{script}: no such script; pass the training script's path "
                          "(or `-m MODULE`) after `--`")
    if output.exists() and not output.is_dir():
        raise RetimeError(f"{output}: exists and is not a folder; choose another -o path")
    old = _existing_traces(output) if output.exists() else []
    if old and not overwrite:
        raise RetimeError(f"{output}: already holds traces of an earlier capture ({old[0].name}, "
                          f"{len(old)} in all); choose a new -o folder or pass --overwrite")
    for p in old:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    if ingest_to is not None and repeat != 1:
        raise RetimeError(f"--ingest needs --repeat 1 (got {repeat}): each cycle is its own run; "
                          "ingest OUTPUT/cycle-<k> folders one at a time")

    cfg = CaptureConfig(out_dir=str(output.resolve()), wait=wait, warmup=warmup, active=active,
                        repeat=repeat, skip_first=skip_first, profile_memory=profile_memory,
                        with_stack=with_stack)
    env = dict(os.environ)
    env.update(cfg.to_env())
    env[ENV_PREFIX + "AUTO"] = "1" if auto else "0"
    # Make `retime` importable in the children even from an uninstalled checkout.
    root = str(Path(retime.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    cmd = launch_command(script_args, nproc_per_node, list(torchrun_arg or []))
    say(f"retime capture: torchrun {' '.join(cmd[3:])}", quiet=json_out)
    t0 = time.perf_counter()
    child_out = _stderr_target() if json_out else None
    proc = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=child_out)
    if child_out == subprocess.PIPE:  # stderr is not a real file (e.g. captured by a caller)
        sys.stderr.write(proc.stdout.decode(errors="replace"))
    wall_s = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RetimeError(f"{script} exited with code {proc.returncode} under torchrun (its "
                          f"output is above); traces written so far are in {output}")
    traces = _existing_traces(output)
    if not traces:
        raise RetimeError(
            f"{script} finished but wrote no trace to {output}: it ran fewer than "
            f"{cfg.steps_needed} steps (skip_first + wait + warmup + active), or never called "
            "optimizer.step() (pass --no-auto and mark steps with Capture.step()), or the "
            "script's own Capture was given another folder")
    result: dict = {"output": str(output), "traces": [str(p) for p in traces],
                    "nproc_per_node": nproc_per_node, "wall_s": round(wall_s, 3),
                    "schedule": {"skip_first": skip_first, "wait": wait, "warmup": warmup,
                                 "active": active, "repeat": repeat}}
    if ingest_to is not None:
        from retime.cmd_trace import ingest_summary
        from retime.collectors.ingest import read

        trace = read([str(output)])
        trace.save(ingest_to)
        result["ingest"] = {**ingest_summary(trace), "output": str(ingest_to)}
    if json_out:
        emit_json(result)
        return
    say(f"wrote {len(traces)} trace(s) to {output} in {wall_s:.1f} s")
    if ingest_to is not None:
        s = result["ingest"]
        say(f"ingested into {ingest_to}: {s['ops']} ops on {len(s['ranks'])} rank(s), "
            f"collectives matched {s['collectives']['matched']}, "
            f"unmatched {s['collectives']['unmatched']}")
    else:
        say(f"next: retime ingest {output} -o {output.name}.retime")
