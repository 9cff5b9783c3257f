"""Scale bench: N ranks of a real Kineto trace, ingest / analyze / replay / what-if / report.

Generates ``N`` rank files in the run (nothing is stored in git) from the largest shared
trace (``shared/traces/kineto/v100-ddp-sgd``, 54 MB of JSON, 216k events), as plain JSON in
Kineto's own text layout (the source's text with only the changed values rewritten, 54.6 MB
per rank: 7.0 GB at N = 128): each copy gets its own ``distributedInfo`` rank and world size, a per-rank arrival skew (up to 5 us: NCCL kernels are 4-8 us apart) and
NCCL kernels that wait for the last rank, with jitter (so collective matching and arrival
skew do real work; see :func:`generate`). Then each command runs as a real ``retime`` subprocess, and the bench prints
wall time, CPU time, GB/s of JSON and the peak RSS of the whole process tree (sampled, so
``--jobs`` workers count) for each, and, between sizes, the growth exponent in N.

Peers in the same run: ``ingest`` streamed (the default) against ``--in-memory`` (parse
every rank, merge the parts, save: the former path), ``ingest --scheduler`` on a local Dask
cluster of 2 workers, then ``analyze --scheduler`` of its store on the same cluster (one task
per rank; each worker's peak and after-job RSS, and the workers' CPU), ``replay``/``report``
against ``analyze`` on the same store (with the memory ``replay`` said it would need before
loading), and ``report`` (streamed by default on a rank store of
more than 2 M ops, :mod:`analysis.report_stream`) against ``report --in-memory``. Figures are printed, never asserted. GB/s is JSON
bytes per wall second of the whole command.

    python bench/scale.py [--ranks 8 32] [--jobs N] [--layout rank] [--workdir DIR]
                          [--baseline CHECKOUT] [--repeat R] [--keep DIR] [--no-warm]
                          [--skip ingest-memory dask analyze replay whatif report
                                  report-memory]

With ``--baseline`` (another checkout, e.g. main's) its ``ingest`` runs on the same files,
alternating with ours ``--repeat`` times, and the bench prints the ratio of each pair: on a
shared machine, only runs side by side under the same load compare. Its identity ``replay``
runs just before ours on the same store, and the bench says whether the two JSON objects are
equal (all but ``memory``, what each said it needs) and how many windows ours used. The store
of the run before is deleted before each timed ``ingest`` (not by its ``--force``): deleting a
store written seconds earlier waits for its write-back (0.05-1.8 s measured on the shared
host), which is not ingest work and which no ingest of a new store pays. The "floor" line is
the physical limit of reading the same files (plain reads from the page cache, no
parsing); "GB per CPU-s" divides by the CPU time of the whole process tree.

Before any timed run, every command runs once, untimed, on 2 generated ranks from each
checkout (``--no-warm`` skips it): numba caches its kernels beside their sources, so a fresh
checkout's first commands would compile them inside the smallest N's timings. At the end,
one summary table (bench/scale_summary.py): per mode (ingest, analyze, replay, report) wall
/ CPU / peak RSS at each N, the growth exponents in N, and issue 30's targets met or not.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from decimal import Decimal
from pathlib import Path

import numpy as np
import orjson
from scale_summary import exponent, summary

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT.parent / "shared" / "traces" / "kineto" / "v100-ddp-sgd" / "df_index_resolver.json.gz"


_NUM = rb"(-?[0-9][0-9.eE+-]*)"


def _template(raw: bytes, events: list) -> tuple[list[bytes], np.ndarray, np.ndarray, np.ndarray]:
    """The source text cut around every event's ``ts`` value and every NCCL kernel's ``dur``
    value: (static pieces, which event each cut belongs to, whether it is a ``dur``, the
    source value in ns). Checked against the decoded events, so a cut can never land on
    another event's field."""
    ts = list(re.finditer(rb'"ts": ' + _NUM, raw))
    du = list(re.finditer(rb'"dur": ' + _NUM, raw))
    with_ts = [i for i, e in enumerate(events) if "ts" in e]
    with_dur = [i for i, e in enumerate(events) if "dur" in e]
    if len(ts) != len(with_ts) or len(du) != len(with_dur):
        raise SystemExit(f"{SRC}: cannot align the text with its events "
                         f"({len(ts)} ts for {len(with_ts)} events); use another source trace")
    cuts = [(m.span(1), i, False, events[i]["ts"]) for m, i in zip(ts, with_ts, strict=True)]
    cuts += [(m.span(1), i, True, events[i]["dur"]) for m, i in zip(du, with_dur, strict=True)
             if _is_nccl(events[i])]
    cuts.sort(key=lambda c: c[0][0])
    pieces, pos = [], 0
    for (a, b), _i, _, v in cuts:
        if float(raw[a:b]) != float(v):
            raise SystemExit(f"{SRC}: text and events disagree at byte {a}; use another trace")
        pieces.append(raw[pos:a])
        pos = b
    pieces.append(raw[pos:])
    ev = np.array([c[1] for c in cuts], np.int64)
    is_dur = np.array([c[2] for c in cuts], bool)
    ns = np.array([int(Decimal(raw[a:b].decode()) * 1000) for (a, b), *_ in cuts], np.int64)
    return pieces, ev, is_dur, ns


