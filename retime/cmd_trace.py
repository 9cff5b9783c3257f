"""CLI: ``retime ingest``, ``retime info``, ``retime export``."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from retime.cli import FORCE_HELP, app, check_output, emit_json, say, skip_exit_collection
from retime.collectors.enums import LaneKind, OpKind
from retime.collectors.errors import RetimeError

if TYPE_CHECKING:
    from retime.collectors.trace import Trace


class Format(str, Enum):
    auto = "auto"
    kineto = "kineto"
    nsys = "nsys"
    oplevel = "oplevel"


def ingest_summary(trace: Trace) -> dict:
    """The `retime ingest --json` object (DESIGN.md §6)."""
    return _summary(trace.meta, [int(r) for r in trace.ranks], trace.world_size, trace.n_ops,
                    len(trace.edges), len(trace.ranges))


def _summary(meta: dict, ranks: list[int], world_size: int, n_ops: int, n_edges: int,
             n_ranges: int) -> dict:
    acc = meta.get("accounting", {})
    dropped: dict[str, int] = {}
    coerced: dict[str, int] = {}
    events = 0
    for rec in acc.values():
        events += int(rec.get("events_read", 0))
        for k, v in rec.get("dropped", {}).items():
            dropped[k] = dropped.get(k, 0) + int(v)
        for k, v in (rec.get("coerced") or {}).items():  # known format drift, decoded
            coerced[k] = coerced.get(k, 0) + int(v)
    colls = meta.get("collectives", {})
    return {
        "ranks": ranks,
        "world_size": world_size,
        "events_read": events,
        "ops": n_ops,
        "edges": n_edges,
        "ranges": n_ranges,
        "dropped": dropped,
        "coerced": coerced,
        "collectives": {"matched": int(colls.get("matched", 0)),
                        "unmatched": int(colls.get("unmatched", 0)),
                        "unmatched_reasons": colls.get("unmatched_reasons", {})},
        "sources": [s.get("path") for s in meta.get("sources", [])],
        "skipped_files": meta.get("skipped_files", {}),
    }


class Layout(str, Enum):
    single = "single"
    rank = "rank"


@app.command()
def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Trace files or folders of them.",
                                                exists=True)],
    output: Annotated[Path, typer.Option("-o", "--output", help="Output NAME.retime directory.")],
    format: Annotated[Format, typer.Option("--format", help="Input format; auto detects by content.")] = Format.auto,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", min=1, help="Parse and write ranks in N processes (default: the cores this process may use).")] = None,
    scheduler: Annotated[str | None, typer.Option("--scheduler", help="Parse Kineto ranks on a Dask cluster (tcp://host:8786); the workers must see the files at the same paths.")] = None,
    layout: Annotated[Layout | None, typer.Option("--layout", help="Store layout: one file per table (single) or per rank (rank; thousands of ranks, streamed analysis). Default: rank with --scheduler, else single.")] = None,
    in_memory: Annotated[bool, typer.Option(
        "--in-memory", help="Kineto: parse every rank and merge them in memory before "
                            "writing (the store is the same; memory grows with the ranks). "
                            "By default each rank is written as soon as the collectives "
                            "are matched, a few ranks in memory at a time.")] = False,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Read traces (Kineto JSON, nsys SQLite, op-level Parquet) into one NAME.retime store.

    Every input event is accounted for: kept in a table or dropped with a counted reason
    (see `retime info`). Collectives are matched across ranks into cross-rank instances.
    With --scheduler the Dask workers parse the rank files and write their ranks' parts of
    a rank-partitioned store themselves (the trace is never gathered here).
    """
    check_output(output, force, store=True)
    lay = (layout or (Layout.rank if scheduler is not None else Layout.single)).value
    if scheduler is not None and lay == "rank":
        from retime.collectors.distributed import ingest_distributed
        r = ingest_distributed([str(p) for p in paths], scheduler, output,
                               format=format.value)
    elif scheduler is not None:
        from retime.collectors.distributed import read_distributed
        trace = read_distributed([str(p) for p in paths], scheduler, format=format.value)
        trace.save(output, layout=lay)
        r = {"meta": trace.meta, "ranks": [int(x) for x in trace.ranks],
             "world_size": trace.world_size, "ops": trace.n_ops, "edges": len(trace.edges),
             "ranges": len(trace.ranges)}
    else:
        from retime.collectors.ingest import ingest as ingest_paths
        r = ingest_paths([str(p) for p in paths], output, format=format.value, layout=lay,
                         jobs=jobs, in_memory=in_memory)
    s = _summary(r["meta"], r["ranks"], r["world_size"], r["ops"], r["edges"], r["ranges"])
    s["layout"] = lay
    s["output"] = str(output)
    if json_out:
        emit_json(s)
    else:
        say(f"wrote {output}: {s['ops']} ops on {len(s['ranks'])} rank(s), {s['edges']} edges, "
            f"{s['events_read']} events read, dropped {sum(s['dropped'].values())} "
            f"({', '.join(f'{k}: {v}' for k, v in s['dropped'].items()) or 'none'}); "
            f"collectives matched {s['collectives']['matched']}, "
            f"unmatched {s['collectives']['unmatched']}")
        if s["coerced"]:
            say("  decoded from known format drift: "
                + ", ".join(f"{k}: {v}" for k, v in s["coerced"].items()))
        if s["skipped_files"]:
            say(f"  skipped {len(s['skipped_files'])} file(s): "
                + "; ".join(f"{Path(k).name} ({v})" for k, v in
                            list(s["skipped_files"].items())[:5]))
    skip_exit_collection()  # the store is written and closed: end without a last collection


