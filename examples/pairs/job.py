"""One real training job of the paired-capture suite: torch DDP on gloo, captured with retime.

One process per host (``--host-rank``) spawns that host's ranks (``--nproc-per-host``); the
ranks meet at ``--master-addr`` (host0's veth address) and talk over the interface named by
``--ifname`` (``GLOO_SOCKET_IFNAME``). Run it through ``hosts.py`` (``capture.py`` does) so
that each host has its own network namespace, hostname and core; it also runs on a plain
machine (``--master-addr 127.0.0.1 --ifname lo``, one host).

Each rank runs ``--settle`` unprofiled steps (DDP rebuilds its buckets after the first one;
caches warm), then the overlap probe (:func:`overlap_probe`: how an all-reduce and a busy
training thread share the rank's core; ``--no-probe`` skips it), then profiles with the schedule
wait=``--wait`` (1), warmup=``--warmup`` (1), active=``--active`` under
retime's :class:`Capture` (record_shapes, with_stack, with_flops). Rank 0 writes
``OUT.job.json`` beside the output folder (``--record``): the knobs, the ranks' hosts, ``ddp_param_bytes`` and the
machine's load during the profiled steps (``load``; ``load_run``: settle + profiled steps):
``foreign``, the share of all cores that other processes (and the kernel's own work not
charged to a process) used, and ``ours``, the share our ranks used (from ``/proc/stat`` and
``/proc/PID/stat``; clock ticks, so +-1 tick per core over the window). Every
rank's trace gets the same record in its ``retimeCapture.job`` block, so a trace is
self-describing (``bench/pairs.py`` lifts it into ``Trace.meta``).

Models (``--model``):

* ``mlp``: ``--layers`` x (Linear(``--hidden``) + ReLU) + Linear(hidden, 1), as
  examples/capture_ddp.py; input (batch, hidden).
* ``cnn``: ``--layers`` x (Conv2d 3x3, ``--channels``, padding 1, + ReLU; the first takes 3
  channels) + global average pooling + Linear(channels, 1); input (batch, 3, ``--image``,
  ``--image``) (added for the pairs captured after the models were frozen).
* ``emb``: an embedding-heavy recommender, DLRM-like: ``--tables`` nn.EmbeddingBag tables
  (``--rows`` x ``--dim``, sum of ``--bag`` ids per sample, **dense** gradients, so DDP
  all-reduces every table whole), a bottom MLP (``--dense`` features -> 256 -> dim), the
  tables' and the bottom MLP's outputs concatenated, a top MLP (-> 512 -> 256 -> 1); input
  (batch, dense) floats and (tables, batch, bag) uniform ids (added for the second batch of
  pairs captured after the model was frozen; ``--checkpoint`` is refused).
* ``transformer``: ``--layers`` nn.TransformerEncoderLayer (d_model ``--d-model``, 4 heads,
  feed-forward 4 x d_model, batch-first, dropout 0) + mean pooling + Linear(d_model, 1);
  input (batch, ``--seq``, d_model).

``--checkpoint`` wraps every block (an MLP Linear+ReLU, a transformer layer) in
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import orjson
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

try:
    from retime.collectors.calibrate import overlap_probe
    from retime.collectors.capture import Capture, end_process
except ImportError:  # a checkout without retime installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from retime.collectors.calibrate import overlap_probe
    from retime.collectors.capture import Capture, end_process

#: the profiler schedule's default wait and warmup steps (``--wait``, ``--warmup``)
WAIT, WARMUP = 1, 1
#: glibc malloc of the ranks: every allocation from the main heap (no per-chunk mmaps, one
#: arena), never given back to the kernel. With --pretouch-mb the heap is grown and touched
#: once before training, so the profiled steps (where the profiler's buffers grow the
#: process by 50-130 MB) reuse resident pages. Why: on this VM (virtio-balloon with free page
#: reporting) memory the guest freed goes back to the host, and a process's first touch of
#: such a page costs ~25 us (measured: 1 GiB touched fresh 6.4 s, again 0.18 s), enough to
#: move a 70 ms step by tens of ms depending on where the allocator lands.
GLIBC_TUNABLES = ("glibc.malloc.mmap_max=0:glibc.malloc.arena_max=1:"
                  f"glibc.malloc.trim_threshold={1 << 40}")


class Blocks(nn.Module):
    """A stack of blocks and a head; each block optionally checkpointed."""

    def __init__(self, blocks: list[nn.Module], head: nn.Module, pool: bool,
                 ckpt: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.head = head
        self.pool = pool
        self.ckpt = ckpt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False) if self.ckpt else b(x)
        if self.pool:  # transformer: over the sequence; cnn: over the image
            x = x.mean(dim=1) if x.dim() == 3 else x.mean(dim=(2, 3))
        return self.head(x)


class EmbMLP(nn.Module):
    """DLRM-like: embedding-bag tables (dense gradients) + bottom and top MLPs."""

    def __init__(self, tables: int, rows: int, dim: int, dense: int) -> None:
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(dense, 256), nn.ReLU(), nn.Linear(256, dim),
                                    nn.ReLU())
        # sparse=False (the default): each table's gradient is a dense rows x dim tensor,
        # all-reduced whole by DDP (what a DLRM trained with plain DDP does)
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum")
                                    for _ in range(tables))
        self.top = nn.Sequential(nn.Linear(dim * (tables + 1), 512), nn.ReLU(),
                                 nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 1))

    def forward(self, x: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        dense, ids = x
        feats = [self.bottom(dense)] + [t(ids[i]) for i, t in enumerate(self.tables)]
        return self.top(torch.cat(feats, dim=1))


def build_model(a: argparse.Namespace) -> nn.Module:
    if a.model == "emb":
        if a.checkpoint:
            raise SystemExit("job: --checkpoint is not defined for --model emb")
        return EmbMLP(a.tables, a.rows, a.dim, a.dense)
    if a.model == "cnn":
        blocks = [nn.Sequential(nn.Conv2d(3 if i == 0 else a.channels, a.channels, 3,
                                          padding=1), nn.ReLU()) for i in range(a.layers)]
        return Blocks(blocks, nn.Linear(a.channels, 1), pool=True, ckpt=a.checkpoint)
    if a.model == "mlp":
        blocks = [nn.Sequential(nn.Linear(a.hidden, a.hidden), nn.ReLU()) for _ in range(a.layers)]
        return Blocks(blocks, nn.Linear(a.hidden, 1), pool=False, ckpt=a.checkpoint)
    blocks = [nn.TransformerEncoderLayer(a.d_model, nhead=4, dim_feedforward=4 * a.d_model,
                                         dropout=0.0, batch_first=True)
              for _ in range(a.layers)]
    return Blocks(blocks, nn.Linear(a.d_model, 1), pool=True, ckpt=a.checkpoint)


def inputs(a: argparse.Namespace, rank: int) -> tuple:
    gen = torch.Generator().manual_seed(1234 + rank)  # each rank its own data shard
    if a.model == "emb":
        ids = torch.randint(0, a.rows, (a.tables, a.batch, a.bag), generator=gen)
        return ((torch.randn(a.batch, a.dense, generator=gen), ids),
                torch.randn(a.batch, 1, generator=gen))
    shape = {"mlp": (a.batch, a.hidden), "transformer": (a.batch, a.seq, a.d_model),
             "cnn": (a.batch, 3, a.image, a.image)}[a.model]
    return torch.randn(*shape, generator=gen), torch.randn(a.batch, 1, generator=gen)


def knobs(a: argparse.Namespace) -> dict:
    """The job's settings as recorded in the trace (model shape included)."""
    k = {"model": a.model, "bucket_cap_mb": a.bucket_cap_mb,
         "batch": a.batch, "threads": a.threads, "checkpoint": a.checkpoint,
         "nhosts": a.nhosts, "nproc_per_host": a.nproc_per_host,
         "world_size": a.nhosts * a.nproc_per_host, "settle": a.settle, "active": a.active,
         "pretouch_mb": a.pretouch_mb, "glibc_tunables": GLIBC_TUNABLES,
         "schedule": {"wait": a.wait, "warmup": a.warmup, "active": a.active}}
    if a.model != "emb":  # the emb model has no stack of blocks
        k["layers"] = a.layers
    k.update({"mlp": {"hidden": a.hidden}, "transformer": {"d_model": a.d_model, "seq": a.seq},
              "cnn": {"channels": a.channels, "image": a.image},
              "emb": {"tables": a.tables, "rows": a.rows, "dim": a.dim, "bag": a.bag,
                      "dense": a.dense}}[a.model])
    k.update(json.loads(a.extra))  # what the launcher set outside the job (link rate, quota)
    return k


