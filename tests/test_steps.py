"""One definition of a step (collectors/steps.py) on every shared trace: windows that tile
each rank's timeline, add up to no more than the trace, match the step period (the host's
ProfilerStep spacing, or the GPU's own step markers where it runs behind the host) within
10%, and give the same figure for a rank in analyze, replay, report and stragglers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import KINETO, SHARED, SHARED_CASES, ingest_cached
from naive_steps import naive_windows

from retime.analysis import breakdown, summarize_breakdown
from retime.analysis.report import build_report, fmt_ns
from retime.cli import run
from retime.collectors.enums import EdgeKind, LaneKind, OpKind
from retime.collectors.steps import device_lane_mask, job_step_windows, launch_waits, step_windows
from retime.replay import build_graph, simulate
from retime.replay.policies.stragglers import straggler_analysis

CASES = SHARED_CASES


def _step_ranges(t) -> pd.DataFrame:
    """ProfilerStep#N ranges with their lane kind (host thread or GPU stream)."""
    r = t.ranges
    names = np.asarray(t.strings, dtype=object)[r["name_id"].to_numpy()] if len(r) else []
    num = pd.Series(names, dtype=object).str.extract(r"^ProfilerStep#(\d+)$")[0]
    lk = dict(zip(t.lanes["lane"].tolist(), t.lanes["lane_kind"].tolist()))
    d = pd.DataFrame({"rank": r["rank"].to_numpy(), "step": num.to_numpy(),
                      "start_ns": r["start_ns"].to_numpy(), "end_ns": r["end_ns"].to_numpy(),
                      "gpu": [lk[x] != int(LaneKind.CPU_THREAD) for x in r["lane"].tolist()]})
    return d[d["step"].notna()].astype({"step": np.int64}).sort_values("start_ns")


def _periods(t, rank: int, steps: np.ndarray) -> np.ndarray | None:
    """The step period of each of ``steps`` on ``rank``, from the trace's own step markers:
    the host's ProfilerStep spacing (the last step: its range's length), or, where the GPU
    runs behind the host (its ProfilerStep#N marker starts after the host's step N ended),
    the spacing of the GPU's markers (the last step: their mean spacing). Op-level traces
    (no markers): the spacing of the job's step starts. None without steps."""
    ps = _step_ranges(t)
    ps = ps[ps["rank"] == rank]
    host, gpu = ps[~ps["gpu"]], ps[ps["gpu"]]
    if len(host):
        host = host.set_index("step").sort_index()
        g = gpu.set_index("step").sort_index() if len(gpu) else None
        if g is not None and g["start_ns"].iloc[0] > host["end_ns"].loc[g.index[0]]:
            sp = np.diff(g["start_ns"].to_numpy())
            per = np.r_[sp, sp.mean()]
            return pd.Series(per, index=g.index).reindex(steps).to_numpy()
        per = np.r_[np.diff(host["start_ns"].to_numpy()),
                    host["end_ns"].iloc[-1] - host["start_ns"].iloc[-1]]
        return pd.Series(per, index=host.index).reindex(steps).to_numpy()
    o = t.ops
    if (steps < 0).any() or not len(steps):
        return None
    js = o.groupby("step")["start_ns"].min().sort_index()
    end = int((o["start_ns"] + o["dur_ns"]).max())
    per = np.r_[np.diff(js.to_numpy()), end - js.iloc[-1]]
    return pd.Series(per, index=js.index).reindex(steps).to_numpy()


@pytest.mark.parametrize("name", sorted(CASES))
def test_windows_tile_and_match_the_step_period(name):
    t = ingest_cached(Path(CASES[name]))
    w = step_windows(t)
    assert {(int(r), int(k)): (int(a), int(b)) for r, k, a, b in
            w[["rank", "step", "start_ns", "end_ns"]].itertuples(index=False)} == naive_windows(t)
    o, rg = t.ops, t.ranges
    for rank, ww in w.groupby("rank"):
        ww = ww.sort_values("step")
        a, b = ww["start_ns"].to_numpy(), ww["end_ns"].to_numpy()
        assert (b >= a).all() and (a[1:] == b[:-1]).all()  # they tile: no overlap, no gap
        # the rank's trace: its first to last event (ops and annotations)
        m, mr = o["rank"].to_numpy() == rank, rg["rank"].to_numpy() == rank
        lo = min(o["start_ns"].to_numpy()[m].min(), rg["start_ns"].to_numpy()[mr].min(initial=2**62))
        hi = max((o["start_ns"] + o["dur_ns"]).to_numpy()[m].max(),
                 rg["end_ns"].to_numpy()[mr].max(initial=-2**62))
        assert a[0] >= lo and b[-1] <= hi and (b - a).sum() <= hi - lo
        per = _periods(t, int(rank), ww["step"].to_numpy())
        if per is None:  # no step markers at all: one window, the whole rank
            assert len(ww) == 1 and ww["step"].iloc[0] == -1
            assert (a[0], b[0]) == (o["start_ns"].to_numpy()[m].min(),
                                    (o["start_ns"] + o["dur_ns"]).to_numpy()[m].max())
            continue
        err = (b - a) / per - 1
        assert np.abs(err).max() < 0.10, (rank, err)


