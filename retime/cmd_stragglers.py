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
    say(f"{trace_dir}: {len(st)} step(s); mean step time measured {mean['measured']:.4f} s, "
        f"simulated {mean['simulated']:.4f} s, ideal {mean['ideal']:.4f} s; slowdown "
        f"{res['slowdown']:.4f}x")
    longest = max(st, key=lambda k: st[k]["measured"])
    say(f"  measured step = its first op start on any rank to its last end on any rank (the "
        f"job's window; longest: step {longest}, {st[longest]['measured']:.4f} s). `retime "
        "analyze`/`report` show each rank's own window instead, shorter where ranks start a "
        "step apart")
    for key, title in (("by_stage", "stage"), ("by_dp_rank", "DP rank"), ("by_optype", "op type")):
        top = list(res[key].items())[:8]
        more = len(res[key]) - len(top)
        say(f"  by {title}: " + ", ".join(f"{k} {v:.4f}" for k, v in top)
            + (f" (and {more} more, all of them in --json)" if more > 0 else ""))
