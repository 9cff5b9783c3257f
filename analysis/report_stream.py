"""The report of a rank-partitioned store, streamed: a batch of ranks at a time, never the
whole store in memory (issue 30).

:class:`StreamRunAnalysis` is a :class:`~analysis.report_run.RunAnalysis` whose frames
come from passes over the store's rank partitions (:func:`collectors.store.rank_batches`);
:func:`build_stream_report` lays them out with the same code as the in-memory report
(:func:`analysis.report.assemble_report`), so the sections, tables and figures are the same.

What is per rank is computed per batch and combined; the figures equal the in-memory ones:

* pass 1 (every rank, 11 of the ops columns and the ranges): step windows, the breakdown,
  kernel and kernel-class sums, op flops (efficiency), pipeline bubbles and stages, the
  counts of unseen GPU work and each (rank, step)'s fold signature;
* the communication ops alone (a filter pushed down to the scan: memory in the number of
  collective/p2p ops): collective statistics and who waits for whom;
* the memory samples: peaks per rank and device in pass 1, and the samples of the (at most
  10) ranks the memory figure draws, read again (its time axis starts at their first
  sample, not at the first sample of every rank);
* pass 2, only past :data:`~analysis.report_sections.MANY_RANKS` ranks: the rank x time
  heatmap of the step drawn (per-rank rows, pooled as the in-memory function pools them).

What needs ops of several ranks at once runs on a bounded subset, stated on the page:

* the critical path is the slowest rank's own (its ops and edges; a collective counts
  whole, its wait for the other ranks included), not the cross-rank path;
* the step timeline and pipeline Gantt read the drawn step's ops of the drawn ranks only.

Left out, said so on the page: the stragglers what-if and the drill-downs (host overhead
with the CUDA-graph what-if, attribution tree, roofline), which replay or walk every op.

Memory: one batch of ranks (about ``batch_rows`` ops of 11 columns, its ranges and memory
samples), the communication ops, the memory samples of at most 10 ranks, the drawn step of at most :data:`MANY_RANKS` (+ one per pipeline stage)
ranks and the slowest rank's ops and edges.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from retime.collectors.enums import LaneKind
from retime.collectors.errors import RetimeError
from retime.collectors.store import (
    part_file,
    rank_batches,
    rank_rows,
    read_small_tables,
    scan_table,
    store_layout,
)
from retime.collectors.trace import (
    EDGES_SCHEMA,
    MEMORY_SCHEMA,
    OPS_SCHEMA,
    RANGES_SCHEMA,
    SCHEMA_VERSION,
    Trace,
    _frame,
)

from ._util import _SCOPES, _lane_kind_of_ops, memo_scope, step_windows
from .breakdown import breakdown
from .coverage import combine_unseen, unseen_work
from .critical_path import critical_path
from .efficiency import finish_efficiency, job_efficiency, op_flops
from .memory import device_peaks, memory_timeline, peak_memory, rank_peaks
from .pipeline import bubbles, rank_stages
from .report_model import Report, Section
from .report_run import RunAnalysis
from .report_sections import MANY_RANKS, _timeline_rows
from .stream import _collectives, _comm_trace, _kernel_final, _kernel_partial
from .tables import Column, people_table
from .timeline import (
    activity_cover,
    activity_edges,
    activity_parts,
    activity_rows,
    fold_groups,
    step_signatures,
    typical_step_of,
)

__all__ = ["StreamRunAnalysis", "build_stream_report", "should_stream_report",
           "STREAM_REPORT_ABOVE_OPS", "REPORT_BATCH_ROWS"]

#: ``retime report`` streams a rank-partitioned store of more ops than this (in memory the
#: report holds about 250 bytes per op: 2 M ops ~ 0.5 GB)
STREAM_REPORT_ABOVE_OPS = 2_000_000

#: ops per batch of ranks: half of `retime analyze`'s (the report holds more per batch: 0.75
#: instead of 1.07 GB peak at 32 ranks of v100-ddp-sgd, no slower)
REPORT_BATCH_ROWS = 1 << 20
#: ops columns of pass 1 (breakdown, kernels, flops, stages, micro-batches, signatures)
_PASS1_COLS = ["rank", "lane", "kind", "name_id", "step", "start_ns", "dur_ns", "correlation",
               "flops", "stage", "microbatch", "coll_id"]
#: ops columns of the drawn step (step timeline, pipeline Gantt)
_DRAWN_COLS = ["op_id", "rank", "lane", "kind", "name_id", "start_ns", "dur_ns", "step",
               "microbatch", "phase", "chunk"]
#: ops columns of the heatmap pass
_ACTIVITY_COLS = ["rank", "lane", "kind", "start_ns", "dur_ns", "step"]


def should_stream_report(path: str | os.PathLike[str], *,
                         above_ops: int = STREAM_REPORT_ABOVE_OPS) -> bool:
    """Auto choice of ``retime report``: stream a rank-partitioned store of more than
    ``above_ops`` ops (counted from the partition metadata, nothing loaded)."""
    p = Path(path)
    if store_layout(p) != "rank":
        return False
    return sum(rank_rows(p).values()) > above_ops


def _class_partial(t: Trace) -> pd.DataFrame:
    """Per kernel class id of one batch's device ops: count and total."""
    from .kernels import _class_ids, _device_ops

    m = _device_ops(t)
    df = pd.DataFrame({"c": _class_ids(t)[m], "dur_ns": t.ops["dur_ns"].to_numpy()[m]})
    return df.groupby("c").agg(count=("dur_ns", "size"), total_ns=("dur_ns", "sum"))


