"""Collective communication: name parsing and cross-rank matching into instances.

A collective *instance* is one call of a collective on every member rank of a process
group (e.g. the 3rd all-reduce of the default group). All member ops of one instance share
one ``coll_id``. Matching key, in order of preference:

1. ``(group, seq)`` when the profiler recorded a sequence number for every member;
2. otherwise ``(group, comm_op, size_key, k)`` where ``k`` is the op's issue index among
   the rank's ops with the same ``(group, comm_op, size_key)``. ``size_key`` is the message
   size for collectives whose size is equal on every rank (all-reduce, broadcast, reduce,
   all-gather, reduce-scatter), which keeps two concurrent calls of different sizes (two
   DDP buckets on two gloo threads, say) from being crossed; it is 0 for all-to-all and
   unknown sizes.

An instance whose member count differs from the group size is kept (its members still
share a coll_id, so they start together in replay) but counted as unmatched with a reason.
"""

from __future__ import annotations

import re

import numpy as np

from .enums import CommOp

__all__ = ["comm_op_from_name", "match_collectives", "DTYPE_BYTES"]

_NAME_RULES: list[tuple[re.Pattern[str], CommOp]] = [
    (re.compile(r"all_?reduce", re.I), CommOp.ALL_REDUCE),
    (re.compile(r"all_?gather|allgather", re.I), CommOp.ALL_GATHER),
    (re.compile(r"reduce_?scatter", re.I), CommOp.REDUCE_SCATTER),
    (re.compile(r"all_?to_?all|alltoall", re.I), CommOp.ALL_TO_ALL),
    (re.compile(r"broadcast|bcast", re.I), CommOp.BROADCAST),
    (re.compile(r"barrier", re.I), CommOp.BARRIER),
    (re.compile(r"sendrecv|send_recv", re.I), CommOp.SEND_RECV),
    (re.compile(r"(^|[^a-z])recv|irecv", re.I), CommOp.RECV),
    (re.compile(r"(^|[^a-z])send|isend", re.I), CommOp.SEND),
    (re.compile(r"gather", re.I), CommOp.GATHER),
    (re.compile(r"scatter", re.I), CommOp.SCATTER),
    (re.compile(r"reduce", re.I), CommOp.REDUCE),
    # expert-parallel libraries (DeepEP, pplx): token dispatch / combine are all-to-alls
    (re.compile(r"(^|::|_)(dispatch|combine)", re.I), CommOp.ALL_TO_ALL),
]

#: bytes per element for the dtype spellings found in Kineto args
DTYPE_BYTES = {
    "float": 4, "float32": 4, "Float": 4, "double": 8, "float64": 8, "Double": 8,
    "c10::Half": 2, "Half": 2, "half": 2, "float16": 2, "c10::BFloat16": 2, "BFloat16": 2,
    "bfloat16": 2, "int": 4, "int32": 4, "Int": 4, "long int": 8, "int64": 8, "Long": 8,
    "int8": 1, "Char": 1, "unsigned char": 1, "uint8": 1, "Byte": 1, "bool": 1, "Bool": 1,
    "short int": 2, "int16": 2, "Short": 2, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
}

_SIZE_KEYED = {int(CommOp.ALL_REDUCE), int(CommOp.BROADCAST), int(CommOp.REDUCE),
               int(CommOp.ALL_GATHER), int(CommOp.REDUCE_SCATTER)}


def comm_op_from_name(name: str) -> CommOp:
    """Map a collective name (NCCL/RCCL kernel, c10d op, ``nccl:all_reduce``) to CommOp."""
    n = name.removeprefix("void ")
    if n.startswith(("ncclKernel_", "ncclDevKernel_", "rcclKernel_")):
        n = n.split("_", 1)[1]
    n = n.split("(", 1)[0]
    if n.startswith("Generic"):
        return CommOp.UNKNOWN
    for pat, op in _NAME_RULES:
        if pat.search(n):
            return op
    return CommOp.UNKNOWN


