"""The host CPU of a gloo DDP trace, measured from the trace itself.

The DDP reducer copies every parameter's gradient into its bucket (``mul_out``) and back
(``copy_bucket_to_grad``); with the gradient sizes (``meta["ddp_param_bytes"]``) those copies
give the host's memory-copy rate, and from it what a byte of a gloo transfer costs the CPU:
the share of a core a transfer keeps busy (its interference with the training thread,
:mod:`.bucketing_cpu`) and the rate of a ring on one host's loopback (:mod:`.network`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from retime.collectors.trace import Trace

from .ddp_params import param_bytes

__all__ = ["ddp_ranges", "host_copy_rate", "loopback_busbw", "cpu_interference_of", "share_cores",
           "TCP_COPIES_PER_BYTE", "OverlapProbe", "overlap_probe"]

#: name of the DDP reducer's per-parameter copy into its bucket (gradient ready)
_MUL_OUT = "torch::distributed::reducer::mul_out"
#: name of the DDP reducer's per-parameter copy back from its all-reduced bucket
_COPY_BACK = "torch.distributed.ddp.reducer::copy_bucket_to_grad"

def ddp_ranges(trace: Trace) -> dict[str, pd.DataFrame] | None:
    """The DDP reducer's per-parameter ranges (``mul_out``, ``copy_bucket_to_grad``), or None."""
    r = trace.ranges
    if len(r) == 0:
        return None
    names = np.asarray(trace.strings, dtype=object)[r["name_id"].to_numpy()]
    out = {}
    for key, nm in (("ready", _MUL_OUT), ("back", _COPY_BACK)):
        sel = r[names == nm]
        if len(sel) == 0:
            return None
        out[key] = sel.sort_values(["rank", "start_ns"], kind="stable")
    return out


#: memory passes of one bus byte of a gloo ring all-reduce over TCP, in memcpy equivalents:
#: the sender's copy into the socket (1 read + 1 write), the receiver's copy out of it (1 + 1)
#: and the reduction (2 reads + 1 write): 7 passes, a memcpy being 2
TCP_COPIES_PER_BYTE = 3.5


def share_cores(n: int, cores: int) -> list[list[int]]:
    """The CPU sets of a host's ``n`` ranks on its ``cores`` cores (ids ``0..cores-1``): with
    at least as many cores as ranks, disjoint shares of ``cores // n`` each (a rank's gloo
    worker threads then run beside its training thread); with fewer, one core each,
    round-robin (ranks on one core time-share it)."""
    if n <= cores:
        per = cores // n
        return [list(range(j * per, (j + 1) * per)) for j in range(n)]
    return [[j % cores] for j in range(n)]


def cpu_interference_of(trace: Trace, per: dict, exact, a_start, end, nbytes, ar_ids) -> float:
    """The interference ``i`` of a gloo transfer with the training thread, from the trace.

    A transfer keeps ``rho`` of a core busy (the rest of the time it waits on its socket for
    the link): ``rho`` = CPU time per bus byte (``TCP_COPIES_PER_BYTE`` memcpy-equivalents at
    the host's memcpy rate, measured on the DDP reducer's own copies of the parameters'
    gradients: exact bytes from ``meta["ddp_param_bytes"]``, their ``mul_out`` and
    ``copy_bucket_to_grad`` times) over the measured transfer time per bus byte. With ``c``
    cores per rank (``meta["cpu_affinity"]``, else 1) and the training thread keeping one
    busy, an overlapped transfer ends ``i T`` late with ``i = min(1, max(0, 1 + rho - c))``.
    Without exact sizes the rate is unknown and ``i = 1`` (full time-sharing), the
    conservative value."""
    if exact is None:
        # sizes known but not in a ready order DDP would use: the copy rate by rank of
        # size and time (host_copy_rate); no sizes at all: full time-sharing
        copy_bpns = host_copy_rate(trace)
        if copy_bpns is None:
            return 1.0
    else:
        copy_ns = np.median(np.stack([
            (v[2]["end_ns"].to_numpy() - v[2]["start_ns"].to_numpy())
            + (v[3]["end_ns"].to_numpy() - v[3]["start_ns"].to_numpy())
            for v in per.values()]), axis=0).astype(np.float64)
        big = np.asarray(exact) >= 64 * 1024  # the fixed cost of a copy dominates small ones
        if not big.any() or copy_ns[big].sum() <= 0:
            return 1.0
        copy_bpns = 2.0 * float(np.sum(np.asarray(exact)[big])) / float(copy_ns[big].sum())
    n = max(2, len({int(r) for r, _s in per}))
    f = 2.0 * (n - 1) / n
    t_per_byte = float(np.median((end[ar_ids] - a_start[ar_ids])
                                 / np.maximum(nbytes[ar_ids] * f, 1.0)))
    if t_per_byte <= 0:
        return 1.0
    rho = min(1.0, TCP_COPIES_PER_BYTE / copy_bpns / t_per_byte)
    aff = trace.meta.get("cpu_affinity") if isinstance(trace.meta, dict) else None
    c = min(len(v) for v in aff.values()) if isinstance(aff, dict) and aff else 1
    return float(min(1.0, max(0.0, 1.0 + rho - c)))


