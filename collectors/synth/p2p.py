"""Pipeline point-to-point pairs in the synth builder's schedule.

:func:`sync_edges` adds the dependency edges of blocking pipeline communication
(``p2p = "sync"`` or ``"serial"``) for one stage's item order; :func:`own_ready_starts` turns
the start-together schedule of a send/receive pair into the start times a measured trace
records (each member starts when its own rank is ready). Both are used by
:func:`collectors.synth.builder.build_trace`.
"""

from __future__ import annotations

import numpy as np

from .schedule import F

__all__ = ["own_ready_starts", "sync_edges"]


def own_ready_starts(start, dur, lane, src, dst, lag, member) -> tuple[np.ndarray, np.ndarray]:
    """Members of a send/receive pair as a measured trace records them (and as the replay
    reads them, replay/graph.py): each starts when its rank is ready and ends where the
    schedule ended it, so the one that waited holds its wait and the transfer after the later
    start is each member's tail. The schedule started both at the later ready time."""
    end = start + dur
    ready = np.zeros(len(start), np.int64)
    em = member[dst]
    np.maximum.at(ready, dst[em], end[src[em]] + lag[em])
    order = np.lexsort((np.arange(len(start)), lane))  # a lane runs its ops in index order
    same = lane[order][1:] == lane[order][:-1]
    prev = np.full(len(start), -1, np.int64)
    prev[order[1:][same]] = order[:-1][same]
    pm = member & (prev >= 0)
    ready[pm] = np.maximum(ready[pm], end[prev[pm]])
    # (one with no predecessor at all was ready at the step's start, 0; never after the
    # schedule's start)
    own = np.where(member, np.minimum(ready, start), start)
    return own, np.where(member, end - own, dur)


def sync_edges(order, item_ids, calls, layout, sched, p, stage, add_edges, recv_post,
                serial: bool = False) -> None:
    """Blocking pipeline communication (``p2p = "sync"``, see ParallelConfig): a send waits
    for the end of the item before its call (a deferred send), the item after a call waits
    for every send and receive of that call, and each receive records its call point (the
    exit of the item before the call) for the rendezvous edge to the matching send.
    ``serial`` (``p2p = "serial"``, DeepSpeed's pipeline engine): the call's send and
    receive are two blocking calls in DeepSpeed's order, the second starting when the first
    has finished, instead of one batched call."""
    n = len(order)
    src, dst = [], []
    # call index of each item's send: first call at or after it
    nxt_call = [-1] * n
    j = -1
    for k in range(n - 1, -1, -1):
        if calls[k]:
            j = k
        nxt_call[k] = j
    prv_call = [-1] * n  # last call before item k
    j = -1
    for k in range(n):
        prv_call[k] = j
        if calls[k]:
            j = k
    members: dict[int, list[int]] = {}
    for k, (ph, mb, c) in enumerate(order):
        recv, send, _exit, _first = item_ids[k]
        if send >= 0:
            cj = nxt_call[k]
            if cj > k and item_ids[cj][2] >= 0:
                src.append(item_ids[cj][2])
                dst.append(send)
            if cj >= 0:
                members.setdefault(cj, []).append(send)
        if recv >= 0:
            cj = prv_call[k]
            vs = layout.vs_of(sched, p, c, stage)
            d = 0 if ph == F else 1
            recv_post[(d, mb, vs)] = item_ids[cj][2] if cj >= 0 else -1
            if cj >= 0:
                members.setdefault(cj, []).append(recv)
    if serial:  # DeepSpeed: two blocking calls, one after the other (REFERENCES.md R38)
        for cj in members:
            snd = item_ids[cj][1] if nxt_call[cj] == cj else -1
            rcv = item_ids[cj + 1][0] if cj + 1 < n else -1
            if snd >= 0 and rcv >= 0:  # forward step: receive, then send the gradient;
                first, then = (rcv, snd) if order[cj + 1][0] == F else (snd, rcv)
                src.append(first)  # backward step: send the activation, then receive
                dst.append(then)
    for cj, ops in members.items():
        if cj + 1 < n and item_ids[cj + 1][3] >= 0:
            first = item_ids[cj + 1][3]
            for o in ops:
                if o != item_ids[cj + 1][0]:
                    src.append(o)
                    dst.append(first)
    if src:
        add_edges(src, dst)
