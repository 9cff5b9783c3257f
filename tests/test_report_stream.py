"""The streamed report (analysis/report_stream.py) of rank-partitioned stores of real shared
traces: every figure computed rank by rank equals the in-memory report's (frames compared
numerically, batches cutting the ranks), the critical path is the slowest rank's own and
says so, the page names what was streamed, bounded or left out, and `retime report` picks
the path by layout and size (--stream/--in-memory force it; bad combinations exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import ingest_cached
from typer.testing import CliRunner

from retime.analysis._util import step_windows
from retime.analysis.critical_path import critical_path
from retime.analysis.report import build_report
from retime.analysis.report_run import RunAnalysis
from retime.analysis.report_stream import (
    STREAM_REPORT_ABOVE_OPS,
    StreamRunAnalysis,
    build_stream_report,
    should_stream_report,
)
from retime.analysis.timeline import rank_activity
from retime.cli import app
from retime.collectors.store import rank_batches
from retime.collectors.trace import Trace, read_trace

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
DLRM = TRACES / "kineto" / "dlrm-v100-8rank"
#: a real multi-rank trace of each collector (8, 2 and 8 ranks); megatron-ST has pipeline
#: stages
REAL = [DLRM, TRACES / "nsys" / "h100-2gpu-fastvideo.sqlite",
        TRACES / "oplevel" / "megatron-ST-8rank" / "trace-ST.parquet"]
#: small batches, so that batches cut the ranks (one to three ranks each)
BATCH = 3000

_FRAMES = ["bd", "bsum", "ks", "cls", "co", "cw", "eff", "bub", "stages", "pm", "mt", "folds"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    out = {}
    for src in REAL:
        p = tmp_path_factory.mktemp("rs") / f"{src.name.split('.')[0]}.retime"
        ingest_cached(src).save(p, layout="rank")
        out[src.name] = p
    return out


@pytest.fixture(scope="module")
def dlrm_pair(stores):
    p = stores[DLRM.name]
    return p, StreamRunAnalysis(p, batch_rows=BATCH), read_trace(p)


@pytest.mark.parametrize("src", REAL, ids=lambda p: p.name)
def test_streamed_frames_equal_in_memory(stores, src):
    p = stores[src.name]
    assert len(rank_batches(p, batch_rows=BATCH)) > 1  # the batches cut the ranks
    s = StreamRunAnalysis(p, batch_rows=BATCH)
    tr = read_trace(p)
    m = RunAnalysis(tr, tr)
    for k in _FRAMES:
        a, b = getattr(s, k), getattr(m, k)
        assert len(a) == len(b), k
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True),
                                      check_dtype=False, rtol=1e-12, obj=k)
    w = step_windows(tr)
    pd.testing.assert_frame_equal(s.windows, w)
    assert s.window == m.window
    assert s.unseen == m.unseen
    assert (s.n_ops, s.n_ranks, s.steps) == (tr.n_ops, len(tr.ranks), m.steps)
    assert s.step_ns == m.step_ns and s.slowest_rank == m.slowest_rank
    assert s.first_start_ns == int(tr.ops["start_ns"].min())
    assert s.has_microbatches == bool((tr.ops["microbatch"] >= 0).any())
    for k in ("mfu", "hfu"):
        np.testing.assert_equal(s.je[k], m.je[k])
    pd.testing.assert_series_equal(s.slow_parts, m.slow_parts)
    if src.name.startswith("trace-ST"):  # pipeline stages: the ideal bubble of the job
        assert s.n_stages > 1 and s.bub["ideal_bubble_frac"].notna().any()


def test_streamed_heatmap_equals_in_memory(dlrm_pair):
    p, s, tr = dlrm_pair
    batches = rank_batches(p, batch_rows=BATCH)
    for max_rows in (512, 3):  # each rank a row; consecutive ranks pooled
        a = s._pass_activity(batches, max_rows=max_rows)
        b = rank_activity(tr, s.window, max_rows=max_rows)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-6)
    assert len(b[0]) == 3 and b[1].sum() == 8


def test_critical_path_is_the_slowest_ranks_own(dlrm_pair):
    p, s, tr = dlrm_pair
    r = s.slowest_rank
    cp = s.cp
    assert cp.attrs["scope"] == f"rank {r} alone (the slowest rank)"
    assert set(cp["rank"]) == {r}
    assert int(cp["dur_ns"].sum() + cp["wait_ns"].sum()) == cp.attrs["length_ns"]
    # the same path from the whole trace in memory, cut to the rank's ops and edges
    keep = tr.ops["rank"].to_numpy() == r
    oid = tr.ops["op_id"].to_numpy()[keep]
    pos = np.full(tr.n_ops, -1)
    pos[oid] = np.arange(len(oid))
    e = tr.edges[keep[tr.edges["src"]] & keep[tr.edges["dst"]]]
    one = Trace(ops=tr.ops[keep].assign(op_id=np.arange(len(oid))).reset_index(drop=True),
                lanes=tr.lanes, edges=e.assign(src=pos[e["src"]], dst=pos[e["dst"]]),
                ranges=tr.ranges, groups=tr.groups, memory=tr.memory, strings=tr.strings,
                meta=tr.meta)
    ref = critical_path(one)
    assert cp.attrs["length_ns"] == ref.attrs["length_ns"] > 0
    np.testing.assert_array_equal(cp["op_id"].to_numpy(), oid[ref["op_id"].to_numpy()])
    # the timeline marks the path's ops: they are ops of the drawn trace by store id
    assert np.isin(cp["op_id"], s.t.ops["op_id"]).sum() > 0


def _tables(rep):
    return {s.key: s.tables for s in rep.sections}


def test_streamed_report_equals_in_memory_report(dlrm_pair):
    p, s, tr = dlrm_pair
    rs = build_stream_report(p, batch_rows=BATCH)
    rm = build_report(tr)
    ts, tm = _tables(rs), _tables(rm)
    # what the streamed report leaves out, and nothing else
    assert set(tm) - set(ts) == {"stragglers", "host", "tree", "roofline"}
    assert set(ts) - set(tm) == {"streamed"}
    for key in ("breakdown", "kernels", "communication"):
        assert len(ts[key]) == len(tm[key]) > 0
        for a, b in zip(ts[key], tm[key], strict=True):
            assert (a.caption, a.header, a.rows, a.note) == (b.caption, b.header, b.rows,
                                                             b.note), key
            if b.csv_frame is not None:
                pd.testing.assert_frame_equal(a.csv_frame.reset_index(drop=True),
                                              b.csv_frame.reset_index(drop=True),
                                              check_dtype=False, rtol=1e-12)
    # the same headline, except what the critical path spans (in the excluded-work note)
    note = f"the critical path (rank {s.slowest_rank}'s whole timeline)"
    assert any(note in h[2] for h in rs.headline)
    assert [tuple(x.replace(note, "the critical path (whole trace)") for x in h)
            for h in rs.headline] == rm.headline
    cp_free = [f for f in rm.findings if "critical path" not in f]
    assert rs.findings[:len(cp_free)] == cp_free
    drop = {"Critical path"}
    assert [x for x in rs.summary if x[0] not in drop] == \
        [x for x in rm.summary if x[0] not in drop]
    facts = dict(rs.facts)
    assert facts["Critical path"].endswith(f"rank {s.slowest_rank} alone (the slowest rank)")
    assert facts["Analysis"].startswith("streamed: 8 ranks read in 4 batch(es)")
    # the page says what was streamed, bounded and left out
    about = rs.sections[0]
    assert about.key == "streamed"
    rows = {r[0]: r[1] for r in about.tables[0].rows}
    assert rows["Critical path"] == f"rank {s.slowest_rank} only"
    assert rows["Stragglers, host overhead, attribution tree, roofline"] == "left out"
    assert rows["Step timeline, pipeline Gantt"] == "rank(s) 0-7"
    cpsec = next(x for x in rs.sections if x.key == "critical_path")
    assert f"rank {s.slowest_rank} alone (the slowest rank)" in cpsec.blocks[0]
    # one rank's path (19.2 ms) is longer than the step (18.71 ms) for its own reasons
    assert "runs over the rank's whole timeline" in cpsec.blocks[1]
    assert "crosses ranks" not in cpsec.blocks[1]
    # the timeline draws the same rows from the drawn ranks' ops of the drawn step
    assert [f.key for f in next(x for x in rs.sections if x.key == "timeline").figures] == \
        [f.key for f in next(x for x in rm.sections if x.key == "timeline").figures]
    assert set(s.t.ops["step"]) == {s.window.step}


def test_streamed_report_needs_a_rank_store(stores, tmp_path):
    p = tmp_path / "single.retime"
    ingest_cached(DLRM).save(p)
    assert not should_stream_report(p)
    from retime.collectors.errors import RetimeError
    with pytest.raises(RetimeError, match="--layout rank"):
        StreamRunAnalysis(p)
    from retime.analysis._util import memo_scope
    with memo_scope(), pytest.raises(RetimeError, match="memo_scope"):
        StreamRunAnalysis(stores[DLRM.name])


def test_auto_threshold(stores):
    p = stores[DLRM.name]
    n = 11764  # ops of the 8 ranks (retime info)
    assert read_trace(p).n_ops == n
    assert not should_stream_report(p)  # far below the default threshold
    assert STREAM_REPORT_ABOVE_OPS == 2_000_000
    assert should_stream_report(p, above_ops=n - 1)
    assert not should_stream_report(p, above_ops=n)


def test_cli_report_stream_and_in_memory(stores, tmp_path):
    p = stores[DLRM.name]
    r = CliRunner().invoke(app, ["report", str(p), "-o", str(tmp_path / "a.html"), "--json",
                                 "--stream"])
    assert r.exit_code == 0, r.output
    js = json.loads(r.stdout)
    assert js["mode"] == "stream"
    html = (tmp_path / "a.html").read_text()
    assert "About this report: streamed" in html and "left out" in html
    r = CliRunner().invoke(app, ["report", str(p), "-o", str(tmp_path / "b.html"), "--json"])
    assert r.exit_code == 0, r.output
    jm = json.loads(r.stdout)
    assert jm["mode"] == "memory"  # below the threshold: in memory by default
    assert [h["value"] for h in js["headline"]] == [h["value"] for h in jm["headline"]]
    # the streamed PDF of the same name shares the tables folder
    r = CliRunner().invoke(app, ["report", str(p), "-o", str(tmp_path / "a.pdf"), "--stream"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "a.pdf").read_bytes()[:5] == b"%PDF-"


@pytest.mark.parametrize("extra,what", [(["--baseline", "{s}"], "both stores rank-partitioned"),
                                        ([], "--layout rank")])
def test_cli_bad_stream_requests_exit_2(stores, tmp_path, extra, what):
    p = stores[DLRM.name]
    single = tmp_path / "single.retime"
    ingest_cached(DLRM).save(single)
    src = p if extra else single
    cmd = [sys.executable, "-m", "retime", "report", str(src), "-o",
           str(tmp_path / "x.html"), "--stream", *[a.format(s=single) for a in extra]]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and what in lines[0] and "Traceback" not in r.stderr


def test_one_rank_store_memory_samples_and_whole_path(tmp_path):
    """v100-ddp-sgd: one rank, 28,010 allocator samples, 5 steps. The memory peaks and the
    drawn samples equal the in-memory ones; with one rank the slowest rank's critical path
    is the whole trace's."""
    src = TRACES / "kineto" / "v100-ddp-sgd"
    p = tmp_path / "v100.retime"
    ingest_cached(src).save(p, layout="rank")
    s = StreamRunAnalysis(p, batch_rows=BATCH)
    tr = read_trace(p)
    m = RunAnalysis(tr, tr)
    assert len(tr.memory) == 28010 and len(s.mt) == 28010
    for k in ("pm", "mt", "bd", "eff"):
        pd.testing.assert_frame_equal(getattr(s, k), getattr(m, k), check_dtype=False, obj=k)
    assert s.pm["source"].tolist() == ["trace"]
    assert s.window == m.window and s.window.steps == 5
    assert s.cp.attrs["length_ns"] == m.cp.attrs["length_ns"]
    pd.testing.assert_frame_equal(s.cp, m.cp)