def host_copy_rate(trace: Trace) -> float | None:
    """The host's memcpy rate (bytes per ns) from the DDP reducer's own copies of the
    gradients: each parameter's ``mul_out`` (into its bucket) and ``copy_bucket_to_grad``
    (back) move its bytes twice; sizes from ``meta["ddp_param_bytes"]``, matched to the
    copies by rank of size and time (the largest gradient takes the longest copies), and
    only parameters of at least 64 KiB (a small copy's time is its fixed cost). None
    without the reducer's ranges or the sizes."""
    given, _ready = param_bytes(trace)
    rr = ddp_ranges(trace)
    if rr is None or not given:
        return None
    try:
        sizes = np.sort(np.asarray([int(x) for x in given], np.float64))[::-1]
    except (TypeError, ValueError):
        return None
    n = len(sizes)
    big = sizes >= 64 * 1024
    rates = []
    for r in np.unique(rr["ready"]["rank"].to_numpy()).tolist():
        a, b = (rr[k][rr[k]["rank"].to_numpy() == r] for k in ("ready", "back"))
        ca = (a["end_ns"] - a["start_ns"]).to_numpy(np.float64)
        cb = (b["end_ns"] - b["start_ns"]).to_numpy(np.float64)
        k = min(len(ca), len(cb)) // n
        if k == 0 or len(ca) % n or len(cb) % n:
            return None  # not whole steps of this model's parameters
        c = np.sort(np.median((ca[:k * n] + cb[:k * n]).reshape(k, n), axis=0))[::-1]
        if big.any() and c[big].sum() > 0:
            rates.append(2.0 * sizes[big].sum() / c[big].sum())
    return float(np.median(rates)) if rates else None


def loopback_busbw(trace: Trace) -> float | None:
    """Bus bandwidth (GB/s) of a gloo ring on one host's loopback, from the trace: no wire,
    so a bus byte costs its CPU passes only (``TCP_COPIES_PER_BYTE`` memcpy-equivalents at
    the host's measured copy rate, :func:`host_copy_rate`), each rank on its own core. An
    upper bound: the socket buffers are colder than the reducer's copies, so the measured
    loopback rate is lower (2.1 and 1.2 GB/s where this gives 5.4 on the paired captures'
    host); set ``network.intra_node_gbps`` when it is known."""
    rate = host_copy_rate(trace)
    return None if rate is None else rate / TCP_COPIES_PER_BYTE


