"""NCCL what-ifs on measured GPU traces through the cost layer (issue 27 parts 2-3):
``overlap.bucket_mb`` and ``network.*_gbps`` priced by collectors/costs/nccl.py on the
trace's GPU and platform, and ``overlap.sm_share`` (compute-communication interference of
NCCL kernels), on the shared real traces."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import KINETO, ingest_cached

from retime.analysis.breakdown import breakdown
from retime.collectors.costs.cluster import load_preset
from retime.collectors.costs.interference import interference
from retime.collectors.costs.nccl import collective_cost
from retime.collectors.enums import CommOp, OpKind
from retime.collectors.errors import PolicyError
from retime.replay import prediction_range, replay, whatif
from retime.replay.policies.keys import KEYS


@pytest.fixture(scope="module")
def a100():
    return ingest_cached(KINETO / "a100-ddp-nccl")


@pytest.fixture(scope="module")
def dlrm():
    return ingest_cached(KINETO / "dlrm-v100-8rank")


@pytest.fixture(scope="module")
def mi300x():
    return ingest_cached(KINETO / "mi300x-resnet-ddp")


def _exposed_ms(res) -> float:
    return float(breakdown(res, by="rank")["exposed_comm_ns"].mean()) / 1e6


def test_bucket_1mb_on_a100_is_priced_by_the_nccl_model_and_changes_exposed_comm_modestly(a100):
    """Rank 0 of 2: every all-reduce is partially traced, so its time (2-3 ms for 8-31 MB)
    is mostly waiting for rank 1. The transfer comes from the NCCL model (ring/LL, as the
    kernel names say every bucket ran), not from an intercept fitted on waiting; the wait is
    kept (assumed: lines say so) and 1 MB buckets change exposed communication modestly."""
    base = _exposed_ms(replay(a100))
    r1 = whatif(a100, {"overlap.bucket_mb": 1})
    r25 = whatif(a100, {"overlap.bucket_mb": 25})
    sc = r1.meta["scenario"][0]
    assert sc["model"] == "nccl" and (sc["algorithm"], sc["protocol"]) == ("ring", "LL")
    assert sc["kappa_source"] == "model" and sc["waiting_kept"]
    assumed = r1.meta["whatif"]["assumed"]
    assert any("NCCL model" in a and "NCCL_PROTO" in a for a in assumed)
    assert any("untraced" in a and "waiting" in a for a in assumed)
    e1, e25 = _exposed_ms(r1), _exposed_ms(r25)
    assert 0.8 * base < e1 < 1.6 * base  # was 6.6x (260.7 vs 39.6 ms) from an 875 us intercept
    assert 0.6 * base < e25 < 1.2 * base  # about the measured buckets
    assert e1 / e25 < 2.0
    # the range replays the model's bounds and each reading of the wait
    variants = r1.meta["whatif"]["range_variants"]
    assert {"overlap.cost_bound": "high"} in variants and {"overlap.peer_wait": "lag"} in variants
    lo, hi = prediction_range(r1)
    assert lo <= r1.step_times()["replayed_step_ns"].max() <= hi


def test_a_new_bucket_is_the_nccl_models_ring_ll_time_plus_its_share_of_the_wait(a100):
    """The modeled transfer of a 1 MB bucket on 2 A100s is what `retime cost collective`
    prints for ring/LL (independently: the dgx-a100 preset cut to 2 GPUs); the wait kept for
    rank 1 is never below zero and the step's last bucket waits for rank 1's last arrival."""
    from retime.replay.policies.bucketing import rebucket

    t, ids, model_ns, info = rebucket(a100, 1.0, peer_wait="bytes")
    ref = collective_cost(load_preset("dgx-a100").with_overrides(gpus_per_node=2), "all_reduce",
                          1_000_000, algo="ring", proto="LL").time_us * 1e3
    b = t.ops["bytes"].to_numpy()[ids]
    full = b == 1_000_000
    assert full.sum() > 100
    assert (model_ns[full] >= ref * (1 - 1e-9)).all()
    # the measured buckets of a step less their modeled transfers is the wait spread back
    o = a100.ops
    ar = (o["kind"] == OpKind.COLLECTIVE) & (o["comm_op"] == CommOp.ALL_REDUCE) & (o["bytes"] > 0)
    step = int(o.loc[ar, "step"].iloc[0])
    old = o[ar & (o["step"] == step)]
    t_old = [collective_cost(load_preset("dgx-a100").with_overrides(gpus_per_node=2),
                             "all_reduce", int(x), algo="ring", proto="LL").time_us * 1e3
             for x in old["bytes"]]
    waited = float(np.maximum(old["dur_ns"].to_numpy() - np.asarray(t_old), 0).sum())
    mine = t.ops["step"].to_numpy()[ids] == step
    assert model_ns[mine].sum() == pytest.approx(waited + sum(
        collective_cost(load_preset("dgx-a100").with_overrides(gpus_per_node=2), "all_reduce",
                        int(x), algo="ring", proto="LL").time_us * 1e3 for x in b[mine]),
        rel=1e-6)


def test_bucket_sizes_on_mi300x_keep_the_step_bound_by_the_late_ranks(mi300x):
    """Rank 0 of 8 waits ~7 ms per bucket for the others: no bucket size ends its step
    much before they arrive. Small buckets spin next to more compute (interference of their
    SMs: a few percent slower); the measured step stays inside each what-if's range."""
    base = replay(mi300x).step_times()["replayed_step_ns"].max()
    for mb in (1, 5, 100):
        r = whatif(mi300x, {"overlap.bucket_mb": mb})
        st = r.step_times()["replayed_step_ns"].max()
        assert 0.95 * base <= st <= 1.06 * base, mb
        assert r.meta["scenario"][0]["model"] == "nccl"
        assert r.meta["scenario"][0]["measured_sm_share"] > 0  # interference priced
        lo, hi = prediction_range(r)
        assert lo <= base <= hi, mb


