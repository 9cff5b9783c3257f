"""Sweep throughput: 1,000 scenarios on a 10^6-op trace, 1 vs 2 workers (issue 8 item 4).

Prints, for a synthesized trace of about ``--ops`` ops (GPT-3 13B, TP8 x PP4, micro-batches
chosen to reach the size):

* the per-scenario cost in one process: the replay (``simulate`` with modified durations)
  and the row metrics (:func:`replay.sweep.scenario_metrics`), best of a few,
* the wall time of ``--scenarios`` scenarios with ``sweep(workers=1)`` (in-process) and with
  ``workers=2`` local processes and a 2-worker Dask LocalCluster, start-up included, and the
  speed-up over 1 worker (the target: under 60 s on 2 cores, near-linear speed-up),
* the real ``replay.whatif`` on a few scenarios of the same trace (per-scenario cost), so the
  distance between the engine-bound sweep and a policy-bound one is visible,
* with ``--real N``: N real policy scenarios (:func:`policy_grid`, a 10 x 10 x 10 grid of
  ``hardware.compute_speedup`` x ``network.inter_node_gbps`` x overlap keys, run by the
  default ``replay.whatif``): first the CPU cost per scenario of each overlap kind (async,
  serial, interference: best of 3, ``process_time``, in this process, caches warm), the
  one-off costs of a network setting (its re-synthesis and graph, its first serial
  scenario's graph with the serializing edges, its first interference scenario's successor
  lists; the shipped trace's own setting builds its graph), the projected CPU of the grid
  (these one-off costs included: ~16 s of it), then the wall time of the
  whole sweep on ``--real-workers`` local processes (skip with ``--real-sample-only``) with
  the CPU its worker processes used (sampled from /proc: the wall time on a loaded machine
  says little, the CPU / workers is the wall time on idle cores). A network change on a
  synthesized run re-synthesizes the trace (the network policy lives in
  replay/policies/network.py); each setting is re-synthesized by one worker. The 800
  interference scenarios run the contention path (replay/_fluid.py) and dominate.

The engine-bound scenarios scale compute and communication durations (``hardware.
compute_speedup`` x ``network.comm_speedup``) on a graph built once per worker, which is
what a what-if that only re-times ops costs. Run on 2 cores:
``taskset -c 0,1 python bench/sweep.py [--ops 1e6] [--scenarios 1000] [--whatif 3]``;
real policies: ``python bench/sweep.py --only-real --real 1000 [--real-sample-only]``
(each worker re-synthesizes a network setting once: replay.sweep groups the scenarios by
it and SynthSpec.synthesize reuses the run).

Measured with ``--only-real --real 1000`` on 2 shared cores, the same contention kernel:
84 s wall / 159 s worker CPU before the work around the kernel (op-order results and their
row metrics, per-scenario duration copies), 72 s / 135 s after (results kept in layout
order, row metrics in one sequential pass, deferred scaling); on a loaded machine 122 s /
163 s before, 114 s / 143 s after. The rest is the kernel:
~0.13 s of the ~0.14 s CPU of an interference scenario. With the contention kernel's
sorted job list and in-loop toggle test (replay/_fluid.py) as well: 56-75 s / 107-139 s
over 9 runs (median ~70 s), the code before those changes interleaved with them 73-85 s
(median 82 s); the host's speed drifts by ~25% within minutes (2026-12-01, morning).
With a flow's re-rates in one pass over the job list, the kernel's per-graph set-up, the
trace handed to the workers in a file and each worker dropping a finished group's runs
(2026-12-01, later): 56, 49, 50, 57, 54 s wall / 93-109 s worker CPU over 5 runs, the
morning's code interleaved with three of them 58, 61, 62 s / 111-117 s; worker page
faults 774k -> ~300k.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from retime.replay import build_graph, simulate  # noqa: E402
from retime.replay.graph_data import RES_COMM, RES_COMPUTE  # noqa: E402
from retime.replay.sweep import scenario_metrics, sweep  # noqa: E402

_GRAPH: dict = {}


def scaled_run(trace, scenario):
    """Re-time compute / communication by the scenario's factors on a cached graph."""
    g = _GRAPH.get(id(trace))
    if g is None or g.trace is not trace:
        g = _GRAPH[id(trace)] = build_graph(trace)
    d = g.op_dur_ns.astype(np.float64)  # op-id order, as simulate takes them
    res = g.by_op(g.resource)
    d[res == RES_COMPUTE] /= float(scenario.get("hardware.compute_speedup", 1.0))
    d[res == RES_COMM] /= float(scenario.get("network.comm_speedup", 1.0))
    return simulate(g, durations_ns=d.astype(np.int64))


