"""Measure a cluster once: collective cost over message sizes, and how a transfer shares a
rank's CPU with busy compute (``retime calibrate``; ``retime replay --calibration FILE``).

What a trace cannot show, a calibration measures, in the manner of nccl-tests (each size
timed alone, every rank at once, after a barrier) and of the overlap probe the pair kit ran
before its captures (now this module's :func:`overlap_probe`):

* ``collectives.all_reduce``: per message size (bytes), the time of one all-reduce on every
  rank (ns, ``reps`` repetitions each). Many sizes, so latency and bandwidth can be told
  apart (a trace usually holds one gradient-bucket size).
* ``overlap_probe``: all-reduces of 1 and 4 MiB timed alone and while the rank's thread keeps
  computing (matmul chunks, polled until the transfer completes), and the chunk's own rate
  alone and during the transfer (gloo on CPU: how a transfer and the training thread share a
  core; :class:`replay.policies.host_cpu.OverlapProbe` reads it).

A calibration file is JSON (:data:`FORMAT`); :func:`read_calibration` validates one and
:func:`attach` puts it on a trace (``meta["calibration"]``) for the what-ifs. Measuring needs
torch (the ``[torch]`` extra); reading does not. gloo is measured and tested here; NCCL runs
the same code on GPUs (``--backend nccl``); its bookkeeping (:func:`assemble`, the fit and
the refinement) is tested on an nccl-tests-shaped sweep, the GPU run itself only on a GPU.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .errors import TraceFormatError

__all__ = ["FORMAT", "DEFAULT_SIZES", "measure", "assemble", "overlap_probe",
           "read_calibration", "attach", "parse_sizes"]

#: the file's format tag and version
FORMAT = "retime-calibration/1"
#: default all-reduce sizes (bytes): 64 KiB to 16 MiB, doubling
DEFAULT_SIZES = tuple(2**k for k in range(16, 25))
#: the overlap probe's transfer sizes and compute chunk (a DIM x DIM fp32 matmul, a fraction
#: of a millisecond on one thread)
PROBE_BYTES = (2**20, 4 * 2**20)
PROBE_DIM = 192
PROBE_REPS = 3


def parse_sizes(text: str) -> tuple[int, ...]:
    """``"64K:16M"`` (doubling from the first to the last) or ``"1M,4M,16M"``; suffixes K, M,
    G are powers of 1024. Raises ValueError with the bad part named."""
    def one(s: str) -> int:
        s = s.strip().upper()
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(s[-1:], 1)
        num = s[:-1] if s[-1:] in "KMG" else s
        try:
            v = int(float(num) * mult)
        except ValueError:
            raise ValueError(f"{s!r} is not a size (e.g. 64K, 4M, 1G)") from None
        if v < 4:
            raise ValueError(f"{s!r}: a size must be at least 4 bytes")
        return v

    if ":" in text:
        lo_s, hi_s = text.split(":", 1)
        lo, hi = one(lo_s), one(hi_s)
        if hi < lo:
            raise ValueError(f"{text!r}: the last size is smaller than the first")
        out, v = [], lo
        while v <= hi:
            out.append(v)
            v *= 2
        return tuple(out)
    return tuple(sorted({one(s) for s in text.split(",") if s.strip()}))


def overlap_probe(reps: int = PROBE_REPS, sizes=PROBE_BYTES) -> dict:
    """How a transfer and a busy thread share this rank's CPU, measured (every rank at once,
    in an initialized process group): per size, the all-reduce alone and issued
    asynchronously while the thread keeps computing until it completes (ns, to the nearest
    chunk), and the chunk's time alone and during the transfer."""
    import torch

    x, y = torch.randn(PROBE_DIM, PROBE_DIM), torch.randn(PROBE_DIM, PROBE_DIM)
    import torch.distributed as dist

    return {"world": dist.get_world_size(),
            "sizes": [_probe_size(int(nb), x, y, reps) for nb in sizes]}


