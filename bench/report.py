"""Benchmark: how long reports take to make (CPU seconds; printed, never asserted).

    python bench/report.py [--repeat N] [--skip-large]

1. The demo's two reports: the HTML and the PDF of the bundled DLRM trace's what-if
   (``hardware.host_speedup = 2``) against the measured trace, as ``retime demo`` writes
   them: one ``build_report``, then ``write_html`` and ``write_pdf`` (the figures are drawn
   once and shared). Warm (numba kernels loaded, matplotlib imported, after one untimed
   round), best and median of ``--repeat`` rounds, with the split build / HTML / PDF. The
   demo's budget for both is 2 s CPU.
2. The report of a synthesized 128-rank pipeline run (Llama-3 70B on H100, TP8 PP4 DP4,
   1F1B, 16 micro-batches, full recompute, sequence parallel; 2.2 M ops), made by
   ``retime report`` in a fresh process, as a user runs it: CPU of the whole command
   (start-up, reading the store, analysis, figures, writing), HTML and PDF. Budget: 10 s.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def demo_reports(repeat: int, out: Path) -> None:
    import retime
    from retime.analysis.report import build_report, write_html, write_pdf
    from retime.collectors.ingest import read
    from retime.replay import whatif

    trace = read([Path(str(retime.sample_trace_path()))])
    w = whatif(trace, {"hardware.host_speedup": 2.0})
    rows = []
    for i in range(repeat + 1):
        c0 = _cpu()
        rep = build_report(w, baseline=trace, title="bench: DLRM what-if")
        c1 = _cpu()
        write_html(rep, out / "dlrm.html")
        c2 = _cpu()
        write_pdf(rep, out / "dlrm.pdf")
        c3 = _cpu()
        if i:  # the first round warms up (kernels loaded, fonts cached)
            rows.append((c3 - c0, c1 - c0, c2 - c1, c3 - c2))
    tot = [r[0] for r in rows]
    best = min(rows)
    print(f"demo reports (DLRM what-if, HTML + PDF), warm CPU: best {best[0]:.2f} s, median "
          f"{statistics.median(tot):.2f} s over {len(rows)} round(s); best split: build "
          f"{best[1]:.2f} s, HTML {best[2]:.2f} s, PDF {best[3]:.2f} s (budget 2 s)")
    print(f"  sizes: HTML {(out / 'dlrm.html').stat().st_size:,} bytes, PDF "
          f"{(out / 'dlrm.pdf').stat().st_size:,} bytes")


def large_report(out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "RETIME_PROGRESS": "0"}
    store = out / "l70.retime"
    synth = [sys.executable, "-m", "retime", "synth", "--model", "llama3-70b", "--hardware",
             "h100-sxm", "--tp", "8", "--pp", "4", "--dp", "4", "--global-batch", "64",
             "--micro-batch", "1", "--recompute", "full", "--sequence-parallel", "-o",
             str(store)]
    subprocess.run(synth, check=True, env=env, capture_output=True)
    for suffix in ("html", "pdf"):
        c0 = _children_cpu()
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "retime", "report", str(store), "-o",
                            str(out / f"l70.{suffix}"), "--force"], env=env,
                           capture_output=True, text=True)
        wall = time.perf_counter() - t0
        cpu = _children_cpu() - c0
        if r.returncode:
            print(f"128-rank report ({suffix}) failed: {r.stderr.strip()[-500:]}")
            continue
        print(f"128-rank pipeline run (2.2 M ops) `retime report -o l70.{suffix}`: {cpu:.2f} s "
              f"CPU ({wall:.2f} s wall), whole command in a fresh process (budget 10 s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-large", action="store_true", help="only the demo's reports")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        out = Path(d)
        demo_reports(max(a.repeat, 1), out)
        if not a.skip_large:
            large_report(out)


if __name__ == "__main__":
    main()
