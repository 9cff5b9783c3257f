"""compression.dp / tp / pp and codec_gbps: smaller transfers, codec on the compute stream."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import KINETO, ingest_cached

from retime.collectors import CommOp, EdgeKind, LaneKind, OpKind, PolicyError, Trace
from retime.replay import replay, whatif

H, G = LaneKind.CPU_THREAD, LaneKind.GPU_STREAM


def _two_ranks(nbytes: int = 1000) -> Trace:
    """Per rank: K1 [0, 100] and K2 [300, 400] on the compute stream, an all-reduce of
    ``nbytes`` on the comm stream [100, 300] between them (K1 -> C -> K2)."""
    ops = {"rank": [], "lane": [], "kind": [], "name_id": [], "start_ns": [], "dur_ns": [],
           "coll_id": [], "comm_op": [], "bytes": [], "group_id": []}
    src, dst = [], []
    for r in (0, 1):
        base = len(ops["rank"])
        for lane, kind, nm, s, d, c in ((2 * r, OpKind.KERNEL, 0, 0, 100, -1),
                                        (2 * r + 1, OpKind.COLLECTIVE, 1, 100, 200, 7),
                                        (2 * r, OpKind.KERNEL, 0, 300, 100, -1)):
            ops["rank"].append(r)
            ops["lane"].append(lane)
            ops["kind"].append(kind)
            ops["name_id"].append(nm)
            ops["start_ns"].append(s)
            ops["dur_ns"].append(d)
            ops["coll_id"].append(c)
            ops["comm_op"].append(CommOp.ALL_REDUCE if c >= 0 else CommOp.NONE)
            ops["bytes"].append(nbytes if c >= 0 else 0)
            ops["group_id"].append(0 if c >= 0 else -1)
        src += [base, base + 1]
        dst += [base + 1, base + 2]
    return Trace.build(
        ops=ops, lanes={"lane": [0, 1, 2, 3], "rank": [0, 0, 1, 1], "device": [0, 0, 1, 1],
                        "lane_kind": [G] * 4},
        edges={"src": src, "dst": dst, "kind": [EdgeKind.SYNC] * 4, "lag_ns": [0] * 4},
        groups=[{"group_id": 0, "name": "0:default_pg", "ranks": [0, 1]}],
        strings=["gemm", "ncclKernel_AllReduce"], meta={"world_size": 2})


def test_closed_form_transfer_and_codec():
    t = _two_ranks()
    assert replay(t).step_time_ns == 400
    # one calibration point: the all-reduce's tail (200 ns) is all bandwidth; 4x smaller
    # messages leave a quarter of it
    w = whatif(t, {"compression.dp": 4})
    assert int(w.end_ns[1] - w.start_ns[1]) == 50
    assert w.step_time_ns == 100 + 50 + 100
    eff = w.meta["scenario"][0]["compression_effect"]
    assert eff["collectives"] == 2 and eff["bytes_saved"] == 2 * 750
    # a 10 GB/s codec: 1000 B take 100 ns to compress (after K1, on the compute stream)
    # and 100 ns to decompress (before K2): 200 + 50 + 200
    c = whatif(t, {"compression.dp": 4, "compression.codec_gbps": 10})
    assert c.step_time_ns == 450
    assert int(c.start_ns[1]) == 200 and int(c.end_ns[2]) == 450
    assert whatif(t, {"compression.dp": 1}).step_time_ns == 400


def test_refusals():
    t = _two_ranks()
    with pytest.raises(PolicyError, match="no tp collectives"):
        whatif(t, {"compression.tp": 2})
    with pytest.raises(PolicyError, match=">= 1"):
        whatif(t, {"compression.dp": 0.5})
    with pytest.raises(PolicyError, match="no sizes"):
        whatif(_two_ranks(nbytes=0), {"compression.dp": 2})
    with pytest.raises(PolicyError, match="no sizes"):
        whatif(ingest_cached(KINETO / "v100-ddp-sgd"), {"compression.dp": 2})


def test_synthesized_saving_is_the_alpha_beta_difference():
    from retime.collectors.synth import load_hardware, synthesize
    t = synthesize("gpt3-125m", "a100-80gb", dict(tp=2, pp=2, dp=2, global_batch=8,
                                                   micro_batch=1))
    hw = load_hardware("a100-80gb")
    o = t.ops
    tp_ops = o[(o["kind"] == OpKind.COLLECTIVE) & o["group_id"].isin(
        t.groups[t.groups["name"].str.startswith("tp")]["group_id"])]
    assert (tp_ops["comm_op"] == CommOp.ALL_REDUCE).all()
    w = whatif(t, {"compression.tp": 4})
    eff = w.meta["scenario"][0]["compression_effect"]
    assert eff["collectives"] == len(tp_ops)
    # the saving is the cost layer's time at S minus at S / 4 for each collective (the
    # synthesizer's formula), and at least the bandwidth term S 2(n-1)/n / B it removes
    from retime.collectors.synth.costs import CommModel
    from retime.collectors.synth.parallel import ParallelConfig
    cm = CommModel(hw, ParallelConfig(tp=2, pp=2, dp=2, global_batch=8))
    sizes = tp_ops["bytes"].to_numpy(float)
    expect = sum(cm.collective_ns(CommOp.ALL_REDUCE, b, "tp")
                 - cm.collective_ns(CommOp.ALL_REDUCE, b / 4, "tp") for b in sizes)
    assert abs(eff["transfer_saved_ns"] - expect) <= len(tp_ops)  # integer ns per call
    bw = hw.intra.gbps * hw.intra.bus_efficiency
    assert eff["transfer_saved_ns"] >= (sizes * 0.75 / bw).sum()
    base = replay(t).step_time_ns
    assert w.step_time_ns < base
    # pipeline sends: one p2p each way per micro-batch and stage boundary
    p = whatif(t, {"compression.pp": 2}).meta["scenario"][0]["compression_effect"]
    assert p["collectives"] == int((o["kind"] == OpKind.P2P).sum())


def test_measured_mi300x_ratio_and_codec_sweep():
    from retime.replay.sweep import grid_scenarios, sweep
    t = ingest_cached(KINETO / "mi300x-resnet-ddp")
    o = t.ops
    ar = o[(o["kind"] == OpKind.COLLECTIVE) & (o["comm_op"] == CommOp.ALL_REDUCE)
           & (o["bytes"] > 0)]
    df = sweep(t, grid_scenarios({"grid": {"compression.dp": [1, 2, 4, 8],
                                           "compression.codec_gbps": [1000.0, 20.0]}}),
               workers=1)
    assert df["error"].isna().all()
    base = replay(t).step_time_ns
    fast = df[df["compression.codec_gbps"] == 1000.0].sort_values("compression.dp")
    slow = df[df["compression.codec_gbps"] == 20.0].sort_values("compression.dp")
    # ratio 1 is no compression: no codec runs either
    assert fast["step_time_ns"].iloc[0] == slow["step_time_ns"].iloc[0] == base
    assert fast["step_time_ns"].is_monotonic_decreasing
    assert (slow["step_time_ns"].to_numpy()[1:] > fast["step_time_ns"].to_numpy()[1:]).all()
    w = whatif(t, {"compression.dp": 4})
    eff = w.meta["scenario"][0]["compression_effect"]
    # only the sized all-reduces are compressed (broadcasts and unsized ops are not)
    assert eff["collectives"] == len(ar)
    assert eff["bytes_saved"] == pytest.approx(0.75 * ar["bytes"].sum(), abs=1)
    assert w.step_time_ns < base


def test_dlrm_all_to_all_untouched():
    t = ingest_cached(KINETO / "dlrm-v100-8rank")
    w = whatif(t, {"compression.dp": 2})
    o = t.ops
    n_ar = int(((o["kind"] == OpKind.COLLECTIVE) & (o["comm_op"] == CommOp.ALL_REDUCE)).sum())
    assert w.meta["scenario"][0]["compression_effect"]["collectives"] == n_ar == 24
    # the embedding all-to-alls (model parallel) are not data-parallel traffic
    raw_ar = 0
    for f in sorted((KINETO / "dlrm-v100-8rank").glob("*.json.gz")):
        with gzip.open(f, "rt") as fh:
            raw_ar += sum(1 for e in json.load(fh)["traceEvents"] if e.get("cat") == "kernel"
                          and "AllReduce" in e["name"])
    assert raw_ar == n_ar