def match_collectives(rank: np.ndarray, group: np.ndarray, group_size: np.ndarray,
                      comm_op: np.ndarray, nbytes: np.ndarray, seq: np.ndarray,
                      order: np.ndarray, ranks_present: dict[int, set[int]] | None = None,
                      ) -> tuple[np.ndarray, dict]:
    """Assign a cross-rank ``coll_id`` to each collective op.

    Parameters
    ----------
    rank, group, group_size, comm_op, nbytes, seq, order : arrays of equal length n
        One entry per collective op. ``group`` is an integer group id (global), ``seq`` the
        recorded sequence number or -1, ``order`` the issue time (ns) used for issue order.
    ranks_present : optional mapping group -> ranks of that group present in the trace

    Returns
    -------
    coll_id : int64 array (n,), dense instance ids from 0
    stats : dict with ``matched`` / ``unmatched`` instance counts, ``unmatched_reasons``
        (reason -> instances) and ``ops`` (ops in matched instances)
    """
    n = len(rank)
    if n == 0:
        return np.zeros(0, np.int64), {"matched": 0, "unmatched": 0, "unmatched_reasons": {},
                                       "ops_matched": 0, "ops_unmatched": 0}
    rank = np.asarray(rank, np.int64)
    group = np.asarray(group, np.int64)
    op = np.asarray(comm_op, np.int64)
    size = np.where(np.isin(comm_op, list(_SIZE_KEYED)), np.asarray(nbytes, np.int64), 0)
    seq = np.asarray(seq, np.int64)
    # a group matches by seq when every one of its ops has one
    ug, g_inv = np.unique(group, return_inverse=True)
    use_seq = (np.bincount(g_inv.reshape(-1), weights=seq < 0, minlength=len(ug)) == 0)[
        g_inv.reshape(-1)]
    srt = np.lexsort((np.arange(n), np.asarray(order), rank))  # issue order per rank
    # k: issue index among the rank's ops with the same (group, op, size)
    gid, first, st = _group_ids([rank[srt], group[srt], op[srt], size[srt]])
    k_s = np.empty(n, np.int64)
    k_s[first] = np.arange(n) - st
    us = use_seq[srt]
    keys = [group[srt], np.where(us, -1, op[srt]), np.where(us, -1, size[srt]),
            np.where(us, seq[srt], k_s)]
    kid, _, _ = _group_ids(keys)
    firsts = np.full(kid.max() + 1, n, np.int64)
    np.minimum.at(firsts, kid, np.arange(n))
    appear = np.empty(len(firsts), np.int64)  # instance ids in order of first appearance
    appear[np.argsort(firsts, kind="stable")] = np.arange(len(firsts))
    out = np.empty(n, np.int64)
    out[srt] = appear[kid]
    # statistics per instance
    n_inst = len(firsts)
    members = np.bincount(out, minlength=n_inst)
    uranks = _count_distinct(out, rank, n_inst)
    nops = _count_distinct(out, op, n_inst)
    gsize = np.full(n_inst, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(gsize, out, np.asarray(group_size, np.int64))
    first_row = np.full(n_inst, n, np.int64)
    np.minimum.at(first_row, out, np.arange(n))
    inst_group = group[first_row]
    reasons: dict[str, int] = {}
    ok = np.ones(n_inst, bool)
    odd = (uranks != members) | (nops > 1) | ((gsize > 0) & (members != gsize))
    for j in np.flatnonzero(odd).tolist():
        why = None
        if uranks[j] != members[j]:
            why = "several ops of one rank in one instance (issue order differs across ranks)"
        elif nops[j] > 1:
            why = "members disagree on the collective type"
        else:
            gs = int(gsize[j])
            present = (len(ranks_present.get(int(inst_group[j]), ())) if ranks_present
                       else None)
            if present is not None and present < gs:
                why = f"ranks missing from trace ({present} of {gs} group ranks ingested)"
            else:
                why = "member count differs from group size (a rank skipped or added a call)"
        ok[j] = False
        reasons[why] = reasons.get(why, 0) + 1
    in_matched = ok[out]
    stats = {"matched": int(ok.sum()), "unmatched": int((~ok).sum()),
             "unmatched_reasons": reasons, "ops_matched": int(in_matched.sum()),
             "ops_unmatched": int((~in_matched).sum())}
    return out, stats


def _group_ids(cols: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows grouped by equal values in ``cols`` (equal-length int arrays, at least one row).

    Returns (gid, order, start): gid per row (groups numbered in key order), the rows in
    (key, row) order, and per position of that order the position where its group begins.
    """
    o = np.lexsort(cols[::-1])
    new = np.zeros(len(o), bool)
    new[0] = True
    for c in cols:
        sc = c[o]
        new[1:] |= sc[1:] != sc[:-1]
    g_sorted = np.cumsum(new) - 1
    gid = np.empty(len(o), np.int64)
    gid[o] = g_sorted
    return gid, o, np.flatnonzero(new)[g_sorted]


def _count_distinct(cid: np.ndarray, val: np.ndarray, n_inst: int) -> np.ndarray:
    """Number of distinct ``val`` per instance id ``cid``."""
    o = np.lexsort((val, cid))
    c, v = cid[o], val[o]
    new = np.ones(len(o), bool)
    new[1:] = (c[1:] != c[:-1]) | (v[1:] != v[:-1])
    return np.bincount(c[new], minlength=n_inst)
