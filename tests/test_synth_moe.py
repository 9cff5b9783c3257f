"""Mixture of experts in the synthesizer: parameter counts against the published ones, the
routing load, all-to-all traffic and time, grouped GEMMs, expert groups in the trace, expert
memory under ZeRO, FP8 (closed forms derived here, independently of the implementation)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from retime.collectors.enums import CommOp, OpKind, Phase
from retime.collectors.errors import ConfigError
from retime.collectors.synth import (
    LANES,
    CommModel,
    ParallelConfig,
    grouped_gemm,
    load_hardware,
    load_model,
    model_flops_per_step,
    moe_load,
    synthesize,
)
from retime.collectors.synth.costs import gemm
from retime.collectors.synth.moe import dispatch_bytes

TINY = dict(name="tiny-moe", hidden=1024, ffn=4096, heads=16, layers=4, seq=1024, vocab=32000,
            experts=8, top_k=2, expert_ffn=1024, shared_experts=1, dense_layers=1,
            gated_mlp=True, norm="rmsnorm", positions="rotary", tied_embeddings=False,
            dropout=False)


def test_zoo_parameter_counts_match_published():
    """DeepSeek-V3: 671B parameters (plus a 14B-class MTP module), 37B activated; Mixtral
    8x7B: 46.7B, 12.9B activated (the reports' rounded figures)."""
    ds = load_model("deepseek-v3")
    main = ds.params() - ds.mtp_depth * ds.mtp_params()
    assert main == pytest.approx(671e9, rel=0.005)
    act_main = ds.active_params() - ds.mtp_depth * ds.active_layer_params(ds.layers - 1) \
        - ds.mtp_depth * (ds.mtp_params() - ds.layer_params(ds.layers - 1))
    assert act_main == pytest.approx(37e9, rel=0.02)
    mx = load_model("mixtral-8x7b")
    assert mx.params() == pytest.approx(46.7e9, rel=0.005)
    assert mx.active_params() == pytest.approx(12.9e9, rel=0.005)
    # one routed expert of DeepSeek-V3: a SwiGLU MLP of 3 * 7168 * 2048 weights
    assert ds.expert_params() == 256 * 3 * 7168 * 2048


@pytest.mark.parametrize("ep,r,cf", [(4, 1.0, 0.0), (4, 2.0, 0.0), (8, 3.0, 0.0),
                                     (2, 2.0, 1.25), (4, 1.0, 1.5)])
def test_routing_load_closed_form(ep, r, cf):
    m = load_model("mixtral-8x7b")
    par = ParallelConfig(tp=2, dp=8, ep=ep, micro_batch=2, global_batch=16, moe_imbalance=r,
                         capacity_factor=cf)
    ld = moe_load(m, par)
    T = 2 * 4096 // 2  # tokens of one TP rank: micro-batch 2 x seq 4096 over tp 2
    E, k = 8, 2
    mean = T * k * ep / E  # each of the ep ranks sends T*k copies over E experts
    assert ld["tokens"] == T and ld["mean_per_expert"] == pytest.approx(mean)
    e_loc = E // ep
    if cf:
        want = [cf * mean] * e_loc
        assert ld["dropped"] == pytest.approx(max(0.0, r - cf) / E)
    else:  # the hot expert and e_loc - 1 others sharing what is left of the total
        want = [r * mean] + [mean * (E - r) / (E - 1)] * (e_loc - 1)
    assert ld["per_expert"] == pytest.approx(want)
    assert ld["load"] == pytest.approx(sum(want) / (T * k))


def test_grouped_gemm_flops_and_hot_expert():
    hw = load_hardware("h100-sxm")
    ms = [4096] * 8
    c = grouped_gemm(hw, "bf16", ms, 4096, 7168)
    assert c.flops == 2.0 * sum(ms) * 4096 * 7168
    # equal groups: the same tiles and waves as one GEMM of the stacked tokens
    one = gemm(hw, "bf16", sum(ms), 4096, 7168)
    assert c.dur_ns == pytest.approx(one.dur_ns, rel=1e-6)
    # moving tokens to one hot expert keeps the FLOPs but never shortens the kernel
    hot = grouped_gemm(hw, "bf16", [4096 * 4] + [4096 * 4 // 7] * 7, 4096, 7168)
    assert hot.dur_ns >= c.dur_ns * 0.99


@pytest.mark.parametrize("route_nodes", [0, 4])
def test_dispatch_traffic_closed_form(route_nodes):
    """EP 64 over 8 nodes of 8: a plain all-to-all sends (n-k)/n of each token copy over the
    network; node-limited routing sends a token once per distinct remote node."""
    m = load_model("deepseek-v3")
    if not route_nodes:
        import dataclasses
        m = dataclasses.replace(m, route_nodes=0)
    par = ParallelConfig(tp=1, pp=1, dp=64, ep=64, global_batch=64, micro_batch=1, dtype="fp8")
    comm = CommModel(load_hardware("h100-sxm"), par)
    geo = comm.geometry["ep"]
    assert (geo.size, geo.per_node, geo.nodes) == (64, 8, 8)
    intra, inter, total = dispatch_bytes(m, par, comm, 1)
    copies = 4096 * 8
    h = 7168
    assert total == copies * h
    if route_nodes:
        N, k = 8, 8
        nodes = min(4.0, N * (1 - (1 - 1 / N) ** k))
        assert nodes == 4.0  # 8 random experts reach 5.25 nodes on average: the cap binds
        assert inter == pytest.approx(4096 * nodes * (N - 1) / N * h)
    else:
        assert inter == pytest.approx(copies * 56 / 64 * h)
        assert intra == pytest.approx(copies * 7 / 64 * h)
    # the all-to-all (the cost layer's NCCL alltoall rates): both levels at once, the slower
    # one sets the time; on-node at the point-to-point share (0.84) of the NVLink bus rate,
    # off-node through the GPU's own NIC share; latency 5 us per call + NCCL's ring/Simple
    # base 8.4 us + log2(64) network hops of 14 us
    hw = comm.hw
    t_intra = intra / (hw.intra.gbps * hw.intra.bus_efficiency * 0.84)
    t_inter = inter / (hw.inter.gbps * hw.inter.bus_efficiency)
    lat = (5.0 + 8.4 + 6 * 14.0) * 1e3
    assert comm.all_to_all_ns(intra, inter, "ep") == round(lat + max(t_inter, t_intra))


@pytest.fixture(scope="module")
def moe_run():
    return synthesize(TINY, "h100-sxm", tp=2, pp=2, dp=4, ep=2, global_batch=16, micro_batch=1,
                      sequence_parallel=True, zero=1)


def test_all_to_alls_per_layer_and_groups(moe_run):
    """Every MoE layer runs dispatch + combine in the forward and their gradients in the
    backward on the EP stream; each instance spans one expert-parallel group (ep
    consecutive data-parallel ranks, same stage and tensor index)."""
    t = moe_run
    o = t.ops
    names = t.names()
    a2a = (o["kind"] == int(OpKind.COLLECTIVE)) & (o["comm_op"] == int(CommOp.ALL_TO_ALL))
    assert (o["lane"][a2a] % len(LANES) == LANES.index("ep")).all()
    r0 = a2a & (o["rank"] == 0)
    m = 16 // (1 * 4)  # micro-batches per pipeline
    moe_layers_stage0 = 1  # layers 0-1 on stage 0, layer 0 dense
    assert r0.sum() == 4 * moe_layers_stage0 * m
    assert sorted(set(names[r0.to_numpy()])) == ["ep.combine", "ep.combine.bwd", "ep.dispatch",
                                                  "ep.dispatch.bwd"]
    groups = {int(g): set(r) for g, r in zip(t.groups["group_id"], t.groups["ranks"],
                                             strict=True)}
    par = ParallelConfig(tp=2, pp=2, dp=4, ep=2, global_batch=16)
    for _cid, g in o[a2a].groupby("coll_id"):
        ranks = sorted(g["rank"].tolist())
        assert len(ranks) == 2 and set(ranks) == groups[int(g["group_id"].iloc[0])]
        # members differ in the data index only, by one (consecutive d of the same block)
        d = [(r // par.tp) % par.dp for r in ranks]
        assert d[1] - d[0] == 1 and d[0] % 2 == 0
        assert ranks[0] // (par.dp * par.tp) == ranks[1] // (par.dp * par.tp)


def test_expert_gradients_reduced_over_expert_data_parallel_group(moe_run):
    t = moe_run
    o = t.ops
    names = t.names()
    h, ef, E = 1024, 1024, 8
    per_rank_expert = E // 2 * 3 * h * ef // 2  # E/ep experts, SwiGLU, sharded over tp=2
    sel = (o["rank"] == 0).to_numpy() & np.char.startswith(names.astype(str),
                                                           "dp.reduce_scatter_grads.experts")
    # stage 0 holds one MoE layer; ZeRO-1 reduce-scatters 4-byte gradients (a bf16 run:
    # fp32 main gradients by Megatron-LM's rule, REFERENCES.md R51)
    assert o["bytes"].to_numpy()[sel].sum() == 4 * per_rank_expert
    # over the 2 ranks holding the same experts (dp / ep = 2), not the 4 data ranks
    assert (o[sel].groupby("coll_id").size().index.size == sel.sum())
    g = t.groups.set_index("group_id")["ranks"]
    assert all(len(g[int(x)]) == 2 for x in o["group_id"].to_numpy()[sel])


def test_expert_memory_under_zero(moe_run):
    s = moe_run.meta["synth"]
    st0 = s["memory"][0]
    h, ef, E = 1024, 1024, 8
    expert = E // 2 * 3 * h * ef // 2
    assert st0["expert_params"] == expert
    dense = st0["params"] - expert
    # ZeRO-1: fp32 master weights + moments shard over dp (dense) and dp/ep (experts)
    assert st0["optimizer_bytes"] == int(12 * (dense / 4 + expert / 2))
    assert st0["weights_bytes"] == int(2 * (dense + expert))


def test_imbalance_slows_and_ep_one_has_no_all_to_all():
    base = dict(tp=1, pp=1, dp=4, global_batch=8, micro_batch=1)
    even = synthesize(TINY, "h100-sxm", ep=4, **base).meta["synth"]
    hot = synthesize(TINY, "h100-sxm", ep=4, moe_imbalance=3.0, **base).meta["synth"]
    assert hot["step_time_ns"] > even["step_time_ns"]
    assert hot["moe"]["load"] == pytest.approx((3 + 1 * (8 - 3) / 7) / 2)
    local = synthesize(TINY, "h100-sxm", ep=1, **base)
    assert not (local.ops["comm_op"] == int(CommOp.ALL_TO_ALL)).any()
    with pytest.raises(ConfigError, match="ep=3 must divide dp=4"):
        ParallelConfig(dp=4, ep=3, global_batch=4)
    with pytest.raises(ConfigError, match="no routed experts"):
        synthesize("gpt3-125m", "h100-sxm", dp=2, ep=2, global_batch=2)


def test_fp8_gemms_and_dtype_check():
    hw = load_hardware("h100-sxm")
    m, n, k = 16384, 16384, 16384
    bf, f8 = gemm(hw, "bf16", m, n, k), gemm(hw, "fp8", m, n, k)
    # both are the cost layer's GEMM at the profile's sustained fraction of the dtype's peak
    # (k_half 192 for 16-bit inputs, 384 for 1-byte ones: the same tile fill in time);
    # FP8 also pays the quantization of its [m, k] input: 3 bytes per element (read 16-bit,
    # write 8-bit) at the published HBM triad rate (K3)
    from retime.collectors.costs.gpus import gpu_spec
    bw = gpu_spec("h100-sxm").hbm_gbps()[0]  # GB/s == bytes/ns
    quant = 3.0 * m * k / bw
    over = hw.kernel_overhead_us * 1e3
    ratio = (f8.dur_ns - quant - over) / (bf.dur_ns - over)
    kh = hw.gemm_k_half
    want = (hw.peak_flops("bf16") * hw.gemm_max * k / (k + kh)) / (
        hw.peak_flops("fp8") * hw.gemm_max_fp8 * k / (k + 2 * kh))
    assert ratio == pytest.approx(want, rel=2e-3)
    with pytest.raises(ConfigError, match="has no fp8 peak"):
        synthesize("gpt3-125m", "a100-80gb", global_batch=1, dtype="fp8")
    for name in ("h100-sxm", "h200", "b200", "mi300x"):
        hw = load_hardware(name)  # datasheets: FP8 dense = 2x BF16 dense (rounded)
        assert hw.peak_flops("fp8") == pytest.approx(2 * hw.peak_flops("bf16"), rel=1e-3)


def test_model_flops_count_active_experts():
    """6 x (active weights a token passes) x tokens + attention scores, Narayanan counting."""
    m = load_model("mixtral-8x7b")
    B, s, h, L, V = 8, m.seq, m.hidden, m.layers, m.vocab
    attn = h * (32 * 128 + 2 * 8 * 128) + 32 * 128 * h
    mlp = 2 * 3 * h * m.expert_ffn + h * 8  # top-2 SwiGLU experts + router
    per_token = L * (2 * (attn + mlp) + 2 * s * 32 * 256) + 2 * h * V
    assert model_flops_per_step(m, B) == pytest.approx(3 * per_token * B * s, rel=1e-12)


def test_moe_memory_counts_dispatch_buffers_and_phases(moe_run):
    s = moe_run.meta["synth"]
    assert s["moe"]["dispatch_bytes"] > 0
    o = moe_run.ops
    names = moe_run.names()
    disp = (o["rank"] == 0).to_numpy() & (names == "ep.dispatch")
    assert (o["phase"].to_numpy()[disp] == int(Phase.FWD)).all()
    assert math.isclose(s["moe"]["load"], 1.0)


def test_deepseek_selective_keeps_the_fp8_swiglu_input_and_recomputes_its_output():
    """DeepSeek-V3's recipe (report §3.3.3, synth R58): the routed experts cache the SwiGLU
    input in FP8 and recompute the output in the backward. EP 64, one 4,096-token sequence
    per rank, 8 of 256 experts per token, balanced: each expert gets 64 x 4096 x 8 / 256 =
    8192 tokens, a rank's 4 experts M = 32768. Without recompute an FP8 run keeps the FC1
    output in 2 bytes (2 x 2048 wide) and the SwiGLU output in 1 (2048 wide); with it the FC1
    output in 1 byte and no SwiGLU output: 3 x M x 2048 bytes fewer per MoE layer."""
    from retime.collectors.synth.moe import moe_activation_bytes
    m = load_model("deepseek-v3")
    kw = dict(tp=1, pp=1, dp=64, ep=64, global_batch=64, micro_batch=1, dtype="fp8")
    keep = moe_activation_bytes(m, ParallelConfig(recompute="none", **kw))
    redo = moe_activation_bytes(m, ParallelConfig(recompute="selective", **kw))
    assert keep - redo == 3 * 32768 * 2048
    names = {}
    for rc in ("none", "selective"):
        tr = synthesize(m, "h100-sxm", recompute=rc, expand="unique", check_memory=False, **kw)
        r0 = (tr.ops["rank"] == 0).to_numpy()
        names[rc] = tr.names()[tr.ops.index.to_numpy()][r0]
    # one per MoE layer's backward (58 layers and the MTP module's)
    n_moe = (names["selective"] == "moe.experts.fc2.bwd_dgrad").sum()
    assert n_moe == sum(m.is_moe_layer(i) for i in range(m.layers)) + 1
    assert (names["selective"] == "recompute.moe.experts.act.fwd").sum() == n_moe
    assert (names["none"] == "recompute.moe.experts.act.fwd").sum() == 0
