"""Analysis of a store of thousands of ranks: streamed vs loaded whole (issue 8 item 2).

Builds a rank-partitioned store of ``--ranks`` ranks by replicating one real rank of the
DLRM trace (shared/traces/kineto/dlrm-v100-8rank; ops, edges, ranges; ranks shifted by a
few microseconds so collectives have arrival skew), written one rank at a time with
:func:`collectors.store.write_store_by_rank`. Then, each in a fresh process (so the peak RSS
is the analysis's own), prints wall and CPU time and the peak RSS above the process's RSS
after imports and a warm-up on the real 8-rank trace:

* ``stream``: :func:`analysis.stream.store_analysis` with ``stream=True`` (a batch of
  ``--batch-rows`` ops at a time; step times, breakdown, top ops, collectives, rank wait),
* ``memory``: the same with ``stream=False`` (``read_trace`` + the in-memory analysis),

and checks that both give the same breakdown. Run:
``python bench/store_scale.py [--ranks 4096] [--batch-rows 200000]``.
The machine is shared: wall times are noisy, CPU times (process_time) less so.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DLRM = ROOT.parent / "shared" / "traces" / "kineto" / "dlrm-v100-8rank"


def replicated_ranks(trace, base_rank: int, n_ranks: int, skew_ns: int = 3_000
                     ) -> tuple[Iterator[tuple[int, dict[str, pd.DataFrame]]], pd.DataFrame]:
    """Rank ``base_rank`` of ``trace`` copied to ranks ``0..n_ranks-1`` (ids shifted, start
    times shifted by ``r * skew_ns``, collective ids kept so instances span every rank);
    returns the per-rank iterator for ``write_store_by_rank`` and the lanes table."""
    o = trace.ops[trace.ops["rank"].to_numpy() == base_rank].reset_index(drop=True)
    first, n0 = int(o["op_id"].iloc[0]), len(o)
    assert (o["op_id"].to_numpy() == np.arange(first, first + n0)).all()
    ln = trace.lanes[trace.lanes["rank"].to_numpy() == base_rank].reset_index(drop=True)
    nl = len(ln)
    lut = pd.Series(np.arange(nl), index=ln["lane"].to_numpy())
    o_lane = lut.reindex(o["lane"].to_numpy()).to_numpy()
    src = trace.edges["src"].to_numpy()
    e = trace.edges[(src >= first) & (src < first + n0)].reset_index(drop=True)
    rg = trace.ranges[trace.ranges["rank"].to_numpy() == base_rank].reset_index(drop=True)
    rg_lane = lut.reindex(rg["lane"].to_numpy()).to_numpy()

    def gen() -> Iterator[tuple[int, dict[str, pd.DataFrame]]]:
        for r in range(n_ranks):
            ops = o.copy()
            ops["op_id"] = o["op_id"].to_numpy() - first + r * n0
            ops["rank"] = np.int32(r)
            ops["lane"] = (o_lane + r * nl).astype(np.int32)
            ops["start_ns"] = o["start_ns"].to_numpy() + r * skew_ns
            ed = e.copy()
            ed["src"] = e["src"].to_numpy() - first + r * n0
            ed["dst"] = e["dst"].to_numpy() - first + r * n0
            rr = rg.copy()
            rr["rank"] = np.int32(r)
            rr["lane"] = (rg_lane + r * nl).astype(np.int32)
            rr["start_ns"] = rg["start_ns"].to_numpy() + r * skew_ns
            rr["end_ns"] = rg["end_ns"].to_numpy() + r * skew_ns
            yield r, {"ops": ops, "edges": ed, "ranges": rr}

    lanes = pd.DataFrame({
        "lane": np.arange(n_ranks * nl, dtype=np.int32),
        "rank": np.repeat(np.arange(n_ranks, dtype=np.int32), nl),
        "device": np.tile(ln["device"].to_numpy(), n_ranks),
        "lane_kind": np.tile(ln["lane_kind"].to_numpy(), n_ranks),
        "native_id": np.tile(ln["native_id"].to_numpy(), n_ranks),
        "name": np.tile(ln["name"].to_numpy(), n_ranks)})
    return gen(), lanes


def build_store(out: Path, n_ranks: int, base_rank: int = 0) -> dict:
    """Write the replicated store; return its size figures."""
    from retime.collectors.ingest import read
    from retime.collectors.store import write_store_by_rank

    t = read(DLRM)
    gen, lanes = replicated_ranks(t, base_rank, n_ranks)
    groups = pd.DataFrame({"group_id": t.groups["group_id"].to_numpy(),
                           "name": t.groups["name"].to_numpy(),
                           "ranks": [list(range(n_ranks))] * len(t.groups)})
    meta = {"source_format": "kineto", "world_size": n_ranks,
            "note": f"rank {base_rank} of {DLRM.name} replicated {n_ranks} times"}
    write_store_by_rank(out, gen, lanes=lanes, groups=groups, strings=t.strings, meta=meta)
    per = t.ops["rank"].to_numpy() == base_rank
    sub_ops = t.ops[per]
    row_bytes = sub_ops.memory_usage(index=False, deep=False).sum() / max(len(sub_ops), 1)
    n_ops = int(per.sum()) * n_ranks
    return {"ops": n_ops, "ops_bytes_in_memory": int(row_bytes * n_ops),
            "disk_bytes": sum(f.stat().st_size for f in out.rglob("*") if f.is_file())}


_CHILD = r"""
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, {root!r})
from retime.analysis.stream import store_analysis
from retime.collectors.ingest import read
import tempfile, pathlib
# warm-up (imports, numba kernels from cache) on the real 8-rank trace
with tempfile.TemporaryDirectory() as d:
    p = read({dlrm!r}).save(pathlib.Path(d) / "w.retime", layout="rank")
    store_analysis(p, stream=True); store_analysis(p, stream=False)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