def _ticks(pids: list[int]) -> tuple[float, int, int]:
    """(monotonic s, machine busy ticks incl. steal, our ranks' ticks)."""
    f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    v = [int(x) for x in f[:8]]  # user nice system idle iowait irq softirq steal
    ours = 0
    for pid in pids:
        st = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ours += int(st[11]) + int(st[12])  # utime + stime, all threads
    return time.monotonic(), sum(v) - v[3] - v[4], ours


def _load(t0: tuple, t1: tuple) -> dict:
    per = os.sysconf("SC_CLK_TCK") * (t1[0] - t0[0]) * (os.cpu_count() or 1)
    ours = (t1[2] - t0[2]) / per
    return {"foreign": round(max(0.0, (t1[1] - t0[1]) / per - ours), 4),
            "ours": round(ours, 4), "wall_s": round(t1[0] - t0[0], 3)}


def _rss_mb() -> list[float]:
    """This process's resident and peak resident memory (MB)."""
    st = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines()
              if ":" in line)
    return [round(int(st[k].split()[0]) / 1024, 1) for k in ("VmRSS", "VmHWM")]


def _add_job(path: Path, job: dict) -> None:
    """Write ``job`` into the trace's ``retimeCapture`` block (rewrites the file)."""
    doc = orjson.loads(gzip.decompress(path.read_bytes()))
    doc.setdefault("retimeCapture", {})["job"] = job
    tmp = path.with_name(f".{path.name}.tmp")
    with gzip.open(tmp, "wb", compresslevel=6) as fh:
        fh.write(orjson.dumps(doc))
    os.replace(tmp, path)


