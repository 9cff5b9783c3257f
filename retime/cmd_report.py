"""CLI: ``retime report RUN.retime [--baseline OTHER.retime] -o reports/NAME.html|.pdf``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from retime.cli import app, emit_json, say
from retime.collectors.errors import RetimeError
from retime.collectors.progress import progress_bar
from retime.collectors.trace import read_trace


@app.command()
def report(
    trace_dir: Annotated[Path, typer.Argument(help="A NAME.retime directory (trace or replay).",
                                              exists=True, file_okay=False)],
    output: Annotated[Path, typer.Option("-o", "--output", dir_okay=False,
                                         help="reports/NAME.html or reports/NAME.pdf")],
    baseline: Annotated[Path | None, typer.Option(
        "--baseline", exists=True, file_okay=False,
        help="Another NAME.retime to compare against (deltas = this run - baseline).")] = None,
    title: Annotated[str | None, typer.Option("--title", help="Report title.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Write a self-contained HTML report (or a PDF with the same content) of a run:
    summary and top findings, breakdown, kernels, critical path, communication, pipeline,
    memory and efficiency, and a comparison when --baseline is given."""
    from retime.analysis.report import build_report, write_html, write_pdf

    suf = output.suffix.lower()
    if suf not in (".html", ".htm", ".pdf"):
        raise RetimeError(f"-o {output}: the report must end in .html or .pdf")
    with progress_bar(3, "report", enabled=None if not json_out else False) as bar:
        trace = read_trace(trace_dir)
        base = read_trace(baseline) if baseline is not None else None
        bar.advance()
        rep = build_report(trace, baseline=base,
                           title=title or f"retime report: {trace_dir.name}")
        bar.advance()
        (write_pdf if suf == ".pdf" else write_html)(rep, output)
        bar.advance()
    summary = dict(rep.summary)
    if json_out:
        emit_json({"output": str(output), "format": "pdf" if suf == ".pdf" else "html",
                   "summary": summary, "findings": rep.findings,
                   "bytes": output.stat().st_size})
    else:
        say(f"wrote {output} ({output.stat().st_size:,} bytes): step time "
            f"{summary.get('Step time')}, MFU {summary.get('MFU')}")
        for i, f in enumerate(rep.findings, 1):
            say(f"  {i}. {f}")