def test_network_key_is_the_nominal_rate_and_replay_prints_fitted_and_assumed(dlrm):
    """DLRM's V100s ran on NVLink2 (150 GB/s per GPU): stating 150 changes nothing (it meant
    3.5x faster against the 33.8 GB/s fit before); 300 shortens the all-reduces by the NCCL
    model's change, scaled by the fitted measured/modeled ratio of the fully traced ones."""
    base = replay(dlrm)
    same = whatif(dlrm, {"network.intra_node_gbps": 150})
    np.testing.assert_array_equal(same.end_ns, base.end_ns)
    fast = whatif(dlrm, {"network.intra_node_gbps": 300})
    lv = fast.meta["whatif"]["nccl_network"]["levels"]["intra-node"]
    assert lv["nominal_gbps"] == 150 and lv["assumed_gbps"] == 300
    assert lv["kappa_source"] == "fitted" and 0.7 < lv["kappa"] < 1.3
    # measured bus bandwidth of the largest all-reduce's last arriver, derived here
    o = dlrm.ops
    big = (o["comm_op"] == CommOp.ALL_REDUCE) & (o["bytes"] == o.loc[o["comm_op"] == 1, "bytes"].max())
    t_last = o.loc[big, "dur_ns"].min()  # the last arriver waited for nobody: the shortest
    assert lv["measured_busbw_gbps"] == pytest.approx(
        o.loc[big, "bytes"].iloc[0] * 2 * 7 / 8 / t_last, rel=0.05)
    assert lv["model_busbw_new_gbps"] > lv["model_busbw_gbps"]
    assert any("measured" in a and "150 GB/s nominal" in a
               for a in fast.meta["whatif"]["assumed"])
    ar = np.flatnonzero(((o["kind"] == OpKind.COLLECTIVE) & (o["comm_op"] == CommOp.ALL_REDUCE)
                         & (o["bytes"] > 100_000)).to_numpy())
    assert (fast.trace.ops["dur_ns"].to_numpy()[ar] <= base.trace.ops["dur_ns"].to_numpy()[ar]).all()
    slow = whatif(dlrm, {"network.intra_node_gbps": 25})
    assert slow.step_time_ns >= base.step_time_ns >= fast.step_time_ns


