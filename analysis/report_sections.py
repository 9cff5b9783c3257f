"""The sections of a run's report. Each builder returns a Section, or None when it does
not apply to the run (no collectives, no pipeline, no memory samples, no flops): panels
that do not apply are left out, never drawn empty.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import plots
from .breakdown import PARTS
from .plots_timeline import (
    plot_pipeline_gantt,
    plot_rank_part_heatmap,
    plot_rank_time_heatmap,
    plot_step_timeline,
)
from .report_findings import cpu_only, explain_critical_path
from .report_model import Fig, Section
from .report_run import RunAnalysis
from .tables import Column, fmt_ns, fmt_pct, people_table, plural, ranks_label
from .timeline import pipeline_blocks, step_segments

__all__ = ["section_breakdown", "section_timeline", "section_critical_path", "section_kernels",
           "section_comm", "section_pipeline", "section_memory", "section_efficiency",
           "section_stragglers", "fold_summary", "MANY_RANKS"]

#: beyond this many ranks (or groups of identical ranks) pictures switch to heatmaps
MANY_RANKS = 32

_PART_COLS = [Column("compute_ns", "Compute", "time"),
              Column("overlapped_comm_ns", "Comm. overlapped", "time"),
              Column("exposed_comm_ns", "Comm. exposed", "time"),
              Column("memcpy_ns", "Copies", "time"),
              Column("host_bound_ns", "Host-bound", "time"),
              Column("idle_ns", "Idle", "time")]


def _group_label(label: str, size: int) -> str:
    return f"rank {label}" if size == 1 else f"ranks {label}"


def fold_summary(bsum: pd.DataFrame) -> pd.DataFrame:
    """Ranks whose mean step breakdown is identical, as one row each: the first rank's
    values plus ``ranks`` (label) and ``n``; in rank order."""
    if len(bsum) == 0:
        return bsum.assign(ranks=[], n=[])
    key = bsum[["step_ns", *PARTS]].round(0).astype(np.int64)
    gid = key.groupby(list(key.columns), sort=False).ngroup().to_numpy()
    df = bsum.assign(_g=gid)
    first = df.groupby("_g", sort=False).head(1).set_index("_g")
    labels = df.groupby("_g")["rank"].agg(lambda s: ranks_label(s.to_numpy()))
    first["ranks"] = labels.reindex(first.index).to_numpy()
    first["n"] = df.groupby("_g").size().reindex(first.index).to_numpy()
    return first.sort_values("rank").reset_index(drop=True)


def section_breakdown(run: RunAnalysis, *, top: int) -> Section:
    s = Section("breakdown", "Where the time goes" if run.no_markers else "Where the step goes")
    b = run.bsum
    folded = fold_summary(b)
    stands = run.stands_for
    if stands:  # a modeled run emitting one rank per class of identical ranks
        folded["ranks"] = [stands.get(int(r), (lab, 1))[0] for r, lab in
                           zip(folded["rank"], folded["ranks"])]
        folded["n"] = [stands.get(int(r), ("", int(k)))[1] for r, k in
                       zip(folded["rank"], folded["n"])]
    cpu = cpu_only(run.t)
    nm = run.no_markers
    over = ("No step markers: the whole trace as one window." if nm
            else f"Means over {plural(run.steps, 'step')}.")
    mean_step = "Whole trace" if nm else "Mean step"
    whole = "whole trace" if nm else "step"
    s.blocks.append(
        f"Each rank's {whole} splits into disjoint parts that add up to its {whole} time: compute "
        "with no communication running, communication hidden under compute, communication "
        "nothing hides (exposed), memory copies alone on the GPU, host-bound time (the GPU "
        f"idle while the CPU works), and idle time (nothing runs on the rank). {over}"
        if not cpu else
        f"Each rank's {whole} splits into disjoint parts that add up to its {whole} time (a "
        "CPU-only trace: its CPU ops stand for the device): compute with no communication running, "
        "communication hidden under compute, communication nothing hides (exposed), "
        "host-bound time (host work outside every op: Python, annotations), and idle time "
        f"(nothing runs on the rank). {over}")
    busy = Column("gpu_busy_frac", "Busy" if cpu else "GPU busy", "pct")
    n = len(folded)
    total = int(folded["n"].sum())
    if stands:
        s.blocks.append(f"The modeled run has {run.t.world_size:,} ranks; identical ranks share "
                        f"one timeline, so {len(b)} representative ranks stand for all of them "
                        "(each row names the ranks it stands for).")
    elif n < len(b):
        s.blocks.append(f"{len(b):,} ranks fall into {plural(n, 'group')} with identical breakdowns; "
                        "each group is shown once.")
    if n <= MANY_RANKS:
        labels = None if total == n else [f"{r} ({k})" if k > 1 else r for r, k in
                                          zip(folded["ranks"], folded["n"])]
        s.blocks.append(Fig("breakdown", f"{mean_step} per rank, split into its parts (ms).",
                            plots.plot_breakdown(folded, labels=labels, title="",
                                                 cpu_only=cpu, ylabel="whole trace (ms)" if nm
                                                 else "mean step time (ms)")))
    else:
        s.blocks.append(Fig("rank_part", "Rank x part: each part's share of the rank's "
                            f"{mean_step.lower()} (per-rank bars do not fit past "
                            f"{MANY_RANKS} ranks).",
                            plot_rank_part_heatmap(b)))
    rows = folded.sort_values("step_ns", ascending=False, kind="mergesort")
    cols = [Column("ranks", "Rank(s)", "text")]
    if total > n:
        cols.append(Column("n", "Ranks", "count"))
    cols += [Column("step_ns", "Whole trace" if nm else "Step", "time"), *_PART_COLS, busy]
    full = b[["rank", "steps", "step_ns", *PARTS, "gpu_busy_frac"]]
    s.blocks.append(people_table(rows, cols, caption=f"{mean_step} per rank, slowest first"
                                 if len(rows) > 1 else f"{mean_step}, split into its parts",
                                 top=top, what="rank groups" if n < len(b) else "ranks",
                                 csv_name="breakdown_per_rank", csv_frame=full, same_unit=True))
    if run.steps > 1:
        s.blocks.append(per_step_table(run, top=top, busy=busy))
    return s


def per_step_table(run: RunAnalysis, *, top: int, busy: Column | None = None):
    """One row per step: its time (the slowest rank's window) and that rank's parts; the
    headline's step time is their mean and its spread their relative standard deviation."""
    bd = run.bd
    rows = bd.loc[bd.groupby("step")["step_ns"].idxmax()].sort_values("step")
    one = run.n_ranks == 1  # one rank: no "slowest rank" to name
    cols = [Column("step", "Step", "count"),
            *([] if one else [Column("rank", "Slowest rank", "count")]),
            Column("step_ns", "Step", "time"), *_PART_COLS,
            busy or Column("gpu_busy_frac", "GPU busy", "pct")]
    return people_table(rows, cols, caption="Each step" if one else
                        "Each step (the slowest rank's window)", top=top,
                        what="steps", cut_word="First", csv_name="breakdown_per_step",
                        csv_frame=bd[["rank", "step", "start_ns", "end_ns", "step_ns", *PARTS,
                                      "gpu_busy_frac"]], same_unit=True)


def _timeline_rows(run: RunAnalysis) -> tuple[pd.DataFrame, list[str], str]:
    """(rows: rank, row_group, label; group names; note) of the step timeline."""
    f = run.folds
    groups = f.drop_duplicates("group").sort_values("group")
    stands = run.stands_for
    if stands:  # representatives of a modeled run's classes of identical ranks
        groups = groups.assign(
            label=[stands[int(r)][0] if int(r) in stands and sz == 1 else lab
                   for r, lab, sz in zip(groups["representative"], groups["label"],
                                         groups["size"])],
            size=[stands[int(r)][1] if int(r) in stands and sz == 1 else sz
                  for r, sz in zip(groups["representative"], groups["size"])])
    if len(groups) <= MANY_RANKS:
        rows = groups[["representative", "group"]].rename(
            columns={"representative": "rank", "group": "row_group"})
        names = [_group_label(lab, int(sz)) for lab, sz in zip(groups["label"], groups["size"])]
        folded = groups[groups["size"] > 1]
        note = ""
        if len(folded):
            n_all = int(groups["size"].sum())
            note = (f"Identical ranks are drawn once: {n_all:,} ranks fall into "
                    f"{plural(len(groups), 'group')} whose ops, durations and offsets in this step "
                    f"are the same ({', '.join(names[:6])}{', …' if len(names) > 6 else ''}).")
        return rows.reset_index(drop=True), names, note
    b = run.bsum.set_index("rank")["step_ns"]
    st = run.stages.set_index("rank")["stage"]
    if run.n_stages > 1:
        pick = []
        for stage in sorted(s for s in st.unique() if s >= 0):
            rs = st.index[st == stage]
            pick.append(int(b.reindex(rs).idxmax()))
        how = "the slowest rank of each pipeline stage"
    else:
        order = b.sort_values(kind="mergesort")
        pick = sorted({int(order.index[-1]), int(order.index[len(order) // 2]),
                       int(order.index[0])})
        how = "the fastest, the median and the slowest rank"
    pick = pick[:MANY_RANKS]
    rows = pd.DataFrame({"rank": pick, "row_group": np.arange(len(pick))})
    names = [f"rank {r}" for r in pick]
    note = (f"{len(groups):,} distinct rank timelines do not fit: shown are {how}; every rank "
            "is in the rank x time heatmap below.")
    return rows, names, note


def _outside_window(t, w, ranks: np.ndarray) -> str:
    """A sentence on the step's ops of the drawn ``ranks`` that ran wholly outside the drawn
    window (a host that runs ahead of its GPU issues a step's host work early), or ''."""
    if w.step < 0:
        return ""
    o = t.ops
    m = (o["step"].to_numpy() == w.step) & np.isin(o["rank"].to_numpy(), ranks)
    s = o["start_ns"].to_numpy()[m]
    e = s + o["dur_ns"].to_numpy()[m]
    before, after = e <= w.start_ns, s >= w.end_ns
    if not (before.any() or after.any()):
        return ""
    where = []
    if before.any():
        where.append(f"{int(before.sum()):,} before it (from {fmt_ns(w.start_ns - s.min())} "
                     "earlier)")
    if after.any():
        where.append(f"{int(after.sum()):,} after it (until {fmt_ns(e.max() - w.end_ns)} later)")
    return (f" {int(before.sum() + after.sum()):,} of the drawn ranks' {int(m.sum()):,} ops "
            "of the step ran "
            f"outside this window and are not drawn: {' and '.join(where)}; the window is "
            "where the step's GPU work runs, and a host that runs ahead of its GPU issues a "
            "step's host work earlier.")


def section_timeline(run: RunAnalysis) -> Section:
    w = run.window
    s = Section("timeline", "One step on the timeline" if w.step >= 0 else
                "The whole trace on the timeline")  # no step markers: no step to draw
    what = w.why[0].upper() + w.why[1:] if w.step < 0 else f"The whole of {w.why}"
    span = ("from the first op on any rank to the last" if w.step < 0 else
            "from the earliest rank's step start to the latest rank's step end")
    s.blocks.append(f"{what}: {fmt_ns(w.dur_ns)} {span}; time runs from that start. Rows are the CPU, GPU "
                    "compute and communication activity of each rank; nearby boxes closer than "
                    "a pixel are merged. Ops on the critical path are outlined.")
    rows, names, note = _timeline_rows(run)
    s.blocks[-1] += _outside_window(run.t, w, rows["rank"].to_numpy())
    if note:
        s.blocks.append(note)
    px = w.dur_ns / 1200.0
    seg = step_segments(run.t, w, rows, critical_op_ids=run.cp["op_id"].to_numpy(), px_ns=px)
    groups = f"{len(rows)} row group" + ("s" if len(rows) != 1 else "")
    s.blocks.append(Fig("timeline", f"Timeline of {w.why}; {groups}.",
                        plot_step_timeline(seg, names, span_ns=w.dur_ns,
                                           origin="trace start" if w.step < 0 else
                                           "step start")))
    if run.n_stages > 1 and run.has_microbatches:
        st = run.stages.set_index("rank")["stage"]
        reps = []
        for stage in sorted(x for x in st.unique() if x >= 0):
            cand = [r for r in rows["rank"] if st.get(r, -1) == stage]
            reps.append((int(stage), cand[0] if cand else int(st.index[st == stage][0])))
        sr = pd.DataFrame(reps, columns=["stage", "rank"])
        blocks = pipeline_blocks(run.t, w, sr)
        if len(blocks):
            s.blocks.append(Fig("pipeline", "Pipeline schedule: each stage's compute, one block "
                                "per micro-batch and pass (forward, backward with any "
                                "recomputation), numbered by micro-batch where it fits.",
                                plot_pipeline_gantt(blocks, {int(a): f"stage {a} (rank {b})"
                                                             for a, b in reps},
                                                    span_ns=w.dur_ns)))
    if run.n_ranks > MANY_RANKS:
        first, per_row, edges, parts = run.activity
        pooled = (f" Rows of {int(per_row.max())} consecutive ranks show what they mostly do "
                  "together." if per_row.max() > 1 else "")
        s.blocks.append(Fig("rank_time", "Rank x time: what each rank mostly does in each "
                            f"{fmt_ns(w.dur_ns / max(len(edges) - 1, 1))} slice of the step "
                            f"(white: outside the rank's step).{pooled}",
                            plot_rank_time_heatmap(first, per_row, edges, parts)))
    return s


def section_critical_path(run: RunAnalysis, *, top: int) -> Section:
    s = Section("critical_path", "Critical path")
    paras, parts, where = explain_critical_path(run)
    s.blocks += paras
    length = int(run.cp.attrs.get("length_ns") or 0)
    tot = pd.DataFrame({"part": ["whole critical path"], "time_ns": [length],
                        "ops": [int(len(run.cp))], "share": [1.0 if length else np.nan]})
    s.blocks.append(people_table(pd.concat([parts, tot], ignore_index=True),
                                 [Column("part", "Part of the path", "text"),
                                  Column("time_ns", "Time", "time"),
                                  Column("share", "Share of the path", "pct"),
                                  Column("ops", "Ops", "count")],
                                 caption="What the path is made of (adds up to its length)",
                                 same_unit=True))
    s.blocks.append(people_table(where, [Column("rank", "Rank", "count"),
                                         Column("resource", "Resource", "text"),
                                         Column("time_ns", "Time on the path", "time"),
                                         Column("share", "Share", "pct"),
                                         Column("ops", "Ops", "count")],
                                 caption="Ranks and resources the path crosses", top=top,
                                 what="rank/resource pairs", csv_name="critical_path_where"))
    cp = run.cp
    if len(cp):
        top_ops = cp.sort_values("dur_ns", ascending=False, kind="mergesort").head(10)
        s.blocks.append(people_table(top_ops, [Column("name", "Op", "name"),
                                               Column("kind", "Kind", lambda v: str(v).lower()),
                                               Column("rank", "Rank", "count"),
                                               Column("dur_ns", "Time on the path", "time"),
                                               Column("wait_ns", "Wait before it", "time")],
                                     caption="Longest ops on the path"))
    return s


def section_kernels(run: RunAnalysis, *, top: int) -> Section | None:
    ks = run.ks
    if len(ks) == 0:
        return None
    # a CPU-only trace has no kernels: what stands for the device are its timed
    # communication ops (gloo collectives on the CPU)
    cpu = cpu_only(run.t)
    dev, what = ("device", "ops") if cpu else ("GPU", "kernels")
    s = Section("kernels", "Timed ops" if cpu else "Kernels")
    s.blocks.append(("Timed ops of this CPU-only trace (no GPU: its collectives stand for the "
                     "device)" if cpu else "GPU ops") + " grouped by name, by total time over "
                    "all ranks. Names are shortened (namespaces and parameter lists dropped, "
                    "template arguments folded); the full ones are in the tables' CSV files "
                    "(and, in the HTML page, on hover).")
    s.blocks.append(people_table(ks, [Column("name", "Op" if cpu else "Kernel", "name"),
                                      Column("kernel_class", "Class", "text"),
                                      Column("count", "Calls", "count"),
                                      Column("total_ns", "Total", "time"),
                                      Column("mean_ns", "Mean", "time"),
                                      Column("share", f"Share of {dev} time", "pct")],
                                 caption=f"Top {what}", top=top, what=what,
                                 csv_name="kernels"))
    cls = run.cls[run.cls["count"] > 0].sort_values("total_ns", ascending=False, kind="mergesort")
    s.blocks.append(people_table(cls, [Column("kernel_class", "Class", "text"),
                                       Column("count", "Calls", "count"),
                                       Column("total_ns", "Total", "time"),
                                       Column("share", f"Share of {dev} time", "pct")],
                                 caption=f"{dev.capitalize() if cpu else dev} time by "
                                         f"{'op' if cpu else 'kernel'} class"))
    return s


def section_comm(run: RunAnalysis, *, top: int) -> Section | None:
    co = run.co
    if len(co) == 0:
        return None
    from .comm import comm_summary

    s = Section("communication", "Communication")
    s.blocks.append("Bandwidths follow nccl-tests: algorithm bandwidth = bytes / transfer time "
                    "of the last rank to arrive; bus bandwidth scales it by the primitive's "
                    "traffic factor. Skew is the spread of arrival times; waiting is the time "
                    "members spent for the last one.")
    cs = comm_summary(co)
    g = run.t.groups
    names = {int(a): f"{b or a}" for a, b in zip(g["group_id"], g["name"])} if len(g) else {}
    cs = cs.assign(group=[names.get(int(x), str(x)) for x in cs["group_id"]],
                   comm_op=cs["comm_op"].str.lower().str.replace("_", "-"))
    cs = cs.sort_values("transfer_ns", ascending=False, kind="mergesort")
    full = cs
    # groups with identical figures (e.g. the 16 tensor-parallel groups of a modeled run)
    # are one row
    same = ["comm_op", "n_ranks", "instances", "total_bytes", "transfer_ns", "wait_ns"]
    gid = cs[same].round(0).fillna(-1).astype(str).agg("|".join, axis=1)
    first = cs.groupby(gid, sort=False).head(1).copy()
    names_of = cs.groupby(gid, sort=False)["group"].agg(list)
    first["group"] = [(lambda g: g[0] if len(g) == 1 else
                       f"{g[0]}, … ({len(g)} groups)")(names_of[k]) for k in gid[first.index]]
    cs = first
    s.blocks.append(people_table(cs, [Column("group", "Process group", "text"),
                                      Column("comm_op", "Primitive", "text"),
                                      Column("n_ranks", "Ranks", "count"),
                                      Column("instances", "Instances", "count"),
                                      Column("total_bytes", "Data", "bytes"),
                                      Column("transfer_ns", "Transfer", "time"),
                                      Column("wait_ns", "Waiting", "time"),
                                      Column("busbw_gbps", "Bus bandwidth", "gbps")],
                                 caption="Per process group and primitive", top=top,
                                 what="group/primitive rows", csv_name="communication",
                                 csv_frame=full))
    cw = run.cw
    if len(cw):
        steps = max(run.steps, 1)
        cw = cw.assign(per_step_ns=cw["wait_ns"] / steps)
        s.blocks.append(people_table(cw, [Column("rank", "Rank", "count"),
                                          Column("late_rank", "Waits for rank", "count"),
                                          Column("comm_op", "In", "text"),
                                          Column("instances", "Times", "count"),
                                          Column("per_step_ns", "Waiting, whole trace"
                                                 if run.no_markers else "Waiting per step",
                                                 "time")],
                                     caption="Who waits for whom at collectives", top=top,
                                     what="pairs", csv_name="collective_waits"))
    sized = co[(co["bytes"] > 0) & co["busbw_gbps"].notna()]
    if len(sized) >= 20:
        s.blocks.append(Fig("collectives", "Collective size against bus bandwidth, one point per "
                            "instance.", plots.plot_collectives(co, title="")))
    return s


def section_pipeline(run: RunAnalysis) -> Section | None:
    if run.n_stages <= 1:
        return None
    from .pipeline import stage_bubbles

    sb = stage_bubbles(run.bub)
    sb = sb[sb["stage"] >= 0]
    s = Section("pipeline", "Pipeline")
    s.blocks.append("A stage's bubble is the part of its step with no compute (waiting for "
                    "neighbours, exposed communication, idle). The ideal is the GPipe/1F1B "
                    "bubble (p-1)/(m+p-1) for p stages and m micro-batches.")
    s.blocks.append(people_table(sb, [Column("stage", "Stage", "count"),
                                      Column("ranks", "Ranks", "count"),
                                      Column("step_ns", "Step", "time"),
                                      Column("bubble_ns", "No compute", "time"),
                                      Column("bubble_frac", "Bubble", "pct"),
                                      Column("ideal_bubble_frac", "Ideal bubble", "pct")],
                                 caption="Bubble per stage"))
    return s


def section_memory(run: RunAnalysis, *, top: int) -> Section | None:
    pm = run.pm
    if len(pm) == 0:
        return None
    s = Section("memory", "Memory")
    src = set(pm["source"])
    s.blocks.append({"trace": "Peaks of the allocator's samples in the trace.",
                     "delta": "Running sums of the allocator's deltas (relative to the first "
                              "sample: lower bounds).",
                     "model": "Modeled per stage (weights, gradients, optimizer state, "
                              "activations, buffers)."}.get(next(iter(src)), ""))
    if run.n_stages > 1:
        g = pm.groupby("stage").agg(ranks=("rank", "size"), peak=("peak_allocated_bytes", "max"),
                                    reserved=("peak_reserved_bytes", "max")).reset_index()
        s.blocks.append(people_table(g, [Column("stage", "Stage", "count"),
                                         Column("ranks", "Ranks", "count"),
                                         Column("peak", "Peak allocated", "bytes"),
                                         Column("reserved", "Peak reserved", "bytes")],
                                     caption="Peak memory per stage"))
    else:
        pm2 = pm.sort_values("peak_allocated_bytes", ascending=False, kind="mergesort")
        s.blocks.append(people_table(pm2, [Column("rank", "Rank", "count"),
                                           Column("peak_allocated_bytes", "Peak allocated",
                                                  "bytes"),
                                           Column("peak_reserved_bytes", "Peak reserved",
                                                  "bytes")],
                                     caption="Peak memory per rank", top=top, what="ranks",
                                     csv_name="memory"))
    if len(run.mt) >= 10:
        s.blocks.append(Fig("memory", "Allocated device memory over time.",
                            plots.plot_memory(run.mt, pm, title="")))
    return s


def section_efficiency(run: RunAnalysis) -> Section | None:
    e = run.eff
    if not (e["mfu"].notna().any() or e["hfu"].notna().any()):
        return None
    s = Section("efficiency", "FLOPs utilization")
    s.blocks.append("MFU counts the flops the model needs per step; HFU counts what the "
                    "hardware ran, recomputed work included, in the same units, so HFU is "
                    "never below MFU. Both are divided by step time x peak FLOP/s.")
    key = "stage" if run.n_stages > 1 else "rank"
    if key == "stage":
        st = run.stages.set_index("rank")["stage"]
        e = e.assign(stage=st.reindex(e["rank"].to_numpy()).to_numpy())
    g = e.groupby(key).agg(ranks=("rank", "nunique"), mfu=("mfu", "mean"), hfu=("hfu", "mean"),
                           step_ns=("step_ns", "mean")).reset_index()
    s.blocks.append(people_table(g, [Column(key, key.capitalize(), "count"),
                                     *([Column("ranks", "Ranks", "count")] if key == "stage"
                                       else []),
                                     Column("step_ns", "Step", "time"),
                                     Column("mfu", "MFU", "pct"), Column("hfu", "HFU", "pct")],
                                 caption=f"Utilization per {key}", top=16,
                                 what=f"{key}s", csv_name="efficiency"))
    return s


_MAX_STRAGGLER_OPS = 200_000  # the attribution replays the trace once per group


def section_stragglers(run: RunAnalysis, *, top: int) -> Section | None:
    """What-if attribution of slowness (measured traces up to 200k ops)."""
    from retime.collectors.errors import RetimeError
    from retime.collectors.trace import Trace

    if run.streamed is not None:  # it replays the whole trace: not in a streamed report
        return None
    if not isinstance(run.x, Trace) or run.t.n_ops > _MAX_STRAGGLER_OPS or "replay" in run.t.meta:
        return None
    if run.n_ranks < 2:  # an op's ideal is its median over ranks: one rank is its own ideal
        return None
    try:
        from .stragglers import stragglers
        df = stragglers(run.t)
    except (ImportError, RetimeError):
        return None
    if not len(df):
        return None
    s = Section("stragglers", "Stragglers (what-if)")
    s.blocks.append("Every step replayed with each op at its ideal duration, then with one group "
                    "at a time (a pipeline stage, a data-parallel rank, an op type) back at its "
                    "measured durations: the cost is how much slower than ideal that group "
                    "alone makes the step.")
    words = {"overall": "all ops measured", "stage": "pipeline stage", "dp_rank":
             "data-parallel rank", "optype": "op type"}
    d = df.assign(group=df["group"].map(words).fillna(df["group"]))
    d = d.sort_values("cost_pct", ascending=False, kind="mergesort")
    s.blocks.append(people_table(d, [Column("group", "Group", "text"),
                                     Column("key", "Which", "text"),
                                     Column("cost_pct", "Cost over ideal",
                                            _signed_pct)],
                                 caption="Slowdown by group", top=top, what="groups",
                                 csv_name="stragglers"))
    run.stragglers = df  # the findings use it
    return s


def _signed_pct(v: float) -> str:
    """A signed percentage; a cost that rounds to zero is +0.0%, never -0.0%."""
    return f"{round(float(v), 1) + 0.0:+.1f}%"


def pct_of(a: float, b: float) -> str:
    return fmt_pct(a / b) if b else "n/a"
