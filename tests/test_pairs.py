"""The paired-capture suite (issue 17): committed captures, their index, bench/pairs.py.

Every check recounts from the raw Kineto JSON (plain gzip + json) or from closed forms (the
models' parameter counts, checkpointing's extra forward ops), never from retime's own reader
alone: the index (traces/pairs/pairs.json) must describe the files that are there, and the
step metric of bench/pairs.py must equal a recount of the raw ProfilerStep events.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import shutil
import statistics
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ROOT / "traces" / "pairs"
sys.path.insert(0, str(ROOT / "bench"))

import pairs as bench_pairs  # noqa: E402

INDEX = json.loads((PAIRS / "pairs.json").read_text())["pairs"]
CAPTURES = [(n, lab) for n in INDEX for lab in ("A", "B")]
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _raw(name: str, label: str) -> dict[int, dict]:
    """rank -> the raw trace document of a committed capture."""
    out = {}
    for f in sorted((PAIRS / name / label).glob("rank-*.pt.trace.json.gz")):
        out[int(f.name.split("-")[1].split(".")[0])] = json.loads(gzip.decompress(f.read_bytes()))
    return out


def _param_bytes(s: dict) -> int:
    """fp32 gradient bytes of the job's model, closed form."""
    if s["model"] == "mlp":
        h = s["hidden"]
        return 4 * (s["layers"] * (h * h + h) + h + 1)
    if s["model"] == "emb":  # bottom MLP (dense -> 256 -> dim), the tables, top MLP
        dim, t = s["dim"], s["tables"]
        bottom = s["dense"] * 256 + 256 + 256 * dim + dim
        top = dim * (t + 1) * 512 + 512 + 512 * 256 + 256 + 256 + 1
        return 4 * (bottom + t * s["rows"] * dim + top)
    if s["model"] == "cnn":  # 3x3 convolutions (the first from 3 channels), head Linear(c, 1)
        c = s["channels"]
        return 4 * ((3 * c * 9 + c) + (s["layers"] - 1) * (c * c * 9 + c) + c + 1)
    d = s["d_model"]
    # attention in/out projections 4d^2+4d, feed-forward (4d) 8d^2+5d, two LayerNorms 4d
    return 4 * (s["layers"] * (12 * d * d + 13 * d) + d + 1)


def _raw_step_ns(docs: dict[int, dict]) -> float:
    """measured_step_ns recounted from raw events: per rank, ProfilerStep#N start to the next
    one's start, the last to the end of the rank's last event (not the profiler's own
    'Trace' span); max over ranks per step; median over steps."""
    worst: dict[str, float] = {}
    for doc in docs.values():
        ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        steps = sorted((e["ts"], e["name"]) for e in ev if e["name"].startswith("ProfilerStep#"))
        last = max(e["ts"] + e["dur"] for e in ev if e.get("cat") != "Trace"
                   and not e["name"].startswith("ProfilerStep#"))
        for i, (ts, name) in enumerate(steps):
            end = steps[i + 1][0] if i + 1 < len(steps) else last
            worst[name] = max(worst.get(name, 0.0), (end - ts) * 1e3)
    return statistics.median(worst.values())


def _raw_step_windows(folder: Path) -> dict[int, list[float]]:
    """Per rank, its step windows (ns) recounted from the raw events as in _raw_step_ns."""
    out: dict[int, list[float]] = {}
    for f in sorted(folder.glob("rank-*.pt.trace.json.gz")):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        steps = sorted(e["ts"] for e in ev if e["name"].startswith("ProfilerStep#"))
        last = max(e["ts"] + e["dur"] for e in ev if e.get("cat") != "Trace"
                   and not e["name"].startswith("ProfilerStep#"))
        ends = steps[1:] + [last]
        out[int(doc["distributedInfo"]["rank"])] = [(b - a) * 1e3 for a, b in zip(steps, ends)]
    return out


#: pairs whose kit TCP rate test (one per direction, before the captures) came out low in one
#: direction under the machine's load: cnn-checkpoint host1->host0 1222.2 Mbit/s on the
#: 1600 Mbit/s link (host0->host1 1529.0), load average ~7 from other sessions' tests; the
#: captures were kept (batch 4 was scored on them once)
SLOW_RATE_TEST = {"cnn-checkpoint": 1222.2}


