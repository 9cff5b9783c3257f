"""Device memory: allocator timeline and peak per rank.

From the trace's ``memory`` table (``[memory]`` events of the PyTorch profiler) when it has
samples: ``allocated_bytes`` as recorded, or the running sum of ``bytes_delta`` per rank and
device when the absolute value is missing (then relative to the first sample, so the peak is
a lower bound and ``source`` says ``delta``). Otherwise from the model: a modeled trace
(synth) carries ``meta['synth']['memory']`` (per stage, ``total_bytes``) and
``meta['synth']['peak_memory_bytes']``; ``meta['peak_memory_bytes']`` (one number or
``{rank: bytes}``) is accepted too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ._util import as_trace

__all__ = ["memory_timeline", "peak_memory", "device_peaks", "rank_peaks"]


def memory_timeline(x: Any) -> pd.DataFrame:
    """Per rank and device, time-ordered: ``rank``, ``device``, ``ts_ns``,
    ``allocated_bytes``, ``reserved_bytes`` (-1 unknown)."""
    t = as_trace(x)
    m = t.memory
    if len(m) == 0:
        return pd.DataFrame({"rank": np.zeros(0, np.int32), "device": np.zeros(0, np.int32),
                             "ts_ns": np.zeros(0, np.int64),
                             "allocated_bytes": np.zeros(0, np.int64),
                             "reserved_bytes": np.zeros(0, np.int64)})
    df = m.sort_values(["rank", "device", "ts_ns"], kind="mergesort").reset_index(drop=True)
    alloc = df["allocated_bytes"].to_numpy().copy()
    missing = alloc < 0
    if missing.any():
        run = df.groupby(["rank", "device"])["bytes_delta"].cumsum().to_numpy()
        alloc = np.where(missing, run, alloc)
    return pd.DataFrame({"rank": df["rank"].to_numpy(), "device": df["device"].to_numpy(),
                         "ts_ns": df["ts_ns"].to_numpy(), "allocated_bytes": alloc,
                         "reserved_bytes": df["reserved_bytes"].to_numpy()})


def peak_memory(x: Any, *, stages: pd.DataFrame | None = None) -> pd.DataFrame:
    """Peak per rank: ``rank``, ``stage`` (-1 unknown), ``peak_allocated_bytes``,
    ``peak_reserved_bytes``, ``samples``, ``source`` (``trace``, ``delta`` or ``model``).
    Empty when unknown.

    ``stages``: the :func:`analysis.pipeline.rank_stages` frame when ``x``'s ops are not all
    there (a streamed report passes a trace of the memory samples alone)."""
    from .pipeline import rank_stages

    t = as_trace(x)
    rs = rank_stages(t) if stages is None else stages
    out = _peak_memory(t, rs)
    if len(out):
        st = rs.set_index("rank")["stage"]
        out.insert(1, "stage", st.reindex(out["rank"].to_numpy(), fill_value=-1).to_numpy())
    return out


def _peak_memory(t, rs: pd.DataFrame) -> pd.DataFrame:
    tl = memory_timeline(t)
    if len(tl):
        src = "delta" if (t.memory["allocated_bytes"].to_numpy() < 0).all() else "trace"
        return rank_peaks(device_peaks(tl), src)
    pm = t.meta.get("peak_memory_bytes")
    syn = t.meta.get("synth") or {}
    per_stage = syn.get("memory")
    if pm is None and isinstance(per_stage, list) and per_stage:
        by_stage = {int(r.get("stage", i)): int(r.get("total_bytes", -1))
                    for i, r in enumerate(per_stage) if isinstance(r, dict)}
        vals = [by_stage.get(int(s), max(by_stage.values())) for s in rs["stage"]]
        return pd.DataFrame({"rank": rs["rank"].to_numpy(), "peak_allocated_bytes": vals,
                             "peak_reserved_bytes": [-1] * len(rs), "samples": [0] * len(rs),
                             "source": ["model"] * len(rs)})
    if pm is None:
        pm = syn.get("peak_memory_bytes")
    if pm is None:
        return pd.DataFrame({"rank": [], "peak_allocated_bytes": [], "peak_reserved_bytes": [],
                             "samples": [], "source": []})
    ranks = [int(r) for r in t.ranks]
    if isinstance(pm, dict):
        vals = [int(pm.get(str(r), pm.get(r, -1))) for r in ranks]
    else:
        vals = [int(pm)] * len(ranks)
    return pd.DataFrame({"rank": ranks, "peak_allocated_bytes": vals,
                         "peak_reserved_bytes": [-1] * len(ranks), "samples": [0] * len(ranks),
                         "source": ["model"] * len(ranks)})


def device_peaks(tl: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, device) of a :func:`memory_timeline`: ``peak_allocated_bytes``,
    ``peak_reserved_bytes``, ``samples``. Per rank: a streamed report computes it a batch
    of ranks at a time and :func:`rank_peaks` finishes it."""
    return tl.groupby(["rank", "device"]).agg(peak_allocated_bytes=("allocated_bytes", "max"),
                                              peak_reserved_bytes=("reserved_bytes", "max"),
                                              samples=("ts_ns", "size")).reset_index()


def rank_peaks(per: pd.DataFrame, src: str) -> pd.DataFrame:
    """:func:`peak_memory`'s rows (before ``stage``) from every rank's
    :func:`device_peaks`: only device samples (device >= 0) when there are any, CPU
    allocations otherwise; ``src`` is ``trace`` or ``delta``."""
    dev = per[per["device"] >= 0] if (per["device"] >= 0).any() else per
    r = dev.groupby("rank", sort=True).agg(
        peak_allocated_bytes=("peak_allocated_bytes", "max"),
        peak_reserved_bytes=("peak_reserved_bytes", "max"),
        samples=("samples", "sum")).reset_index()
    r["source"] = src
    return r
