"""Breakdown, kernel classes, communication, pipeline, memory, efficiency and compare on
hand-built traces whose answers are derived by hand, and on a modeled (synth) run."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from retime.analysis import (
    KERNEL_CLASSES,
    as_trace,
    breakdown,
    bubbles,
    busbw_factor,
    class_stats,
    classify_names,
    collectives,
    comm_summary,
    compare,
    efficiency,
    job_efficiency,
    kernel_stats,
    memory_timeline,
    metrics,
    peak_memory,
    rank_wait,
    stage_bubbles,
)
from retime.collectors.enums import CommOp, LaneKind, OpKind
from retime.collectors.errors import RetimeError
from retime.collectors.trace import Trace

K, C, M, R, CPU = (int(OpKind.KERNEL), int(OpKind.COLLECTIVE), int(OpKind.MEMCPY),
                   int(OpKind.RUNTIME), int(OpKind.CPU_OP))


def one_rank() -> Trace:
    """rank 0, one step: host lane 0, compute stream 1, comm stream 2.

    host: launch 0..10, launch 100..110           (host busy 0..10, 100..110)
    compute: kernel 10..50, kernel 120..200       (C = 10..50, 120..200)
    comm: all-reduce 40..90                        (M = 40..90)
    memcpy on stream 1: 60..70                     (Y)
    step window 0..200
    """
    return Trace.build(
        ops={"rank": [0] * 6, "lane": [0, 0, 1, 1, 2, 1],
             "kind": [R, R, K, K, C, M], "name_id": [0, 0, 1, 2, 3, 4],
             "start_ns": [0, 100, 10, 120, 40, 60], "dur_ns": [10, 10, 40, 80, 50, 10],
             "step": [7] * 6, "comm_op": [0, 0, 0, 0, int(CommOp.ALL_REDUCE), 0],
             "bytes": [0, 0, 0, 0, 1_000_000, 0]},
        lanes={"lane": [0, 1, 2], "rank": [0, 0, 0],
               "lane_kind": [int(LaneKind.CPU_THREAD), int(LaneKind.GPU_STREAM),
                             int(LaneKind.GPU_STREAM)]},
        strings=["cudaLaunchKernel", "void cutlass::Kernel<cutlass::gemm::GemmUniversal<>>",
                 "flash_fwd_kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                 "Memcpy HtoD (Pageable -> Device)"])


def test_breakdown_hand_derived():
    bd = breakdown(one_rank())
    assert len(bd) == 1
    r = bd.iloc[0]
    assert (r["rank"], r["step"], r["step_ns"]) == (0, 7, 200)
    # C = [10,50] u [120,200] = 120; M = [40,90] = 50; C∩M = [40,50] = 10
    assert r["compute_ns"] == 110
    assert r["overlapped_comm_ns"] == 10
    assert r["exposed_comm_ns"] == 40
    # Y = [60,70] lies inside M: no memcpy-alone time
    assert r["memcpy_ns"] == 0
    # idle device: [0,10], [90,120]; host busy [0,10], [100,110] -> host-bound 20
    assert r["host_bound_ns"] == 20
    assert r["idle_ns"] == 20
    assert r["busy_ns"] == 160 and r["gpu_busy_frac"] == pytest.approx(0.8)


def test_breakdown_rejects_bad_grouping():
    with pytest.raises(RetimeError, match="choose 'step' or 'rank'"):
        breakdown(one_rank(), by="layer")


def test_as_trace_rejects_other_objects():
    with pytest.raises(RetimeError, match="expected a Trace or a ReplayResult"):
        as_trace(3.0)


def test_kernel_classes_from_names():
    names = ["volta_sgemm_128x64_nn", "void cutlass::Kernel<cutlass::gemm::GemmUniversal<>>",
             "sm80_xmma_gemm_f16f16_f16f32", "Cijk_Ailk_Bljk_HHS_BH_MT128x128",
             "flash_fwd_kernel", "fmha_cutlassF_f16_aligned_64x64_rf_sm80",
             "ncclKernel_AllReduce_RING_LL_Sum_float", "ncclDevKernel_SendRecv",
             "Memcpy HtoD (Pageable -> Device)", "Memset (Device)",
             "void at::native::vectorized_elementwise_kernel<4, ...>",
             "void cudnn::bn_fw_tr_1C11_kernel_NCHW", "implicit_convolve_sgemm",
             "void at::native::unrolled_elementwise_kernel<convert>",
             "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN"]
    got = classify_names(names).tolist()
    assert got == ["GEMM", "GEMM", "GEMM", "GEMM", "attention", "attention",
                   "communication", "communication", "memory", "memory", "elementwise",
                   "norm", "conv", "elementwise", "GEMM"]


def test_kernel_stats_counts_and_shares():
    t = one_rank()
    ks = kernel_stats(t)
    # device ops only (host launches excluded): 4 names, 4 ops
    assert ks["count"].sum() == 4
    assert ks.iloc[0]["name"] == "flash_fwd_kernel" and ks.iloc[0]["total_ns"] == 80
    assert ks["share"].sum() == pytest.approx(1.0)
    assert ks["cum_share"].iloc[-1] == pytest.approx(1.0)
    cls = class_stats(t).set_index("kernel_class")["total_ns"]
    assert {k: v for k, v in cls.to_dict().items() if v} == {
        "GEMM": 40, "attention": 80, "communication": 50, "memory": 10}
    assert list(cls.index) == list(KERNEL_CLASSES)
    top = kernel_stats(t, top=2)
    assert len(top) == 2
    br = kernel_stats(t, by_rank=True)
    assert set(br["rank"]) == {0}


def four_rank_allreduce() -> Trace:
    """One all-reduce of 8 MB over 4 ranks; ranks arrive at 0, 100, 300, 1000 ns and all
    finish at 5000 ns (the last arriver transfers for 4000 ns)."""
    starts = [0, 100, 300, 1000]
    return Trace.build(
        ops={"rank": [0, 1, 2, 3], "lane": [0, 1, 2, 3], "kind": [C] * 4, "name_id": [0] * 4,
             "start_ns": starts, "dur_ns": [5000 - s for s in starts], "coll_id": [9] * 4,
             "comm_op": [int(CommOp.ALL_REDUCE)] * 4, "bytes": [8_000_000] * 4,
             "group_id": [0] * 4},
        lanes={"lane": [0, 1, 2, 3], "rank": [0, 1, 2, 3], "lane_kind": [1] * 4},
        strings=["ncclKernel_AllReduce"],
        groups=[{"group_id": 0, "name": "default_pg", "ranks": [0, 1, 2, 3]}])


def test_collective_skew_wait_and_nccl_tests_bandwidth():
    co = collectives(four_rank_allreduce())
    assert len(co) == 1
    r = co.iloc[0]
    assert r["members"] == 4 and r["n_ranks"] == 4 and r["last_rank"] == 3
    assert r["skew_ns"] == 1000
    assert r["wait_ns"] == 1000 + 900 + 700 + 0
    assert r["transfer_ns"] == 4000
    # algbw = S / t = 8e6 B / 4e-6 s = 2000 GB/s; all-reduce busbw = algbw * 2(n-1)/n
    assert r["algbw_gbps"] == pytest.approx(2000.0)
    assert r["busbw_gbps"] == pytest.approx(2000.0 * 2 * 3 / 4)
    s = comm_summary(co)
    assert s.iloc[0]["instances"] == 1 and s.iloc[0]["busbw_gbps"] == pytest.approx(3000.0)
    rw = rank_wait(four_rank_allreduce()).set_index("rank")
    assert rw.loc[0, "wait_ns"] == 1000 and rw.loc[3, "last_arrivals"] == 1


def test_busbw_factors_follow_nccl_tests():
    ops = [CommOp.ALL_REDUCE, CommOp.ALL_GATHER, CommOp.REDUCE_SCATTER, CommOp.ALL_TO_ALL,
           CommOp.BROADCAST, CommOp.SEND]
    f = busbw_factor(np.array([int(o) for o in ops]), np.full(len(ops), 8))
    assert f.tolist() == pytest.approx([2 * 7 / 8, 7 / 8, 7 / 8, 7 / 8, 1.0, 1.0])


def two_stage_pipeline() -> Trace:
    """2 stages (ranks 0, 1), 2 micro-batches, op-level compute on one stream each.
    stage 0 computes 0..10, 10..20, then 40..50, 50..60 (bwd); stage 1 computes 10..30,
    30..50 ... arranged so stage 0 is idle 20..40 and stage 1 idle 0..10 and 50..60."""
    COMP = int(OpKind.COMPUTE)
    return Trace.build(
        ops={"rank": [0, 0, 0, 0, 1, 1], "lane": [0, 0, 0, 0, 1, 1], "kind": [COMP] * 6,
             "name_id": [0] * 6, "start_ns": [0, 10, 40, 50, 10, 30],
             "dur_ns": [10, 10, 10, 10, 20, 20], "stage": [0, 0, 0, 0, 1, 1],
             "microbatch": [0, 1, 0, 1, 0, 1], "step": [0] * 6},
        lanes={"lane": [0, 1], "rank": [0, 1], "lane_kind": [int(LaneKind.OP_STREAM)] * 2},
        strings=["fwd"])


def test_pipeline_bubbles_per_stage():
    b = bubbles(two_stage_pipeline()).set_index("rank")
    assert b.loc[0, "step_ns"] == 60 and b.loc[0, "bubble_ns"] == 20
    assert b.loc[1, "step_ns"] == 40 and b.loc[1, "bubble_ns"] == 0
    assert b.loc[0, "microbatches"] == 2
    # GPipe/1F1B ideal bubble (p-1)/(m+p-1) with p=2, m=2
    assert b.loc[0, "ideal_bubble_frac"] == pytest.approx(1 / 3)
    sb = stage_bubbles(two_stage_pipeline()).set_index("stage")
    assert sb.loc[0, "bubble_frac"] == pytest.approx(20 / 60)
    assert sb.loc[1, "bubble_frac"] == 0


def test_memory_timeline_from_samples_and_deltas():
    t = one_rank()
    t.memory = pd.DataFrame({"rank": np.array([0, 0, 0], np.int32),
                             "device": np.array([0, 0, 0], np.int32),
                             "ts_ns": np.array([30, 10, 20], np.int64),
                             "bytes_delta": np.array([-50, 100, 200], np.int64),
                             "allocated_bytes": np.array([-1, -1, -1], np.int64),
                             "reserved_bytes": np.array([-1, -1, -1], np.int64)})
    tl = memory_timeline(t)
    assert tl["ts_ns"].tolist() == [10, 20, 30]
    assert tl["allocated_bytes"].tolist() == [100, 300, 250]
    pm = peak_memory(t)
    assert pm.iloc[0]["peak_allocated_bytes"] == 300 and pm.iloc[0]["source"] == "delta"


def test_efficiency_mfu_hfu_from_flops_and_peak():
    t = one_rank()
    t.ops["flops"] = np.array([np.nan, np.nan, 4e6, 8e6, np.nan, np.nan])
    t.meta["devices"] = {"0": {"0": {"name": "NVIDIA A100-SXM4-80GB"}}}
    e = efficiency(t)
    # 12e6 flops in 200 ns on a 312 TFLOP/s part
    assert e.iloc[0]["hfu"] == pytest.approx(12e6 / (200e-9 * 312e12))
    assert e.iloc[0]["mfu"] == pytest.approx(e.iloc[0]["hfu"])
    assert job_efficiency(e)["mfu"] == pytest.approx(e.iloc[0]["mfu"])
    t.meta["devices"] = {}
    assert np.isnan(efficiency(t).iloc[0]["mfu"])


def test_compare_deltas():
    a = one_rank()
    b = one_rank()
    b.ops["dur_ns"] = b.ops["dur_ns"] * 2
    cmp = compare(a, b).set_index("metric")
    ma, mb = metrics(a), metrics(b)
    assert cmp.loc["step_ns", "baseline"] == ma["step_ns"] == 200
    assert cmp.loc["step_ns", "candidate"] == mb["step_ns"]
    assert cmp.loc["step_ns", "delta"] == mb["step_ns"] - 200
    assert cmp.loc["step_ns", "delta_pct"] == pytest.approx(100 * (mb["step_ns"] - 200) / 200)
    assert cmp.loc["attention_ns", "delta"] == 80


def test_modeled_run_mfu_and_memory_match_synth():
    import retime.collectors.synth as synth
    t = synth.synthesize("gpt3-1.3b", "a100-80gb", tp=2, pp=2, dp=1, global_batch=8,
                         micro_batch=1)
    je = job_efficiency(t)
    assert je["mfu"] == pytest.approx(t.meta["synth"]["mfu"], rel=1e-6)
    pm = peak_memory(t)
    if len(t.memory):  # synth writes a modeled allocator timeline
        assert (pm["source"] == "trace").all()
        assert pm["peak_allocated_bytes"].max() == pytest.approx(
            t.meta["synth"]["peak_memory_bytes"], rel=0.05)
    else:  # otherwise the modeled per-stage totals
        assert (pm["source"] == "model").all()
        assert pm["peak_allocated_bytes"].max() == t.meta["synth"]["peak_memory_bytes"]
    assert list(pm["stage"]) == [0, 0, 1, 1]
    sb = stage_bubbles(t)
    assert list(sb["stage"]) == [0, 1]
    assert ((sb["bubble_frac"] >= 0) & (sb["bubble_frac"] < 1)).all()
