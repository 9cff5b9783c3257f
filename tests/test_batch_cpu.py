"""The batch-independent part of a CPU job's host time (replay/policies/batch_cpu.py), on the
real captures of traces/pairs/mlp-batch-32-16 (the MLP at per-rank batch 32, A, and 16, B)."""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest

from retime.collectors.enums import OpKind, Phase
from retime.replay.policies import batch_cpu
from retime.replay.policies.batch_cpu import copy_rate, host_split, weight_bytes

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "traces" / "pairs" / "mlp-batch-32-16"
sys.path.insert(0, str(ROOT / "bench"))
from pairs import load_capture  # noqa: E402

W = {(512, 512), (1, 512), (1024, 256), (256, 1024)}


def test_weight_operand_closed_form():
    f = ["float"] * 5
    # x W^T: the weight is the second operand (1 MiB of fp32)
    assert weight_bytes("aten::addmm", [[512], [16, 512], [512, 512], [], []], f, W) == 1 << 20
    # dY W (the input's gradient)
    assert weight_bytes("aten::mm", [[16, 512], [512, 512]], f, W) == 1 << 20
    # dY^T X (the weight's gradient): the result [512, 512] is the parameter
    assert weight_bytes("aten::mm", [[512, 16], [16, 512]], f, W) == 1 << 20
    # either orientation of a non-square weight; bf16 halves it
    assert weight_bytes("aten::mm", [[2048, 1024], [1024, 256]], ["c10::BFloat16"] * 2, W) \
        == 1024 * 256 * 2
    # attention-like: no parameter operand
    assert weight_bytes("aten::mm", [[64, 64], [64, 64]], f, W) == 0


def _events(side):
    doc = json.loads(gzip.decompress((PAIR / side / "rank-0.pt.trace.json.gz").read_bytes()))
    return [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]


def _addmm_us(side, rows):
    return statistics.median(e["dur"] for e in _events(side) if e["name"] == "aten::addmm"
                             and e["args"]["Input Dims"][1] == [rows, 512])


def test_copy_rate_is_the_traces_large_copies():
    """The rate is the median bytes / duration of the trace's >= 256 KiB aten::copy_ calls
    (recomputed here from rank 0's raw events alone: the same order of magnitude as both
    ranks together, a single core's copy rate of a few GB/s)."""
    t = load_capture(PAIR / "A", plain=True)
    ev = batch_cpu._events(t)
    rate, n = copy_rate(ev)
    mine = [512 * 512 * 4 / (e["dur"] * 1e3) for e in _events("A")
            if e["name"] == "aten::copy_" and e["args"]["Input Dims"][0] == [512, 512]]
    assert n >= len(mine) > 0
    assert rate == pytest.approx(statistics.median(mine), rel=0.15)
    assert 1.0 < rate < 30.0  # GB/s (bytes per ns)


def test_gemm_split_matches_the_measured_batch_independent_time():
    """The weight copy the model keeps per addmm of the 512 x 512 weight, against what the
    two captures measured: the intercept of the addmm's time over the batch (32 vs 16) is
    the batch-independent time (the weight copy plus the dispatch); the model's part lies
    between half of it and all of it, and predicts B's addmm from A's within 15%."""
    t = load_capture(PAIR / "A", plain=True)
    rate, _ = copy_rate(batch_cpu._events(t))
    fixed_us = (512 * 512 * 4) / rate / 1e3
    a, b = _addmm_us("A", 32), _addmm_us("B", 16)
    intercept = b - (a - b)
    assert 0.5 * intercept <= fixed_us <= intercept
    pred_b = fixed_us + (a - fixed_us) * 16 / 32
    assert pred_b == pytest.approx(b, rel=0.15)
    # linear scaling (the range's other end) misses it by far more
    assert abs(a * 16 / 32 / b - 1) > 0.4


