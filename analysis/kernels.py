"""Kernel statistics and kernel classes (GEMM, conv, attention, memory-bound classes,
communication, memory, other).

Classes come from the one table of :mod:`collectors.kernel_classes` (ingest, breakdown and
the hardware what-ifs use the same): the op kind first (collective/p2p ops are
``communication``, memcpy/memset are ``memory``), then the kernel name. A name no rule knows
is ``other`` (never a guess); :func:`unclassified` lists the top ones.
Names are classified once per distinct name (the string table), never per op.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from retime.collectors.arrays import isin
from retime.collectors.enums import OpKind
from retime.collectors.kernel_classes import CLASS_NAMES, KernelClass, op_classes
from retime.collectors.kernel_classes import classify_names as _classify_ids

from ._util import COMM_KINDS, COMPUTE_KINDS, MEM_KINDS, as_trace, device_mask

__all__ = ["KERNEL_CLASSES", "classify_names", "kernel_classes", "kernel_stats",
           "class_stats", "unclassified"]

#: every class, in the table's order (``other``: names no rule knows)
KERNEL_CLASSES = CLASS_NAMES

_NAMES = np.asarray(CLASS_NAMES, dtype=object)


def classify_names(names: list[str] | np.ndarray) -> np.ndarray:
    """Class of each name (:mod:`collectors.kernel_classes`); an object array of class
    names."""
    return _NAMES[_classify_ids(names)] if len(names) else np.zeros(0, object)


def kernel_classes(x: Any) -> np.ndarray:
    """Class of every op of ``x`` (aligned with ``ops``), from its kind and name."""
    t = as_trace(x)
    return _NAMES[_class_ids(t)]


def _class_ids(t) -> np.ndarray:
    """Class id (int8 :class:`KernelClass`) of every op: the tables group on these, not on
    millions of class-name strings (pandas would build a string column of every op)."""
    o = t.ops
    return op_classes(o["kind"].to_numpy(), o["name_id"].to_numpy(), t.strings)


def _device_ops(t) -> np.ndarray:
    kind = t.ops["kind"].to_numpy()
    return device_mask(t) & isin(kind, COMPUTE_KINDS + COMM_KINDS + MEM_KINDS)


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
    cls = _class_ids(t)[m]
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
    s["kernel_class"] = _NAMES[s["kernel_class"].to_numpy()]  # one name per group
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

    Every class is listed (zero rows included), in :data:`KERNEL_CLASSES` order.
    """
    t = as_trace(x)
    m = _device_ops(t)
    cls = _class_ids(t)[m]
    dur = t.ops["dur_ns"].to_numpy()[m]
    df = pd.DataFrame({"kernel_class": cls, "dur_ns": dur})
    return class_table(df.groupby("kernel_class").agg(count=("dur_ns", "size"),
                                                      total_ns=("dur_ns", "sum")))


def class_table(g: pd.DataFrame) -> pd.DataFrame:
    """:func:`class_stats`' frame from ``count`` / ``total_ns`` indexed by class id (a
    subset of the classes): every class in :data:`KERNEL_CLASSES` order, with its share."""
    g = g.copy()
    g.index = pd.Index(_NAMES[g.index.to_numpy().astype(int)], name="kernel_class")
    g = g.reindex(list(KERNEL_CLASSES), fill_value=0).reset_index()
    g["count"] = g["count"].astype(np.int64)
    g["total_ns"] = g["total_ns"].astype(np.int64)
    tot = g["total_ns"].sum()
    g["share"] = g["total_ns"] / tot if tot > 0 else 0.0
    return g


def unclassified(x: Any, *, top: int | None = 10) -> pd.DataFrame:
    """The device ops whose name no rule of the kernel-class table knows (class ``other``),
    by name: ``name``, ``kind``, ``count``, ``total_ns``, ``share`` (of all device time),
    the ``top`` names by total time."""
    ks = kernel_stats(x)
    u = ks[ks["kernel_class"] == CLASS_NAMES[KernelClass.OTHER]]
    u = u[["name", "kind", "count", "total_ns", "share"]].reset_index(drop=True)
    return u.head(top) if top is not None else u
