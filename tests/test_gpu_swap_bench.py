"""bench/gpu_swap.py (issue 27, held-out GPU swaps): its plumbing, and the recorded misses
against the published per-iteration times as strict xfails (no timing asserts: the published
figures are measured on real GPUs, the predictions are deterministic replays)."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT, SHARED, bench_module, ingest_cached

bench = bench_module("gpu_swap")


@pytest.fixture(scope="module")
def k33():
    (p,) = [p for p in bench.pairs() if p["id"] == "K33"]
    tr = ingest_cached(SHARED / p["trace"])
    return p, bench.rows(p, tr)


def test_the_pair_is_the_shared_trace_at_the_published_batch_and_gpus(k33):
    """The trace's own batch is the one the toml states (its first convolution's input), the
    published figures are the ones REFERENCES.md K33 cites."""
    import gzip

    import orjson
    p, rs = k33
    doc = orjson.loads(gzip.decompress((SHARED / p["trace"]).read_bytes()))
    conv = next(e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"
                and e.get("name") == "aten::convolution")
    assert conv["args"]["Input Dims"][0] == [p["trace_batch"], 3, 224, 224]
    refs = (ROOT / "collectors" / "costs" / "REFERENCES.md").read_text()
    row = next(line for line in refs.splitlines() if line.startswith("| K33 |"))
    for _gpu, ms in p["published"]:
        assert f"{ms:.2f}" in row
    assert [r["gpu"] for r in rs] == ["a100-80gb", "v100-sxm2"]


def test_rows_are_the_whatif_of_the_batch_and_gpu(k33):
    p, rs = k33
    for r in rs:
        assert r["batch"] == 12 and r["published_ms"] in (23.75, 54.15)
        assert r["error"] == pytest.approx(r["predicted_ms"] / r["published_ms"] - 1.0)
        assert r["kernel_ms"] + r["other_ms"] == pytest.approx(r["predicted_ms"])
        assert 0 < r["kernel_ms"] <= r["predicted_ms"]
        a = " ".join(r["assumed"])
        assert re.search(r"micro_batch 512 -> 12", a), a[:300]
        assert r["gpu"] in a
    (q,) = bench.ratios(rs)
    assert q["published"] == pytest.approx(54.15 / 23.75)
    assert q["predicted"] == pytest.approx(rs[1]["predicted_ms"] / rs[0]["predicted_ms"])


def test_bench_prints_every_row(capsys):
    assert bench.main([]) == 0
    out = capsys.readouterr().out
    assert "a100-80gb" in out and "v100-sxm2" in out and "ratio v100-sxm2/a100-80gb" in out


@pytest.mark.xfail(strict=True, reason="K33 scored once (held out): A100 predicted 62.87 ms vs "
                   "published 23.75 (+164.7%): 33.3 ms of the step is the trace's profiled host "
                   "issue time (record_shapes, with_stack, profile_memory and an execution-"
                   "trace observer were on), the published time is unprofiled")
def test_a100_step_within_10_percent(k33):
    assert abs(k33[1][0]["error"]) < 0.10


@pytest.mark.xfail(strict=True, reason="K33 V100: scored once (held out) 163.26 ms vs published "
                   "54.15 (+201.5%), the FP32 3x3 convolutions priced as implicit GEMMs; with "
                   "Winograd F(2x2,3x3) on the CUDA cores (K34, after seeing) 98.78 ms (+82.4%): "
                   "81.7 ms of kernels")
def test_v100_step_within_10_percent(k33):
    assert abs(k33[1][1]["error"]) < 0.10


@pytest.mark.xfail(strict=True, reason="K33: V100 / A100 time ratio published 2.28, predicted "
                   "2.60 when scored, 1.57 with K34's Winograd (the A100's step is its profiled "
                   "host time)")
def test_v100_over_a100_ratio_within_10_percent(k33):
    (q,) = bench.ratios(k33[1])
    assert abs(q["predicted"] / q["published"] - 1.0) < 0.10


def test_the_gpu_swap_says_its_host_times_were_measured_under_the_profiler(k33):
    """The trace shows profile_memory (its [memory] events: recounted from the raw file) and
    with_stack (Python-function ranges) were on: the hardware.gpu line says the kept host
    times include the profiler's bookkeeping (an upper bound where the host bounds the step)."""
    import gzip

    import orjson
    p, rs = k33
    doc = orjson.loads(gzip.decompress((SHARED / p["trace"]).read_bytes()))
    mem = sum(1 for e in doc["traceEvents"] if e.get("cat") == "cpu_instant_event"
              and e.get("name") == "[memory]")
    assert doc["profile_memory"] == 1 and doc["with_stack"] == 1 and mem == 464
    for r in rs:
        line = next(a for a in r["assumed"] if a.startswith("hardware.gpu: host (CPU)"))
        m = re.search(r"profile_memory \((\d+) memory events\) and with_stack \((\d+) "
                      r"Python-function ranges\) on: .* upper bound", line)
        assert m and int(m.group(1)) == mem and int(m.group(2)) > 0, line


def test_recording_floor_recounts_the_raw_file(k33):
    """The bench's diagnosis of per-call recording: the metadata-only calls' median and the
    aten:: call count, recounted from the raw Kineto file (every cpu_op, any depth)."""
    import gzip

    import numpy as np
    import orjson
    p, _rs = k33
    doc = orjson.loads(gzip.decompress((SHARED / p["trace"]).read_bytes()))
    ev = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    meta = [e["dur"] for e in ev if e["name"] in bench.METADATA_OPS]
    f = bench.recording_floor(ingest_cached(SHARED / p["trace"]))
    assert f["meta_calls"] == len(meta) == 40
    assert f["floor_us"] == pytest.approx(float(np.median(meta)))
    assert f["calls"] == sum(e["name"].startswith("aten::") for e in ev) == 742
    assert f["upper_ms"] == pytest.approx(f["floor_us"] * 742 / 1e3)
