"""Collective communication: name parsing and cross-rank matching into instances.

A collective *instance* is one call of a collective on every member rank of a process
group (e.g. the 3rd all-reduce of the default group). All member ops of one instance share
one ``coll_id``. Matching, per group:

1. ``(group, seq)`` when the profiler recorded a sequence number for every member;
2. otherwise by each rank's issue order: the ranks' sequences of ``(comm_op, size_key)``
   (``size_key`` is the message size for collectives whose size is equal on every rank, 0 for
   all-to-all and unknown sizes) are aligned, order preserving, into one common sequence of
   instances. When every rank issued the same sequence this is the k-th call with the k-th;
   when they differ (a partial trace: ranks sampled from a larger job, traces that start or
   stop at different steps) the alignment matches as many calls as possible and, among
   equally good alignments, the one whose members end closest in time (so a step-552
   all-reduce meets the other rank's step-552 one, not its step-551 one). Members of one
   instance must overlap in time (a collective completes on no rank before every rank
   joined it): calls whose start-end intervals are disjoint are never paired, even when
   the k-th-with-k-th pairing would pair more of them (an all-to-all, whose size differs
   by rank and so is no key, would otherwise meet its neighbour: 1.5 kB with 340 MB). The
   constraint is dropped for a rank whose clock is not comparable (it would leave fewer
   than half the matches).
3. Across groups, the instances must be orderable consistently with every rank's issue
   order (else the replay graph would hold a cycle): where two ranks issued two instances in
   opposite orders, the instance whose members end furthest apart is split into unmatched
   members, until none conflict.

An instance whose member count differs from the group size is kept (its members still
share a coll_id, so they start together in replay) but counted as unmatched with a reason.
"""

from __future__ import annotations

import re

import numpy as np

from ._kernels import acyclic_nodes, align_sequences
from .enums import CommOp

__all__ = ["comm_op_from_name", "match_collectives", "DTYPE_BYTES"]