def test_host_split_keeps_python_and_gradient_handling():
    """On the real trace: the GEMMs' fixed part equals their weights' copies, the gaps that
    scale are a minority of the forward/backward host gaps (the rest is the Python
    interpreter, the autograd engine, the reducer, and the wait for the all-reduce), and no
    Python op scales."""
    t = load_capture(PAIR / "B", plain=True)
    o = t.ops
    k, ph = o["kind"].to_numpy(), o["phase"].to_numpy()
    work = ((k == OpKind.CPU_OP) | (k == OpKind.RUNTIME)) & \
        ((ph == Phase.FWD) | (ph == Phase.BWD))
    sp = host_split(t, work)
    i = sp.info
    assert i["unmatched_ranks"] == [] and i["gemms"] == i["gemms_with_weight"] > 0
    rate = i["copy_rate_gbps"]
    # per rank and step, 11 GEMMs on a 512 x 512 weight: 4 forward addmm, 4 weight
    # gradients, 3 input gradients (none for the first layer); 3 steps, 2 ranks: 66 copies
    # of 1 MiB (the 1 x 512 head's 2 KiB are negligible); a GEMM whose uncovered time is
    # shorter than the copy keeps only that time
    assert 0 < i["fixed_ns"] <= i["gemm_ns"]
    copies = i["fixed_ns"] / ((512 * 512 * 4) / rate)
    assert 0.8 * 66 <= copies <= 66 + 0.01
    assert 0.0 < i["gap_scaled_ns"] < 0.5 * i["gap_ns"]
    names = np.asarray(t.strings, dtype=object)[o["name_id"].to_numpy()]
    py = np.fromiter(((".py(" in n or n.startswith("<")) for n in names), bool, len(names))
    assert not (i["op_scales"] & py).any() and i["op_scales"].any()
    assert (sp.gap_fixed_ns >= 0).all()


def test_batch_is_read_from_embedding_indices_never_from_the_table():
    """aten::embedding(weight, indices) leads with the table: its batch is the indices';
    aten::embedding_bag's offsets may hold B + 1 entries, so it casts no vote (batch 4's
    recommender was read as batch 4000, the tables' rows)."""
    from retime.replay.policies.batch_measured import _batch_dim

    assert _batch_dim("aten::linear", [[16, 64], [32, 64], [32]]) == 16
    assert _batch_dim("aten::conv2d", [[8, 3, 32, 32], [16, 3, 3, 3]]) == 8
    assert _batch_dim("aten::embedding", [[4000, 64], [16, 128], [], [], []]) == 16
    assert _batch_dim("aten::embedding_bag", [[4000, 64], [128], [17], [], []]) is None
    assert _batch_dim("aten::embedding", [[4000, 64], [128]]) is None  # 1-D indices: no batch
    assert _batch_dim("aten::linear", []) is None


def test_recommender_pair_reads_its_own_batch():
    """On the real batch-4 captures the plain trace gives 64 and 16, not the tables' 4000."""
    from retime.replay.policies.batch_measured import _from_shapes

    root = Path(__file__).resolve().parents[1] / "traces" / "pairs" / "emb-batch-64-16"
    for label, want in (("A", 64), ("B", 16)):
        files = sorted((root / label).rglob("*.json*"))
        assert files, root / label
        meta = {"sources": [{"path": str(files[0]), "format": "kineto"}]}
        assert _from_shapes(meta) == want


def test_table_gradient_zero_fills_keep_their_time():
    """On the real batch-4 recommender captures: each step's backward zero-fills one dense
    4000 x 64 table gradient per embedding bag (8 tables, 3 steps, 2 ranks: 48 fills), a
    memset of the same 1 MB at either batch, so those fills do not scale (nor do the 12
    fills of the 1 x 256 head weight's shape, 2 per rank and step); the measured
    fills' median is indeed about the same at batch 64 and 16 (within 15%), while the
    batch-sized operators' compute is not."""
    root = ROOT / "traces" / "pairs" / "emb-batch-64-16"
    tot = {}
    for label in ("A", "B"):
        t = load_capture(root / label, plain=True)
        o = t.ops
        k, ph = o["kind"].to_numpy(), o["phase"].to_numpy()
        work = ((k == OpKind.CPU_OP) | (k == OpKind.RUNTIME)) & (ph == Phase.BWD)
        i = host_split(t, work).info
        names = np.asarray(t.strings, dtype=object)[o["name_id"].to_numpy()]
        memset = work & np.isin(names, batch_cpu.MEMSETS)
        kept = memset & ~i["op_scales"]
        assert i["param_fills"] == 60 == int(kept.sum())
        # the 1 MB tables' fills, not the 1 KB head's (a few of which were preempted)
        big = kept & (o["dur_ns"].to_numpy() > 50_000)
        assert 48 <= int(big.sum()) <= 52
        tot[label] = float(np.median(o["dur_ns"].to_numpy()[big]))
        # a 4000 x 64 fp32 fill writes 1 MB: its time is near a memset at the trace's copy
        # rate (a copy reads and writes each byte; a fill only writes)
        assert 0.2 < tot[label] / (4000 * 64 * 4 / i["copy_rate_gbps"]) < 5
    assert abs(tot["A"] / tot["B"] - 1) < 0.15