def make_trace(n_ops: float):
    from retime.collectors.synth import synthesize

    # 32 ranks (TP8 x PP4) of GPT-3 13B emit ~12.3k ops per micro-batch
    gb = max(8, int(round(n_ops / 12_350)))
    return synthesize("gpt3-13b", "h100-sxm", tp=8, pp=4, dp=1, global_batch=gb,
                      micro_batch=1, expand="all", check_memory=False)


def grid(n: int) -> list[dict]:
    side = int(np.ceil(np.sqrt(n)))
    c = np.linspace(0.5, 4.0, side)
    m = np.linspace(0.25, 8.0, side)
    out = [{"hardware.compute_speedup": float(a), "network.comm_speedup": float(b)}
           for a in c for b in m]
    return out[:n]


#: inter-node bandwidths swept (GB/s per GPU and direction); 50 is the h100-sxm profile's
#: own value (its NIC), so that column re-times nothing and re-synthesizes nothing
NETWORK_GBPS = (50.0, 12.5, 25.0, 37.5, 62.5, 75.0, 100.0, 200.0, 400.0, 800.0)
OVERLAP = ({}, {"overlap.mode": "serial"},
           *({"overlap.interference": f} for f in (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2)))


def policy_grid(n: int = 1000) -> list[dict]:
    """``n`` real what-if scenarios: compute speed-up (10 values) x inter-node bandwidth (10)
    x overlap (async as traced, serial, 8 interference fractions), in that nesting."""
    out = [{"hardware.compute_speedup": float(c), "network.inter_node_gbps": b, **o}
           for c in np.round(np.linspace(0.8, 2.6, 10), 2) for b in NETWORK_GBPS
           for o in OVERLAP]
    return out[:n]


