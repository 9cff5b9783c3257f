"""Scale bench: N ranks of a real Kineto trace, ingest / analyze / replay / what-if / report.

Generates ``N`` rank files in the run (nothing is stored in git) from the largest shared
trace (``shared/traces/kineto/v100-ddp-sgd``, 54 MB of JSON, 216k events): each copy gets
its own ``distributedInfo`` rank and world size, a per-rank arrival skew (up to 5 us: NCCL kernels are 4-8 us apart) and
NCCL kernels that wait for the last rank, with jitter (so collective matching and arrival
skew do real work; see :func:`generate`). Then each command runs as a real ``retime`` subprocess, and the bench prints
wall time, CPU time, GB/s of JSON and the peak RSS of the whole process tree (sampled, so
``--jobs`` workers count) for each, and, between sizes, the growth exponent in N.

Peers in the same run: ``ingest`` streamed (the default) against ``--in-memory`` (parse
every rank, merge the parts, save: the former path), ``ingest --scheduler`` on a local Dask
cluster of 2 workers (each worker's peak and after-job RSS), ``replay``/``report``
against ``analyze`` on the same store, and ``report`` (streamed by default on a rank store of
more than 2 M ops, :mod:`analysis.report_stream`) against ``report --in-memory``. Figures are printed, never asserted. GB/s is JSON
bytes per wall second of the whole command.

    python bench/scale.py [--ranks 8 32] [--jobs 1] [--layout rank] [--workdir DIR]
                          [--skip ingest-memory dask analyze replay whatif report
                                  report-memory]
"""

from __future__ import annotations

import argparse
import gzip
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT.parent / "shared" / "traces" / "kineto" / "v100-ddp-sgd" / "df_index_resolver.json.gz"


def generate(out: Path, n_ranks: int, *, seed: int = 0, skew_us: float = 5.0,
             jitter: float = 0.05) -> int:
    """Write ``n_ranks`` Kineto files ``rank-R.json`` into ``out``; return their bytes.

    Rank ``r``'s copy: ``distributedInfo.rank = r``, ``world_size = n_ranks``; every
    timestamp shifted by the rank's arrival skew, drawn in ``[0, skew_us)``; every NCCL
    kernel waits for the last rank to arrive, as a real one does (it ends ``skew_us`` after
    the earliest possible arrival plus its own duration scaled by ``1 + U(-jitter, jitter)``,
    never past the next NCCL kernel of its stream): collectives' members overlap in time on
    every rank while their start and end times differ."""
    doc = orjson.loads(gzip.decompress(SRC.read_bytes()))
    events = doc.pop("traceEvents")
    has_ts = np.array(["ts" in e for e in events])
    nccl_idx = [i for i, e in enumerate(events) if e.get("cat") == "kernel"
                and "nccl" in str(e.get("name", "")).lower()]
    # room to grow: the gap to the next NCCL kernel on the same stream
    room = {}
    by_tid: dict = {}
    for i in nccl_idx:
        by_tid.setdefault(events[i].get("tid"), []).append(i)
    for idx in by_tid.values():
        idx.sort(key=lambda i: events[i]["ts"])
        for a, b in zip(idx, idx[1:] + [None], strict=True):
            room[a] = (events[b]["ts"] - events[a]["ts"]) if b is not None else math.inf
    rng = np.random.default_rng(seed)
    offs = rng.uniform(0, skew_us, size=n_ranks)
    offs[0] = 0.0
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for r in range(n_ranks):
        off = float(offs[r])
        sc = 1.0 + rng.uniform(-jitter, jitter, size=len(nccl_idx))
        evs = [dict(e, ts=e["ts"] + off) if h else e for e, h in zip(events, has_ts,
                                                                    strict=True)]
        for k, i in enumerate(nccl_idx):
            dur = float(events[i]["dur"]) * float(sc[k]) + (skew_us - off)
            evs[i]["dur"] = round(min(dur, room[i] - 0.001), 3)
        d = dict(doc)
        d["distributedInfo"] = {"backend": "nccl", "rank": r, "world_size": n_ranks}
        d["traceEvents"] = evs
        blob = orjson.dumps(d)
        (out / f"rank-{r}.json").write_bytes(blob)
        total += len(blob)
    return total


