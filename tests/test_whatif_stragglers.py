"""Straggler what-ifs: ByteDance's result-ST.json reproduced, injection, ideal replay, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from retime.cli import run
from retime.collectors.errors import PolicyError
from retime.collectors.oplevel import read_oplevel
from retime.collectors.synth import synthesize
from retime.replay import replay, whatif
from retime.replay.policies import Stragglers, straggler_analysis

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
ST = TRACES / "oplevel" / "megatron-ST-8rank"


@pytest.fixture(scope="module")
def st_trace():
    return read_oplevel(ST)


@pytest.fixture(scope="module")
def analysis(st_trace):
    return straggler_analysis(st_trace)


@pytest.fixture(scope="module")
def ref():
    return json.loads((ST / "result-ST.json").read_text())


def test_step_times_match_result_st(analysis, ref):
    st = analysis["step_time_s"]
    assert sorted(st) == sorted(int(s) for s in ref["step_t_base"])
    for s, v in st.items():
        assert v["measured"] == pytest.approx(ref["step_t_base"][str(s)], rel=1e-6)
        assert v["simulated"] == pytest.approx(ref["step_t_nodelay"][str(s)], rel=1e-5)
        assert v["ideal"] == pytest.approx(ref["step_t_noblk"][str(s)], rel=1e-5)
    assert analysis["slowdown"] == pytest.approx(ref["blocking_slowdown"], rel=1e-5)


@pytest.mark.parametrize("ours,theirs", [("by_stage", "blocking_decompose_by_stage"),
                                         ("by_dp_rank", "blocking_decompose_by_dp_rank"),
                                         ("by_optype", "blocking_decompose_by_optype")])
def test_decompositions_match_result_st(analysis, ref, ours, theirs):
    assert set(analysis[ours]) == {str(k) for k in ref[theirs]}
    for k, v in ref[theirs].items():
        assert analysis[ours][str(k)] == pytest.approx(v, rel=1e-5), (ours, k)
    # the worst group first (as published: the last stage explains most of the slowdown)
    assert list(analysis["by_stage"])[0] == "3"


def test_cli_stragglers_json(tmp_path, ref):
    out = tmp_path / "st.retime"
    assert run(["ingest", str(ST), "-o", str(out), "--json"]) == 0
    p = subprocess.run([sys.executable, "-m", "retime", "stragglers", str(out), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert {"step_time_s", "slowdown", "by_stage", "by_dp_rank", "by_optype"} <= set(d)
    assert set(d["step_time_s"]["23"]) == {"measured", "simulated", "ideal"}
    assert d["slowdown"] == pytest.approx(ref["blocking_slowdown"], rel=1e-5)
    assert run(["stragglers", str(tmp_path / "missing.retime")]) == 2


@pytest.fixture(scope="module")
def pp_job():
    return synthesize("gpt3-125m", "a100-80gb", tp=1, pp=2, dp=4, global_batch=8,
                      micro_batch=1, grad_overlap=True)


def test_injected_straggler_slows_the_job_and_ideal_durations_remove_it(pp_job):
    base = whatif(pp_job)
    slow = whatif(pp_job, {"stragglers.slow_ranks": [3], "stragglers.slowdown": 1.5})
    assert slow.step_time_ns > base.step_time_ns
    # compute on the slow rank takes 1.5x; other ranks' compute is untouched
    o = pp_job.ops
    comp = (o["kind"].to_numpy() == 0)
    r3 = comp & (o["rank"].to_numpy() == 3)
    np.testing.assert_allclose(slow.dur_ns[r3], np.rint(base.dur_ns[r3] * 1.5), atol=1)
    np.testing.assert_array_equal(slow.dur_ns[comp & ~r3], base.dur_ns[comp & ~r3])
    # a measured-like straggler among 4 replicas: the median ideal durations undo it
    assert whatif(slow.to_trace(), {"stragglers.ideal_durations": True}).step_time_ns \
        == pytest.approx(base.step_time_ns, rel=0.01)


def test_ideal_drops_unexplained_delays(st_trace):
    a = whatif(st_trace, [Stragglers(ideal=True)])
    b = replay(st_trace, ideal=True)
    np.testing.assert_array_equal(a.end_ns, b.end_ns)
    assert a.step_time_ns < replay(st_trace).step_time_ns
    assert a.meta["scenario"] == [{"policy": "stragglers", "ideal": True}]


def test_bad_straggler_values():
    with pytest.raises(PolicyError, match="go together"):
        Stragglers(slow_ranks=(1,))
    with pytest.raises(PolicyError, match="slowdown=0"):
        Stragglers(slow_ranks=(1,), slowdown=0)
    with pytest.raises(PolicyError, match=r"rank\(s\) \[99\]"):
        whatif(synthesize("gpt3-125m", "a100-80gb", dp=2, global_batch=2),
               {"stragglers.slow_ranks": [99], "stragglers.slowdown": 2.0})


def test_attribution_finds_an_injected_straggler_on_a_kernel_trace(pp_job):
    slow = whatif(pp_job, {"stragglers.slow_ranks": [5], "stragglers.slowdown": 1.5}).to_trace()
    a = straggler_analysis(slow)
    # rank 5 is stage 1, data-parallel index 1 (Megatron order: rank = stage*dp + d)
    assert list(a["by_stage"])[0] == "1" and list(a["by_dp_rank"])[0] == "1"
    assert a["by_dp_rank"]["1"] == pytest.approx(a["slowdown"], rel=1e-9)
    assert a["slowdown"] > 1.2
    assert a["by_dp_rank"]["0"] < 1.01