def _copies(t: Trace, k: int) -> Trace:
    """``k`` copies of ``t``'s ranks: rank ``r`` of copy ``c`` becomes ``r + c * n``, with its
    own lanes, op ids, collective instances and process groups; copy ``c``'s kernels last
    ``c`` ns longer, so that no two copies' ranks fold together."""
    from retime.collectors.enums import OpKind

    n = int(t.ranks.max()) + 1
    n_lanes = int(t.lanes["lane"].max()) + 1
    n_coll = int(t.ops["coll_id"].max()) + 1
    n_grp = int(t.groups["group_id"].max()) + 1 if len(t.groups) else 0
    ops, lanes, edges, ranges, groups = [], [], [], [], []
    for c in range(k):
        o = t.ops.copy()
        o["op_id"] += c * t.n_ops
        o["rank"] += c * n
        o["lane"] += c * n_lanes
        o["coll_id"] = np.where(o["coll_id"] >= 0, o["coll_id"] + c * n_coll, -1)
        o["group_id"] = np.where(o["group_id"] >= 0, o["group_id"] + c * n_grp, -1)
        o["dur_ns"] += np.where(o["kind"] == int(OpKind.KERNEL), c, 0)
        ops.append(o)
        lanes.append(t.lanes.assign(lane=t.lanes["lane"] + c * n_lanes,
                                    rank=t.lanes["rank"] + c * n))
        edges.append(t.edges.assign(src=t.edges["src"] + c * t.n_ops,
                                    dst=t.edges["dst"] + c * t.n_ops))
        ranges.append(t.ranges.assign(rank=t.ranges["rank"] + c * n,
                                      lane=t.ranges["lane"] + c * n_lanes))
        groups.append(t.groups.assign(group_id=t.groups["group_id"] + c * n_grp,
                                      ranks=[[r + c * n for r in g] for g in t.groups["ranks"]]))
    meta = dict(t.meta, world_size=n * k, devices={})

    def cat(xs):
        return pd.concat(xs, ignore_index=True)

    return Trace.build(ops=cat(ops), lanes=cat(lanes), edges=cat(edges), ranges=cat(ranges),
                       groups=cat(groups), strings=list(t.strings), meta=meta)