def test_replay_cli_prints_the_nccl_figures(tmp_path, dlrm):
    from typer.testing import CliRunner

    from retime.cli import app

    dlrm.save(tmp_path / "d.retime")
    r = CliRunner().invoke(app, ["replay", str(tmp_path / "d.retime"), "--set",
                                 "network.intra_node_gbps=300", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    lv = d["whatif"]["nccl_network"]["levels"]["intra-node"]
    assert lv["assumed_gbps"] == 300 and lv["fitted_busbw_gbps"] > 0
    r = CliRunner().invoke(app, ["replay", str(tmp_path / "d.retime"), "--set",
                                 "network.intra_node_gbps=300"])
    assert r.exit_code == 0
    assert "assumed: intra-node link: measured" in r.output


def test_interference_model_reproduces_c3s_published_fractions():
    assert interference(0.0).overlap_fraction == pytest.approx(0.72)  # DMA offload (ConCCL)
    assert interference(0.2).overlap_fraction == pytest.approx(0.21)  # naive, default channels
    lo, hi = interference(0.2, bound="low"), interference(0.2, bound="high")
    assert lo.slowdown < interference(0.2).slowdown < hi.slowdown
    assert interference(0.0, bound="high").slowdown == pytest.approx(0.28)  # SM part only


def test_sm_share_offload_helps_more_channels_hurt_and_the_measured_share_is_identity(mi300x):
    base = replay(mi300x).step_times()["replayed_step_ns"].max()
    r0 = whatif(mi300x, {"overlap.sm_share": 0.0})
    p0 = r0.meta["scenario"][0]["measured_sm_share"]
    same = whatif(mi300x, {"overlap.sm_share": p0})
    more = whatif(mi300x, {"overlap.sm_share": 0.3})
    st = [x.step_times()["replayed_step_ns"].max() for x in (r0, same, more)]
    assert st[1] == pytest.approx(base, rel=0.005)
    assert st[0] < base < st[2]
    assert any("C3" in a for a in r0.meta["whatif"]["assumed"])
    assert {"overlap.cost_bound": "low"} in r0.meta["whatif"]["range_variants"]


def test_sm_share_refuses_gloo_and_conflicts():
    gloo = ingest_cached(KINETO / "cpu-gloo-rank34")
    with pytest.raises(PolicyError, match="gloo"):
        whatif(gloo, {"overlap.sm_share": 0.1})
    with pytest.raises(PolicyError, match="interference"):
        whatif(gloo, {"overlap.sm_share": 0.1, "overlap.interference": 0.5})
    with pytest.raises(PolicyError, match="sm_share"):
        whatif(gloo, {"overlap.sm_share": 1.5})


def test_unsized_v100_collectives_refuse_buckets_but_take_sm_share():
    v100 = ingest_cached(KINETO / "v100-ddp-sgd")
    with pytest.raises(PolicyError, match="sizes"):
        whatif(v100, {"overlap.bucket_mb": 1})
    base = replay(v100).step_time_ns
    assert whatif(v100, {"overlap.sm_share": 0.0}).step_time_ns <= base


def test_new_keys_are_catalogued():
    for k in ("overlap.sm_share", "overlap.cost_bound", "overlap.peer_wait"):
        assert k in KEYS and KEYS[k].values


def test_the_measured_sm_share_is_the_nccl_kernels_launch_grid(a100):
    """Kineto records each kernel's grid; NCCL runs one block per channel (C13): the reader
    keeps the collective kernels' median grid, read here from the raw file independently."""
    import gzip

    raw = json.load(gzip.open(KINETO / "a100-ddp-nccl" / "nccl_data.json.gz"))
    grids = [e["args"]["grid"][0] for e in raw["traceEvents"]
             if e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower()]
    assert len(grids) == 21
    dev = a100.meta["devices"]["0"]["0"]
    assert dev["nccl_blocks"] == int(np.median(grids)) == 8
    r = whatif(a100, {"overlap.sm_share": 0.0})
    sc = r.meta["scenario"][0]
    assert sc["measured_sm_share"] == pytest.approx(8 / dev["sms"], abs=1e-4)
    assert sc["interference_sources"]["measured_share"] == "measured (kernel grid)"
    assert any("launch grid: measured" in a for a in r.meta["whatif"]["assumed"])


def test_memory_bound_kernels_lose_bandwidth_not_sms_next_to_nccl():
    """overlap.sm_share per kernel: a compute-bound kernel keeps C3's GEMM figure; a
    memory-bound one loses HBM bandwidth to NCCL's traffic (also with DMA offload, where a
    GEMM loses only the memory floor) but little of the SM part (values derived by hand)."""
    from retime.collectors.costs.interference import (
        HBM_PER_WIRE_BYTE,
        kernel_slowdowns,
        nccl_hbm_share,
    )
    ridge = 250.0
    b = nccl_hbm_share(400.0, 4000.0)
    assert b == pytest.approx(HBM_PER_WIRE_BYTE.value * 0.1)  # 3 x 400 / 4000 = 0.3
    ai = np.array([np.nan, 1e4, 50.0, 0.5])
    for p in (0.0, 0.1, 0.2, 0.4):
        base = interference(p)
        s = kernel_slowdowns(base, ai, ridge, b)
        assert s[0] == base.slowdown and s[1] == pytest.approx(base.slowdown)
        sm = base.slowdown - 0.28
        # needs all the bandwidth: gets 1 - b of it -> b / (1 - b) more
        assert s[2] == pytest.approx(0.28 + sm * 50 / 250 + 0.3 / 0.7)
        assert s[3] == pytest.approx(0.28 + sm * 0.5 / 250 + 0.3 / 0.7)
    off, naive = interference(0.0), interference(0.2)
    mb_off, mb_naive = kernel_slowdowns(off, [1.0], ridge, b)[0], \
        kernel_slowdowns(naive, [1.0], ridge, b)[0]
    # DMA offload helps a GEMM by 0.51 but a memory-bound kernel by almost nothing
    assert naive.slowdown - off.slowdown == pytest.approx(0.51)
    assert mb_naive - mb_off < 0.01
    assert mb_off > off.slowdown + 0.4
    # just above the ridge a kernel still needs most of the bandwidth: slowed more than C3
    s = kernel_slowdowns(naive, [300.0], ridge, b)[0]
    assert s == pytest.approx(0.79 + (250 / 300 + 0.3 - 1) / 0.7)
    # a kernel spinning for peers most of the time moves little data
    assert kernel_slowdowns(interference(0.0, active=0.1), [1.0], ridge, b, active=0.1)[0] \
        == pytest.approx(0.1 * (0.28 + 0.3 / 0.7))


def test_sm_share_on_a_shaped_trace_is_per_kernel(mi300x):
    p0 = whatif(mi300x, {"overlap.sm_share": 0.0}).meta["scenario"][0]["measured_sm_share"]
    r = whatif(mi300x, {"overlap.sm_share": 0.3})
    sc = r.meta["scenario"][0]
    assert sc["shaped_kernels"] > sc["memory_bound_kernels"] > 0
    assert 0 < sc["nccl_hbm_share"] < 0.9
    # memory-bound kernels lose less than C3's GEMM figure when NCCL takes SMs
    assert sc["slowdown_memory_bound_median"] < sc["slowdown_used"]
    assert any("ridge point" in a for a in r.meta["whatif"]["assumed"])
    # the measured share stays the identity with per-kernel slowdowns
    base = replay(mi300x).step_times()["replayed_step_ns"].max()
    same = whatif(mi300x, {"overlap.sm_share": p0}).step_times()["replayed_step_ns"].max()
    assert same == pytest.approx(base, rel=0.005)
