"""Stragglers: which ranks, stages and op types cost how much (what-if attribution).

A thin tidy view over the replay's straggler analysis
(:func:`replay.policies.stragglers.straggler_analysis`): every step is replayed with ideal
op durations, then with one group at a time (a pipeline stage, a DP rank, an op type) back at
its measured durations; a group's ``slowdown`` is that replay's mean step time over the ideal
one, so ``cost_pct = 100 * (slowdown - 1)`` is what the group's deviation from ideal costs.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ._util import as_trace

__all__ = ["stragglers"]


def stragglers(x: Any) -> pd.DataFrame:
    """Tidy straggler attribution: ``group`` (``overall``, ``stage``, ``dp_rank``,
    ``optype``), ``key``, ``slowdown``, ``cost_pct``; sorted by cost within each group.
    ``attrs['step_time_s']`` keeps the per-step measured/simulated/ideal times."""
    from retime.replay.policies.stragglers import straggler_analysis

    res = straggler_analysis(as_trace(x))
    rows = [("overall", "all", float(res["slowdown"]))]
    for group, field in (("stage", "by_stage"), ("dp_rank", "by_dp_rank"),
                         ("optype", "by_optype")):
        rows += [(group, str(k), float(v)) for k, v in res.get(field, {}).items()]
    df = pd.DataFrame(rows, columns=["group", "key", "slowdown"])
    df["cost_pct"] = 100.0 * (df["slowdown"] - 1.0)
    df.attrs["step_time_s"] = res.get("step_time_s", {})
    df.attrs["method"] = res.get("method", "")
    return df
