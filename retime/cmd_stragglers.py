"""CLI: ``retime stragglers RUN.retime [--json]`` (what-if attribution of slowdown)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from retime.cli import app, emit_json, say


@app.command("stragglers")
def stragglers_cmd(
    trace_dir: Annotated[Path, typer.Argument(help="A NAME.retime directory.", exists=True,
                                              file_okay=False)],
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Refuse a trace whose dependency "
                                         "graph has a cycle instead of relaxing the fewest "
                                         "cross-rank links on it.")] = False,
) -> None:
    """Attribute the run's slowdown to stages, DP ranks and op types by what-if replays.

    Per step: measured time, simulated time without unexplained delays, and ideal time
    with every op at its ideal duration (compute: mean of its op type; communication: median
    transfer time). slowdown = mean simulated / mean ideal; each group's figure is the mean
    step time when only that group keeps its measured durations, over the mean ideal.
    """
    from retime.collectors.trace import read_trace
    from retime.replay.policies.stragglers import straggler_analysis

    res = straggler_analysis(read_trace(trace_dir), strict=strict)
    if json_out:
        emit_json({**res, "step_time_s": {str(k): v for k, v in res["step_time_s"].items()}})
        return
    st = res["step_time_s"]
    if res["relaxed"]["count"]:
        say(f"{trace_dir}: dependency cycle(s) broken by relaxing {res['relaxed']['count']} "
            "cross-rank link(s) (see --json 'relaxed'; --strict refuses instead)")
    mean = {k: sum(v[k] for v in st.values()) / len(st) for k in ("measured", "simulated", "ideal")}
    unmarked = list(st) == [-1] or list(st) == ["-1"]
    count = ("no step markers: the whole trace as one window" if unmarked
             else f"{len(st)} step(s)")
    say(f"{trace_dir}: {count}; mean step time measured {mean['measured']:.4f} s, "
        f"simulated {mean['simulated']:.4f} s, ideal {mean['ideal']:.4f} s; slowdown "
        f"{res['slowdown']:.4f}x (simulated / ideal)")
    longest = max(st, key=lambda k: st[k]["measured"])
    say("  measured = the step as recorded, its first op start on any rank to its last end "
        "on any rank (the job's window" + ("" if unmarked else
                                          f"; longest: step {longest}, "
                                          f"{st[longest]['measured']:.4f} s")
        + "). `retime analyze`/`report` show each rank's own window instead, shorter where "
        "ranks start a step apart")
    gap = mean["measured"] - mean["simulated"]
    say("  simulated = the same ops replayed from the step's measured start at their measured "
        "durations (a collective at its transfer time: its end minus its last member's "
        "start) with no unexplained delay (gaps no dependency explains dropped); measured - "
        f"simulated = {gap * 1e3:.3f} ms of such delays and waits for late ranks")
    say("  ideal = the same replay with every op at its ideal duration (the same op on the "
        "other ranks: their median; op-level traces: compute at the mean, communication at "
        "the median transfer time of its op type); each group below: the step with only "
        "that group back at its measured durations, over ideal")
    for key, title in (("by_stage", "stage"), ("by_dp_rank", "DP rank"), ("by_optype", "op type")):
        top = list(res[key].items())[:8]
        more = len(res[key]) - len(top)
        say(f"  by {title}: " + ", ".join(f"{k} {v:.4f}" for k, v in top)
            + (f" (and {more} more, all of them in --json)" if more > 0 else ""))
