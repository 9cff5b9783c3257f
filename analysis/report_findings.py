"""Findings in plain words, and the critical path explained.

:func:`findings` turns a :class:`~analysis.report_run.RunAnalysis` into candidate sentences
weighted by the share of the step they concern; the report keeps the heaviest.
:func:`explain_critical_path` splits the path into parts in words (op time by what ran,
waits by what was waited on) whose shares add up to 100%, lists the ranks and resources it
crosses, and says why its length differs from the step time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from retime.collectors.arrays import isin
from retime.collectors.enums import CommOp, LaneKind

from ._util import COMM_KINDS, _memo
from .breakdown import PARTS
from .report_run import RunAnalysis
from .tables import fmt_ns, fmt_pct, ranks_label, short_name

__all__ = ["findings", "collective_waits", "explain_critical_path", "PART_WORDS"]

#: the breakdown parts in words
PART_WORDS = {"compute_ns": "GPU compute", "overlapped_comm_ns": "communication hidden under "
              "compute", "exposed_comm_ns": "exposed communication",
              "memcpy_ns": "memory copies", "host_bound_ns": "host-bound time",
              "idle_ns": "idle time"}

_OP_WORDS = {"KERNEL": "GPU compute kernels", "COMPUTE": "compute ops",
             "COLLECTIVE": "collective transfers", "P2P": "point-to-point transfers",
             "MEMCPY": "memory copies", "MEMSET": "memory copies",
             "CPU_OP": "host CPU work (operators)", "RUNTIME": "host runtime calls (launches, "
             "allocations)", "SYNC": "stream synchronization markers"}
_WAIT_WORDS = {"HOST_ORDER": "host time between traced ops (Python, framework, untraced work)",
               "LAUNCH": "kernel launch latency (launch call to kernel start)",
               "SYNC": "waiting for a synchronization (event, stream or device)",
               "COLLECTIVE": "waiting for the last rank to reach a collective",
               "P2P": "waiting for the matching send or receive",
               "DATA": "waiting on a data dependency",
               "LANE_ORDER": "queued behind earlier work on the same stream or thread",
               "GAP": "gaps in the replay (delays no dependency explains)"}


def collective_waits(t) -> pd.DataFrame:
    """Who waits for whom: per (waiting rank, last-arriving rank, primitive) the total time
    the rank spent in collectives waiting for that rank to arrive. Columns ``rank``,
    ``late_rank``, ``comm_op``, ``instances``, ``wait_ns``; sorted by wait, longest first."""
    # the findings and the communication section both ask: once per memo scope
    return _memo(t, "collective_waits", lambda: _collective_waits(t)).copy()


def _collective_waits(t) -> pd.DataFrame:
    from .comm import matched_coll_ids

    o = t.ops
    m = isin(o["kind"].to_numpy(), COMM_KINDS) & (o["coll_id"].to_numpy() >= 0)
    m &= isin(o["coll_id"].to_numpy(), matched_coll_ids(t))  # matched instances only
    df = pd.DataFrame({"rank": o["rank"].to_numpy()[m], "coll": o["coll_id"].to_numpy()[m],
                       "start": o["start_ns"].to_numpy()[m], "op": o["comm_op"].to_numpy()[m]})
    cols = ["rank", "late_rank", "comm_op", "instances", "wait_ns"]
    if len(df) == 0:
        return pd.DataFrame({c: [] for c in cols})
    df = df.sort_values(["coll", "start", "rank"], ascending=[True, False, True],
                        kind="mergesort")
    last = df.groupby("coll", sort=False).head(1).set_index("coll")
    df["late_rank"] = last["rank"].reindex(df["coll"]).to_numpy()
    df["wait_ns"] = last["start"].reindex(df["coll"]).to_numpy() - df["start"].to_numpy()
    w = df[df["wait_ns"] > 0]
    g = w.groupby(["rank", "late_rank", "op"]).agg(instances=("coll", "size"),
                                                  wait_ns=("wait_ns", "sum")).reset_index()
    g["comm_op"] = [CommOp(int(c)).name.lower().replace("_", "-") if 0 <= c <= max(CommOp)
                    else "collective" for c in g["op"]]
    return g.sort_values("wait_ns", ascending=False, kind="mergesort")[cols].reset_index(drop=True)


def cpu_only(t) -> bool:
    """A trace with no GPU streams (CPU training, gloo): its CPU ops stand for the device
    in the breakdown (analysis.breakdown), so the words are about the CPU, not a GPU."""
    lk = t.lanes["lane_kind"].to_numpy() if len(t.lanes) else []
    return len(lk) > 0 and not (lk == int(LaneKind.GPU_STREAM)).any() \
        and not (lk == int(LaneKind.OP_STREAM)).any()


def _slowest_words(run: RunAnalysis) -> str:
    """Which rank the slowest-rank figures are of: one rank, or, when the slowest rank
    changes from step to step, the mean over each step's slowest rank and how often the
    most frequent one is it (its own figures are in the per-rank table)."""
    bd = run.bd
    slow = bd.loc[bd.groupby("step")["step_ns"].idxmax(), "rank"].to_numpy()
    r = run.slowest_rank
    k = int((slow == r).sum())
    if k == len(slow):
        return f"rank {r}"
    return f"each step's slowest rank, averaged: rank {r} in {k} of {len(slow)} steps"


def _dominant(run: RunAnalysis) -> tuple[float, str]:
    parts = run.slow_parts
    st = run.step_ns
    top = max(PARTS, key=lambda p: parts[p])
    share = parts[top] / st if st else 0.0
    if len(run.bd) and (run.bd["step"] < 0).all():  # no step markers: one window, no "step"
        amount = (f"{fmt_pct(share)} of the slowest rank's trace ({_slowest_words(run)}, "
                  f"{fmt_ns(parts[top])}; no step markers: the whole trace as one window)"
                  if run.n_ranks > 1 else f"{fmt_pct(share)} of the trace ({fmt_ns(parts[top])};"
                  " no step markers: the whole trace as one window)")
    else:
        amount = (f"{fmt_pct(share)} of the slowest rank's step ({_slowest_words(run)}, "
                  f"{fmt_ns(parts[top])} per step)" if run.n_ranks > 1 else
                  f"{fmt_pct(share)} of the step ({fmt_ns(parts[top])})")
    if top == "host_bound_ns" and cpu_only(run.t):
        txt = (f"The job is host-bound: for {amount} the CPU runs Python and framework code "
               "outside every operator; less Python per step (larger operators, fewer calls) "
               "helps more than faster operators.")
    elif top == "host_bound_ns":
        txt = (f"The job is host-bound: for {amount} the GPU waits while the CPU works (Python, "
               "framework, kernel launches); a faster host or fewer, larger kernels help more "
               "than a faster GPU.")
    elif top == "exposed_comm_ns":
        txt = (f"Communication that nothing hides takes {amount}: overlap it with compute or "
               "make it smaller.")
    elif top == "idle_ns":
        txt = (f"Nothing runs for {amount}: the rank waits on other ranks (pipeline bubbles, "
               "late collectives) or on work the trace does not show.")
    elif top == "compute_ns":
        dev = "CPU" if cpu_only(run.t) else "GPU"
        what = "The trace" if "no step markers" in amount else "The step"
        txt = f"{what} is compute-bound: {dev} compute with no communication running fills {amount}."
    else:
        txt = f"{PART_WORDS[top].capitalize()} take {amount}."
    return share + 0.5, txt


def findings(run: RunAnalysis) -> list[tuple[float, str]]:
    """Candidate findings as (weight = share of the step concerned, sentence)."""
    out: list[tuple[float, str]] = []
    st = run.step_ns
    if not st or len(run.bd) == 0:
        return out
    out.append(_dominant(run))
    steps = max(run.steps, 1)
    cw = run.cw
    if len(cw):
        w = cw.iloc[0]
        per = float(w["wait_ns"]) / steps
        times = int(w["instances"])
        out.append((per / st, f"Rank {int(w['rank'])} waits {fmt_ns(per)} per step in "
                              f"{w['comm_op']} for rank {int(w['late_rank'])}, which issues it "
                              f"last" + (f" ({times} times)" if times > 1 else "") + "."))
    b = run.bsum
    if len(b) > 1:
        hi, lo = float(b["step_ns"].max()), float(b["step_ns"].min())
        if hi > 0 and (hi - lo) / hi > 0.03:
            rh = int(b.loc[b["step_ns"].idxmax(), "rank"])
            rl = int(b.loc[b["step_ns"].idxmin(), "rank"])
            out.append(((hi - lo) / hi * 0.8,
                        f"Ranks are imbalanced: rank {rh} takes {fmt_ns(hi)} per step, "
                        f"{fmt_pct((hi - lo) / lo)} more than rank {rl} ({fmt_ns(lo)})."))
    ks = run.ks
    if len(ks) and not cpu_only(run.t):  # a CPU trace has no kernels (only its collectives)
        k = ks.iloc[0]
        out.append((float(k["share"]) * 0.5,
                    f"The top kernel, {short_name(str(k['name']), 60)} "
                    f"({k['kernel_class']}), takes {fmt_pct(k['share'])} of GPU time "
                    f"({int(k['count']):,} calls, {fmt_ns(k['mean_ns'])} each on average)."))
    if run.n_stages > 1 and len(run.bub):
        bf = float(run.bub["bubble_ns"].sum() / max(run.bub["step_ns"].sum(), 1))
        ideal = run.bub["ideal_bubble_frac"].mean()
        tail = (f" (the schedule's ideal is {fmt_pct(ideal)} for {run.n_stages} stages)"
                if ideal == ideal else "")
        out.append((bf * 0.9, f"Pipeline stages do no compute for {fmt_pct(bf)} of the step "
                              f"(bubbles and waits){tail}."))
    cp = run.cp
    if len(cp) and cp.attrs.get("length_ns"):
        parts = _path_parts(run)
        if len(parts):
            p0 = parts.iloc[0]
            ranks = sorted(set(cp["rank"].tolist()))
            whose = "The slowest rank's own critical path" if cp.attrs.get("scope") else \
                "The critical path"  # a streamed report's path is one rank's (said so)
            where = (f"it stays on rank {ranks[0]}" if len(ranks) == 1 else
                     f"it crosses {len(ranks)} ranks ({ranks_label(ranks, 4)})")
            out.append((0.25, f"{whose} ({fmt_ns(cp.attrs['length_ns'])}) is "
                              f"{fmt_pct(p0['share'])} {p0['part']}; {where}."))
    return out


# ------------------------------------------------------------------ critical path
def _path_parts(run: RunAnalysis) -> pd.DataFrame:
    cp = run.cp
    length = int(cp.attrs.get("length_ns") or 0)
    rows: dict[str, list[int]] = {}
    kinds = cp["kind"].astype(str).to_numpy()
    for k, d in zip(kinds, cp["dur_ns"].to_numpy()):
        if d:
            key = _OP_WORDS.get(k, k.lower())
            r = rows.setdefault(key, [0, 0])
            r[0] += int(d)
            r[1] += 1
    for k, w in zip(cp["wait_kind"].to_numpy(), cp["wait_ns"].to_numpy()):
        if w:
            key = _WAIT_WORDS.get(str(k), f"waiting ({k})")
            r = rows.setdefault(key, [0, 0])
            r[0] += int(w)
            r[1] += 1
    df = pd.DataFrame([(k, v[0], v[1]) for k, v in rows.items()],
                      columns=["part", "time_ns", "ops"])
    df["share"] = df["time_ns"] / length if length else np.nan
    return df.sort_values("time_ns", ascending=False, kind="mergesort").reset_index(drop=True)


def _resource_names(t) -> pd.Series:
    ln = t.lanes.set_index("lane")
    out = {}
    for lane, r in ln.iterrows():
        k = int(r["lane_kind"])
        if k == int(LaneKind.CPU_THREAD):
            out[lane] = "CPU thread"
        elif k == int(LaneKind.GPU_STREAM):
            out[lane] = f"GPU stream {int(r['native_id'])}"
        else:
            out[lane] = f"{r['name'] or 'stream'} stream"
    return pd.Series(out)


def explain_critical_path(run: RunAnalysis) -> tuple[list[str], pd.DataFrame, pd.DataFrame]:
    """(paragraphs, parts frame, where frame) of the critical path.

    ``parts``: ``part`` (in words), ``time_ns``, ``ops``, ``share`` (adds up to 1).
    ``where``: ``rank``, ``resource``, ``time_ns`` (op time and the waits before them),
    ``ops``, ``share``.
    """
    cp = run.cp
    length = int(cp.attrs.get("length_ns") or 0)
    parts = _path_parts(run)
    res = _resource_names(run.t)
    tmp = pd.DataFrame({"rank": cp["rank"].to_numpy(),
                        "resource": res.reindex(cp["lane"].to_numpy()).fillna("lane").to_numpy(),
                        "time_ns": (cp["dur_ns"] + cp["wait_ns"]).to_numpy()})
    where = tmp.groupby(["rank", "resource"]).agg(time_ns=("time_ns", "sum"),
                                                  ops=("time_ns", "size")).reset_index()
    where = where[where["time_ns"] > 0]
    where["share"] = where["time_ns"] / length if length else np.nan
    where = where.sort_values("time_ns", ascending=False, kind="mergesort").reset_index(drop=True)
    paras: list[str] = []
    if not len(cp):
        return ["The trace has no dependency path (no ops)."], parts, where
    lanes = cp["lane"].to_numpy()
    hops = int((lanes[1:] != lanes[:-1]).sum())
    rank_hops = int((cp["rank"].to_numpy()[1:] != cp["rank"].to_numpy()[:-1]).sum())
    ranks = sorted(set(cp["rank"].tolist()))
    src = ("the replay's record of which op held each op back" if cp.attrs.get("source") ==
           "replay" else "the longest chain of recorded dependencies (launches, "
           "synchronizations, collectives, host order) ending at the trace's last op")
    scope = cp.attrs.get("scope")
    if scope:  # a streamed report: the path of a bounded subset of the ranks, said so
        src = (f"{scope}: the longest chain of recorded dependencies (launches, "
               "synchronizations, host order) among that rank's own ops, ending at its last op")
    if len(where) == 1:
        route = (f"It stays on rank {int(where['rank'].iloc[0])}'s "
                 f"{where['resource'].iloc[0]}")
    elif len(ranks) == 1:
        route = (f"It stays on rank {ranks[0]} and crosses {len(where)} of its resources, "
                 f"moving between them {_times(hops)}")
    else:
        route = (f"It crosses {len(ranks)} ranks ({ranks_label(ranks)}) and "
                 f"{len(where)} rank/resource pairs, moving between them {_times(hops)}"
                 + (f" ({_times(rank_hops)} between ranks)" if rank_hops else ""))
    paras.append(f"The critical path is {src}: shorten anything on it and the run gets "
                 f"shorter; shorten anything else and it does not. It is {fmt_ns(length)} long "
                 f"and runs through {len(cp):,} ops. {route}. Its parts below add up to its "
                 "length.")
    paras.append(_why_length(run, length))
    return paras, parts, where


def _times(n: int) -> str:
    """``once``, ``twice``, ``3 times``."""
    return {1: "once", 2: "twice"}.get(n, f"{n:,} times")


def _outside_steps_ns(run: RunAnalysis, cp: pd.DataFrame) -> int:
    """Time of the path (each row's wait, then its op) before its rank's first step window
    or after its last: the windows tile a rank's steps, so that time is in no step."""
    from ._util import step_windows
    w = step_windows(run.t)
    w = w[w["step"] >= 0]
    if not len(w) or not len(cp):
        return 0
    lo = w.groupby("rank")["start_ns"].min()
    hi = w.groupby("rank")["end_ns"].max()
    rk = cp["rank"].to_numpy()
    a = cp["start_ns"].to_numpy(np.int64) - cp["wait_ns"].to_numpy(np.int64)
    b = cp["start_ns"].to_numpy(np.int64) + cp["dur_ns"].to_numpy(np.int64)
    first = lo.reindex(rk).to_numpy()
    last = hi.reindex(rk).to_numpy()
    ok = ~(np.isnan(first) | np.isnan(last))
    before = np.clip(np.minimum(b, np.where(ok, first, 0)) - a, 0, None)
    after = np.clip(b - np.maximum(a, np.where(ok, last, 0)), 0, None)
    return int((before + after)[ok].sum())


def _why_length(run: RunAnalysis, length: int) -> str:
    cp = run.cp
    one = bool(cp.attrs.get("scope"))  # a streamed report: one rank's own path
    first = int(cp.attrs["first_start_ns"]) if one else run.first_start_ns
    path_start = int(cp["start_ns"].iloc[0])
    span = int(cp.attrs.get("span_ns") or 0)
    st = run.step_ns
    steps = run.steps
    if steps > 1:
        # the part of the path before the first or after the last step window of its rank
        # (GPU work queued before the trace started) is no step's: left out of "per step"
        out = 0 if one else _outside_steps_ns(run, cp)
        inner = length - out
        bits = [f"The path runs through all {steps} steps of the trace (span {fmt_ns(span)}), "
                f"{fmt_ns(length)} in all"
                + (f", of which {fmt_ns(out)} lies outside every step (before the first or "
                   "after the last)" if out > 0.01 * max(length, 1) else "")
                + f": {fmt_ns(inner / steps)} per step, "
                f"{fmt_pct(inner / steps / st) if st else 'n/a'} of the mean step "
                f"({fmt_ns(st)}, the slowest rank's)."]
    else:
        bits = [f"The step takes {fmt_ns(st)} (the slowest rank's step); the path is "
                f"{fmt_ns(length)}, {fmt_pct(length / st) if st else 'n/a'} of it."]
    head = path_start - first
    if head > 0.01 * max(length, 1):
        r0 = int(cp["rank"].iloc[0])
        bits.append(f"It starts on rank {r0}, {fmt_ns(head)} after the "
                    f"{'rank' if one else 'trace'}'s first op: no "
                    "dependency links the earlier work to the end of the run (the path's first "
                    "op waited for nothing recorded), so that work ran beside the path, not "
                    "on it.")
    if steps <= 1 and st and length > 1.02 * st and one:
        bits.append("It is longer than the step: it runs over the rank's whole timeline (its "
                    "work outside the step included), and its collectives count whole (their "
                    "wait for the other ranks included).")
    elif steps <= 1 and st and length > 1.02 * st and span > 1.02 * st:
        # the trace runs past its one step (the profiler caught work outside it)
        cross = (" and crosses ranks whose steps start at different times (waits at "
                 "collectives join their timelines)") if cp["rank"].nunique() > 1 else ""
        bits.append(f"It is longer than the step: it runs over the whole trace "
                    f"({fmt_ns(span)}), the work outside the step included{cross}.")
    elif steps <= 1 and st and length > 1.02 * st:
        bits.append("It is longer than the slowest rank's step because it crosses ranks whose "
                    "steps start at different times (waits at collectives join their timelines).")
    elif steps <= 1 and st and length < 0.98 * st and head <= 0.01 * max(length, 1):
        bits.append("It is shorter than the step: the rest of the step is work that no "
                    "dependency chains to the run's last op.")
    return " ".join(bits)