def _class_final(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """:func:`analysis.kernels.class_stats`' frame from the batches' partials."""
    from .kernels import class_table

    parts = [p for p in parts if len(p)]
    return class_table(pd.concat(parts).groupby(level=0).sum() if parts else
                       pd.DataFrame({"count": np.zeros(0, np.int64),
                                     "total_ns": np.zeros(0, np.int64)}))


class StreamRunAnalysis(RunAnalysis):
    """The analyses of a rank-partitioned store a report needs, streamed (module
    docstring). ``t`` holds the store's small tables and meta and only the drawn step's ops
    of the drawn ranks; the figures of the whole run are set by the passes.

    Build it outside a :func:`analysis._util.memo_scope`: a scope keeps every trace it saw,
    and the batches must be freed as the passes go.
    """

    def __init__(self, path: str | os.PathLike[str], *,
                 batch_rows: int = REPORT_BATCH_ROWS) -> None:
        p = Path(path)
        if store_layout(p) != "rank":
            raise RetimeError(f"{p}: a streamed report needs a rank-partitioned store "
                              "(`retime ingest --layout rank`); report it in memory "
                              "(--in-memory) or re-ingest it with --layout rank")
        if _SCOPES:
            raise RetimeError("StreamRunAnalysis inside a memo_scope would keep every batch; "
                              "build it before entering the scope")
        self.path = p
        small = read_small_tables(p)
        meta = dict(small["meta"])
        meta.pop("layout", None)
        meta.pop("partitions", None)
        meta["schema_version"] = SCHEMA_VERSION
        self._lanes, self._strings, self._groups, self._meta = (
            small["lanes"], small["strings"], small["groups"], meta)
        rows = rank_rows(p)
        self._n_ops = int(sum(rows.values()))
        if self._n_ops == 0:
            raise RetimeError(f"{p}: the trace has no ops; nothing to report (check "
                              "`retime info`)")
        batches = rank_batches(p, batch_rows=batch_rows)
        super().__init__(None, self._trace(None))
        self._pass_ranks(batches)
        self._pass_comm(batch_rows)
        self._pass_memory()
        self.activity = (self._pass_activity(batches) if self.n_ranks > MANY_RANKS else None)
        self.t = self._drawn_trace()
        self.x = self.t
        self.cp = self._rank_critical_path(self.slowest_rank)
        self.streamed = self._notes(len(batches), batch_rows)

    # ------------------------------------------------------------------ traces
    def _trace(self, ops: pd.DataFrame | None, ranges: pd.DataFrame | None = None,
               edges: pd.DataFrame | None = None, memory: pd.DataFrame | None = None,
               meta: dict[str, Any] | None = None) -> Trace:
        """A Trace of some of the store's ops, only the columns read (not validated: op
        ids are the store's; never saved)."""
        return Trace(
            ops=(ops.reset_index(drop=True) if ops is not None else
                 _frame(OPS_SCHEMA, None, "ops", n=0)),
            lanes=self._lanes, edges=_frame(EDGES_SCHEMA, edges, "edges"),
            ranges=_frame(RANGES_SCHEMA, ranges, "ranges"), groups=self._groups,
            memory=_frame(MEMORY_SCHEMA, memory, "memory"), strings=self._strings,
            meta=self._meta if meta is None else meta)

    @property
    def n_ops(self) -> int:
        return self._n_ops

    # ------------------------------------------------------------------ passes
    def _pass_ranks(self, batches: list[np.ndarray]) -> None:
        """Pass 1: everything per rank, one batch of ranks at a time.

        A replayed trace carries its step windows (``meta["step_windows"]``, valid for ops
        at exactly the recorded times: a checksum of every op's times,
        :func:`collectors.steps.times_checksum`). Each batch gets its ranks' recorded
        windows with the batch's own checksum, and the store's checksum is summed over the
        batches (the sums wrap as int64, so batches add up); should it not match, the pass
        runs again without them, as the in-memory analysis does."""
        rec = self._meta.get("step_windows")
        if isinstance(rec, dict) and rec.get("ops") == self._n_ops:
            if self._pass_ranks_once(batches, rec):
                return
        self._pass_ranks_once(batches, None)

    def _pass_ranks_once(self, batches: list[np.ndarray], rec: dict[str, Any] | None) -> bool:
        """Pass 1 (with the recorded windows ``rec``); False when they do not apply."""
        from retime.collectors.steps import times_checksum

        sw, bd, kp, cp_, fl, bub, st, un, sig, mem, dev = ([] for _ in range(11))
        first = None
        mb = False
        self._all_delta = True  # every memory sample relative (no absolute value)
        sums = [0, 0]
        cols = _PASS1_COLS + (["op_id"] if rec is not None else [])
        recw = pd.DataFrame({k: np.asarray(rec[k], np.int64) for k in
                             ("rank", "step", "start_ns", "end_ns")}) if rec is not None else None
        from .stream import p2p_later
        later = p2p_later(self.path)
        for batch in batches:
            ops = scan_table(self.path, "ops", ranks=batch, columns=cols)
            meta = None
            if recw is not None:
                ms = ops["start_ns"].to_numpy().astype(np.int64)
                me = ms + ops["dur_ns"].to_numpy().astype(np.int64)
                w = ops["op_id"].to_numpy().astype(np.int64) + 1  # positions in the store
                with np.errstate(over="ignore"):
                    sums[0] += int((ms * w).sum())
                    sums[1] += int((me * (w + 7)).sum())
                mine = recw[np.isin(recw["rank"].to_numpy(), batch)]
                meta = dict(self._meta, step_windows={
                    "ops": len(ops), "times": times_checksum(ms, me),
                    **{k: mine[k].tolist() for k in ("rank", "step", "start_ns", "end_ns")}})
                ops = ops.drop(columns="op_id")
            t = self._trace(ops, scan_table(self.path, "ranges", ranks=batch),
                            memory=scan_table(self.path, "memory", ranks=batch), meta=meta)
            if len(t.memory):
                mem.append(device_peaks(memory_timeline(t)))
                self._all_delta &= bool((t.memory["allocated_bytes"].to_numpy() < 0).all())
            with memo_scope():  # a scope of its own: freed with the batch
                sw.append(step_windows(t))
                bd.append(breakdown(t, p2p_later=later))
                kp.append(_kernel_partial(t))
                cp_.append(_class_partial(t))
                fl.append(op_flops(t))
                bub.append(bubbles(t))
                st.append(rank_stages(t))
                un.append(unseen_work(t))
                sig.append(step_signatures(t))
                lk = _lane_kind_of_ops(t)
                dev.append(np.unique(t.ops["rank"].to_numpy()[
                    (lk == int(LaneKind.GPU_STREAM)) | (lk == int(LaneKind.OP_STREAM))]))
            if len(t.ops):
                s0 = int(t.ops["start_ns"].min())
                first = s0 if first is None else min(first, s0)
                mb = mb or bool((t.ops["microbatch"].to_numpy() >= 0).any())
            del t
        if rec is not None:
            a, b = ((x + 2**63) % 2**64 - 2**63 for x in sums)  # int64 wrap-around
            if ((a ^ b) & 0x7FFFFFFFFFFFFFFF) != rec.get("times"):
                return False

        def cat(xs: list[pd.DataFrame]) -> pd.DataFrame:
            return pd.concat(xs, ignore_index=True)

        w = cat(sw)
        self.windows = w
        self.bd = cat(bd)
        self.ks = _kernel_final(kp, self._strings, None)
        self.cls = _class_final(cp_)
        self.eff = finish_efficiency(cat(fl), self.t)
        self.je = job_efficiency(self.eff)
        self.stages = cat(st)
        b = cat(bub)
        # the ideal bubble counts the stages of the whole job, not of one batch
        sv = self.stages["stage"].to_numpy()
        n_st = len(np.unique(sv[sv >= 0]))
        mbs = b["microbatches"].to_numpy().astype(float)
        b["ideal_bubble_frac"] = np.where((n_st > 0) & (mbs > 0),
                                          (n_st - 1) / (mbs + n_st - 1), np.nan)
        self.bub = b
        self.unseen = combine_unseen(un)
        self.window = typical_step_of(w)
        self._mem_peaks = cat(mem) if mem else None
        self._sig = cat(sig)
        # the ranks with ops on a device lane (the others compute on their CPU threads)
        self._dev_ranks = (np.unique(np.concatenate(dev)).astype(np.int64) if dev else
                           np.zeros(0, np.int64))
        self.folds = fold_groups(self._sig, self.window.step, self.t.ranks)
        self.first_start_ns = int(first or 0)
        self.has_microbatches = mb
        return True

    def _pass_comm(self, batch_rows: int) -> None:
        """The communication ops of every rank (only those: a pushed-down filter)."""
        from .report_findings import collective_waits

        ct, oid = _comm_trace(self.path, batch_rows)
        self.co = _collectives(ct, oid)
        self.cw = collective_waits(ct)

    def _pass_memory(self) -> None:
        """Peaks per rank from pass 1's per-device peaks; the samples of the ranks the
        memory figure draws (:func:`analysis.plots.plot_memory`: every rank up to 10, else
        the highest of each pipeline stage or the four highest) read again, those only."""
        per = self._mem_peaks
        if per is None or not len(per):  # no samples: modeled or recorded peaks (meta)
            self.pm = peak_memory(self._trace(None), stages=self.stages)
            self.mt = memory_timeline(self._trace(None))
            return
        pm = rank_peaks(per, "delta" if self._all_delta else "trace")
        st = self.stages.set_index("rank")["stage"]
        pm.insert(1, "stage", st.reindex(pm["rank"].to_numpy(), fill_value=-1).to_numpy())
        self.pm = pm
        peak = per.groupby("rank")["peak_allocated_bytes"].max()
        ranks = list(peak.index)
        if len(ranks) > 10:
            if (pm["stage"] >= 0).any():
                sr = pm.set_index("rank")["stage"].reindex(peak.index)
                top = peak.groupby(sr.to_numpy()).idxmax()
                ranks = [int(top[s]) for s in sorted(top.index)][:10]
            else:
                ranks = list(peak.sort_values(ascending=False).index[:4])
        self.mt = memory_timeline(self._trace(
            None, memory=scan_table(self.path, "memory", ranks=[int(r) for r in ranks])))

    def _pass_activity(self, batches: list[np.ndarray], max_rows: int = 512):
        """Pass 2: the rank x time heatmap of the drawn step (:func:`rank_activity`): the
        covered time of each batch's ranks summed into the job's rows, then split into
        parts, as the in-memory function does."""
        sig = self._sig
        ranks = np.unique(sig.loc[sig["step"] == self.window.step, "rank"].to_numpy()
                          ).astype(np.int64)
        first, counts, row_of = activity_rows(ranks, max_rows)
        total = np.zeros((len(first), 240, 5))
        step = int(self.window.step)
        for batch in batches:
            if not np.isin(batch, ranks).any():
                continue
            ops = self._step_scan(batch, step) if step >= 0 else None
            if ops is None:
                ops = scan_table(self.path, "ops", ranks=batch, columns=_ACTIVITY_COLS)
            t = self._trace(ops)
            w = self.windows[np.isin(self.windows["rank"].to_numpy(), batch)]
            with memo_scope():
                total += activity_cover(t, self.window, ranks, row_of, w)
            del t
        return first, counts, activity_edges(self.window), activity_parts(total)

    def _step_scan(self, batch: np.ndarray, step: int) -> pd.DataFrame | None:
        """The ops of ``step`` alone of the ranks of ``batch`` (a filter pushed down to the
        scan), or None where that would change what the heatmap draws: a rank with device
        ops elsewhere but none in the step would be taken for a CPU-only rank (whose host
        ops are its device's, :func:`analysis._util.device_mask`), so it is read whole."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        files = [str(f) for f in (part_file(self.path, "ops", int(r)) for r in batch)
                 if f.is_file()]
        if not files:
            return None
        try:
            tbl = ds.dataset(files, format="parquet").to_table(
                columns=_ACTIVITY_COLS, filter=pc.field("step") == step)
        except (OSError, pa.ArrowException) as exc:
            raise RetimeError(f"{self.path}: unreadable Parquet in the ops of ranks "
                              f"{self._label(list(batch))} ({exc}); re-ingest the "
                              "trace") from exc
        ops = tbl.to_pandas()
        ops = ops.astype({c: OPS_SCHEMA[c][0] for c in ops.columns})
        lk = self._lane_kind_lut()[ops["lane"].to_numpy()]
        rk = ops["rank"].to_numpy()
        with_dev = np.unique(rk[(lk == int(LaneKind.GPU_STREAM)) | (lk == int(LaneKind.OP_STREAM))])
        want = np.intersect1d(np.unique(rk), self._dev_ranks)
        return ops if np.isin(want, with_dev).all() else None

    def _lane_kind_lut(self) -> np.ndarray:
        lid = self._lanes["lane"].to_numpy().astype(np.int64)
        lut = np.full(int(lid.max()) + 1 if len(lid) else 1, -1, np.int8)
        lut[lid] = self._lanes["lane_kind"].to_numpy().astype(np.int8)
        return lut

    def _drawn_ranks(self) -> list[int]:
        """The ranks the step timeline and the pipeline Gantt draw (section_timeline)."""
        rows, _, _ = _timeline_rows(self)
        ranks = [int(r) for r in rows["rank"]]
        if self.n_stages > 1:
            st = self.stages.set_index("rank")["stage"]
            for stage in sorted(x for x in st.unique() if x >= 0):
                if not any(st.get(r, -1) == stage for r in ranks):
                    ranks.append(int(st.index[st == stage][0]))
        return sorted(set(ranks))

    def _drawn_trace(self) -> Trace:
        """The drawn step's ops of the drawn ranks (the columns the pictures read), a rank
        at a time with the step filtered in the scan: memory in the drawn ops only."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        flt = [("step", "==", int(self.window.step))] if self.window.step >= 0 else None
        pieces = []
        for r in self._drawn_ranks():
            f = part_file(self.path, "ops", r)
            if not f.is_file():
                continue
            try:
                pieces.append(pq.read_table(f, columns=_DRAWN_COLS, filters=flt))
            except (OSError, pa.ArrowException) as exc:
                raise RetimeError(f"{f}: unreadable Parquet ({exc}); re-ingest the "
                                  "trace") from exc
        if not pieces:
            return self._trace(None)
        ops = pa.concat_tables(pieces).to_pandas()
        return self._trace(ops.astype({c: OPS_SCHEMA[c][0] for c in ops.columns}))

    def _rank_critical_path(self, rank: int) -> pd.DataFrame:
        """The critical path of ``rank``'s own ops and edges (op ids the store's)."""
        ops = scan_table(self.path, "ops", ranks=[rank])
        ops = ops.sort_values("op_id", kind="mergesort").reset_index(drop=True)
        oid = ops["op_id"].to_numpy().astype(np.int64)
        e = scan_table(self.path, "edges", ranks=[rank]) if self._has_edges(rank) else None
        if e is not None and len(e):
            src = e["src"].to_numpy().astype(np.int64)
            dst = e["dst"].to_numpy().astype(np.int64)
            pos_s = np.minimum(np.searchsorted(oid, src), max(len(oid) - 1, 0))
            pos_d = np.minimum(np.searchsorted(oid, dst), max(len(oid) - 1, 0))
            ok = (oid[pos_s] == src) & (oid[pos_d] == dst)  # edges to other ranks dropped
            e = e[ok].assign(src=pos_s[ok], dst=pos_d[ok])
        ops["op_id"] = np.arange(len(ops), dtype=np.int64)
        t = self._trace(ops, scan_table(self.path, "ranges", ranks=[rank]), edges=e)
        cp = critical_path(t)
        cp["op_id"] = oid[cp["op_id"].to_numpy()] if len(cp) else cp["op_id"]
        cp.attrs["scope"] = f"rank {rank} alone (the slowest rank)"
        cp.attrs["scope_rank"] = int(rank)
        cp.attrs["first_start_ns"] = int(ops["start_ns"].min()) if len(ops) else 0
        return cp

    def _has_edges(self, rank: int) -> bool:
        return part_file(self.path, "edges", rank).is_file()

    # ------------------------------------------------------------------ the page
    def _notes(self, n_batches: int, batch_rows: int) -> dict[str, Any]:
        """The fact line and the section that say what was streamed, bounded, left out."""
        r = self.slowest_rank
        drawn = [int(x) for x in np.unique(self.t.ops["rank"].to_numpy())]
        fact = (f"streamed: {self.n_ranks:,} ranks read in {n_batches} batch(es) of "
                f"up to {batch_rows:,} ops, never the whole store (see 'About this report')")
        s = Section("streamed", "About this report: streamed")
        s.blocks.append(
            f"The store holds {self.n_ops:,} ops of {self.n_ranks:,} ranks in rank partitions. "
            f"This report read it one batch of ranks at a time ({n_batches} batch(es) of up to "
            f"{batch_rows:,} ops), so its memory follows one batch, not the store. Every "
            "figure computed rank by rank equals the in-memory report's; what needs the ops "
            "of several ranks at once ran on a stated subset or was left out.")
        rows = pd.DataFrame([
            ("Step times, breakdown, kernels, FLOPs utilization, pipeline, memory, "
             "rank groups" + (", rank x time heatmap" if self.activity is not None else ""),
             "streamed", "per rank: equal to in memory"),
            ("Communication, who waits for whom", "streamed",
             "communication ops only: equal"),
            ("Critical path", f"rank {r} only", "needs all ranks' ops at once"),
            ("Step timeline, pipeline Gantt", f"rank(s) {self._label(drawn)}",
             "the drawn ranks' step only"),
            ("Stragglers, host overhead, attribution tree, roofline", "left out",
             "replay or walk every op"),
        ], columns=["what", "how", "why"])
        s.blocks.append(people_table(rows, [Column("what", "Part of the report", "text"),
                                            Column("how", "Computed", "text"),
                                            Column("why", "Why", "text")],
                                     caption="What was streamed, bounded or left out"))
        s.blocks.append(
            f"The critical path below is rank {r}'s own (the slowest rank): its ops and edges, "
            "where a collective counts whole, its wait for the other ranks included; the "
            "cross-rank path needs every rank's ops and edges at once. The step timeline and "
            "the pipeline Gantt read the drawn step's ops of the ranks they draw, nothing "
            "else. The stragglers what-if and the drill-downs (host overhead and CUDA graphs, "
            "attribution tree, roofline) replay or walk every op of the trace, so they are "
            "left out: `retime report RUN --in-memory` (loads the whole store) or "
            "`retime stragglers RUN` gives them.")
        return {"fact": fact, "section": s, "batches": n_batches,
                "critical_path_rank": r, "drawn_ranks": drawn}

    @staticmethod
    def _label(ranks: list[int]) -> str:
        from .tables import ranks_label
        return ranks_label(np.asarray(ranks)) if ranks else "none"


def build_stream_report(path: str | os.PathLike[str], *, title: str | None = None,
                        top: int = 15, batch_rows: int = REPORT_BATCH_ROWS,
                        baseline: str | os.PathLike[str] | None = None) -> Report:
    """The report of a rank-partitioned store, streamed (module docstring); the same
    layout as :func:`analysis.report.build_report`, with a section saying what was
    streamed, what ran on a subset and what was left out.

    With ``baseline`` (another rank-partitioned store) both runs are streamed, one after
    the other, and the comparison is built from their streamed analyses: the waterfall,
    the per-rank deltas and the metrics side by side equal the in-memory report's, but for
    the critical path, which is each run's slowest rank's own (the row says so)."""
    from .report import assemble_report

    base = None
    if baseline is not None:
        if store_layout(Path(baseline)) != "rank":
            raise RetimeError(f"--baseline {baseline}: a streamed comparison needs both stores "
                              "rank-partitioned; re-ingest it with `retime ingest --layout "
                              "rank` or report in memory (--in-memory)")
        base = StreamRunAnalysis(baseline, batch_rows=batch_rows)
    run = StreamRunAnalysis(path, batch_rows=batch_rows)
    if base is not None:
        run.streamed["section"].blocks.append(
            f"The baseline ({Path(baseline).name}: {base.n_ops:,} ops of {base.n_ranks:,} "
            f"ranks) was streamed the same way ({base.streamed['batches']} batch(es)), one run "
            "after the other. The comparison is built from the two streamed analyses: the "
            "waterfall, the per-rank changes and the metrics equal the in-memory report's, "
            "but for the critical path, each run's slowest rank's own (rank "
            f"{base.slowest_rank} in the baseline, rank {run.slowest_rank} here).")
    with memo_scope():
        return assemble_report(run, baseline=base, title=title, top=top)
