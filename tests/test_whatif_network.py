"""Network and hardware what-ifs: direction and amount against the alpha-beta closed form."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import KINETO, ingest_cached

from retime.collectors.enums import CommOp, OpKind
from retime.collectors.errors import PolicyError
from retime.collectors.ingest import read
from retime.collectors.synth import load_hardware, synthesize
from retime.collectors.trace import Trace
from retime.replay import build_graph, replay, whatif
from retime.replay.policies import Hardware, Network, calibrate, kernel_class
from retime.replay.policies.link_fit import collective_table

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
HW = load_hardware("a100-80gb")


@pytest.fixture(scope="module")
def dp_job():
    """Comm-bound data parallelism over two DGX nodes: one gradient bucket after backward,
    so the all-reduce is fully exposed."""
    return synthesize("gpt3-125m", "a100-80gb", tp=1, pp=1, dp=16, global_batch=16,
                      micro_batch=1, bucket_mb=300, grad_reduce_dtype="bf16")


@pytest.fixture(scope="module")
def dlrm():
    return read(sorted((TRACES / "kineto" / "dlrm-v100-8rank").glob("*")))


def _as_measured(t: Trace) -> Trace:
    meta = {k: v for k, v in t.meta.items() if k != "synth"}
    meta["source_format"] = "kineto"
    meta["hostnames"] = {str(r): f"node{r // 8}" for r in range(int(t.ops["rank"].max()) + 1)}
    return Trace(ops=t.ops, lanes=t.lanes, edges=t.edges, ranges=t.ranges, groups=t.groups,
                 memory=t.memory, strings=t.strings, meta=meta)


def _with_inter(hw, gbps):
    import dataclasses
    return dataclasses.replace(hw, inter=dataclasses.replace(hw.inter, gbps=gbps))


def test_halving_inter_node_bandwidth_costs_the_alpha_beta_amount(dp_job):
    o = dp_job.ops
    ar = (o["kind"] == OpKind.COLLECTIVE) & (o["comm_op"] == CommOp.ALL_REDUCE) & (o["rank"] == 0)
    assert ar.sum() == 1  # one bucket
    S = float(o.loc[ar, "bytes"].iloc[0])
    n, per_node = 16, 8
    # closed form (the cost layer's ring/Simple, PUBLISHED.md §3): bus bytes 2(n-1)/n * S
    # over the slowest level, plus one pipeline pass of the soft minimum of S and
    # I = n x 16 channels x 64 KiB x w (S I / sqrt(S^2 + I^2))
    # (two channels per NIC leave the node); the inter-node level gives each of the node's
    # 8 members its NIC share. w: the ring's 2 network hops fill at the slowest level's
    # rate, its 14 NVLink hops at the NVLink rate (nccl.ring_fill_weight). Latency terms
    # are the same at both rates.
    inter_gbps = HW.nics * HW.nic_gbps / HW.gpus_per_node
    intra = HW.intra.gbps * HW.intra.bus_efficiency

    def bus_us(net, nic_gbps):
        # two channels per NIC (16) where a NIC runs at 25 GB/s or more, else one (8):
        # NCCL doubles a ring's channels only at >= 25 GB/s per channel (REFERENCES C32)
        channels = 16 if nic_gbps >= 25.0 else 8
        slow = min(intra, net)
        w = ((n - 2) * slow / intra + 2 * slow / net) / n
        inflight = n * channels * 65536 * w
        moved = S + S * inflight / (S * S + inflight * inflight) ** 0.5
        return moved * 2 * (n - 1) / n / slow

    expected = (bus_us(inter_gbps / 2 * HW.inter.bus_efficiency * per_node, HW.nic_gbps / 2)
                - bus_us(inter_gbps * HW.inter.bus_efficiency * per_node, HW.nic_gbps))
    from retime.collectors.costs import Group, cluster_from_hardware, collective_cost
    for hw in (HW, _with_inter(HW, inter_gbps / 2)):
        r = collective_cost(cluster_from_hardware(hw), "all_reduce", int(S),
                            group=Group(16, 8, 2, False))
        assert (r.algorithm, r.protocol) == ("ring", "Simple")
    base = whatif(dp_job)
    half = whatif(dp_job, {"network.inter_node_gbps": inter_gbps / 2})
    assert half.meta["whatif"]["resynthesized"]
    assert base.step_time_ns == dp_job.meta["synth"]["step_time_ns"]
    assert half.step_time_ns - base.step_time_ns == pytest.approx(expected, abs=2)
    assert expected > 0.05 * base.step_time_ns  # the job really is comm-bound


@pytest.mark.parametrize("kw", [dict(tp=2, pp=2, dp=4, global_batch=16, micro_batch=1),
                                dict(tp=1, pp=1, dp=16, global_batch=32, micro_batch=2,
                                     zero=3)])
def test_less_bandwidth_or_more_latency_never_speeds_up(kw):
    t = synthesize("gpt3-125m", "a100-80gb", **kw)
    base = whatif(t).step_time_ns
    for scen in ({"network.inter_node_gbps": 12.5}, {"network.intra_node_gbps": 150},
                 {"network.latency_us": 50}, {"topology.ranks_per_node": 4}):
        assert whatif(t, scen).step_time_ns >= base, scen


def test_calibration_recovers_the_synthesized_bus_bandwidth(dp_job):
    t = synthesize("gpt3-125m", "a100-80gb", tp=1, pp=1, dp=16, global_batch=16,
                   micro_batch=1, bucket_mb=20)
    m = _as_measured(t)
    g = build_graph(m)
    cal = calibrate(m, g, collective_table(m, g))
    bw = min(HW.intra.gbps * HW.intra.bus_efficiency,
             HW.nics * HW.nic_gbps / HW.gpus_per_node * HW.inter.bus_efficiency * 8)
    # The NCCL model is not one alpha-beta line: its 28 MB buckets run tree/LL128 and the
    # 80 MB one ring/LL128, each with a pipeline start-up of ~0.26 ms (one chunk pass per
    # channel and step). The line through the buckets has the right slope (near the
    # asymptotic bus bandwidth) but that intercept, more latency than the calibration's
    # physical bound allows; so it reads all time as bandwidth: the buckets' median
    # effective bus bandwidth, which reproduces them at the sizes a what-if re-times.
    o = t.ops
    ar = o[(o["kind"] == OpKind.COLLECTIVE) & (o["comm_op"] == CommOp.ALL_REDUCE)
           & (o["rank"] == 0)]
    sizes = ar["bytes"].to_numpy(float)
    f = 2 * 15 / 16
    eff = np.median(sizes * f / ar["dur_ns"].to_numpy(float))
    assert cal[1]["identifiable"] is False and "outside physical bounds" in cal[1]["why"]
    assert cal[1]["busbw_gbps"] == pytest.approx(eff, rel=1e-3)
    assert cal[1]["busbw_gbps"] < bw
    lo, hi = sizes.argmin(), sizes.argmax()
    slope = (sizes[hi] - sizes[lo]) * f / (ar["dur_ns"].iat[hi] - ar["dur_ns"].iat[lo])
    assert 0.85 * bw < slope <= bw * 1.001


def test_measured_trace_recalibrated_identity_and_halving(dlrm):
    """The key states the link's nominal rate (NCCL traces: the cost layer's NCCL model
    applies the efficiency): DLRM's V100s ran on NVLink2 at 150 GB/s per GPU, so 150 is the
    identity (not the fitted bus bandwidth / 0.8, the old meaning)."""
    base = replay(dlrm)
    g = build_graph(dlrm)
    cal = calibrate(dlrm, g)
    assert set(cal) == {0}  # one node: every collective is intra-node
    bus = cal[0]["busbw_gbps"]
    same = whatif(dlrm, {"network.intra_node_gbps": 150})
    np.testing.assert_array_equal(same.end_ns, base.end_ns)
    half = whatif(dlrm, {"network.intra_node_gbps": 75})
    tab = collective_table(dlrm, g)
    # every collective's transfer tail grows by exactly S * f / B
    grow = tab["bytes"] * tab["factor"] / bus
    st_b, st_h = base.step_times(), half.step_times()
    assert (st_h["replayed_ns"].to_numpy() >= st_b["replayed_ns"].to_numpy()).all()
    assert half.meta["whatif"]["network_calibration"]["intra"]["points"] == cal[0]["points"]
    assert grow.max() > 0


def test_measured_trace_needs_an_inter_node_bandwidth(dlrm):
    with pytest.raises(PolicyError, match="inter_node_gbps"):
        whatif(dlrm, {"topology.ranks_per_node": 4})
    r = whatif(dlrm, {"topology.ranks_per_node": 4, "network.inter_node_gbps": 12.5})
    assert r.step_time_ns >= replay(dlrm).step_time_ns


def test_gemm_speedup_touches_only_gemms_and_compute_speedup_helps(dp_job):
    cls = kernel_class(dp_job)
    names = dp_job.names()
    assert (cls[names == "attn.qkv.fwd"] == 0).all() and (cls[names == "attn.softmax.fwd"] == 1).all()
    assert (cls[names == "mlp.act.fwd"] == 2).all() and (cls[names == "dp.allreduce_grads"] == 4).all()
    base = whatif(dp_job)
    r = whatif(dp_job, {"hardware.gemm_speedup": 2.0})
    gemm = cls == 0
    np.testing.assert_allclose(r.dur_ns[gemm], np.rint(base.dur_ns[gemm] / 2), atol=1)
    np.testing.assert_array_equal(r.dur_ns[cls == 2], base.dur_ns[cls == 2])
    assert r.step_time_ns < base.step_time_ns
    c2 = whatif(dp_job, [Hardware(compute_speedup=2.0)])
    assert c2.step_time_ns < r.step_time_ns
    slow = whatif(dp_job, {"hardware.compute_speedup": 0.5})
    assert slow.step_time_ns > base.step_time_ns


def test_gpu_swap_resynthesizes_faster_and_measured_needs_its_gpu(dp_job, dlrm):
    h100 = whatif(dp_job, {"hardware.gpu": "h100-sxm"})
    assert h100.meta["whatif"]["resynthesized"]
    assert h100.step_time_ns < whatif(dp_job).step_time_ns
    unknown = Trace(**{**dlrm.__dict__, "meta": {**dlrm.meta, "devices": {"0": {"0": {
        "name": "Z100"}}}}})  # a GPU without a built-in profile
    with pytest.raises(PolicyError, match="from_gpu"):
        whatif(unknown, {"hardware.gpu": "h100-sxm"})
    r = whatif(dlrm, {"hardware.gpu": "h100-sxm", "hardware.from_gpu": "a100-40gb"})
    assert r.step_time_ns <= replay(dlrm).step_time_ns


def test_bad_values_name_the_key():
    with pytest.raises(PolicyError, match="inter_node_gbps=-1"):
        Network(inter_node_gbps=-1)
    with pytest.raises(PolicyError, match="algorithm"):
        Network(algorithm="butterfly")
    with pytest.raises(PolicyError, match="unknown hardware"):
        Hardware(gpu="tpu-v9")


def test_pipeline_stages_across_datacenters_slow_the_pipeline():
    t = synthesize("gpt3-1.3b", "a100-80gb", tp=8, pp=2, dp=1, global_batch=8, micro_batch=1)
    base = whatif(t)
    near = whatif(t, {"network.nodes_per_dc": 1, "network.cross_dc_gbps": 12.5,
                      "network.cross_dc_km": 0.0})
    far = whatif(t, {"network.nodes_per_dc": 1, "network.cross_dc_gbps": 12.5,
                     "network.cross_dc_km": 1000.0})
    assert base.step_time_ns <= near.step_time_ns < far.step_time_ns
    # two nodes in one DC (nodes_per_dc=2) is the single-site job
    same = whatif(t, {"network.nodes_per_dc": 2, "network.cross_dc_gbps": 12.5})
    assert same.step_time_ns == base.step_time_ns


def test_fewer_nics_per_node_is_less_inter_node_bandwidth(dp_job):
    base = whatif(dp_job)
    four = whatif(dp_job, {"topology.nics": 4})
    half = whatif(dp_job, {"network.inter_node_gbps": HW.nics * HW.nic_gbps / HW.gpus_per_node / 2})
    # the same bandwidth per node; four NICs carry fewer rings (two channels per NIC), so
    # the pipeline holds less data in flight: within 1% of each other, both slower
    assert four.step_time_ns > base.step_time_ns and half.step_time_ns > base.step_time_ns
    assert four.step_time_ns == pytest.approx(half.step_time_ns, rel=0.01)
    with pytest.raises(PolicyError, match="NICs"):
        whatif(read(sorted((TRACES / "kineto" / "a100-ddp-nccl").glob("*"))), {"topology.nics": 2})


def test_hardware_rank_slowdown_equals_the_straggler_injection(dp_job):
    a = whatif(dp_job, {"hardware.slow_ranks": [5], "hardware.rank_slowdown": 1.3})
    b = whatif(dp_job, {"stragglers.slow_ranks": [5], "stragglers.slowdown": 1.3})
    np.testing.assert_array_equal(a.end_ns, b.end_ns)
    assert a.step_time_ns > whatif(dp_job).step_time_ns
    with pytest.raises(PolicyError, match="go together"):
        Hardware(slow_ranks=(1,))


def test_collectives_without_sizes_cannot_be_retimed_by_bandwidth():
    tr = read(sorted((TRACES / "kineto" / "v100-ddp-sgd").glob("*")))
    with pytest.raises(PolicyError, match="carry no sizes"):
        whatif(tr, {"network.intra_node_gbps": 50})
    assert whatif(tr, {"hardware.comm_speedup": 2}).step_time_ns <= replay(tr).step_time_ns


@pytest.mark.parametrize("rpn", [2, 4])
def test_measured_step_is_monotone_in_inter_node_bandwidth(dlrm, rpn):
    steps = [whatif(dlrm, {"topology.ranks_per_node": rpn, "network.inter_node_gbps": bw}).step_time_ns
             for bw in (100.0, 50.0, 25.0, 12.5, 6.25)]
    assert steps == sorted(steps)
    assert steps[-1] > steps[0]


def test_partially_traced_collectives_are_not_last_arrivers(dlrm):
    """A collective whose group has untraced ranks has no known last arriver (its traced
    members may have waited for the others): the fit uses fully traced collectives, and
    only where a level has none does it rest on such points, flagged, with a note saying
    the bandwidth is a lower bound."""
    g = build_graph(dlrm)
    tab = collective_table(dlrm, g)
    assert not tab["partial"].any()  # all 8 DLRM ranks are traced
    marked = dict(tab)
    marked["partial"] = tab["partial"].copy()
    marked["partial"][::2] = True
    # the partial rows are left out: the same fit as on the fully traced rows alone
    kept = {k: (v[1::2] if isinstance(v, np.ndarray) and len(v) == len(tab["op"]) else v)
            for k, v in tab.items()}
    assert calibrate(dlrm, g, marked) == calibrate(dlrm, g, kept)
    # one traced rank of a DDP job: every all-reduce is partial, the fit is flagged
    one = ingest_cached(KINETO / "a100-ddp-nccl")
    g1 = build_graph(one)
    t1 = collective_table(one, g1)
    assert t1["partial"].all()
    cal = calibrate(one, g1, t1)
    assert all(v.get("partial") for v in cal.values())
    w = whatif(one, {"network.intra_node_gbps": 100}).meta["whatif"]
    assert any("untraced members" in a and "lower bound" in a for a in w["assumed"])