def real_sweep(tr, n: int, workers: int, sample_only: bool) -> None:
    """Per-kind cost of real scenarios, then the sweep of ``n`` of them."""
    from retime.replay import whatif

    net = {"hardware.compute_speedup": 1.4, "network.inter_node_gbps": 25.0}
    kinds = {  # one per overlap kind of the grid (the bandwidth changes the trace, not the cost)
        "async (compute + network)": net,
        "serial overlap (+ compute + network)": {**net, "overlap.mode": "serial"},
        "interference (+ compute + network)": {**net, "overlap.interference": 0.5},
    }
    # a network setting's first what-if re-synthesizes the run and builds its graph; each
    # worker does that once per setting it is dealt (replay.sweep deals whole settings), and
    # the setting's first serial scenario derives a graph with the serializing edges, its
    # first interference scenario the contention path's successor lists
    t = time.process_time()
    scenario_metrics(whatif(tr, {"network.inter_node_gbps": 25.0}))
    first = time.process_time() - t
    firsts = {}
    for name, sc in (("serial", {"overlap.mode": "serial"}),
                     ("interference", {"overlap.interference": 0.5})):
        t = time.process_time()
        scenario_metrics(whatif(tr, {"network.inter_node_gbps": 25.0, **sc}))
        firsts[name] = time.process_time() - t
    # the shipped trace's own graph (the grid's 50 GB/s column: its worker builds it)
    t = time.process_time()
    scenario_metrics(whatif(pickle.loads(pickle.dumps(tr)), {}))
    own = time.process_time() - t
    cost = {}
    for name, sc in kinds.items():
        c = best_of(lambda sc=sc: scenario_metrics(whatif(tr, sc)), k=3,
                    clock=time.process_time)
        cost[name] = c
        print(f"  real whatif + row metrics, {name}: {c:.3f} s CPU per scenario (best of 3, "
              "caches warm)")
    # the contention path's cost depends on how much compute and communication overlap:
    # a spread of the grid's interference scenarios (the 800 that dominate)
    spread = [{"hardware.compute_speedup": c, "network.inter_node_gbps": b,
               "overlap.interference": f}
              for c, b, f in ((0.8, 12.5, 0.2), (0.8, 800.0, 0.9), (2.6, 12.5, 0.9),
                              (2.6, 800.0, 0.2), (1.4, 50.0, 0.6))]
    cs = [best_of(lambda sc=sc: scenario_metrics(whatif(tr, sc)), k=2,
                  clock=time.process_time) for sc in spread]
    print(f"  interference over the grid (5 points, best of 2 each): {min(cs):.3f} .. "
          f"{max(cs):.3f} s CPU, mean {np.mean(cs):.3f} s")
    cost["interference (+ compute + network)"] = float(np.mean(
        [*cs, cost["interference (+ compute + network)"]]))
    resynth = max(first - cost["async (compute + network)"], 0.0)
    ser1 = max(firsts["serial"] - cost["serial overlap (+ compute + network)"], 0.0)
    int1 = max(firsts["interference"] - cost["interference (+ compute + network)"], 0.0)
    own = max(own - cost["async (compute + network)"], 0.0)
    print(f"  first what-if of a network setting: re-synthesis + graph + per-trace caches "
          f"{resynth:.2f} s CPU; first serial (graph with the serializing edges) +{ser1:.2f} s; "
          f"first interference (successor lists) +{int1:.2f} s; the shipped trace's own setting "
          f"(its graph, no re-synthesis) {own:.2f} s")
    scs = policy_grid(n)
    n_ser = sum(s.get("overlap.mode") == "serial" for s in scs)
    n_int = sum("overlap.interference" in s for s in scs)
    n_asy = len(scs) - n_ser - n_int
    n_net = len({s["network.inter_node_gbps"] for s in scs} - {NETWORK_GBPS[0]})
    per_setting = resynth + ser1 + int1
    proj = (n_asy * cost["async (compute + network)"]
            + n_ser * cost["serial overlap (+ compute + network)"]
            + n_int * cost["interference (+ compute + network)"]
            + n_net * per_setting + own + ser1 + int1)
    print(f"  grid of {len(scs)}: {n_asy} async, {n_ser} serial, {n_int} interference "
          f"(contention path); {n_net} network settings to re-synthesize "
          f"({n_net * per_setting:.0f} s CPU with their first serial / interference set-up). "
          f"Projected CPU ~{proj:.0f} s = ~{proj / workers:.0f} s wall on {workers} idle cores "
          f"(+ pool start-up); the interference scenarios alone: "
          f"~{n_int * cost['interference (+ compute + network)'] / workers:.0f} s")
    if sample_only:
        return
    from retime.replay.sweep import SweepInterrupted

    load0 = os.getloadavg()[0]
    t, c = time.perf_counter(), time.process_time()
    with ChildCPU() as kids:
        try:
            df = sweep(tr, scs, workers=workers)
            done = len(df)
        except SweepInterrupted as exc:  # Ctrl-C / timeout -s INT: report the finished rows
            df, done = exc.frame, len(exc.frame)
    wall = time.perf_counter() - t
    errs = int(df["error"].notna().sum())
    print(f"sweep of {done}/{len(scs)} real scenarios, "
          f"workers={workers}: {wall:.0f} s wall "
          f"({done / wall:.2f} scenarios/s; parent CPU {time.process_time() - c:.0f} s), "
          f"{errs} error row(s)")
    cpu = kids.cpu_s
    print(f"  worker processes' CPU: {cpu:.0f} s ({cpu / max(done, 1) * 1e3:.0f} ms per "
          f"scenario, start-up and re-synthesis included); CPU-bound wall on {workers} idle "
          f"cores ~{cpu / workers:.0f} s; the sweep kept {cpu / wall:.2f} cores busy "
          f"(1-min load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after: other "
          f"processes' load stretches the wall time)")
    print(f"  worker page faults: {kids.minor_faults / 1e3:.0f}k (first touches of fresh "
          f"pages, {kids.minor_faults * 4096 / 1e9:.1f} GB: the OS zeroes each)")
    if done:
        ok = df[df["error"].isna()]
        print(f"  step time over the grid: {ok['step_time_ns'].min() / 1e9:.3f} .. "
              f"{ok['step_time_ns'].max() / 1e9:.3f} s")


