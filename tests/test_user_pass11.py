"""User pass 11: the real single-H200 traces of traces/gpu_pairs (plain torch.profiler), each
finding checked against a recount of the raw file with plain Python, none of the analysis code:

- a lone file named ``rep1.pt.trace.json.gz`` (no distributedInfo) was ingested as rank 1 of
  a world of 2: the bare number before ``.pt.trace.json`` was read as a rank, and replay's
  memory line said "on 2 rank(s)". A lone file whose name tells no rank (rank-N, worker-N,
  _rN) is now rank 0 of 1; several files still tell their ranks apart by that number.
- ``hardware.cuda_graphs`` on the CUDA-graph trace (tiny-graph, gpt-b8-graph: one
  cudaGraphLaunch per step, no kernel launch) "captured" the graph launches again: the report
  read "3 graph launches replace 3 kernel launches" and 39.9% of host-bound time removed, by
  swapping a measured 2.1 ms cudaGraphLaunch for a modeled 10 us one. It is now refused, with
  the reason: the trace already runs CUDA graphs.
- the report's "Launch overhead per rank and step" counted GPU ops as launches: on the graph
  trace "Launches 964" per step where the raw file has one cudaGraphLaunch (2.12 ms), and
  the summed launch-call time was 964 times that call. Launch calls are now counted once;
  the GPU ops they start are their own column.
- the nsys FastVideo report (no step marker; the SQLite has no ProfilerStep/NVTX step range)
  still read "Mean step per rank", "Step (ms)", "Waiting per step" and "CUDA-graph what-if
  (summed over ranks and steps)" / "Step time, summed" of its one whole-trace window. They
  now say "Whole trace".
- gpt-b8 was recorded with with_stack=True: profiled step 58.1 ms against 27.2 ms unprofiled
  (job.json), host_bound 54.5%; gpt-b8-nostack 28.9 ms. analyze said nothing of the profiler,
  and compare read "IMPROVEMENT -50.3%" of gpt-b8 against gpt-b8-nostack with no word. Ingest
  now keeps the file's with_stack flag; analyze notes that host-bound time is then partly the
  profiler's, and compare notes that one run was recorded with it and the other without.
- the report's critical path on gpt-b8-graph read "108.1 ms in all: 36.03 ms per step,
  129.8% of the mean step": 27.02 ms of the path is the warm-up step's graph replay, queued
  before the trace and outside every step (recounted: the 964 GPU ops of a correlation id no
  runtime call of the file holds). That part is now named and left out of "per step" (27.02
  ms per step, 97.4%).
- tiny-eager (no with_stack; 17 ms unprofiled, 27.8 ms profiled) read "idle 15.6%", which the
  breakdown defines as "nothing runs anywhere on the rank": it is 853 gaps under 100 us
  between recorded ops (9.55 ms; recounted from the raw events), the host between calls
  (Python, the profiler's own work). analyze now says so in a note (the breakdown is unchanged).
- the G2 traces' CUPTI overhead records (big-b8-graph: 194 'Command Buffer Full', pid -1) were
  dropped as "unsupported category 'overhead'"; the drop reason now says what they are.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from retime.cli import run

ROOT = Path(__file__).resolve().parents[1]
G1 = ROOT / "traces" / "gpu_pairs" / "g1"
TINY_EAGER = G1 / "tiny-eager" / "rep1.pt.trace.json.gz"
TINY_GRAPH = G1 / "tiny-graph" / "rep1.pt.trace.json.gz"
NSYS = ROOT.parent / "shared" / "traces" / "nsys" / "h100-2gpu-fastvideo.sqlite"


def _doc(path: Path) -> dict:
    return json.load(gzip.open(path))


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("u11")
    out = {}
    for k, src in (("eager", TINY_EAGER), ("graph", TINY_GRAPH)):
        out[k] = d / f"{k}.retime"
        assert run(["ingest", str(src), "-o", str(out[k])]) == 0
    return out


def test_lone_rep1_file_is_rank_0_of_1(stores):
    doc = _doc(TINY_EAGER)
    assert "distributedInfo" not in doc  # plain torch.profiler, one GPU
    assert {e["pid"] for e in doc["traceEvents"] if e.get("cat") == "kernel"} == {0}
    meta = json.loads((stores["eager"] / "meta.json").read_text())
    assert meta["world_size"] == 1
    (src,) = meta["sources"]
    assert src["rank"] == 0
    assert "not read as a rank" in src["rank_source"]
    assert list(meta["accounting"].values())[0]["rank"] == 0
    for table in ("ops", "lanes", "ranges"):  # the tables too, not only the metadata
        assert set(pd.read_parquet(stores["eager"] / f"{table}.parquet")["rank"]) == {0}


def test_bare_numbers_still_tell_several_files_apart(tmp_path):
    for r in (1, 2):
        (tmp_path / f"host_{r}.pt.trace.json.gz").write_bytes(TINY_GRAPH.read_bytes())
    out = tmp_path / "two.retime"
    assert run(["ingest", str(tmp_path), "-o", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert sorted(s["rank"] for s in meta["sources"]) == [1, 2]


def _runtime_calls(path: Path) -> list[dict]:
    return [e for e in _doc(path)["traceEvents"] if e.get("cat") == "cuda_runtime"]


def test_cuda_graph_whatif_on_a_graph_trace_is_refused(stores, capsys):
    # tiny-graph replays one captured graph per step: its only launches are cudaGraphLaunch
    calls = _runtime_calls(TINY_GRAPH)
    assert sum(e["name"] == "cudaGraphLaunch" for e in calls) == 3
    assert not any(e["name"] == "cudaLaunchKernel" for e in calls)
    capsys.readouterr()
    rc = run(["replay", str(stores["graph"]), "--set", "hardware.cuda_graphs=step", "--json"])
    assert rc == 2
    err = json.loads(capsys.readouterr().out)["error"]
    assert "already runs CUDA graphs" in err and "all 3 of its launch calls" in err
    # the eager run of the same model still gets the what-if
    assert run(["replay", str(stores["eager"]), "--set", "hardware.cuda_graphs=step",
                "--json"]) == 0


def test_host_overhead_counts_a_graph_launch_once(stores):
    from retime.analysis.host import host_overhead
    from retime.collectors.trace import read_trace

    doc = _doc(TINY_GRAPH)
    ev = doc["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1])) for e in ev
                   if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    launches = [e for e in ev if e.get("name") == "cudaGraphLaunch"]
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    h = host_overhead(read_trace(stores["graph"])).set_index("step")
    assert sorted(h.index) == [s for *_, s in steps] == [2, 3, 4]
    for a, b, s in steps:
        mine = [e for e in launches if a <= e["ts"] < b]
        assert len(mine) == 1 and h.loc[s, "launches"] == 1
        corr = mine[0]["args"]["correlation"]
        assert h.loc[s, "gpu_ops"] == sum(g["args"]["correlation"] == corr for g in gpu) == 438
        assert h.loc[s, "launch_call_ns"] == pytest.approx(mine[0]["dur"] * 1000, abs=1)
        assert h.loc[s, "cpu_ns_per_launch"] == pytest.approx(mine[0]["dur"] * 1000, abs=1)


def _text(html_path: Path) -> str:
    import html
    import re
    s = re.sub(r"<script.*?</script>|<style.*?</style>|<svg.*?</svg>", "",
               html_path.read_text(), flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", "\n", s))


def test_report_of_a_trace_without_step_markers_says_whole_trace(tmp_path):
    import sqlite3
    con = sqlite3.connect(NSYS)
    tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
    if "NVTX_EVENTS" in tables:  # no step range among its NVTX ranges
        names = [r[0] or "" for r in con.execute("select text from NVTX_EVENTS")]
        assert not any("ProfilerStep" in n or "step" in n.lower() for n in names)
    con.close()
    store = tmp_path / "nsys.retime"
    assert run(["ingest", str(NSYS), "-o", str(store)]) == 0
    out = tmp_path / "nsys.html"
    assert run(["report", str(store), "-o", str(out)]) == 0
    text = _text(out)
    assert "Whole trace per rank, slowest first" in text
    assert "Waiting, whole trace" in text
    assert "CUDA-graph what-if (whole trace, summed over ranks; no step markers)" in text
    for stale in ("Mean step per rank", "Waiting per step", "summed over ranks and steps",
                  "Step time, summed"):
        assert stale not in text, stale


def _profiled_step_ms(path: Path) -> float:
    ev = _doc(path)["traceEvents"]
    d = [e["dur"] for e in ev if e.get("cat") == "user_annotation"
         and str(e.get("name", "")).startswith("ProfilerStep#")]
    return sum(d) / len(d) / 1000


def test_with_stack_is_noted_by_analyze_and_compare(tmp_path, capsys):
    import statistics
    job = json.loads((G1 / "job.json").read_text())["configs"]
    a, b = G1 / "gpt-b8" / "rep1.pt.trace.json.gz", G1 / "gpt-b8-nostack" / "rep1.pt.trace.json.gz"
    assert (_doc(a).get("with_stack"), _doc(b).get("with_stack")) == (1, None)
    assert job["gpt-b8"]["with_stack"] and not job["gpt-b8-nostack"]["with_stack"]
    # the recount: with the stack the profiled step is about twice the unprofiled one
    plain = statistics.median(job["gpt-b8"]["unprofiled_step_ms"])
    assert _profiled_step_ms(a) > 1.8 * plain and _profiled_step_ms(b) < 1.2 * plain
    sa, sb = tmp_path / "a.retime", tmp_path / "b.retime"
    assert run(["ingest", str(a), "-o", str(sa)]) == 0
    assert run(["ingest", str(b), "-o", str(sb)]) == 0
    capsys.readouterr()
    assert run(["analyze", str(sa), "--json"]) == 0
    an = json.loads(capsys.readouterr().out)
    hb = an["breakdown"]["total_frac"]["host_bound_frac"]
    assert hb > 0.4
    (note,) = [n for n in an["notes"] if "with_stack" in n]
    assert f"{100 * hb:.1f}% of the time here" in note and "profiler's" in note
    assert run(["analyze", str(sb), "--json"]) == 0
    assert not any("with_stack" in n for n in json.loads(capsys.readouterr().out)["notes"])
    run(["compare", str(sa), str(sb), "--json"])
    v = json.loads(capsys.readouterr().out)
    assert v["note"] and "baseline was recorded with with_stack=True" in v["note"]
    run(["compare", str(sb), str(sb), "--json"])
    assert json.loads(capsys.readouterr().out)["note"] is None


def test_critical_path_per_step_leaves_out_the_work_before_the_first_step(stores, tmp_path):
    # tiny-graph: the graph replay of the warm-up step (its launch is before the trace) runs
    # before ProfilerStep#2's GPU range; the path runs through it, but no step holds it
    ev = _doc(TINY_GRAPH)["traceEvents"]
    corr = {e["args"]["correlation"] for e in ev if e.get("cat") == "cuda_runtime"}
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    early = [e for e in gpu if e["args"]["correlation"] not in corr]
    first_step = min(e["ts"] for e in ev if e.get("cat") == "gpu_user_annotation")
    assert len(early) == 122 and all(e["ts"] < first_step for e in early)
    early_ms = sum(e["dur"] for e in early) / 1000
    out = tmp_path / "graph.html"
    assert run(["report", str(stores["graph"]), "-o", str(out)]) == 0
    (line,) = [s for s in _text(out).splitlines() if "runs through all 3 steps" in s]
    import re
    m = re.search(r"([\d.]+) ms in all, of which ([\d.]+) µs lies outside every step .*?: "
                  r"([\d.]+) ms per step, ([\d.]+)% of the mean step", line)
    assert m, line
    length, out_us, per_step, pct = (float(x) for x in m.groups())
    # outside the steps: part of the early (pre-trace) graph replay, no more than it
    assert 0 < out_us / 1000 <= early_ms
    assert per_step == pytest.approx((length - out_us / 1000) / 3, abs=0.002)
    # per step the path now fits in the step (the GPU ranges of the raw file: ~1.67 ms)
    steps = [e["dur"] / 1000 for e in ev if e.get("cat") == "gpu_user_annotation"]
    assert per_step <= sum(steps) / len(steps) and pct <= 100


def test_idle_made_of_short_gaps_between_ops_is_said_to_be_host_time(stores, capsys):
    import numpy as np
    ev = [e for e in _doc(TINY_EAGER)["traceEvents"] if e.get("ph") == "X" and "dur" in e
          and e.get("cat") not in ("Trace", "gpu_user_annotation")]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "user_annotation"
             and e["name"].startswith("ProfilerStep#")]
    iv = np.array([(e["ts"], e["ts"] + e["dur"]) for e in ev
                   if not e["name"].startswith("ProfilerStep#")])
    n, tot = 0, 0.0
    for s0, s1 in steps:  # gaps under 100 us in the union of every recorded event
        m = (iv[:, 1] > s0) & (iv[:, 0] < s1)
        a, b = np.maximum(iv[m, 0], s0), np.minimum(iv[m, 1], s1)
        i = np.argsort(a)
        g = a[i][1:] - np.maximum.accumulate(b[i])[:-1]
        g = g[(g > 0) & (g < 100)]
        n, tot = n + len(g), tot + g.sum()
    capsys.readouterr()
    assert run(["analyze", str(stores["eager"]), "--json"]) == 0
    an = json.loads(capsys.readouterr().out)
    idle = an["breakdown"]["total_frac"]["idle_frac"]
    assert idle > 0.1
    (note,) = [x for x in an["notes"] if x.startswith("idle")]
    assert f"{n:,} gaps shorter than 100 us" in note and f"({tot / 1000:.2f} ms)" in note
    assert tot / 1000 > 0.5 * idle * an["breakdown"]["total_ns"]["step_ns"] / 1e6


def test_cupti_overhead_records_are_dropped_by_name(tmp_path):
    src = ROOT / "traces" / "gpu_pairs" / "g2" / "big-b8-graph" / "rep1.pt.trace.json.gz"
    ov = [e for e in _doc(src)["traceEvents"] if e.get("cat") == "overhead"]
    assert len(ov) == 194 and {e["name"] for e in ov} == {"Command Buffer Full"}
    out = tmp_path / "g.retime"
    assert run(["ingest", str(src), "-o", str(out)]) == 0
    (acc,) = json.loads((out / "meta.json").read_text())["accounting"].values()
    (reason,) = [k for k in acc["dropped"] if "overhead" in k]
    assert acc["dropped"][reason] == 194
    assert "unsupported" not in reason and "Command Buffer Full" in reason