def _empty_steps(es) -> list[dict]:
    """Profiler steps without ops (no window; every command leaves them out)."""
    return [{"rank": int(r.rank), "step": int(r.step), "dur_ns": int(r.end_ns - r.start_ns)}
            for r in es.itertuples()]


def _streamed_empty_steps(path: Path):
    """:func:`collectors.steps.empty_steps` of a rank-partitioned store, a batch of ranks at
    a time (their step ranges against the (rank, step) pairs their ops have)."""
    import pandas as pd

    from retime.analysis.stream import iter_rank_traces
    from retime.collectors.steps import empty_steps

    parts = [empty_steps(t) for t in iter_rank_traces(path, columns=["rank", "step"],
                                                      ranges=True)]
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        {"rank": [], "step": [], "start_ns": [], "end_ns": []})


def info_summary(trace: Trace) -> dict:
    import numpy as np

    from retime.collectors.steps import empty_steps

    o = trace.ops
    kinds = np.bincount(o["kind"].to_numpy(), minlength=len(OpKind)) if len(o) else np.zeros(len(OpKind), int)
    lk = trace.lanes["lane_kind"].to_numpy()
    st = trace.step_times_ns()
    s = ingest_summary(trace)
    s.update({
        "schema_version": trace.meta.get("schema_version"),
        "source_format": trace.meta.get("source_format"),
        "ops_by_kind": {k.name: int(kinds[k]) for k in OpKind if kinds[k]},
        "lanes": {k.name: int((lk == k).sum()) for k in LaneKind if (lk == k).any()},
        "groups": len(trace.groups),
        "steps": sorted({int(x) for x in np.unique(o["step"].to_numpy()) if x >= 0}) if len(o) else [],
        "empty_steps": _empty_steps(empty_steps(trace)),
        "span_ns": [{"rank": int(r.rank), "span_ns": int(r.span_ns)} for r in st.itertuples()],
        "devices": trace.meta.get("devices", {}),
        "accounting": trace.meta.get("accounting", {}),
    })
    return s


