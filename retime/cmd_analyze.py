"""CLI: ``retime analyze RUN.retime [--stream/--no-stream] [--by step|rank] [--top N]``."""

from __future__ import annotations

import math
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from retime.cli import app, emit_json, say
from retime.collectors.errors import RetimeError

if TYPE_CHECKING:
    import pandas as pd


class By(str, Enum):
    step = "step"
    rank = "rank"
    hierarchy = "hierarchy"
    roofline = "roofline"


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in df.to_dict("records")]


def _gbps(bw: float) -> str:
    """A bandwidth with 3 significant digits (a 300-rank gloo job's 0.045 GB/s is not 0.0)."""
    return f"{bw:.1f} GB/s" if bw >= 10 else f"{bw:.3g} GB/s"


def analysis_summary(res: dict[str, Any]) -> dict[str, Any]:
    """The ``retime analyze --json`` object, from :func:`analysis.stream.store_analysis`."""
    from retime.analysis.breakdown import PARTS
    from retime.analysis.coverage import hides_gpu_work, unseen_notes

    st = res["step_times"]
    per_rank = st.groupby("rank", sort=True)["step_ns"].agg(["size", "mean", "max"])
    bd = res["breakdown"]
    tot = int(bd["step_ns"].sum()) if len(bd) else 0
    job = st.groupby("step", sort=True)["step_ns"].max()  # per step, the slowest rank
    v = job.to_numpy(dtype=float)
    spread = float(v.std(ddof=1) / v.mean()) if len(v) > 1 and v.mean() > 0 else None
    es = res.get("empty_steps")
    return {
        "mode": res["mode"],
        "by": res.get("by", "step"),
        "ranks": int(st["rank"].nunique()),
        # mean: over every (rank, step) row; job_mean: over steps of the slowest rank's
        # window (the report's headline step time; compare's with one rank per step row)
        "step_time_ns": {"mean": float(st["step_ns"].mean()) if len(st) else None,
                         "max": int(st["step_ns"].max()) if len(st) else None,
                         "job_mean": float(v.mean()) if len(v) else None,
                         # `retime replay`'s figure: the slowest rank's mean step
                         "slowest_rank_mean": float(per_rank["mean"].max()) if len(per_rank)
                         else None},
        "per_rank": [{"rank": int(r), "steps": int(n), "mean_step_ns": float(m),
                      "max_step_ns": int(x)} for r, n, m, x in per_rank.itertuples()],
        # one row per step: the slowest rank's window (the job's step), and the spread of
        # those rows (relative standard deviation, as the report's headline)
        "job_steps": [{"step": int(k), "step_ns": int(x)} for k, x in job.items()],
        "step_spread": spread,
        "empty_steps": [] if es is None else _records(es),
        "breakdown": {
            "total_ns": {p: int(bd[p].sum()) for p in PARTS} | {"step_ns": tot},
            "total_frac": {p.replace("_ns", "_frac"): (bd[p].sum() / tot if tot else None)
                           for p in PARTS},
            "per_rank": _records(res["breakdown_summary"]),
            # --by step: one row per rank and step (its window, time and parts);
            # --by rank: one row per rank, its steps' sums (``steps`` of them)
            "rows": _records(bd),
        },
        "top_ops": _records(res["top_ops"]),
        "unclassified": _records(res["unclassified"]),
        # GPU work the step figures leave out or the trace cannot show (analysis.coverage)
        "unseen": res["unseen"] | {"hidden_in_graph_replays": hides_gpu_work(res["unseen"])},
        "notes": unseen_notes(res["unseen"]),
        "comm": _records(res["comm"]),
        # instances without every group member in the trace (or lone ops): no wait or skew
        "comm_unmatched": _records(res["comm_unmatched"]),
        "rank_wait": _records(res["rank_wait"]),
    }


_ROWS_SHOWN = 40


def _top_shown(n: int) -> int:
    """How many rows of a long list the text output shows."""
    return min(n, 10)


