"""CLI: ``retime report RUN.retime|SWEEP.parquet [--baseline OTHER.retime] -o NAME.html|.pdf``
and ``retime compare BASELINE CANDIDATE --threshold 5%`` (a verdict for CI, exit 3 on a
regression)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from retime.cli import FORCE_HELP, app, check_output, emit_json, keep_freed_memory, say
from retime.collectors.errors import RetimeError

#: exit code of `retime compare` when the candidate regressed beyond the threshold
EXIT_REGRESSION = 3


class Paper(str, Enum):
    a4 = "a4"
    letter = "letter"


#: in a report's CSV folder: what the tables were made from (its HTML and PDF forms share it)
SOURCE_MARK = ".retime-report-source"


def _source_key(source: Path, baseline: Path | None) -> str:
    return f"{source.resolve()}\n{baseline.resolve() if baseline is not None else ''}\n"


def _check_tables_dir(output: Path, force: bool, key: str) -> None:
    """The CSV folder beside a report is the report's own: replaced with it (--force), and
    shared by the HTML and PDF forms of one report (same source and baseline: the folder's
    mark says so), so `-o X.html` then `-o X.pdf` works without --force."""
    d = output.with_name(output.stem + "-tables")
    if d.exists() and not d.is_dir():
        raise RetimeError(f"{d}: exists and is not a folder; the report writes its full tables "
                          "there, so move it or choose another -o path")
    mark = d / SOURCE_MARK
    same = mark.is_file() and mark.read_text() == key
    if d.is_dir() and any(d.iterdir()) and not force and not output.exists() and not same:
        raise RetimeError(f"{d}: folder exists (the tables of another report); pass --force "
                          "to let this report write its tables there, or choose another -o "
                          "path")


@app.command()
def report(
    source: Annotated[Path, typer.Argument(
        help="A NAME.retime directory (trace or replay), or a SWEEP.parquet of `retime sweep`.",
        exists=True)],
    output: Annotated[Path, typer.Option("-o", "--output", dir_okay=False,
                                         help="reports/NAME.html or reports/NAME.pdf")],
    baseline: Annotated[Path | None, typer.Option(
        "--baseline", exists=True, file_okay=False,
        help="Another NAME.retime to compare against: waterfall of what changed, per-rank "
             "deltas (changes = this run - baseline).")] = None,
    title: Annotated[str | None, typer.Option("--title", help="Report title.")] = None,
    paper: Annotated[Paper, typer.Option("--paper", help="PDF page size.")] = Paper.a4,
    top: Annotated[int, typer.Option("--top", min=1, help="Rows of a long table shown (all of "
                                     "them go to NAME-tables/*.csv beside the report).")] = 15,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    stream: Annotated[bool | None, typer.Option(
        "--stream/--in-memory",
        help="Stream the store's rank partitions a batch at a time (bounded memory; the "
             "critical path is the slowest rank's, the stragglers what-if and drill-downs "
             "are left out, the page says so) or load the whole trace. Default: stream a "
             "rank-partitioned store (--layout rank) of more than 2,000,000 ops (with "
             "--baseline: when the baseline is rank-partitioned too, both are streamed).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Write a self-contained HTML report (or a PDF document with the same content).

    Of a run: headline (measured vs replayed step for a what-if, the scenario named),
    top findings, where the step goes, one step on the timeline (pipeline Gantt and rank
    heatmaps where they apply), the critical path explained, kernels, communication,
    pipeline, memory, efficiency. With --baseline: a comparison first. Of a sweep: the
    fastest scenarios, sensitivity per key, the Pareto front of step time and memory.
    Long tables show their top rows; all rows go to NAME-tables/*.csv beside the report.
    """
    suf = output.suffix.lower()
    if suf not in (".html", ".htm", ".pdf"):
        raise RetimeError(f"-o {output}: the report must end in .html or .pdf")
    is_sweep = source.is_file()
    if is_sweep and source.suffix.lower() != ".parquet":
        raise RetimeError(f"{source}: not a NAME.retime directory or a SWEEP.parquet; pass a "
                          f"stored trace (a raw one: `retime ingest {source} -o NAME.retime` "
                          "first) or the output of `retime sweep`")
    if is_sweep and baseline is not None:
        raise RetimeError("--baseline applies to a run, not to a sweep; drop it")
    if stream and is_sweep:
        raise RetimeError("--stream reports a stored run, not a sweep; drop --stream")
    check_output(output, force)
    key = _source_key(source, baseline)
    _check_tables_dir(output, force, key)
    keep_freed_memory()
    from retime.analysis.report import (
        build_report,
        build_sweep_report,
        read_sweep,
        write_html,
        write_pdf,
    )
    from retime.collectors.progress import progress_bar
    from retime.collectors.store import store_layout
    from retime.collectors.trace import read_trace
    with progress_bar(3, "report", enabled=None if not json_out else False) as bar:
        if is_sweep:
            df = read_sweep(source)
            bar.advance()
            rep = build_sweep_report(df, title=title or f"retime sweep report: {source.stem}",
                                     top=top)
        else:
            from retime.analysis.report_stream import build_stream_report, should_stream_report

            name = source.name.removesuffix(".retime")
            if stream is None:  # a comparison streams when both stores can be streamed
                stream = should_stream_report(source) and (
                    baseline is None or store_layout(baseline) == "rank")
            if stream:
                bar.advance()
                rep = build_stream_report(source, title=title or f"retime report: {name}",
                                          top=top, baseline=baseline)
            else:
                trace = read_trace(source)
                base = read_trace(baseline) if baseline is not None else None
                bar.advance()
                rep = build_report(trace, baseline=base,
                                   title=title or f"retime report: {name}", top=top)
        bar.advance()
        if suf == ".pdf":
            write_pdf(rep, output, paper=paper.value)
        else:
            write_html(rep, output)
        tables = output.with_name(output.stem + "-tables")
        if tables.is_dir():
            (tables / SOURCE_MARK).write_text(key)
        bar.advance()
    summary = dict(rep.summary)
    if json_out:
        emit_json({"output": str(output), "format": "pdf" if suf == ".pdf" else "html",
                   "kind": rep.kind, "summary": summary,
                   "headline": [{"label": a, "value": b, "note": c} for a, b, c in rep.headline],
                   "scenario": [{"key": k, "value": v} for k, v, _ in rep.scenario],
                   "findings": rep.findings, "bytes": output.stat().st_size,
                   "mode": "stream" if stream else "memory"})
    else:
        head = "; ".join(f"{a} {b}" for a, b, _ in rep.headline)
        say(f"wrote {output} ({output.stat().st_size:,} bytes"
            f"{', streamed' if stream else ''}): {head}")
        for i, f in enumerate(rep.findings, 1):
            say(f"  {i}. {f}")


