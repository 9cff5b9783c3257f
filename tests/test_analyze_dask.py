"""`analyze --scheduler` on a real dask.distributed LocalCluster (2 worker processes): one
task per rank (a worker never holds more than one rank's ops), the same frames as the local
streamed analysis, and the CLI as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

distributed = pytest.importorskip("distributed")

from retime.analysis.stream import store_analysis  # noqa: E402
from retime.analysis.stream_dask import rank_tasks  # noqa: E402
from retime.collectors.ingest import read  # noqa: E402
from retime.collectors.store import rank_rows  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DLRM = ROOT.parent / "shared" / "traces" / "kineto" / "dlrm-v100-8rank"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("adask")
    t = read(DLRM)
    return t.save(d / "rank.retime", layout="rank"), t.save(d / "single.retime")


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as lc, \
            distributed.Client(lc, set_as_default=False) as client:
        yield lc, client


def test_work_units_are_one_rank_each(store):
    tasks = rank_tasks(store[0])
    assert [t.tolist() for t in tasks] == [[r] for r in sorted(rank_rows(store[0]))]
    assert len(tasks) == 8


def test_dask_analysis_equals_local_streamed(store, cluster):
    _, client = cluster
    local = store_analysis(store[0], stream=True, top=5)
    remote = store_analysis(store[0], top=5, scheduler=client)
    assert remote["mode"] == "stream"
    for k, v in local.items():
        if isinstance(v, pd.DataFrame):
            pd.testing.assert_frame_equal(remote[k], v, obj=k)
        else:
            assert remote[k] == v, k


def test_cli_analyze_scheduler(store, cluster, tmp_path):
    lc, _ = cluster
    cmd = [sys.executable, "-m", "retime", "analyze", str(store[0]), "--json"]
    a = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    b = subprocess.run(cmd + ["--scheduler", lc.scheduler_address], cwd=ROOT,
                       capture_output=True, text=True)
    assert a.returncode == 0 and b.returncode == 0, b.stderr
    assert json.loads(a.stdout) == json.loads(b.stdout)
    bad = subprocess.run([sys.executable, "-m", "retime", "analyze", str(store[1]), "--json",
                          "--scheduler", lc.scheduler_address], cwd=ROOT, capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--layout rank" in json.loads(bad.stdout)["hint"]


def test_scheduler_with_no_stream_is_refused_before_connecting(store, capsys):
    from retime.cli import run

    assert run(["analyze", str(store[0]), "--no-stream", "--scheduler", "tcp://127.0.0.1:1",
                "--json"]) == 2
    assert "--scheduler" in json.loads(capsys.readouterr().out)["error"]
