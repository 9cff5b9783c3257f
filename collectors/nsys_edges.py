"""nsys: dependency edges of one or more exports' ops (see collectors.nsys' docstring):
HOST_ORDER between consecutive runtime calls of a thread, LAUNCH by correlation id within a
process, SYNC from blocking syncs and (with a CUDA_EVENT table) stream waits."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .enums import EdgeKind
from .nsys_sql import _SYNC, _SYNC_CONTEXT, _SYNC_EVENT, _SYNC_STREAM, _SYNC_WAIT
from .trace import StringTable

__all__ = ["nsys_edges"]


def nsys_edges(files: list, gpu: pd.DataFrame, rt: pd.DataFrame,
           strings: StringTable) -> dict[str, np.ndarray]:
    srcs, dsts, kinds, lags = [], [], [], []

    def add(s, d, k, lag):
        srcs.append(np.asarray(s, np.int64))
        dsts.append(np.asarray(d, np.int64))
        kinds.append(np.full(len(srcs[-1]), int(k), np.int8))
        lags.append(np.asarray(lag, np.int64))

    # HOST_ORDER: consecutive runtime calls per thread lane (rt sorted by lane, start)
    lane = rt["lane"].to_numpy()
    same = lane[1:] == lane[:-1]
    st, en, oid = rt["start"].to_numpy(), rt["end"].to_numpy(), rt["op_id"].to_numpy()
    add(oid[:-1][same], oid[1:][same], EdgeKind.HOST_ORDER,
        np.maximum(0, st[1:][same] - en[:-1][same]))

    # LAUNCH: (file, process, correlation)
    # (process, correlation) as one int64: process index in the high bits, corr (uint32)
    procs = pd.unique(np.concatenate([gpu["file"].to_numpy(np.int64) << 56 | gpu["gpid"].to_numpy(np.int64) >> 24,
                                      rt["file"].to_numpy(np.int64) << 56 | rt["gpid"].to_numpy(np.int64) >> 24]))
    pidx = pd.Index(procs)

    def corr_key(df: pd.DataFrame) -> np.ndarray:
        p = pidx.get_indexer(df["file"].to_numpy(np.int64) << 56 | df["gpid"].to_numpy(np.int64) >> 24)
        c = df["corr"].to_numpy(np.int64)
        return np.where(c >= 0, (p.astype(np.int64) << 32) | (c & 0xFFFFFFFF), -1)

    gkey, rkey = corr_key(gpu), corr_key(rt)
    ro = np.argsort(rkey, kind="stable")
    rs = rkey[ro]
    pos = np.clip(np.searchsorted(rs, gkey), 0, max(len(rs) - 1, 0))
    hit = (gkey >= 0) & (len(rs) > 0) & (rs[pos] == gkey) if len(rs) else np.zeros(len(gkey), bool)
    gi = np.flatnonzero(hit)
    ri = ro[pos[hit]]
    add(rt["op_id"].to_numpy()[ri], gpu["op_id"].to_numpy()[gi], EdgeKind.LAUNCH,
        np.minimum(0, gpu["start"].to_numpy()[gi] - rt["end"].to_numpy()[ri]))

    # SYNC
    is_query = np.array(["Query" in n for n in strings.names] + [False], bool)
    next_op = np.full(len(rt), -1, np.int64)
    next_op[:-1][same] = oid[1:][same]
    rt_next = rt.assign(next_op=next_op)
    gl = gpu[["file", "gpid", "rank", "stream", "corr", "end", "op_id"]]
    for fi, f in enumerate(files):
        if len(f.sync) == 0:
            continue
        s = pd.DataFrame({"corr": f.sync[:, 2], "gpid": f.sync[:, 3], "stype": f.sync[:, 4],
                          "stream": f.sync[:, 5], "event": f.sync_event})
        calls = rt_next.loc[rt_next["file"] == fi, ["gpid", "corr", "op_id", "end", "next_op",
                                                    "rank", "name_id"]]
        s = s.merge(calls, on=["gpid", "corr"], how="left")
        no_call = s["op_id"].isna().to_numpy()
        f._drop("sync_without_runtime_call", int(no_call.sum()))
        s = s[~no_call].astype({"op_id": np.int64, "next_op": np.int64, "rank": np.int64,
                                "end": np.int64, "name_id": np.int64})
        stype = s["stype"].to_numpy()
        nonblock = (stype == _SYNC_EVENT) & is_query[s["name_id"].to_numpy()]
        f._drop("sync_nonblocking_event_query", int(nonblock.sum()))
        other = ~np.isin(stype, [_SYNC_EVENT, _SYNC_WAIT, _SYNC_STREAM, _SYNC_CONTEXT])
        f._drop("sync_unknown_type", int(other.sum()))
        s = s[~nonblock & ~other]
        fg = gl[gl["file"] == fi]
        # event syncs and stream waits: the op launched last on the recording stream before
        # the matching cudaEventRecord (needs CUPTI_ACTIVITY_KIND_CUDA_EVENT)
        ev = s["stype"].isin([_SYNC_EVENT, _SYNC_WAIT]).to_numpy()
        rec_src = np.full(len(s), -1, np.int64)
        if ev.any() and len(f.events):
            rec = pd.DataFrame({"rcorr": f.events[:, 0], "gpid": f.events[:, 1],
                                "event": f.events[:, 2], "rstream": f.events[:, 3]})
            q = s.loc[ev, ["gpid", "event", "corr"]].reset_index().sort_values("corr")
            q = pd.merge_asof(q, rec.sort_values("rcorr"), left_on="corr", right_on="rcorr",
                              by=["gpid", "event"], direction="backward",
                              allow_exact_matches=False).dropna(subset=["rcorr"])
            q = q.astype({"rcorr": np.int64, "rstream": np.int64}).sort_values("rcorr")
            launched = fg[fg["corr"] >= 0].rename(columns={"stream": "rstream", "corr": "lcorr"})
            q = pd.merge_asof(q, launched[["gpid", "rstream", "lcorr", "op_id"]].sort_values(
                "lcorr"), left_on="rcorr", right_on="lcorr", by=["gpid", "rstream"],
                direction="backward").dropna(subset=["op_id"])
            pos = s.index.get_indexer(q["index"].to_numpy())
            rec_src[pos] = q["op_id"].to_numpy(np.int64)
        # GPU-side waits: recorded op -> first op launched on the waiting stream after the wait
        wait = (s["stype"] == _SYNC_WAIT).to_numpy()
        w = s[wait].assign(src=rec_src[wait])
        unknown = (w["src"] < 0).to_numpy()
        f._drop("stream_wait_event_record_unknown", int(unknown.sum()))
        w = w[~unknown].sort_values("corr")
        if len(w):
            launched = fg[fg["corr"] >= 0].rename(columns={"corr": "lcorr", "op_id": "dst"})
            w = pd.merge_asof(w[["gpid", "stream", "corr", "src"]], launched[
                ["gpid", "stream", "lcorr", "dst"]].sort_values("lcorr"), left_on="corr",
                right_on="lcorr", by=["gpid", "stream"], direction="forward",
                allow_exact_matches=False)
            nodst = w["dst"].isna().to_numpy()
            f._drop("stream_wait_no_later_gpu_op", int(nodst.sum()))
            w = w[~nodst]
            add(w["src"].to_numpy(np.int64), w["dst"].to_numpy(np.int64), EdgeKind.SYNC,
                np.zeros(len(w), np.int64))
            f._keep(_SYNC, len(w))
        # blocking host syncs: last GPU op finished before the call returned -> next call
        blk = s[~wait].assign(src=rec_src[~wait])
        no_next = (blk["next_op"] < 0).to_numpy()
        f._drop("sync_no_following_runtime_call", int(no_next.sum()))
        blk = blk[~no_next]
        known = (blk["stype"] == _SYNC_EVENT).to_numpy() & (blk["src"] >= 0).to_numpy()
        add(blk["src"].to_numpy()[known], blk["next_op"].to_numpy()[known], EdgeKind.SYNC,
            np.zeros(int(known.sum()), np.int64))
        f._keep(_SYNC, int(known.sum()))
        blk = blk[~known]
        by_stream = (blk["stype"] == _SYNC_STREAM).to_numpy()
        g = fg[["rank", "stream", "end", "op_id"]].sort_values("end", kind="stable")
        for mask, by in ((by_stream, ["rank", "stream"]), (~by_stream, ["rank"])):
            q = blk[mask].sort_values("end", kind="stable")
            if len(q) == 0:
                continue
            mm = pd.merge_asof(q[["end", "next_op", *by]], g[["end", "op_id", *by]].rename(
                columns={"op_id": "gsrc"}), on="end", by=by, direction="backward")
            miss = mm["gsrc"].isna().to_numpy()
            f._drop("sync_no_prior_gpu_op", int(miss.sum()))
            mm = mm[~miss]
            add(mm["gsrc"].to_numpy(np.int64), mm["next_op"].to_numpy(np.int64), EdgeKind.SYNC,
                np.zeros(len(mm), np.int64))
            f._keep(_SYNC, len(mm))
    if not srcs:
        return {"src": np.zeros(0, np.int64), "dst": np.zeros(0, np.int64),
                "kind": np.zeros(0, np.int8), "lag_ns": np.zeros(0, np.int64)}
    return {"src": np.concatenate(srcs), "dst": np.concatenate(dsts),
            "kind": np.concatenate(kinds), "lag_ns": np.concatenate(lags)}