def pretouch(mb: int) -> None:
    """Grow the (never trimmed, see GLIBC_TUNABLES) heap by ``mb`` MB of touched pages."""
    if mb <= 0:
        return
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    n = mb * 2**20
    ptr = libc.malloc(n)
    if ptr:
        ctypes.memset(ptr, 1, n)
        libc.free(ptr)


# the overlap probe is retime calibrate's (retime.collectors.calibrate.overlap_probe): the
# kit records the same measurement in its job block that `retime calibrate` writes to a file


def rank_main(local_rank: int, a: argparse.Namespace) -> None:
    rank = a.host_rank * a.nproc_per_host + local_rank
    world = a.nhosts * a.nproc_per_host
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world),
                      MASTER_ADDR=a.master_addr, MASTER_PORT=str(a.master_port),
                      GLOO_SOCKET_IFNAME=a.ifname)
    if a.cpus:
        cpus = [int(c) for c in a.cpus.split(",")]
        os.sched_setaffinity(0, {cpus[local_rank % len(cpus)]})
    pretouch(a.pretouch_mb)
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    import datetime

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    torch.manual_seed(0)
    model = DDP(build_model(a), bucket_cap_mb=a.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x, y = inputs(a, rank)

    def step() -> None:
        with torch.profiler.record_function("forward"):
            loss = nn.functional.mse_loss(model(x), y)
        with torch.profiler.record_function("backward"):
            loss.backward()
        with torch.profiler.record_function("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)

    pids: list = [None] * world
    hosts: list = [None] * world
    dist.all_gather_object(pids, os.getpid())
    dist.all_gather_object(hosts, os.uname().nodename)
    t_run = _ticks(pids) if rank == 0 else None
    settle_ms = []
    for _ in range(a.settle):
        t = time.perf_counter()
        step()
        settle_ms.append((time.perf_counter() - t) * 1e3)
    job = knobs(a)
    if a.probe:
        job["overlap_probe"] = overlap_probe()
    job["ddp_param_bytes"] = [p.numel() * p.element_size() for p in model.parameters()]
    job["hosts"] = hosts
    rss_before = _rss_mb()
    dist.barrier()
    t0 = _ticks(pids) if rank == 0 else None
    n = a.wait + a.warmup + a.active
    with Capture(a.out, wait=a.wait, warmup=a.warmup, active=a.active, record_shapes=True,
                 with_stack=True, with_flops=True) as cap:
        for i in range(n):
            step()
            if i == n - 1 and rank == 0:
                t1 = _ticks(pids)  # before the last step() call writes the trace
            cap.step()
    rss: list = [None] * world
    dist.all_gather_object(rss, rss_before + _rss_mb())
    if rank == 0:
        job["rss_mb"] = rss  # per rank: [rss, peak] before the capture, [rss, peak] after
        job["load"] = _load(t0, t1)
        job["load_run"] = _load(t_run, t1)
        job["settle_ms"] = [round(v, 2) for v in settle_ms]
        Path(a.record or f"{a.out.rstrip('/')}.job.json").write_text(
            json.dumps(job, indent=1) + "\n")
    for p in cap.paths:
        _add_job(p, {k: v for k, v in job.items() if k not in ("load", "load_run", "settle_ms", "rss_mb")})
    dist.barrier()
    end_process(0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the traces (rank-*.pt.trace.json.gz)")
    p.add_argument("--model", choices=("mlp", "transformer", "cnn", "emb"), default="mlp")
    p.add_argument("--tables", type=int, default=8, help="emb: embedding-bag tables")
    p.add_argument("--rows", type=int, default=4000, help="emb: rows per table")
    p.add_argument("--dim", type=int, default=64, help="emb: embedding dimension")
    p.add_argument("--bag", type=int, default=8, help="emb: ids per sample and table")
    p.add_argument("--dense", type=int, default=16, help="emb: dense features per sample")
    p.add_argument("--channels", type=int, default=96, help="cnn: channels of every conv")
    p.add_argument("--image", type=int, default=16, help="cnn: input image side (3 channels)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512, help="mlp: width")
    p.add_argument("--d-model", type=int, default=256, help="transformer: d_model")
    p.add_argument("--seq", type=int, default=64, help="transformer: sequence length")
    p.add_argument("--batch", type=int, default=64, help="per-rank batch")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket_cap_mb (MiB)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    p.add_argument("--checkpoint", action="store_true", help="activation checkpointing per block")
    p.add_argument("--settle", type=int, default=3, help="unprofiled steps first")
    p.add_argument("--active", type=int, default=3, help="recorded steps")
    p.add_argument("--wait", type=int, default=WAIT, help="profiler schedule: idle steps first")
    p.add_argument("--warmup", type=int, default=WARMUP,
                   help="profiler schedule: traced but discarded steps before the active ones")
    p.add_argument("--pretouch-mb", type=int, default=256,
                   help="heap grown and touched by each rank before training (MB; see "
                        "GLIBC_TUNABLES; 0: off)")
    p.add_argument("--no-probe", dest="probe", action="store_false",
                   help="skip the overlap probe (overlap_probe) before the profiled steps")
    p.add_argument("--nhosts", type=int, default=1)
    p.add_argument("--nproc-per-host", type=int, default=1)
    p.add_argument("--host-rank", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29517)
    p.add_argument("--ifname", default="lo", help="GLOO_SOCKET_IFNAME")
    p.add_argument("--cpus", default="",
                   help="pin local rank i to CPU cpus[i %% n] (comma list; default: inherit)")
    p.add_argument("--record", default="",
                   help="where rank 0 writes the job record (default: OUT.job.json, beside "
                        "the folder: the folder holds only traces, so it ingests as one run)")
    p.add_argument("--extra", default="{}", help="JSON object added to the recorded knobs")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    os.environ["GLIBC_TUNABLES"] = GLIBC_TUNABLES  # the spawned ranks start with it
    mp.start_processes(rank_main, args=(a,), nprocs=a.nproc_per_host, start_method="spawn")


if __name__ == "__main__":
    main()
