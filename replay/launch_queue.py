"""Host launches blocked on a full CUDA launch queue (issue 27; analysis/LAUNCH_QUEUE.md).

On a GPU-bound source the host runs ahead until the launch queue is full; the next launch
call then blocks until the GPU finishes the op launched K launches earlier (K = 1022 on the
g2 H200 traces, recounted from their 'Command Buffer Full' records). Such a call is replayed
as a *wait edge* (the same mechanism as a synchronize): it ends at
``max(start + own, end of op i-K + measured lag)``, so a faster GPU shortens the block and a
slower one lengthens it, while the measured timeline is reproduced exactly.

K is found per device from the trace itself: for every launch call of at least
``MIN_CALL_NS``, the largest k (up to ``MAX_DEPTH``) whose GPU op (launch order; ops launched
before the window first, in GPU order) ended ``WINDOW_NS`` before the call returned. The mode
is used when at least ``MIN_SUPPORT`` calls agree on it (within ``SLACK``); a call is tied to
op i-k only where its own k is within ``SLACK`` of the mode. Traces without GPU ops (CPU
pairs) or with no such pattern get no queue waits.
"""
from __future__ import annotations

import numpy as np

from retime.collectors.enums import EdgeKind

MIN_CALL_NS = 20_000
WINDOW_NS = (-2_000, 30_000)
MAX_DEPTH = 1100
MIN_DEPTH = 64
MIN_SUPPORT = 20
SLACK = 2
_CHUNK = 2048


def queue_waits(s, end, es, ed, ek, on_device, device_key):
    """(gpu op ids, launch call ids, {device key: K}) of the launch calls blocked on a full
    queue; empty arrays when none is found."""
    n = len(s)
    none = (np.zeros(0, np.int64), np.zeros(0, np.int64), {})
    if not len(es) or not on_device.any():
        return none
    lm = (ek == EdgeKind.LAUNCH) & on_device[ed] & ~on_device[es]
    if not lm.any():
        return none
    launch_of = np.full(n, -1, np.int64)
    launch_of[ed[lm]] = es[lm]
    srcs, dsts, depths = [], [], {}
    gpu = np.flatnonzero(on_device)
    for key in np.unique(device_key[gpu]):
        ops = gpu[device_key[gpu] == key]
        lo = launch_of[ops]
        pre = ops[lo < 0]
        pre = pre[np.lexsort((pre, s[pre]))]
        post = ops[lo >= 0]
        post = post[np.lexsort((post, s[launch_of[post]]))]
        order = np.concatenate([pre, post])
        ends = end[order]
        calls = launch_of[post]
        pos = np.arange(len(pre), len(order))
        long_ = (end[calls] - s[calls]) >= MIN_CALL_NS
        pos, calls = pos[long_], calls[long_]
        if len(pos) < MIN_SUPPORT:
            continue
        k_of = np.zeros(len(pos), np.int64)
        ks = np.arange(1, MAX_DEPTH + 1)
        for a in range(0, len(pos), _CHUNK):
            p = pos[a:a + _CHUNK, None] - ks[None, :]
            ok = p >= 0
            gap = end[calls[a:a + _CHUNK], None] - ends[np.where(ok, p, 0)]
            hit = ok & (gap >= WINDOW_NS[0]) & (gap <= WINDOW_NS[1])
            last = MAX_DEPTH - np.argmax(hit[:, ::-1], axis=1)  # largest k that hit
            k_of[a:a + _CHUNK] = np.where(hit.any(axis=1), last, 0)
        valid = k_of >= MIN_DEPTH
        if valid.sum() < MIN_SUPPORT:
            continue
        K = int(np.bincount(k_of[valid]).argmax())
        near = valid & (np.abs(k_of - K) <= SLACK)
        if near.sum() < MIN_SUPPORT:
            continue
        depths[int(key)] = K
        srcs.append(order[pos[near] - k_of[near]])
        dsts.append(calls[near])
    if not srcs:
        return none
    return np.concatenate(srcs), np.concatenate(dsts), depths
