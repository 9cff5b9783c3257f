"""Communication statistics: per collective instance and per process group.

Bandwidths follow nccl-tests (PUBLISHED.md §3): ``algbw = S / time`` with ``S`` the op's
``bytes`` (the collector records the nccl-tests message size), and
``busbw = algbw * factor`` with factor ``2(n-1)/n`` for all-reduce, ``(n-1)/n`` for
all-gather, reduce-scatter and all-to-all, and 1 for broadcast, reduce and point-to-point.
A member's measured kernel time includes waiting for the last rank to arrive, so the transfer
time of an instance is taken from the last arriver: ``transfer_ns = max(end) - max(start)``.
``skew_ns = max(start) - min(start)`` is the arrival skew and ``wait_ns`` the time all
members together spent waiting for the last one (``sum(max(start) - start_i)``).
Only *matched* instances have a skew, a wait and a last arriver: a ``coll_id`` whose
members are every rank of its group, once each, all of one primitive (a group of one rank
included: its collective is complete, with no wait), or a point-to-point pair: two ``P2P``
ops on two ranks, a send and its receive (their group is the pipeline's, larger than the
pair; ``n_ranks`` is 2 and the pair's primitive is ``SEND_RECV``). An instance with
members missing (ranks not in the trace: 2 of 128 ranks, say) or a lone op (single-rank
traces, ops the ingest could not pair) has ``matched`` False, NaN ``skew_ns``/``wait_ns``
and ``last_rank`` -1: the rank that arrived last may not be in the trace, so any wait
figure would be a guess. Their transfer time includes any waiting the trace cannot show.
:func:`comm_summary` counts ``matched``/``unmatched`` instances and takes wait and skew from
the matched ones only; :func:`rank_wait` likewise.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from retime.collectors.arrays import isin
from retime.collectors.enums import CommOp, OpKind

from ._util import COMM_KINDS, _memo, as_trace, op_ends_ns

__all__ = ["busbw_factor", "collectives", "comm_summary", "rank_wait", "matched_coll_ids",
           "unmatched_collectives"]


def busbw_factor(comm_op: np.ndarray | int, n_ranks: np.ndarray | int) -> np.ndarray:
    """nccl-tests bus-bandwidth factor for each (comm_op, n_ranks)."""
    op = np.asarray(comm_op, dtype=np.int64)
    n = np.asarray(n_ranks, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(n > 0, (n - 1) / n, 0.0)
    f = np.ones(np.broadcast(op, n).shape, np.float64)
    f = np.where(op == int(CommOp.ALL_REDUCE), 2 * frac, f)
    f = np.where(isin(op, [int(CommOp.ALL_GATHER), int(CommOp.REDUCE_SCATTER),
                              int(CommOp.ALL_TO_ALL)]), frac, f)
    return f


def _group_sizes(trace) -> dict[int, int]:
    g = trace.groups
    return {int(gid): len(r) for gid, r in zip(g["group_id"], g["ranks"])} if len(g) else {}


def matched_coll_ids(x: Any) -> np.ndarray:
    """The ``coll_id`` of every matched instance (module docstring), sorted (read-only
    inside a report's memo scope, where three sections share it)."""
    t = as_trace(x)
    return _memo(t, "matched_coll_ids", lambda: _matched_coll_ids(t))


def _matched_coll_ids(t) -> np.ndarray:
    o = t.ops
    m = isin(o["kind"].to_numpy(), COMM_KINDS) & (o["coll_id"].to_numpy() >= 0)
    if not m.any():
        return np.zeros(0, np.int64)
    df = pd.DataFrame({"c": o["coll_id"].to_numpy()[m], "r": o["rank"].to_numpy()[m],
                       "op": o["comm_op"].to_numpy()[m], "g": o["group_id"].to_numpy()[m],
                       "p2p": o["kind"].to_numpy()[m] == int(OpKind.P2P)})
    df["send"] = df["op"] == int(CommOp.SEND)
    df["recv"] = df["op"] == int(CommOp.RECV)
    df["sr"] = df["op"] == int(CommOp.SEND_RECV)
    g = df.groupby("c", sort=True).agg(n=("r", "size"), nr=("r", "nunique"),
                                       nop=("op", "nunique"), g=("g", "first"),
                                       p2p=("p2p", "all"), send=("send", "any"),
                                       recv=("recv", "any"), sr=("sr", "all"))
    sizes = _group_sizes(t)
    gs = (pd.Series(sizes, dtype=np.int64).reindex(g["g"].to_numpy(), fill_value=0).to_numpy()
          if sizes else np.zeros(len(g), np.int64))
    n, nr, nop = g["n"].to_numpy(), g["nr"].to_numpy(), g["nop"].to_numpy()
    coll = (n == nr) & (nop == 1) & (gs > 0) & (n == gs)
    # a send and its receive on two ranks (the ingest pairs them by group, peer and order)
    pair = g["p2p"].to_numpy() & (n == 2) & (nr == 2) & (
        (g["send"].to_numpy() & g["recv"].to_numpy()) | g["sr"].to_numpy())
    return g.index.to_numpy()[coll | pair].astype(np.int64)


def collectives(x: Any) -> pd.DataFrame:
    """One row per collective instance (cross-rank ``coll_id``, or a lone op).

    Returns
    -------
    DataFrame: ``coll_id`` (-1 for lone ops), ``op_id`` (first member), ``comm_op`` (name),
    ``group_id``, ``step``, ``n_ranks`` (group size when known, else members; 2 for a
    matched send/receive pair, whose ``comm_op`` is ``SEND_RECV``), ``members``,
    ``bytes``, ``first_start_ns``, ``last_start_ns``, ``end_ns``, ``skew_ns``, ``wait_ns``,
    ``mean_dur_ns``, ``transfer_ns``, ``algbw_gbps``, ``busbw_gbps``, ``last_rank`` (the last
    arriver), ``matched`` (skew, wait and last arriver are NaN / -1 when False).
    """
    t = as_trace(x)
    o = t.ops
    m = isin(o["kind"].to_numpy(), COMM_KINDS)
    idx = np.flatnonzero(m)
    coll = o["coll_id"].to_numpy()[idx]
    start = o["start_ns"].to_numpy()[idx]
    end = op_ends_ns(t)[idx]
    # lone ops get unique negative keys so they group alone
    key = np.where(coll >= 0, coll, -1 - idx)
    df = pd.DataFrame({"key": key, "coll_id": coll, "op_id": idx,
                       "rank": o["rank"].to_numpy()[idx],
                       "comm_op": o["comm_op"].to_numpy()[idx],
                       "group_id": o["group_id"].to_numpy()[idx],
                       "step": o["step"].to_numpy()[idx],
                       "bytes": o["bytes"].to_numpy()[idx],
                       "p2p": o["kind"].to_numpy()[idx] == int(OpKind.P2P),
                       "start_ns": start, "end_ns": end, "dur_ns": end - start})
    if len(df) == 0:
        cols = ["coll_id", "op_id", "comm_op", "group_id", "step", "n_ranks", "members",
                "bytes", "first_start_ns", "last_start_ns", "end_ns", "skew_ns", "wait_ns",
                "mean_dur_ns", "transfer_ns", "algbw_gbps", "busbw_gbps", "last_rank",
                "matched"]
        return pd.DataFrame({c: [] for c in cols})
    df["last_start"] = df.groupby("key")["start_ns"].transform("max")
    df["waited"] = df["last_start"] - df["start_ns"]
    # the last arriver: the member with the latest start (lowest rank on ties)
    last_rank = (df.sort_values(["key", "start_ns", "rank"], ascending=[True, False, True])
                 .groupby("key", sort=True)["rank"].first())
    g = df.groupby("key", sort=True)
    s = g.agg(coll_id=("coll_id", "first"), op_id=("op_id", "min"), comm_op=("comm_op", "first"),
              group_id=("group_id", "first"), step=("step", "max"), members=("rank", "size"),
              bytes=("bytes", "max"), first_start_ns=("start_ns", "min"),
              last_start_ns=("start_ns", "max"), end_ns=("end_ns", "max"),
              wait_ns=("waited", "sum"), mean_dur_ns=("dur_ns", "mean"), p2p=("p2p", "all"))
    s["last_rank"] = last_rank.reindex(s.index).to_numpy()
    s = s.reset_index(drop=True)
    sizes = _group_sizes(t)
    gid = s["group_id"].to_numpy().astype(np.int64)
    gs = (pd.Series(sizes, dtype=np.int64).reindex(gid, fill_value=0).to_numpy()
          if sizes else np.zeros(len(gid), np.int64))
    ok = isin(s["coll_id"].to_numpy(), matched_coll_ids(t))
    pair = ok & s["p2p"].to_numpy()  # a matched send/receive pair, not a whole group
    s.insert(5, "n_ranks", np.where(pair, 2, np.where(gs > 0, gs, s["members"].to_numpy())))
    s.loc[pair, "comm_op"] = int(CommOp.SEND_RECV)
    s["matched"] = ok
    s["skew_ns"] = np.where(ok, s["last_start_ns"] - s["first_start_ns"], np.nan)
    s["wait_ns"] = np.where(ok, s["wait_ns"], np.nan)
    s["last_rank"] = np.where(ok, s["last_rank"], -1)
    s["transfer_ns"] = s["end_ns"] - s["last_start_ns"]
    with np.errstate(divide="ignore", invalid="ignore"):
        alg = np.where(s["transfer_ns"] > 0,
                       s["bytes"].to_numpy() / np.maximum(s["transfer_ns"].to_numpy(), 1), np.nan)
    alg = np.where(s["bytes"].to_numpy() > 0, alg, np.nan)  # bytes/ns == GB/s
    s["algbw_gbps"] = alg
    s["busbw_gbps"] = alg * busbw_factor(s["comm_op"].to_numpy(), s["n_ranks"].to_numpy())
    names = np.array([CommOp(i).name for i in range(max(CommOp) + 1)], dtype=object)
    code = s["comm_op"].to_numpy().astype(np.int64)
    s["comm_op"] = np.where((code >= 0) & (code < len(names)),
                            names[np.clip(code, 0, len(names) - 1)], "UNKNOWN")
    order = ["coll_id", "op_id", "comm_op", "group_id", "step", "n_ranks", "members", "bytes",
             "first_start_ns", "last_start_ns", "end_ns", "skew_ns", "wait_ns", "mean_dur_ns",
             "transfer_ns", "algbw_gbps", "busbw_gbps", "last_rank", "matched"]
    return s[order].sort_values(["first_start_ns", "op_id"], kind="mergesort").reset_index(drop=True)


def comm_summary(x: Any | pd.DataFrame) -> pd.DataFrame:
    """Per process group and primitive: instances, bytes, transfer time, skew, wait, bandwidth.

    ``total_bytes`` is NaN where no instance of the row records its size (unknown, not 0).

    ``x`` is a Trace/ReplayResult or the frame of :func:`collectives`. Bandwidths are
    byte-weighted (total bytes / total transfer time) and multiplied by the busbw factor.
    """
    c = x if isinstance(x, pd.DataFrame) else collectives(x)
    if len(c) == 0:
        return pd.DataFrame({k: [] for k in ["group_id", "comm_op", "n_ranks", "instances",
                                             "matched", "unmatched", "total_bytes",
                                             "transfer_ns", "wait_ns", "mean_skew_ns",
                                             "max_skew_ns", "algbw_gbps", "busbw_gbps"]})
    g = c.groupby(["group_id", "comm_op"], sort=True)
    s = g.agg(n_ranks=("n_ranks", "max"), instances=("op_id", "size"),
              matched=("matched", "sum"),
              total_bytes=("bytes", "sum"), transfer_ns=("transfer_ns", "sum"),
              wait_ns=("wait_ns", lambda v: v.sum(min_count=1)),
              mean_skew_ns=("skew_ns", "mean"),
              max_skew_ns=("skew_ns", "max")).reset_index()
    s["matched"] = s["matched"].astype(np.int64)
    s["wait_ns"] = s["wait_ns"].astype(np.float64)
    # a group whose trace records no message size (op-level timers, nsys without NCCL
    # payloads) moved an unknown amount, not 0 bytes
    sized = g["bytes"].agg(lambda v: bool((v > 0).any())).to_numpy()
    s["total_bytes"] = s["total_bytes"].astype(np.float64).where(sized, np.nan)
    s.insert(s.columns.get_loc("matched") + 1, "unmatched", s["instances"] - s["matched"])
    with np.errstate(divide="ignore", invalid="ignore"):
        alg = np.where((s["transfer_ns"] > 0) & (s["total_bytes"] > 0),
                       s["total_bytes"] / s["transfer_ns"].where(s["transfer_ns"] > 0), np.nan)
    s["algbw_gbps"] = alg
    ops = np.array([CommOp[n].value if n in CommOp.__members__ else int(CommOp.UNKNOWN)
                    for n in s["comm_op"]], np.int64)
    s["busbw_gbps"] = alg * busbw_factor(ops, s["n_ranks"].to_numpy())
    return s


def rank_wait(x: Any) -> pd.DataFrame:
    """Per rank: time spent waiting in collectives for later ranks, and how often the rank
    was the last to arrive (the straggler signal). Columns ``rank``, ``collectives``,
    ``wait_ns``, ``last_arrivals``."""
    t = as_trace(x)
    o = t.ops
    m = isin(o["kind"].to_numpy(), COMM_KINDS) & (o["coll_id"].to_numpy() >= 0)
    m &= isin(o["coll_id"].to_numpy(), matched_coll_ids(t))  # matched instances only
    df = pd.DataFrame({"rank": o["rank"].to_numpy()[m], "coll_id": o["coll_id"].to_numpy()[m],
                       "start_ns": o["start_ns"].to_numpy()[m]})
    if len(df) == 0:
        return pd.DataFrame({"rank": [], "collectives": [], "wait_ns": [], "last_arrivals": []})
    last = df.groupby("coll_id")["start_ns"].transform("max")
    df["wait_ns"] = last - df["start_ns"]
    df["is_last"] = (df["start_ns"] == last)
    r = df.groupby("rank", sort=True).agg(collectives=("coll_id", "size"),
                                           wait_ns=("wait_ns", "sum"),
                                           last_arrivals=("is_last", "sum")).reset_index()
    return r


def unmatched_collectives(c: pd.DataFrame) -> pd.DataFrame:
    """The unmatched instances of a :func:`collectives` frame with why: ``coll_id``,
    ``comm_op``, ``group_id``, ``step``, ``members``, ``n_ranks``, ``bytes``,
    ``first_start_ns``, ``end_ns``, ``reason``."""
    cols = ["coll_id", "comm_op", "group_id", "step", "members", "n_ranks", "bytes",
            "first_start_ns", "end_ns"]
    u = c[~c["matched"].astype(bool)] if len(c) else c
    if len(u) == 0:
        return pd.DataFrame({k: [] for k in [*cols, "reason"]})
    u = u[cols].reset_index(drop=True)
    lone = u["coll_id"].to_numpy() < 0
    u["reason"] = np.where(lone, "no partner paired on another rank",
                           [f"{m} of {n} group members in the trace"
                            for m, n in zip(u["members"], u["n_ranks"])])
    return u