class ChildCPU:
    """CPU seconds (user + system) of this process's descendants (the sweep's forkserver and
    workers, which are not our direct children, so ``RUSAGE_CHILDREN`` misses them),
    sampled from /proc every 0.2 s: a worker's last sample counts (up to 0.2 s early)."""

    def __init__(self) -> None:
        import threading

        self._seen: dict[int, float] = {}
        self._faults: dict[int, int] = {}
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK")

    def __enter__(self):
        self._th.start()
        return self

    def __exit__(self, *exc) -> None:
        self._sample()
        self._stop.set()
        self._th.join()

    @property
    def cpu_s(self) -> float:
        return sum(self._seen.values())

    @property
    def minor_faults(self) -> int:
        """Page faults of the descendants (first touches of fresh pages)."""
        return sum(self._faults.values())

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def _sample(self) -> None:
        parent: dict[int, int] = {}
        cpu: dict[int, float] = {}
        flt: dict[int, int] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(d)] = int(st[1])
            cpu[int(d)] = (int(st[11]) + int(st[12])) / self._tick
            flt[int(d)] = int(st[7])
        me = os.getpid()
        for pid in cpu:
            p, hops = parent.get(pid), 0
            while p is not None and p != me and hops < 8:
                p, hops = parent.get(p), hops + 1
            if p == me and pid != me:
                self._seen[pid] = max(self._seen.get(pid, 0.0), cpu[pid])
                self._faults[pid] = max(self._faults.get(pid, 0), flt[pid])


