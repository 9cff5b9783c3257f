"""A real what-if check: predict a DDP run with other gradient buckets from a captured one.

Trains a small MLP with DDP on 2 CPU processes (gloo, one intra-op thread each), with two
gradient bucket sizes (``--base-mb`` A and ``--target-mb`` B, DDP's ``bucket_cap_mb`` in
MiB), captures it, and predicts each setting's step time from the captures of the other with
``replay.whatif`` and ``overlap.bucket_mb`` (issue #5 item 9; target: within 10%).

Measurement protocol (the "truth" must be steadier than the error we want to see):

* one launch of the 2 ranks holds both DDP models (same initial weights, separate modules
  and reducers) and alternates between them: a discarded warm-up pair first, then
  ``--pairs`` pairs in the order A B, B A, A B, ... so that a drift of the machine (it warms
  up, other processes come and go) hits both settings alike and cancels over the pairs;
* before each capture the model runs ``--settle`` unprofiled steps (its buffers back in the
  caches, DDP's rebuilt buckets in place) and the ranks time a few lone all-reduces of all
  the gradients (their CPU-busy share, below); then the profiler runs one warm-up step and
  records ``--active`` steps;
* other processes must not take the cores from the ranks: by default the ranks run under
  the normal scheduler at a raised priority (``--nice``, also their session's where the
  kernel shares the CPU between sessions); on a shared, busy machine ``--realtime`` (root)
  runs them under round-robin real-time scheduling with 3 ms slices (the kernel's
  round-robin slice, a system-wide setting, is set to that during the captures and
  restored), so other processes only get the cores while the ranks wait and the ranks' own
  threads still share a core finely, as on an idle machine. On a busy machine the normal scheduler's numbers are not those
  of an idle one: a rank's core goes to another process whenever its gloo thread waits on
  the socket, and comes back late, which slows one large bucket far more than small buckets
  overlapped with backward (seen on a shared 2-core machine: 1 MiB buckets 26% faster than
  100 MiB under the normal scheduler, 1% under the real-time one). Each capture records the share of the cores other processes used (``load``)
  and ours (``cpu``); pairs where both loads stay under ``--quiet`` are summarized apart;
* a capture's step time is the median over its recorded steps of the slowest rank's step
  span; a setting's measured figure is the median over its captures, with its spread
  ``(max - min) / median`` and the relative standard error of the mean;
* errors, both directions: each capture of one setting predicts the other setting; the
  *paired* error compares it with the capture of the other setting taken next to it (the
  same pair: the same machine state), ``mean +- standard error`` over the pairs; the *pooled*
  error compares the median prediction with the median measurement. Each capture is also
  re-bucketed to its own size (``A -> A``): the model's bias without a what-if.

The model (replay/policies/bucketing_cpu.py) re-buckets parameters one by one with DDP's
size rule in the order their gradients became ready, on each rank's CPU shared between the
training thread and the gloo thread (the engine's contention path). The bench gives it the
exact parameter sizes of the model it built (``trace.meta["ddp_param_bytes"]``, what a real
user can do: they have the model); ``--no-sizes`` leaves it to estimate them from copy
times. ``overlap.interference`` is a physical property of the machine, not fitted to the
errors: from the cores per rank and the CPU-busy share of a lone gloo all-reduce (a gloo
transfer partly waits on the peer's socket; that share of it overlaps compute for free),
the median of the probes of the session (:func:`cpu_interference`); ``--interference``
overrides it.

Usage::

    python bench/whatif_real.py [--pairs 12] [--active 15] [--base-mb 100] [--target-mb 1]
                                [--realtime] [--interference F] [--keep DIR [--reuse]]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from retime.collectors.errors import RetimeError  # noqa: E402
from retime.collectors.ingest import read  # noqa: E402
from retime.collectors.trace import Trace  # noqa: E402
from retime.replay.policies.bucketing import rebucket_cpu  # noqa: E402
from retime.replay.whatif import whatif  # noqa: E402

NPROCS = 2
#: round-robin time slice (ms) of the real-time ranks (the kernel's default,
#: 100 ms, would let a training thread keep its core for a whole step)
RR_SLICE_MS = 3
#: all-reduces of all the gradients timed before each capture for their CPU-busy share
COMM_PROBES = 8
#: the ranks are killed if the captures take longer than this
CAPTURE_TIMEOUT_S = 900


# ---------------------------------------------------------------------------- capture
def _build(hidden: int, layers: int):
    from torch import nn

    mods: list = []
    for _ in range(layers):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    mods.append(nn.Linear(hidden, 1))
    return nn.Sequential(*mods)


def _cpu_ticks(pids: list) -> tuple | None:
    """(wall s, machine busy ticks incl. steal, our ranks' ticks) from /proc, or None."""
    try:
        f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        v = [int(x) for x in f[:8]]  # user nice system idle iowait irq softirq steal
        busy = sum(v) - v[3] - v[4]
        ours = 0
        for pid in pids:
            st = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ours += int(st[11]) + int(st[12])  # utime + stime, all threads
        return time.monotonic(), busy, ours
    except (OSError, ValueError, IndexError):
        return None


def _shares(a: tuple | None, b: tuple | None) -> list | None:
    """``[foreign, ours]``: the shares of the machine's cores used by other processes (or
    stolen by the host) and by our ranks between two :func:`_cpu_ticks` readings (0.5 =
    one of two cores), or None."""
    if a is None or b is None or b[0] <= a[0]:
        return None
    per = os.sysconf("SC_CLK_TCK") * (b[0] - a[0]) * (os.cpu_count() or 1)
    ours = (b[2] - a[2]) / per
    return [max(0.0, (b[1] - a[1]) / per - ours), ours]


def _rank_main(local_rank: int, port: int, cfg: dict) -> None:
    """One rank: both DDP models, alternated; one capture folder per (setting, pair)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from retime.collectors.capture import Capture

    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank),
                      WORLD_SIZE=str(NPROCS), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # 2 ranks on 2 cores: one training thread each (+ gloo's)
    dist.init_process_group("gloo")
    models, opts = {}, {}
    for name, mb in cfg["settings"].items():
        torch.manual_seed(0)
        models[name] = DDP(_build(cfg["hidden"], cfg["layers"]), bucket_cap_mb=mb)
        opts[name] = torch.optim.SGD(models[name].parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1234 + local_rank)
    x = torch.randn(cfg["batch"], cfg["hidden"], generator=gen)
    y = torch.randn(cfg["batch"], 1, generator=gen)

    def step(name: str) -> None:
        with torch.profiler.record_function("forward"):
            loss = nn.functional.mse_loss(models[name](x), y)
        with torch.profiler.record_function("backward"):
            loss.backward()
        with torch.profiler.record_function("optimizer"):
            opts[name].step()
            opts[name].zero_grad(set_to_none=True)

    for name in models:  # DDP rebuilds its buckets in ready order after the first step
        for _ in range(3):
            step(name)
    pids = [None] * NPROCS
    dist.all_gather_object(pids, os.getpid())
    grads = torch.zeros(sum(p.numel() for p in models["A"].parameters()))

    def comm_cpu() -> float:
        """CPU-busy share of a gloo all-reduce of all the gradients, alone: this process's
        CPU time (all threads: the caller waits, a gloo thread works) over the wall time,
        mean of the ranks."""
        dist.barrier()
        t, c = time.perf_counter(), time.process_time()
        for _ in range(COMM_PROBES):
            dist.all_reduce(grads)
        share = torch.tensor([(time.process_time() - c) / (time.perf_counter() - t)])
        dist.all_reduce(share)
        return float(share) / NPROCS

    loads = {}
    for out, name in cfg["plan"]:
        for _ in range(cfg["settle"]):
            step(name)
        rho = comm_cpu()
        dist.barrier()
        before = _cpu_ticks(pids)
        with Capture(out, wait=0, warmup=1, active=cfg["active"]) as cap:
            for _ in range(1 + cfg["active"]):
                step(name)
                cap.step()
        loads[Path(out).name] = (_shares(before, _cpu_ticks(pids)) or [None, None]) + [rho]
    if local_rank == 0:  # gradient bytes of every parameter, in registration order
        sizes = [p.numel() * p.element_size() for p in models["A"].parameters()]
        Path(cfg["sizes"]).write_text(json.dumps(sizes))
        Path(cfg["loads"]).write_text(json.dumps(loads))
    dist.destroy_process_group()


@contextlib.contextmanager
def _raised_priority(nice: int, realtime: bool = False):
    """Run the ranks (spawned: they inherit it) ahead of other processes on a shared
    machine: at ``nice`` (the process's nice value and, where the kernel groups processes
    by session, ``/proc/self/autogroup``, its session's) and with ``realtime`` under
    round-robin real-time scheduling with ``RR_SLICE_MS`` slices. Everything is restored
    afterwards; what is not permitted is skipped (printed)."""
    ag = Path("/proc/self/autogroup")
    nice0 = os.getpriority(os.PRIO_PROCESS, 0)
    ag0 = None
    try:
        if ag.is_file():
            ag0 = int(ag.read_text().split("nice")[-1])
            ag.write_text(str(nice))
        os.setpriority(os.PRIO_PROCESS, 0, min(nice0, nice))
    except (OSError, ValueError):
        print(f"  (could not raise the priority to nice {nice}: not permitted; the captures "
              "compete with other processes as equals)")
    pol0 = slice0 = None
    rr = Path("/proc/sys/kernel/sched_rr_timeslice_ms")
    if realtime:
        try:
            # round-robin slices as short as the fair scheduler's, so that the ranks' own
            # threads (training and gloo) still share a core finely, as on an idle machine
            slice0 = int(rr.read_text())
            rr.write_text(str(RR_SLICE_MS))
            pol0 = os.sched_getscheduler(0), os.sched_getparam(0)
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
        except (OSError, AttributeError, ValueError):
            pol0 = None
            print("  (could not use real-time scheduling with short slices: not permitted; "
                  f"the ranks run under the normal scheduler at nice {nice})")
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            if slice0 is not None:
                rr.write_text(str(slice0))
            if pol0 is not None:
                os.sched_setscheduler(0, *pol0)
            os.setpriority(os.PRIO_PROCESS, 0, nice0)
            if ag0 is not None:
                ag.write_text(str(ag0))


def capture_all(work: Path, args: argparse.Namespace, settings: dict) -> list:
    """Run the 2 ranks once; return the plan ``[(folder, setting, pair)]`` (pair -1 is the
    discarded warm-up pair)."""
    import torch.multiprocessing as mp

    plan = []
    for k in range(-1, args.pairs):
        order = ("A", "B") if k % 2 == 0 or k < 0 else ("B", "A")
        for name in order:
            plan.append((str(work / f"{name}-{settings[name]:g}MiB-{k + 1:02d}"), name, k))
    for out, _, _ in plan:
        shutil.rmtree(out, ignore_errors=True)
    cfg = {"settings": settings, "plan": [(o, n) for o, n, _ in plan], "hidden": args.hidden,
           "layers": args.layers, "batch": args.batch, "active": args.active,
           "settle": args.settle, "sizes": str(work / "param_bytes.json"),
           "loads": str(work / "loads.json")}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with _raised_priority(args.nice, args.realtime):
        ctx = mp.spawn(_rank_main, args=(port, cfg), nprocs=NPROCS, join=False)
        deadline = time.monotonic() + CAPTURE_TIMEOUT_S
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for proc in ctx.processes:  # our own ranks
                    proc.kill()
                raise SystemExit(f"the captures did not finish in {CAPTURE_TIMEOUT_S} s "
                                 f"(ranks killed); traces so far in {work}")
    return plan


# ---------------------------------------------------------------------------- analysis
def step_ms(trace: Trace, start_ns: np.ndarray, end_ns: np.ndarray) -> float:
    """Median over recorded steps of the slowest rank's step span (ms): a rank's span is
    first start to last end of its ops attributed to that step (ProfilerStep ranges)."""
    o = trace.ops
    step = o["step"].to_numpy()
    rank = o["rank"].to_numpy()
    spans = []
    for s in np.unique(step[step >= 0]):
        worst = 0
        for r in np.unique(rank):
            sel = (step == s) & (rank == r)
            if sel.any():
                worst = max(worst, int(end_ns[sel].max() - start_ns[sel].min()))
        spans.append(worst)
    return float(np.median(spans)) / 1e6 if spans else float("nan")


def measured_ms(trace: Trace) -> float:
    o = trace.ops
    s = o["start_ns"].to_numpy()
    return step_ms(trace, s, s + o["dur_ns"].to_numpy())


def buckets_per_step(trace: Trace) -> float:
    """Gradient all-reduces per rank and step."""
    o = trace.ops
    ar = (o["kind"].to_numpy() == 3) & (o["bytes"].to_numpy() > 0)
    keys = o.loc[ar, ["rank", "step"]].drop_duplicates()
    return float(ar.sum() / max(len(keys), 1))


def predict_ms(trace: Trace, bucket_mib: float, interference: float | None) -> tuple[float, dict]:
    """Predicted step ms with DDP buckets of ``bucket_mib`` MiB (``bucket_cap_mb`` counts
    MiB; ``overlap.bucket_mb`` counts 10^6 bytes)."""
    sc = {"overlap.mode": "async", "overlap.bucket_mb": bucket_mib * 2**20 / 1e6}
    if interference is not None:
        sc["overlap.interference"] = interference
    res = whatif(trace, sc)
    info = (res.meta.get("scenario") or [{}])[-1]
    return step_ms(res.trace, res.start_ns, res.end_ns), info


def cpu_interference(comm_cpu: float = 1.0) -> float:
    """``overlap.interference`` (fraction of the ideal overlap achieved) of CPU ranks whose
    gloo all-reduces keep ``comm_cpu`` of a core busy (the rest of their time they wait on
    the peer's socket) while the training thread keeps one core busy, with ``c`` cores per
    rank (``cores / ranks``).

    The engine runs overlapped compute and communication at ``1 / (1 + i)`` of their rates,
    so a transfer ``T_m`` inside compute ``T_c`` ends after ``T_c + i T_m``; with the
    spare ``c - 1`` cores and the transfer's idle share packed (fair sharing),
    ``T_c + max(0, 1 + comm_cpu - c) T_m``: ``i = min(1, max(0, 1 + comm_cpu - c))`` and
    ``overlap.interference = 1 - i`` (one core per rank and a CPU-bound transfer: 0, the
    policy's default for CPU ranks).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    c = max(cores or 1, 1) / NPROCS
    i = min(1.0, max(0.0, 1.0 + min(max(comm_cpu, 0.0), 1.0) - c))
    return 1.0 - i


def _spread(v: list[float]) -> float:
    return (max(v) - min(v)) / statistics.median(v) if len(v) > 1 else float("nan")


def _rse(v: list[float]) -> float:
    """Relative standard error of the mean of ``v``."""
    return statistics.stdev(v) / len(v) ** 0.5 / abs(statistics.mean(v)) if len(v) > 1 \
        else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-mb", type=float, default=100.0, help="setting A: bucket_cap_mb (MiB)")
    p.add_argument("--target-mb", type=float, default=1.0, help="setting B: bucket_cap_mb (MiB)")
    p.add_argument("--pairs", type=int, default=12, help="captures per setting (interleaved)")
    p.add_argument("--active", type=int, default=15, help="recorded steps per capture")
    p.add_argument("--settle", type=int, default=2, help="unprofiled steps before a capture")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--interference", type=float, default=None,
                   help="overlap.interference to predict with (default: per capture from "
                        "the cores per rank and the probed CPU share of an all-reduce, see "
                        "cpu_interference)")
    p.add_argument("--no-sizes", action="store_true",
                   help="do not give the model the parameter sizes (estimate from copy times)")
    p.add_argument("--nice", type=int, default=-10,
                   help="nice value of the ranks while capturing (negative needs root or "
                        "CAP_SYS_NICE; not permitted: they run at the default priority)")
    p.add_argument("--realtime", action=argparse.BooleanOptionalAction, default=False,
                   help="capture with real-time round-robin scheduling, 3 ms slices (SCHED_RR, "
                        "needs root, else the ranks run at --nice): other processes then run "
                        "only while the ranks wait, an idle machine on a shared one (the "
                        "kernel keeps 5%% for others; it changes the system-wide round-robin slice while "
                        "capturing); default: the normal scheduler at --nice")
    p.add_argument("--quiet", type=float, default=0.1,
                   help="a pair is quiet when other processes used less than this share of "
                        "the cores during both of its captures")
    p.add_argument("--keep", type=Path, default=None, help="keep the traces in this folder")
    p.add_argument("--reuse", action="store_true",
                   help="with --keep: analyse the traces already there instead of capturing")
    args = p.parse_args(argv)

    work = args.keep or Path(tempfile.mkdtemp(prefix="retime-whatif-"))
    work.mkdir(parents=True, exist_ok=True)
    settings = {"A": args.base_mb, "B": args.target_mb}
    n_params = args.layers * (args.hidden * args.hidden + args.hidden) + args.hidden + 1
    print(f"model: {args.layers} x Linear({args.hidden}, {args.hidden}) + head, "
          f"{n_params * 4 / 2**20:.1f} MiB of fp32 gradients, batch {args.batch}; {NPROCS} "
          f"ranks, gloo, CPU, 1 intra-op thread per rank, {os.cpu_count()} cores; "
          f"{args.pairs} pairs of captures (+1 discarded), {args.active} recorded steps each; "
          + ("scheduling: real-time round-robin, 3 ms slices; "
             if args.realtime and not args.reuse else
             f"scheduling: normal, nice {args.nice} (--realtime on a busy machine); " if not args.reuse else "")
          + "overlap.interference: "
          + (f"{args.interference:g} (given)" if args.interference is not None else
             "from the cores per rank and the CPU share of a lone all-reduce (probed before "
             "every capture; the median), see cpu_interference"))
    t0 = time.perf_counter()
    if args.reuse:
        plan = json.loads((work / "plan.json").read_text())
    else:
        plan = capture_all(work, args, settings)
        (work / "plan.json").write_text(json.dumps(plan))
    t_cap = time.perf_counter() - t0
    sizes = None
    if not args.no_sizes:
        sizes = json.loads((work / "param_bytes.json").read_text())

    loads: dict = {}
    if (work / "loads.json").is_file():
        loads = json.loads((work / "loads.json").read_text())
    meas: dict[tuple[str, int], float] = {}
    load: dict[tuple[str, int], float] = {}
    busy: dict[tuple[str, int], float] = {}
    rho: dict[tuple[str, int], float] = {}  # CPU-busy share of a lone all-reduce
    traces: dict[tuple[str, int], Trace] = {}
    pred: dict[tuple[str, int], float] = {}
    same: dict[tuple[str, int], float] = {}  # each capture re-bucketed to its own size
    infos: dict[str, list[dict]] = {"A": [], "B": []}
    for out, name, k in plan:
        if k < 0:
            continue
        t = read(out)
        if sizes is not None:
            t.meta["ddp_param_bytes"] = sizes
        meas[(name, k)] = measured_ms(t)
        fo = [float("nan") if x is None else x for x in loads.get(Path(out).name) or []]
        fo += [float("nan")] * (3 - len(fo))
        load[(name, k)], busy[(name, k)], rho[(name, k)] = fo[:3]
        traces[(name, k)] = t
    # one physical parameter for the session: the median probed CPU share of an all-reduce
    probes = [v for v in rho.values() if np.isfinite(v)]
    comm_cpu = statistics.median(probes) if probes else 1.0
    f = args.interference if args.interference is not None else cpu_interference(comm_cpu)
    for (name, k), t in traces.items():
        other = "B" if name == "A" else "A"
        try:
            pred[(other, k)], info = predict_ms(t, settings[other], f)
            same[(name, k)] = predict_ms(t, settings[name], f)[0]
        except RetimeError as exc:
            raise SystemExit(f"the what-if refused a trace: {exc}") from exc
        info = dict(info, n_buckets=buckets_per_step(t))
        if not infos[name]:  # what overlap's scenario record leaves out
            cpu = rebucket_cpu(t, settings[other] * 2**20 / 1e6, 1.0)
            info["param_sizes"] = cpu[3]["param_sizes"] if cpu else "-"
        infos[name].append(info)
    pairs = sorted({k for _, k in meas})
    t_all = time.perf_counter() - t0
    print(f"\noverlap.interference {f:.3f} (i = {1 - f:.3f})"
          + (f": a lone all-reduce of all the gradients keeps {comm_cpu:.2f} of a core busy "
             f"(median of {len(probes)} probes, range {min(probes):.2f}-{max(probes):.2f}), "
             f"{(os.cpu_count() or 1) / NPROCS:g} core(s) per rank"
             if args.interference is None and probes else ""))
    a, b = settings["A"], settings["B"]
    print(f"\nper pair (ms per step, each the median of a capture's {args.active} steps; "
          "load: share of the cores other processes used during the capture; cpu: share our "
          "ranks used; comm: CPU share of a lone all-reduce probed before the capture)")
    hdr = (f"{'pair':>4} {f'{a:g} MiB':>9} {f'{b:g} MiB':>9} {'pred ' + f'{b:g}':>9} "
           f"{'err':>7} {'pred ' + f'{a:g}':>9} {'err':>7} {'load A':>6} {'load B':>6} "
           f"{'cpu A':>5} {'cpu B':>5} {'comm A':>6} {'comm B':>6}")
    print(hdr)
    for k in pairs:
        ea = pred[("B", k)] / meas[("B", k)] - 1
        eb = pred[("A", k)] / meas[("A", k)] - 1
        print(f"{k:4d} {meas[('A', k)]:9.2f} {meas[('B', k)]:9.2f} {pred[('B', k)]:9.2f} "
              f"{ea:+7.1%} {pred[('A', k)]:9.2f} {eb:+7.1%} {load[('A', k)]:6.2f} "
              f"{load[('B', k)]:6.2f} {busy[('A', k)]:5.2f} {busy[('B', k)]:5.2f} "
              f"{rho[('A', k)]:6.2f} {rho[('B', k)]:6.2f}")

    print("\nper setting (ms per step over its captures)")
    print(f"{'setting':>10} {'median':>8} {'min':>8} {'max':>8} {'spread':>7} {'+-se':>6}")
    for name in ("A", "B"):
        v = [meas[(name, k)] for k in pairs]
        print(f"{settings[name]:>6g} MiB {statistics.median(v):8.2f} {min(v):8.2f} "
              f"{max(v):8.2f} {_spread(v):7.1%} {_rse(v):6.1%}")
    quiet = [k for k in pairs if max(load[("A", k)], load[("B", k)]) < args.quiet]
    summary = {}
    for label, ks in (("all pairs", pairs), (f"quiet pairs (load < {args.quiet:g})", quiet)):
        if not ks:
            print(f"\n{label}: none")
            continue
        print(f"\nerrors, {label}: {len(ks)} (paired: each prediction against the capture of "
              "the same pair, mean +- standard error, and median; pooled: median prediction / "
              "median measurement - 1)")
        hdr = (f"{'direction':>16} {'measured':>9} {'predicted':>9} {'paired err':>10} "
               f"{'+-se':>6} {'median':>7} {'pooled err':>10} {'pred spread':>11} "
               f"{'change meas':>11} {'change pred':>11}")
        print(hdr)
        print("-" * len(hdr))
        for src, dst in (("A", "B"), ("B", "A"), ("A", "A"), ("B", "B")):
            p_of = pred if src != dst else same
            m = [meas[(dst, k)] for k in ks]
            pr = [p_of[(dst, k)] for k in ks]
            errs = [p_of[(dst, k)] / meas[(dst, k)] - 1 for k in ks]
            se = statistics.stdev(errs) / len(errs) ** 0.5 if len(errs) > 1 else float("nan")
            pooled = statistics.median(pr) / statistics.median(m) - 1
            cm = statistics.median([meas[(dst, k)] / meas[(src, k)] for k in ks])
            cp = statistics.median([p_of[(dst, k)] / meas[(src, k)] for k in ks])
            if src != dst:
                summary[(label, src)] = (statistics.mean(errs), se)
            print(f"{settings[src]:>6g} -> {settings[dst]:<5g}MiB {statistics.median(m):9.2f} "
                  f"{statistics.median(pr):9.2f} {statistics.mean(errs):+10.1%} {se:6.1%} "
                  f"{statistics.median(errs):+7.1%} {pooled:+10.1%} {_spread(pr):11.1%} "
                  f"{cm:11.3f} {cp:11.3f}")
    print("change: median over the pairs of (measured or predicted 'to') / measured 'from' of "
          "the same pair; A -> A and B -> B: each capture re-bucketed to its own size (the "
          "model's own bias, no what-if)")
    for name in ("A", "B"):
        inf = infos[name]
        fits = [i["interference_fit"] for i in inf if i.get("interference_fit") is not None]
        last = inf[-1]
        models = sorted({str(i.get("model", "generic")) for i in inf})
        print(f"model from {settings[name]:g} MiB: {'/'.join(models)}, "
              f"{statistics.median(i['n_buckets'] for i in inf):.0f} buckets per step, "
              f"parameter sizes from {inf[0].get('param_sizes', '?')}, transfer alpha "
              f"{last.get('alpha_ns', float('nan')) / 1e3:.0f} us, isolated bus bandwidth "
              f"{statistics.median(i.get('busbw_gbps', float('nan')) for i in inf):.2f} GB/s, "
              f"overlap.interference {last.get('interference', float('nan')):g}"
              + (f"; the interference i the traces show: median {statistics.median(fits):.2f} "
                 f"(range {min(fits):.2f}-{max(fits):.2f})" if fits else ""))
    print()
    for label in dict.fromkeys(lab for lab, _ in summary):
        errs = [v for (lab, _), v in summary.items() if lab == label]
        ok = all(abs(e) <= 0.10 for e, _ in errs)
        print(f"target |error| <= 10% in both directions, {label}: {'met' if ok else 'NOT met'}"
              f" ({a:g} -> {b:g} MiB, {b:g} -> {a:g} MiB: "
              f"{', '.join(f'{e:+.1%} +- {s:.1%}' for e, s in errs)})")
    print(f"capture {t_cap:.0f} s, total {t_all:.0f} s")
    if args.keep is None:
        print(f"(traces in {work}; pass --keep DIR to choose where)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
