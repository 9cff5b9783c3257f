"""What a new user met on the shared traces (user pass 8), each checked against a recount of
the raw trace with gzip + json (or sqlite3) and plain Python, none of the reader's code:

- a what-if's report and `analyze` of the replayed store said "64 of them ran before the
  first launched GPU op (queued before the trace started)" where `retime replay` of the very
  same what-if (and the raw DLRM files) say 125: the queue is a fact of the recording, and
  the replayed store recounted it on the what-if's times (host 2x faster moves rank 1's
  first launched copy ahead of its recorded backlog).
- `export --chakra FILE` / `demo -o FILE` called the file in the way a raw trace to ingest;
- the report's "GPU busy" (over all ranks) read as the slowest rank's, beside a step time
  and a largest part that are the slowest rank's: it now says "all ranks" (nsys FastVideo:
  90.2% of both ranks' spans, rank 0 alone 91.3%, recounted from the SQLite export);
- `retime analyze` headed its output "step time mean 15.768 ms" on DLRM where the report,
  `replay` and `compare` say 18.71 ms: its mean was over every (rank, step) row, theirs the
  slowest rank's; it now leads with the slowest rank's (per step, then the mean) and names
  the mean over ranks and steps as such;
- `retime replay` of the nsys FastVideo export said "86.9% is host work ..., 16.8% is
  unexplained delay; the rest, -3.6%, is the traced ops": gaps summed over threads and
  streams that run side by side are no shares of the ranks' time; it now gives the amounts
  and says why they add up to more (the ranks' 599.7 ms recounted from the SQLite export);
- `retime report RUN --baseline OTHER` of two different jobs (8 DLRM ranks, 2 FastVideo
  ranks) compared them without the word `retime compare` gives: it now notes the rank counts;
- `retime sweep` of the 32-step Megatron trace said "best step time 55057.880 ms" and its
  report "Fastest step 55.06 s": a row holds the replayed steps end to end; they are now
  shown per step (1720.559 ms, `retime replay`'s figure for the same what-if);
- the CPU-only gloo rank's report headed its table column "GPU busy" and explained
  host-bound as "the GPU idle while the CPU works" (there is no GPU): "Busy", in CPU terms;
- `retime ingest` of DLRM's rank 0 and the V100 DDP trace's rank 1 (world sizes 8 and 2 in
  their distributedInfo, recorded a year apart) wrote one 2-rank job of world size 8: files
  of different world sizes are refused (one line, exit 2, nothing written);
- `analyze SWEEP.parquet` / `info REPORT.html` said "ingest it first (`retime ingest
  REPORT.html ...`)": a report is no trace, a sweep table goes to `retime report`.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

import pytest

from retime import load as retime_load
from retime.cli import run

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
DLRM = TRACES / "kineto" / "dlrm-v100-8rank"
MEGATRON = TRACES / "oplevel" / "megatron-ST-8rank"
GLOO = next((TRACES / "kineto" / "cpu-gloo-rank34").glob("*.json.gz"))
NSYS = TRACES / "nsys" / "h100-2gpu-fastvideo.sqlite"

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _raw_queue(folder: Path) -> tuple[int, int, dict[int, int]]:
    """GPU ops whose correlation id no runtime call of the file has; and per rank how many
    of those start before the rank's first GPU op that has one."""
    total = ns = 0
    before: dict[int, int] = {}
    for f in sorted(folder.glob("*.json.gz")):
        d = json.load(gzip.open(f))
        ev = d["traceEvents"]
        calls = {e["args"]["correlation"] for e in ev
                 if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in
                 e.get("args", {})}
        gpu = [e for e in ev if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
        orphan = [e for e in gpu if e["args"].get("correlation") not in calls]
        first = min(e["ts"] for e in gpu if e["args"].get("correlation") in calls)
        total += len(orphan)
        ns += sum(round(e["dur"] * 1000) for e in orphan)
        n = sum(1 for e in orphan if e["ts"] < first)
        if n:
            before[d["distributedInfo"]["rank"]] = n
    return total, ns, before


@pytest.fixture(scope="module")
def dlrm_whatif(tmp_path_factory):
    d = tmp_path_factory.mktemp("u8")
    assert run(["ingest", str(DLRM), "-o", str(d / "m.retime")]) == 0
    assert run(["replay", str(d / "m.retime"), "--set", "hardware.host_speedup=2",
                "-o", str(d / "w.retime")]) == 0
    return d


def test_replayed_store_says_the_recorded_queue(dlrm_whatif, capsys):
    total, ns, before = _raw_queue(DLRM)
    assert (total, before) == (128, {1: 61, 3: 64})
    q = sum(before.values())
    capsys.readouterr()
    for store in ("m.retime", "w.retime"):
        assert run(["analyze", str(dlrm_whatif / store), "--json"]) == 0
        u = json.loads(capsys.readouterr().out)["unseen"]
        assert (u["without_launch_ops"], u["queued_before_trace_ops"]) == (total, q), store
        assert u["without_launch_ns"] == ns
    assert run(["replay", str(dlrm_whatif / "m.retime"), "--set", "hardware.host_speedup=2"]) == 0
    assert f"{q} of them ran before the first launched GPU op" in capsys.readouterr().out
    out = dlrm_whatif / "r.html"
    assert run(["report", str(dlrm_whatif / "w.retime"), "--baseline",
                str(dlrm_whatif / "m.retime"), "-o", str(out)]) == 0
    assert f"{q} of them ran before the first launched GPU op" in out.read_text()


@pytest.mark.parametrize("argv", [["demo", "-o", "{f}"],
                                  ["export", "{store}", "--chakra", "{f}", "--json"]])
def test_a_file_where_an_output_folder_goes_is_named_as_in_the_way(dlrm_whatif, tmp_path,
                                                                   capsys, argv):
    """`export --chakra FILE` and `demo -o FILE` said "is a file, not a NAME.retime store;
    ingest it first": the file is the output's place, not an input to ingest."""
    f = tmp_path / "keep.json.gz"
    raw = (DLRM / "worker0_step_12.1694128201545.pt.trace.json.gz").read_bytes()
    f.write_bytes(raw)
    capsys.readouterr()
    a = [x.format(f=f, store=dlrm_whatif / "m.retime") for x in argv]
    assert run(a) == 2
    cap = capsys.readouterr()
    line = cap.err.strip()
    assert "\n" not in line and "Traceback" not in cap.err
    assert "ingest it first" not in line and "is a file" in line and "folder" in line
    assert f.read_bytes() == raw and sorted(tmp_path.iterdir()) == [f]
    if "--json" in a:
        assert json.loads(cap.out)["exit_code"] == 2


def _union(iv: list[tuple[int, int]]) -> int:
    iv = sorted(iv)
    tot, (cs, ce) = 0, iv[0]
    for a, b in iv[1:]:
        if a > ce:
            tot, cs, ce = tot + ce - cs, a, b
        else:
            ce = max(ce, b)
    return tot + ce - cs


@pytest.fixture(scope="module")
def nsys_store(tmp_path_factory):
    store = tmp_path_factory.mktemp("u8n") / "n.retime"
    assert run(["ingest", str(NSYS), "-o", str(store)]) == 0
    return store


def _nsys_spans_and_busy() -> tuple[dict[int, int], dict[int, int]]:
    """Per process: its span (first to last CUDA activity or runtime call: the trace has no
    steps, so one window per rank) and the union of its kernels, copies and memsets."""
    c = sqlite3.connect(NSYS)
    pid = "(globalPid / 16777216) % 16777216"
    busy, span = {}, {}
    for p in (144, 145):
        iv = []
        for t in ("KERNEL", "MEMCPY", "MEMSET"):
            iv += c.execute(f"SELECT start, end FROM CUPTI_ACTIVITY_KIND_{t} WHERE {pid} = ?",
                            (p,)).fetchall()
        lo, hi = c.execute("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                           "WHERE (globalTid / 16777216) % 16777216 = ?", (p,)).fetchone()
        span[p] = max(hi, max(b for _, b in iv)) - min(lo, min(a for a, _ in iv))
        busy[p] = _union(iv)
    return span, busy


def test_gpu_busy_headline_is_all_ranks_as_recounted_from_sqlite(nsys_store, tmp_path,
                                                                 capsys):
    span, busy = _nsys_spans_and_busy()
    assert (span[144], busy[144]) == (299_873_237, 273_817_787)
    assert (span[145], busy[145]) == (299_844_161, 267_275_916)
    whole = sum(busy.values()) / sum(span.values())
    assert f"{whole:.1%}" == "90.2%" and f"{busy[144] / span[144]:.1%}" == "91.3%"
    capsys.readouterr()
    assert run(["report", str(nsys_store), "-o", str(tmp_path / "n.html"), "--json"]) == 0
    head = {h["label"]: h for h in json.loads(capsys.readouterr().out)["headline"]}
    assert head["GPU busy"]["value"] == "90.2%"
    assert head["GPU busy"]["note"].endswith("all ranks")
    assert head["Step time"]["value"] == "299.9 ms" and "slowest rank (0)" in \
        head["Step time"]["note"]


def test_analyze_leads_with_the_step_time_the_report_shows(dlrm_whatif, tmp_path, capsys):
    store = dlrm_whatif / "m.retime"
    capsys.readouterr()
    assert run(["analyze", str(store), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    rows = a["breakdown"]["rows"]
    # one profiler step (ProfilerStep#10 in every raw file): the job's step is the slowest
    # rank's window; the mean over the 8 ranks' windows is another, smaller figure
    assert [j["step"] for j in a["job_steps"]] == [10] and len(rows) == 8
    slowest = max(r["step_ns"] for r in rows)
    assert a["step_time_ns"]["job_mean"] == slowest == 18_711_000
    assert a["step_time_ns"]["mean"] == sum(r["step_ns"] for r in rows) / 8 == 15_767_875
    assert run(["analyze", str(store)]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert "step time 18.711 ms (mean of 1 step(s), slowest rank each)" in head
    assert "mean over ranks and steps 15.768 ms" in head
    assert run(["report", str(store), "-o", str(tmp_path / "r.html"), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["headline"][0]["value"] == "18.71 ms"


def test_replay_gap_amounts_are_not_negative_shares(nsys_store, capsys):
    span, _ = _nsys_spans_and_busy()
    capsys.readouterr()
    assert run(["replay", str(nsys_store), "--json"]) == 0
    g = json.loads(capsys.readouterr().out)["gaps"]["total"]
    assert g["span_ns"] == sum(span.values()) == 599_717_398
    assert g["host_work_ns"] + g["unexplained_ns"] > g["span_ns"]  # threads side by side
    assert run(["replay", str(nsys_store)]) == 0
    out = capsys.readouterr().out
    assert "the rest, -" not in out and "% is host work" not in out
    assert (f"host work the profiler did not cover {g['host_work_ns'] / 1e6:.1f} ms" in out
            and f"unexplained delay {g['unexplained_ns'] / 1e6:.1f} ms" in out
            and "more than the ranks' 599.7 ms" in out)


def test_report_against_a_baseline_of_other_rank_count_says_so(dlrm_whatif, nsys_store,
                                                               tmp_path, capsys):
    n_dlrm = len({json.load(gzip.open(f))["distributedInfo"]["rank"]
                  for f in DLRM.glob("*.json.gz")})
    n_nsys = sqlite3.connect(NSYS).execute(
        "SELECT count(DISTINCT globalPid) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert (n_dlrm, n_nsys) == (8, 2)
    note = f"the runs hold {n_dlrm} and {n_nsys} ranks: check that they are the same job"
    capsys.readouterr()
    assert run(["report", str(nsys_store), "--baseline", str(dlrm_whatif / "m.retime"),
                "-o", str(tmp_path / "x.html"), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert note in rep["findings"][0]
    assert run(["compare", str(dlrm_whatif / "m.retime"), str(nsys_store)]) == 3
    assert note in capsys.readouterr().out
    # a what-if against its own measured run: same ranks, no note
    assert run(["report", str(dlrm_whatif / "w.retime"), "--baseline",
                str(dlrm_whatif / "m.retime"), "-o", str(tmp_path / "y.html"), "--json"]) == 0
    assert "same job" not in json.loads(capsys.readouterr().out)["findings"][0]


def test_sweep_of_a_multi_step_trace_shows_times_per_step(tmp_path, capsys):
    import pandas as pd
    steps = pd.read_parquet(MEGATRON / "trace-ST.parquet")["step"].nunique()
    assert steps == 32
    store = tmp_path / "st.retime"
    assert run(["ingest", str(MEGATRON), "-o", str(store)]) == 0
    grid = tmp_path / "g.toml"
    grid.write_text('[grid]\n"hardware.compute_speedup" = [1, 2]\n')
    capsys.readouterr()
    per_step = []
    for v in (1, 2):
        assert run(["replay", str(store), "--set", f"hardware.compute_speedup={v}",
                    "--json"]) == 0
        per_step.append(json.loads(capsys.readouterr().out)["step_time_ns"]["per_step"])
    out = tmp_path / "s.parquet"
    assert run(["sweep", str(store), "--grid", str(grid), "-o", str(out), "--workers",
                "1"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert f"best step time {per_step[1]['replayed'] / 1e6:.3f} ms per step ({steps} steps" \
        in line
    df = pd.read_parquet(out)  # the rows keep the windows end to end, as documented
    assert int(df["step_time_ns"].iloc[0]) / steps == pytest.approx(
        per_step[0]["measured"], abs=1)
    assert run(["report", str(out), "-o", str(tmp_path / "s.html"), "--json"]) == 0
    head = {h["label"]: h["value"] for h in json.loads(capsys.readouterr().out)["headline"]}
    assert head["Slowest step"] == "2.214 s" and head["Fastest step"] == "1.721 s"
    assert (f"{per_step[0]['measured'] / 1e9:.3f}", f"{per_step[1]['replayed'] / 1e9:.3f}") \
        == ("2.214", "1.721")


def test_cpu_only_report_says_busy_not_gpu_busy(tmp_path, capsys):
    """The step is ProfilerStep#551; inside it only the two gloo all_reduce annotations of
    the gloo threads run: their union over the step is the busy share."""
    ev = json.load(gzip.open(GLOO))["traceEvents"]
    step = next(e for e in ev if e.get("name", "").startswith("ProfilerStep#"))
    s0, s1 = step["ts"], step["ts"] + step["dur"]
    iv = [(max(e["ts"], s0), min(e["ts"] + e["dur"], s1)) for e in ev
          if e.get("ph") == "X" and e is not step and e.get("cat") != "Trace"
          and e["ts"] < s1 and e["ts"] + e["dur"] > s0]
    assert len(iv) == 2 and not any(e.get("cat") in GPU_CATS for e in ev)
    busy = _union([(round(a * 1000), round(b * 1000)) for a, b in iv]) / round(
        step["dur"] * 1000)
    store = tmp_path / "g.retime"
    assert run(["ingest", str(GLOO), "-o", str(store)]) == 0
    out = tmp_path / "g.html"
    capsys.readouterr()
    assert run(["report", str(store), "-o", str(out), "--json"]) == 0
    head = {h["label"]: h["value"] for h in json.loads(capsys.readouterr().out)["headline"]}
    assert head["Busy"] == f"{busy:.1%}" == "85.1%"
    html = out.read_text()
    assert '<th class="num">Busy</th>' in html
    assert "GPU busy" not in html and "GPU idle while" not in html
    from retime.analysis import plots
    from retime.analysis.breakdown import breakdown, summarize_breakdown
    summ = summarize_breakdown(breakdown(retime_load(store)))
    # this run has no host-bound time, and a part no rank has stays out of the legend (user
    # pass 11): give it some, to read the label the legend uses for it
    summ = summ.assign(host_bound_ns=1e6)
    for cpu, want in ((True, "host-bound (host work outside ops)"),
                      (False, "host-bound (GPU waits for CPU)")):
        fig = plots.plot_breakdown(summ, cpu_only=cpu)
        got = [t.get_text() for ax in fig.axes if ax.get_legend() for t in
               ax.get_legend().get_texts()] or fig.axes[0].get_legend_handles_labels()[1]
        assert want in got


@pytest.mark.parametrize("extra", [[], ["--in-memory"]])
def test_files_of_two_jobs_are_refused(tmp_path, capsys, extra):
    a = DLRM / "worker0_step_12.1694128201545.pt.trace.json.gz"
    b = TRACES / "kineto" / "v100-ddp-sgd" / "df_index_resolver.json.gz"
    info = [json.load(gzip.open(f))["distributedInfo"] for f in (a, b)]
    assert [(d["rank"], d["world_size"]) for d in info] == [(0, 8), (1, 2)]
    out = tmp_path / "mix.retime"
    capsys.readouterr()
    assert run(["ingest", str(a), str(b), "-o", str(out), "--json", *extra]) == 2
    cap = capsys.readouterr()
    e = json.loads(cap.out)
    assert "world size 8" in e["error"] and "world size 2" in e["error"]
    assert "one run at a time" in e["hint"] and len(cap.err.strip().splitlines()) == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name, needle", [
    ("s.parquet", "a sweep table goes to `retime report"),
    ("r.html", "a report or its table"),
])
def test_an_output_file_where_a_store_goes_is_not_sent_to_ingest(tmp_path, capsys, name,
                                                                 needle):
    f = tmp_path / name
    f.write_bytes(b"x")
    capsys.readouterr()
    assert run(["analyze", str(f), "--json"]) == 2
    cap = capsys.readouterr()
    e = json.loads(cap.out)
    assert needle in e["error"] + "; " + e["hint"]
    assert f"retime ingest {f}" not in cap.err and len(cap.err.strip().splitlines()) == 1
