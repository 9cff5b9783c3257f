"""Identity-replay fidelity on every shared real trace (issue 3 item 4).

For each trace: ingest it, replay it unmodified and compare each rank's step time (its step
windows end to end, collectors/steps.py) with the measurement. Three replays per trace:

* ``identity``   — default mode (unexplained delays kept as lags): the target is a median
  error under 1% and every rank under 3%;
* ``contention`` — the contention path with sharing off (must equal the fast path);
* ``ideal``      — unexplained delays dropped: how much of each rank's time the dependency
  model does not explain (not an error, a diagnostic: "what if nothing stalled").

Run: ``python bench/fidelity.py [--markdown]`` (prints a table; never asserts).
Folders whose files are separate runs of one rank (a100-event-sync, edge-cases) are
replayed file by file; the execution-trace-only folder (dlrm-v100-8rank-et) holds no timings.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from retime.collectors.ingest import read  # noqa: E402
from retime.replay import ContentionModel, build_graph, simulate  # noqa: E402
from retime.replay.gaps import gap_shares  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces"


def cases() -> list[tuple[str, list[Path]]]:
    """(name, input paths) of every replayable shared trace."""
    k = TRACES / "kineto"
    out: list[tuple[str, list[Path]]] = []
    for name in ("dlrm-v100-8rank", "a100-ddp-nccl", "v100-ddp-sgd", "mi300x-resnet-ddp",
                 "cpu-gloo-rank34"):
        out.append((f"kineto/{name}", [k / name]))
    out.append(("kineto/h100-vgg13", [k / "h100-vgg13" / "profiler_vgg13-iter41.json.gz"]))
    for folder in ("a100-event-sync", "edge-cases"):
        for f in sorted((k / folder).glob("*.json.gz")):
            out.append((f"kineto/{folder}/{f.name.removesuffix('.json.gz')}", [f]))
    out.append(("oplevel/megatron-ST-8rank", [TRACES / "oplevel" / "megatron-ST-8rank"]))
    out.append(("nsys/h100-2gpu-fastvideo", [TRACES / "nsys" / "h100-2gpu-fastvideo.sqlite"]))
    return out


def rank_errors(result) -> np.ndarray:
    st = result.step_times()
    m = st["measured_ns"].to_numpy().astype(float)
    r = st["replayed_ns"].to_numpy().astype(float)
    return np.where(m > 0, (r - m) / np.where(m > 0, m, 1), 0.0)


def measure(name: str, paths: list[Path]) -> dict:
    t0 = time.perf_counter()
    trace = read([str(p) for p in paths], progress=False)
    t1 = time.perf_counter()
    g = build_graph(trace)
    ident = simulate(g)
    t2 = time.perf_counter()
    cont = simulate(g, mode="contention", contention=ContentionModel(share_links=False))
    ideal = simulate(build_graph(trace, ideal=True))
    e_id, e_co, e_ideal = rank_errors(ident), rank_errors(cont), rank_errors(ideal)
    st = trace.step_times_ns()  # whole rank spans: the delays cover the whole timeline
    spans = int(st["span_ns"].sum())
    exact = bool(np.array_equal(ident.start_ns, trace.ops["start_ns"].to_numpy())
                 and np.array_equal(ident.end_ns, g.meas_end_ns))
    return {
        "trace": name, "ranks": len(e_id), "ops": trace.n_ops, "edges": len(trace.edges),
        "collectives": g.stats["collectives"],
        "id_median_pct": 100 * float(np.median(np.abs(e_id))),
        "id_max_pct": 100 * float(np.abs(e_id).max()),
        "exact": exact,
        "cont_max_pct": 100 * float(np.abs(e_co).max()),
        "ideal_median_pct": 100 * float(np.median(e_ideal)),
        "ideal_min_pct": 100 * float(e_ideal.min()),
        "delays": g.stats["unexplained_delay_count"],
        "delay_ms": g.stats["unexplained_delay_ns"] / 1e6,
        "delay_share_pct": 100 * g.stats["unexplained_delay_ns"] / spans if spans else 0.0,
        "unexplained_max_rank_pct": 100 * max(
            r["unexplained_share"] for r in gap_shares(g)["per_rank"]),
        "wait_gap_ms": g.stats.get("wait_gap_ns", 0) / 1e6,
        "handoffs": g.stats.get("handoff_edges", 0),
        "clamped": g.stats["edges_clamped"], "waits": g.stats["wait_edges"],
        "ingest_s": t1 - t0, "replay_s": t2 - t1,
    }


COLUMNS = [("trace", "trace", "{}"), ("ranks", "ranks", "{}"), ("ops", "ops", "{:,}"),
           ("collectives", "colls", "{:,}"), ("id_median_pct", "id med %", "{:.4f}"),
           ("id_max_pct", "id max %", "{:.4f}"), ("exact", "exact", "{}"),
           ("cont_max_pct", "cont max %", "{:.4f}"), ("ideal_median_pct", "ideal med %", "{:+.2f}"),
           ("ideal_min_pct", "ideal min %", "{:+.2f}"), ("delays", "delays", "{:,}"),
           ("delay_share_pct", "unexpl. %", "{:.1f}"),
           ("unexplained_max_rank_pct", "unexpl. max rank %", "{:.1f}"),
           ("wait_gap_ms", "wait gaps ms", "{:.1f}"), ("handoffs", "handoffs", "{}"),
           ("clamped", "clamped", "{}"),
           ("waits", "waits", "{}"), ("replay_s", "build+replay s", "{:.2f}")]


def main() -> None:
    ap = argparse.ArgumentParser(description="identity replay fidelity on the shared traces")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args()
    rows = []
    for name, paths in cases():
        try:
            rows.append(measure(name, paths))
        except Exception as exc:  # a bench reports, it does not stop
            print(f"{name}: FAILED {type(exc).__name__}: {exc}", file=sys.stderr)
    cells = [[fmt.format(r[k]) for k, _, fmt in COLUMNS] for r in rows]
    heads = [h for _, h, _ in COLUMNS]
    if args.markdown:
        print("| " + " | ".join(heads) + " |")
        print("|" + "|".join("---" for _ in heads) + "|")
        for c in cells:
            print("| " + " | ".join(c) + " |")
    else:
        w = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
        print("  ".join(h.rjust(w[i]) for i, h in enumerate(heads)))
        for c in cells:
            print("  ".join(x.rjust(w[i]) for i, x in enumerate(c)))
    ok = all(r["id_median_pct"] < 1 and r["id_max_pct"] < 3 for r in rows)
    print()
    print(f"identity target (median < 1%, every rank < 3%): "
          f"{'met on all ' + str(len(rows)) + ' traces' if ok else 'NOT met'}")
    print("id = default replay (unexplained delays kept); cont = contention path, sharing off; "
          "ideal = delays dropped (negative: faster than measured); unexpl. = total "
          "unexplained delay over the summed rank spans (max rank: the worst rank's share); "
          "wait gaps = host gaps classified as waiting on a dependency (replay/gaps.py); "
          "handoffs = inferred thread hand-offs; clamped = edges the measurement "
          "contradicts (lag clamped to the measured slack)")


if __name__ == "__main__":
    main()
