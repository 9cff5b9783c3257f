"""`retime replay`: JSON contract (DESIGN.md §6), -o writes a replayed trace that
`retime export --chrome` shows, errors exit 2 with one line."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from conftest import SHARED, ingest_cached
from naive_replay import random_trace
from naive_steps import naive_rank_totals

from retime.cli import run
from retime.collectors.trace import read_trace


def test_replay_json_identity_and_ideal(tmp_path, capsys):
    tr = ingest_cached(SHARED / "kineto" / "dlrm-v100-8rank")
    src = tr.save(tmp_path / "dlrm.retime")
    tot = naive_rank_totals(tr)  # each rank's step windows end to end (one step here)
    assert run(["replay", str(src), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"] == []
    assert out["step_time_ns"]["measured"] == out["step_time_ns"]["replayed"] == max(tot.values())
    assert [r["rank"] for r in out["per_rank"]] == list(range(8))
    assert [r["measured_ns"] for r in out["per_rank"]] == [tot[r] for r in range(8)]
    assert [r["measured_step_ns"] for r in out["per_rank"]] == [tot[r] for r in range(8)]
    assert all(r["replayed_ns"] == r["measured_ns"] for r in out["per_rank"])
    assert out["unexplained_delays"]["count"] > 0 and out["unexplained_delays"]["applied"]
    assert run(["replay", str(src), "--ideal", "--json"]) == 0
    ideal = json.loads(capsys.readouterr().out)
    assert ideal["ideal"] is True and ideal["unexplained_delays"]["applied"] is False
    assert ideal["step_time_ns"]["replayed"] <= ideal["step_time_ns"]["measured"]


def test_replay_output_trace_and_chrome_export(tmp_path, capsys):
    tr = random_trace(5, n_ranks=3)
    src = tr.save(tmp_path / "r.retime")
    out_dir = tmp_path / "ideal.retime"
    assert run(["replay", str(src), "--ideal", "-o", str(out_dir), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["output"] == str(out_dir)
    rt = read_trace(out_dir)
    assert rt.meta["replay"]["ideal"] is True
    st = rt.step_times_ns()
    assert st["span_ns"].tolist() == [r["replayed_ns"] for r in s["per_rank"]]
    chrome = tmp_path / "t.json"
    assert run(["export", str(out_dir), "--chrome", str(chrome), "--json"]) == 0
    capsys.readouterr()
    doc = json.loads(chrome.read_text())
    x = [e for e in doc["traceEvents"] if e["ph"] == "X" and "op_id" in e.get("args", {})]
    assert len(x) == rt.n_ops
    # the exported timeline is the replayed one (microseconds from baseTimeNanoseconds)
    by_id = {e["args"]["op_id"]: e for e in x}
    base = doc["baseTimeNanoseconds"]
    rs = rt.ops["start_ns"].to_numpy()
    for i in (0, rt.n_ops // 2, rt.n_ops - 1):
        assert round(by_id[i]["ts"] * 1000) + base == rs[i]
    assert not np.array_equal(rs, tr.ops["start_ns"].to_numpy())  # delays were dropped


def test_replay_human_output_and_bad_input(tmp_path, capsys):
    src = random_trace(2).save(tmp_path / "a.retime")
    assert run(["replay", str(src)]) == 0
    text = capsys.readouterr().out
    assert "rank 0" in text and "+0.00%" in text
    not_trace = tmp_path / "empty"
    not_trace.mkdir()
    assert run(["replay", str(not_trace)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a retime trace" in err[0]


def test_replay_subprocess(tmp_path):
    src = random_trace(1).save(tmp_path / "s.retime")
    p = subprocess.run([sys.executable, "-m", "retime", "replay", str(src), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["step_time_ns"]["measured"] == out["step_time_ns"]["replayed"]
    assert len(out["per_rank"]) == 3
