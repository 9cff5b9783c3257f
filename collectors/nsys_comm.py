"""Nsight Systems: a communication kernel's primitive from the NVTX range that launched it.

NCCL runs many collectives with one kernel that does not name them: an all-to-all
(``c10d::alltoall_base_`` > ``nccl:all_to_all`` > ``ncclGroupStart``/``ncclSend``/
``ncclRecv``/``ncclGroupEnd``) is a ``ncclDevKernel_SendRecv``, as is a batch of
point-to-point calls. Where the kernel's name gives ``SEND_RECV`` or nothing, the innermost
NVTX range around its launch call (same thread, the call's start inside it) that names a
collective primitive gives it: ``nccl:all_to_all`` -> ``ALL_TO_ALL``. Ranges that name a
point-to-point call (``nccl:send``) leave the kernel as it is (a send on one rank and a recv
on the other are one transfer, which the name-based matching already pairs).

A kernel whose launch call is not in the export (queued before the capture began: the first
SendRecv of each rank of h100-2gpu-fastvideo) has no range to read. It takes the primitive
that the ranges gave every other kernel of its name on its rank and stream, when they all
agree (:func:`primitives_from_peers`); where they disagree or none got one it stays vague.

An export holds no message sizes in the range names (PyTorch writes ``sizes = [[...]]``
only under ``emit_nvtx(record_shapes=True)``, without the dtype; NCCL's own NVTX payloads
are often exported empty), so bytes stay as the kernel row has them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .collectives import comm_op_from_name
from .enums import CommOp

__all__ = ["primitives_from_nvtx", "primitives_from_peers", "COLLECTIVE_OPS"]

#: primitives a range may give (point-to-point ones are left to the kernel's name)
COLLECTIVE_OPS = frozenset(int(c) for c in (
    CommOp.ALL_REDUCE, CommOp.ALL_GATHER, CommOp.REDUCE_SCATTER, CommOp.ALL_TO_ALL,
    CommOp.BROADCAST, CommOp.REDUCE, CommOp.BARRIER, CommOp.GATHER, CommOp.SCATTER))
_VAGUE = (int(CommOp.SEND_RECV), int(CommOp.UNKNOWN), int(CommOp.NONE))
#: enclosing ranges looked at per launch call (nesting deeper than this is not searched)
_MAX_DEPTH = 64


def _range_op(name: str) -> int:
    """The collective a range names (``nccl:all_to_all``, ``c10d::alltoall_base_, op_id =
    7``), or 0."""
    head = name.split(",", 1)[0].strip()
    if head.startswith(("ncclGroup", "ncclComm")):
        return 0
    c = int(comm_op_from_name(head.rsplit(":", 1)[-1]))
    return c if c in COLLECTIVE_OPS else 0


def primitives_from_nvtx(comm_op: np.ndarray, is_comm: np.ndarray, g_rank: np.ndarray,
                         g_corr: np.ndarray, rt: pd.DataFrame, nv_rank: np.ndarray,
                         nv_tid: np.ndarray, nv_start: np.ndarray, nv_end: np.ndarray,
                         nv_name_id: np.ndarray, names: list[str]) -> tuple[np.ndarray, int]:
    """``comm_op`` with the vague communication kernels (``is_comm`` and SEND_RECV /
    UNKNOWN) given the primitive of the innermost collective-naming NVTX range around their
    launch call (module docstring); and how many changed.

    ``rt``: runtime calls with ``rank``, ``tid``, ``corr``, ``start``; ``nv_*``: NVTX ranges
    (rank, thread id, start, end, name id into ``names``).
    """
    out = np.asarray(comm_op).copy()
    want = np.flatnonzero(np.asarray(is_comm, bool) & np.isin(out, _VAGUE))
    nv_name_id = np.asarray(nv_name_id, np.int64)
    if not len(want) or not len(nv_name_id) or not len(rt):
        return out, 0
    used = np.unique(nv_name_id)
    by_name = np.zeros(int(used.max()) + 1, np.int64)
    by_name[used] = [_range_op(names[i]) for i in used.tolist()]
    ops = by_name[nv_name_id]
    keep = ops > 0
    if not keep.any():
        return out, 0
    r = pd.DataFrame({"rank": np.asarray(nv_rank)[keep], "tid": np.asarray(nv_tid)[keep],
                      "s": np.asarray(nv_start)[keep], "e": np.asarray(nv_end)[keep],
                      "op": ops[keep]}).sort_values(["rank", "tid", "s"], kind="mergesort")
    by_thread = {k: (g["s"].to_numpy(), g["e"].to_numpy(), g["op"].to_numpy())
                 for k, g in r.groupby(["rank", "tid"], sort=False)}
    launch = rt.drop_duplicates(["rank", "corr"]).set_index(["rank", "corr"])
    key = pd.MultiIndex.from_arrays([np.asarray(g_rank)[want], np.asarray(g_corr)[want]])
    li = launch.reindex(key)
    changed = 0
    for j, tid, t in zip(want.tolist(), li["tid"].tolist(), li["start"].tolist()):
        if t != t:  # no launch call in the trace
            continue
        ranges = by_thread.get((int(g_rank[j]), int(tid)))
        if ranges is None:
            continue
        s, e, op = ranges
        k = int(np.searchsorted(s, t, side="right")) - 1
        stop = max(k - _MAX_DEPTH, -1)
        while k > stop:  # innermost first: the latest start that still holds the call
            if e[k] > t:
                out[j] = op[k]
                changed += 1
                break
            k -= 1
    return out, changed


def primitives_from_peers(comm_op: np.ndarray, comm_before: np.ndarray, is_comm: np.ndarray,
                          no_launch: np.ndarray, rank: np.ndarray, stream: np.ndarray,
                          name_id: np.ndarray) -> tuple[np.ndarray, int]:
    """``comm_op`` with the communication kernels (``is_comm``) that were vague
    (``comm_before``, before :func:`primitives_from_nvtx`) and whose launch call is missing
    (``no_launch``) given the primitive of the other kernels of their (rank, stream, name)
    that a range labelled, when those all got the same one; and how many changed. All arrays
    are per kernel."""
    out = np.asarray(comm_op).copy()
    vague = np.asarray(is_comm, bool) & np.isin(comm_before, _VAGUE)
    want = vague & np.asarray(no_launch, bool)
    if not want.any():
        return out, 0
    labelled = vague & ~want & np.isin(out, list(COLLECTIVE_OPS))
    if not labelled.any():
        return out, 0
    f = pd.DataFrame({"rank": np.asarray(rank)[labelled], "stream": np.asarray(stream)[labelled],
                      "name": np.asarray(name_id)[labelled], "op": out[labelled]})
    agg = f.groupby(["rank", "stream", "name"])["op"].agg(["min", "max"])
    sole = agg[agg["min"] == agg["max"]]["min"]
    wi = np.flatnonzero(want)
    key = pd.MultiIndex.from_arrays([np.asarray(rank)[wi], np.asarray(stream)[wi],
                                     np.asarray(name_id)[wi]])
    got = sole.reindex(key).to_numpy()
    hit = ~pd.isna(got)
    out[wi[hit]] = got[hit].astype(out.dtype)
    return out, int(hit.sum())