def _naive_waits(t) -> np.ndarray:
    """launch_waits by a dict of (rank, correlation) -> earliest end of a runtime call."""
    o = t.ops
    dev = device_lane_mask(t)
    end = {}
    rt = o["kind"].to_numpy() == int(OpKind.RUNTIME)
    for i in np.flatnonzero(~dev & rt & (o["correlation"].to_numpy() >= 0)):
        k = (int(o["rank"].iat[i]), int(o["correlation"].iat[i]))
        end[k] = min(end.get(k, 2**62), int(o["start_ns"].iat[i] + o["dur_ns"].iat[i]))
    out = np.full(len(o), -1, np.int64)
    for i in np.flatnonzero(dev & (o["correlation"].to_numpy() >= 0)):
        k = (int(o["rank"].iat[i]), int(o["correlation"].iat[i]))
        if k in end:
            out[i] = max(int(o["start_ns"].iat[i]) - end[k], 0)
    return out


def test_launch_waits_match_a_dict_of_launches_with_any_correlation_ids():
    """The sorted-key lookup (and the general path, taken for ids past 2**40) pair each GPU
    op with the earliest-ending runtime call of its rank and correlation id, as a dict does;
    mi300x-resnet-ddp has GPU ops whose launch is not in the trace (-1)."""
    import dataclasses

    t = ingest_cached(KINETO / "mi300x-resnet-ddp")
    want = _naive_waits(t)
    got = launch_waits(t)
    assert (got == -1).any() and (got > 0).any()
    assert np.array_equal(got, want)
    o = t.ops.copy()
    c = o["correlation"].to_numpy().astype(np.int64)
    o["correlation"] = np.where(c >= 0, c + (1 << 41), c)  # past the packed key: general path
    assert np.array_equal(launch_waits(dataclasses.replace(t, ops=o)), want)


def test_a_gpu_behind_the_host_steps_at_its_own_period():
    """mi300x-resnet-ddp: the host runs 3 profiled steps in 48.7 ms, the GPU takes ~19 ms per
    step and starts them 30 ms late, after 968 ops queued before the first profiled step
    (their launches are not in the trace). Those ops belong to no step; each step's window is
    the GPU's step period, not the 49-54 ms from host start to GPU end it used to be."""
    t = ingest_cached(KINETO / "mi300x-resnet-ddp")
    o = t.ops
    lk = t.lanes.set_index("lane")["lane_kind"]
    gpu = (lk.reindex(o["lane"]).to_numpy() == int(LaneKind.GPU_STREAM))
    launched = np.zeros(len(o), bool)
    e = t.edges
    launched[e["dst"].to_numpy()[e["kind"].to_numpy() == int(EdgeKind.LAUNCH)]] = True
    backlog = gpu & ~launched
    assert backlog.sum() == 968 and (o["step"].to_numpy()[backlog] == -1).all()
    first = o["start_ns"].to_numpy()[gpu & launched].min()
    assert (o["start_ns"].to_numpy()[backlog] < first).all()
    # a launched GPU op has its launch call's step
    src = e["src"].to_numpy()[e["kind"].to_numpy() == int(EdgeKind.LAUNCH)]
    dst = e["dst"].to_numpy()[e["kind"].to_numpy() == int(EdgeKind.LAUNCH)]
    np.testing.assert_array_equal(o["step"].to_numpy()[dst], o["step"].to_numpy()[src])
    w = step_windows(t)
    ms = (w["end_ns"] - w["start_ns"]).to_numpy() / 1e6
    assert w["step"].tolist() == [15, 16, 17]
    np.testing.assert_allclose(ms, [18.98, 18.98, 18.55], atol=0.01)


