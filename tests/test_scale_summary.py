"""bench/scale.py's summary table (bench/scale_summary.py): issue 30's targets judged from
the measured rows: exponents fitted in N, wall against CPU verdicts, modes not run."""

from __future__ import annotations

import pytest
from conftest import bench_module

S = bench_module("scale_summary")


def _r(wall, cpu, rss):
    return {"wall_s": wall, "cpu_s": cpu, "rss_gb": rss}


def test_exponent_is_the_log_log_slope():
    assert S.exponent([8, 32, 128], [1.0, 4.0, 16.0]) == pytest.approx(1.0)
    assert S.exponent([8, 128], [0.5, 0.5]) == pytest.approx(0.0)
    assert S.exponent([8], [3.0]) != S.exponent([8], [3.0])  # nan with one N


def test_table_judges_every_target():
    res = {"ingest (streamed)": [(8, _r(1.0, 1.9, 0.5)), (128, _r(11.0, 19.0, 0.8))],
           "analyze": [(8, _r(1.0, 1.0, 0.5)), (128, _r(16.0, 14.0, 2.5))],
           "replay (identity)": [(8, _r(1.0, 1.0, 0.5)), (128, _r(40.0, 20.0, 1.0))],
           "report -o X.html": [(8, _r(1.0, 1.0, 0.5)), (128, _r(10.0, 10.0, 0.5))]}
    lines = S.summary(res, {8: 0.44, 128: 6.99})
    row = {ln.split("|")[0].strip(): ln for ln in lines[2:-1]}
    assert set(row) == {"ingest", "analyze", "replay", "report"}
    # ingest: 6.99 GB in 11 s is 0.64 GB/s (not met on wall), 2 x 6.99 / 19 = 0.74 (CPU)
    assert "0.64 GB/s wall" in row["ingest"] and "met on CPU only" in row["ingest"]
    # analyze: 16 s wall, 14 s CPU; 2.5 GB over the 2 GB limit; RSS exponent log(5)/log(16)
    assert "<= 15 s: wall 16.0 / CPU 14.0 s met on CPU only" in row["analyze"]
    assert "2.50 GB NOT met" in row["analyze"] and "0.580 NOT met" in row["analyze"]
    # replay: 40 / 16 = 2.5x wall, 20 / 14 = 1.43x CPU
    assert "wall 2.50x / CPU 1.43x met on CPU only" in row["replay"]
    # time exponent on CPU: log(20)/log(16) = 1.08 met; report's 10x in 16x N: 0.83
    assert "1.080 (1.33) met" in row["replay"]
    assert "<= 15 s: wall 10.0 / CPU 10.0 s met" in row["report"]
    assert "0.000 met" in row["report"]  # flat memory


def test_an_exponent_just_over_its_limit_is_not_met():
    # 0.3045 rounds to 0.30 at 2 decimals: it must still read as over the limit
    res = {"replay (identity)": [(8, _r(1.0, 1.0, 0.44)),
                                 (128, _r(2.0, 2.0, 0.44 * 16 ** 0.3045))]}
    row = {ln.split("|")[0].strip(): ln for ln in S.summary(res, {})[2:-1]}["replay"]
    assert "0.304 NOT met" in row or "0.305 NOT met" in row


def test_modes_not_run_and_no_128():
    lines = S.summary({"analyze": [(8, _r(1.0, 1.0, 0.5)), (32, _r(2.0, 2.0, 0.5))]},
                      {8: 0.44, 32: 1.75})
    row = {ln.split("|")[0].strip(): ln for ln in lines[2:-1]}
    assert row["ingest"].endswith("(not run)")
    assert "(N = 128 not in this run)" in row["analyze"]
    assert S.summary({}, {}) == []