@dataclass(frozen=True)
class OverlapProbe:
    """How a gloo transfer and a busy training thread shared a rank's CPU, as the capture
    measured it before training (``overlap_probe`` in the job record the pair kit writes,
    examples/pairs/job.py): all-reduces of a few sizes timed alone and while every rank's
    training thread kept computing, and the compute's own rate during those transfers.

    The two sides are not slowed alike. Under compute a transfer waits for the scheduler at
    each of its hand-offs (socket ready, worker thread woken), so it costs about a fixed
    number of scheduler turns on top of its bytes (measured at 1600 Mbit/s: 1 MiB in 18-27
    ms where it took 1-5 ms alone), while the training thread loses only the CPU the
    transfer's copies take (15-30%). ``under`` and ``alone`` are least-squares lines ``a +
    b S`` (ns, ns per payload byte) over the probe's sizes (median of its repetitions and
    ranks)."""

    compute_slowdown: float
    under: tuple[float, float]
    alone: tuple[float, float]
    sizes: tuple[int, ...]

    def under_ns(self, nbytes) -> np.ndarray:
        """Time of an all-reduce of ``nbytes`` payload bytes that overlaps compute throughout."""
        a, b = self.under
        return np.maximum(a + b * np.asarray(nbytes, np.float64), 0.0)

    def alone_ns(self, nbytes) -> np.ndarray:
        a, b = self.alone
        return np.maximum(a + b * np.asarray(nbytes, np.float64), 1.0)

    def comm_slowdown(self, nbytes, alone_ns=None) -> np.ndarray:
        """The slowdown ``i`` (rate ``1 / (1 + i)`` while a training thread computes) that
        stretches a transfer taking ``alone_ns`` (default: the probe's own alone time) to
        the probe's time under compute."""
        t = self.alone_ns(nbytes) if alone_ns is None else np.asarray(alone_ns, np.float64)
        return np.maximum(self.under_ns(nbytes) / np.maximum(t, 1.0) - 1.0, 0.0)


def _probe_records(trace: Trace) -> list[dict]:
    m = trace.meta if isinstance(trace.meta, dict) else {}
    out = []
    job = m.get("job")
    if isinstance(job, dict) and isinstance(job.get("overlap_probe"), dict):
        out.append(job["overlap_probe"])
    cal = m.get("calibration")  # retime calibrate's file (replay --calibration)
    if isinstance(cal, dict) and isinstance(cal.get("overlap_probe"), dict):
        out.append(cal["overlap_probe"])
    for block in (m.get("capture") or {}).values():
        j = block.get("job") if isinstance(block, dict) else None
        if isinstance(j, dict) and isinstance(j.get("overlap_probe"), dict):
            out.append(j["overlap_probe"])
    return out


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """``y ~ a + b x`` with ``a, b >= 0`` (one size: through the origin)."""
    if len(np.unique(x)) >= 2:
        sol, *_ = np.linalg.lstsq(np.stack([np.ones(len(x)), x], axis=1), y, rcond=None)
        a, b = float(sol[0]), float(sol[1])
        if a >= 0 and b >= 0:
            return a, b
        if a < 0:
            return 0.0, float(np.sum(x * y) / np.sum(x * x))
        return float(np.mean(y)), 0.0
    return 0.0, float(np.mean(y / np.maximum(x, 1.0)))


#: how a probe's repetitions are summarized: the median, or the range's bounds (the
#: fastest or slowest repetition of each measurement)
_SUMMARY = {None: np.median, "low": np.min, "high": np.max}


def overlap_probe(trace: Trace, bound: str | None = None) -> OverlapProbe | None:
    """The capture's overlap probe (:class:`OverlapProbe`), or None when it has none or it
    is unreadable. Every rank's record counts (each rank measured its own side). ``bound``
    ``"low"`` / ``"high"``: each measurement's fastest / slowest repetition instead of the
    median (the prediction range's bounds)."""
    pick = _SUMMARY[bound]
    xs, under, alone, ratio = [], [], [], []
    for rec in _probe_records(trace):
        for sz in rec.get("sizes") or []:
            try:
                nb = float(sz["bytes"])
                u = [float(v) for v in sz["under_compute_ns"]]
                a_ = [float(v) for v in sz["alone_ns"]]
                ca = [float(v) for v in sz["chunk_alone_ns"]]
                cu = [float(v) for v in sz["chunk_under_ns"]]
            except (KeyError, TypeError, ValueError):
                return None
            if not u or not a_ or nb <= 0:
                continue
            xs.append(nb)
            under.append(float(pick(u)))
            alone.append(float(pick(a_)))
            ratio.extend(c_u / c_a for c_u, c_a in zip(cu, ca, strict=False) if c_a > 0)
    if not xs:
        return None
    x = np.asarray(xs)
    return OverlapProbe(compute_slowdown=max(float(pick(ratio)) - 1.0, 0.0) if ratio else 0.0,
                        under=_line(x, np.asarray(under)), alone=_line(x, np.asarray(alone)),
                        sizes=tuple(sorted({int(v) for v in xs})))
