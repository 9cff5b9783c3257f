"""Megatron step times recounted from the raw Parquet by bench/recount_steps.py (no retime
code): `retime stragglers`' measured step is the job's window and equals result-ST.json's
step_t_base; `analyze`/`report`'s per-step figure is the slowest rank's own window (step 23:
2.3817 s against 2.3764 s, both right by their definitions), and the CLI says which is which."""

from __future__ import annotations

import importlib.util
import json

import pytest
from conftest import ROOT, SHARED

from retime.cli import run
from retime.collectors.oplevel import read_oplevel
from retime.collectors.steps import step_windows
from retime.replay.policies import straggler_analysis

ST = SHARED / "oplevel" / "megatron-ST-8rank"


@pytest.fixture(scope="module")
def recount():
    spec = importlib.util.spec_from_file_location("recount_steps", ROOT / "bench" / "recount_steps.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.recount(ST / "trace-ST.parquet")


@pytest.fixture(scope="module")
def trace():
    return read_oplevel(ST)


def test_recount_job_window_is_the_published_step_time(recount):
    ref = json.loads((ST / "result-ST.json").read_text())["step_t_base"]
    assert sorted(map(int, ref)) == sorted(recount)
    for s, v in recount.items():
        assert v["job"] == pytest.approx(ref[str(s)], rel=1e-7)
        assert v["job_optimizer"] == pytest.approx(v["job"], rel=1e-9)
    assert recount[23]["job"] == pytest.approx(2.381652, abs=1e-6)
    assert recount[23]["slowest_rank"] == pytest.approx(2.376426, abs=1e-6)
    assert recount[23]["slowest_rank_id"] == 3


def test_ours_match_the_recount_by_definition(recount, trace):
    res = straggler_analysis(trace)
    w = step_windows(trace)  # what analyze and report print per rank and step
    w["d"] = (w["end_ns"] - w["start_ns"]) / 1e9
    own = w.groupby("step")["d"].max()
    for s, v in recount.items():
        assert res["step_time_s"][s]["measured"] == pytest.approx(v["job"], abs=2e-9)
    # the first step's per-rank window is the rank's own first start to last end (later
    # windows tile from the rank's end of the step before: collectors/steps.py)
    assert own[23] == pytest.approx(recount[23]["slowest_rank"], abs=2e-9)
    assert own[23] < res["step_time_s"][23]["measured"] - 5e-3


def test_stragglers_says_which_window(trace, tmp_path, capsys):
    trace.save(tmp_path / "m.retime")
    assert run(["stragglers", str(tmp_path / "m.retime")]) == 0
    out = capsys.readouterr().out
    assert "longest: step 23, 2.3817 s" in out and "each rank's own window" in out
