"""User pass 5: figures the CLI prints against recounts of the raw traces (gzip + json,
sqlite3; no retime code in the recount)."""

from __future__ import annotations

import gzip
import html
import json
import re
from pathlib import Path

import pytest

from retime.cli import run

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
MI300X = TRACES / "kineto" / "mi300x-resnet-ddp" / "resnet_act_checkpoint.json.gz"


def _raw_events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


@pytest.fixture(scope="module")
def mi300x_store(tmp_path_factory):
    out = tmp_path_factory.mktemp("u5") / "mi300x.retime"
    assert run(["ingest", str(MI300X), "-o", str(out)]) == 0
    return out


def test_report_timeline_says_the_step_ops_it_leaves_out(mi300x_store, tmp_path, capsys):
    """On the MI300X trace the host runs ahead: ProfilerStep#15's host range ends 13.3 ms
    before the first GPU op it launched starts, so the drawn step window holds exactly the
    GPU ops launched from that range, and the page says how many of the step's ops it leaves
    out (it used to say the window ran 'from its first op on any rank to its last')."""
    ev = _raw_events(MI300X)
    rng = next(e for e in ev if e.get("name") == "ProfilerStep#15"
               and e.get("cat") == "user_annotation")
    lo, hi = rng["ts"], rng["ts"] + rng["dur"]
    corr = {e["args"]["correlation"] for e in ev if e.get("cat") == "cuda_runtime"
            and lo <= e["ts"] <= hi and "correlation" in e.get("args", {})}
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
           and e["args"].get("correlation") in corr]
    assert len(gpu) == 895 and min(e["ts"] for e in gpu) > hi  # all GPU work after the range
    out = tmp_path / "r.html"
    assert run(["report", str(mi300x_store), "-o", str(out)]) == 0
    text = html.unescape(out.read_text())
    m = re.search(r"The whole of step 15, the median of 3 steps by duration: [\d.]+ ms from the "
                  r"earliest rank's step start to the latest rank's step end;.*? ([\d,]+) of "
                  r"the drawn ranks' ([\d,]+) ops of the step ran outside this window and "
                  r"are not drawn: "
                  r"([\d,]+) before it", text)
    assert m, "timeline paragraph"
    outside, total, before = (int(g.replace(",", "")) for g in m.groups())
    assert outside == before and total - outside == len(gpu)
    assert "from its first op on any rank to its last" not in text
    # the kernel-class table runs from the largest class down; its memory row is the raw
    # trace's 550 copies and 108 memsets
    table = text[text.index("GPU time by kernel class"):].split("</table>")[0]
    rows = re.findall(r'<td class="text">([^<]+)</td><td class="num">([\d,]+)</td>'
                      r'<td class="num">([\d.]+)</td>', table)
    totals = [float(t) for _, _, t in rows]
    assert len(rows) > 5 and totals == sorted(totals, reverse=True)
    n_mem = sum(e.get("cat") in ("gpu_memcpy", "gpu_memset") for e in ev)
    assert ("memory", f"{n_mem:,}") in [(c, n) for c, n, _ in rows] and n_mem == 658


def test_launch_latency_histogram_in_the_tables_unit(mi300x_store):
    """The MI300X host runs ~28 ms ahead of its GPU (median over the raw launch/GPU op pairs);
    the histogram is in ms like the table beside it, with plain tick labels (it was in us with
    labels like 2.25x10^4)."""
    import numpy as np

    from retime.analysis.drilldown_plots import plot_launch_latency
    from retime.analysis.host import launch_latency
    from retime.collectors.trace import read_trace

    ev = _raw_events(MI300X)
    call = {e["args"]["correlation"]: e["ts"] for e in ev if e.get("cat") == "cuda_runtime"
            and "correlation" in e.get("args", {})}
    lat_us = [e["ts"] - call[e["args"]["correlation"]] for e in ev
              if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
              and e["args"].get("correlation") in call]
    assert len(lat_us) == 2685 and 27.0 < np.median(lat_us) / 1e3 < 28.5
    lat = launch_latency(read_trace(mi300x_store))
    assert len(lat) == len(lat_us)
    ax = plot_launch_latency(lat).axes[0]
    assert ax.get_xlabel() == "GPU op start - launch call start (ms, log scale)"
    ax.figure.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels(minor=True) + ax.get_xticklabels()]
    # plain labels in ms; minor ticks are labelled only where they do not crowd (user pass 11)
    assert "20" in labels and "30" in labels and not any("times" in t for t in labels)


