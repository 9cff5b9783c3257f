"""Parallelism what-ifs on the real op-level Megatron trace (DP2 x PP4, 1F1B, 4 micro-batches,
32 steps): the same layout reproduces the straggler analysis' ideal step, micro-batches and
schedules move the pipeline bubble by the closed forms, DP at a fixed global batch changes
the micro-batches per pipeline, and what the trace cannot tell is refused."""

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
from retime.replay import whatif
from retime.replay.engine import simulate
from retime.replay.graph import build_graph
from retime.replay.policies import straggler_analysis
from retime.replay.policies.parallel_oplevel import oplevel_layout, oplevel_template
from retime.replay.policies.stragglers import _step_info, isolate_steps

ST = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "oplevel" / \
    "megatron-ST-8rank"
P = 4  # pipeline stages of the job


@pytest.fixture(scope="module")
def st():
    return read_oplevel(ST)


@pytest.fixture(scope="module")
def ideal_ref(st):
    return straggler_analysis(st)["step_time_s"]


def _pipe(res) -> tuple[float, int, int]:
    """(bubble over the ideal time, pipeline window, busiest rank's compute): the window runs
    from the first forward to the last backward over all ranks."""
    names = res.trace.names().astype(str)
    c = np.isin(names, ["forward-compute", "backward-compute"])
    window = int(res.end_ns[c].max() - res.start_ns[c].min())
    busy = int(np.bincount(res.trace.ops["rank"].to_numpy()[c], weights=res.dur_ns[c]).max())
    return window / busy - 1.0, window, busy


def _n(res, optype: str) -> np.ndarray:
    """Ops of an optype per rank."""
    names = res.trace.names().astype(str)
    r = res.trace.ops["rank"].to_numpy()
    return np.bincount(r[names == optype], minlength=int(r.max()) + 1)


def test_layout_is_read_from_the_trace(st):
    lay = st.meta["oplevel"]["layout"]
    assert {k: lay[k] for k in ("dp", "pp", "chunks", "microbatches", "schedule")} == \
        {"dp": 2, "pp": 4, "chunks": 1, "microbatches": 4, "schedule": "1f1b"}
    assert lay["schedule_match"] == 1.0  # every rank of every step ran Megatron's 1F1B order
    # traces ingested before the reader recorded it: detected from the ops
    st2 = read_oplevel(ST)
    del st2.meta["oplevel"]["layout"]
    got = oplevel_layout(st2)
    assert got["schedule"] == "1f1b" and got["microbatches"] == 4 and got["global_batch"] == 8
    # the program order tells the schedules apart (re-laid-out traces, layout forgotten)
    for sched, v, m in (("gpipe", 1, 4), ("interleaved", 2, 8), ("bfs", 2, 8)):
        t = whatif(st, {"parallel.schedule": sched, "parallel.chunks": v,
                        "parallel.microbatches": m}).trace
        del t.meta["oplevel"]["layout"]
        got = oplevel_layout(t)
        assert (got["schedule"], got["chunks"], got["microbatches"]) == (sched, v, m)
        assert got["schedule_match"] == 1.0


def test_same_layout_reproduces_the_ideal_step(st, ideal_ref):
    # (a) straggler-ideal durations: the re-assembled step is the straggler analysis' ideal
    # (every step is the same there) and the published step_t_noblk
    res = whatif(st, {"parallel.durations": "ideal"})
    ours = {s["ideal"] for s in ideal_ref.values()}
    assert len(ours) == 1
    assert abs(res.step_time_ns - ours.pop() * 1e9) <= 1_000  # float rounding only
    pub = json.loads((ST / "result-ST.json").read_text())["step_t_noblk"]
    assert res.step_time_ns / 1e9 == pytest.approx(np.mean(list(pub.values())), rel=1e-6)
    rl = res.meta["whatif"]["relayout"]
    assert rl["from"] == rl["to"] and rl["baseline_step_time_ns"] == res.step_time_ns
    assert res.trace.n_ops == 212  # one step: the trace has 6784 ops over 32 steps
    assert rl["measured_mean_step_time_ns"] == pytest.approx(2.2144e9, rel=1e-3)