def test_past_32_ranks_heatmap_and_picked_timeline_rows(tmp_path):
    """40 distinct ranks (5 copies of DLRM's 8): the rank x time heatmap is streamed and
    equals the in-memory one; the timeline draws the fastest, median and slowest rank, read
    alone."""
    from retime.analysis.report_sections import section_timeline

    tr = _copies(ingest_cached(DLRM), 5)
    p = tmp_path / "x40.retime"
    tr.save(p, layout="rank")
    tr = read_trace(p)
    s = StreamRunAnalysis(p, batch_rows=5000)
    m = RunAnalysis(tr, tr)
    assert s.n_ranks == 40 and len(s.folds["group"].unique()) == 40
    for k in ("bd", "folds", "co", "cw", "ks"):
        pd.testing.assert_frame_equal(getattr(s, k).reset_index(drop=True),
                                      getattr(m, k).reset_index(drop=True),
                                      check_dtype=False, rtol=1e-12, obj=k)
    for x, y in zip(s.activity, m.activity, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-6)
    assert len(s.activity[0]) == 40
    b = s.bsum.set_index("rank")["step_ns"].sort_values(kind="mergesort")
    picks = sorted({int(b.index[0]), int(b.index[20]), int(b.index[-1])})
    assert sorted(set(s.t.ops["rank"])) == picks  # only the drawn ranks were read
    a, z = section_timeline(s), section_timeline(m)
    assert [f.key for f in a.figures] == [f.key for f in z.figures] == ["timeline", "rank_time"]
    assert [x for x in a.blocks if isinstance(x, str)] == \
        [x for x in z.blocks if isinstance(x, str)]