def _is_nccl(e: dict) -> bool:
    return e.get("cat") == "kernel" and "nccl" in str(e.get("name", "")).lower()


def _us(ns: np.ndarray) -> list[bytes]:
    """Microseconds with 3 decimals (as Kineto writes ``ts``/``dur``), exactly from ns."""
    q, r = np.divmod(ns, 1000)
    return [b"%d.%03d" % qr for qr in zip(q.tolist(), r.tolist(), strict=True)]


def generate(out: Path, n_ranks: int, *, seed: int = 0, skew_us: float = 5.0,
             jitter: float = 0.05) -> int:
    """Write ``n_ranks`` Kineto files ``rank-R.json`` into ``out``; return their bytes.

    Each file is the source trace's own text (Kineto's layout: one field group per line,
    53.7 MB per rank, as torch writes it), with only these values replaced: rank ``r``'s
    ``distributedInfo.rank = r`` and ``world_size = n_ranks``; every timestamp shifted by
    the rank's arrival skew, drawn in ``[0, skew_us)``; every NCCL kernel waits for the last
    rank to arrive, as a real one does (it ends ``skew_us`` after the earliest possible
    arrival plus its own duration scaled by ``1 + U(-jitter, jitter)``, never past the next
    NCCL kernel of its stream): collectives' members overlap in time on every rank while
    their start and end times differ. Times are written in us with 3 decimals, exact in ns."""
    raw = gzip.decompress(SRC.read_bytes())
    events = orjson.loads(raw)["traceEvents"]
    pieces, ev, is_dur, src_ns = _template(raw, events)
    nccl_idx = [i for i, e in enumerate(events) if _is_nccl(e)]
    ts_ns = dict(zip(ev[~is_dur].tolist(), src_ns[~is_dur].tolist(), strict=True))
    # room to grow: the gap to the next NCCL kernel on the same stream (ns)
    room = {}
    by_tid: dict = {}
    for i in nccl_idx:
        by_tid.setdefault(events[i].get("tid"), []).append(i)
    for idx in by_tid.values():
        idx.sort(key=lambda i: events[i]["ts"])
        for a, b in zip(idx, idx[1:] + [None], strict=True):
            room[a] = (ts_ns[b] - ts_ns[a] if b is not None
                       else 2 ** 62)
    k_of = {i: k for k, i in enumerate(nccl_idx)}
    dur_k = np.array([k_of[i] for i in ev[is_dur].tolist()], np.int64)
    dur_room = np.array([room[i] for i in ev[is_dur].tolist()], np.int64)
    head = pieces[0]
    m = re.search(rb'"distributedInfo": \{[^}]*\}', head)
    if m is None:
        raise SystemExit(f"{SRC}: no distributedInfo before traceEvents; use another trace")
    rng = np.random.default_rng(seed)
    offs = rng.uniform(0, skew_us, size=n_ranks)
    offs[0] = 0.0
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for r in range(n_ranks):
        off_ns = round(float(offs[r]) * 1000)
        sc = 1.0 + rng.uniform(-jitter, jitter, size=len(nccl_idx))
        vals = src_ns.copy()
        vals[~is_dur] += off_ns
        d = np.rint(src_ns[is_dur] * sc[dur_k]).astype(np.int64) + round(skew_us * 1000) - off_ns
        vals[is_dur] = np.minimum(d, dur_room - 1)
        info = (b'"distributedInfo": {"backend": "nccl", "rank": %d, "world_size": %d}'
                % (r, n_ranks))
        parts = [head[:m.start()] + info + head[m.end():]]
        for v, p in zip(_us(vals), pieces[1:], strict=True):
            parts.append(v)
            parts.append(p)
        blob = b"".join(parts)
        (out / f"rank-{r}.json").write_bytes(blob)
        total += len(blob)
    return total


