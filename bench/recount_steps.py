"""Independent recount of the Megatron op-level trace's step times from the raw Parquet.

Reads ``../shared/traces/oplevel/megatron-ST-8rank/trace-ST.parquet`` with pyarrow alone (no
retime code) and prints, per step, three windows next to ``result-ST.json``'s
``step_t_base``:

* ``job``: the step's first op start on any rank to its last op end on any rank (what
  ``retime stragglers`` calls *measured*, and what ``step_t_base`` is);
* ``job (optimizer)``: the same, ending at the last end of the step's ``optimizer`` ops
  (the stragglers module's stated rule; equal here);
* ``slowest rank``: the largest of the ranks' own windows, each rank's first op start to its
  own last op end. For the first step (23) this is what ``retime analyze`` / ``retime
  report`` print; their later steps' windows tile each rank's timeline from its own end of
  the step before (``collectors/steps.py``), which this recount does not redo.

They differ where the ranks start a step apart: step 23's ranks 0, 1, 6 and 7 start it
~5.1-5.3 ms after ranks 2-5 and end it as much later, so the job window (2.3817 s) exceeds
every rank's own window (at most 2.3764 s, rank 3).

Usage::

    python bench/recount_steps.py
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq

ST = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "oplevel" / "megatron-ST-8rank"


def recount(path: Path = ST / "trace-ST.parquet") -> dict[int, dict[str, float]]:
    """{step: {"job", "job_optimizer", "slowest_rank", "slowest_rank_id"}} in seconds, from
    the raw columns (start_ts and duration are float32 seconds; sums in float64)."""
    t = pq.read_table(path, columns=["rank", "step", "optype", "start_ts", "duration"]).to_pydict()
    first: dict[tuple[int, int], float] = {}
    last: dict[tuple[int, int], float] = {}
    opt_end: dict[int, float] = defaultdict(lambda: float("-inf"))
    for r, s, op, st, du in zip(t["rank"], t["step"], t["optype"], t["start_ts"], t["duration"],
                                strict=True):
        st, en = float(st), float(st) + float(du)
        k = (int(r), int(s))
        first[k] = min(first.get(k, st), st)
        last[k] = max(last.get(k, en), en)
        if op == "optimizer":
            opt_end[int(s)] = max(opt_end[int(s)], en)
    out: dict[int, dict[str, float]] = {}
    for s in sorted({k[1] for k in first}):
        ks = [k for k in first if k[1] == s]
        f0 = min(first[k] for k in ks)
        own = {k[0]: last[k] - first[k] for k in ks}
        rk = max(own, key=own.get)
        out[s] = {"job": max(last[k] for k in ks) - f0, "job_optimizer": opt_end[s] - f0,
                  "slowest_rank": own[rk], "slowest_rank_id": rk}
    return out


def main() -> None:
    ref = json.loads((ST / "result-ST.json").read_text())["step_t_base"]
    rc = recount()
    print(f"{'step':>5s} {'job (s)':>10s} {'job opt.':>10s} {'step_t_base':>12s} "
          f"{'slowest rank':>13s} {'rank':>5s}")
    worst = 0.0
    for s, v in rc.items():
        pub = ref[str(s)]
        worst = max(worst, abs(v["job"] / pub - 1))
        print(f"{s:5d} {v['job']:10.6f} {v['job_optimizer']:10.6f} {pub:12.6f} "
              f"{v['slowest_rank']:13.6f} {v['slowest_rank_id']:5d}")
    print(f"job window vs step_t_base: max relative difference {worst:.2e} over {len(rc)} steps")


if __name__ == "__main__":
    main()
