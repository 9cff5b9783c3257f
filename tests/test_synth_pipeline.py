"""Zero-bubble and DualPipe schedules, blocking pipeline transfers, uneven stages and
on-demand (ODC) FSDP transfers in the synthesizer, against closed forms derived here."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from retime.collectors.errors import ConfigError
from retime.collectors.synth import (
    CommModel,
    LayerTemplate,
    OpTemplate,
    ParallelConfig,
    StepTemplate,
    bubble_time,
    build_trace,
    imbalance_scale,
    load_hardware,
    max_in_flight,
    stage_order,
    synthesize,
)
from retime.collectors.synth.schedule import BI, F, W, overlapped_pairs
from retime.collectors.synth.stages import balanced_splits, even_split, makespan_ns

HW = load_hardware("a100-80gb")
SMALL = dict(hidden=1024, ffn=4096, heads=16, layers=8, seq=1024, vocab=32000)


def _uniform(sched, p, m, f, b, w, v=1, p2p_ns=0, p2p="sync", layers_per_stage=2):
    """Identical layers (forward f, input gradient b, weight gradient w ns each)."""
    layer = LayerTemplate((OpTemplate("f", "compute", f),), (OpTemplate("b", "compute", b),),
                          wgrad=(OpTemplate("w.bwd_wgrad", "compute", w),) if w else ())
    tpl = StepTemplate(layers=(layer,) * (layers_per_stage * p * v), optimizer_kernels=())
    par = ParallelConfig(pp=p, global_batch=m, schedule=sched, chunks=v, p2p=p2p)
    tr = build_trace(tpl, par, CommModel(HW, par), p2p_ns=p2p_ns, recv_ns=0)
    o = tr.ops
    return int((o["start_ns"] + o["dur_ns"]).max() - o["start_ns"].min())


_COSTS = [(1000, 1000, 1000), (1000, 1500, 800), (1500, 1000, 1000), (1000, 2000, 500)]


@pytest.mark.parametrize("p,m,f,b,w", [(p, m, *c) for p, m in ((4, 8), (4, 12), (8, 16),
                                                                (8, 32)) for c in _COSTS]
                         + [(4, 4, 1000, 1000, 1000)])  # m = p: exact for F = B = W
def test_zb_h1_bubble_is_p_minus_1_f_plus_b_minus_w(p, m, f, b, w):
    """ZB-H1 (Qi et al. 2024): the stage idles (p-1)(F+B-W) with B the input-gradient and W
    the weight-gradient pass; 1F1B with the same work idles (p-1)(F+B+W)."""
    F_, B_, W_ = 2 * f, 2 * b, 2 * w  # two layers per stage
    step = _uniform("zb-h1", p, m, f, b, w)
    assert step - m * (F_ + B_ + W_) == (p - 1) * (F_ + B_ - W_) == bubble_time(
        "zb-h1", p, m, 1, F_, B_, W_)
    one = _uniform("1f1b", p, m, f, b + w, 0)
    assert one - m * (F_ + B_ + W_) == (p - 1) * (F_ + B_ + W_)
    if f == b == w:  # one third of 1F1B's bubble
        assert 3 * (step - m * (F_ + B_ + W_)) == one - m * (F_ + B_ + W_)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 16), (8, 40)])
def test_zb_h1_order_and_memory(p, m):
    for s in range(p):
        order = stage_order("zb-h1", p, m, 1, s)
        assert sorted(order) == sorted((ph, mb, 0) for ph in (F, W, BI) for mb in range(m))
        pos = {it: k for k, it in enumerate(order)}
        assert all(pos[(F, j, 0)] < pos[(BI, j, 0)] < pos[(W, j, 0)] for j in range(m))
        # activations of 1F1B: at most p - i micro-batches forwarded, not yet back
        assert max_in_flight(order) == min(p - s, m)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 12), (8, 16), (8, 32), (16, 32)])
def test_dualpipe_order_memory_and_bubble(p, m):
    """DualPipe (DeepSeek-V3 report, Table 2): every item once, p+1 micro-batch chunks of
    activations per rank, and with free communication and F = B = W a bubble of
    (p/2-1)(F+B-W), within the report's (p/2-1)(F&B+B-3W) (B the whole backward)."""
    for s in range(p):
        order = stage_order("dualpipe", p, m, 1, s)
        items = [(ph, mb, c) for ph, mb, c in order]
        # each direction: m/2 micro-batches forward, backward (whole, or split + W)
        for d in (0, 1):
            mbs = range(d * m // 2, (d + 1) * m // 2)
            f = [mb for ph, mb, c in items if ph == F and c == d]
            assert f == list(mbs)
            b = [mb for ph, mb, c in items if ph in (1, BI) and c == d]
            assert b == list(mbs)
        n_split = sum(ph == BI for ph, _, _ in items)
        assert n_split == sum(ph == W for ph, _, _ in items) == p - min(s, p - 1 - s) - 1
        assert max_in_flight(order) == p + 1
        for k in overlapped_pairs("dualpipe", p, m, s):
            assert items[k][0] == F and items[k + 1][0] == 1 and items[k][2] != items[k + 1][2]
    u = 1000
    step = _uniform("dualpipe", p, m, u, u, u)
    # 2 layers per chunk: F = B_in = W = 2u per chunk; work of m micro-batch chunks x 3
    idle = step - m * 3 * 2 * u
    assert idle == (p // 2 - 1) * 2 * u
    assert idle <= bubble_time("dualpipe", p, m, 1, 2 * u, 2 * u, 2 * u)


def test_dualpipe_needs_even_pp_and_enough_microbatches():
    with pytest.raises(ConfigError, match="dualpipe needs an even pp"):
        ParallelConfig(pp=3, global_batch=12, schedule="dualpipe")
    with pytest.raises(ConfigError, match="dualpipe needs"):
        ParallelConfig(pp=4, global_batch=6, schedule="dualpipe")


@pytest.mark.parametrize("sched,v", [("1f1b", 1), ("interleaved", 2), ("gpipe", 1)])
def test_blocking_p2p_costs_grow_with_transfer_time(sched, v):
    """Megatron's blocking send/receive: free transfers give the closed-form bubble either
    way; a transfer time c makes the blocking step longer than the overlapped one, and the
    extra time grows linearly with c."""
    p, m, f, b = 4, 8, 1000, 2000
    free_s = _uniform(sched, p, m, f, b, 0, v=v, p2p="sync")
    free_a = _uniform(sched, p, m, f, b, 0, v=v, p2p="async")
    assert free_s == free_a
    extra = []
    for c in (200, 400, 800):
        s = _uniform(sched, p, m, f, b, 0, v=v, p2p_ns=c, p2p="sync")
        a = _uniform(sched, p, m, f, b, 0, v=v, p2p_ns=c, p2p="async")
        assert s > a
        extra.append(s - free_s)
    assert extra[2] - extra[1] == 2 * (extra[1] - extra[0])


def test_deepspeed_serial_p2p_pays_both_transfers_of_each_exchange():
    """DeepSpeed's pipeline engine (p2p="serial"): between two items a stage sends and
    receives with two blocking calls, one after the other. Two stages, m micro-batches,
    uniform f / b, transfer c (derived by hand): in Megatron's batched call each of the m - 1
    exchanges that carry both an activation and a gradient costs c, in DeepSpeed's two
    calls 2c, so the step is (m - 1) c longer; with free transfers the two are equal."""
    f, b = 1000, 2000
    for m in (4, 8):
        assert _uniform("1f1b", 2, m, f, b, 0, p2p="serial") == \
            _uniform("1f1b", 2, m, f, b, 0, p2p="sync")
        for c in (300, 700):
            serial = _uniform("1f1b", 2, m, f, b, 0, p2p_ns=c, p2p="serial")
            sync = _uniform("1f1b", 2, m, f, b, 0, p2p_ns=c, p2p="sync")
            assert serial - sync == (m - 1) * c
    # deeper pipelines: the extra time is linear in c (middle stages exchange with both
    # neighbours)
    for p in (3, 4):
        extra = [_uniform("1f1b", p, 8, f, b, 0, p2p_ns=c, p2p="serial")
                 - _uniform("1f1b", p, 8, f, b, 0, p2p_ns=c, p2p="sync") for c in (300, 600)]
        assert extra[0] > 0 and extra[1] == 2 * extra[0]


def test_serial_p2p_is_deepspeeds_1f1b_only():
    with pytest.raises(ConfigError, match="only schedule is 1F1B"):
        ParallelConfig(pp=4, global_batch=8, schedule="interleaved", chunks=2, p2p="serial")


def test_interleaved_sends_wait_for_the_following_backward():
    """In Megatron's interleaved steady state a forward's output leaves after the backward
    that follows it (one batched call per pair)."""
    tr = synthesize(SMALL, "a100-80gb", tp=1, pp=4, dp=1, global_batch=16, micro_batch=1,
                    schedule="interleaved", chunks=2)
    o = tr.ops
    names = tr.names()
    r1 = (o["rank"] == 1).to_numpy()
    send = r1 & (names == "pp.send") & (o["phase"] == 0).to_numpy()
    comp = r1 & (o["lane"] % 7 == 0).to_numpy() & (o["phase"] == 1).to_numpy()
    starts = o["start_ns"].to_numpy()
    ends = starts + o["dur_ns"].to_numpy()
    bwd_ends = np.sort(ends[comp])
    # at least one forward send starts exactly when a backward compute op ends
    assert np.isin(starts[send], bwd_ends).any()


def test_explicit_uneven_stages():
    tr = synthesize(SMALL, "a100-80gb", tp=1, pp=4, dp=1, global_batch=8, micro_batch=1,
                    stage_layers=[1, 3, 3, 1])
    o = tr.ops
    s = tr.meta["synth"]
    assert s["stage_layers"] == [1, 3, 3, 1]
    lay = o[(o["layer"] >= 0) & (o["layer"] < 8)]
    per_stage = lay.groupby("stage")["layer"].unique()
    assert [sorted(x.tolist()) for x in per_stage] == [[0], [1, 2, 3], [4, 5, 6], [7]]
    with pytest.raises(ConfigError, match="sums to 7"):
        synthesize(SMALL, "a100-80gb", pp=4, global_batch=4, stage_layers=[1, 2, 3, 1])
    with pytest.raises(ConfigError, match="3 entries"):
        synthesize(SMALL, "a100-80gb", pp=4, global_batch=4, stage_layers=[2, 3, 3])
    # Llama 3's interleaved layout (synth REFERENCES R34): one-layer model chunks, the
    # first holding the embedding alone and the last the head alone
    tr = synthesize(SMALL, "a100-80gb", tp=1, pp=2, dp=1, global_batch=8, micro_batch=1,
                    schedule="interleaved", chunks=5, stage_layers=[0] + [1] * 8 + [0])
    o = tr.ops
    assert tr.meta["synth"]["stage_layers"] == [0] + [1] * 8 + [0]
    lay = o[(o["layer"] >= 0) & (o["layer"] < 8)]
    per_rank = lay.groupby("stage")["layer"].unique()
    # chunk j on rank j % 2 holds layer j - 1
    assert [sorted(x.tolist()) for x in per_rank] == [[1, 3, 5, 7], [0, 2, 4, 6]]
    assert set(o.loc[o["layer"] == 8, "stage"]) == {1}  # the head: the last chunk's only op
    # 61 layers over 16 stages: as even as possible, the 13 extra layers in the middle
    sp = even_split(61, 16)
    assert sum(sp) == 61 and sorted(sp) == [3] * 3 + [4] * 13
    assert sp[0] == sp[-1] == 3


def _brute(L, n, cost, feasible):
    best = None
    for cuts in itertools.combinations(range(1, L), n - 1):
        b = [0, *cuts, L]
        if not all(feasible(i, b[i], b[i + 1]) for i in range(n)):
            continue
        v = max(cost(i, b[i], b[i + 1]) for i in range(n))
        if best is None or v < best:
            best = v
    return best


@pytest.mark.parametrize("seed", range(6))
def test_balanced_splits_are_exact_min_max_partitions(seed):
    rng = np.random.default_rng(seed)
    L, n, m = int(rng.integers(6, 11)), int(rng.integers(2, 5)), 8
    layer_ns = rng.uniform(1, 3, L)
    state = rng.uniform(1, 2, L)
    act = rng.uniform(0.5, 1.5, L)
    in_flight = [n - i for i in range(n)]
    static = rng.uniform(0, 3, n)
    first, last = 0.5, 2.0
    out = balanced_splits(layer_ns, first, last, m, n, state, act, static, in_flight, 0.05)
    T = np.concatenate([[0], np.cumsum(layer_ns)])
    S = np.concatenate([[0], np.cumsum(state)])
    A = np.concatenate([[0], np.cumsum(act)])
    extra = np.zeros(n)
    extra[0], extra[-1] = extra[0] + first, extra[-1] + last

    def t(i, a, b):
        return T[b] - T[a] + extra[i]

    def mem(i, a, b):
        return static[i] + S[b] - S[a] + in_flight[i] * (A[b] - A[a])
    best_t = _brute(L, n, t, lambda *_: True)
    ts = out["time"]
    st = [0, *np.cumsum(ts)]
    assert max(t(i, st[i], st[i + 1]) for i in range(n)) == pytest.approx(best_t)
    assert out["time_ns"] == pytest.approx(makespan_ns(
        [t(i, st[i], st[i + 1]) for i in range(n)], m))
    # memory split: least largest-stage memory among splits within 5% of the time split
    total = T[L] + extra.sum()
    tmax = (out["bound_ns"] - total) / (m - 1)
    best_m = _brute(L, n, mem, lambda i, a, b: t(i, a, b) <= tmax + 1e-6)
    assert out["memory_bytes"] == pytest.approx(best_m)
    assert out["memory_ns"] <= out["bound_ns"] + 1e-6
    assert out["memory_bytes"] <= out["even_bytes"] + 1e-9 or out["even_ns"] > out["bound_ns"]


def test_stage_layers_time_and_memory_on_a_model():
    kw = dict(tp=1, pp=4, dp=1, global_batch=16, micro_batch=1)
    even = synthesize("gpt3-1.3b", "a100-80gb", **kw).meta["synth"]
    tm = synthesize("gpt3-1.3b", "a100-80gb", stage_layers="time", **kw).meta["synth"]
    mm = synthesize("gpt3-1.3b", "a100-80gb", stage_layers="memory", **kw).meta["synth"]
    split = mm["stage_split"]
    assert sum(split["memory"]) == sum(split["time"]) == 24
    assert tm["stage_layers"] == split["time"] and mm["stage_layers"] == split["memory"]
    # the head (logits over a 50k vocabulary) makes the last stage heavier: "time" moves
    # layers off it, and the simulated step is no slower than the even split's
    assert split["time"][-1] < 6 and tm["step_time_ns"] <= even["step_time_ns"]
    # "memory": stage 0 keeps p = 4 micro-batches alive, so it gets fewer layers, and the
    # largest stage needs less memory than with the even split
    assert split["memory"][0] < 6
    assert mm["peak_memory_bytes"] < even["peak_memory_bytes"]
    assert split["memory_ns"] <= split["bound_ns"]


@pytest.mark.parametrize("m,r", [(1, 1.5), (4, 1.5), (8, 2.0)])
def test_imbalance_scale_closed_forms(m, r):
    fsdp = ParallelConfig(dp=4, fsdp=True, global_batch=4 * m, seq_imbalance=r)
    odc = ParallelConfig(dp=4, fsdp=True, odc=True, global_batch=4 * m, seq_imbalance=r)
    ddp = ParallelConfig(dp=4, global_batch=4 * m, seq_imbalance=r)
    piped = ParallelConfig(dp=4, pp=2, fsdp=True, global_batch=4 * m, seq_imbalance=r)
    assert imbalance_scale(fsdp) == r
    assert imbalance_scale(odc) == imbalance_scale(ddp) == pytest.approx((m + r - 1) / m)
    assert imbalance_scale(piped) == pytest.approx((m + r - 1) / m)  # one sync per step
    with pytest.raises(ConfigError, match="odc .* needs ZeRO-3"):
        ParallelConfig(dp=4, odc=True, global_batch=4)


def test_odc_transfers_closed_form():
    par = ParallelConfig(tp=1, dp=16, fsdp=True, odc=True, global_batch=16)
    cm = CommModel(load_hardware("h100-sxm"), par)
    hw = cm.hw
    S = 1 << 28
    geo = cm.geometry["dp"]
    assert (geo.size, geo.per_node, geo.nodes) == (16, 8, 2)
    # off-node half through the GPU's own NIC share (the cost layer's alltoall rates);
    # 5 us per call + NCCL's ring/Simple base 8.4 us + log2(16) network hops of 14 us
    inter = S * 8 / 16 / (hw.inter.gbps * hw.inter.bus_efficiency)
    want = (5.0 + 8.4 + 4 * 14.0) * 1e3 + inter
    assert cm.odc_ns(S, "dp") == round(want)
    # the ring collective spreads the off-node bytes over the node's 8 NICs
    assert cm.odc_ns(S, "dp") > cm.collective_ns(2, S, "dp")
    push = cm.odc_ns(S, "dp", accumulate=True) - cm.odc_ns(S, "dp")
    assert push == int(S * 15 / 16 / 2 * 10 / (hw.hbm_gbps * hw.memory_efficiency))


@pytest.mark.parametrize("dp,mb", [(8, 1), (16, 4)])
def test_odc_pays_under_balance_and_wins_under_imbalance(dp, mb):
    """Balanced work: ODC's transfers cost more (the owners' accumulation pass; across nodes
    a fetch uses one NIC share, not the node's eight). Imbalanced work (r = 1.6, 8
    micro-batches): FSDP's per-layer collectives run every micro-batch at the slowest
    rank's pace, ODC only pays the minibatch's leftover, and wins."""
    kw = dict(tp=1, pp=1, dp=dp, fsdp=True, global_batch=dp * 8 * mb, micro_batch=mb)
    f1 = synthesize("gpt3-1.3b", "h100-sxm", **kw).meta["synth"]["step_time_ns"]
    o1 = synthesize("gpt3-1.3b", "h100-sxm", odc=True, **kw).meta["synth"]["step_time_ns"]
    assert o1 > f1
    f2 = synthesize("gpt3-1.3b", "h100-sxm", seq_imbalance=1.6, **kw).meta["synth"]
    o2 = synthesize("gpt3-1.3b", "h100-sxm", odc=True, seq_imbalance=1.6, **kw).meta["synth"]
    assert o2["step_time_ns"] < f2["step_time_ns"]
    assert f2["imbalance_scale"] == 1.6 and o2["imbalance_scale"] == pytest.approx(
        (8 + 0.6) / 8)


def test_gradient_reduction_after_the_backward_by_default():
    """Megatron-LM reduces data-parallel gradients after the last backward: the step is the
    compute, then every bucket's all-reduce back to back, then the optimizer; overlapping
    them with the backward (DDP) hides part of it."""
    kw = dict(tp=1, pp=1, dp=16, global_batch=16, micro_batch=1, bucket_mb=40.0)
    after = synthesize("gpt3-125m", "a100-80gb", **kw)
    during = synthesize("gpt3-125m", "a100-80gb", grad_overlap=True, **kw)
    assert during.meta["synth"]["step_time_ns"] < after.meta["synth"]["step_time_ns"]
    o = after.ops
    r0 = o[o["rank"] == 0]
    names = after.names()[r0.index.to_numpy()]
    end = (r0["start_ns"] + r0["dur_ns"]).to_numpy()
    comp = (r0["lane"] % 7 == 0).to_numpy() & (r0["phase"] == 1).to_numpy()
    ar = names == "dp.allreduce_grads"
    starts = np.sort(r0["start_ns"].to_numpy()[ar])
    ends = np.sort(end[ar])
    # the first bucket starts when the backward ends; the buckets run back to back
    assert starts[0] == end[comp].max()
    assert (starts[1:] == ends[:-1]).all()
    opt = (r0["phase"] == 2).to_numpy() & (r0["lane"] % 7 == 0).to_numpy()
    assert r0["start_ns"].to_numpy()[opt].min() == ends[-1]


def test_fsdp_backward_prefetch_gathers_before_the_reduce_scatter():
    """ZeRO-3 / FSDP backward: the next layer's parameter all-gather is issued on the dp
    stream before this layer's gradient reduce-scatter (which waits for this layer's
    backward), so it runs beside this layer's backward instead of after it."""
    from retime.collectors.synth import synthesize

    t = synthesize("gpt3-125m", "a100-80gb", tp=1, pp=1, dp=16, global_batch=16,
                   micro_batch=1, zero=3)
    ops = t.ops.assign(name=t.names())
    ops = ops[(ops["rank"] == 0) & (ops["microbatch"] == 0)]
    ag = ops[ops["name"] == "zero3.allgather_params.bwd"].set_index("layer")["start_ns"]
    rs = ops[ops["name"] == "zero3.reduce_scatter_grads"].set_index("layer")["start_ns"]
    bwd = ops[(ops["phase"] == 1) & (ops["kind"] == 0)]  # backward compute kernels
    end = bwd.assign(end=bwd["start_ns"] + bwd["dur_ns"]).groupby("layer")["end"].max()
    pairs = [(lay, lay - 1) for lay in rs.index if lay - 1 in ag.index and lay >= 1]
    assert len(pairs) >= 10
    for lay, nxt in pairs:
        assert ag[nxt] < rs[lay]  # issued first on the dp stream
        assert ag[nxt] < end[lay]  # and starts while this layer's backward still runs


def test_fsdp_under_a_pipeline_gathers_once_and_reduces_after_the_last_backward():
    """FSDP under a pipeline (PyTorch pipelining, torchtitan: ``reshard_after_forward=False``
    with PP, no reshard or gradient sync until the last backward): per pipeline rank and
    step, one parameter all-gather per layer, in the first forward micro-batch; one
    gradient reduce-scatter per layer, issued once the stage's last backward has ended; no
    backward gathers. Without a pipeline every micro-batch gathers and reduces per layer."""
    kw = dict(tp=1, dp=4, global_batch=32, micro_batch=1, fsdp=True)
    t = synthesize("gpt3-125m", "a100-80gb", pp=2, **kw)  # 32 / (1 x 4) = 8 micro-batches
    ops = t.ops.assign(name=t.names())
    for stage in (0, 1):
        r = ops[ops["rank"] == stage * 4]
        ag = r[r["name"] == "zero3.allgather_params"]
        rs = r[r["name"] == "zero3.reduce_scatter_grads"]
        layers = sorted(set(r.loc[(r["kind"] == 0) & (r["layer"] >= 0)
                                  & (r["layer"] < 12), "layer"]))
        assert len(layers) == 6  # 12 layers over 2 stages
        # one gather per layer (the embedding / head pieces add theirs), all in micro-batch 0
        assert set(ag["layer"]) >= set(layers) and len(ag) == len(set(ag["layer"]))
        assert (ag["microbatch"] == 0).all()
        assert not (r["name"] == "zero3.allgather_params.bwd").any()
        assert set(rs["layer"]) >= set(layers) and len(rs) == len(set(rs["layer"]))
        bwd = r[(r["phase"] == 1) & (r["kind"] == 0) & (r["lane"] % 7 == 0)]
        last_bwd_end = (bwd["start_ns"] + bwd["dur_ns"]).max()
        assert (rs["start_ns"] >= last_bwd_end).all()
    # no pipeline: every micro-batch gathers (forward and backward) and reduces per layer
    t1 = synthesize("gpt3-125m", "a100-80gb", pp=1, **dict(kw, global_batch=32))
    o1 = t1.ops.assign(name=t1.names())
    o1 = o1[o1["rank"] == 0]
    mb = o1.loc[o1["name"] == "zero3.reduce_scatter_grads", "microbatch"]
    assert mb.nunique() == 8
    assert (o1["name"] == "zero3.allgather_params.bwd").any()


def test_pipelined_fsdp_memory_holds_the_stage_unsharded():
    """The memory model of FSDP under a pipeline keeps the stage's parameters gathered and
    its gradients unsharded over the step: 2 + 2 bytes per parameter the stage holds with
    16-bit main gradients, 2 + 4 with fp32 ones (a bf16 run's default, Megatron-LM's rule,
    R51), in place of ZeRO-1's gradient bucket (the sharded states are ZeRO-3's: 2 / dp
    weights, 2 or 4 / dp gradients)."""
    kw = dict(tp=1, dp=4, pp=2, global_batch=32, micro_batch=1, check_memory=False)
    mp = synthesize("gpt3-125m", "a100-80gb", fsdp=True, grad_reduce_dtype="bf16",
                    **kw).meta["synth"]["memory"][0]
    m1 = synthesize("gpt3-125m", "a100-80gb", zero=1, **kw).meta["synth"]["memory"][0]
    n = mp["params"]
    assert mp["weights_bytes"] == 2 * n // 4 and mp["grads_bytes"] == 2 * n // 4
    assert mp["buffer_bytes"] - m1["buffer_bytes"] == 4 * n - int(40.0 * 1e6)
    m32 = synthesize("gpt3-125m", "a100-80gb", fsdp=True, **kw).meta["synth"]["memory"][0]
    assert m32["grads_bytes"] == 4 * n // 4
    assert m32["buffer_bytes"] - m1["buffer_bytes"] == 6 * n - int(40.0 * 1e6)
    # PyTorch FSDP2 (torchtitan) accumulates in its reduce dtype: fp32 by default
    for dt, acc in (("fp32", 4), ("bf16", 2)):
        m2 = synthesize("gpt3-125m", "a100-80gb", fsdp=True, fsdp_impl="fsdp2",
                        fsdp_reduce_dtype=dt, **kw).meta["synth"]["memory"][0]
        assert m2["buffer_bytes"] - m1["buffer_bytes"] == (2 + acc) * n - int(40.0 * 1e6)


def test_dualpipe_pairs_run_compute_bound_kernels_on_the_sms_left_by_the_all_to_all():
    """In DualPipe's overlapped forward-backward pairs the all-to-all kernels hold 20 SMs
    (DeepSeek-V3 §3.2.2): a compute-bound kernel (FLOPs per byte at least the BF16 ridge)
    issued after the pair's first communication op takes sm / (sm - 20) of its time; one
    before it, a memory-bound one, and every kernel of an unpaired item keep theirs."""
    from retime.collectors.enums import OpKind
    from retime.collectors.synth.blocks import DUALPIPE_COMM_SMS, comm_sm_stretch
    sms = HW.sm_count
    factor, ridge = comm_sm_stretch(HW)
    assert DUALPIPE_COMM_SMS == 20 and factor == pytest.approx(sms / (sms - 20))
    assert ridge == pytest.approx(HW.peak_tflops["bf16"] * 1e3 / HW.hbm_gbps)
    big, few = 1e12, 1e6  # FLOPs of a GEMM-like kernel, bytes of it
    def ops(tag):
        return (OpTemplate(f"{tag}.gemm0", "compute", 10_000, flops=big, bytes=int(few)),
                OpTemplate(f"{tag}.a2a", "ep", 4_000, kind=int(OpKind.COLLECTIVE), bytes=1000),
                OpTemplate(f"{tag}.gemm1", "compute", 10_000, flops=big, bytes=int(few)),
                OpTemplate(f"{tag}.stream", "compute", 10_000, flops=10.0, bytes=10**9))
    layer = LayerTemplate(ops("f"), ops("b"))
    p, m = 2, 4
    tpl = StepTemplate(layers=(layer,) * 4, optimizer_kernels=())
    par = ParallelConfig(pp=p, global_batch=m, schedule="dualpipe")
    tr = build_trace(tpl, par, CommModel(HW, par), p2p_ns=0, recv_ns=0)
    names = tr.names()
    d = tr.ops["dur_ns"].to_numpy()
    stretched = int(round(10_000 * factor))
    assert set(d[names == "f.stream"]) == {10_000} and set(d[names == "b.stream"]) == {10_000}
    assert set(d[names == "f.gemm1"]) == {10_000, stretched}
    assert set(d[names == "b.gemm1"]) == {10_000, stretched}
    # paired items exist, and in each pair the ops after the first all-to-all stretch
    assert (d[names == "b.gemm0"] == stretched).any()
    assert (d[names == "f.gemm0"] == 10_000).any()


def test_comm_window_stretches_only_kernels_issued_while_the_all_to_all_is_in_flight():
    """One DualPipe pair in issue order: a.gemm0, a.a2a | b.gemm0, b.a2a | a.gemm1 (waits
    for a.a2a), a.stream | b.shared (does not wait for b.a2a), b.gemm1 (waits for it),
    b.stream. A kernel runs beside a communication op from the op after it up to its first
    user: b.gemm0 (beside a.a2a), a.gemm1 and b.shared (beside b.a2a) are stretched;
    a.gemm0 (nothing in flight), b.gemm1 and b.stream (b.a2a has returned) are not, nor
    a.stream (memory-bound)."""
    from retime.collectors.enums import OpKind
    from retime.collectors.synth.blocks import Block, comm_sm_stretch, merge_blocks
    factor, ridge = comm_sm_stretch(HW)
    coll = int(OpKind.COLLECTIVE)
    g = dict(flops=1e12, bytes=10**6)

    def block(tag, shared):
        blk = Block()
        blk.add(OpTemplate(f"{tag}.gemm0", "compute", 1000, **g), 0, 0, [])
        blk.add(OpTemplate(f"{tag}.a2a", "ep", 500, kind=coll, bytes=10), 0, 0, [0])
        if shared:
            blk.add(OpTemplate(f"{tag}.shared", "compute", 1000, **g), 0, 0, [0])
        i = blk.add(OpTemplate(f"{tag}.gemm1", "compute", 1000, **g), 0, 0, [1])
        blk.add(OpTemplate(f"{tag}.stream", "compute", 1000, flops=10.0, bytes=10**9), 0, 0,
                [i])
        return blk
    a, b = block("a", False), block("b", True)
    out, _, _ = merge_blocks(a, b, (factor, ridge))
    assert out.cols["name"] == ["a.gemm0", "a.a2a", "b.gemm0", "b.a2a", "a.gemm1",
                                "a.stream", "b.shared", "b.gemm1", "b.stream"]
    s = int(round(1000 * factor))
    want = {"a.gemm0": 1000, "a.a2a": 500, "b.gemm0": s, "b.a2a": 500, "a.gemm1": s,
            "a.stream": 1000, "b.shared": s, "b.gemm1": 1000, "b.stream": 1000}
    assert dict(zip(out.cols["name"], out.cols["dur"])) == want
    plain, _, _ = merge_blocks(a, b)
    assert plain.cols["dur"] == [500 if n.endswith("a2a") else 1000
                                 for n in plain.cols["name"]]