def test_stragglers_text_says_how_many_groups_it_leaves_to_json(tmp_path, capsys):
    """Megatron's raw Parquet has 13 optypes; sends and receives fold into forward- and
    backward-pp-comm as in the published result-ST.json, so 11 op-type groups: the text shows
    8 and says 3 more are in --json (it used to drop them silently)."""
    import pandas as pd

    src = TRACES / "oplevel" / "megatron-ST-8rank"
    raw = pd.read_parquet(src / "trace-ST.parquet")["optype"].unique()
    groups = {o.replace("-send", "-pp-comm").replace("-recv", "-pp-comm") for o in raw}
    assert len(raw) == 13 and len(groups) == 11
    store = tmp_path / "m.retime"
    assert run(["ingest", str(src), "-o", str(store)]) == 0
    capsys.readouterr()
    assert run(["stragglers", str(store)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "by op type" in ln)
    shown, tail = line.split(" (and ")
    assert len(shown.split(", ")) == 8 and tail == "3 more, all of them in --json)"
    assert run(["stragglers", str(store), "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["by_optype"]) == groups


def test_dominant_finding_does_not_pin_a_mean_over_ranks_on_one_rank(tmp_path):
    """Megatron's 8 ranks have step windows within 0.1 ms of each other, so which rank is
    slowest changes from step to step; the finding's figure is the mean over each step's
    slowest rank and says so (it said 'rank 1, 1.158 s per step' while rank 1's own exposed
    communication is 1.296 s per step). The raw Parquet has 32 steps."""
    import pandas as pd

    from retime.analysis.report_findings import _dominant
    from retime.analysis.report_run import RunAnalysis
    from retime.collectors.trace import read_trace

    src = TRACES / "oplevel" / "megatron-ST-8rank"
    n_steps = pd.read_parquet(src / "trace-ST.parquet")["step"].nunique()
    assert n_steps == 32
    store = tmp_path / "m.retime"
    assert run(["ingest", str(src), "-o", str(store)]) == 0
    ra = RunAnalysis(read_trace(store))
    txt = _dominant(ra)[1]
    m = re.search(r"\(each step's slowest rank, averaged: rank (\d) in (\d+) of (\d+) steps, ",
                  txt)
    assert m, txt
    assert int(m.group(3)) == n_steps and 0 < int(m.group(2)) < n_steps
    # the per-step table shows the first 15 steps by number and says "First", not "Top"
    from retime.analysis.report_sections import per_step_table

    tb = per_step_table(ra, top=15)
    first = sorted(pd.read_parquet(src / "trace-ST.parquet")["step"].unique())[:15]
    assert [int(r[0].replace(",", "")) for r in tb.rows] == [int(x) for x in first]
    assert tb.note.startswith("First 15 of 32 steps")


def test_resynthesized_whatif_labels_its_per_rank_lines(tmp_path, capsys):
    """A what-if on a synthesized trace re-synthesizes it; the per-rank lines are the new
    trace's own times and say so (they read 'measured 2387.225 ms' beside a measured step of
    917.5 ms)."""
    store = tmp_path / "s.retime"
    assert run(["synth", "--model", "gpt3-125m", "--hardware", "a100-80gb", "--tp", "1",
                "--pp", "2", "--dp", "1", "--global-batch", "4", "--micro-batch", "1",
                "-o", str(store)]) == 0
    step_ns = json.loads((store / "meta.json").read_text())["synth"]["step_time_ns"]
    capsys.readouterr()
    assert run(["replay", str(store), "--set", "network.intra_node_gbps=20"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = next(ln for ln in out if "step time (the slowest rank's mean step)" in ln)
    assert f"measured {step_ns / 1e6:.3f} ms, what-if" in head
    ranks = [ln for ln in out if ln.startswith("  rank ")]
    assert len(ranks) == 2 and all(": re-synthesized " in ln for ln in ranks)
    assert not any(": measured " in ln for ln in ranks)
