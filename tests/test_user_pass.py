"""What a new user met on the shared traces (user pass 4), each checked against a recount of
the raw trace or against the line the CLI must print:

- the op-level Megatron trace's point-to-point pairs and one-rank tensor-parallel all-reduces
  were "unmatched" in `analyze` and the report while `ingest` counted them matched;
- collectives whose trace records no size read "0.0 MB" / "0 B" instead of unknown;
- a folder holding Kineto JSON and an nsys SQLite export ingested the JSON and left the
  export out without a word; a trace with no events became a 0-op store;
- a raw trace file passed where a NAME.retime store is wanted said "dir ... is a file".
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import retime
from retime.analysis import collectives, comm_summary, rank_wait
from retime.cli import run

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
MEGATRON = TRACES / "oplevel" / "megatron-ST-8rank"
NSYS = TRACES / "nsys" / "h100-2gpu-fastvideo.sqlite"
DLRM = TRACES / "kineto" / "dlrm-v100-8rank"


@pytest.fixture(scope="module")
def megatron(tmp_path_factory):
    out = tmp_path_factory.mktemp("user") / "st.retime"
    assert run(["ingest", str(MEGATRON), "-o", str(out)]) == 0
    return out


def _raw_pairs() -> pd.DataFrame:
    """Every send joined to its receive in the raw Parquet: the next stage (forward) or the
    previous one (backward) of the same step and data-parallel rank, same sequence number."""
    t = pd.read_parquet(MEGATRON / "trace-ST.parquet")
    parts = []
    for snd, rcv, ds in (("forward-send", "forward-recv", 1),
                         ("backward-send", "backward-recv", -1)):
        s = t[t["optype"] == snd].assign(to=lambda d, ds=ds: d["stage"] + ds)
        r = t[t["optype"] == rcv]
        parts.append(s.merge(r, left_on=["step", "dp_rank", "to", "seq_id"],
                             right_on=["step", "dp_rank", "stage", "seq_id"],
                             suffixes=("_s", "_r")))
    return pd.concat(parts, ignore_index=True)


def test_point_to_point_pairs_are_matched_with_their_wait(megatron, capsys):
    raw = _raw_pairs()
    assert len(raw) == 1536  # 768 forward + 768 backward transfers, each one pair
    t = retime.load(megatron)
    co = collectives(t)
    ing = json.loads((megatron / "meta.json").read_text())["collectives"]
    # analyze now agrees with ingest: every instance the ingest matched is matched
    assert int(co["matched"].sum()) == ing["matched"] == len(co)
    pairs = co[co["comm_op"] == "SEND_RECV"]
    assert len(pairs) == len(raw) and (pairs["n_ranks"] == 2).all()
    # the wait of a pair is how long the earlier side waited: |start_send - start_recv|
    want = (raw["start_ts_s"] - raw["start_ts_r"]).abs()
    for dp, gname in ((0, "pp:dp0"), (1, "pp:dp1")):
        gid = int(t.groups.loc[t.groups["name"] == gname, "group_id"].iloc[0])
        got = pairs.loc[pairs["group_id"] == gid, "wait_ns"].sum() / 1e9
        assert got == pytest.approx(want[raw["dp_rank"] == dp].sum(), rel=1e-6)
    # a collective of a one-rank group (tp size 1) is complete, with nothing to wait for
    one = co[co["n_ranks"] == 1]
    assert len(one) == 8 * 32 and (one["wait_ns"] == 0).all()
    # every rank now waits somewhere (pipeline ranks wait for their neighbours' sends)
    assert set(rank_wait(t)["rank"]) == set(range(8))
    assert run(["analyze", str(megatron)]) == 0
    out = capsys.readouterr().out
    assert "unmatched collective instances" not in out
    assert "group members in the trace" not in out


def test_unpaired_point_to_point_ops_stay_unmatched():
    """One send whose receive is not in the trace (a lone op) and two sends paired by
    mistake are not pairs."""
    from retime.collectors.enums import CommOp, LaneKind, OpKind
    from retime.collectors.trace import Trace

    P = int(OpKind.P2P)
    t = Trace.build(
        ops={"rank": [0, 1, 0, 1, 0], "lane": [0, 1, 0, 1, 0], "kind": [P] * 5,
             "name_id": [0] * 5, "start_ns": [0, 50, 200, 210, 400], "dur_ns": [100] * 5,
             "comm_op": [int(CommOp.SEND), int(CommOp.RECV), int(CommOp.SEND),
                         int(CommOp.SEND), int(CommOp.SEND)],
             "coll_id": [0, 0, 1, 1, -1], "group_id": [0] * 5, "bytes": [1000] * 5},
        lanes={"lane": [0, 1], "rank": [0, 1], "lane_kind": [int(LaneKind.GPU_STREAM)] * 2},
        groups={"group_id": [0], "name": ["pp"], "ranks": [[0, 1, 2, 3]]},
        strings=["p2p"])
    co = collectives(t).set_index("coll_id")
    assert bool(co.loc[0, "matched"]) and co.loc[0, "comm_op"] == "SEND_RECV"
    assert co.loc[0, "wait_ns"] == 50 and co.loc[0, "n_ranks"] == 2
    assert not bool(co.loc[1, "matched"]) and co.loc[1, "n_ranks"] == 4
    assert not bool(co.loc[-1, "matched"])


def test_unknown_collective_sizes_are_unknown_not_zero(megatron, capsys):
    s = comm_summary(collectives(retime.load(megatron)))
    assert s["total_bytes"].isna().all()  # op-level timers record no message sizes
    assert run(["analyze", str(megatron)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "comm group" in ln]
    assert lines and all("size unknown" in ln and " MB" not in ln for ln in lines)
    assert run(["analyze", str(megatron), "--json"]) == 0
    comm = json.loads(capsys.readouterr().out)["comm"]
    assert len(comm) == 21 and all(r["total_bytes"] is None for r in comm)


def test_known_sizes_are_kept(tmp_path):
    out = tmp_path / "dlrm.retime"
    assert run(["ingest", str(DLRM), "-o", str(out)]) == 0
    s = comm_summary(collectives(retime.load(out))).set_index("comm_op")
    # 3 all-reduces: the bytes of each instance summed (NCCL kernel args of the raw trace)
    assert s.loc["ALL_REDUCE", "total_bytes"] > 0 and np.isfinite(s["total_bytes"]).all()


def test_folder_mixing_kineto_and_nsys_is_refused(tmp_path, capsys):
    d = tmp_path / "mixed"
    d.mkdir()
    for f in sorted(DLRM.glob("*.json.gz"))[:2]:
        shutil.copy(f, d)
    shutil.copy(NSYS, d)
    out = tmp_path / "m.retime"
    assert run(["ingest", str(d), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "mixes 2 JSON" in err and "1 SQLite" in err
    assert not out.exists()
    assert run(["ingest", str(d), "-o", str(out), "--json"]) == 2
    e = json.loads(capsys.readouterr().out)
    assert e["exit_code"] == 2 and "ingest one format at a time" in e["hint"]


@pytest.mark.parametrize("in_memory", [False, True])
def test_a_trace_without_events_is_refused_and_writes_nothing(tmp_path, capsys, in_memory):
    src = tmp_path / "rank0.json.gz"
    with gzip.open(src, "wt") as fh:
        json.dump({"traceEvents": [], "distributedInfo": {"rank": 0}}, fh)
    out = tmp_path / "e.retime"
    argv = ["ingest", str(src), "-o", str(out)] + (["--in-memory"] if in_memory else [])
    assert run(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no timed activity" in err and "rank0.json.gz" in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["rank0.json.gz"]


@pytest.mark.parametrize("argv", [["analyze", "{f}"], ["replay", "{f}", "--json"],
                                  ["compare", "{f}", "{f}"], ["report", "{f}", "-o", "{o}"]])
def test_a_raw_trace_file_where_a_store_is_wanted_says_ingest_first(tmp_path, capsys, argv):
    f = sorted(DLRM.glob("*.json.gz"))[0]
    o = tmp_path / "x.html"
    assert run([a.format(f=f, o=o) for a in argv]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert len(err.splitlines()) == 1 and "retime ingest" in err and str(f) in err
    assert not o.exists()
    if "--json" in argv:
        e = json.loads(cap.out)
        assert "not a NAME.retime store" in e["error"] and "retime ingest" in e["hint"]


def test_report_words_a_trace_without_steps_once_and_costs_never_negative_zero(tmp_path):
    from retime.analysis.report_sections import _signed_pct

    store = tmp_path / "nsys.retime"
    assert run(["ingest", str(NSYS), "-o", str(store)]) == 0
    html = tmp_path / "n.html"
    assert run(["report", str(store), "-o", str(html)]) == 0
    text = html.read_text()
    assert "The whole trace (no step markers): 300 ms" in text  # the raw span: 299.9 ms
    assert "whole of the whole" not in text
    # the nsys export records no NCCL message sizes: the table says n/a, not 0 B
    assert ">0 B</td>" not in text and ">n/a</td>" in text
    # the launch table's step of a trace without step markers is the whole trace, not -1
    assert ">whole trace</td>" in text and ">-1</td>" not in text
    # the kernels' wording holds for the PDF too, which has no hover
    assert "hover over a name" not in text and "the full ones are in the tables" in text
    assert [_signed_pct(v) for v in (-0.001, -0.04, 0.0, 0.05, -0.06, 12.34)] == \
        ["+0.0%", "+0.0%", "+0.0%", "+0.1%", "-0.1%", "+12.3%"]


def test_analyze_of_a_cpu_only_trace_says_it_has_no_device_ops(tmp_path, capsys):
    store = tmp_path / "cpu.retime"
    src = TRACES / "kineto" / "edge-cases" / "rank_non_gpu.json.gz"
    assert run(["ingest", str(src), "-o", str(store)]) == 0
    capsys.readouterr()
    assert run(["analyze", str(store)]) == 0
    out = capsys.readouterr().out
    assert "top 0 ops" not in out and "no device ops in the trace (CPU only)" in out


def test_a_timeline_of_unknown_events_is_refused_with_what_was_dropped(tmp_path, capsys):
    """StragglerAnalysis' own Chrome timeline of the Megatron run: 6,866 events, none of a
    profiler category (it used to become a 0-op store)."""
    out = tmp_path / "tl.retime"
    assert run(["ingest", str(MEGATRON / "timeline-ST.json.gz"), "-o", str(out), "--json"]) == 2
    e = json.loads(capsys.readouterr().out)
    assert "0 ops from 6866 event(s) read" in e["error"]
    assert "unsupported category 'backward-compute' x1024" in e["error"]
    assert "op-level Parquet folder" in e["hint"] and not out.exists()


def test_analyze_words_steps_and_small_sizes_as_the_raw_trace_has_them(tmp_path, capsys):
    gloo = tmp_path / "gloo.retime"
    assert run(["ingest", str(TRACES / "kineto" / "cpu-gloo-rank34"), "-o", str(gloo)]) == 0
    capsys.readouterr()
    assert run(["analyze", str(gloo)]) == 0
    lines = capsys.readouterr().out.splitlines()
    # the raw file: ProfilerStep#551 ends before 8 of its 10 gloo:all_reduce annotations
    # start (Input Dims [[321271]] / [[2082411]] floats: 1.285 / 8.330 MB)
    un = [ln.strip() for ln in lines if ln.strip().startswith("ALL_REDUCE group 0")]
    assert sum("step 551" in ln for ln in un) == 2
    assert sum("outside every step" in ln for ln in un) == 8 and not any("-1" in ln for ln in un)
    # 48.1 MB in ~2.1 s of transfers on 300 ranks: a bandwidth, not 0.0 GB/s
    assert any("busbw 0.0449 GB/s" in ln for ln in lines)
    a100 = tmp_path / "a100.retime"
    assert run(["ingest", str(TRACES / "kineto" / "a100-ddp-nccl"), "-o", str(a100)]) == 0
    capsys.readouterr()
    assert run(["analyze", str(a100)]) == 0
    out = capsys.readouterr().out
    assert "BROADCAST group 0 step 5: 424 B" in out  # 53 Long elements (In msg nelems)
    nsys = tmp_path / "nsys.retime"
    assert run(["ingest", str(NSYS), "-o", str(nsys)]) == 0
    capsys.readouterr()
    assert run(["analyze", str(nsys)]) == 0
    out = capsys.readouterr().out
    assert "rank    0 whole trace:    299.873 ms" in out and "step     -1" not in out


def test_sweep_report_calls_the_no_compute_share_what_it_is(tmp_path):
    """sweep's bubble_fraction is the step share with no device compute; on a job without a
    pipeline (here a single-stream A100 benchmark, 98% of it waiting on the host) it is no
    pipeline bubble, and the report said 'Bubble'."""
    store = tmp_path / "s.retime"
    assert run(["ingest", str(TRACES / "kineto" / "a100-event-sync" / "single_stream.json.gz"),
                "-o", str(store)]) == 0
    grid = tmp_path / "g.toml"
    grid.write_text('[grid]\n"hardware.compute_speedup" = [1, 2]\n')
    sw = tmp_path / "sw.parquet"
    assert run(["sweep", str(store), "--grid", str(grid), "-o", str(sw), "--workers", "1"]) == 0
    assert pd.read_parquet(sw)["bubble_fraction"].min() > 0.9
    html = tmp_path / "sw.html"
    assert run(["report", str(sw), "-o", str(html)]) == 0
    text = html.read_text()
    assert ">No compute</th>" in text and ">Bubble</th>" not in text


def test_compare_of_runs_with_different_rank_counts_says_so(tmp_path, capsys):
    a, b = tmp_path / "dlrm.retime", tmp_path / "vgg.retime"
    assert run(["ingest", str(DLRM), "-o", str(a)]) == 0
    assert run(["ingest", str(TRACES / "kineto" / "h100-vgg13"), "-o", str(b)]) == 0
    capsys.readouterr()
    assert run(["compare", str(a), str(b), "--json"]) == 3  # still the verdict CI gates on
    v = json.loads(capsys.readouterr().out)
    # DLRM and VGG13 are also different jobs: the op-name note follows (user pass 10)
    assert v["note"].startswith("the runs hold 8 and 1 ranks: check that they are the same "
                                "job; the runs share ")
    assert v["line"].endswith("; note: " + v["note"])
    assert run(["compare", str(a), str(a), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["note"] is None


def test_critical_path_longer_than_a_one_rank_step_says_why(tmp_path):
    """cpu-gloo-rank34: one rank, ProfilerStep#551 of 210.1 ms, ops over 1,264.6 ms of the
    raw file (8 of its 10 gloo all-reduces after the step). The report said the path was
    longer 'because it crosses ranks', on a path that never leaves rank 34."""
    store = tmp_path / "g.retime"
    assert run(["ingest", str(TRACES / "kineto" / "cpu-gloo-rank34"), "-o", str(store)]) == 0
    html = tmp_path / "g.html"
    assert run(["report", str(store), "-o", str(html)]) == 0
    text = html.read_text()
    assert "it runs over the whole trace (1.265 s), the work outside the step included." in text
    assert "because it crosses ranks" not in text
    # world size 300 in distributedInfo, one rank's file: not "emitted" like a modeled run
    assert "300 (1 in the trace: 34)" in text and "emitted" not in text
    # a CPU-only trace has no GPU: its collectives are not called kernels or GPU time
    assert "Share of GPU time" not in text and "Top kernels" not in text
    assert "Timed ops of this CPU-only trace" in text and "Device time by op class" in text