class TreeRss:
    """Peak of the summed RSS of a process and its descendants, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.proc = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                procs = [self.proc, *self.proc.children(recursive=True)]
                rss = 0
                for p in procs:
                    try:
                        rss += p.memory_info().rss
                    except psutil.Error:
                        pass
                self.peak = max(self.peak, rss)
            except psutil.Error:
                return
            self._stop.wait(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.peak


def run(cmd: list[str], label: str) -> dict:
    """Run a retime command in a fresh process: wall, CPU (it and its children), tree RSS."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "RETIME_PROGRESS": "0"}
    c0 = os.times()
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "retime", *cmd], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    mon = TreeRss(p.pid)
    out, err = p.communicate()
    wall = time.perf_counter() - t0
    peak = mon.stop()
    c1 = os.times()
    cpu = (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
    res = {"label": label, "wall_s": wall, "cpu_s": cpu, "rss_gb": peak / 1e9,
           "rc": p.returncode}
    if p.returncode:
        res["error"] = (err.strip().splitlines() or ["?"])[-1][:200]
    return res


def dask_ingest(src: Path, out: Path, workers: int = 2) -> dict:
    """``retime ingest --scheduler`` on a LocalCluster of ``workers`` processes started
    here: the command's own figures plus each worker's peak RSS during the job and its RSS
    after it (the workers are sampled on their own: they are not the command's children)."""
    import psutil
    from distributed import Client, LocalCluster

    # the workers import this checkout's retime, as the command does
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc, set_as_default=False) as c:
        pids = list(c.run(os.getpid).values())
        base = max(psutil.Process(p).memory_info().rss for p in pids)
        mons = [TreeRss(p) for p in pids]
        r = run(["ingest", str(src), "-o", str(out), "--scheduler", lc.scheduler_address,
                 "--force"], f"ingest --scheduler ({workers} workers)")
        peaks = [m.stop() for m in mons]
        time.sleep(1.0)
        after = max(psutil.Process(p).memory_info().rss for p in pids)
    r.update(worker_peak_gb=max(peaks) / 1e9, worker_after_gb=after / 1e9,
             worker_base_gb=base / 1e9)
    return r


def line(r: dict, gb: float | None = None) -> str:
    rate = f", {gb / r['wall_s']:.2f} GB/s" if gb else ""
    tail = f"   exit {r['rc']}: {r['error']}" if r.get("error") else ""
    if "worker_peak_gb" in r:
        tail += (f"; per worker: peak {r['worker_peak_gb']:.2f} GB, after the job "
                 f"{r['worker_after_gb']:.2f} GB (idle before: {r['worker_base_gb']:.2f} GB)")
    return (f"  {r['label']:<34} wall {r['wall_s']:6.1f} s  CPU {r['cpu_s']:6.1f} s  "
            f"peak RSS (tree) {r['rss_gb']:5.2f} GB{rate}{tail}")


def exponent(xs: list[int], ys: list[float]) -> float:
    """Least-squares slope of log(y) on log(N)."""
    lx, ly = np.log(np.asarray(xs, float)), np.log(np.maximum(np.asarray(ys, float), 1e-9))
    return float(np.polyfit(lx, ly, 1)[0]) if len(xs) > 1 else math.nan