def floor(src: Path) -> dict:
    """The physical floor of reading ``src``'s files in this process: plain reads (and gzip
    inflate for ``.gz``) of every byte, no parsing; wall seconds and GB."""
    t0 = time.perf_counter()
    n = 0
    buf = bytearray(4 << 20)
    for f in sorted(src.iterdir()):
        if f.suffix == ".gz":
            with gzip.open(f, "rb") as fh:
                while got := fh.readinto(buf):
                    n += got
        else:
            with open(f, "rb") as fh:
                while got := fh.readinto(buf):
                    n += got
    return {"wall_s": time.perf_counter() - t0, "gb": n / 1e9}


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


def run(cmd: list[str], label: str, root: Path = ROOT) -> dict:
    """Run a retime command of the checkout ``root`` in a fresh process: wall, CPU (it and
    its children), tree RSS, and the 1-minute load average when it ended."""
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "RETIME_PROGRESS": "0"}
    c0 = os.times()
    t0 = time.perf_counter()
    # cwd: `python -m` puts it first on sys.path, so from another checkout it would import that
    p = subprocess.Popen([sys.executable, "-m", "retime", *cmd], env=env, cwd=root,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    mon = TreeRss(p.pid)
    out, err = p.communicate()
    wall = time.perf_counter() - t0
    peak = mon.stop()
    c1 = os.times()
    cpu = (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
    res = {"label": label, "wall_s": wall, "cpu_s": cpu, "rss_gb": peak / 1e9,
           "rc": p.returncode, "load": os.getloadavg()[0]}
    if p.returncode:
        res["error"] = (err.strip().splitlines() or ["?"])[-1][:200]
    elif "--json" in cmd and '"estimated_peak_bytes"' in out:
        # what `retime replay` said it would need, before loading (replay/footprint.py)
        js = orjson.loads(out)
        res["estimated_gb"] = js["memory"]["estimated_peak_bytes"] / 1e9
        res["windows"] = js["memory"].get("windows", 1)
        # the figures, to compare with the baseline's (memory: what each said it needs)
        res["json"] = {k: v for k, v in js.items() if k != "memory"}
    return res


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 if it is missing)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def imported_from(root: Path) -> str:
    """The collectors package a command of checkout ``root`` imports (as :func:`run` starts it)."""
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", "import retime.collectors as c; print(c.__file__)"],
                          env=env, cwd=root, capture_output=True, text=True).stdout.strip()


def dask_rows(src: Path, out: Path, workers: int = 2) -> list[dict]:
    """``retime ingest --scheduler`` then ``retime analyze --scheduler`` of its store on one
    LocalCluster of ``workers`` processes started here: each command's own figures plus each
    worker's peak RSS during it, its RSS after it and the workers' CPU seconds during it (the
    workers are sampled on their own: they are not the command's children)."""
    import psutil
    from distributed import Client, LocalCluster

    # the workers import this checkout's retime, as the command does
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    rows = []
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc, set_as_default=False) as c:
        pids = list(c.run(os.getpid).values())
        procs = [psutil.Process(p) for p in pids]
        for args, label in (
                (["ingest", str(src), "-o", str(out), "--force"], "ingest"),
                (["analyze", str(out), "--json"], "analyze")):
            base = max(p.memory_info().rss for p in procs)
            cpu0 = sum(sum(p.cpu_times()[:2]) for p in procs)
            mons = [TreeRss(p) for p in pids]
            r = run([*args, "--scheduler", lc.scheduler_address],
                    f"{label} --scheduler ({workers} workers)")
            peaks = [m.stop() for m in mons]
            r["worker_cpu_s"] = sum(sum(p.cpu_times()[:2]) for p in procs) - cpu0
            time.sleep(1.0)
            after = max(p.memory_info().rss for p in procs)
            r.update(worker_peak_gb=max(peaks) / 1e9, worker_after_gb=after / 1e9,
                     worker_base_gb=base / 1e9)
            rows.append(r)
            if r.get("error"):
                break
    return rows