def info_summary_streamed(path: Path) -> dict:
    """:func:`info_summary` of a stored trace without loading its per-rank tables (ops by
    kind and step and rank spans streamed, counts from the partition metadata)."""
    from retime.collectors.store import op_totals, rank_spans, read_small_tables
    from retime.collectors.trace import SCHEMA_VERSION

    small = read_small_tables(path)
    meta = {k: v for k, v in small["meta"].items() if k not in ("layout", "partitions")}
    meta["schema_version"] = SCHEMA_VERSION
    parts = small["meta"].get("partitions", {})
    ranks = sorted({int(r) for r in small["lanes"]["rank"].to_numpy()})
    ws = int(meta.get("world_size") or (max(ranks) + 1 if ranks else 0))
    n = {t: sum(int(v) for v in parts.get(t, {}).values()) for t in ("ops", "edges", "ranges")}
    s = _summary(meta, ranks, ws, n["ops"], n["edges"], n["ranges"])
    kinds = op_totals(path, by=["kind"])
    steps = op_totals(path, by=["step"])
    lk = small["lanes"]["lane_kind"].to_numpy()
    s.update({
        "schema_version": SCHEMA_VERSION,
        "source_format": meta.get("source_format"),
        "ops_by_kind": {OpKind(int(k)).name: int(c) for k, c in
                        zip(kinds["kind"], kinds["ops"], strict=True) if c},
        "lanes": {k.name: int((lk == k).sum()) for k in LaneKind if (lk == k).any()},
        "groups": len(small["groups"]),
        "steps": sorted(int(x) for x in steps["step"] if x >= 0),
        "empty_steps": _empty_steps(_streamed_empty_steps(path)),
        "span_ns": [{"rank": int(r.rank), "span_ns": int(r.span_ns)}
                    for r in rank_spans(path).itertuples()],
        "devices": meta.get("devices", {}),
        "accounting": meta.get("accounting", {}),
    })
    return s