w, c = time.perf_counter(), time.process_time()
res = store_analysis({store!r}, stream={stream}, batch_rows={batch})
w, c = time.perf_counter() - w, time.process_time() - c
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
bd = res["breakdown"]
print(json.dumps({{"wall_s": w, "cpu_s": c, "base_rss_mb": base / 1024,
                  "peak_above_base_mb": (peak - base) / 1024, "rows": len(bd),
                  "digest": [int(bd[k].sum()) for k in ("step_ns", "compute_ns",
                  "exposed_comm_ns", "host_bound_ns", "idle_ns")],
                  "top_op": str(res["top_ops"]["name"].iloc[0])[:60],
                  "collectives": int(res["comm"]["instances"].sum())}}))
"""


def measure(store: Path, stream: bool, batch_rows: int) -> dict:
    """Run the analysis of ``store`` in a fresh process; its figures."""
    code = _CHILD.format(root=str(ROOT), dlrm=str(DLRM), store=str(store), stream=stream,
                         batch=batch_rows)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--batch-rows", type=int, default=200_000)
    ap.add_argument("--skip-memory", action="store_true",
                    help="do not run the load-it-whole comparison")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=ROOT.parent / "tmp" if (ROOT.parent / "tmp").is_dir()
                                     else None) as d:
        store = Path(d) / "scale.retime"
        t0 = time.perf_counter()
        size = build_store(store, a.ranks)
        print(f"store: {a.ranks} ranks, {size['ops']:,} ops ({size['ops_bytes_in_memory'] / 2**20:.0f} MiB "
              f"of ops columns in memory), {size['disk_bytes'] / 2**20:.0f} MiB on disk; written "
              f"rank by rank in {time.perf_counter() - t0:.1f} s")
        s = measure(store, True, a.batch_rows)
        print(f"stream (batches of {a.batch_rows:,} ops): wall {s['wall_s']:.1f} s, CPU "
              f"{s['cpu_s']:.1f} s, peak RSS {s['peak_above_base_mb']:.0f} MiB above the "
              f"{s['base_rss_mb']:.0f} MiB after imports/warm-up")
        if not a.skip_memory:
            m = measure(store, False, a.batch_rows)
            print(f"memory (read_trace + analysis): wall {m['wall_s']:.1f} s, CPU "
                  f"{m['cpu_s']:.1f} s, peak RSS {m['peak_above_base_mb']:.0f} MiB above the "
                  f"{m['base_rss_mb']:.0f} MiB after imports/warm-up")
            print(f"ratio memory/stream: peak RSS {m['peak_above_base_mb'] / max(s['peak_above_base_mb'], 1):.1f}x, "
                  f"CPU {m['cpu_s'] / max(s['cpu_s'], 1e-9):.2f}x; same breakdown: "
                  f"{m['digest'] == s['digest'] and m['rows'] == s['rows']}")
        print(f"breakdown rows {s['rows']}, collectives {s['collectives']}, top op {s['top_op']!r}")


if __name__ == "__main__":
    main()