def _parse_threshold(text: str) -> float:
    t = text.strip()
    try:
        v = float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
    except ValueError:
        raise RetimeError(f"--threshold {text!r}: give a percentage like 5% (or a fraction "
                          "like 0.05)") from None
    if not v >= 0:
        raise RetimeError(f"--threshold {text!r}: must be >= 0 (e.g. 5%)")
    return v


@app.command()
def compare(
    baseline: Annotated[Path, typer.Argument(help="The baseline NAME.retime (trace or replay).",
                                             exists=True, file_okay=False)],
    candidate: Annotated[Path, typer.Argument(help="The candidate NAME.retime to judge.",
                                              exists=True, file_okay=False)],
    threshold: Annotated[str, typer.Option("--threshold", help="Largest step-time increase "
                                           "that is not a regression (5% or 0.05).")] = "5%",
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """One-line verdict on the candidate's step time against the baseline, for CI.

    Prints REGRESSION, IMPROVEMENT or NO SIGNIFICANT CHANGE with the change, the threshold
    and a confidence from the step-to-step spread of both runs. Exit codes: 0 no regression,
    3 regression beyond the threshold, 2 bad input, 1 internal error.
    """
    thr = _parse_threshold(threshold)
    from retime.analysis.compare import verdict
    from retime.collectors.trace import read_trace

    v = verdict(read_trace(baseline), read_trace(candidate), threshold=thr)
    code = EXIT_REGRESSION if v["status"] == "regression" else 0
    if json_out:
        emit_json({**v, "baseline": str(baseline), "candidate": str(candidate),
                   "exit_code": code})
    else:
        say(v["line"])
    if code:
        raise typer.Exit(code)