def test_index_records_are_consistent():
    assert INDEX, "traces/pairs/pairs.json lists no pair"
    for name, r in INDEX.items():
        assert set(r["whatif"]) == {"A->B", "B->A"}, name
        # interleaved A B B A A B ... after the discarded warm-up (order 0)
        order = sorted((x["order"], lab) for lab in ("A", "B") for x in r["reps"][lab])
        n = len(r["reps"]["A"])
        assert n == len(r["reps"]["B"]) >= 3, name
        expect = [lab for k in range(n) for lab in (("A", "B") if k % 2 == 0 else ("B", "A"))]
        assert [lab for _, lab in order] == expect and order[0][0] == 1, name
        for lab in ("A", "B"):
            steps = [x["step_ns"] for x in r["reps"][lab]]
            assert r["median_ns"][lab] == int(statistics.median(steps)), (name, lab)
            assert r["spread"][lab] == pytest.approx((max(steps) - min(steps))
                                                     / statistics.median(steps), abs=1e-4)
            kept = r["kept"][lab]
            assert kept["step_ns"] == r["reps"][lab][kept["rep"]]["step_ns"]
            # the kept capture is the one closest to the median
            assert abs(kept["step_ns"] - r["median_ns"][lab]) == min(
                abs(s - r["median_ns"][lab]) for s in steps), (name, lab)
            for x in r["reps"][lab]:
                for share in (x["load"]["foreign"], x["load"]["ours"]):
                    assert 0.0 <= share <= 1.05, (name, lab, x["load"])
        # the shaped link came close to its rate and never above it less the TCP/IP headers
        # (1448 payload bytes per 1514 on the wire)
        for lab in ("A", "B"):
            got = r["achieved_mbit"][lab]
            if name in SLOW_RATE_TEST:  # the slower direction's test ran short: the faster
                assert got == SLOW_RATE_TEST[name]  # one must still reach the rate
                got = max(r["achieved_mbit_by_direction"][f"{r[lab]['rate_mbit']:g}"].values())
            assert 0.85 <= got / r[lab]["rate_mbit"] <= 1448 / 1514 + 1e-3, (name, lab)
        # exactly one knob differs (a layout knob moves hosts x ranks together)
        diff = {k for k in r["A"] if r["A"][k] != r["B"][k]}
        assert diff == set(r["changed"]), name
        assert diff in ({"rate_mbit"}, {"bucket_cap_mb"}, {"nproc_per_host"},
                        {"nhosts", "nproc_per_host"}, {"speed_pct"}, {"checkpoint"},
                        {"batch"}), (name, diff)


