"""Launch-queue recount on a raw Kineto (torch.profiler) trace (issue 27).

On a GPU-bound source the host runs ahead until the CUDA launch queue is full; the next
launch call then blocks, and CUPTI records a 'Command Buffer Full' overhead event inside it.
This module recounts, from the trace alone, how many GPU ops were outstanding when such a
blocked call returned: for each blocked launch i (counting every GPU op in launch order,
with ops whose launch precedes the profiling window counted first, in GPU order), it finds
the K for which the GPU op launched K launches earlier finished 0..30 us before the call
returned. Analysis only: the replay does not use it yet.
"""
from __future__ import annotations

import bisect
import gzip
import json
from collections import Counter
from dataclasses import dataclass, field

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("cuda_runtime", "cuda_driver")
# the blocked call returns this long (us) after the freeing op's end, at most (clock
# resolution plus the driver's own return path); -2 us allows for clock rounding.
RETURN_WINDOW_US = (-2.0, 30.0)


@dataclass
class QueueRecount:
    blocked_calls: int  # launch calls holding a 'Command Buffer Full' record
    cbf_records: int
    cbf_total_us: float
    pre_window_ops: int  # GPU ops whose launch is before the profiling window
    depth: Counter = field(default_factory=Counter)  # K -> blocked calls matched at K
    unmatched: int = 0  # blocked calls with no freeing op found (GPU not recorded yet)

    @property
    def modal_depth(self) -> int | None:
        return self.depth.most_common(1)[0][0] if self.depth else None


def load_events(path: str) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


def recount(events: list[dict], max_depth: int = 1100) -> QueueRecount:
    host = [e for e in events if e.get("cat") in HOST_CATS and e.get("ph") == "X"]
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATS and e.get("ph") == "X"),
                 key=lambda e: e["ts"])
    cbf = sorted((e for e in events if e.get("cat") == "overhead"
                  and e.get("name") == "Command Buffer Full"), key=lambda e: e["ts"])
    by_corr = {e.get("args", {}).get("correlation"): e for e in host}
    pre = [g for g in gpu if g.get("args", {}).get("correlation") not in by_corr]
    launched = sorted(((by_corr[g["args"]["correlation"]], g) for g in gpu
                       if g.get("args", {}).get("correlation") in by_corr),
                      key=lambda x: x[0]["ts"])
    ends = [g["ts"] + g["dur"] for g in pre] + [g["ts"] + g["dur"] for _, g in launched]
    starts = [h["ts"] for h, _ in launched]
    out = QueueRecount(0, len(cbf), sum(e["dur"] for e in cbf), len(pre))
    lo, hi = RETURN_WINDOW_US

    seen = set()
    for rec in cbf:
        i = bisect.bisect_right(starts, rec["ts"] + 1) - 1
        if i < 0:
            continue
        h = launched[i][0]
        if not (h["ts"] + h["dur"] + 1 >= rec["ts"] + rec["dur"]):
            continue  # record not inside a launch call that has a GPU op
        if i in seen:
            continue
        seen.add(i)
        out.blocked_calls += 1
        ret = h["ts"] + h["dur"]
        gi = len(pre) + i
        ks = [gi - j for j in range(max(0, gi - max_depth), gi) if lo <= ret - ends[j] <= hi]
        if ks:
            out.depth[max(ks)] += 1  # the oldest op that freed a slot just before return
        else:
            out.unmatched += 1
    return out
