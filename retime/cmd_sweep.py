"""CLI: ``retime sweep RUN.retime --grid GRID.toml -o SWEEP.parquet`` (DESIGN.md §6)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from retime.cli import FORCE_HELP, app, check_output, emit_json, say
from retime.collectors.errors import RetimeError

if TYPE_CHECKING:
    import pandas as pd


def write_sweep(df: pd.DataFrame, path: Path, *, steps: int = 1) -> None:
    """Write the sweep frame to ``path`` (Parquet, via a temporary file and a rename).

    ``steps``: the profiled steps of the swept trace, kept in the file's metadata
    (``retime.steps``): a row's ``step_time_ns`` is its replayed windows end to end, so a
    report shows it over this count, per step."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from retime.collectors.fsutil import atomic_output

    table = pa.Table.from_pandas(df, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                           b"retime": json.dumps({"steps": int(steps)})})
    with atomic_output(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def trace_steps(trace) -> int:
    """The profiled steps a sweep row's times span (distinct step ids; at least 1), as
    :func:`replay.sweep_metrics.scenario_metrics` counts them."""
    import numpy as np

    st = trace.ops["step"].to_numpy()
    return max(int(len(np.unique(st[st >= 0]))), 1)


def _jsonable_row(row: pd.Series) -> dict[str, Any]:
    import pandas as pd

    out: dict[str, Any] = {}
    for k, v in row.items():
        if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
            out[str(k)] = None
        elif hasattr(v, "item"):
            out[str(k)] = v.item()
        else:
            out[str(k)] = v
    return out


def sweep_summary(df: pd.DataFrame, total: int) -> dict[str, Any]:
    """Counts and the best scenario (shortest step time among those that ran)."""
    ok = df[df["error"].isna() & df["step_time_ns"].notna()]
    best = _jsonable_row(ok.loc[ok["step_time_ns"].astype("int64").idxmin()]) if len(ok) else None
    return {"scenarios": int(total), "completed": int(len(df)),
            "failed": int(df["error"].notna().sum()), "best": best}


def _check_keys(grid: Path, scenarios: list[dict]) -> None:
    """Refuse a grid naming a key no policy has before any scenario runs (each would fail
    alike, after the trace is read and the workers started)."""
    import dataclasses

    from retime.replay.policies.scenario import TABLES

    for key in dict.fromkeys(k for sc in scenarios for k in sc if k != "name"):
        table, _, fld = key.partition(".")
        if table not in TABLES:
            raise RetimeError(f"{grid}: key {key!r}: unknown table {table!r}; tables: "
                              f"{', '.join(TABLES)} (`retime keys` lists every key)")
        names = [f.name for f in dataclasses.fields(TABLES[table])]
        if fld not in names:
            raise RetimeError(f"{grid}: key {key!r}: unknown field {fld!r} of [{table}]; "
                              f"fields: {', '.join(names)} (`retime keys {table}` says what "
                              "each does)")


@app.command(name="sweep")
def sweep_cmd(
    trace_dir: Annotated[Path, typer.Argument(help="A NAME.retime directory.", exists=True,
                                              file_okay=False)],
    grid: Annotated[Path, typer.Option("--grid", help="Grid TOML: [grid] keys -> value lists "
                                       "and/or [[scenario]] entries.", exists=True,
                                       dir_okay=False)],
    output: Annotated[Path, typer.Option("-o", "--output", help="Output SWEEP.parquet.",
                                         dir_okay=False)],
    workers: Annotated[int | None, typer.Option("--workers", "-w", min=1, help="Local worker "
                                                "processes (default: the cores).")] = None,
    scheduler: Annotated[str | None, typer.Option("--scheduler", help="Dask scheduler address "
                                                  "(tcp://host:8786) instead of local workers.")]
    = None,
    calibration: Annotated[Path | None, typer.Option(
        "--calibration", exists=True, dir_okay=False,
        help="A calibration file from `retime calibrate`, used by every scenario. With "
             "--cluster it must have been measured on that cluster (else exit 2); its "
             "measured efficiency then replaces the model's for the level it measured (a "
             "grid key of the same name wins).")] = None,
    cluster: Annotated[Path | None, typer.Option(
        "--cluster", exists=True, dir_okay=False,
        help="Cluster TOML (`retime cost cluster --preset NAME -o F.toml`) every scenario runs "
             "on: it sets hardware.gpu, topology.ranks_per_node, network.intra_node_gbps and "
             "network.inter_node_gbps in each row (as `retime replay --cluster`); a grid key "
             "wins for the same key.")] = None,
    ranges: Annotated[bool, typer.Option(
        "--ranges/--no-ranges",
        help="Each row's step-time range (step_time_lo_ns, step_time_hi_ns), as `retime "
             "replay` prints it; a what-if with bounded assumptions is replayed again at "
             "their bounds. --no-ranges leaves them empty (faster).")] = True,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
    = False,
) -> None:
    """Replay every scenario of a grid; write one Parquet row per scenario.

    Rows hold the scenario's keys, step_time_ns with its range (step_time_lo_ns,
    step_time_hi_ns), tokens_per_s, mfu, peak_memory_bytes, exposed_comm_ns,
    bubble_fraction, oom and error (null when the scenario ran). A failed scenario is a row
    with its error; Ctrl-C writes the rows finished so far (exit 130).
    """
    if workers is not None and scheduler is not None:
        raise RetimeError("--workers and --scheduler exclude each other: give --workers N for "
                          "local processes or --scheduler ADDR for a Dask cluster")
    check_output(output, force)
    from retime.collectors.trace import read_trace
    from retime.replay.sweep import METRICS, SweepInterrupted, default_workers, read_grid, sweep

    scenarios = read_grid(grid)
    _check_keys(grid, scenarios)
    cal = ref = cl = None
    if calibration is not None:
        from retime.collectors.calibrate import read_calibration
        cal = read_calibration(calibration)
    if cluster is not None:
        from retime.collectors.costs import read_cluster
        from retime.replay.policies.cluster_cal import refine
        cl = read_cluster(cluster)
        ref = refine(cl, cal)  # a calibration of another cluster is refused before the trace
    trace = read_trace(trace_dir)
    if cal is not None:
        from retime.collectors.calibrate import attach
        trace = attach(trace, cal)
    ck = None
    cal_lines: list[str] = []
    if cl is not None:
        from retime.cmd_replay import refined_keys
        grid_keys = {k for sc in scenarios for k in sc}
        ck, cal_lines = refined_keys(cl, ref, trace, grid_keys)
        scenarios = [{**ck.keys, **sc} for sc in scenarios]
    n_workers = None if scheduler else (workers or default_workers())
    t0 = time.perf_counter()
    interrupted = False
    try:
        df = sweep(trace, scenarios, workers=n_workers, scheduler=scheduler, ranges=ranges)
    except SweepInterrupted as exc:
        df, interrupted = exc.frame, True
    elapsed = time.perf_counter() - t0
    n_steps = trace_steps(trace)
    write_sweep(df, output, steps=n_steps)
    s = sweep_summary(df, len(scenarios))
    s.update({"output": str(output), "steps": n_steps, "interrupted": interrupted,
              "elapsed_s": round(elapsed, 3),
              "workers": n_workers, "scheduler": scheduler})
    if ck is not None:
        s["cluster"] = ck.describe()
        if cal is not None:
            s["cluster"]["calibration"] = {"file": str(calibration), "level": ref.level,
                                           "lines": cal_lines}
    if interrupted:
        typer.echo(f"retime: interrupted: wrote the {s['completed']} of {s['scenarios']} "
                   f"scenarios finished to {output}", err=True)
        if json_out:
            emit_json(s)
        raise typer.Exit(130)
    if s["completed"] and s["failed"] == s["completed"]:
        first = df["error"].dropna().iloc[0]
        raise RetimeError(f"{grid}: every scenario failed (rows with errors written to "
                          f"{output}); the first: {first}")
    if json_out:
        emit_json(s)
        return
    say(f"wrote {output}: {s['completed']} scenario(s), {s['failed']} failed, "
        f"in {elapsed:.1f} s")
    if s["best"]:
        keys = {k: v for k, v in s["best"].items()
                if k not in ("scenario_id", "error", *METRICS)}
        b = s["best"]
        # the row holds the replayed steps end to end: per step over their count
        rng = (f" (range {b['step_time_lo_ns'] / n_steps / 1e6:.3f}-"
               f"{b['step_time_hi_ns'] / n_steps / 1e6:.3f} ms)"
               if b.get("step_time_lo_ns") is not None else "")
        per = (f" per step ({n_steps} steps: {b['step_time_ns'] / 1e6:.3f} ms end to end)"
               if n_steps > 1 else "")
        say(f"  best step time {b['step_time_ns'] / n_steps / 1e6:.3f} ms{per}{rng} (scenario "
            f"{s['best']['scenario_id']}: "
            f"{', '.join(f'{k}={v}' for k, v in keys.items() if v is not None) or 'baseline'})")
    for line in cal_lines:
        say(f"  {line}")
    for e in df["error"].dropna().head(3):
        say(f"  failed: {e}")
