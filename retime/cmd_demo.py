"""CLI: ``retime demo`` — the whole job on the bundled real sample, with no download.

Ingest the bundled 8-rank DLRM Kineto trace (real V100 data, shipped as package data in
``retime.traces``), replay it unchanged (identity: per-rank error vs the measured step), run
two what-ifs (GPU compute 2x faster; host CPU 2x faster), and write HTML + PDF reports of the
better what-if against the measured trace to ``./retime-demo/`` (or ``-o DIR``). The folder is
the demo's own: a rerun replaces what the demo wrote there; any other existing non-empty
folder is refused unless ``--force``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from retime.cli import app, emit_json, say
from retime.collectors.errors import RetimeError

#: marker file of a folder the demo wrote (a rerun may replace its contents)
MARKER = ".retime-demo"


def _prepare(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise RetimeError(f"{out}: exists and is not a folder; pass another -o DIR")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file() and not force:
        raise RetimeError(f"{out}: folder exists and was not written by `retime demo`; pass "
                          "--force to write into it, or another -o DIR")
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by `retime demo`; a rerun replaces this folder's demo "
                              "outputs\n")


@app.command()
def demo(
    output_dir: Annotated[Path, typer.Option(
        "--output-dir", "-o", file_okay=False,
        help="Where the store and reports go (created; default ./retime-demo).")] = Path("retime-demo"),
    force: Annotated[bool, typer.Option("--force", help="Write into an existing folder that "
                                        "the demo did not create.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Run ingest -> identity replay -> two what-ifs -> HTML/PDF report on the bundled sample
    (8 real V100 ranks of a DLRM training step); writes ./retime-demo/ and says where."""
    import retime

    sample = Path(str(retime.sample_trace_path()))
    if not sample.is_dir():
        raise RetimeError(f"{sample}: bundled sample missing from the installation; reinstall "
                          "retime (pip install retime) or run from a checkout")
    _prepare(output_dir, force)
    from retime.analysis import write_report
    from retime.collectors.ingest import read
    from retime.replay import replay, whatif

    quiet = json_out
    t0 = time.perf_counter()
    trace = read([sample])
    store = trace.save(output_dir / "dlrm-v100-8rank.retime")
    t_ingest = time.perf_counter() - t0
    coll = trace.meta["collectives"]
    say(f"ingested the bundled sample (dlrm-v100-8rank): {trace.n_ops} ops on "
        f"{len(trace.ranks)} ranks, {len(trace.edges)} dependencies, collectives matched "
        f"{coll['matched']} / unmatched {coll['unmatched']} ({t_ingest:.1f} s) -> {store}",
        quiet=quiet)

    ident = replay(trace)
    st = ident.step_times()
    st["error_pct"] = 100.0 * (st["replayed_ns"] - st["measured_ns"]) / st["measured_ns"]
    say("identity replay (unchanged trace), per-rank step time:", quiet=quiet)
    for r in st.itertuples():
        say(f"  rank {r.rank}: measured {r.measured_ns / 1e6:8.3f} ms  replayed "
            f"{r.replayed_ns / 1e6:8.3f} ms  error {r.error_pct:+.3f}%", quiet=quiet)

    whatifs = []
    best = None
    for key in ("hardware.compute_speedup", "hardware.host_speedup"):
        w = whatif(trace, {key: 2.0})
        sp = float(ident.step_time_ns / max(w.step_time_ns, 1))
        whatifs.append({"scenario": {key: 2.0}, "step_time_ns": int(w.step_time_ns),
                        "speedup": sp})
        say(f"what-if {key}=2: step {ident.step_time_ns / 1e6:.3f} ms -> "
            f"{w.step_time_ns / 1e6:.3f} ms ({sp:.2f}x)", quiet=quiet)
        if best is None or w.step_time_ns < best.step_time_ns:
            best = w
    title = "retime demo: DLRM, 8x V100 (real trace)"
    html = write_report(best, output_dir / "dlrm-v100-8rank.html", baseline=trace, title=title)
    pdf = write_report(best, output_dir / "dlrm-v100-8rank.pdf", baseline=trace, title=title)
    say(f"reports: {html} and {pdf} (open the HTML in a browser)", quiet=quiet)
    if json_out:
        emit_json({
            "output_dir": str(output_dir), "store": str(store),
            "ranks": [int(r) for r in trace.ranks], "ops": trace.n_ops,
            "collectives": {"matched": coll["matched"], "unmatched": coll["unmatched"]},
            "identity": [{"rank": int(r.rank), "measured_ns": int(r.measured_ns),
                          "replayed_ns": int(r.replayed_ns), "error_pct": float(r.error_pct)}
                         for r in st.itertuples()],
            "whatif": whatifs, "reports": [str(html), str(pdf)],
        })
