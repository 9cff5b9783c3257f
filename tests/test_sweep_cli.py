"""`retime sweep` CLI: a real subprocess, bad input exits 2 with one line, failed scenarios
are rows, every-scenario-failed is an error that still writes the rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from retime.cli import run
from retime.collectors.synth import synthesize

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep") / "run.retime"
    t = synthesize("gpt3-125m", "a100-80gb", tp=2, pp=2, dp=2, global_batch=16, micro_batch=2)
    t.save(d)
    return d, t.meta["synth"]


def test_sweep_subprocess(run_dir, tmp_path):
    d, syn = run_dir
    grid = tmp_path / "g.toml"
    grid.write_text('[grid.hardware]\ncompute_speedup = [1.0, 1.5]\n'
                    '[[scenario]]\nname = "broken"\n"parallel.tp" = 5\n')
    out = tmp_path / "out" / "s.parquet"
    p = subprocess.run([sys.executable, "-m", "retime", "sweep", str(d), "--grid", str(grid),
                        "-o", str(out), "--workers", "1", "--json"], capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert (s["scenarios"], s["completed"], s["failed"]) == (3, 3, 1)
    df = pd.read_parquet(out)
    assert list(df.columns[:4]) == ["scenario_id", "hardware.compute_speedup", "name",
                                    "parallel.tp"]
    base = df.iloc[0]
    # the identity scenario reproduces the modeled step, throughput, MFU and memory
    assert base["step_time_ns"] == syn["step_time_ns"]
    assert base["tokens_per_s"] == pytest.approx(syn["tokens_per_s"], rel=1e-9)
    assert base["mfu"] == pytest.approx(syn["mfu"], rel=1e-9)
    assert base["peak_memory_bytes"] == syn["peak_memory_bytes"]
    assert not base["oom"] and pd.isna(base["error"])
    assert df.iloc[1]["step_time_ns"] < base["step_time_ns"]
    assert df.iloc[2]["name"] == "broken" and "tp" in df.iloc[2]["error"]
    assert pd.isna(df.iloc[2]["step_time_ns"])
    assert s["best"]["scenario_id"] == 1


@pytest.mark.parametrize("grid_text, extra, needle", [
    ("[grid\n", [], "invalid TOML"),
    ('[grid]\n"hardware.compute_speedup" = []\n', [], "empty list"),
    ('[grid]\n"hardware.compute_speedup" = [1]\n', ["--workers", "1", "--scheduler",
                                                    "tcp://127.0.0.1:1"], "exclude each other"),
    # a key no policy has is the grid's error: refused before any scenario runs (was a row
    # of errors per scenario; user pass 8)
    ('[grid]\n"nosuch.key" = [1, 2]\n', ["--workers", "1"], "unknown table 'nosuch'"),
    ('[grid]\n"hardware.gpu_speedup" = [1, 2]\n', ["--workers", "1"],
     "unknown field 'gpu_speedup' of [hardware]"),
])
def test_bad_input_exits_2_with_one_line(run_dir, tmp_path, capsys, grid_text, extra, needle):
    d, _ = run_dir
    grid = tmp_path / "g.toml"
    grid.write_text(grid_text)
    out = tmp_path / "s.parquet"
    rc = run(["sweep", str(d), "--grid", str(grid), "-o", str(out), *extra])
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_every_scenario_failed_is_an_error_with_rows(run_dir, tmp_path, capsys):
    d, _ = run_dir
    grid = tmp_path / "g.toml"
    grid.write_text('[grid]\n"parallel.tp" = [5, 7]\n')  # TP 5 and 7 divide no head count
    out = tmp_path / "s.parquet"
    rc = run(["sweep", str(d), "--grid", str(grid), "-o", str(out), "--workers", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "every scenario failed" in err and "tp" in err
    df = pd.read_parquet(out)
    assert len(df) == 2 and df["error"].notna().all()


def test_ctrl_c_writes_the_finished_rows(run_dir, tmp_path, capsys):
    import _thread
    import signal
    import threading

    d, _ = run_dir
    grid = tmp_path / "g.toml"
    n = 20_000  # minutes of work: the interrupt always lands mid-sweep
    grid.write_text('[grid]\n"hardware.compute_speedup" = '
                    f'{[round(1 + i / 1000, 3) for i in range(n)]}\n')
    out = tmp_path / "s.parquet"
    # interrupt_main does nothing while SIGINT is ignored or left to the OS; a terminal's
    # Python has its default handler, so make sure this process has it too (whatever an
    # earlier test or library left installed)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(4.0, _thread.interrupt_main)  # what Ctrl-C does
    timer.start()
    try:
        rc = run(["sweep", str(d), "--grid", str(grid), "-o", str(out), "--workers", "1",
                  "--json"])
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, before)
    cap = capsys.readouterr()
    assert rc == 130, (before, cap.out, cap.err)
    assert "interrupted: wrote the" in cap.err
    s = json.loads(cap.out)
    df = pd.read_parquet(out)
    assert s["interrupted"] and s["completed"] == len(df) < n
    assert df["scenario_id"].tolist() == list(range(len(df)))  # serial: a prefix
    assert df["error"].isna().all() and df["step_time_ns"].notna().all()