def test_stored_whatif_streamed(stores, tmp_path):
    """A what-if saved by rank: the streamed report is a what-if report (measured against
    replayed, the scenario named) with the in-memory report's figures. The replay's own
    step windows (meta, valid for ops at exactly the recorded times) are used batch by
    batch; with a checksum that does not match, both recompute them alike."""
    import retime

    t = read_trace(stores[DLRM.name])
    rt = retime.whatif(t, {"hardware.compute_speedup": 2}).to_trace()
    assert rt.meta["step_windows"]["ops"] == rt.n_ops
    p = tmp_path / "wi.retime"
    rt.save(p, layout="rank")
    rs = build_stream_report(p, batch_rows=BATCH)
    rm = build_report(read_trace(p))
    assert rs.kind == rm.kind == "whatif"
    assert rs.scenario == rm.scenario == [("hardware.compute_speedup", "2",
                                           "every compute kernel class (factor)")]
    assert rs.headline[:3] == rm.headline[:3]
    assert [h[0] for h in rs.headline[:2]] == ["Measured step", "What-if step"]
    bad = tmp_path / "bad.retime"
    rt.meta["step_windows"] = dict(rt.meta["step_windows"], times=12345)
    rt.save(bad, layout="rank")
    for q in (p, bad):
        tr = read_trace(q)
        s, m = StreamRunAnalysis(q, batch_rows=BATCH), RunAnalysis(tr, tr)
        pd.testing.assert_frame_equal(s.windows, step_windows(tr))
        pd.testing.assert_frame_equal(s.bd, m.bd)
    # the recorded windows differ from recomputed ones: the two stores test both paths
    assert not StreamRunAnalysis(bad).windows.equals(StreamRunAnalysis(p).windows)