def test_freeze_batches_are_marked_and_scored_apart():
    """pairs.json marks the pairs captured after each freeze (``after_freeze``: true for the
    first batch, 2 with the frozen commit for the second); the bench groups them apart."""
    by = {}
    for name, r in INDEX.items():
        by.setdefault(bench_pairs.freeze_batch(r), []).append(name)
    assert sorted(by[1]) == ["cnn-bandwidth-300-1200", "cnn-batch", "mlp-bandwidth-burst4",
                             "transformer-bandwidth-2x2"]
    assert sorted(by[2]) == ["cnn-dp", "emb-bandwidth-500-2000", "emb-bucket",
                             "transformer-bandwidth-500-2000-burst2"]
    assert sorted(by[3]) == ["emb-bandwidth-300-1000-burst-half", "mlp-bandwidth-400-2000",
                             "mlp-batch-32-16", "transformer-batch-32-16",
                             "transformer-bucket-1000mbit"]
    labels = {b: bench_pairs._batch_label(b, [INDEX[n] for n in names])
              for b, names in by.items()}
    assert sorted(by[4]) == ["cnn-batch-32-8", "cnn-checkpoint", "emb-batch-64-16",
                             "emb-host-speed-70"]
    assert sorted(by[5]) == ["emb-batch-2048-512", "emb-batch-32-8", "emb-bucket-800mbit",
                             "transformer-batch-16-4"]
    assert sorted(by[6]) == ["cnn-host-speed-60", "mlp-bandwidth-250-1000-burst3",
                             "mlp-bucket-2x2", "transformer-checkpoint-1200mbit"]
    assert sorted(by[7]) == ["cnn-bandwidth-400-1600-2x2", "emb-ranks-per-host-1200mbit",
                             "transformer-bandwidth-300-1200-burst1.5",
                             "transformer-batch-8-2-600mbit"]
    assert sorted(by[8]) == ["cnn-bucket-0.25-25-500mbit", "emb-bandwidth-700-1400-2x2",
                             "mlp-batch-2048-512-burst2", "transformer-checkpoint-2000mbit"]
    assert sorted(by[9]) == ["cnn-bucket-0.125-25-900mbit", "emb-batch-1024-256-burst2",
                             "mlp-checkpoint-500mbit", "transformer-bandwidth-600-1800"]
    assert len(set(labels.values())) == 10
    for b in (2, 3, 4, 5, 6, 7, 8, 9):
        commits = {INDEX[n]["frozen_commit"] for n in by[b]}
        assert len(commits) == 1 and len(next(iter(commits))) == 40
        assert next(iter(commits))[:7] in labels[b]
    # batch b's freeze commit (b = 3..9) is an ancestor of this tree, and its message says
    # FREEZE-b (batch 7's is the second FREEZE-7 commit: the first, 368afb3, held a range rule
    # reverted before any batch-7 prediction was run; batch 8's is an empty commit, the model
    # of main 7194928 unchanged; batch 9's an empty commit over the range-only link bound)
    for b in (3, 4, 5, 6, 7, 8, 9):
        frozen = INDEX[by[b][0]]["frozen_commit"]
        msg = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%s", frozen],
                             capture_output=True, text=True)
        if msg.returncode == 0:  # a checkout without the git history cannot tell
            assert msg.stdout.startswith(f"FREEZE-{b}"), (b, msg.stdout)
    # fixed after batch 2 (emb-bucket), batch 3 (mlp-batch-32-16) and batch 4
    # (emb-batch-64-16) were seen, and the calibrated re-bucketing after the calibrated rows
    # of emb-bucket-800mbit (batch 5) and transformer-bucket-1000mbit (batch 3) were seen:
    # marked, and scored apart by the bench
    assert sorted(n for n, r in INDEX.items() if r.get("shaped_after_freeze")) == [
        "emb-batch-64-16", "emb-bucket", "emb-bucket-800mbit", "mlp-batch-32-16",
        "transformer-bucket-1000mbit"]