def test_same_layout_stage_template_equals_the_measured_graph(st):
    # (a) per-stage medians: replaying the measured timeline's own dependency graph with
    # every op at its template duration gives the same step as the re-assembled layout
    tpl = oplevel_template(st, "stage")
    o = st.ops
    names = st.names().astype(str)
    stage = o["stage"].to_numpy()
    d = np.zeros(len(o))
    for group in ("compute", "p2p", "step", "dp"):
        for t, per in tpl[group].items():
            sel = names == t
            d[sel] = per[stage[sel]]  # one chunk: virtual stage = stage
    g0 = build_graph(st, ideal=True)
    sidx, steps, s0 = _step_info(st)
    r = simulate(isolate_steps(g0, sidx, s0, zero_lags=True),
                 durations_ns=np.rint(d).astype(np.int64))
    opt = names == "optimizer"
    end = np.full(len(steps), -1, np.int64)
    np.maximum.at(end, sidx[opt], r.end_ns[opt])
    graph_steps = end - s0
    assert np.ptp(graph_steps) == 0
    res = whatif(st, {"parallel.schedule": "1f1b"})
    assert abs(res.step_time_ns - int(graph_steps[0])) <= 1_000
    # the last stage (logits + loss) is the bottleneck: its compute is ~2x the others'
    f, b = tpl["compute"]["forward-compute"], tpl["compute"]["backward-compute"]
    assert f[3] / np.median(f[:3]) == pytest.approx(2.07, abs=0.05)
    # closed form with free transfers: sum_s (F_s + B_s) + (m - 1) (F_3 + B_3); the
    # measured transfers (~0.6 ms a hop) add the rest
    _, window, _ = _pipe(res)
    closed = (f + b).sum() + 3 * (f[3] + b[3])
    assert 0 <= window - closed < 0.005 * closed


@pytest.mark.parametrize("sched,v", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2),
                                     ("bfs", 2), ("interleaved", 4)])
def test_bubble_follows_the_closed_form(st, sched, v):
    # (b) uniform stages (ideal durations): bubble / ideal time = (p-1)/(v m). The closed
    # form has free transfers; Megatron's blocking ones (0.4-0.6 ms) add at most one forward
    # and one backward transfer per item on the critical path: 2 (v m + p - 1) of them
    tpl = oplevel_template(st, "ideal")
    t_p2p = max(np.nanmax(x) for x in tpl["p2p"].values())
    bub = {}
    for m in (4, 8, 16):
        res = whatif(st, {"parallel.schedule": sched, "parallel.chunks": v,
                          "parallel.microbatches": m, "parallel.durations": "ideal"})
        bub[m], window, busy = _pipe(res)
        assert _n(res, "forward-compute").tolist() == [m * v] * 8
        closed = busy * (1 + (P - 1) / (v * m))
        assert 0 <= window - closed <= 2 * (v * m + P - 1) * t_p2p, (m, window - closed)
        assert 0 <= bub[m] - (P - 1) / (v * m) < 0.025
    if v == 1:  # the change of the bubble with m is the closed form's within 0.2 %
        assert bub[4] - bub[8] == pytest.approx(3 / 4 - 3 / 8, abs=0.002)
        assert bub[8] - bub[16] == pytest.approx(3 / 8 - 3 / 16, abs=0.002)


def test_more_micro_batches_cost_the_bottleneck_stage(st):
    # (b) measured per-stage durations: each extra micro-batch adds the slowest stage's F + B
    tpl = oplevel_template(st, "stage")
    fb3 = tpl["compute"]["forward-compute"][3] + tpl["compute"]["backward-compute"][3]
    w = {m: _pipe(whatif(st, {"parallel.microbatches": m}))[1] for m in (4, 8, 16)}
    assert w[8] - w[4] == pytest.approx(4 * fb3, rel=0.005)
    assert w[16] - w[8] == pytest.approx(8 * fb3, rel=0.005)
    # interleaving halves the bubble: 2 chunks per stage at m = 4
    one = whatif(st, {"parallel.durations": "ideal"})
    inter = whatif(st, {"parallel.schedule": "interleaved", "parallel.durations": "ideal"})
    assert inter.meta["whatif"]["relayout"]["to"]["chunks"] == 2
    assert inter.meta["whatif"]["relayout"]["baseline_step_time_ns"] == one.step_time_ns
    f_b = _pipe(one)[2] / 4  # F + B of one micro-batch on a (uniform) stage
    saved = one.step_time_ns - inter.step_time_ns
    assert saved == pytest.approx((P - 1) * f_b / 2, rel=0.03)


