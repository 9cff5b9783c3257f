"""Benchmark: analysis speed on the largest shared trace, and our critical path vs HTA's.

    python bench/analysis.py [--trace DIR] [--rank R] [--repeat N] [--no-hta]

Prints (never asserts):
1. load time (ingest of the Kineto files), then the time of every analysis function on the
   loaded trace after a JIT warm-up (best of ``--repeat``), and their total; the target is
   under 2 s after load.
2. critical path on the same single-rank trace: retime (numba longest path over all steps)
   and HolisticTraceAnalysis' ``critical_path_analysis`` (networkx) over all ProfilerStep
   instances, side by side in this run: wall time, ops/nodes on the path, path length, and
   the speed ratio. HTA is optional (``pip install -e ".[bench]"``); if it cannot
   be imported or fails, the reason is printed. HTA 0.5 calls ``DataFrame.drop(axis=1,
   columns=...)``, which pandas 3 rejects; this script drops the redundant ``axis`` for it
   (a shim for the peer only, installed after retime's timings are taken).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT = ROOT.parent / "shared" / "traces" / "kineto" / "v100-ddp-sgd"


def _best(fn, repeat: int) -> tuple[float, float, object]:
    times = []
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times), out


def bench_analysis(trace, repeat: int) -> dict:
    import retime.analysis as A

    suite = {
        "breakdown(step)": lambda: A.breakdown(trace),
        "breakdown(rank)": lambda: A.breakdown(trace, by="rank"),
        "kernel_stats": lambda: A.kernel_stats(trace, top=20),
        "class_stats": lambda: A.class_stats(trace),
        "critical_path": lambda: A.critical_path(trace),
        "collectives+summary": lambda: A.comm_summary(A.collectives(trace)),
        "rank_wait": lambda: A.rank_wait(trace),
        "bubbles": lambda: A.stage_bubbles(trace),
        "memory": lambda: A.peak_memory(trace),
        "efficiency": lambda: A.job_efficiency(trace),
    }
    for fn in suite.values():  # JIT warm-up and first-touch, not timed
        fn()
    res = {}
    for name, fn in suite.items():
        best, med, _ = _best(fn, repeat)
        res[name] = (best, med)
    t0 = time.perf_counter()
    for fn in suite.values():
        fn()
    res["TOTAL (one pass)"] = (time.perf_counter() - t0, float("nan"))
    return res


def run_hta(trace_dir: Path, rank: int, n_steps: int) -> dict:
    out: dict = {}
    try:
        import pandas as pd

        _drop = pd.DataFrame.drop

        def drop(self, *a, **k):  # HTA 0.5 passes axis together with columns (pandas 3 raises)
            if ("columns" in k or "index" in k) and "axis" in k:
                k.pop("axis")
            return _drop(self, *a, **k)

        pd.DataFrame.drop = drop
        import logging
        import warnings
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        from hta.trace_analysis import TraceAnalysis
    except Exception as exc:  # noqa: BLE001 - report any reason the peer cannot run
        out["error"] = f"cannot import HTA: {type(exc).__name__}: {exc}"
        return out
    try:
        t0 = time.perf_counter()
        ta = TraceAnalysis(trace_dir=str(trace_dir))
        out["load_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        inst = (0, n_steps - 1) if n_steps > 1 else 0
        g, ok = ta.critical_path_analysis(rank=rank, annotation="ProfilerStep", instance_id=inst)
        out["cp_s"] = time.perf_counter() - t0
        out["ok"] = bool(ok)
        out["graph_nodes"] = g.number_of_nodes()
        edges = list(g.critical_path_edges_set)
        out["path_edges"] = len(edges)
        out["path_events"] = len(g.critical_path_events_set)
        out["length_units"] = int(sum(int(e.weight) for e in edges))
        # HTA keeps the trace's time unit; infer it from HTA's own span of the rank's events
        df = ta.t.get_trace(rank)
        span_units = float((df["ts"] + df["dur"].clip(lower=0)).max() - df["ts"].min())
        out["span_units"] = span_units
        try:
            s = g.summary()
            out["bound_by"] = {str(k): round(float(v), 1) for k, v in s.items()}
        except Exception as exc:  # noqa: BLE001
            out["bound_by"] = f"summary failed: {exc}"
    except Exception as exc:  # noqa: BLE001
        out["error"] = f"HTA critical_path_analysis failed: {type(exc).__name__}: {exc}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT)
    ap.add_argument("--rank", type=int, default=None, help="rank for HTA (default: the trace's)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-hta", action="store_true")
    args = ap.parse_args()

    import numpy as np

    import retime.analysis as A
    from retime.collectors.ingest import read

    t0 = time.perf_counter()
    trace = read([args.trace])
    load_s = time.perf_counter() - t0
    ranks = [int(r) for r in trace.ranks]
    steps = sorted({int(s) for s in np.unique(trace.ops["step"]) if s >= 0})
    print(f"trace {args.trace} : {trace.n_ops:,} ops, {len(trace.edges):,} edges, "
          f"{len(trace.ranges):,} ranges, ranks {ranks}, steps {steps}")
    print(f"load (ingest)                 {load_s:8.3f} s")
    res = bench_analysis(trace, args.repeat)
    print(f"analysis after load (best of {args.repeat}, median):")
    for k, (b, m) in res.items():
        print(f"  {k:28s} {b:8.3f} s   {m:8.3f} s")
    total = res["TOTAL (one pass)"][0]
    print(f"  => full analysis {total:.3f} s after load (target < 2 s: "
          f"{'met' if total < 2 else 'NOT met'})")

    best, med, cp = _best(lambda: A.critical_path(trace), args.repeat)
    by_kind = A.attribute_critical_path(cp, by="kind")
    print("\ncritical path, side by side on the same single-rank trace")
    print(f"  retime : {best * 1e3:9.1f} ms (median {med * 1e3:.1f} ms), {len(cp):,} ops on path, "
          f"length {cp.attrs['length_ns'] / 1e6:.3f} ms of span {cp.attrs['span_ns'] / 1e6:.3f} ms")
    print("           by kind: " + ", ".join(f"{r.kind} {100 * r.share:.1f}%"
                                            for r in by_kind.head(5).itertuples()))
    if args.no_hta:
        print("  HTA    : skipped (--no-hta)")
        return
    rank = args.rank if args.rank is not None else ranks[0]
    h = run_hta(args.trace, rank, max(len(steps), 1))
    if "error" in h:
        print(f"  HTA    : could not run: {h['error']}"
              + (f" (trace load took {h['load_s']:.1f} s)" if "load_s" in h else ""))
        return
    print(f"  HTA    : {h['cp_s'] * 1e3:9.1f} ms critical_path_analysis (+ {h['load_s']:.1f} s "
          f"trace load), success={h['ok']}, graph {h['graph_nodes']:,} nodes, "
          f"{h['path_edges']:,} edges / {h['path_events']:,} events on path, "
          f"path weight {h['length_units']:,} trace units = "
          f"{100 * h['length_units'] / h['span_units']:.1f}% of HTA's span of the rank; "
          f"bound by {h['bound_by']}")
    print(f"           (retime: path length = "
          f"{100 * cp.attrs['length_ns'] / cp.attrs['span_ns']:.1f}% of the rank's span)")
    print(f"  ratio  : retime is {h['cp_s'] / best:,.0f}x faster than HTA's critical path "
          f"analysis (target >= 50x); including each tool's load: "
          f"{(h['cp_s'] + h['load_s']) / (best + load_s):,.0f}x")


if __name__ == "__main__":
    main()