_NAME_RULES: list[tuple[re.Pattern[str], CommOp]] = [
    # library kernels whose names do not spell their primitive
    (re.compile(r"get_dispatch_layout", re.I), CommOp.NONE),  # DeepEP: local counting
    (re.compile(r"cached_notify", re.I), CommOp.BARRIER),  # DeepEP: rank barrier + clean-up
    (re.compile(r"cross_device_reduce", re.I), CommOp.ALL_REDUCE),  # vLLM custom all-reduce
    (re.compile(r"userbuffers\w*_rs(\b|<|$)", re.I), CommOp.REDUCE_SCATTER),
    (re.compile(r"userbuffers\w*_ag(\b|<|$)", re.I), CommOp.ALL_GATHER),
    (re.compile(r"all[-_]?reduce", re.I), CommOp.ALL_REDUCE),
    (re.compile(r"all[-_]?gather", re.I), CommOp.ALL_GATHER),
    (re.compile(r"reduce[-_]?scatter", re.I), CommOp.REDUCE_SCATTER),
    (re.compile(r"all[-_]?to[-_]?all", re.I), CommOp.ALL_TO_ALL),
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


_ANON = re.compile(r"\(anonymous namespace\)::|<unnamed>::|\{anonymous\}::")


def comm_op_from_name(name: str) -> CommOp:
    """Map a collective name (NCCL/RCCL kernel, c10d op, ``nccl:all_reduce``) to CommOp
    (``NONE`` for a communication library's local kernel, ``UNKNOWN`` when the name does not
    say). Anonymous namespaces are dropped before the argument list is cut off
    (``void (anonymous namespace)::multimem_all_reduce_kernel<...>(...)``)."""
    n = _ANON.sub("", name.removeprefix("void "))
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
                      end: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """Assign a cross-rank ``coll_id`` to each collective op (module docstring).

    Parameters
    ----------
    rank, group, group_size, comm_op, nbytes, seq, order : arrays of equal length n
        One entry per collective op. ``group`` is an integer group id (global), ``seq`` the
        recorded sequence number or -1, ``order`` the issue time (ns) used for issue order.
    ranks_present : optional mapping group -> ranks of that group present in the trace
    end : optional end time (ns) per op: the time tie-break of the alignment and of order
        conflicts (``order`` when not given)

    Returns
    -------
    coll_id : int64 array (n,), dense instance ids from 0
    stats : dict with ``matched`` / ``unmatched`` instance counts, ``unmatched_reasons``
        (reason -> instances) and ``ops_matched`` / ``ops_unmatched``
    """
    n = len(rank)
    if n == 0:
        return np.zeros(0, np.int64), {"matched": 0, "unmatched": 0, "unmatched_reasons": {},
                                       "ops_matched": 0, "ops_unmatched": 0}
    rank = np.asarray(rank, np.int64)
    group = np.asarray(group, np.int64)
    op = np.asarray(comm_op, np.int64)
    order = np.asarray(order, np.int64)
    t_end = order if end is None else np.asarray(end, np.int64)
    size = np.where(np.isin(comm_op, list(_SIZE_KEYED)), np.asarray(nbytes, np.int64), 0)
    seq = np.asarray(seq, np.int64)
    srt = np.lexsort((np.arange(n), order, rank))  # issue order per rank
    label = np.full(n, -1, np.int64)
    # a group matches by seq when every one of its ops has one
    ug, g_inv = np.unique(group, return_inverse=True)
    g_inv = g_inv.reshape(-1)
    use_seq = (np.bincount(g_inv, weights=seq < 0, minlength=len(ug)) == 0)[g_inv]
    if use_seq.any():
        kid, _, _ = _group_ids([group[use_seq], seq[use_seq]])
        label[use_seq] = kid
    nxt = int(label.max()) + 1
    sym, _, _ = _group_ids([op, size])
    for gi in np.unique(g_inv[~use_seq]).tolist():
        idx = srt[g_inv[srt] == gi]  # the group's ops, by rank and issue order
        lab = _align_group(rank[idx], sym[idx], t_end[idx],
                           None if end is None else (order[idx], t_end[idx]))
        label[idx] = lab + nxt
        nxt += int(lab.max()) + 1
    label, split = _break_order_conflicts(rank[srt], label[srt], t_end[srt], nxt)
    out_s = label
    out = np.empty(n, np.int64)
    # dense instance ids in order of first appearance (rank, then issue order)
    uniq, first_pos, inv = np.unique(out_s, return_index=True, return_inverse=True)
    appear = np.empty(len(uniq), np.int64)
    appear[np.argsort(first_pos, kind="stable")] = np.arange(len(uniq))
    out[srt] = appear[inv.reshape(-1)]
    split_inst = np.zeros(len(uniq), bool)
    if split:
        split_inst[appear[np.isin(uniq, list(split))]] = True
    return out, _stats(out, rank, op, group, group_size, ranks_present, split_inst)


def _kth_overlap(iv: tuple[np.ndarray, np.ndarray] | None, bounds: np.ndarray,
                 lens: np.ndarray) -> bool:
    """Do the k-th calls of every rank overlap in time (each k)? True without intervals."""
    if iv is None:
        return True
    lo, hi = iv
    k = len(lens)
    m = int(lens[0])
    return bool((lo.reshape(k, m).max(axis=0) <= hi.reshape(k, m).min(axis=0)).all())


def _align_pair(c_sym, c_t, c_iv, sym, t, iv):
    """Align one rank's calls with the common sequence. With intervals, calls whose times
    do not overlap cannot be one instance (a collective completes on no rank before every
    rank has joined it): that constraint is dropped only when it leaves fewer than half the
    matches of the unconstrained alignment (clocks that are not comparable across ranks).

    When the rank issued the common sequence itself and (with intervals) each of its calls
    overlaps the common sequence's call of the same index, k-th with k-th is the only
    alignment matching every call, so it is what the O(n m) alignment would return: taken
    at once (one late rank no longer makes every other rank pay for an alignment)."""
    if len(c_sym) == len(sym) and np.array_equal(c_sym, sym) and (
            c_iv is None or iv is None or bool(
                (np.maximum(c_iv[0], iv[0]) <= np.minimum(c_iv[1], iv[1])).all())):
        k = np.arange(len(sym), dtype=np.int64)
        return k, k.copy()
    free = align_sequences(c_sym, c_t, sym, t)
    if free is None or c_iv is None or iv is None:
        return free
    tied = align_sequences(c_sym, c_t, sym, t, c_iv, iv)
    return tied if tied is not None and 2 * len(tied[0]) >= len(free[0]) else free


def _align_group(rank: np.ndarray, sym: np.ndarray, t: np.ndarray,
                 iv: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Instance labels (0..) of one group's ops, given sorted by (rank, issue order): the
    ranks' symbol sequences aligned into one common sequence (module docstring, 2).
    ``iv``: (start, end) per op; members of one instance must overlap in time."""
    n = len(rank)
    bounds = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1], True])
    seqs = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
    lens = np.diff(bounds)
    first = sym[seqs[0][0]:seqs[0][1]]
    if (lens == lens[0]).all() and all(np.array_equal(sym[a:b], first) for a, b in seqs[1:]) \
            and _kth_overlap(iv, bounds, lens):
        return np.arange(n, dtype=np.int64) - np.repeat(bounds[:-1], lens)  # k-th with k-th
    # progressive alignment against the longest sequence (ties: the lowest rank)
    ref = int(np.argmax(lens))
    a, b = seqs[ref]
    c_sym, c_t = sym[a:b].copy(), t[a:b].copy()
    c_lo = iv[0][a:b].copy() if iv is not None else None
    c_hi = iv[1][a:b].copy() if iv is not None else None
    c_lab = np.arange(b - a, dtype=np.int64)
    label = np.full(n, -1, np.int64)
    label[a:b] = c_lab
    nxt = b - a
    for k, (a, b) in enumerate(seqs):
        if k == ref:
            continue
        res = _align_pair(c_sym, c_t, None if iv is None else (c_lo, c_hi), sym[a:b], t[a:b],
                          None if iv is None else (iv[0][a:b], iv[1][a:b]))
        if res is None:  # too large to align: the k-th call of each (op, size) per rank
            return _kth_labels(rank, sym)
        ia, ib = res
        lab = np.full(b - a, -1, np.int64)
        lab[ib] = c_lab[ia]
        new = lab < 0
        lab[new] = nxt + np.arange(int(new.sum()))
        nxt += int(new.sum())
        label[a:b] = lab
        # merge the rank's unmatched calls into the common sequence: each between the
        # matched calls it falls between (gap q: before the q-th matched pair), interleaved
        # with the common sequence's unmatched calls of that gap by time (running maxima,
        # so that both keep their own order)
        nn = int(new.sum())
        seg_c = np.searchsorted(ia, np.arange(len(c_sym)), side="left")
        seg_r = np.searchsorted(ib, np.arange(b - a), side="left")
        is_m = np.zeros(len(c_sym), np.int64)
        is_m[ia] = 1  # a matched element closes its gap
        key_gap = np.r_[seg_c, seg_r[new]]
        key_close = np.r_[is_m, np.zeros(nn, np.int64)]
        key_t = np.r_[np.maximum.accumulate(c_t), np.maximum.accumulate(t[a:b])[new]]
        key_src = np.r_[np.zeros(len(c_sym), np.int64), np.ones(nn, np.int64)]
        key_pos = np.r_[np.arange(len(c_sym)), np.flatnonzero(new)]
        o = np.lexsort((key_pos, key_src, key_t, key_close, key_gap))
        c_sym = np.r_[c_sym, sym[a:b][new]][o]
        c_t = np.r_[c_t, t[a:b][new]][o]
        c_lab = np.r_[c_lab, lab[new]][o]
        if iv is not None:
            c_lo = np.r_[c_lo, iv[0][a:b][new]][o]
            c_hi = np.r_[c_hi, iv[1][a:b][new]][o]
    return label


def _kth_labels(rank: np.ndarray, sym: np.ndarray) -> np.ndarray:
    """The k-th op of each symbol on every rank shares a label (ops sorted by rank, order)."""
    n = len(rank)
    gid, first, st = _group_ids([rank, sym])
    k = np.empty(n, np.int64)
    k[first] = np.arange(n) - st
    lab, _, _ = _group_ids([sym, k])
    return lab


def _break_order_conflicts(rank: np.ndarray, label: np.ndarray, t: np.ndarray, nxt: int
                           ) -> tuple[np.ndarray, set[int]]:
    """Split instances until every rank's issue order agrees with one order of instances
    (ops sorted by rank and issue order). Returns the labels and the split labels' new
    ids (each member of a split instance gets an id of its own)."""
    label = label.copy()
    split: set[int] = set()
    while True:
        uniq, inv = np.unique(label, return_inverse=True)
        inv = inv.reshape(-1)
        same = rank[1:] == rank[:-1]
        src, dst = inv[:-1][same], inv[1:][same]
        keep = src != dst
        src, dst = src[keep], dst[keep]
        done = acyclic_nodes(len(uniq), src, dst)
        if done.all():
            return label, split
        # one cycle among the nodes left (each has a predecessor left: walk back), then
        # split its worst instance
        left = ~done[src] & ~done[dst]
        pred_of: dict[int, int] = {}
        for x, y in zip(src[left].tolist(), dst[left].tolist()):
            pred_of.setdefault(y, x)
        v = next(iter(pred_of))
        seen: dict[int, int] = {}
        path: list[int] = []
        while v not in seen:
            seen[v] = len(path)
            path.append(v)
            v = pred_of[v]
        cyc = path[seen[v]:]
        lo = np.full(len(uniq), np.iinfo(np.int64).max, np.int64)
        hi = np.full(len(uniq), np.iinfo(np.int64).min, np.int64)
        np.minimum.at(lo, inv, t)
        np.maximum.at(hi, inv, t)
        members = np.bincount(inv, minlength=len(uniq))
        multi = [c for c in cyc if members[c] > 1]
        worst = max(multi, key=lambda c: (int(hi[c] - lo[c]), -c))
        m = np.flatnonzero(inv == worst)
        label[m] = nxt + np.arange(len(m))
        split.update(range(nxt, nxt + len(m)))
        nxt += len(m)


_SPLIT_REASON = "issue order conflicts with another rank's (members left unmatched)"


def _stats(out, rank, op, group, group_size, ranks_present, split_inst) -> dict:
    """Matched / unmatched instance counts with the reasons."""
    n = len(out)
    n_inst = int(out.max()) + 1
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
    odd = (uranks != members) | (nops > 1) | ((gsize > 0) & (members != gsize)) | split_inst
    for j in np.flatnonzero(odd).tolist():
        why = None
        if split_inst[j]:
            why = _SPLIT_REASON
        elif uranks[j] != members[j]:
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
    return {"matched": int(ok.sum()), "unmatched": int((~ok).sum()),
            "unmatched_reasons": reasons, "ops_matched": int(in_matched.sum()),
            "ops_unmatched": int((~in_matched).sum())}


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