STEPS = ("ingest", "ingest-memory", "dask", "analyze", "replay", "whatif", "report",
         "report-memory")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--layout", choices=("rank", "single"), default="rank")
    ap.add_argument("--skip", nargs="*", default=[], choices=STEPS)
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where the rank files and stores go (default: a temporary folder)")
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="retime-scale-", dir=a.workdir))
    results: dict[str, list[tuple[int, dict]]] = {}
    try:
        for n in a.ranks:
            src = base / f"ranks-{n}"
            t0 = time.perf_counter()
            nbytes = generate(src, n)
            gb = nbytes / 1e9
            print(f"N = {n}: {gb:.2f} GB of JSON generated in {time.perf_counter() - t0:.1f} s",
                  flush=True)
            store = base / f"run-{n}.retime"
            rows = []
            if "ingest" not in a.skip:
                rows.append((run(["ingest", str(src), "-o", str(store), "--layout", a.layout,
                                  "--jobs", str(a.jobs), "--force"], "ingest (streamed)"), gb))
            if "ingest-memory" not in a.skip:
                mem = base / f"mem-{n}.retime"
                rows.append((run(["ingest", str(src), "-o", str(mem), "--layout", a.layout,
                                  "--jobs", str(a.jobs), "--in-memory", "--force"],
                                 "ingest --in-memory (peer)"), gb))
                shutil.rmtree(mem, ignore_errors=True)
                if "ingest" in a.skip:
                    store = mem
            if "dask" not in a.skip:
                dk = base / f"dask-{n}.retime"
                rows.append((dask_ingest(src, dk), gb))
                shutil.rmtree(dk, ignore_errors=True)
            shutil.rmtree(src, ignore_errors=True)
            if "analyze" not in a.skip:
                rows.append((run(["analyze", str(store), "--json"], "analyze"), None))
            if "replay" not in a.skip:
                rows.append((run(["replay", str(store), "--json"], "replay (identity)"), None))
            if "whatif" not in a.skip:
                rows.append((run(["replay", str(store), "--json", "--set",
                                  "network.inter_node_gbps=100"],
                                 "replay --set inter_node_gbps=100"), None))
            if "report" not in a.skip:  # streamed on its own past 2 M ops of a rank store
                rows.append((run(["report", str(store), "-o", str(base / f"r{n}.html"),
                                  "--force"], "report -o X.html"), None))
            if "report-memory" not in a.skip:
                rows.append((run(["report", str(store), "-o", str(base / f"m{n}.html"),
                                  "--in-memory", "--force"], "report --in-memory (peer)"), None))
            for r, g in rows:
                print(line(r, g), flush=True)
                results.setdefault(r["label"], []).append((n, r))
            by = {r["label"]: r for r, _ in rows}
            ing, mem_r = by.get("ingest (streamed)"), by.get("ingest --in-memory (peer)")
            if ing and mem_r and not ing.get("error") and not mem_r.get("error"):
                print(f"  streamed / in-memory ingest: wall {ing['wall_s'] / mem_r['wall_s']:.2f}x,"
                      f" peak RSS {ing['rss_gb'] / mem_r['rss_gb']:.2f}x", flush=True)
            an = by.get("analyze")
            for k in ("replay (identity)", "report -o X.html", "report --in-memory (peer)"):
                if an and k in by and not by[k].get("error"):
                    print(f"  {k} / analyze: wall {by[k]['wall_s'] / an['wall_s']:.2f}x, peak RSS "
                          f"{by[k]['rss_gb'] / an['rss_gb']:.2f}x", flush=True)
            shutil.rmtree(store, ignore_errors=True)
        if len(a.ranks) > 1:
            print(f"growth exponent in N ({a.ranks[0]} to {a.ranks[-1]} ranks; wall time is "
                  "inflated by other load on a shared machine, CPU time less so):")
            for label, xs in results.items():
                ok = [(n, r) for n, r in xs if not r.get("error")]
                if len(ok) > 1:
                    ns = [n for n, _ in ok]
                    extra = (f", worker peak RSS "
                             f"{exponent(ns, [r['worker_peak_gb'] for _, r in ok]):.2f}"
                             if "worker_peak_gb" in ok[0][1] else "")
                    print(f"  {label:<34} wall {exponent(ns, [r['wall_s'] for _, r in ok]):.2f}, "
                          f"CPU {exponent(ns, [r['cpu_s'] for _, r in ok]):.2f}, peak RSS "
                          f"{exponent(ns, [r['rss_gb'] for _, r in ok]):.2f}{extra}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