def _probe_size(nbytes: int, x, y, reps: int) -> dict:
    import torch
    import torch.distributed as dist

    buf = torch.ones(nbytes // 4)
    out: dict[str, Any] = {"bytes": nbytes, "alone_ns": [], "under_compute_ns": [],
                           "chunk_alone_ns": [], "chunk_under_ns": []}
    now = time.perf_counter_ns
    for _ in range(reps):
        dist.barrier()
        t0 = now()
        dist.all_reduce(buf)
        out["alone_ns"].append(now() - t0)
        dist.barrier()
        t0, k = now(), 0
        while k < 64:
            torch.mm(x, y)
            k += 1
        out["chunk_alone_ns"].append((now() - t0) // k)
        dist.barrier()
        t0, k, done = now(), 0, None
        work = dist.all_reduce(buf, async_op=True)
        while done is None:
            torch.mm(x, y)
            k += 1
            if work.is_completed():
                done = now() - t0
        work.wait()
        out["under_compute_ns"].append(done)
        out["chunk_under_ns"].append(done // k)
    return out


def _sweep(sizes, reps: int, device) -> list[dict]:
    import torch
    import torch.distributed as dist

    out = []
    now = time.perf_counter_ns
    warm = torch.ones(max(int(max(sizes)) // 4, 1), device=device)
    for _ in range(3):  # connections, allocator and caches: the first transfers are slow
        dist.all_reduce(warm)
    del warm
    for nb in sizes:
        buf = torch.ones(max(int(nb) // 4, 1), device=device)
        dist.all_reduce(buf)  # warm the connection and the buffers for this size
        ts = []
        for _ in range(reps):
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = now()
            dist.all_reduce(buf)
            if device.type == "cuda":
                torch.cuda.synchronize()
            ts.append(now() - t0)
        out.append({"bytes": int(nb), "ns": ts})
    return out


def measure(sizes=DEFAULT_SIZES, reps: int = 5, probe: bool = True) -> dict | None:
    """Run the calibration on this rank of an initialized process group; rank 0 returns the
    whole calibration (every rank's measurements gathered), the others None."""
    import torch
    import torch.distributed as dist

    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" \
        else torch.device("cpu")
    mine = {"rank": dist.get_rank(), "host": os.uname().nodename,
            "all_reduce": _sweep(sizes, reps, device)}
    if probe and backend == "gloo":
        mine["overlap_probe"] = overlap_probe()
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() != 0:
        return None
    return assemble(everyone, sizes, backend, torch.__version__)


def assemble(everyone: list[dict], sizes, backend: str, torch_version: str) -> dict:
    """The calibration file's contents from every rank's record (rank order), as
    :func:`measure` gathers them: ``{"rank", "host", "all_reduce": [{"bytes", "ns"}, ...],
    "overlap_probe"?}`` per rank, the same ``sizes`` on each. Pure: no process group, so the
    NCCL path's bookkeeping is tested without a GPU."""
    hosts = [e["host"] for e in everyone]
    per_host = max(hosts.count(h) for h in set(hosts))
    sizes_out = []
    for i, nb in enumerate(sizes):
        sizes_out.append({"bytes": int(nb),
                          "ns_by_rank": [e["all_reduce"][i]["ns"] for e in everyone]})
    cal: dict[str, Any] = {
        "format": FORMAT, "backend": backend, "world_size": len(everyone), "hosts": hosts,
        "ranks_per_host": per_host, "torch_version": torch_version,
        "created_unix_s": int(time.time()),
        "collectives": {"all_reduce": sizes_out}}
    probes = [e["overlap_probe"] for e in everyone if "overlap_probe" in e]
    if probes:
        # one record in the probe's own format, every rank's repetitions pooled per size
        pooled = []
        for j, sz in enumerate(probes[0]["sizes"]):
            rec = {"bytes": sz["bytes"]}
            for k in ("alone_ns", "under_compute_ns", "chunk_alone_ns", "chunk_under_ns"):
                rec[k] = [v for p in probes for v in p["sizes"][j][k]]
            pooled.append(rec)
        cal["overlap_probe"] = {"world": len(everyone), "sizes": pooled}
    return cal


def read_calibration(path: str | Path) -> dict:
    """A calibration file, checked: its format tag, an all-reduce sweep of positive sizes and
    times. Raises TraceFormatError naming the file and what is wrong."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as exc:
        raise TraceFormatError(f"{p}: cannot read the calibration file ({exc.strerror})") from exc
    except ValueError as exc:
        raise TraceFormatError(f"{p}: not a calibration file (invalid JSON: {exc}); write one "
                               "with `retime calibrate -o FILE`") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TraceFormatError(f"{p}: not a calibration file (format is "
                               f"{doc.get('format') if isinstance(doc, dict) else None!r}, "
                               f"expected {FORMAT!r}); write one with `retime calibrate -o FILE`")
    rows = (doc.get("collectives") or {}).get("all_reduce")
    if not isinstance(rows, list):
        raise TraceFormatError(f"{p}: calibration has no collectives.all_reduce list")
    for i, r in enumerate(rows):
        ok = isinstance(r, dict) and isinstance(r.get("bytes"), int) and r["bytes"] > 0 \
            and isinstance(r.get("ns_by_rank"), list) and r["ns_by_rank"] and all(
                isinstance(x, list) and x and all(isinstance(v, (int, float)) and v > 0
                                                  for v in x) for x in r["ns_by_rank"])
        if not ok:
            raise TraceFormatError(f"{p}: collectives.all_reduce[{i}] must hold a positive "
                                   "'bytes' and 'ns_by_rank' (per rank, positive times in ns)")
    if not isinstance(doc.get("world_size"), int) or doc["world_size"] < 2:
        raise TraceFormatError(f"{p}: calibration world_size must be an integer >= 2")
    rec = doc.get("cluster")
    if rec is not None:
        fit = rec.get("fit") if isinstance(rec, dict) else None
        if not (isinstance(rec, dict) and isinstance(rec.get("name"), str)
                and rec.get("level") in ("intra-node", "inter-node") and isinstance(fit, dict)
                and isinstance(fit.get("busbw_gbps"), (int, float))
                and isinstance(rec.get("nominal_gbps"), (int, float))):
            raise TraceFormatError(f"{p}: calibration 'cluster' must hold the measured "
                                   "cluster's name, level (intra-node | inter-node), "
                                   "nominal_gbps and fit (busbw_gbps); write it with "
                                   "`retime calibrate --cluster FILE`")
    doc["path"] = str(p)
    return doc


def attach(trace, calibration: dict):
    """The trace with ``calibration`` in ``meta["calibration"]`` (what the what-ifs read)."""
    import dataclasses

    meta = dict(trace.meta)
    meta["calibration"] = calibration
    return dataclasses.replace(trace, meta=meta)


def _local_rank(rank: int, world: int, port: int, sizes, reps: int, probe: bool, out: str,
                backend: str) -> None:
    """One rank of a one-host calibration (``retime calibrate --nproc N``)."""
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=300))
    try:
        cal = measure(sizes, reps, probe)
        if cal is not None:
            Path(out).write_text(json.dumps(cal))
    finally:
        dist.destroy_process_group()


def run_local(nproc: int, sizes, reps: int, probe: bool, backend: str = "gloo") -> dict:
    """Calibrate this host with ``nproc`` local ranks (loopback); returns the calibration."""
    import socket
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="retime-calibrate-") as d:
        out = os.path.join(d, "cal.json")
        mp.spawn(_local_rank, args=(nproc, port, tuple(sizes), reps, probe, out, backend),
                 nprocs=nproc, join=True)
        return json.loads(Path(out).read_text())


def run_distributed(sizes, reps: int, probe: bool, backend: str = "gloo") -> dict | None:
    """Calibrate under torchrun (``RANK``/``WORLD_SIZE`` set, e.g. one process per GPU or per
    host's rank on every host): rank 0 returns the calibration, the others None."""
    import datetime

    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=300))
    try:
        return measure(sizes, reps, probe)
    finally:
        dist.destroy_process_group()