def test_dp_at_fixed_global_batch(st):
    # (c) global batch 8 micro-batches: dp=1 -> 8 per pipeline, dp=4 -> 2
    tpl = oplevel_template(st, "stage")
    for dp, m in ((1, 8), (4, 2)):
        res = whatif(st, {"parallel.dp": dp})
        to = res.meta["whatif"]["relayout"]["to"]
        assert (to["dp"], to["microbatches"], to["global_batch"]) == (dp, m, 8)
        assert res.trace.ops["rank"].nunique() == 4 * dp
        assert _n(res, "forward-compute").tolist() == [m] * (4 * dp)
        assert _n(res, "forward-compute").sum() == 8 * 4  # global batch x stages, kept
    one = whatif(st, {"parallel.dp": 1})
    assert _n(one, "grads-reduce-scatter").sum() == 0 and _n(one, "params-all-gather").sum() == 0
    # the pipeline does not depend on DP: same window as dp=2 with 8 micro-batches
    assert _pipe(one)[1] == _pipe(whatif(st, {"parallel.microbatches": 8}))[1]
    four = whatif(st, {"parallel.dp": 4})
    names = four.trace.names().astype(str)
    stage = four.trace.ops["stage"].to_numpy()
    rs = names == "grads-reduce-scatter"
    # ring reduce-scatter (n-1)/n: 3/4 over 1/2 = 1.5x the measured time, per stage
    np.testing.assert_allclose(four.dur_ns[rs], 1.5 * tpl["dp"]["grads-reduce-scatter"][stage[rs]],
                               atol=1)
    opt = names == "optimizer"  # distributed optimizer: half the shard
    np.testing.assert_allclose(four.dur_ns[opt], 0.5 * tpl["step"]["optimizer"][stage[opt]],
                               atol=1)


def test_pipeline_degree_keeps_the_model(st):
    tpl = oplevel_template(st, "stage")
    f = tpl["compute"]["forward-compute"]
    for pp, dp in ((2, 4), (8, 1)):
        res = whatif(st, {"parallel.pp": pp, "parallel.dp": dp})
        names = res.trace.names().astype(str)
        o = res.trace.ops
        sel = (names == "forward-compute") & (o["microbatch"].to_numpy() == 0) \
            & (o["rank"].to_numpy() % dp == 0)
        got = res.dur_ns[sel][np.argsort(o["stage"].to_numpy()[sel])]
        assert len(got) == pp
        assert got.sum() == pytest.approx(f.sum(), abs=pp)  # the model's forward is kept
        # the first and last stage keep their embedding / loss work over the layers
        assert got[-1] - got[0] == pytest.approx(f[3] - f[0], abs=2)
        if pp > 2:
            assert got[-1] - got[1] == pytest.approx(f[3] - np.median(f[1:3]), abs=2)
        assert res.trace.ops["rank"].nunique() == pp * dp
    # pp=1: no pipeline transfers and no embedding all-reduce
    flat = whatif(st, {"parallel.pp": 1, "parallel.dp": 8})
    assert not np.isin(flat.trace.names().astype(str),
                       ["forward-send", "backward-recv", "embedding-grads-all-reduce"]).any()


def test_distributed_optimizer_off_and_back(st):
    # ZeRO-0: one gradient all-reduce = the measured reduce-scatter + all-gather (ring), and
    # the optimizer updates all parameters instead of 1/dp of them
    tpl = oplevel_template(st, "stage")
    off = whatif(st, {"parallel.zero": 0})
    names = off.trace.names().astype(str)
    stage = off.trace.ops["stage"].to_numpy()
    assert not np.isin(names, ["grads-reduce-scatter", "params-all-gather"]).any()
    ar = names == "separate-grads-all-reduce"
    assert ar.sum() == 8
    want = tpl["dp"]["grads-reduce-scatter"] + tpl["dp"]["params-all-gather"]
    np.testing.assert_allclose(off.dur_ns[ar], want[stage[ar]], atol=2)
    opt = names == "optimizer"
    np.testing.assert_allclose(off.dur_ns[opt], 2 * tpl["step"]["optimizer"][stage[opt]], atol=1)
    rl = off.meta["whatif"]["relayout"]
    assert (rl["from"]["zero"], rl["to"]["zero"]) == (1, 0)
    # the all-gather moves from the step start to the end; the step grows by the optimizer
    extra = off.step_time_ns - rl["baseline_step_time_ns"]
    assert extra == pytest.approx(tpl["step"]["optimizer"][0], rel=0.01)
    # and back: the ZeRO-0 trace's own template re-laid out with ZeRO-1 is the original
    back = whatif(off.to_trace(), {"parallel.zero": 1})
    assert abs(back.step_time_ns - rl["baseline_step_time_ns"]) <= 1_000


