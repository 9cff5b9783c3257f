"""CLI: ``retime replay`` (identity replay today; what-if scenarios plug in here later)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from retime.cli import FORCE_HELP, app, check_output, emit_json, keep_freed_memory, say
from retime.collectors.errors import PolicyError


def sc_keys(scenario: Path | None, sets: list[str] | None) -> set[str]:
    """The dotted keys the user gave (scenario file and --set)."""
    from retime.replay.policies.scenario import load_scenario, parse_set
    keys = set(parse_set(sets))
    if scenario is not None:
        keys |= set(load_scenario(scenario).to_dict())
    return keys


def refined_keys(cl, ref, trace, user_keys: set[str]):
    """The cluster's what-if keys on ``trace``, with a calibration's measured efficiency
    (``ref``, :func:`retime.replay.policies.cluster_cal.refine`) where it applies; and the
    ``measured:`` / ``assumed:`` lines that say so."""
    import dataclasses

    from retime.replay.policies.cluster_cal import refine_keys
    from retime.replay.policies.scenario import cluster_keys

    ck = cluster_keys(cl, trace)
    extra, user_lines = refine_keys(ref, ck.keys, user_keys)
    out = []
    for x in ref.lines:
        if x.startswith("measured:") and (not extra or user_lines):
            if not user_lines:  # the cluster leaves that level's rate out on this trace
                out.append(f"assumed: the calibration's {ref.level} efficiency is not used: "
                           f"the cluster does not re-time the trace's {ref.level} link")
            continue
        out.append(x)
    return dataclasses.replace(ck, keys={**ck.keys, **extra}), out + user_lines


@app.command("replay")
def replay_cmd(
    trace_dir: Annotated[Path, typer.Argument(help="A NAME.retime directory.", exists=True,
                                              file_okay=False)],
    ideal: Annotated[bool, typer.Option("--ideal", help="Drop unexplained delays (gaps no "
                                        "dependency explains) instead of keeping them.")] = False,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the replayed "
                                                "trace here (NAME.retime).")] = None,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
    scenario: Annotated[Path | None, typer.Option("--scenario", help="What-if scenario TOML "
                                                  "(one [table] per policy).", exists=True,
                                                  dir_okay=False)] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="What-if key=value, e.g. "
                                                   "network.inter_node_gbps=25 (repeatable; "
                                                   "applied on top of --scenario).")] = None,
    cluster: Annotated[Path | None, typer.Option(
        "--cluster", exists=True, dir_okay=False,
        help="Cluster TOML (`retime cost cluster --preset NAME -o F.toml`) to replay the run "
             "on. It sets hardware.gpu (its GPU profile), topology.ranks_per_node (GPUs per "
             "NVLink domain), network.intra_node_gbps and network.inter_node_gbps (NICs per "
             "node x Gbit/s per NIC / 8 / GPUs per node); --scenario and --set win for the "
             "same key. A synthesized run is re-synthesized on it.")] = None,
    calibration: Annotated[Path | None, typer.Option(
        "--calibration", exists=True, dir_okay=False,
        help="A calibration file from `retime calibrate` (measured collective latency over "
             "sizes; how transfers share the CPU with compute): used where the trace alone "
             "cannot tell (parallel.tp on a CPU run prices its gloo all-reduces by it). "
             "With --cluster it must have been measured on that cluster "
             "(`retime calibrate --cluster F`; another cluster's: exit 2), and its measured "
             "efficiency replaces the model's for the level it measured "
             "(network.intra_bus_efficiency / inter_bus_efficiency; --set wins; nccl "
             "calibrations only).")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Refuse a trace whose dependency "
                                         "graph has a cycle instead of relaxing the fewest "
                                         "cross-rank links on it.")] = False,
    all_columns: Annotated[bool, typer.Option(
        "--all-columns", hidden=True,
        help="Read every ops column, not only those the replay needs (what the projected "
             "read is checked against).")] = False,
    window_ops: Annotated[int | None, typer.Option(
        "--window-ops", hidden=True, min=1,
        help="Ops per window of a windowed (identity) replay (default "
             "replay.window.WINDOW_OPS).")] = None,
) -> None:
    """Replay a trace through the dependency model and compare step times per rank.

    Without a scenario the replay reproduces the measured timeline (identity); --ideal
    drops the delays no dependency explains. With -o the replayed trace is written, so
    `retime export OUT.retime --chrome t.json` shows the replayed timeline. An identity
    replay of a --layout rank store (without -o or --calibration) reads it a window at a
    time and spills the edges and results to a temporary directory (TMPDIR).
    """
    import pandas as pd

    from retime.collectors.trace import read_trace
    from retime.replay import build_graph, simulate, whatif

    if output is not None:
        check_output(output, force, store=True)
    # the keys and the calibration file are checked before the trace is read: a bad value
    # is refused at once, not after loading a large store
    from retime.replay.policies.scenario import scenario_from_cli
    if scenario is not None or set_:
        # and what the store's metadata already tells (replay/admission.py): a what-if the
        # policies would refuse on this trace is refused before it is loaded
        from retime.replay.admission import refuse_early
        refuse_early(trace_dir, scenario_from_cli(scenario, set_))
    cal = None
    if calibration is not None:
        from retime.collectors.calibrate import read_calibration
        cal = read_calibration(calibration)
    cl = ref = None
    if cluster is not None:
        from retime.collectors.costs import read_cluster
        from retime.replay.policies.cluster_cal import refine
        cl = read_cluster(cluster)
        ref = refine(cl, cal)  # a calibration of another cluster is refused here
    # a replay reads only the ops columns it needs (replay/projection.py): an identity
    # replay the graph's and the step windows', a what-if those its keys (and the cluster's)
    # declare; -o adds the others afterwards. What it needs is said first (and refused when
    # the machine has less: replay/footprint.py)
    from retime.collectors.store import store_layout
    from retime.collectors.trace import OPS_SCHEMA
    from retime.replay.footprint import IDENTITY_COLUMNS, check_footprint
    from retime.replay.projection import complete_ops, replay_columns
    whatif_run = scenario is not None or bool(set_) or cluster is not None
    cols = None if all_columns else replay_columns(
        trace_dir, sc_keys(scenario, set_), cluster=cluster is not None,
        calibration=calibration is not None)
    # an identity replay without -o keeps only the ProfilerStep annotations (the step
    # windows' marks), drops the edges once the graph holds them, and reads no memory table
    light = not whatif_run and output is None and cols is not None
    # the memory table (allocator samples): written by -o, and read by the cache.* policies
    # (activation bytes for offloading and recompute; their memory estimates)
    memory = output is not None or any(
        k.startswith("cache.") for k in sc_keys(scenario, set_))
    # an identity replay without -o runs a window of the run at a time (replay/window.py);
    # a what-if's policies and -o's written trace need the whole graph
    windowed = not whatif_run and output is None
    # and, from a rank-partitioned store, reads its windows from the store without loading
    # the trace (replay/window_store.py); a calibration is attached to a loaded trace
    stream = windowed and light and cal is None and store_layout(trace_dir) == "rank"
    fp, need = check_footprint(trace_dir, full=not light, columns=cols, memory=memory,
                               windowed=windowed, streamed=stream)
    if not json_out:
        say(need)
    skip = () if memory else ("memory",)

    def load(columns):
        if columns is None:
            t = read_trace(trace_dir, skip=skip)
        else:
            t = read_trace(trace_dir, columns=list(columns), fill_defaults=False, skip=skip)
        if light and columns is not None:  # the step windows read only ProfilerStep ranges
            from retime.collectors.steps import step_range_mask
            t.ranges = t.ranges[step_range_mask(t.ranges, t.strings)].reset_index(drop=True)
        if cal is not None:  # also on a whole load (what-ifs read it: parallel.tp on CPU)
            from retime.collectors.calibrate import attach
            t = attach(t, cal)
        return t

    def replay_of(trace):
        ck = given = cal_lines = None
        if cl is not None:
            ck, cal_lines = refined_keys(cl, ref, trace, sc_keys(scenario, set_))
            given = sc_keys(scenario, set_) & set(ck.keys)  # the user's value wins for these
        if windowed:
            from retime.replay.window import windowed_replay
            res = windowed_replay(trace, ideal=ideal, **(
                {} if window_ops is None else {"window_ops": window_ops}))
            if res is not None:
                if light:  # (a copy, as below)
                    trace.edges = trace.edges.iloc[:0].copy()
                return res, ck, given, cal_lines
        if not whatif_run:
            g = build_graph(trace, ideal=ideal, strict=strict)
            if windowed and not json_out:  # (bad input was refused by the build, above)
                say(f"{trace_dir}: a window of the run has a dependency cycle (relaxing it "
                    "is a choice over the whole run): replaying the whole graph")
            if light:  # the graph holds what the edges said; nothing after this reads them
                # (a copy: ``iloc[:0]`` alone is a view that keeps every edge's arrays alive)
                trace.edges = trace.edges.iloc[:0].copy()
            return simulate(g), ck, given, cal_lines
        sc = scenario_from_cli(scenario, set_, ck.keys if ck else None)
        try:
            return whatif(trace, sc, ideal=ideal), ck, given, cal_lines
        except PolicyError as exc:
            key = str(exc).split(" ", 1)[0].split(":", 1)[0]
            if ck is None or key not in ck.keys or key in given:
                raise
            # a key the user did not type: say where it came from
            raise PolicyError(f"--cluster {cluster} sets {key}={ck.keys[key]}: {exc}") from exc

    from retime.replay import prediction_range
    result = trace = ck = given = cal_lines = None
    if stream:  # read a window at a time from the store; None: load it (replay_store says when)
        from retime.replay.window_store import replay_store
        keep_freed_memory()  # (see window_store.replay_store: no page faults per window)
        result = replay_store(trace_dir, ideal=ideal, **(
            {} if window_ops is None else {"window_ops": window_ops}))
    if result is None:
        trace = load(cols)
        result, ck, given, cal_lines = replay_of(trace)
    if "whatif" in result.meta:
        prediction_range(result)  # the range, before the summary and the saved trace
    filled: list[str] = []
    if output is not None:
        written = result.to_trace()
        if cols is not None:
            # (a re-synthesized run has every column: nothing is read for it)
            filled = [c for c in OPS_SCHEMA if c not in written.ops.columns]
            written = complete_ops(trace_dir, written, result.trace.ops, trace.ops)
        if written is None:  # the what-if re-laid out the ops from the columns read
            del result, trace
            cols, filled = None, []
            trace = load(None)
            result, ck, given, cal_lines = replay_of(trace)
            if "whatif" in result.meta:
                prediction_range(result)
            written = result.to_trace()
        written.save(output)
        del written
    s = result.summary()
    if "whatif" in result.meta:
        s["whatif"] = result.meta["whatif"]
        # "measured" is the input trace as recorded (a re-laid-out what-if has new ops)
        s["step_time_ns"]["measured"] = result.meta["whatif"]["baseline_measured_step_time_ns"]
        if "baseline_per_step_ns" in result.meta["whatif"]:
            s["step_time_ns"]["per_step"]["measured"] = result.meta["whatif"]["baseline_per_step_ns"]
        if "step_range_ns" in result.meta["whatif"]:
            s["step_time_ns"]["range"] = [int(x) for x in result.meta["whatif"]["step_range_ns"]]
    if ck is not None:
        s["cluster"] = ck.describe()
        s["cluster"]["overridden"] = sorted(given)
        if cal is not None:
            s["cluster"]["calibration"] = {"file": str(calibration), "level": ref.level,
                                           "lines": cal_lines}
    s["memory"] = {"estimated_peak_bytes": fp.peak_bytes,
                   # a windowed replay's largest window graph
                   "graph_bytes": (result.meta["graph_bytes"] if result.graph is None
                                   else result.graph.nbytes),
                   "windows": result.meta.get("windows", 1),
                   "columns": ("all" if cols is None else "identity" if cols == IDENTITY_COLUMNS
                               else list(cols))}
    if filled:  # read after the replay, for the written trace
        s["memory"]["output_columns"] = filled
    # GPU work the measured step figures leave out or the trace cannot show
    from retime.analysis.coverage import unseen_notes, unseen_work_by_rank
    # (the measured step windows the replay computed serve them too: not computed twice)
    w = result.step_windows() if not whatif_run else None
    s["notes"] = unseen_notes(result.meta["unseen"] if trace is None else unseen_work_by_rank(
        trace, None if w is None else pd.DataFrame({
            "rank": w["rank"].to_numpy(), "step": w["step"].to_numpy(),
            "start_ns": w["measured_start_ns"].to_numpy(),
            "end_ns": w["measured_end_ns"].to_numpy()})))
    if w is not None and len(w) and w["step"].nunique() > 1:
        # `analyze`/`report`/`compare`'s step time: per step the slowest rank, then the mean
        per = (w["measured_end_ns"] - w["measured_start_ns"]).groupby(w["step"]).max()
        s["step_time_ns"]["per_step"]["measured_mean_of_step_max"] = float(per.mean())
    del w
    if output is not None:
        s["output"] = str(output)
    if json_out:
        emit_json(s)
        return
    st = s["step_time_ns"]
    d = s["unexplained_delays"]
    rl = s["relaxed"]
    if rl["count"]:
        say(f"{trace_dir}: dependency cycle(s) broken by relaxing {rl['count']} cross-rank "
            f"link(s): collectives {rl['collectives'][:8]}"
            f"{' ...' if len(rl['collectives']) > 8 else ''}, edges {rl['edges'][:4]}"
            f"{' ...' if len(rl['edges']) > 4 else ''} (--strict refuses instead)")
    ps = st["per_step"]
    rng = st.get("range")
    alt = ps.get("measured_mean_of_step_max")
    say(f"{trace_dir}: step time (the slowest rank's mean step) measured "
        f"{ps['measured'] / 1e6:.3f} ms, {'what-if' if 'whatif' in s else 'replayed'} "
        f"{ps['replayed'] / 1e6:.3f} ms"
        + (f" (range {rng[0] / 1e6:.3f}-{rng[1] / 1e6:.3f} ms)" if rng else "")
        + (f" ({(ps['replayed'] / ps['measured'] - 1):+.1%})" if ps["measured"] else "")
        + (f"; `analyze`/`report`/`compare` give the mean of each step's slowest rank, "
           f"measured {alt / 1e6:.3f} ms" if alt is not None else ""))
    say(f"  whole trace: measured {st['measured'] / 1e6:.3f} ms, replayed "
        f"{st['replayed'] / 1e6:.3f} ms ({'ideal: ' if ideal else ''}{d['count']} unexplained "
        f"delays, {d['total_ns'] / 1e6:.3f} ms in all, {'dropped' if ideal else 'kept'})")
    gt = s.get("gaps", {}).get("total")
    if gt and gt.get("span_ns") and "whatif" not in s and \
            gt["host_work_ns"] + gt["unexplained_ns"] > gt["span_ns"]:
        # gaps on threads and streams that run side by side add up to more than the ranks'
        # time (nsys FastVideo: 86.9% + 16.8%): no shares of it, the amounts and why
        say(f"  host work the profiler did not cover {gt['host_work_ns'] / 1e6:.1f} ms (kept; "
            f"scales with host speed), unexplained delay {gt['unexplained_ns'] / 1e6:.1f} ms "
            f"(kept as measured): summed over every thread and stream, which run side by "
            f"side, so together more than the ranks' {gt['span_ns'] / 1e6:.1f} ms")
    elif gt and gt.get("span_ns") and "whatif" not in s:
        span = gt["span_ns"]
        say(f"  of the measured time, summed over ranks ({span / 1e6:.1f} ms): "
            f"{gt['host_work_ns'] / span:.1%} is host work the profiler did not cover (kept; "
            f"scales with host speed), {gt['unexplained_ns'] / span:.1%} is unexplained delay "
            f"(kept as measured); the rest, {1 - (gt['host_work_ns'] + gt['unexplained_ns']) / span:.1%}"
            ", is the traced ops and the waits between them, which the modelled dependencies "
            "re-derive")
    # a re-synthesized what-if replays the new synthesized trace: its per-rank figures are
    # that trace's own times, not the measured run's (the lines above compare with those)
    resyn = bool(s.get("whatif", {}).get("resynthesized"))
    if resyn and s["per_rank"]:
        say("  per rank: the re-synthesized what-if trace's own times, replayed")
    for r in s["per_rank"][:32]:
        err = (r["replayed_ns"] - r["measured_ns"]) / r["measured_ns"] if r["measured_ns"] else 0.0
        per = (f"; per step {r['measured_step_ns'] / 1e6:.3f} -> "
               f"{r['replayed_step_ns'] / 1e6:.3f} ms over {r['steps']} steps"
               if r["steps"] > 1 else "")
        say(f"  rank {r['rank']}: {'re-synthesized' if resyn else 'measured'} "
            f"{r['measured_ns'] / 1e6:.3f} ms, replayed {r['replayed_ns'] / 1e6:.3f} ms "
            f"({err:+.2%}{per})")
    if ck is not None:
        left: dict[str, list[str]] = {}
        for k, why in ck.left_out.items():
            left.setdefault(why, []).append(k)
        say(f"  cluster {ck.name} ({cluster}): "
            + ", ".join((f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}")
                        + (" (overridden)" if k in given else "") for k, v in ck.keys.items())
            + "".join(f"; {', '.join(ks)} left out: {why}" for why, ks in left.items()))
        for line in cal_lines:
            say(f"  {line}")
    for note in s.get("whatif", {}).get("assumed", []):
        say(f"  assumed: {note}")
    for note in s["notes"]:
        say(f"  note: {note}")
    if output is not None:
        say(f"wrote {output} (view with `retime export {output} --chrome OUT.json`)")