def _say_rows(s: dict[str, Any]) -> None:
    """The breakdown rows: per rank and step (``--by step``) or per rank (``--by rank``)."""
    from retime.analysis.breakdown import PARTS

    rows = s["breakdown"]["rows"]
    per_step = s["by"] == "step"
    say(f"  {'per step' if per_step else 'per rank (mean over its steps)'}: " + " ".join(
        f"{p.removesuffix('_ns')}" for p in PARTS) + " (ms)")
    for r in rows[:_ROWS_SHOWN]:
        n = 1 if per_step else max(int(r["steps"]), 1)
        step = "whole trace" if r["step"] < 0 else f"step {r['step']:>6}"
        head = (f"rank {r['rank']:>4} {step}" if per_step else
                f"rank {r['rank']:>4} ({n} step{'s' if n != 1 else ''})")
        say(f"    {head}: {r['step_ns'] / n / 1e6:10.3f} ms = " + " + ".join(
            f"{r[p] / n / 1e6:.3f}" for p in PARTS))
    if len(rows) > _ROWS_SHOWN:
        say(f"    ... {len(rows) - _ROWS_SHOWN} more rows (all of them in --json)")


@app.command("analyze")
def analyze_cmd(
    trace_dir: Annotated[Path, typer.Argument(help="A NAME.retime directory.", exists=True,
                                              file_okay=False)],
    stream: Annotated[bool | None, typer.Option(
        "--stream/--no-stream",
        help="Read a batch of ranks at a time (memory bounded by the batch) or load the "
             "trace; default: stream rank-partitioned and very large stores.")] = None,
    by: Annotated[By, typer.Option("--by", help="Breakdown per step or per rank, the "
                                   "step/phase/module/operator/kernel attribution tree, or the "
                                   "roofline per operator.")] = By.step,
    top: Annotated[int, typer.Option("--top", min=1, help="Top ops by total device time.")] = 10,
    batch_rows: Annotated[int, typer.Option("--batch-rows", min=1,
                                            help="Ops per batch of ranks when streaming.")] = 1 << 21,
    hardware: Annotated[str | None, typer.Option(
        "--hardware", help="With --by roofline: the GPU profile whose peaks to compare with "
                           "(default: the one the trace names).")] = None,
    scheduler: Annotated[str | None, typer.Option(
        "--scheduler", help="Run the per-rank analysis on a Dask cluster (tcp://host:8786), "
                            "one task per rank of a rank-partitioned store; the workers must "
                            "see the store at the same path.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Step times, time breakdown (compute / overlapped and exposed communication / memcpy /
    host-bound / idle), top ops and communication statistics of a stored trace.

    A store of thousands of ranks (e.g. from `retime ingest --scheduler`) is analyzed a
    batch of ranks at a time, without loading it whole; the figures equal the in-memory ones.
    """
    if scheduler is not None and (stream is False or by in (By.hierarchy, By.roofline)):
        raise RetimeError("--scheduler runs the streamed per-step/per-rank analysis: drop "
                          "--no-stream (and --by hierarchy/roofline) or drop --scheduler")
    if by in (By.hierarchy, By.roofline):
        from retime.cmd_hierarchy import analyze_hierarchy, analyze_roofline
        if by == By.hierarchy:
            analyze_hierarchy(trace_dir, top=top, json_out=json_out)
        else:
            analyze_roofline(trace_dir, top=top, hardware=hardware, json_out=json_out)
        return
    from retime.analysis.stream import store_analysis

    res = store_analysis(trace_dir, stream=stream, by=by.value, top=top, batch_rows=batch_rows,
                         scheduler=scheduler)
    s = analysis_summary(res)
    from pathlib import Path

    from retime.analysis.coverage import profiler_notes
    from retime.collectors.trace import read_meta
    # a trace recorded with Python stack tracing: its host-bound share is partly the profiler's
    s["notes"] = s["notes"] + profiler_notes(read_meta(Path(trace_dir)),
                                             s["breakdown"]["total_frac"].get("host_bound_frac"))
    idle = s["breakdown"]["total_frac"].get("idle_frac")
    if s["mode"] != "stream" and idle and idle >= 0.02:  # what the idle time is made of
        from retime.analysis.coverage import idle_notes
        from retime.collectors.trace import read_trace
        s["notes"] = s["notes"] + idle_notes(read_trace(Path(trace_dir)), idle,
                                             s["breakdown"]["total_ns"]["step_ns"])
    if json_out:
        emit_json(s)
        return
    st = s["step_time_ns"]
    js = s["job_steps"]
    which = ("whole trace, slowest rank" if len(js) == 1 and js[0]["step"] < 0 else
             f"mean of {len(js)} step(s), slowest rank each")
    if len(js) > 1 and st.get("slowest_rank_mean") is not None:
        which += (f"; the slowest rank's mean step, `retime replay`'s figure: "
                  f"{st['slowest_rank_mean'] / 1e6:.3f} ms")
    say(f"{trace_dir}: {s['ranks']} rank(s), analyzed {'streamed' if s['mode'] == 'stream' else 'in memory'}; "
        f"step time {(st['job_mean'] or 0) / 1e6:.3f} ms ({which}), "
        f"max {(st['max'] or 0) / 1e6:.3f} ms"
        + (f"; mean over ranks and steps {(st['mean'] or 0) / 1e6:.3f} ms"
           if s["ranks"] > 1 else ""))
    if s["step_spread"] is not None:
        say(f"  {len(s['job_steps'])} steps, step-to-step spread {100 * s['step_spread']:.1f}% "
            f"(relative standard deviation of the slowest rank's step times)")
    if s["empty_steps"]:
        say(f"  {len(s['empty_steps'])} empty profiler step(s) (no ops) left out: " + ", ".join(
            f"rank {r['rank']} step {r['step']}" for r in s["empty_steps"][:8]))
    for note in s["notes"]:
        say(f"  note: {note}")
    fr = s["breakdown"]["total_frac"]
    say("  breakdown: " + ", ".join(f"{k.removesuffix('_frac')} {100 * v:.1f}%"
                                    for k, v in fr.items() if v is not None))
    _say_rows(s)
    say(f"  top {len(s['top_ops'])} ops by total device time:" if s["top_ops"] else
        "  no device ops in the trace (CPU only): no top ops by device time")
    for r in s["top_ops"]:
        say(f"    {r['total_ns'] / 1e6:10.3f} ms  {100 * r['share']:5.1f}%  x{r['count']:<7d} "
            f"{r['kernel_class']:<13s} {str(r['name'])[:80]}")
    if s["unclassified"]:
        say(f"  unclassified kernels (no rule of the kernel-class table knows them; "
            f"class 'other'): {len(s['unclassified'])} shown")
        for r in s["unclassified"]:
            say(f"    {r['total_ns'] / 1e6:10.3f} ms  {100 * r['share']:5.1f}%  x{r['count']:<7d} "
                f"{str(r['name'])[:100]}")
    for r in s["comm"][:10]:
        bw = r["busbw_gbps"]
        wait = ("wait n/a (no matched instance)" if r["wait_ns"] is None else
                f"wait {r['wait_ns'] / 1e6:.3f} ms over {r['matched']} matched")
        size = ("size unknown" if r["total_bytes"] is None else
                f"{r['total_bytes'] / 1e6:.1f} MB")
        say(f"  comm group {r['group_id']} {r['comm_op']}: {r['instances']} instance(s), "
            f"{size}, busbw {'n/a' if bw is None else _gbps(bw)}, {wait}")
    if len(s["comm"]) > 10:
        say(f"    ... {len(s['comm']) - 10} more group/primitive rows (all of them in --json)")
    un = s["comm_unmatched"]
    has_steps = any(r["step"] >= 0 for r in s["breakdown"]["rows"])
    if un:
        say(f"  unmatched collective instances (left out of wait and skew): {len(un)}")
        for r in un[:_top_shown(len(un))]:
            size = ("size unknown" if r["bytes"] <= 0 else f"{int(r['bytes'])} B"
                    if r["bytes"] < 1000 else f"{r['bytes'] / 1e6:.3f} MB")
            when = (f"step {r['step']}" if r["step"] >= 0 else "outside every step"
                    if has_steps else "whole trace")
            say(f"    {r['comm_op']} group {r['group_id']} {when}: {size}, "
                f"{r['reason']}")
