"""Benchmark: ingest of a ~1 GB Nsight Systems SQLite export (target: under 20 s).

The export is generated from the real one in ../shared/traces/nsys: the schema is copied
verbatim from its ``sqlite_master`` and every event table is replicated N times along the
time axis (each copy shifted by the trace's span, correlation ids shifted so they stay unique
per process, torch NVTX texts made unique per copy as real ``op_id = N`` labels are).  The
generation runs inside SQLite (a recursive CTE), so it takes seconds, and the file is kept in
``bench/out/`` for later runs (``--regenerate`` rebuilds it).

Prints: file size, rows per table, ingest wall time (best of ``--repeat``), events/s, and the
ratio to the 20 s target; plus, as a peer reference measured in the same run, the time of a
bare ``SELECT`` of the same columns with Python's sqlite3 (the floor any reader built on it
pays).

    python bench/nsys_ingest.py [--size-gb 1.0] [--repeat 1] [--regenerate]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from retime.collectors.nsys import read_nsys  # noqa: E402

REAL = ROOT.parent / "shared" / "traces" / "nsys" / "h100-2gpu-fastvideo.sqlite"
OUT = ROOT / "bench" / "out"
EVENT_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME",
                "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS",
                "CUPTI_ACTIVITY_KIND_CUDA_EVENT")
# columns shifted per copy: time columns by the span, correlation ids by the id stride
TIME_COLS = ("start", "end", "timestamp")
CORR_COLS = ("correlationId",)


def generate(dst: Path, size_gb: float) -> None:
    """Write a ~size_gb export with the real file's schema to ``dst``."""
    src_bytes = REAL.stat().st_size
    copies = max(1, int(round(size_gb * 1e9 / src_bytes)))
    tmp = dst.with_suffix(".tmp")
    if tmp.exists():
        tmp.unlink()
    con = sqlite3.connect(tmp)
    con.execute("pragma journal_mode = off")
    con.execute("pragma synchronous = off")
    con.execute(f"attach database 'file:{REAL}?mode=ro' as src")
    schema = con.execute("select name, sql from src.sqlite_master where type = 'table' "
                         "and sql is not null").fetchall()
    for _, sql in schema:
        con.execute(sql)
    (t0, t1), = con.execute("select min(start), max(end) from src.CUPTI_ACTIVITY_KIND_RUNTIME")
    span = int(t1 - t0) + 1_000_000  # 1 ms gap between copies
    (cmax,), = con.execute("select max(correlationId) from src.CUPTI_ACTIVITY_KIND_RUNTIME")
    stride = int(cmax) + 1
    for name, _ in schema:
        cols = [r[1] for r in con.execute(f'pragma src.table_info("{name}")')]
        if name not in EVENT_TABLES:
            con.execute(f'insert into main."{name}" select * from src."{name}"')
            continue
        exprs = []
        for c in cols:
            if c in TIME_COLS:
                exprs.append(f'"{c}" + r.i * {span}')
            elif c in CORR_COLS:
                exprs.append(f'"{c}" + r.i * {stride}')
            elif name == "NVTX_EVENTS" and c == "text":
                exprs.append("case when text like '%op_id = %' then text || '.' || r.i else text end")
            else:
                exprs.append(f'"{c}"')
        con.execute(
            f"with recursive r(i) as (select 0 union all select i + 1 from r where i < {copies - 1}) "
            f'insert into main."{name}" ({", ".join(chr(34) + c + chr(34) for c in cols)}) '
            f'select {", ".join(exprs)} from r, src."{name}" order by r.i')
    con.commit()
    con.execute("detach database src")
    con.close()
    os.replace(tmp, dst)


def bare_select(path: Path) -> float:
    """Seconds to fetch the columns the reader needs with plain sqlite3 (the floor)."""
    t = time.perf_counter()
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    for q in ("select start, end, deviceId, streamId, correlationId, globalPid, demangledName "
              "from CUPTI_ACTIVITY_KIND_KERNEL",
              "select start, end, globalTid, correlationId, nameId from CUPTI_ACTIVITY_KIND_RUNTIME",
              "select start, end, eventType, globalTid, textId, text from NVTX_EVENTS"):
        con.execute(q).fetchall()
    con.close()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--regenerate", action="store_true")
    ap.add_argument("--out", type=Path, default=OUT / "nsys-synthetic.sqlite")
    a = ap.parse_args()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    if a.regenerate or not a.out.exists() or abs(a.out.stat().st_size / 1e9 - a.size_gb) > 0.25 * a.size_gb:
        t = time.perf_counter()
        generate(a.out, a.size_gb)
        print(f"generated {a.out} in {time.perf_counter() - t:.1f} s")
    size = a.out.stat().st_size
    with sqlite3.connect(f"file:{a.out}?mode=ro", uri=True) as con:
        rows = {t: con.execute(f'select count(*) from "{t}"').fetchone()[0] for t in EVENT_TABLES}
    print(f"file: {size / 1e9:.2f} GB, rows: " + ", ".join(f"{t.split('_')[-1]}={n:,}"
                                                         for t, n in rows.items()))
    floor = bare_select(a.out)
    best = cpu = float("inf")
    for _ in range(a.repeat):
        t, c = time.perf_counter(), time.process_time()
        tr = read_nsys(a.out, progress=False)
        best = min(best, time.perf_counter() - t)
        cpu = min(cpu, time.process_time() - c)
    n_events = sum(v["events_read"] for v in tr.meta["accounting"].values())
    print(f"read_nsys: {best:.2f} s (best of {a.repeat}) for {n_events:,} events, "
          f"{n_events / best / 1e6:.2f} M events/s, {size / 1e9 / best:.3f} GB/s; "
          f"{tr.n_ops:,} ops, {len(tr.edges):,} edges, {len(tr.ranges):,} ranges")
    print(f"process CPU time: {cpu:.2f} s (wall > CPU means other load on the machine; "
          f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print(f"target 20 s: {best / 20:.2f}x of budget ({'PASS' if best < 20 else 'OVER'})")
    print(f"peer floor (bare sqlite3 fetch of kernel/runtime/NVTX columns): {floor:.2f} s; "
          f"read_nsys / floor = {best / floor:.2f}x")


if __name__ == "__main__":
    main()
