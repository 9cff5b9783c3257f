"""Sweeps: grid files, row metrics against plain-Python references, serial vs local workers,
a worker killed mid-sweep, Ctrl-C keeping finished rows (replay/sweep.py)."""

from __future__ import annotations

import _thread
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from naive_steps import naive_rank_totals

from retime.collectors.errors import PolicyError
from retime.collectors.ingest import read
from retime.replay import build_graph, simulate
from retime.replay.graph_data import RES_COMM, RES_COMPUTE
from retime.replay.sweep import (
    METRICS,
    SweepInterrupted,
    grid_scenarios,
    read_grid,
    scenario_metrics,
    sweep,
)

ROOT = Path(__file__).resolve().parents[1]
DLRM = ROOT.parent / "shared" / "traces" / "kineto" / "dlrm-v100-8rank"

_GRAPHS: dict = {}


def scale_run(trace, scenario):
    """Stand-in scenario for the machinery tests: divide compute durations by
    ``hardware.compute_speedup`` and communication durations by ``network.comm_speedup``.
    ``test.kill_once`` = a marker path: the worker running it SIGKILLs itself the first time.
    ``test.fail`` raises; ``test.sleep_s`` sleeps."""
    if scenario.get("test.kill_once"):
        marker = Path(scenario["test.kill_once"])
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
    if scenario.get("test.kill_always"):
        os.kill(os.getpid(), signal.SIGKILL)
    if scenario.get("test.fail"):
        raise ValueError(f"scenario asked to fail: {scenario['test.fail']}")
    if scenario.get("test.sleep_s"):
        time.sleep(float(scenario["test.sleep_s"]))
    if scenario.get("test.done_dir"):  # a file per finished scenario, for the Ctrl-C test
        (Path(scenario["test.done_dir"]) / f"{os.getpid()}-{time.monotonic_ns()}").touch()
    g = _GRAPHS.get(id(trace))
    if g is None or g.trace is not trace:
        g = _GRAPHS[id(trace)] = build_graph(trace)
    d = g.op_dur_ns.astype(np.float64)  # op-id order, as simulate takes them
    res = g.by_op(g.resource)
    d[res == RES_COMPUTE] /= float(scenario.get("hardware.compute_speedup", 1.0))
    d[res == RES_COMM] /= float(scenario.get("network.comm_speedup", 1.0))
    return simulate(g, durations_ns=np.round(d).astype(np.int64),
                    scenario=[dict(scenario)])


@pytest.fixture(scope="module")
def dlrm():
    return read(DLRM)


GRID = [{"hardware.compute_speedup": c, "network.comm_speedup": m}
        for c in (0.5, 1.0, 2.0) for m in (1.0, 4.0)]


# ------------------------------------------------------------------ grid files
def test_grid_quoted_and_nested_keys_give_the_same_product(tmp_path):
    a = tmp_path / "a.toml"
    a.write_text('[grid]\n"network.inter_node_gbps" = [12.5, 25, 50]\n'
                 '"overlap.mode" = ["serial", "async"]\n')
    b = tmp_path / "b.toml"
    b.write_text('[grid.network]\ninter_node_gbps = [12.5, 25, 50]\n'
                 '[grid.overlap]\nmode = ["serial", "async"]\n')
    sa, sb = read_grid(a), read_grid(b)
    assert sa == sb
    assert len(sa) == 6
    # first key varies slowest
    assert [s["network.inter_node_gbps"] for s in sa] == [12.5, 12.5, 25, 25, 50, 50]
    assert [s["overlap.mode"] for s in sa] == ["serial", "async"] * 3


def test_grid_and_listed_scenarios(tmp_path):
    f = tmp_path / "g.toml"
    f.write_text('[grid]\n"hardware.compute_speedup" = [1, 2]\n"network.latency_us" = 5\n'
                 '[[scenario]]\nname = "fast net"\n"network.inter_node_gbps" = 400\n'
                 '[[scenario]]\n[scenario.parallel]\ntp = 4\npp = 2\n')
    s = read_grid(f)
    assert s == [{"hardware.compute_speedup": 1, "network.latency_us": 5},
                 {"hardware.compute_speedup": 2, "network.latency_us": 5},
                 {"name": "fast net", "network.inter_node_gbps": 400},
                 {"parallel.tp": 4, "parallel.pp": 2}]


@pytest.mark.parametrize("doc, needle", [
    ({"grid": {"network.inter_node_gbps": []}}, "empty list"),
    ({"grid": {"bandwidth": [1, 2]}}, "dotted policy.field"),
    ({"grids": {"a.b": [1]}}, "unknown table"),
    ({"scenario": [{"a.b": [1, 2]}]}, "one value per key"),
    ({}, "no scenarios"),
])
def test_bad_grids_raise_policy_error(doc, needle):
    with pytest.raises(PolicyError, match=needle):
        grid_scenarios(doc)


