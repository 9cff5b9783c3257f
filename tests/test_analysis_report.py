"""`retime report`: HTML content, baseline comparison, CLI contract (in-process and as a real
subprocess). The PDF is rendered and checked in test_report_browser.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, SHARED, ingest_cached
from retime.analysis import build_report, compare, metrics, render_html
from retime.analysis.report import fmt_ns

from retime.cli import run


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("stores")
    dlrm = ingest_cached(SHARED / "kineto" / "dlrm-v100-8rank")
    a = dlrm.save(d / "dlrm.retime")
    # a second run: rank 0's ops only (a different run of the same job)
    import dataclasses

    import numpy as np
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


def test_report_structure_summary_first(stores):
    _, _, _, dlrm, _ = stores
    rep = build_report(dlrm)
    keys = [k for k, _ in rep.summary]
    assert keys[:4] == ["Step time", "MFU", "HFU", "Dominant part"]
    assert dict(rep.summary)["Step time"] == fmt_ns(metrics(dlrm)["step_ns"])
    assert len(rep.findings) == 3
    assert all(any(ch.isdigit() for ch in f) for f in rep.findings)  # stated with numbers
    html = render_html(rep)
    assert html.index('id="summary"') < html.index('class="report-section"')
    titles = [s.title for s in rep.sections]
    assert titles == ["Step time breakdown", "Kernels", "Critical path", "Communication",
                      "Pipeline, memory and efficiency", "Stragglers (what-if)"]
    assert html.count("data:image/png;base64,") == sum(len(s.figures) for s in rep.sections)


def test_cli_report_html_with_baseline_json(stores, capsys):
    d, a, b, dlrm, one = stores
    out = d / "reports" / "cmp.html"
    rc = run(["report", str(a), "--baseline", str(b), "-o", str(out), "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    obj = json.loads(cap.out)
    assert obj["output"] == str(out) and obj["format"] == "html"
    assert obj["summary"]["Step time"] == fmt_ns(metrics(dlrm)["step_ns"])
    html = out.read_text(encoding="utf-8")
    assert "Comparison with the baseline" in html
    cmp = compare(one, dlrm).set_index("metric")
    pct = cmp.loc["step_ns", "delta_pct"]
    assert f"{pct:+.1f}%" in html
    assert any("baseline" in f for f in obj["findings"])


def test_cli_report_subprocess(stores):
    d, _, b, _, one = stores
    out = d / "run.html"
    r = subprocess.run([sys.executable, "-m", "retime", "report", str(b), "-o", str(out),
                        "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert obj["format"] == "html"
    assert obj["summary"]["Step time"] == fmt_ns(metrics(one)["step_ns"])
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert obj["bytes"] == out.stat().st_size


def test_cli_report_bad_suffix_and_missing_input(stores, capsys):
    d, a, _, _, _ = stores
    rc = run(["report", str(a), "-o", str(d / "x.docx")])
    err = capsys.readouterr().err
    assert rc == 2 and "must end in .html or .pdf" in err
    rc = run(["report", str(d / "nope.retime"), "-o", str(d / "x.html")])
    assert rc == 2
    assert not (d / "x.html").exists()


def test_report_of_a_replay_against_its_trace(stores):
    import retime.replay as replay
    _, _, _, dlrm, _ = stores
    r = replay.replay(dlrm)
    from retime.analysis import PARTS, breakdown, critical_path
    bd = breakdown(r)
    assert (bd[list(PARTS)].sum(axis=1) == bd["step_ns"]).all()
    # identity replay: the same per-rank step times as measured
    assert (bd["step_ns"].to_numpy() == breakdown(dlrm)["step_ns"].to_numpy()).all()
    assert critical_path(r).attrs["source"] == "replay"
    rep = build_report(r, baseline=dlrm)
    assert rep.sections[-1].title == "Comparison with the baseline"
    cmp = compare(dlrm, r).set_index("metric")
    assert cmp.loc["step_ns", "delta"] == 0
    assert "+0.0%" in rep.findings[-1]


def test_stragglers_tidy_view_matches_the_replay_analysis(stores):
    import retime.replay.policies.stragglers as strag_mod
    from retime.analysis import stragglers
    _, _, _, dlrm, _ = stores
    df = stragglers(dlrm)
    ref = strag_mod.straggler_analysis(dlrm)
    ov = df[df["group"] == "overall"].iloc[0]
    assert ov["slowdown"] == pytest.approx(ref["slowdown"])
    dp = df[df["group"] == "dp_rank"].set_index("key")["slowdown"].to_dict()
    assert dp == pytest.approx({str(k): v for k, v in ref["by_dp_rank"].items()})
    assert (df["cost_pct"] == 100 * (df["slowdown"] - 1)).all()