def test_relaid_out_trace_is_a_consistent_oplevel_trace(st):
    res = whatif(st, {"parallel.schedule": "interleaved", "parallel.microbatches": 8})
    assert res.meta["unexplained_delay_count"] == 0 and res.meta["edges_clamped"] == 0
    new = res.trace
    assert new.meta["source_format"] == "oplevel"
    assert new.meta["collectives"]["unmatched"] == 0
    # pipeline pairs, DP pairs per stage and chunk, embedding pairs, one world all-reduce,
    # one-member layernorm all-reduces
    n_p2p = (_n(res, "forward-send").sum() + _n(res, "backward-send").sum())
    assert new.meta["collectives"]["matched"] == n_p2p + 2 * 4 * 2 + 2 + 1 + 8
    assert whatif(new).step_time_ns == res.step_time_ns == whatif(new, ideal=True).step_time_ns
    an = straggler_analysis(new)["step_time_s"][23]
    assert an["measured"] == pytest.approx(an["simulated"], abs=1e-9)
    # straggler-ideal durations on top of a re-layout: close to the ideal template's layout
    # (the ideal of one step of per-stage medians is not the ideal of 32 measured steps)
    both = whatif(st, {"parallel.schedule": "interleaved", "parallel.microbatches": 8,
                       "stragglers.ideal_durations": True})
    ideal = whatif(st, {"parallel.schedule": "interleaved", "parallel.microbatches": 8,
                        "parallel.durations": "ideal"})
    assert both.step_time_ns == pytest.approx(ideal.step_time_ns, rel=0.01)


def test_relayout_round_trip(st):
    # 1F1B -> interleaved (8 virtual stages) -> 1F1B again, from the re-laid-out trace's own
    # template: the first / last stage extras survive the re-split, the middle stages come
    # back at their median, so the step returns within 0.5 %
    direct = whatif(st, {"parallel.schedule": "1f1b"})
    inter = whatif(st, {"parallel.schedule": "interleaved"}).to_trace()
    assert inter.meta["oplevel"]["layout"]["schedule"] == "interleaved"
    back = whatif(inter, {"parallel.schedule": "1f1b"})
    assert back.meta["whatif"]["relayout"]["from"]["chunks"] == 2
    assert back.step_time_ns == pytest.approx(direct.step_time_ns, rel=0.005)


@pytest.mark.parametrize("key,val,words", [
    ("parallel.tp", 2, "per-layer GEMMs"), ("parallel.cp", 2, "attention kernels"),
    ("parallel.sequence_parallel", True, "TP collectives"), ("parallel.fsdp", True, "per-layer"),
    ("parallel.zero", 3, "ZeRO-1"), ("parallel.micro_batch", 2, "micro-batch size"),
    ("parallel.dp", 3, "not divisible by dp=3"),
    ("parallel.schedule", "interleaved", "multiple of pp")])
def test_what_the_trace_cannot_tell_is_refused(st, key, val, words):
    kw = {key: val}
    if key == "parallel.schedule":
        kw["parallel.microbatches"] = 6
    with pytest.raises(PolicyError, match=words):
        whatif(st, kw)


def test_cli_replay_gpipe_json(st, tmp_path, capsys):
    out = tmp_path / "st.retime"
    st.save(out)
    assert run(["replay", str(out), "--set", "parallel.schedule=gpipe", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["scenario"] == [{"policy": "parallel", "schedule": "gpipe"}]
    rl = d["whatif"]["relayout"]
    assert rl["to"]["schedule"] == "gpipe" and rl["from"]["schedule"] == "1f1b"
    # GPipe and 1F1B have the same bubble; the step moves by the transfers only
    assert d["step_time_ns"]["replayed"] == rl["step_time_ns"]
    assert rl["step_time_ns"] == pytest.approx(rl["baseline_step_time_ns"], rel=0.005)
    assert len(d["per_rank"]) == 8
    # "measured" is the input's mean step (2.214 s over 32 steps), not the 32-step span
    assert d["step_time_ns"]["measured"] == rl["measured_mean_step_time_ns"]
    assert 2.0e9 < d["step_time_ns"]["measured"] < 2.5e9
    p = subprocess.run([sys.executable, "-m", "retime", "replay", str(out), "--set",
                        "parallel.tp=2", "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "per-layer GEMMs" in json.loads(p.stdout)["error"]
    assert "per-layer GEMMs" in p.stderr and len(p.stderr.strip().splitlines()) == 1
