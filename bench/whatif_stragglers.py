"""Fidelity of the straggler what-if against ByteDance's published result-ST.json.

Runs :func:`replay.policies.straggler_analysis` on ``../shared/traces/oplevel/
megatron-ST-8rank`` and prints, for every published figure (per-step ``step_t_base``,
``step_t_nodelay``, ``step_t_noblk``, ``blocking_slowdown`` and the decompositions by stage,
DP rank and op type), ours, theirs and the relative error, plus the wall time.

Usage::

    python bench/whatif_stragglers.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from retime.collectors.oplevel import read_oplevel  # noqa: E402
from retime.replay.policies import straggler_analysis  # noqa: E402

ST = ROOT.parent / "shared" / "traces" / "oplevel" / "megatron-ST-8rank"


def main() -> None:
    ref = json.loads((ST / "result-ST.json").read_text())
    trace = read_oplevel(ST)
    straggler_analysis(trace)  # JIT warm-up
    t0 = time.perf_counter()
    res = straggler_analysis(trace)
    wall = time.perf_counter() - t0
    rows = []
    for ours, theirs in (("measured", "step_t_base"), ("simulated", "step_t_nodelay"),
                         ("ideal", "step_t_noblk")):
        errs = [abs(v[ours] / ref[theirs][str(s)] - 1) for s, v in res["step_time_s"].items()]
        rows.append((f"{theirs} (max over {len(errs)} steps)", None, None, max(errs)))
    rows.append(("blocking_slowdown", res["slowdown"], ref["blocking_slowdown"],
                 abs(res["slowdown"] / ref["blocking_slowdown"] - 1)))
    for ours, theirs in (("by_stage", "blocking_decompose_by_stage"),
                         ("by_dp_rank", "blocking_decompose_by_dp_rank"),
                         ("by_optype", "blocking_decompose_by_optype")):
        for k, v in ref[theirs].items():
            got = res[ours][str(k)]
            rows.append((f"{theirs}[{k}]", got, v, abs(got / v - 1)))
    print(f"{'figure':58s} {'retime':>10s} {'published':>10s} {'rel. error':>11s}")
    for name, a, b, e in rows:
        a_s = f"{a:10.6f}" if a is not None else " " * 10
        b_s = f"{b:10.6f}" if b is not None else " " * 10
        print(f"{name:58s} {a_s} {b_s} {e:11.2e}")
    print(f"max relative error {max(r[3] for r in rows):.2e} over {len(rows)} figures; "
          f"analysis {wall:.2f} s ({2 + len(rows) - 4} replays of {trace.n_ops} ops)")


if __name__ == "__main__":
    main()