def line(r: dict, gb: float | None = None) -> str:
    # a Dask run's CPU is the client's only (the workers are not its children)
    per_cpu = "" if "worker_peak_gb" in r else f"{gb / r['cpu_s']:.2f} GB per CPU-s; " if gb \
        else ""
    rate = f", {gb / r['wall_s']:.2f} GB/s ({per_cpu}load {r['load']:.1f})" if gb else ""
    tail = f"   exit {r['rc']}: {r['error']}" if r.get("error") else ""
    if "estimated_gb" in r:
        tail += f"; estimated before loading {r['estimated_gb']:.2f} GB"
    if "store_gb" in r:
        tail += f"; store {r['store_gb']:.2f} GB"
    if "worker_peak_gb" in r:
        tail += (f"; workers' CPU {r['worker_cpu_s']:.1f} s; per worker: peak "
                 f"{r['worker_peak_gb']:.2f} GB, after the job "
                 f"{r['worker_after_gb']:.2f} GB (idle before: {r['worker_base_gb']:.2f} GB)")
    return (f"  {r['label']:<34} wall {r['wall_s']:6.1f} s  CPU {r['cpu_s']:6.1f} s  "
            f"peak RSS (tree) {r['rss_gb']:5.2f} GB{rate}{tail}")


#: what-ifs that run on the generated ranks, each with the ops columns it reads (issue 30):
#: kernel-class re-pricing (adds ``flops``) and a slowed rank (the what-if's own columns)
WHATIFS = (("hardware.compute_speedup=2", "compute_speedup=2"),
           ("stragglers.slow_ranks=[1] stragglers.slowdown=1.5", "slow rank 1 x1.5"))


def whatif_rows(store: Path, baseline: Path | None) -> list[tuple[dict, None]]:
    """``retime replay --set`` rows: one refused from the store's metadata (the generated
    ranks' collectives carry no sizes), then :data:`WHATIFS`, each after ``baseline``'s run
    of it when given (same store, same load)."""
    rows = [(run(["replay", str(store), "--json", "--set", "network.inter_node_gbps=100"],
                 "replay --set inter_node_gbps=100"), None)]
    for keys, label in WHATIFS:
        sets = [x for k in keys.split() for x in ("--set", k)]
        if baseline:
            rows.append((run(["replay", str(store), "--json", *sets],
                             f"baseline replay --set {label}", root=baseline), None))
        rows.append((run(["replay", str(store), "--json", *sets], f"replay --set {label}"),
                      None))
    return rows


def warm_up(base: Path, roots: list[Path], layout: str) -> None:
    """Run each command once, untimed, on 2 generated ranks from every checkout: numba
    caches its kernels next to their sources, so the first commands of a fresh checkout
    compile them (the 8-rank replay and report paid 4-12 s of CPU for it in one run)."""
    t0 = time.perf_counter()
    src, store = base / "warm-ranks", base / "warm.retime"
    generate(src, 2)
    for root in roots:
        for cmd in (["ingest", str(src), "-o", str(store), "--layout", layout, "--force"],
                    ["analyze", str(store), "--json"], ["replay", str(store), "--json"],
                    ["report", str(store), "-o", str(base / "warm.html"), "--force"],
                    *([["report", str(store), "-o", str(base / "warm-s.html"), "--stream",
                        "--force"]] if layout == "rank" else [])):
            r = run(cmd, "warm-up", root=root)
            if r.get("error"):
                print(f"  warm-up {cmd[0]} ({root}): exit {r['rc']}: {r['error']}", flush=True)
        shutil.rmtree(store, ignore_errors=True)
    shutil.rmtree(src, ignore_errors=True)
    print(f"warm-up (each command once on 2 ranks, untimed): {time.perf_counter() - t0:.1f} s",
          flush=True)


