"""Kernel statistics and kernel classes (GEMM, attention, elementwise, communication, memory).

Classes come from the op kind first (collective/p2p ops are ``communication``, memcpy/memset
are ``memory``) and from the kernel name otherwise. cuDNN/MIOpen convolutions are implicit
GEMMs and are classed as ``GEMM``; reductions, norms, optimizers and everything else that
is not matched fall into ``elementwise`` (memory-bound kernels, the usual roofline split).
Names are classified once per distinct name (the string table), never per op.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd
from retime.collectors.enums import OpKind

from ._util import COMM_KINDS, COMPUTE_KINDS, MEM_KINDS, as_trace, device_mask

__all__ = ["KERNEL_CLASSES", "classify_names", "kernel_classes", "kernel_stats",
           "class_stats"]

KERNEL_CLASSES = ("GEMM", "attention", "elementwise", "communication", "memory")

_COMM_RE = re.compile(r"nccl|rccl|c10d::|gloo|all_?reduce|all_?gather|reduce_?scatter|"
                      r"sendrecv|all_?to_?all|broadcast", re.I)
_MEM_RE = re.compile(r"^memcpy|^memset|\bmemcpy\b|\bmemset\b|Memcpy|Memset", re.I)
_ATTN_RE = re.compile(r"flash|fmha|attention|attn|sdpa|\bmha\b|xformers|efficient_attention",
                      re.I)
_GEMM_RE = re.compile(r"gemm|gemv|cutlass|cublas|nvjet|hipblas|rocblas|matmul|\bmm\b|bmm|"
                      r"xmma|Cijk_|s884|s1688|h884|h1688|s16816|wgrad|dgrad|fprop|"
                      r"conv(?!ert)|winograd|implicit_?convolve|igemm|"
                      r"(volta|turing|ampere|hopper|sm\d\d)_\w*_(nn|nt|tn|tt)\b", re.I)


def classify_names(names: list[str] | np.ndarray) -> np.ndarray:
    """Class of each name by pattern (``communication`` > ``memory`` > ``attention`` >
    ``GEMM`` > ``elementwise``); returns an object array of class strings."""
    out = np.empty(len(names), dtype=object)
    for i, n in enumerate(names):
        n = str(n)
        if _COMM_RE.search(n):
            out[i] = "communication"
        elif _MEM_RE.search(n):
            out[i] = "memory"
        elif _ATTN_RE.search(n):
            out[i] = "attention"
        elif _GEMM_RE.search(n):
            out[i] = "GEMM"
        else:
            out[i] = "elementwise"
    return out


def kernel_classes(x: Any) -> np.ndarray:
    """Class of every op of ``x`` (aligned with ``ops``), from its kind and name."""
    t = as_trace(x)
    o = t.ops
    by_name = classify_names(t.strings) if len(t.strings) else np.zeros(0, object)
    cls = by_name[o["name_id"].to_numpy()] if len(o) else np.zeros(0, object)
    kind = o["kind"].to_numpy()
    cls = np.where(np.isin(kind, COMM_KINDS), "communication", cls)
    cls = np.where(np.isin(kind, MEM_KINDS), "memory", cls)
    return cls.astype(object)


def _device_ops(t) -> np.ndarray:
    kind = t.ops["kind"].to_numpy()
    return device_mask(t) & np.isin(kind, COMPUTE_KINDS + COMM_KINDS + MEM_KINDS)


def kernel_stats(x: Any, *, top: int | None = None, by_rank: bool = False) -> pd.DataFrame:
    """Device ops grouped by name: count, total/mean/min/max duration and share of the total.

    Parameters
    ----------
    x : Trace or ReplayResult
    top : keep only the ``top`` names by total time (None: all)
    by_rank : group by (rank, name) instead of name

    Returns
    -------
    DataFrame sorted by ``total_ns`` descending with ``name``, ``kernel_class``, ``kind``,
    ``count``, ``total_ns``, ``mean_ns``, ``min_ns``, ``max_ns``, ``share`` (of all device op
    time in the same grouping scope) and ``cum_share``.
    """
    t = as_trace(x)
    o = t.ops
    m = _device_ops(t)
    cls = kernel_classes(t)[m]
    df = pd.DataFrame({"rank": o["rank"].to_numpy()[m], "name_id": o["name_id"].to_numpy()[m],
                       "kind": o["kind"].to_numpy()[m], "dur_ns": o["dur_ns"].to_numpy()[m],
                       "kernel_class": cls})
    keys = ["rank", "name_id"] if by_rank else ["name_id"]
    if len(df) == 0:
        cols = [*keys[:-1], "name", "kernel_class", "kind", "count", "total_ns", "mean_ns",
                "min_ns", "max_ns", "share", "cum_share"]
        return pd.DataFrame({c: [] for c in cols})
    g = df.groupby(keys, sort=False)
    s = g.agg(count=("dur_ns", "size"), total_ns=("dur_ns", "sum"), mean_ns=("dur_ns", "mean"),
              min_ns=("dur_ns", "min"), max_ns=("dur_ns", "max"),
              kernel_class=("kernel_class", "first"), kind=("kind", "first")).reset_index()
    names = np.asarray(t.strings, dtype=object)
    s.insert(len(keys), "name", names[s["name_id"].to_numpy()])
    s["kind"] = [OpKind(int(k)).name for k in s["kind"].to_numpy()]
    if by_rank:
        tot = s.groupby("rank")["total_ns"].transform("sum")
    else:
        tot = s["total_ns"].sum()
    s["share"] = s["total_ns"] / tot
    s = s.sort_values(["total_ns", "name"], ascending=[False, True], kind="mergesort")
    if by_rank:
        s = s.sort_values(["rank", "total_ns"], ascending=[True, False], kind="mergesort")
        s["cum_share"] = s.groupby("rank")["share"].cumsum()
        if top is not None:
            s = s.groupby("rank", sort=True).head(top)
    else:
        s["cum_share"] = s["share"].cumsum()
        if top is not None:
            s = s.head(top)
    s = s.drop(columns=["name_id"]).reset_index(drop=True)
    order = [*keys[:-1], "name", "kernel_class", "kind", "count", "total_ns", "mean_ns",
             "min_ns", "max_ns", "share", "cum_share"]
    return s[order]


def class_stats(x: Any) -> pd.DataFrame:
    """Device op time per kernel class: ``kernel_class``, ``count``, ``total_ns``, ``share``.

    All five classes are listed (zero rows included), in :data:`KERNEL_CLASSES` order.
    """
    t = as_trace(x)
    m = _device_ops(t)
    cls = kernel_classes(t)[m]
    dur = t.ops["dur_ns"].to_numpy()[m]
    df = pd.DataFrame({"kernel_class": cls, "dur_ns": dur})
    g = df.groupby("kernel_class").agg(count=("dur_ns", "size"), total_ns=("dur_ns", "sum"))
    g = g.reindex(list(KERNEL_CLASSES), fill_value=0).reset_index()
    g["count"] = g["count"].astype(np.int64)
    g["total_ns"] = g["total_ns"].astype(np.int64)
    tot = g["total_ns"].sum()
    g["share"] = g["total_ns"] / tot if tot > 0 else 0.0
    return g