@pytest.mark.parametrize("name,label", CAPTURES)
def test_capture_files_match_their_setting(name, label):
    s = INDEX[name][label]
    world = s["nhosts"] * s["nproc_per_host"]
    docs = _raw(name, label)
    assert sorted(docs) == list(range(world))
    for rank, doc in docs.items():
        assert doc["distributedInfo"]["world_size"] == world
        assert doc["distributedInfo"]["backend"] == "gloo"
        assert doc["host_name"] == f"host{rank // s['nproc_per_host']}"  # own UTS namespace
        job = doc["retimeCapture"]["job"]
        for k in ("model", "layers", "batch", "bucket_cap_mb", "checkpoint", "nhosts",
                  "nproc_per_host", "rate_mbit", "speed_pct", "tables", "rows", "dim"):
            if k in s:  # the emb model has no layers; only it has tables
                assert job[k] == s[k], (k, job[k], s[k])
        assert sum(job["ddp_param_bytes"]) == _param_bytes(s)
        assert job["hosts"] == [f"host{r // s['nproc_per_host']}" for r in range(world)]
        steps = [e["name"] for e in doc["traceEvents"]
                 if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")]
        # the kit's schedule wait 1 warmup 1 active 3, or the pair's own (batch 3's burst-half
        # pair: wait 2 warmup 2 active 5); torch numbers the steps from 0
        first = s.get("wait", 1) + s.get("warmup", 1)
        assert steps == [f"ProfilerStep#{first + i}" for i in range(s.get("active", 3))]
        assert job["schedule"] == {"wait": s.get("wait", 1), "warmup": s.get("warmup", 1),
                                   "active": s.get("active", 3)}
        # the recorded input shapes carry the per-rank batch: the first Linear's input is
        # (batch, hidden) in the MLP, (seq, batch, d_model) in attention's in-projection; the
        # conv net's first convolution takes (batch, 3, image, image); the recommender's
        # first Linear (its bottom MLP) (batch, dense), and each table (rows, dim) bags
        # batch x bag ids, flattened by nn.EmbeddingBag with one offset per sample
        if s["model"] == "emb":
            lin = next(e for e in doc["traceEvents"] if e.get("name") == "aten::linear")
            assert lin["args"]["Input Dims"][0] == [s["batch"], s["dense"]]
            bags = [e for e in doc["traceEvents"] if e.get("name") == "aten::embedding_bag"]
            assert len(bags) == s.get("active", 3) * s["tables"]  # per recorded step
            assert all(e["args"]["Input Dims"][:3] == [[s["rows"], s["dim"]],
                                                       [s["batch"] * s["bag"]], [s["batch"]]]
                       for e in bags)
        elif s["model"] == "cnn":
            conv = next(e for e in doc["traceEvents"] if e.get("name") == "aten::conv2d")
            assert conv["args"]["Input Dims"][0] == [s["batch"], 3, s["image"], s["image"]]
        else:
            lin = next(e for e in doc["traceEvents"] if e.get("name") == "aten::linear")
            assert lin["args"]["Input Dims"][0] == (
                [s["batch"], s["hidden"]] if s["model"] == "mlp"
                else [s["seq"], s["batch"], s["d_model"]])
    for f in (PAIRS / name / label).iterdir():
        assert f.stat().st_size < 1_000_000, f  # small, as the suite promises


@pytest.mark.parametrize("name,label", CAPTURES)
def test_measured_step_matches_raw_recount(name, label):
    trace = bench_pairs.load_capture(PAIRS / name / label)
    got = bench_pairs.measured_step_ns(trace)
    assert got == pytest.approx(_raw_step_ns(_raw(name, label)), abs=2_000)  # us floats
    assert int(got) == INDEX[name]["kept"][label]["step_ns"]
    assert trace.meta["ddp_param_bytes"] == _raw(name, label)[0]["retimeCapture"]["job"][
        "ddp_param_bytes"]


@pytest.mark.parametrize("name", [n for n in INDEX if n.endswith("-checkpoint")])
def test_checkpointing_reruns_each_blocks_forward(name):
    """With checkpointing every block's forward runs again in the backward: per recorded step
    the Linear calls go from L x k + 1 (the head is not checkpointed) to 2 x L x k + 1, with
    k = 1 per MLP block and 4 per transformer layer (attention in/out projections, the two
    feed-forward linears); the conv net's blocks have one conv2d each (L -> 2 L) and its
    head one Linear."""
    for label in ("A", "B"):
        s = INDEX[name][label]
        doc = _raw(name, label)[0]
        n = sum(e.get("name") == "aten::linear" for e in doc["traceEvents"])
        if s["model"] == "cnn":
            conv = sum(e.get("name") == "aten::conv2d" for e in doc["traceEvents"])
            assert conv == 3 * s["layers"] * (2 if s["checkpoint"] else 1), (label, conv)
            assert n == 3, (label, n)
            continue
        k = 1 if s["model"] == "mlp" else 4
        assert n == 3 * (s["layers"] * k * (2 if s["checkpoint"] else 1) + 1), (label, n)


def test_measured_step_closed_form():
    """A hand-made two-rank trace: steps 1..3 with known starts; the last step ends at the
    rank's last op."""
    import numpy as np

    from retime.collectors.trace import Trace

    ms = 1_000_000
    starts = {0: [0, 100 * ms, 190 * ms], 1: [5 * ms, 110 * ms, 200 * ms]}
    last_end = {0: 300 * ms, 1: 280 * ms}
    strings = ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3", "op"]
    rr, rs, rn = [], [], []
    for r, st in starts.items():
        for i, s in enumerate(st):
            rr.append(r)
            rs.append(s)
            rn.append(i)
    n = len(rr)
    ranges = {"rank": np.asarray(rr, np.int32), "lane": np.asarray(rr, np.int32),
              "name_id": np.asarray(rn, np.int32), "start_ns": np.asarray(rs, np.int64),
              "end_ns": np.asarray(rs, np.int64) + ms, "depth": np.zeros(n, np.int32)}
    ops = {"rank": np.asarray([0, 1], np.int32), "lane": np.asarray([0, 1], np.int32),
           "kind": np.full(2, 5, np.int8), "name_id": np.full(2, 3, np.int32),
           "start_ns": np.asarray([last_end[0] - ms, last_end[1] - ms], np.int64),
           "dur_ns": np.full(2, ms, np.int64)}
    lanes = {"lane": np.asarray([0, 1], np.int32), "rank": np.asarray([0, 1], np.int32),
             "device": np.full(2, -1, np.int32), "lane_kind": np.zeros(2, np.int8),
             "native_id": np.zeros(2, np.int64), "name": ["main", "main"]}
    t = Trace.build(ops=ops, lanes=lanes, strings=strings, ranges=ranges)
    # step 1: max(100, 105) = 105; step 2: max(90, 90) = 90; step 3: max(110, 80) = 110
    assert bench_pairs.measured_step_ns(t) == 105 * ms


def test_bench_pairs_json_rows():
    name = next(iter(INDEX))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "pairs.py"), "--pair", name,
                           "--json"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    rows = out["rows"]
    assert [r["direction"] for r in rows] == ["A->B", "B->A"]
    r0 = INDEX[name]
    for row in rows:
        src, dst = row["direction"].split("->")
        assert row["keys"] == {**r0["whatif"][row["direction"]],
                               **r0.get("stated", {}).get(row["direction"], {})}
        assert row["measured_ms"] == pytest.approx(r0["median_ns"][dst] / 1e6)
        # the source's step as the CLI prints it (the slowest rank's mean step window) ...
        cli = bench_pairs.whatif_summary(bench_pairs.load_capture(PAIRS / name / src,
                                                                  plain=True), {})
        src_ns = cli["step_time_ns"]["per_step"]["measured"]
        assert row["source_ms"] == pytest.approx(src_ns / 1e6, rel=1e-12)
        # ... and, recounted from the raw ProfilerStep ranges, within 0.1% (the last window
        # ends where the step's own ops end, the raw count at the rank's last event)
        per_rank = _raw_step_windows(PAIRS / name / src)
        assert src_ns == pytest.approx(max(sum(v) / len(v) for v in per_rank.values()),
                                       rel=1e-3)
        assert row["no_change_err"] == pytest.approx(src_ns / r0["median_ns"][dst] - 1,
                                                     abs=1e-9)
        if row["predicted_ms"] is None:
            assert row["refused"]  # the engine's one-line reason
        else:
            assert row["predicted_ms"] > 0
            assert row["err"] == pytest.approx(row["predicted_ms"] / row["measured_ms"] - 1)
    assert out["summary"]["all"]["plain"]["predictions"] == 2
    bad = subprocess.run([sys.executable, str(ROOT / "bench" / "pairs.py"), "--pair", "nope",
                          "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert bad.returncode == 2 and "unknown pair" in json.loads(bad.stdout)["error"]


#: how a rank of examples/pairs/job.py dies inside torch while its profiler stops (torch 2.13,
#: CPU build, gloo): SIGSEGV, or ``MemoryError: std::bad_alloc`` raised by
#: ``_disable_profiler``. Seen in CI runs and in 1 of 23 loopback runs of the emb job here;
#: not in our code (the traceback ends in torch's profiler), cause not verified (torch's
#: exporter also writes uninitialized bytes on these jobs: tests/test_capture.py).
_TORCH_PROFILER_CRASH = ("terminated with signal SIGSEGV", "std::bad_alloc")


def _run_job(out: Path, args: list[str]) -> tuple[int, str]:
    """Run examples/pairs/job.py with 2 ranks on loopback (a free port, 1 settle step, 2 active
    steps, 8 MB pre-touch) and return (exit code, stderr). A run whose rank died of a
    :data:`_TORCH_PROFILER_CRASH` at profiler stop is run once more with a warning; a second
    failure, or any other failure, is returned as it is (the caller asserts on it)."""
    import os
    import signal
    import socket

    def once() -> tuple[int, str]:
        with socket.socket() as sock:  # a free port for the rendezvous
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        cmd = [sys.executable, str(ROOT / "examples" / "pairs" / "job.py"), "--out", str(out),
               *args, "--nproc-per-host", "2", "--settle", "1", "--active", "2",
               "--pretouch-mb", "8", "--master-port", str(port)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=ROOT, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the job and the ranks it spawned
            raise
        return proc.returncode, err

    rc, err = once()
    if rc != 0 and "profiler_stop" in err and any(c in err for c in _TORCH_PROFILER_CRASH):
        warnings.warn(f"a rank of the job crashed in torch's profiler; rerun: {err[-300:]}",
                      stacklevel=2)
        shutil.rmtree(out, ignore_errors=True)
        rc, err = once()
    return rc, err


@pytest.mark.skipif(not HAS_TORCH, reason='torch is not importable; install it with '
                    'pip install "retime[torch]"')
def test_job_runs_on_loopback_and_records_itself(tmp_path):
    """examples/pairs/job.py without the emulated hosts: 2 ranks on loopback, a tiny MLP with
    checkpointing; the job record and each trace's retimeCapture.job describe it."""
    out = tmp_path / "cap"
    rc, err = _run_job(out, ["--model", "mlp", "--hidden", "64", "--layers", "2", "--batch", "8",
                             "--checkpoint", "--extra", '{"rate_mbit": 0}'])
    assert rc == 0, err[-3000:]
    rec = json.loads((tmp_path / "cap.job.json").read_text())
    assert rec["ddp_param_bytes"] == [64 * 64 * 4, 64 * 4] * 2 + [64 * 4, 4]
    assert rec["checkpoint"] is True and rec["world_size"] == 2 and rec["rate_mbit"] == 0
    assert len(rec["rss_mb"]) == 2 and len(rec["settle_ms"]) == 1
    # shares over a window of a few ms: clock-tick granularity, so only their sign is exact
    assert rec["load"]["foreign"] >= 0 and rec["load"]["ours"] >= 0 and rec["load"]["wall_s"] > 0
    docs = {}
    for f in sorted(out.glob("rank-*.pt.trace.json.gz")):
        docs[int(f.name.split("-")[1].split(".")[0])] = json.loads(gzip.decompress(f.read_bytes()))
    assert sorted(docs) == [0, 1]
    for doc in docs.values():
        assert doc["retimeCapture"]["job"]["ddp_param_bytes"] == rec["ddp_param_bytes"]
        lin = sum(e.get("name") == "aten::linear" for e in doc["traceEvents"])
        assert lin == 2 * (2 * 2 + 1)  # 2 steps: 2 blocks run twice (recompute) + head
    got = bench_pairs.measured_step_ns(bench_pairs.load_capture(out))
    assert got == pytest.approx(_raw_step_ns(docs), abs=2_000)


@pytest.mark.skipif(not HAS_TORCH, reason='torch is not importable; install it with '
                    'pip install "retime[torch]"')
def test_recommender_job_all_reduces_its_dense_tables(tmp_path):
    """examples/pairs/job.py --model emb on loopback (2 ranks, small tables): every table's
    gradient is dense, so DDP's buckets carry all of them (closed form), and each step bags
    every table once."""
    out = tmp_path / "cap"
    s = {"model": "emb", "tables": 3, "rows": 50, "dim": 8, "dense": 4, "bag": 2, "batch": 6}
    rc, err = _run_job(out, ["--model", "emb", "--tables", "3", "--rows", "50", "--dim", "8",
                             "--dense", "4", "--bag", "2", "--batch", "6", "--no-probe"])
    assert rc == 0, err[-3000:]
    rec = json.loads((tmp_path / "cap.job.json").read_text())
    assert sum(rec["ddp_param_bytes"]) == _param_bytes(s)
    assert rec["ddp_param_bytes"].count(50 * 8 * 4) == 3 and "layers" not in rec
    for f in sorted(out.glob("rank-*.pt.trace.json.gz")):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        bags = [e for e in doc["traceEvents"] if e.get("name") == "aten::embedding_bag"]
        assert len(bags) == 2 * 3  # 2 recorded steps x 3 tables
        assert all(e["args"]["Input Dims"][:3] == [[50, 8], [12], [6]] for e in bags)
        ar = [e for e in doc["traceEvents"] if e.get("name") == "gloo:all_reduce"]
        assert sum(math.prod(e["args"]["Input Dims"][0]) * 4 for e in ar) \
            == 2 * _param_bytes(s)  # both steps all-reduce every gradient once