def test_streamed_comparison_equals_in_memory(stores, tmp_path):
    """A streamed report with --baseline: both runs streamed, the comparison built from their
    streamed analyses. Pair: DLRM's 8 ranks and its what-if (compute 2x), both stored by
    rank. The waterfall, the per-rank deltas and every side-by-side row equal the in-memory
    report's, but the critical path, each run's slowest rank's own (the row says so)."""
    import retime
    from retime.analysis.report_compare import waterfall_frame

    base_p = stores[DLRM.name]
    tb = read_trace(base_p)
    rt = retime.whatif(tb, {"hardware.compute_speedup": 2}).to_trace()
    p = tmp_path / "wi.retime"
    rt.save(p, layout="rank")
    tc = read_trace(p)
    rs = build_stream_report(p, baseline=base_p, batch_rows=BATCH)
    rm = build_report(tc, baseline=tb)
    assert rs.kind == rm.kind == "whatif"
    assert rs.headline[:2] == rm.headline[:2]
    assert [h[0] for h in rs.headline[:2]] == ["Measured step", "What-if step"]
    ca = next(x for x in rs.sections if x.key == "comparison")
    cb = next(x for x in rm.sections if x.key == "comparison")
    assert [f.key for f in ca.figures] == [f.key for f in cb.figures] == \
        ["waterfall", "rank_deltas"]
    (sa, da), (sb, db) = ca.tables, cb.tables
    cp_a = [r for r in sa.rows if r[0].startswith("Critical path")]
    cp_b = [r for r in sb.rows if r[0].startswith("Critical path")]
    assert [r[0] for r in cp_a] == ["Critical path (each run's slowest rank alone)"]
    assert [r[0] for r in cp_b] == ["Critical path"]
    assert [r for r in sa.rows if r not in cp_a] == [r for r in sb.rows if r not in cp_b]
    assert len(sa.rows) == len(sb.rows) > 8
    assert (da.caption, da.header, da.rows) == (db.caption, db.header, db.rows)
    assert len(da.rows) == 8  # every rank (all shown: no CSV needed below --top)
    wa = waterfall_frame(StreamRunAnalysis(base_p, batch_rows=BATCH),
                         StreamRunAnalysis(p, batch_rows=BATCH))
    wb = waterfall_frame(RunAnalysis(tb, tb), RunAnalysis(tc, tc))
    pd.testing.assert_frame_equal(wa, wb)
    assert wa.attrs == wb.attrs and wa["delta_ns"].abs().sum() > 0
    # the comparison finding (first) is the same
    assert rs.findings[0] == rm.findings[0]
    # the CLI streams both when both are stored by rank (and says so)
    r = CliRunner().invoke(app, ["report", str(p), "--baseline", str(base_p), "-o",
                                 str(tmp_path / "c.html"), "--stream", "--json"])
    assert r.exit_code == 0, r.output
    js = json.loads(r.stdout.strip().splitlines()[-1])
    assert js["mode"] == "stream" and js["kind"] == "whatif"
    html = (tmp_path / "c.html").read_text()
    assert "About this report: streamed" in html and "slowest rank alone" in html
    about = next(x for x in rs.sections if x.key == "streamed")
    assert any(isinstance(b, str) and b.startswith(f"The baseline ({base_p.name}: 11,764 ops "
                                                   "of 8 ranks) was streamed the same way")
               for b in about.blocks)
