"""`retime report`: what the report says (headline, scenario, findings, sections that apply),
tables for people, pictures that scale, the comparison and sweep reports, the CLI contract
(in-process and as a real subprocess). Pages rendered in Chromium and poppler:
test_report_browser.py."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT, SHARED, ingest_cached

from retime.analysis import PARTS, breakdown, build_report, metrics, render_html
from retime.analysis.report_compare import waterfall_frame
from retime.analysis.report_run import RunAnalysis
from retime.analysis.tables import Column, fmt_ns, people_table, short_name, time_unit
from retime.cli import run


@pytest.fixture(scope="module")
def dlrm():
    return ingest_cached(SHARED / "kineto" / "dlrm-v100-8rank")


@pytest.fixture(scope="module")
def megatron():
    return ingest_cached(SHARED / "oplevel" / "megatron-ST-8rank")


@pytest.fixture(scope="module")
def pipeline64():
    """A modeled 64-rank pipeline run (PP4 DP16, 16 micro-batches)."""
    import retime.collectors.synth as synth
    return synth.synthesize("gpt3-1.3b", "a100-80gb", tp=1, pp=4, dp=16, global_batch=128,
                            micro_batch=1)


@pytest.fixture(scope="module")
def stores(tmp_path_factory, dlrm):
    d = tmp_path_factory.mktemp("stores")
    a = dlrm.save(d / "dlrm.retime")
    # a second run: rank 0's ops only (a different run of the same job)
    m = dlrm.ops["rank"].to_numpy() == 0
    keep = np.flatnonzero(m)
    remap = np.full(len(m), -1)
    remap[keep] = np.arange(len(keep))
    e = dlrm.edges
    em = m[e["src"].to_numpy()] & m[e["dst"].to_numpy()]
    ops = dlrm.ops[m].reset_index(drop=True)
    ops["op_id"] = np.arange(len(ops))
    edges = e[em].reset_index(drop=True)
    edges["src"] = remap[edges["src"].to_numpy()]
    edges["dst"] = remap[edges["dst"].to_numpy()]
    lanes = dlrm.lanes[dlrm.lanes["rank"] == 0].reset_index(drop=True)
    one = dataclasses.replace(dlrm, ops=ops, edges=edges, lanes=lanes,
                              ranges=dlrm.ranges[dlrm.ranges["rank"] == 0].reset_index(drop=True))
    one.validate()
    b = one.save(d / "rank0.retime")
    return d, a, b, dlrm, one


def _headers(rep) -> list[str]:
    return [h for s in rep.sections for t in s.tables for h in t.header]


# ------------------------------------------------------------------ tables for people
def test_short_names_fold_templates_and_keep_the_distinguishing_part():
    long = ("void at::native::vectorized_elementwise_kernel<4, at::native::sqrt_kernel_cuda("
            "at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#2}::"
            "operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, "
            "at::native::sqrt_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() "
            "const::{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*"
            ", 2>)")
    assert short_name(long) == "vectorized_elementwise_kernel<4, sqrt_kernel_cuda, Array<…>>"
    assert short_name("volta_sgemm_128x32_nt") == "volta_sgemm_128x32_nt"  # fits: unchanged
    cut = short_name("x" * 200)
    assert len(cut) == 64 and cut.endswith("…")


def test_people_table_units_rounding_top_n_and_csv():
    df = pd.DataFrame({"name": [f"k{i}" for i in range(40)],
                       "t": np.linspace(2e6, 40e6, 40)[::-1], "share": np.full(40, 0.025)})
    t = people_table(df, [Column("name", "Kernel", "name"), Column("t", "Total", "time"),
                          Column("share", "Share", "pct")], caption="x", top=5, what="kernels",
                     csv_name="kernels")
    assert t.header == ["Kernel", "Total (ms)", "Share"]
    assert len(t.rows) == 5 and t.rows[0] == ["k0", "40.00", "2.5%"]
    assert t.note == "Top 5 of 40 kernels; all of them in {csv}."
    assert t.csv_name == "kernels" and len(t.csv_frame) == 40
    # a table that fits is not cut and writes no CSV
    t2 = people_table(df.head(3), [Column("t", "Total", "time")], caption="y", top=5,
                      csv_name="z")
    assert t2.note == "" and t2.csv_name is None
    assert time_unit([19_876_000.0]) == ("ms", 1e6)
    assert time_unit([500.0, 8_927_000.0, 850_000.0]) == ("ms", 1e6)  # 8,927 µs reads badly


def test_report_of_a_measured_trace(dlrm):
    rep = build_report(dlrm)
    assert rep.kind == "run"
    run_ = RunAnalysis(dlrm)
    head = {k: v for k, v, _ in rep.headline}
    assert head["Step time"] == fmt_ns(metrics(dlrm)["step_ns"]) == fmt_ns(run_.step_ns)
    facts = dict(rep.facts)
    assert facts["Source"].startswith("PyTorch profiler (Kineto) trace (8 files")
    assert facts["Hardware"] == "8x Tesla V100-SXM2-32GB"
    assert facts["Ops"] == f"{dlrm.n_ops:,}"
    assert len(rep.findings) == 3 and all(re.search(r"\d", f) for f in rep.findings)
    keys = [s.key for s in rep.sections]
    assert keys[:3] == ["breakdown", "timeline", "critical_path"]
    # panels that do not apply are left out: no pipeline, no flops, no memory samples
    assert not {"pipeline", "efficiency", "memory", "comparison"} & set(keys)
    assert "communication" in keys
    # drill-downs (issue 22): launches, annotations and the shapes' roofline (V100 profile)
    assert {"host", "tree", "roofline"} <= set(keys)
    # headers are words with units, never column names
    for h in _headers(rep):
        assert "_" not in h and not h.endswith("ns"), h
    # 8 ranks: per-rank bars with a legend naming every part
    bars = next(f for s in rep.sections for f in s.figures if f.key == "breakdown")
    assert len(bars.legend) == len(PARTS) and "idle" in bars.legend


def test_critical_path_explained_adds_up_and_never_waits_negative():
    # the shared traces where the raw longest path had a negative lag on the path
    for path in (SHARED / "kineto" / "h100-vgg13" / "profiler_vgg13-iter41.json.gz",
                 SHARED / "nsys" / "h100-2gpu-fastvideo.sqlite"):
        t = ingest_cached(path)
        run_ = RunAnalysis(t)
        cp = run_.cp
        assert (cp["wait_ns"] >= 0).all() and (cp["dur_ns"] >= 0).all()
        assert int(cp["dur_ns"].sum() + cp["wait_ns"].sum()) == cp.attrs["length_ns"]
        rep = build_report(t)
        sec = next(s for s in rep.sections if s.key == "critical_path")
        parts = sec.tables[0]
        assert parts.rows[-1][0] == "whole critical path" and parts.rows[-1][2] == "100.0%"
        shares = [float(r[2].rstrip("%")) for r in parts.rows[:-1]]
        assert sum(shares) == pytest.approx(100.0, abs=0.05 * len(shares))
        assert not any("WAIT:" in r[0] or "HOST_ORDER" in r[0] for r in parts.rows)


def test_megatron_pipeline_report(megatron):
    rep = build_report(megatron)
    keys = [s.key for s in rep.sections]
    assert "pipeline" in keys
    figs = {f.key: f for s in rep.sections for f in s.figures}
    assert {"timeline", "pipeline"} <= set(figs)
    assert figs["pipeline"].legend[:2] == ["forward", "backward"]
    cp = next(s for s in rep.sections if s.key == "critical_path")
    why = cp.blocks[1]
    # the path spans all 32 steps; the report says so and gives it per step
    assert "all 32 steps" in why and "per step" in why


def test_pipeline_gantt_numbers_micro_batches(megatron):
    from retime.analysis.plots_timeline import plot_pipeline_gantt
    from retime.analysis.timeline import pipeline_blocks, typical_step
    w = typical_step(megatron)
    sr = pd.DataFrame({"stage": [0, 1, 2, 3], "rank": [0, 2, 4, 6]})
    b = pipeline_blocks(megatron, w, sr)
    # 1F1B on 4 stages with 4 micro-batches: every stage runs F and B of micro-batches 0-3
    for stage, g in b[b["microbatch"] >= 0].groupby("stage"):
        assert sorted(set(g["microbatch"])) == [0, 1, 2, 3], stage
        assert {"forward", "backward"} <= set(g["phase"]) <= {"forward", "backward", "other"}
    fig = plot_pipeline_gantt(b, {0: "s0", 1: "s1", 2: "s2", 3: "s3"}, span_ns=w.dur_ns)
    nums = [t.get_text() for t in fig.axes[0].texts]
    assert {"0", "1", "2", "3"} <= set(nums)


def test_many_ranks_fold_and_switch_to_heatmaps(pipeline64):
    rep = build_report(pipeline64)
    keys = [s.key for s in rep.sections]
    assert {"pipeline", "memory", "efficiency"} <= set(keys)
    figs = {f.key: f for s in rep.sections for f in s.figures}
    # 64 ranks: the rank x time heatmap; identical ranks folded (and said so)
    assert "rank_time" in figs and figs["rank_time"].legend
    tl = next(s for s in rep.sections if s.key == "timeline")
    assert any("Identical ranks are drawn once" in b for b in tl.blocks if isinstance(b, str))
    # every figure has a legend
    for f in figs.values():
        assert f.legend, f.key
    # HFU is never below MFU
    e = RunAnalysis(pipeline64).eff
    assert (e["hfu"] >= e["mfu"] - 1e-12).all()


def test_plots_scale_to_16384_ranks():
    from retime.analysis.plots_timeline import plot_rank_part_heatmap, plot_rank_time_heatmap
    n = 16384
    rng = np.random.default_rng(0)
    parts = rng.integers(1, 100, size=(n, len(PARTS))).astype(float)
    s = pd.DataFrame({"rank": np.arange(n), **{p: parts[:, i] for i, p in enumerate(PARTS)}})
    s["step_ns"] = parts.sum(axis=1)
    fig = plot_rank_part_heatmap(s)
    img = fig.axes[0].images[0].get_array()
    assert img.shape == (len(PARTS), 1024)  # 16 ranks averaged per column, said on the axis
    assert "16 ranks averaged per column" in fig.axes[0].get_xlabel()
    first = np.arange(0, n, 32)
    per = np.full(len(first), 32)
    act = rng.random((len(first), 240, 5))
    fig = plot_rank_time_heatmap(first, per, np.arange(241) * 10_000, act)
    assert "32 ranks per row" in fig.axes[0].get_ylabel()
    assert fig.legends and len(fig.legends[0].get_texts()) == 5


def test_hfu_never_below_mfu_on_a_modeled_run_whose_op_flops_undercount():
    import retime.collectors.synth as synth
    from retime.analysis import efficiency, job_efficiency
    # op flops of this run sum to less than the model formula: raw op sums put HFU < MFU
    t = synth.synthesize("llama3-8b", "a100-80gb", tp=2, pp=2, dp=1, global_batch=4,
                         micro_batch=1)
    assert t.meta["synth"]["hfu"] < t.meta["synth"]["mfu"]
    e = efficiency(t)
    assert (e["hfu"] >= e["mfu"]).all()
    je = job_efficiency(e)
    # no recomputation: the hardware ran exactly the model's flops
    assert je["hfu"] == pytest.approx(je["mfu"]) == pytest.approx(t.meta["synth"]["mfu"])
    # with full recompute, HFU / MFU = executed / (executed - recomputed) op flops, per rank
    t2 = synth.synthesize("gpt3-1.3b", "a100-80gb", tp=1, pp=2, dp=1, global_batch=4,
                          micro_batch=1, recompute="full")
    e2 = efficiency(t2)
    assert (e2["hfu"] / e2["mfu"]).to_numpy() == pytest.approx(
        (e2["flops"] / (e2["flops"] - e2["recompute_flops"])).to_numpy())
    assert (e2["hfu"] > e2["mfu"]).all()


# ------------------------------------------------------------------ what-ifs and comparisons
def test_whatif_report_names_the_scenario_and_puts_both_steps_side_by_side(dlrm):
    import retime.replay as replay
    w = replay.whatif(dlrm, {"hardware.host_speedup": 2.0})
    rep = build_report(w, baseline=dlrm)
    assert rep.kind == "whatif"
    head = {k: (v, note) for k, v, note in rep.headline}
    a, b = RunAnalysis(dlrm).step_ns, RunAnalysis(w).step_ns
    assert head["Measured step"][0] == fmt_ns(a)
    assert head["What-if step"][0] == fmt_ns(b)
    lo, hi = replay.prediction_range(w)
    assert lo < b < hi
    assert head["What-if step"][1] == (f"hardware.host_speedup = 2; range {fmt_ns(lo)} to "
                                       f"{fmt_ns(hi)}")
    assert head["Change"][0] == f"{(b - a) / a:+.1%}"
    assert rep.scenario[0][:2] == ("hardware.host_speedup", "2")
    assert "host (CPU) work" in rep.scenario[0][2]
    assert rep.findings[0].startswith("The what-if hardware.host_speedup = 2 shortens the step")
    assert rep.sections[0].key == "comparison"
    # after the comparison the numbers are the what-if's, and the page says where that starts
    assert rep.sections[1].key == "breakdown"
    assert rep.sections[1].blocks[0].startswith("This section and the ones after it describe "
                                                "the what-if run, not the measured one")
    # the waterfall adds up exactly: measured + changes == what-if
    wf = waterfall_frame(RunAnalysis(dlrm), RunAnalysis(w))
    assert wf.attrs["baseline_ns"] == pytest.approx(a)
    assert wf.attrs["baseline_ns"] + wf["delta_ns"].sum() == pytest.approx(b)
    # a replay without a baseline is compared with the trace it replayed
    rep2 = build_report(w)
    assert rep2.headline[0][:2] == ("Measured step", fmt_ns(a))


def test_gpu_swap_is_named():
    import retime.collectors.synth as synth
    import retime.replay as replay
    t = synth.synthesize("gpt3-1.3b", "a100-80gb", tp=1, pp=2, dp=1, global_batch=4,
                         micro_batch=1)
    w = replay.whatif(t, {"hardware.gpu": "h100-sxm"})
    rep = build_report(w, baseline=t)
    facts = dict(rep.facts)
    assert facts["GPU swapped"].startswith("NVIDIA A100") and "h100-sxm" in facts["GPU swapped"]
    assert ("hardware.gpu", "h100-sxm") == rep.scenario[0][:2]


def test_cli_report_with_baseline_json(stores, capsys):
    d, a, b, dlrm, one = stores
    out = d / "reports" / "cmp.html"
    rc = run(["report", str(a), "--baseline", str(b), "-o", str(out), "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    obj = json.loads(cap.out)
    assert obj["output"] == str(out) and obj["format"] == "html" and obj["kind"] == "comparison"
    assert obj["summary"]["Step time"] == fmt_ns(metrics(dlrm)["step_ns"])
    html = out.read_text(encoding="utf-8")
    assert 'id="comparison"' in html and 'id="fig-waterfall"' in html
    pa, pb = metrics(one)["step_ns"], metrics(dlrm)["step_ns"]
    assert f"{(pb - pa) / pa:+.1%}" in html
    assert obj["findings"][0].startswith("Against the baseline, this run")
    # only rank 0 is in both runs, and the report says so
    assert "Only 1 rank present in both runs is compared" in html


def test_cli_report_subprocess_and_tables_beside_it(stores):
    d, a, _, dlrm, _ = stores
    out = d / "run.html"
    r = subprocess.run([sys.executable, "-m", "retime", "report", str(a), "-o", str(out),
                        "--json", "--top", "5"], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert obj["format"] == "html" and obj["bytes"] == out.stat().st_size
    html = out.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>")
    # the kernel table shows 5 rows and links the whole table, written beside the report
    csv = d / "run-tables" / "kernels.csv"
    assert 'href="run-tables/kernels.csv"' in html
    ks = pd.read_csv(csv)
    from retime.analysis import kernel_stats
    assert len(ks) == len(kernel_stats(dlrm))


def test_cli_report_bad_input(stores, capsys):
    d, a, _, _, _ = stores
    rc = run(["report", str(a), "-o", str(d / "x.docx")])
    assert rc == 2 and "must end in .html or .pdf" in capsys.readouterr().err
    rc = run(["report", str(d / "nope.retime"), "-o", str(d / "x.html")])
    assert rc == 2
    assert not (d / "x.html").exists()
    (d / "notes.txt").write_text("hi")
    rc = run(["report", str(d / "notes.txt"), "-o", str(d / "y.html")])
    assert rc == 2 and "SWEEP.parquet" in capsys.readouterr().err


def test_identity_replay_report_against_its_trace(dlrm):
    import retime.replay as replay
    r = replay.replay(dlrm)
    bd = breakdown(r)
    assert (bd[list(PARTS)].sum(axis=1) == bd["step_ns"]).all()
    assert (bd["step_ns"].to_numpy() == breakdown(dlrm)["step_ns"].to_numpy()).all()
    rep = build_report(r, baseline=dlrm)
    head = {k: v for k, v, _ in rep.headline}
    assert head["Change"] == "+0.0%"
    assert rep.findings[0].startswith("The replay leaves the step unchanged")
    assert "Replayed step" in head


# ------------------------------------------------------------------ verdicts for CI
def _scaled(t, f: float):
    ops = t.ops.copy()
    ops["dur_ns"] = (ops["dur_ns"] * f).round().astype(np.int64)
    starts = ops.groupby("rank")["start_ns"].transform("min")
    ops["start_ns"] = (starts + (ops["start_ns"] - starts) * f).round().astype(np.int64)
    return dataclasses.replace(t, ops=ops)


def test_verdict_regression_improvement_and_noise(megatron):
    from retime.analysis import verdict
    from retime.analysis.compare import step_times
    same = verdict(megatron, megatron, threshold=0.05)
    assert same["status"] == "unchanged" and same["change"] == 0.0
    st = step_times(megatron)
    spread = np.std(st, ddof=1) / st.mean()
    assert same["spread"] == pytest.approx(spread)
    # |change| = 0, threshold 5%, noise = spread * mean * sqrt(2 / 32): confidence that the
    # true change is within the threshold
    from math import erf, sqrt
    z = 0.05 / (spread * sqrt(2 / len(st)))
    assert same["confidence"] == pytest.approx(erf(z / sqrt(2)), rel=1e-6)
    slow = _scaled(megatron, 1.10)
    v = verdict(megatron, slow, threshold=0.05)
    assert v["status"] == "regression" and v["change"] == pytest.approx(0.10, abs=0.005)
    assert v["line"].startswith("REGRESSION: step time +10.0%")
    assert verdict(megatron, _scaled(megatron, 0.9))["status"] == "improvement"
    # one step per run: no spread, confidence unknown, said in the line
    dl = ingest_cached(SHARED / "kineto" / "dlrm-v100-8rank")
    u = verdict(dl, dl)
    assert u["confidence"] is None and "confidence unknown" in u["line"]


def test_cli_compare_exit_codes(tmp_path, megatron, capsys):
    a = megatron.save(tmp_path / "a.retime")
    b = _scaled(megatron, 1.10).save(tmp_path / "b.retime")
    assert run(["compare", str(a), str(b), "--threshold", "5%"]) == 3
    line = capsys.readouterr().out.strip()
    assert line.startswith("REGRESSION") and len(line.splitlines()) == 1
    assert run(["compare", str(a), str(b), "--threshold", "15%", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["status"] == "unchanged" and obj["exit_code"] == 0
    assert run(["compare", str(a), str(b), "--threshold", "lots"]) == 2
    assert "give a percentage" in capsys.readouterr().err
    r = subprocess.run([sys.executable, "-m", "retime", "compare", str(a), str(b), "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 3 and json.loads(r.stdout)["exit_code"] == 3


# ------------------------------------------------------------------ sweeps
def test_sweep_report_pareto_and_sensitivity(tmp_path, capsys):
    import retime.collectors.synth as synth
    from retime.cmd_sweep import write_sweep
    from retime.replay.sweep import sweep
    t = synth.synthesize("gpt3-1.3b", "a100-80gb", tp=1, pp=2, dp=2, global_batch=8,
                         micro_batch=1)
    grid = [{"cache.recompute": r, "network.inter_node_gbps": g}
            for r in ("none", "full") for g in (12.5, 50.0)]
    df = sweep(t, grid, workers=1)
    p = tmp_path / "sw.parquet"
    write_sweep(df, p)
    out = tmp_path / "sw.html"
    assert run(["report", str(p), "-o", str(out), "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["kind"] == "sweep"
    html = out.read_text(encoding="utf-8")
    assert 'id="sensitivity"' in html and 'id="pareto"' in html
    best = df.loc[df["step_time_ns"].astype("int64").idxmin()]
    assert fmt_ns(best["step_time_ns"]) in obj["headline"][1]["value"]
    # recompute changes the step more than the network here, and the report ranks it first
    from retime.analysis.sweep_plots import sensitivity
    sens = sensitivity(df, ["cache.recompute", "network.inter_node_gbps"])
    assert sens["key"].iloc[0] in obj["findings"][1]
    # the facts name the metrics in words, not by their Parquet column names
    assert "Step time" in html and "step_time_ns" not in html
    assert "4 scenarios over 2 keys" in html and "(s)" not in html


def test_render_html_escapes_names(dlrm):
    strings = list(dlrm.strings)
    strings[0] = "<script>alert(1)</script>"
    t = dataclasses.replace(dlrm, strings=strings)
    html = render_html(build_report(t))
    assert "<script>alert(1)</script>" not in html


def test_cpu_only_trace_is_not_described_as_a_gpu():
    """A gloo (CPU-only) capture: its CPU ops stand for the device in the breakdown, so the
    headline says "Busy", the dominant part is CPU compute, and no "top kernel" finding (the
    only kernel-like ops are its collectives, 100% of nothing)."""
    import retime

    root = Path(__file__).resolve().parents[1]
    t = retime.load(str(root / "traces" / "pairs" / "mlp-bucket" / "B"))
    rep = build_report(t)
    labels = [label for label, _v, _n in rep.headline]
    assert "GPU busy" not in labels and "Busy" in labels
    assert not any("GPU" in f for f in rep.findings), rep.findings
    assert not any(f.startswith("The top kernel") for f in rep.findings)
    # Python time outside every op is host work (43.8 of 60.7 ms on rank 0's first step),
    # not "nothing runs": the verdict says so in CPU terms
    assert rep.findings[0].startswith("The job is host-bound") and \
        "the CPU runs Python and framework code outside every operator" in rep.findings[0]


def _axis_labels(rep, key: str) -> tuple[str, str]:
    fig = next(f for s in rep.sections for f in s.figures if f.key == key).figure
    return fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel()


def test_single_rank_wording_and_no_stragglers_section(stores):
    """One rank: the critical path "stays on rank 0" (no "1 rank(s)", no "1 times"), and
    no stragglers what-if (an op's ideal is its median over ranks: all +0.0% on one rank)."""
    one = stores[4]
    rep = build_report(one)
    keys = [s.key for s in rep.sections]
    assert "stragglers" not in keys
    cp = next(s for s in rep.sections if s.key == "critical_path")
    text = " ".join(b for b in cp.blocks if isinstance(b, str))
    assert "stays on rank 0" in text
    assert "rank(s)" not in text and "pair(s)" not in text and " 1 times" not in text
    assert not any("rank(s)" in f for f in rep.findings), rep.findings
    # counts read as words: "Means over 1 step.", never "1 step(s)" anywhere in the prose
    prose = [b for s in rep.sections for b in s.blocks if isinstance(b, str)] + rep.findings
    prose += [f.caption for s in rep.sections for f in s.figures]
    assert not [p for p in prose if "(s)" in p or "(es)" in p], prose
    assert any("Means over 1 step." in p for p in prose)
    # a step-marked trace: the axes read from the step start, per mean step
    assert _axis_labels(rep, "timeline")[0].startswith("time from the step start")
    assert _axis_labels(rep, "breakdown")[1] == "mean step time (ms)"


def test_trace_without_step_markers_is_not_drawn_as_a_step(stores):
    """No step markers: the whole trace is one window, and the plots say so (the timeline's
    axis runs from the trace start, the bars are the whole trace, not a mean step)."""
    one = stores[4]
    ops = one.ops.assign(step=np.int64(-1) * np.ones(len(one.ops), np.int64))
    t = dataclasses.replace(one, ops=ops, ranges=one.ranges.iloc[:0])
    rep = build_report(t)
    assert _axis_labels(rep, "timeline")[0].startswith("time from the trace start")
    assert _axis_labels(rep, "breakdown")[1] == "whole trace (ms)"
    cap = next(f for s in rep.sections for f in s.figures if f.key == "timeline").caption
    assert "((" not in cap and ") (" not in cap and "(s)" not in cap, cap
    titles = {s.key: s.title for s in rep.sections}
    assert titles["timeline"] == "The whole trace on the timeline"
    assert titles["breakdown"] == "Where the time goes"


def test_one_gpu_several_steps_per_step_table_names_no_slowest_rank():
    """A single-H200 trace of 3 steps (CUDA graphs): the per-step table has no "Slowest rank"
    column (always 0 on one rank) and its caption no "slowest rank's window"."""
    t = ingest_cached(ROOT / "traces" / "gpu_pairs" / "g1" / "tiny-graph" /
                      "rep1.pt.trace.json.gz")
    rep = build_report(t)
    tab = next(tb for s in rep.sections for tb in s.tables if tb.caption.startswith("Each step"))
    assert tab.caption == "Each step" and "Slowest rank" not in tab.header
    captions = [tb.caption for s in rep.sections for tb in s.tables]
    assert "Mean step, split into its parts" in captions
    assert not any("slowest first" in c for c in captions), captions
    assert len(tab.rows) == 3
    assert "stragglers" not in [s.key for s in rep.sections]