def test_one_step_time_per_rank_in_every_command(tmp_path, capsys):
    """Bundled DLRM rank 1: 18.584 ms everywhere (report and replay used to say 19.876 ms,
    analyze 19.712: the rank's span vs its step's ops)."""
    t = ingest_cached(KINETO / "dlrm-v100-8rank")
    src = t.save(tmp_path / "dlrm.retime")
    ref = naive_windows(t)
    want = {r: b - a for (r, _), (a, b) in ref.items()}
    assert want[1] == 18_584_000
    assert run(["analyze", str(src), "--json"]) == 0
    an = json.loads(capsys.readouterr().out)
    assert {r["rank"]: r["mean_step_ns"] for r in an["per_rank"]} == want
    assert run(["replay", str(src), "--json"]) == 0
    rp = json.loads(capsys.readouterr().out)
    assert {r["rank"]: r["measured_step_ns"] for r in rp["per_rank"]} == want
    assert {r["rank"]: r["replayed_step_ns"] for r in rp["per_rank"]} == want
    assert rp["step_time_ns"]["measured"] == max(want.values()) == an["step_time_ns"]["max"]
    bsum = summarize_breakdown(breakdown(t)).set_index("rank")["step_ns"]
    assert bsum.to_dict() == want
    rep = build_report(t)
    assert dict(rep.summary)["Step time"] == fmt_ns(max(want.values()))
    table = next(tb for s in rep.sections for tb in s.tables
                 if tb.caption.startswith("Mean step per rank"))
    col = table.header.index("Step (ms)")
    got = {int(row[0]): float(row[col].replace(",", "")) for row in table.rows}
    assert got == pytest.approx({r: v / 1e6 for r, v in want.items()}, abs=0.0051)
    # the job's step (stragglers): from the earliest rank's start to the latest rank's end
    js = straggler_analysis(t)["step_time_s"]
    jw = job_step_windows(step_windows(t))
    assert list(js) == jw["step"].tolist() == [10]
    assert js[10]["measured"] == (jw["end_ns"] - jw["start_ns"]).iloc[0] / 1e9
    assert js[10]["measured"] * 1e9 == max(b for a, b in ref.values()) - min(
        a for a, b in ref.values())


def test_stragglers_measured_steps_are_the_job_windows_on_megatron():
    """The op-level job's steps are laid back to back: the job windows are exactly the
    published StragglerAnalysis step times' windows (first op to last optimizer end)."""
    t = ingest_cached(SHARED / "oplevel" / "megatron-ST-8rank")
    res = straggler_analysis(t)["step_time_s"]
    jw = job_step_windows(step_windows(t)).set_index("step")
    o = t.ops
    first = o.groupby("step")["start_ns"].min()
    last = (o["start_ns"] + o["dur_ns"]).groupby(o["step"]).max()
    for k, v in res.items():
        assert v["measured"] * 1e9 == pytest.approx(jw.loc[k, "end_ns"] - jw.loc[k, "start_ns"],
                                                    abs=1)
        assert jw.loc[k, "end_ns"] - jw.loc[k, "start_ns"] == last[k] - first[k]


def test_replay_windows_move_with_the_replay():
    """A what-if that slows one rank's GPU lengthens that rank's windows; the first window
    keeps its measured offset from its step's start (the backlog is earlier steps' work)."""
    t = ingest_cached(KINETO / "mi300x-resnet-ddp")
    g = build_graph(t)
    base = simulate(g)
    d = g.op_dur_ns.copy()
    sel = g.by_op(g.resource) == 1
    d[sel] = d[sel] * 2
    slow = simulate(g, durations_ns=d)
    bw, sw = base.step_windows(), slow.step_windows()
    assert (sw["replayed_ns"] > bw["replayed_ns"]).all()
    tr = slow.to_trace()  # analysis of the replayed trace uses the replay's windows
    w2 = step_windows(tr)
    np.testing.assert_array_equal(w2["start_ns"], sw["replayed_start_ns"])
    np.testing.assert_array_equal(w2["end_ns"], sw["replayed_end_ns"])
    bd = breakdown(tr)
    np.testing.assert_array_equal(bd["step_ns"], sw["replayed_ns"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_measured_times_give_the_two_pass_windows(name, monkeypatch):
    """``step_windows(t, measured start, measured end)`` (an identity replay) returns its
    first pass's windows without the second pass; that pass, forced, gives the same frame
    (every rank's first window's lead is its own)."""
    from retime.collectors import steps

    t = ingest_cached(Path(CASES[name]))
    ms = t.ops["start_ns"].to_numpy()
    me = ms + t.ops["dur_ns"].to_numpy()
    short = step_windows(t, ms.copy(), me.copy())
    with monkeypatch.context() as m:
        m.setattr(steps.np, "array_equal", lambda *a, **k: False)
        two = step_windows(t, ms.copy(), me.copy())
    pd.testing.assert_frame_equal(short, two)