def best_of(f, k=3, clock=time.perf_counter):
    ts = []
    for _ in range(k):
        t = clock()
        f()
        ts.append(clock() - t)
    return min(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=float, default=1e6)
    ap.add_argument("--scenarios", type=int, default=1000)
    ap.add_argument("--whatif", type=int, default=3, help="real whatif scenarios to time")
    ap.add_argument("--no-dask", action="store_true")
    ap.add_argument("--real", type=int, default=0,
                    help="also time N real policy scenarios (policy_grid)")
    ap.add_argument("--real-workers", type=int, default=2)
    ap.add_argument("--real-sample-only", action="store_true",
                    help="time each kind of real scenario, do not run the whole sweep")
    ap.add_argument("--only-real", action="store_true",
                    help="skip the engine-bound sweeps")
    a = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"cores available: {cores}")
    t = time.perf_counter()
    tr = make_trace(a.ops)
    print(f"trace: {tr.n_ops:,} ops, {len(tr.edges):,} edges, {tr.world_size} ranks "
          f"(synthesized in {time.perf_counter() - t:.1f} s)")
    if a.only_real:
        real_sweep(tr, a.real or 1000, a.real_workers, a.real_sample_only)
        return
    t = time.perf_counter()
    res = scaled_run(tr, {})  # builds the graph, warms the kernels
    t_build_s = time.perf_counter() - t
    print(f"graph build (once per worker): {t_build_s:.2f} s")
    scenario_metrics(res)
    g = _GRAPH[id(tr)]
    t_sim = best_of(lambda: scaled_run(tr, {"hardware.compute_speedup": 1.5}))
    t_met = best_of(lambda: scenario_metrics(res))
    c_sim = best_of(lambda: scaled_run(tr, {"hardware.compute_speedup": 1.5}), clock=time.process_time)
    c_met = best_of(lambda: scenario_metrics(res), clock=time.process_time)
    print(f"per scenario, one process: replay {t_sim * 1e3:.1f} ms wall / {c_sim * 1e3:.1f} ms "
          f"CPU ({g.dur_ns.size / c_sim / 1e6:.1f} M ops/s), metrics {t_met * 1e3:.1f} ms "
          f"wall / {c_met * 1e3:.1f} ms CPU")

    scs = grid(a.scenarios)
    # workers must import scaled_run by name: a __main__ function would be pickled by value
    # (cloudpickle), its graph cache with it, once per task
    sys.path.insert(0, str(ROOT / "bench"))
    import sweep as this  # noqa: PLC0415  this file, under an importable name

    run = this.scaled_run
    walls = {}
    cpu1 = 0.0
    for w in (1, 2):
        t, c = time.perf_counter(), time.process_time()
        df = sweep(tr, scs, run=run, workers=w)
        walls[w] = time.perf_counter() - t
        if w == 1:
            cpu1 = time.process_time() - c
        assert df["error"].isna().all(), df["error"].dropna().iloc[0]
        print(f"sweep {len(scs)} scenarios, workers={w}: {walls[w]:.1f} s "
              f"({len(scs) / walls[w]:.1f} scenarios/s)"
              + (f", speed-up {walls[1] / walls[w]:.2f}x over 1 worker" if w > 1 else
                 f"; CPU {cpu1:.1f} s = {cpu1 / len(scs) * 1e3:.0f} ms per scenario "
                 f"(the machine's other load does not count here)"))
        if w == 1:
            base = df
        else:
            same = base.drop(columns=[]).equals(df)
            print(f"  rows equal to workers=1: {same}")
    per = cpu1 / len(scs)
    print(f"CPU-bound projection, 1,000 scenarios: {1000 * per:.0f} s on 1 core, "
          f"{1000 * per / 2 + t_build_s:.0f} s on 2 workers (+ each worker's graph build "
          f"{t_build_s:.1f} s)")
    if not a.no_dask:
        from distributed import Client, LocalCluster

        # the workers' stack-sampling profiler costs ~10% CPU on this grid (README: Dask
        # sweeps); spawned workers read their config from the environment
        os.environ.setdefault("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", "False")
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                          dashboard_address=":0", silence_logs=50) as lc, \
                Client(lc, set_as_default=False) as client:
            t = time.perf_counter()
            df = sweep(tr, scs, run=run, scheduler=client)
            wd = time.perf_counter() - t
            print(f"sweep {len(scs)} scenarios, Dask LocalCluster 2 workers (worker profiler enabled: "
                  f"{os.environ['DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED']}): {wd:.1f} s, "
                  f"speed-up {walls[1] / wd:.2f}x over 1 worker; rows equal: "
                  f"{base.equals(df)}")
    if a.whatif:
        from retime.replay import whatif

        wscs = [{"network.inter_node_gbps": 25}, {"hardware.compute_speedup": 2.0},
                {"overlap.mode": "serial"}][:a.whatif]
        ts = []
        for sc in wscs:
            t = time.perf_counter()
            scenario_metrics(whatif(tr, sc))
            ts.append(time.perf_counter() - t)
        print(f"real whatif, {len(wscs)} scenarios: {np.mean(ts):.2f} s per scenario "
              f"(builds the replay graph each call: {len(scs)} would take "
              f"~{np.mean(ts) * len(scs) / 2:.0f} s on 2 workers)")
    if a.real:
        real_sweep(tr, a.real, a.real_workers, a.real_sample_only)


if __name__ == "__main__":
    main()
