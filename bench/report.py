"""Benchmark: how long reports take to make (CPU seconds; printed, never asserted).

    python bench/report.py [--repeat N] [--skip-large] [--skip-demo]
                           [--baseline CHECKOUT] [--pairs P]

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
   With ``--baseline CHECKOUT`` (e.g. main's), the HTML report is made from each checkout
   in turn, ``--pairs`` times alternating which goes first, on the same store: CPU (user +
   system, and user alone: system time moves most with other load on a shared host) per
   pair, the ratios and their medians, and in how many pairs the two HTML reports and
   their tables are byte for byte the same (but for the minute the page was made).
"""

from __future__ import annotations

import argparse
import os
import re
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


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "RETIME_PROGRESS": "0",
            "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _children_ut() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime, r.ru_stime


def _same_report(a: Path, b: Path) -> bool:
    """Whether the reports ``a`` and ``b`` (same file name, other folders: the page links its
    tables folder by name) and their tables folders are byte for byte the same, but for the
    minute the page says it was made at."""
    stamp = re.compile(rb"\d{4}-\d\d-\d\d \d\d:\d\d UTC")
    if stamp.sub(b"", a.read_bytes()) != stamp.sub(b"", b.read_bytes()):
        return False
    ta, tb = a.with_name(a.stem + "-tables"), b.with_name(b.stem + "-tables")
    fa = sorted(f.name for f in ta.iterdir()) if ta.is_dir() else []
    fb = sorted(f.name for f in tb.iterdir()) if tb.is_dir() else []
    return fa == fb and all((ta / f).read_bytes() == (tb / f).read_bytes() for f in fa)


def report_pairs(store: Path, out: Path, baseline: Path, pairs: int) -> None:
    """The HTML report of ``store`` from this checkout and ``baseline`` in turn."""
    got: dict[str, list[tuple[float, float]]] = {"ours": [], "baseline": []}
    for name in got:
        (out / name).mkdir(exist_ok=True)
    for k in range(pairs):
        order = [("ours", ROOT), ("baseline", baseline)]
        for name, root in (order if k % 2 == 0 else order[::-1]):
            u0, s0 = _children_ut()
            r = subprocess.run([sys.executable, "-m", "retime", "report", str(store), "-o",
                                str(out / name / f"r{k}.html"), "--force"], env=_env(root),
                               cwd=root, capture_output=True, text=True)
            u1, s1 = _children_ut()
            if r.returncode:
                raise SystemExit(f"{root}: report failed: {r.stderr.strip()[-500:]}")
            got[name].append((u1 - u0, s1 - s0))
    same = sum(_same_report(out / "ours" / f"r{k}.html", out / "baseline" / f"r{k}.html")
               for k in range(pairs))
    print(f"  outputs: HTML and tables equal to the baseline's in {same} of {pairs} pair(s)")
    tot = {n: [u + s for u, s in v] for n, v in got.items()}
    usr = {n: [u for u, _ in v] for n, v in got.items()}
    for n in got:
        print(f"  {n:<8} CPU {' '.join(f'{x:5.2f}' for x in tot[n])} s (user "
              f"{' '.join(f'{x:5.2f}' for x in usr[n])} s)")
    rt = [a / b for a, b in zip(tot["ours"], tot["baseline"], strict=True)]
    ru = [a / b for a, b in zip(usr["ours"], usr["baseline"], strict=True)]
    print(f"  ours / baseline per pair: CPU {' '.join(f'{x:.2f}' for x in rt)} (median "
          f"{statistics.median(rt):.2f}), user {' '.join(f'{x:.2f}' for x in ru)} (median "
          f"{statistics.median(ru):.2f}); median CPU ours {statistics.median(tot['ours']):.2f} "
          f"s, baseline {statistics.median(tot['baseline']):.2f} s")


def large_report(out: Path, baseline: Path | None = None, pairs: int = 3) -> None:
    env = _env(ROOT)
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
    if baseline is not None:
        print(f"128-rank pipeline run, HTML, against {baseline} ({pairs} interleaved pairs):")
        report_pairs(store, out, baseline, pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-large", action="store_true", help="only the demo's reports")
    ap.add_argument("--skip-demo", action="store_true", help="only the 128-rank report")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another checkout: its 128-rank report interleaved with ours")
    ap.add_argument("--pairs", type=int, default=3)
    a = ap.parse_args()
    if a.baseline is not None and not (a.baseline / "retime" / "__main__.py").is_file():
        raise SystemExit(f"--baseline {a.baseline}: not a retime checkout")
    with tempfile.TemporaryDirectory() as d:
        out = Path(d)
        if not a.skip_demo:
            demo_reports(max(a.repeat, 1), out)
        if not a.skip_large:
            large_report(out, a.baseline.resolve() if a.baseline else None, max(a.pairs, 1))


if __name__ == "__main__":
    main()