STEPS = ("ingest", "ingest-memory", "dask", "analyze", "replay", "whatif", "report",
         "report-memory")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--jobs", type=int, default=None,
                    help="ingest --jobs (default: the command's own default, the cores)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another retime checkout (e.g. `git worktree add ../base main`): its "
                         "ingest runs on the same files, interleaved with ours, as a peer")
    ap.add_argument("--repeat", type=int, default=1,
                    help="ingest runs per checkout (interleaved with --baseline's)")
    ap.add_argument("--layout", choices=("rank", "single"), default="rank")
    ap.add_argument("--skip", nargs="*", default=[], choices=STEPS)
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where the rank files and stores go (default: a temporary folder)")
    ap.add_argument("--no-warm", action="store_true",
                    help="skip the untimed warm-up (every command once on 2 generated ranks, "
                         "so that no timed run compiles numba kernels into a fresh checkout)")
    ap.add_argument("--keep", type=Path, default=None,
                    help="keep the generated rank files in KEEP/ranks-N (not deleted) and "
                         "reuse them when a later run finds them there")
    a = ap.parse_args()
    if a.baseline is not None:
        a.baseline = a.baseline.resolve()
        if not (a.baseline / "retime" / "__main__.py").is_file():
            raise SystemExit(f"--baseline {a.baseline}: not a retime checkout (no "
                             "retime/__main__.py); pass the root of one, e.g. a worktree of main")
    for root in (ROOT, a.baseline) if a.baseline else (ROOT,):
        print(f"checkout {root}: runs {imported_from(root)}", flush=True)
    base = Path(tempfile.mkdtemp(prefix="retime-scale-", dir=a.workdir)).resolve()
    if not a.no_warm:
        warm_up(base, [ROOT, a.baseline] if a.baseline else [ROOT], a.layout)
    results: dict[str, list[tuple[int, dict]]] = {}
    gb_of: dict[int, float] = {}
    try:
        for n in a.ranks:
            src = base / f"ranks-{n}"
            t0 = time.perf_counter()
            kept = a.keep is not None and (a.keep / f"ranks-{n}").is_dir()
            if a.keep is not None:
                src = a.keep / f"ranks-{n}"
            nbytes = (sum(f.stat().st_size for f in src.iterdir()) if kept
                      else generate(src, n))
            gb = gb_of[n] = nbytes / 1e9
            print(f"N = {n}: {gb:.2f} GB of JSON {'kept from before' if kept else 'generated'} "
                  f"in {time.perf_counter() - t0:.1f} s", flush=True)
            store = base / f"run-{n}.retime"
            fl = floor(src)
            print(f"  floor: plain read of the same files in one process: {fl['wall_s']:.1f} s,"
                  f" {fl['gb'] / fl['wall_s']:.2f} GB/s (page cache; load "
                  f"{os.getloadavg()[0]:.1f})", flush=True)
            jobs = ["--jobs", str(a.jobs)] if a.jobs else []
            rows = []
            if "ingest" not in a.skip:
                ours, peer = [], []
                for k in range(a.repeat):  # ours and the baseline's alternate: same load
                    if a.baseline:  # first, so that the store the later steps read is ours
                        shutil.rmtree(store, ignore_errors=True)  # untimed: see the docstring
                        peer.append(run(["ingest", str(src), "-o", str(store), "--layout",
                                         a.layout, *jobs, "--force"], f"baseline ingest #{k + 1}",
                                        root=a.baseline))
                        peer[-1]["store_gb"] = tree_bytes(store) / 1e9
                    shutil.rmtree(store, ignore_errors=True)
                    ours.append(run(["ingest", str(src), "-o", str(store), "--layout", a.layout,
                                     *jobs, "--force"], f"ingest (streamed) #{k + 1}"))
                    ours[-1]["store_gb"] = tree_bytes(store) / 1e9
                for r in ours + peer:
                    print(line(r, gb), flush=True)
                for who, rs in (("ours", ours), ("baseline", peer)):
                    if len(rs) > 1:  # the load moves walls run to run: medians, and its range
                        wall = float(np.median([r["wall_s"] for r in rs]))
                        print(f"  {who} ingest, median of {len(rs)}: wall {wall:.1f} s "
                              f"({gb / wall:.2f} GB/s), CPU "
                              f"{float(np.median([r['cpu_s'] for r in rs])):.1f} s, peak RSS "
                              f"{float(np.median([r['rss_gb'] for r in rs])):.2f} GB; load "
                              f"{min(r['load'] for r in rs):.1f}-{max(r['load'] for r in rs):.1f}",
                              flush=True)
                if peer:
                    ratio = [o["wall_s"] / p["wall_s"] for o, p in zip(ours, peer, strict=True)]
                    cpu = [o["cpu_s"] / p["cpu_s"] for o, p in zip(ours, peer, strict=True)]
                    print(f"  ours / baseline ingest ({a.repeat} interleaved pairs): wall "
                          f"{' '.join(f'{x:.2f}' for x in ratio)} (median "
                          f"{float(np.median(ratio)):.2f}x), CPU median "
                          f"{float(np.median(cpu)):.2f}x", flush=True)
                best = min(ours, key=lambda r: r["wall_s"])
                rows.append((dict(best, label="ingest (streamed)"), gb))
            if "ingest-memory" not in a.skip:
                mem = base / f"mem-{n}.retime"
                rows.append((run(["ingest", str(src), "-o", str(mem), "--layout", a.layout,
                                  *jobs, "--in-memory", "--force"],
                                 "ingest --in-memory (peer)"), gb))
                shutil.rmtree(mem, ignore_errors=True)
                if "ingest" in a.skip:
                    store = mem
            if "dask" not in a.skip:
                dk = base / f"dask-{n}.retime"
                dr = dask_rows(src, dk)
                rows += [(r, gb if r["label"].startswith("ingest") else None) for r in dr]
                shutil.rmtree(dk, ignore_errors=True)
            if a.keep is None:
                shutil.rmtree(src, ignore_errors=True)
            if "analyze" not in a.skip:
                rows.append((run(["analyze", str(store), "--json"], "analyze"), None))
            if "replay" not in a.skip:
                if a.baseline:  # side by side under the same load, and the same figures?
                    peer_r = run(["replay", str(store), "--json"], "baseline replay (identity)",
                                 root=a.baseline)
                    rows.append((peer_r, None))
                rows.append((run(["replay", str(store), "--json"], "replay (identity)"), None))
                if a.baseline and "json" in rows[-1][0] and "json" in peer_r:
                    ours_j, peer_j = rows[-1][0]["json"], peer_r["json"]
                    diff = sorted(k for k in set(ours_j) | set(peer_j)
                                  if ours_j.get(k) != peer_j.get(k))
                    print(f"  replay (identity), {rows[-1][0]['windows']} window(s): JSON "
                          + ("equal to the baseline's (all but memory)" if not diff else
                             f"DIFFERS from the baseline's in {diff}"), flush=True)
            if "whatif" not in a.skip:
                rows += whatif_rows(store, a.baseline)
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
                             f"{exponent(ns, [r['worker_peak_gb'] for _, r in ok]):.2f}, "
                             f"workers' CPU "
                             f"{exponent(ns, [r['worker_cpu_s'] for _, r in ok]):.2f}"
                             if "worker_peak_gb" in ok[0][1] else "")
                    print(f"  {label:<34} wall {exponent(ns, [r['wall_s'] for _, r in ok]):.2f}, "
                          f"CPU {exponent(ns, [r['cpu_s'] for _, r in ok]):.2f}, peak RSS "
                          f"{exponent(ns, [r['rss_gb'] for _, r in ok]):.2f}{extra}")
        for label, xs in results.items():  # the Dask path's done-when: independent of N
            if xs and "worker_peak_gb" in xs[0][1]:
                print(f"  {label}: per-worker peak RSS by N: " + ", ".join(
                    f"{n}: {r['worker_peak_gb']:.2f} GB (after {r['worker_after_gb']:.2f})"
                    for n, r in xs if not r.get("error")))
        for ln in summary(results, gb_of):
            print(ln, flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
