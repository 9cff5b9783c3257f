"""A slow, obvious reference of the step windows (collectors.steps), for the tests.

Written from the definition in plain Python loops over one rank at a time: a profiler
step's extent is its ProfilerStep#N range on a host thread joined with the ops issued in it;
``E_k`` is the running maximum of the extents' ends; every window but the first starts at
the previous ``E``; the first starts at its extent's start or, if later, at the end of the
GPU work of no step queued before the step's first GPU op, or, if later still and that first
GPU op started more than max(50 us, 1% of the window) after its launch call (a LAUNCH edge)
ended, at that op's start or the step's GPU-side marker if it starts earlier. A step with no
ops makes no window.
"""

from __future__ import annotations

import re

from retime.collectors.enums import EdgeKind, LaneKind

_PS = re.compile(r"^ProfilerStep#(\d+)$")


def naive_windows(trace) -> dict[tuple[int, int], tuple[int, int]]:
    """{(rank, step): (start_ns, end_ns)} of the measured trace."""
    lane_kind = dict(zip(trace.lanes["lane"].tolist(), trace.lanes["lane_kind"].tolist()))
    gpu_kinds = (int(LaneKind.GPU_STREAM), int(LaneKind.OP_STREAM))
    per_rank: dict[int, list] = {}
    o = trace.ops
    ends = (o["start_ns"] + o["dur_ns"]).tolist()
    launch_end: dict[int, int] = {}
    for src, dst, k in zip(trace.edges["src"].tolist(), trace.edges["dst"].tolist(),
                           trace.edges["kind"].tolist()):
        if k == int(EdgeKind.LAUNCH):
            launch_end[dst] = ends[src]
    for i, (r, st, s, d, ln) in enumerate(zip(o["rank"].tolist(), o["step"].tolist(),
                                              o["start_ns"].tolist(), o["dur_ns"].tolist(),
                                              o["lane"].tolist())):
        wait = s - launch_end[i] if i in launch_end else -1
        per_rank.setdefault(r, []).append((st, s, s + d, lane_kind[ln] in gpu_kinds, wait))
    ps: dict[int, dict[int, list[int]]] = {}
    gmark: dict[tuple[int, int], int] = {}
    rg = trace.ranges
    for r, nid, a, b, ln in zip(rg["rank"].tolist(), rg["name_id"].tolist(),
                                rg["start_ns"].tolist(), rg["end_ns"].tolist(),
                                rg["lane"].tolist()):
        m = _PS.match(trace.strings[nid])
        if m and lane_kind[ln] == int(LaneKind.CPU_THREAD):
            cur = ps.setdefault(r, {}).setdefault(int(m.group(1)), [a, b])
            cur[0], cur[1] = min(cur[0], a), max(cur[1], b)
        elif m:
            key = (r, int(m.group(1)))
            gmark[key] = min(gmark.get(key, a), a)
    out = {}
    for r in sorted(set(per_rank) | set(ps)):
        ops = per_rank.get(r, [])
        ext: dict[int, list[int]] = {}
        for st, s, e, _, _ in ops:
            if st >= 0:
                cur = ext.setdefault(st, [s, e])
                cur[0], cur[1] = min(cur[0], s), max(cur[1], e)
        for k, (a, b) in ps.get(r, {}).items():
            if k in ext:  # a step without ops makes no window
                ext[k] = [min(ext[k][0], a), max(ext[k][1], b)]
        if not ext:
            if ops:
                out[(r, -1)] = (min(x[1] for x in ops), max(x[2] for x in ops))
            continue
        first_gpu = min((s for st, s, e, g, _ in ops if g and st >= 0), default=None)
        prior = None
        for st, s, e, g, _ in ops:
            if g and st < 0 and (first_gpu is None or s < first_gpu):
                prior = e if prior is None else max(prior, e)
        prev_end = None
        for k in sorted(ext):
            a, b = ext[k]
            end = b if prev_end is None else max(b, prev_end)
            if prev_end is None:
                start = a if prior is None else max(a, prior)
                start = min(start, end)
                gops = sorted((s, w) for st, s, e, g, w in ops if g and st == k)
                if gops and gops[0][1] > max(50_000, int(0.01 * (end - start))):
                    cut = min(gops[0][0], gmark.get((r, k), gops[0][0]))
                    start = min(max(start, cut), end)
            else:
                start = prev_end
            out[(r, k)] = (start, end)
            prev_end = end
    return out


def naive_rank_totals(trace) -> dict[int, int]:
    """{rank: sum of its window lengths}."""
    tot: dict[int, int] = {}
    for (r, _), (a, b) in naive_windows(trace).items():
        tot[r] = tot.get(r, 0) + (b - a)
    return tot
