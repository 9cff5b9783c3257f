"""numba helpers of the contention path for link sharing (max-min fair bandwidth).

Split from :mod:`replay._fluid`. A job's flows load the links of its member devices;
``link_cnt`` counts active flows per link and ``link_cap`` is each link's capacity share.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__: list[str] = []


@njit(cache=True)
def _links_add(j, n, coll_ptr, coll_members, link, link_cnt, link_cap, delta):
    if j < n:
        if link[j] >= 0:
            link_cnt[link[j]] += delta
            link_cap[link[j]] = 1.0
        return
    c = j - n
    for k in range(coll_ptr[c], coll_ptr[c + 1]):
        lk = link[coll_members[k]]
        if lk >= 0:
            link_cnt[lk] += delta
            link_cap[lk] = 1.0


@njit(cache=True)
def _flow_share(j, n, coll_ptr, coll_members, link, link_cnt, link_cap):
    """Bottleneck fair share of flow ``j``: min over its links of capacity left / flows."""
    best = np.inf
    if j < n:
        lk = link[j]
        if lk >= 0 and link_cnt[lk] > 0:
            best = link_cap[lk] / link_cnt[lk]
        return best
    c = j - n
    for k in range(coll_ptr[c], coll_ptr[c + 1]):
        lk = link[coll_members[k]]
        if lk >= 0 and link_cnt[lk] > 0:
            v = link_cap[lk] / link_cnt[lk]
            if v < best:
                best = v
    return best


@njit(cache=True)
def _links_freeze(j, n, coll_ptr, coll_members, link, link_cnt, link_cap, rate):
    if j < n:
        lk = link[j]
        if lk >= 0:
            link_cnt[lk] -= 1
            link_cap[lk] -= rate
        return
    c = j - n
    for k in range(coll_ptr[c], coll_ptr[c + 1]):
        lk = link[coll_members[k]]
        if lk >= 0:
            link_cnt[lk] -= 1
            link_cap[lk] -= rate


@njit(cache=True)
def _links_reset(j, n, coll_ptr, coll_members, link, link_cnt, link_cap):
    if j < n:
        if link[j] >= 0:
            link_cnt[link[j]] = 0
            link_cap[link[j]] = 0.0
        return
    c = j - n
    for k in range(coll_ptr[c], coll_ptr[c + 1]):
        lk = link[coll_members[k]]
        if lk >= 0:
            link_cnt[lk] = 0
            link_cap[lk] = 0.0
