"""Sweeps on a real dask.distributed LocalCluster (2 worker processes): rows equal the
serial sweep's row for row, the trace is shipped once, a worker killed mid-sweep loses and
duplicates nothing; `retime sweep --scheduler` as a real subprocess."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

distributed = pytest.importorskip("distributed")

from retime.collectors.ingest import read  # noqa: E402
from retime.replay import build_graph, simulate  # noqa: E402
from retime.replay.graph_data import RES_COMM, RES_COMPUTE  # noqa: E402
from retime.replay.sweep import sweep  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DLRM = ROOT.parent / "shared" / "traces" / "kineto" / "dlrm-v100-8rank"

_GRAPHS: dict = {}
_CALLS: list = []


def scale_run(trace, scenario):
    """Stand-in scenario: compute / communication durations divided by a factor;
    ``test.kill_once`` (a marker path) makes the worker running it SIGKILL itself once."""
    if scenario.get("test.kill_once"):
        marker = Path(scenario["test.kill_once"])
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
    if scenario.get("test.kill_always"):
        os.kill(os.getpid(), signal.SIGKILL)
    if scenario.get("test.sleep_s"):
        time.sleep(float(scenario["test.sleep_s"]))
    _CALLS.append(id(trace))
    g = _GRAPHS.get(id(trace))
    if g is None or g.trace is not trace:
        g = _GRAPHS[id(trace)] = build_graph(trace)
    d = g.op_dur_ns.astype(np.float64)  # op-id order, as simulate takes them
    res = g.by_op(g.resource)
    d[res == RES_COMPUTE] /= float(scenario.get("hardware.compute_speedup", 1.0))
    d[res == RES_COMM] /= float(scenario.get("network.comm_speedup", 1.0))
    return simulate(g, durations_ns=np.round(d).astype(np.int64))


def traces_seen():
    """On a worker: how many distinct trace objects the scenarios ran on."""
    return len(set(_CALLS))


GRID = [{"hardware.compute_speedup": c, "network.comm_speedup": m}
        for c in (0.5, 1.0, 2.0, 3.0) for m in (1.0, 4.0)]


@pytest.fixture(scope="module")
def cluster():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0", silence_logs=50) as lc, \
            Client(lc, set_as_default=False) as client:
        yield lc, client


@pytest.fixture(scope="module")
def dlrm():
    return read(DLRM)


@pytest.fixture(scope="module")
def serial(dlrm):
    return sweep(dlrm, GRID, run=scale_run, workers=1)


def test_dask_sweep_equals_serial_row_for_row(cluster, dlrm, serial):
    lc, client = cluster
    df = sweep(dlrm, GRID * 2, run=scale_run, scheduler=lc.scheduler_address)
    n = len(GRID)
    for k in range(2):  # each repetition equals the serial rows
        part = df.iloc[k * n:(k + 1) * n].reset_index(drop=True)
        part = part.assign(scenario_id=part["scenario_id"] - k * n)
        pd.testing.assert_frame_equal(part, serial)
    # the trace went to each worker once: all the scenarios a worker ran saw one trace
    # object (a trace shipped per task would be a new object each time)
    seen = client.run(traces_seen)
    assert len(seen) == 2 and all(v <= 1 for v in seen.values()) and sum(seen.values()) >= 1


def test_dask_worker_killed_mid_sweep(cluster, dlrm, serial, tmp_path):
    lc, client = cluster
    before = set(client.scheduler_info()["workers"])
    marker = tmp_path / "killed"
    scs = [dict(s, **{"test.sleep_s": 0.05}) for s in GRID]
    scs[len(scs) // 2]["test.kill_once"] = str(marker)
    df = sweep(dlrm, scs, run=scale_run, scheduler=client)
    assert marker.exists()  # a worker really died while running a scenario
    client.wait_for_workers(2, timeout=60)
    assert set(client.scheduler_info()["workers"]) != before  # the nanny replaced it
    assert df["scenario_id"].tolist() == list(range(len(scs)))  # none lost, none twice
    assert df["error"].isna().all()
    cols = [c for c in serial.columns]
    pd.testing.assert_frame_equal(df[cols], serial)


def test_dask_scenario_that_kills_its_worker_is_an_error_row(dlrm):
    """Dask gives up on a task whose workers keep dying (KilledWorker; no retries on this
    cluster): the scenario is a row with that error, not a lost or broken sweep."""
    import dask
    from distributed import Client, LocalCluster

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                         dashboard_address=":0", silence_logs=50) as lc, \
            Client(lc, set_as_default=False) as client:
        df = sweep(dlrm, [{"test.kill_always": True}], run=scale_run, scheduler=client)
    assert df["scenario_id"].tolist() == [0]
    assert df.loc[0, "error"].startswith("KilledWorker: ")
    assert df["step_time_ns"].isna().all()


def test_cli_sweep_on_scheduler(cluster, tmp_path, capsys):
    from retime.cli import run
    from retime.collectors.synth import synthesize

    lc, _ = cluster
    run_dir = tmp_path / "run.retime"
    synthesize("gpt3-125m", "a100-80gb", tp=2, pp=2, dp=2, global_batch=16,
               micro_batch=2).save(run_dir)
    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\n"hardware.compute_speedup" = [1.0, 2.0]\n'
                    '"overlap.mode" = ["serial", "async"]\n')
    out = tmp_path / "sweep.parquet"
    rc = run(["sweep", str(run_dir), "--grid", str(grid), "-o", str(out), "--scheduler",
              lc.scheduler_address, "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    s = json.loads(cap.out)
    assert s["scenarios"] == 4 and s["completed"] == 4 and s["failed"] == 0
    assert s["scheduler"] == lc.scheduler_address
    df = pd.read_parquet(out)
    assert df["scenario_id"].tolist() == [0, 1, 2, 3]
    assert df["hardware.compute_speedup"].tolist() == [1.0, 1.0, 2.0, 2.0]
    # twice the compute speed shortens the step; serializing communication never helps
    st = df.set_index(["hardware.compute_speedup", "overlap.mode"])["step_time_ns"]
    assert st[(2.0, "async")] < st[(1.0, "async")]
    assert st[(1.0, "serial")] >= st[(1.0, "async")]
    assert s["best"]["step_time_ns"] == int(df["step_time_ns"].min())
    # the same grid serially gives the same file
    out1 = tmp_path / "serial.parquet"
    assert run(["sweep", str(run_dir), "--grid", str(grid), "-o", str(out1), "--workers",
                "1", "--json"]) == 0
    capsys.readouterr()
    pd.testing.assert_frame_equal(pd.read_parquet(out1), df)


def test_ingest_on_dask_equals_local_ingest(cluster, dlrm, tmp_path, capsys):
    from retime.cli import run
    from retime.collectors.distributed import read_distributed

    lc, client = cluster
    t = read_distributed(DLRM, client)
    for name in ("ops", "lanes", "edges", "ranges", "memory"):
        pd.testing.assert_frame_equal(getattr(t, name), getattr(dlrm, name))
    assert t.strings == dlrm.strings
    assert t.meta["collectives"] == dlrm.meta["collectives"]
    out = tmp_path / "d.retime"
    rc = run(["ingest", str(DLRM), "-o", str(out), "--scheduler", lc.scheduler_address,
              "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    s = json.loads(cap.out)
    assert s["ops"] == dlrm.n_ops and s["ranks"] == list(range(8))
    assert s["collectives"]["matched"] == dlrm.meta["collectives"]["matched"]
    # other formats are refused with one line, exit 2
    nsys = DLRM.parents[1] / "nsys" / "h100-2gpu-fastvideo.sqlite"
    rc = run(["ingest", str(nsys), "-o", str(tmp_path / "n.retime"), "--scheduler",
              lc.scheduler_address])
    err = capsys.readouterr().err
    assert rc == 2 and "Kineto traces" in err and len(err.strip().splitlines()) == 1


def worker_caches():
    """On a worker: how many replay graphs and re-synthesized runs it still holds, and
    whether the sweep's heap settings are still on."""
    from retime.replay.policies.base import _GRAPH_CACHE, _SYNTH_CACHE
    from retime.replay.sweep import _WORKER

    return len(_GRAPH_CACHE), len(_SYNTH_CACHE), bool(_WORKER.get("dask_malloc"))


def test_dask_sweep_leaves_nothing_on_the_workers(cluster, dlrm):
    """The default policies cache each trace's graph (which holds the trace) on the worker:
    once the sweep ends the workers forget them and the sweep's heap settings."""
    lc, client = cluster
    df = sweep(dlrm, [{"hardware.compute_speedup": c} for c in (1.0, 2.0, 4.0)],
               scheduler=lc.scheduler_address)
    assert df["error"].isna().all() and len(df) == 3
    assert set(client.run(worker_caches).values()) == {(0, 0, False)}