@app.command()
def info(
    trace_dir: Annotated[Path, typer.Argument(help="A NAME.retime directory.", exists=True,
                                              file_okay=False)],
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Summarize a stored trace: ranks, ops by kind, lanes, steps, accounting.

    A rank-partitioned store is summarized from its metadata and streamed scans (it is not
    loaded whole)."""
    from retime.collectors.store import store_layout

    if store_layout(trace_dir) == "rank":
        s = info_summary_streamed(trace_dir)
    else:
        from retime.collectors.trace import read_trace
        s = info_summary(read_trace(trace_dir))
    if json_out:
        emit_json(s)
        return
    say(f"{trace_dir}: schema v{s['schema_version']}, format {s['source_format']}, "
        f"world size {s['world_size']}, ranks {s['ranks'][:16]}{' ...' if len(s['ranks']) > 16 else ''}")
    say(f"  ops {s['ops']} ({', '.join(f'{k}={v}' for k, v in s['ops_by_kind'].items())}); "
        f"edges {s['edges']}; ranges {s['ranges']}; groups {s['groups']}")
    st = s["steps"]
    steps_txt = (f" ({len(st)}): {st}" if 0 < len(st) <= 20 else
                 f" ({len(st)}): {st[:10]} ... {st[-3:]}" if st else
                 ": none marked (no step markers: the whole trace as one window)")
    say(f"  lanes: {', '.join(f'{k}={v}' for k, v in s['lanes'].items())}; steps{steps_txt}")
    if s["empty_steps"]:
        say("  empty profiler steps (no ops; no command counts them): " + ", ".join(
            f"rank {r['rank']} step {r['step']} ({r['dur_ns'] / 1e3:.0f} us)"
            for r in s["empty_steps"][:8]))
    say(f"  collectives matched {s['collectives']['matched']}, unmatched {s['collectives']['unmatched']}")
    for r in s["span_ns"][:16]:
        say(f"  rank {r['rank']}: span {r['span_ns'] / 1e6:.3f} ms")
    say(f"  events read {s['events_read']}; dropped: "
        f"{', '.join(f'{k}={v}' for k, v in s['dropped'].items()) or 'none'}")


class Timelines(str, Enum):
    both = "both"
    measured = "measured"
    replayed = "replayed"


@app.command()
def export(
    trace_dir: Annotated[Path, typer.Argument(help="A NAME.retime directory.", exists=True,
                                              file_okay=False)],
    chrome: Annotated[Path | None, typer.Option("--chrome", help="Write a Chrome/Perfetto JSON "
                                                "here (.json or .json.gz).",
                                                dir_okay=False)] = None,
    chakra: Annotated[Path | None, typer.Option(
        "--chakra", help="Write one MLCommons Chakra ET file per rank into this folder.",
        file_okay=False)] = None,
    scenario: Annotated[Path | None, typer.Option("--scenario", help="What-if scenario TOML: "
                                                  "export its replayed timeline too.",
                                                  exists=True, dir_okay=False)] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="What-if key=value (repeatable; "
                                                   "on top of --scenario).")] = None,
    ideal: Annotated[bool, typer.Option("--ideal", help="Replay without unexplained delays "
                                        "and export that timeline too.")] = False,
    timelines: Annotated[Timelines, typer.Option("--timelines", help="With a what-if: which "
                                                 "timelines to write.")] = Timelines.both,
    flows: Annotated[bool, typer.Option("--flows/--no-flows", help="Dependency and collective "
                                        "arrows (flow events).")] = True,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Export a trace as Chrome trace JSON for Perfetto / chrome://tracing (--chrome), or as
    Chakra execution traces (--chakra: one protobuf .et file per rank) for ASTRA-sim.

    Ops on one track per lane and rank, annotation ranges as slices on their threads,
    launches, synchronizations, data and point-to-point dependencies and collective waits as
    arrows, the critical path marked (its ops tagged, and a "critical path" track on top).
    With --scenario/--set/--ideal the what-if's replayed timeline is written beside the
    measured one (ranks named "rank R (replayed: ...)"), so either can be pinned or hidden.
    """
    if chakra is not None or chrome is None:
        from retime.cmd_chakra import export_chakra
        export_chakra(trace_dir, chakra, chrome, force=force, json_out=json_out)
        return
    from retime.analysis.critical_path import critical_path
    from retime.collectors.chrome import Timeline, write_chrome
    from retime.collectors.trace import read_trace

    if not chrome.name.endswith((".json", ".json.gz")):
        raise RetimeError(
            f"--chrome {chrome}: write a .json or .json.gz file (what Perfetto opens and what "
            "`retime ingest` reads back, also from a folder); e.g. "
            f"--chrome {chrome.with_suffix('').name or 'trace'}.json")
    check_output(chrome, force)
    trace = read_trace(trace_dir)
    whatif_given = scenario is not None or bool(set_) or ideal
    if not whatif_given and timelines != Timelines.both:
        raise RetimeError("--timelines needs a what-if (--scenario, --set or --ideal); without "
                          "one only the trace's own timeline is written")
    also: tuple = ()
    main = trace
    main_crit = None
    label = ""
    if whatif_given:
        from retime.replay import whatif
        from retime.replay.policies.scenario import scenario_from_cli
        sc = scenario_from_cli(scenario, set_) if (scenario is not None or set_) else {}
        result = whatif(trace, sc, ideal=ideal)
        pols = result.meta.get("scenario") or []
        label = "replayed: " + (", ".join(f"{p.get('policy')}.{k}={v}" for p in pols
                                          for k, v in p.items() if k != "policy")
                                or ("ideal" if ideal else "identity"))
        replayed = Timeline(result.to_trace(), label=label,
                            critical_op_ids=critical_path(result)["op_id"].to_numpy(),
                            replayed=True)
        if timelines == Timelines.replayed:
            main, main_crit = replayed.trace, replayed.critical_op_ids
        else:
            main_crit = critical_path(trace)["op_id"].to_numpy()
            also = (replayed,) if timelines == Timelines.both else ()
    else:
        main_crit = critical_path(trace)["op_id"].to_numpy()
    n = write_chrome(main, chrome, critical_op_ids=main_crit, flows=flows, also=also)
    if json_out:
        emit_json({"output": str(chrome), "events": n,
                   "timelines": ["measured"] * (main is trace) + [label] * (bool(also) or
                                                                       main is not trace)})
    else:
        say(f"wrote {chrome}: {n} events (open in https://ui.perfetto.dev or chrome://tracing)")