def test_bad_toml_names_the_file(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[grid\n")
    with pytest.raises(PolicyError, match="bad.toml: invalid TOML"):
        read_grid(f)


# ------------------------------------------------------------------ metrics
def _naive_union(iv):
    tot, cur_s, cur_e = 0, None, None
    for s, e in sorted(iv):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                tot += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return tot + (cur_e - cur_s if cur_e is not None else 0)


@pytest.mark.parametrize("sc", [{}, {"hardware.compute_speedup": 3.0},
                                {"network.comm_speedup": 0.25}])
def test_metrics_match_plain_python(dlrm, sc):
    res = scale_run(dlrm, sc)
    m = scenario_metrics(res)
    g = res.graph
    s, e = res.start_ns.tolist(), res.end_ns.tolist()
    resource = g.by_op(g.resource).tolist()
    per_rank = {}
    for i, r in enumerate(g.rank.tolist()):
        d = per_rank.setdefault(r, {"lo": s[i], "hi": e[i], "x": [], "cx": []})
        d["lo"], d["hi"] = min(d["lo"], s[i]), max(d["hi"], e[i])
        if resource[i] == RES_COMPUTE:
            d["x"].append((s[i], e[i]))
        if resource[i] in (RES_COMPUTE, RES_COMM):
            d["cx"].append((s[i], e[i]))
    # the step time is the longest rank's step windows end to end (collectors.steps): here
    # one profiler step, which leaves out the ops before and after it
    assert m["step_time_ns"] == res.step_time_ns == int(res.step_times()["replayed_ns"].max())
    assert m["step_time_ns"] < max(d["hi"] - d["lo"] for d in per_rank.values())
    if not sc:
        assert m["step_time_ns"] == max(naive_rank_totals(dlrm).values())
    exposed = max(_naive_union(d["cx"]) - _naive_union(d["x"]) for d in per_rank.values())
    assert m["exposed_comm_ns"] == exposed
    assert exposed > 0  # DLRM's all_to_all / all_reduce are partly exposed
    bub = np.mean([1 - _naive_union(d["x"]) / (d["hi"] - d["lo"])
                   for d in per_rank.values() if d["x"]])
    assert m["bubble_fraction"] == pytest.approx(bub, rel=1e-12)
    # the trace records no tokens, no model flops, no memory samples: unknown, not guessed
    assert np.isnan(m["tokens_per_s"]) and np.isnan(m["mfu"])
    assert m["peak_memory_bytes"] is None and m["oom"] is None


def test_metrics_of_a_modeled_run_reproduce_synth():
    from retime.collectors.synth import synthesize

    t = synthesize("gpt3-125m", "a100-80gb", tp=2, pp=2, dp=2, global_batch=16,
                   micro_batch=2)
    syn = t.meta["synth"]
    m = scenario_metrics(simulate(build_graph(t)))
    assert m["step_time_ns"] == syn["step_time_ns"]  # identity replay of the modeled step
    assert m["tokens_per_s"] == pytest.approx(syn["tokens_per_s"], rel=1e-9)
    assert m["mfu"] == pytest.approx(syn["mfu"], rel=1e-9)
    assert m["peak_memory_bytes"] == syn["peak_memory_bytes"]
    assert m["oom"] is False
    assert 0 < m["bubble_fraction"] < 1


# ------------------------------------------------------------------ execution
@pytest.fixture(scope="module")
def serial(dlrm):
    return sweep(dlrm, GRID, run=scale_run, workers=1)


def test_serial_rows(dlrm, serial):
    assert list(serial.columns) == ["scenario_id", "hardware.compute_speedup",
                                    "network.comm_speedup", *METRICS, "error"]
    assert serial["scenario_id"].tolist() == list(range(len(GRID)))
    assert serial["error"].isna().all()
    ident = serial[(serial["hardware.compute_speedup"] == 1.0)
                   & (serial["network.comm_speedup"] == 1.0)]
    assert ident["step_time_ns"].item() == simulate(build_graph(dlrm)).step_time_ns
    # faster compute never makes the step longer (fixed comm)
    for mval in (1.0, 4.0):
        st = serial[serial["network.comm_speedup"] == mval].sort_values(
            "hardware.compute_speedup")["step_time_ns"].tolist()
        assert st == sorted(st, reverse=True)


def test_failed_scenario_is_a_row(dlrm):
    scs = [{"hardware.compute_speedup": 2.0}, {"test.fail": "bad"},
           {"hardware.compute_speedup": 1.0}]
    df = sweep(dlrm, scs, run=scale_run, workers=1)
    assert len(df) == 3
    assert df.loc[1, "error"] == "ValueError: scenario asked to fail: bad"
    assert all(pd.isna(df.loc[1, m]) for m in METRICS)
    assert df.loc[[0, 2], "error"].isna().all()
    assert df.loc[2, "step_time_ns"] == simulate(build_graph(dlrm)).step_time_ns


def test_local_workers_equal_serial(dlrm, serial, tmp_path):
    par = sweep(dlrm, GRID, run=scale_run, workers=2)
    pd.testing.assert_frame_equal(par, serial)


def _payload_files() -> set[Path]:
    """The pickled traces local sweeps hand their workers (replay.sweep._write_payload)."""
    import tempfile
    return {p for d in ("/dev/shm", tempfile.gettempdir()) if os.path.isdir(d)
            for p in Path(d).glob("retime-sweep-*.pkl")}


def test_local_worker_killed_mid_sweep(dlrm, serial, tmp_path):
    marker = tmp_path / "killed"
    scs = [dict(s) for s in GRID]
    scs[3]["test.kill_once"] = str(marker)
    scs.append({"test.kill_always": True})
    before = _payload_files()
    df = sweep(dlrm, scs, run=scale_run, workers=2)
    assert _payload_files() == before  # the replacement worker read it; then removed
    assert marker.exists()  # a worker really died
    assert df["scenario_id"].tolist() == list(range(len(scs)))  # none lost, none twice
    pd.testing.assert_frame_equal(
        df.iloc[:len(GRID)][serial.columns.drop("error")].reset_index(drop=True),
        serial[serial.columns.drop("error")])
    assert df["error"].iloc[:len(GRID)].isna().all()
    assert df["error"].iloc[-1].startswith("WorkerDied: the worker process died twice")


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_keeps_finished_rows(dlrm, workers, tmp_path):
    scs = [{"hardware.compute_speedup": 1.0 + i, "test.sleep_s": 0.2,
            "test.done_dir": str(tmp_path)} for i in range(40)]
    stop = threading.Event()

    def ctrl_c_after_three_rows():
        while not stop.is_set():
            if len(list(tmp_path.iterdir())) >= 3:
                _thread.interrupt_main()  # what Ctrl-C does to the main thread
                return
            time.sleep(0.02)

    th = threading.Thread(target=ctrl_c_after_three_rows, daemon=True)
    before = _payload_files()
    th.start()
    try:
        with pytest.raises(SweepInterrupted) as ei:
            sweep(dlrm, scs, run=scale_run, workers=workers)
    finally:
        stop.set()
        th.join()
    assert _payload_files() == before
    df = ei.value.frame
    assert 0 < len(df) < len(scs)
    assert df["scenario_id"].is_unique
    assert df["error"].isna().all() and df["step_time_ns"].notna().all()
    assert ei.value.total == len(scs)


def test_work_order_groups_resynthesizing_settings_and_rows_keep_input_order():
    from retime.replay.sweep import _work_order
    scs = [{"hardware.compute_speedup": c, "network.inter_node_gbps": b}
           for c in (1.0, 2.0, 3.0) for b in (10.0, 20.0)]
    order = _work_order(scs)
    assert sorted(order) == list(range(len(scs)))
    nets = [scs[i]["network.inter_node_gbps"] for i in order]
    assert nets == [10.0, 10.0, 10.0, 20.0, 20.0, 20.0]  # each network once, consecutively
    # within a group the input order is kept
    assert [scs[i]["hardware.compute_speedup"] for i in order[:3]] == [1.0, 2.0, 3.0]


# ------------------------------------------------------------------ ranges
def test_rows_carry_the_whatif_range_scaled_to_their_step(dlrm):
    """Each default-what-if row's range is `retime replay`'s range (prediction_range, per
    step of the slowest rank) times the row's step_time_ns over the predicted step."""
    from retime.replay import prediction_range, whatif

    scs = [{"hardware.compute_speedup": 2.0}, {"network.intra_node_gbps": 10.0}]
    df = sweep(dlrm, scs, workers=1, progress=False)
    for i, sc in enumerate(scs):
        row = df.iloc[i]
        res = whatif(dlrm, sc)
        lo, hi = prediction_range(res)
        pred = res.meta["whatif"]["range"]["predicted_step_ns"]
        step = int(row["step_time_ns"])
        assert int(row["step_time_lo_ns"]) == round(step * lo / pred)
        assert int(row["step_time_hi_ns"]) == round(step * hi / pred)
        assert int(row["step_time_lo_ns"]) < step < int(row["step_time_hi_ns"])
    off = sweep(dlrm, scs, workers=1, progress=False, ranges=False)
    assert off["step_time_lo_ns"].isna().all() and off["step_time_hi_ns"].isna().all()
    np.testing.assert_array_equal(off["step_time_ns"].to_numpy(), df["step_time_ns"].to_numpy())
