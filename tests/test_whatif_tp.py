"""parallel.tp on measured GPU traces (issue 27): linear layers split as Megatron's
column/row pairs found from recorded shapes, TP all-reduces priced by the NCCL model."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import KINETO, ROOT, SHARED, ingest_cached

from retime.collectors.costs.ops import op_cost
from retime.collectors.enums import CommOp, OpKind
from retime.collectors.errors import PolicyError
from retime.replay import prediction_range, replay, whatif
from retime.replay.policies.kernel_cost import shaped_kernels
from retime.replay.policies.nccl_trace import NcclPricer, measured_channels, trace_cluster
from retime.replay.policies.tp_attention import cpu_calls
from retime.replay.policies.tp_measured import dp_buckets, split_dims, tp_layout

VGG = KINETO / "h100-vgg13" / "profiler_vgg13-iter41.json.gz"
#: a real TP pair on CPU (examples/tp/capture_tp.py): two pre-norm transformer blocks,
#: hidden 256, 8 heads of 32, 512 tokens (batch 4 x seq 128), at TP=1 and TP=2 over gloo
TP_PAIR = ROOT / "traces" / "tp"
F32 = 4


@pytest.fixture(scope="module")
def vgg():
    return ingest_cached(VGG)


@pytest.mark.parametrize(("name", "dims", "types"), [
    ("aten::mm", [[512, 4096], [4096, 25088]], ["float", "float"]),
    ("aten::addmm", [[4096], [512, 25088], [25088, 4096], [], []],
     ["float", "float", "float", "Scalar", "Scalar"]),
    ("aten::linear", [[512, 25088], [4096, 25088], [4096]], ["float", "float", "float"]),
])
@pytest.mark.parametrize("axis", ["m", "k", "n"])
@pytest.mark.parametrize("t", [2, 4, 8])
def test_split_dims_divides_the_flops_exactly(name, dims, types, axis, t):
    f0 = op_cost(name, dims, types)[0]
    new = split_dims(name, dims, axis, t)
    assert op_cost(name, new, types)[0] == f0 / t
    assert dims != new  # the input is not edited in place
    # the other two dimensions keep their extents: only one product factor moved
    m, k, n = 512, 25088, 4096
    want = {"m": (m // t, k, n), "k": (m, k // t, n), "n": (m, k, n // t)}[axis]
    assert op_cost(name, new, types)[0] == 2.0 * np.prod(want)


def test_vgg13_classifier_splits_as_one_column_row_pair(vgg):
    lay = tp_layout(vgg, 2)
    kinds = [(L["k"], L["n"], L["kind"]) for L in lay.layers]
    # VGG13's classifier: 25088 -> 4096 -> 4096 -> 1000 at batch 512
    assert kinds == [(25088, 4096, "column"), (4096, 4096, "row"), (4096, 1000, "replicated")]
    assert all(L["dgrad"] is not None and L["wgrad"] is not None for L in lay.layers)
    assert len(lay.calls) == 6
    # TP all-reduces: the row layer's output forward, the column layer's input gradient
    # backward (fp32)
    assert sorted(b for _c, b, _p in lay.allreduces) == [512 * 4096 * F32, 512 * 25088 * F32]


def _kernels(t):
    k = t.ops["kind"].to_numpy()
    return (k == OpKind.KERNEL) | (k == OpKind.MEMSET)


def _carriers(t, lay):
    """The kernels the TP all-reduces are serialized after (their time rides on them)."""
    sk = shaped_kernels(t)
    out = np.zeros(t.n_ops, bool)
    end = t.ops["start_ns"].to_numpy() + t.ops["dur_ns"].to_numpy()
    for c, _b, _p in lay.allreduces:
        own = sk.op_ids[sk.call_of == c]
        out[own[np.argmax(end[own])]] = True
    return out


def test_vgg13_tp2_halves_the_split_flops_and_adds_priced_allreduces(vgg):
    base = replay(vgg)
    r = whatif(vgg, {"parallel.tp": 2})
    fx = r.meta["scenario"][0]["tp_effect"]
    # three GEMMs per split layer (forward, input and weight gradient): 2 m k n each
    flops = 3 * 2.0 * 512 * (25088 * 4096 + 4096 * 4096)
    assert fx["flops_old"] == flops and fx["flops_new"] == flops / 2
    assert fx["tp_allreduce_bytes"] == 512 * (4096 + 25088) * F32
    c, _ = trace_cluster(vgg, ranks_per_node=2, world=2)
    p = NcclPricer(c, channels=measured_channels(vgg))
    priced = sum(p.time_ns(int(CommOp.ALL_REDUCE), 512 * w * F32, 2) for w in (4096, 25088))
    assert fx["tp_allreduce_ns"] == pytest.approx(priced, abs=1)
    # NVLink4 moves 60 MB between two H100s in a fraction of a millisecond
    assert 0.1e6 < priced < 0.5e6
    sk = shaped_kernels(vgg)
    lay = tp_layout(vgg, 2)
    split = np.zeros(vgg.n_ops, bool)
    split[sk.op_ids[np.isin(sk.call_of, lay.calls)]] = True
    kern = _kernels(vgg)
    # every kernel outside the split GEMMs (convolutions, the replicated layer) and every
    # host op keeps its time (but the synchronize call, which lasts until the GPU is done)
    sync = np.asarray(["Synchronize" in str(n) for n in vgg.names()])
    assert 1 <= sync.sum() <= 3
    np.testing.assert_array_equal(r.dur_ns[~split & ~sync], base.dur_ns[~split & ~sync])
    carriers = _carriers(vgg, lay)
    plain = split & kern & ~carriers
    ratio = r.dur_ns[plain] / base.dur_ns[plain]
    # the split GEMMs run at about half their time: not less (half the work), a little more
    # where fewer output tiles fill fewer waves of the H100's 132 SMs (the forward's
    # 512 x 2048 output at TP=2)
    assert len(ratio) >= 5 and (ratio > 0.49).all() and (ratio < 0.6).all()
    assert carriers.sum() == 2
    saved = float(base.dur_ns[split].sum() - r.dur_ns[split].sum()) + priced
    assert saved == pytest.approx(fx["gemm_saved_ns"], rel=0.01)
    # the step moves by what the classifier's GEMMs save less the all-reduces
    assert base.step_time_ns - r.step_time_ns == pytest.approx(fx["gemm_saved_ns"] - priced,
                                                               rel=0.05)
    lo, hi = prediction_range(r)
    assert lo < hi and lo <= r.step_time_ns <= hi
    a = " ".join(r.meta["whatif"]["assumed"])
    assert "column/row pairs" in a and "NCCL model for 2 GPUs" in a
    # one GPU: no data-parallel gradients to resize
    assert fx["dp_buckets_resized"] == 0 and "no gradient all-reduce in the trace" in a


def test_vgg13_tp_allreduces_follow_the_stated_nvlink_rate(vgg):
    fast = whatif(vgg, {"parallel.tp": 2}).meta["scenario"][0]["tp_effect"]
    r = whatif(vgg, {"parallel.tp": 2, "network.intra_node_gbps": 45.0})
    slow = next(d for d in r.meta["scenario"] if "tp_effect" in d)["tp_effect"]
    # the 51 MB backward all-reduce is bandwidth-bound: a tenth of NVLink4's 450 GB/s per
    # GPU takes several times longer (latency and protocol terms do not scale)
    assert slow["tp_allreduce_ns"] > 5 * fast["tp_allreduce_ns"]
    assert any("45 GB/s per GPU stated" in a for a in r.meta["whatif"]["assumed"])


def test_vgg13_tp_flat_pricing_is_exactly_one_over_t(vgg):
    base = replay(vgg)
    r = whatif(vgg, {"parallel.tp": 4, "hardware.kernel_pricing": "flat"})
    sk = shaped_kernels(vgg)
    lay = tp_layout(vgg, 4)
    split = np.zeros(vgg.n_ops, bool)
    split[sk.op_ids[np.isin(sk.call_of, lay.calls)]] = True
    plain = split & ~_carriers(vgg, lay)
    np.testing.assert_allclose(r.dur_ns[plain], base.dur_ns[plain] / 4, atol=1)


def test_dlrm_mlps_split_on_every_rank_with_exact_allreduce_bytes(dlrm_trace):
    dlrm = dlrm_trace
    lay = tp_layout(dlrm, 2)
    # per rank: bottom MLP 13-256-128-16, top MLP 367-512-512-256-1 (batch 16)
    per_rank = [(L["k"], L["n"], L["kind"]) for L in lay.layers if L["rank"] == 0]
    assert per_rank == [(13, 256, "column"), (256, 128, "row"), (128, 16, "replicated"),
                        (367, 512, "column"), (512, 512, "row"), (512, 256, "column"),
                        (256, 1, "row")]
    # forward: each row layer's output; backward: each column layer's input gradient, but
    # not the bottom MLP's first (its input needs no gradient: no such GEMM in the trace)
    rank_bytes = 16 * F32 * ((128 + 512 + 1) + (367 + 512))
    assert sum(b for _c, b, _p in lay.allreduces) == 8 * rank_bytes
    assert len(lay.allreduces) == 8 * 5
    base = replay(dlrm)
    r = whatif(dlrm, {"parallel.tp": 2})
    fx = r.meta["scenario"][0]["tp_effect"]
    assert fx["flops_new"] == fx["flops_old"] / 2
    # DDP's two gradient buckets per rank hold exactly the MLPs' weights and biases, in
    # reverse layer order: top 256-1, 512-256, 512-512 in the first, top 367-512 and the
    # bottom MLP in the second; at TP=2 a column layer keeps half its weight and bias, a
    # row layer half its weight and all its bias, the replicated 128-16 layer all
    b1_old = (256 + 1) + (512 * 256 + 256) + (512 * 512 + 512)
    b2_old = (367 * 512 + 512) + (128 * 16 + 16) + (256 * 128 + 128) + (13 * 256 + 256)
    b1_new = (256 // 2 + 1) + (512 * 256 + 256) // 2 + (512 * 512 // 2 + 512)
    b2_new = (367 * 512 + 512) // 2 + (128 * 16 + 16) + (256 * 128 // 2 + 128) \
        + (13 * 256 + 256) // 2
    buckets = dp_buckets(dlrm, lay)
    assert len(buckets) == 16
    assert sorted({(old, new) for _op, old, new in buckets}) == sorted(
        {(F32 * b1_old, F32 * b1_new), (F32 * b2_old, F32 * b2_new)})
    assert fx["dp_bytes_old"] == 8 * F32 * (b1_old + b2_old)
    assert fx["dp_bytes_new"] == 8 * F32 * (b1_new + b2_new)
    ops = np.asarray([op for op, _o, _n in buckets])
    assert (r.dur_ns[ops] <= base.dur_ns[ops]).all() and fx["dp_saved_ns"] > 0
    k = dlrm.ops["kind"].to_numpy()
    sync = np.asarray(["Synchronize" in str(n) for n in dlrm.names()])
    host = ((k == OpKind.CPU_OP) | (k == OpKind.RUNTIME)) & ~sync
    # the host's work is the measured one but for one NCCL launch per TP all-reduce: the
    # trace's 64 NCCL cudaLaunchKernel calls take 8 us (median), charged on the launch call
    # of the GEMM each all-reduce follows
    grew = host & (r.dur_ns != base.dur_ns)
    assert grew.sum() == 40
    np.testing.assert_array_equal(r.dur_ns[grew] - base.dur_ns[grew], 8000)
    assert fx["tp_launch_host_ns"] == 40 * 8000
    # batch-16 GEMMs sit on their launch floor: splitting them saves next to nothing, and
    # the host-bound step does not move
    assert fx["gemm_saved_ns"] < 0.05 * fx["tp_allreduce_ns"] + 200_000
    assert base.step_time_ns < r.step_time_ns < 1.01 * base.step_time_ns


@pytest.mark.parametrize(("path", "match"), [
    (KINETO / "a100-ddp-nccl", r"no operator shapes .*record_shapes=True"),
    (SHARED / "nsys" / "h100-2gpu-fastvideo.sqlite", r"no operator shapes"),
    (KINETO / "mi300x-resnet-ddp", r"none forms a column/row pair"),
])
def test_tp_refused_where_the_trace_cannot_support_it(path, match):
    t = ingest_cached(path)
    with pytest.raises(PolicyError, match=r"parallel.tp=2 on a measured trace: .*" + match +
                       r".*retime synth --tp 2"):
        whatif(t, {"parallel.tp": 2})


def test_tp_refusals_of_the_key_itself(vgg):
    with pytest.raises(PolicyError, match=r"parallel.tp=16 .* one node's 8 GPUs"):
        whatif(vgg, {"parallel.tp": 16})
    with pytest.raises(PolicyError, match=r"parallel.tp with parallel.micro_batch"):
        whatif(vgg, {"parallel.tp": 2, "parallel.micro_batch": 256})
    with pytest.raises(PolicyError, match=r"hardware.gpu=a100-80gb with parallel.tp=2"):
        whatif(vgg, {"parallel.tp": 2, "hardware.gpu": "a100-80gb"})
    assert whatif(vgg, {"parallel.tp": 1}).step_time_ns == replay(vgg).step_time_ns


def test_cli_refuses_tp_in_one_line(tmp_path, capsys):
    from retime.cli import run

    d = tmp_path / "resnet.retime"
    ingest_cached(KINETO / "mi300x-resnet-ddp").save(d)
    capsys.readouterr()
    assert run(["replay", str(d), "--set", "parallel.tp=2"]) == 2
    cap = capsys.readouterr()
    assert "parallel.tp=2" in cap.err and len(cap.err.strip().splitlines()) == 1
    # no result: stdout holds at most the memory estimate printed before loading
    assert all(ln.startswith("replay: ") for ln in cap.out.splitlines())
    assert "Traceback" not in cap.err


# -- the real TP pair (traces/tp): TP=1 split by the what-if vs TP=2 as recorded -------------
_WORK = ("aten::mm", "aten::addmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
         "aten::_scaled_dot_product_flash_attention_for_cpu_backward")


def _raw(path):
    """The raw Kineto file's GEMM and attention calls ((name, dims) in file order) and its
    gloo all-reduces (bytes each), read with json alone."""
    import gzip
    import json
    ev = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
          if e.get("ph") == "X"]
    calls = [(e["name"], json.dumps(e["args"]["Input Dims"])) for e in ev
             if e.get("cat") == "cpu_op" and e["name"] in _WORK]
    ars = [int(np.prod(e["args"]["Input Dims"][0])) * F32 for e in ev
           if e["name"] == "gloo:all_reduce"]
    return calls, ars


def _flops(calls):
    """2 m n k of every 2-D GEMM call (mm: [m, k] x [k, n]; addmm: bias, [m, k], [k, n])."""
    import json
    f = 0
    for name, dims in calls:
        d = [x for x in json.loads(dims) if x]
        if name in ("aten::mm", "aten::addmm"):
            (m, k), (_k, n) = d[-2], d[-1]
            f += 2 * m * n * k
    return f


def test_real_tp_pair_tp2_graph_is_the_split_tp1_graph():
    """``parallel.tp=2`` on the TP=1 capture rebuilds the TP=2 capture's graph: every GEMM
    and attention call at its TP=2 shape (attention by heads 8 -> 4), FLOPs halved, and the
    TP=2 run's all-reduces (count and bytes, forward and backward) on each rank."""
    from collections import Counter
    tp1 = ingest_cached(TP_PAIR / "tp1")
    raw1, ars1 = _raw(TP_PAIR / "tp1" / "rank-0.pt.trace.json.gz")
    assert ars1 == [] and len(raw1) == 2 * (4 + 1) + 2 * (8 + 1)  # per block: 4 linears
    lay = tp_layout(tp1, 2)
    c = cpu_calls(tp1)
    assert len(lay.attention) == 2 and {b["heads"] for b in lay.attention} == {8}
    assert [L["kind"] for L in lay.layers] == ["column", "row"] * 4
    # every recorded call of TP=1 is split (4 linears x 3 GEMMs + 2 cores per block)
    assert len(set(lay.calls.tolist())) == len(c.names) == len(raw1)
    split = {int(x): split_dims(c.names[x], c.dims[x], a, 2) for x, a in zip(lay.calls,
                                                                                lay.axis)}
    import json
    want = Counter((c.names[x], json.dumps(d)) for x, d in split.items())
    for r in (0, 1):
        raw2, ars2 = _raw(TP_PAIR / "tp2" / f"rank-{r}.pt.trace.json.gz")
        assert Counter(raw2) == want
        assert _flops(raw2) * 2 == _flops(raw1) == 2 * 2 * 512 * 256 * (768 + 256 + 2048) * 3
        # TP all-reduces: as many, as large (512 x 256 fp32 each) as the TP=2 run's
        assert sorted(b for _c, b, _p in lay.allreduces) == sorted(ars2)
        assert len(ars2) == 8 and set(ars2) == {512 * 256 * F32}
    tp2 = ingest_cached(TP_PAIR / "tp2")
    k = tp2.ops["kind"].to_numpy()
    ph = tp2.ops["phase"].to_numpy()[(k == OpKind.COLLECTIVE) & (tp2.ops["rank"] == 0)]
    assert Counter(p for _c, _b, p in lay.allreduces) == {"forward": int((ph == 0).sum()),
                                                          "backward": int((ph == 1).sum())}


@pytest.mark.parametrize("name", ["aten::_scaled_dot_product_flash_attention",
                                  "aten::_scaled_dot_product_efficient_attention",
                                  "aten::_scaled_dot_product_flash_attention_backward"])
@pytest.mark.parametrize("t", [2, 4, 8])
def test_attention_split_by_heads_divides_the_flops_exactly(name, t):
    q = [2, 16, 1024, 64]
    dims = [q, q, q, [], []] if "backward" not in name else [q, q, q, q, q, [2, 16, 1024]]
    types = ["c10::BFloat16"] * 5 + ["float"]
    f0 = op_cost(name, dims, types)[0]
    new = split_dims(name, dims, "h", t)
    assert op_cost(name, new, types)[0] == f0 / t
    # 4 b H s^2 d (x 2.5 backward) at H / t heads; every [b, H, ...] tensor loses its heads
    assert f0 == 4.0 * 2 * 16 * 1024 * 1024 * 64 * (2.5 if "backward" in name else 1.0)
    assert [d[1] for d in new if d] == [16 // t] * sum(1 for d in dims if d)


def test_real_tp_pair_refusals():
    tp1 = ingest_cached(TP_PAIR / "tp1")
    # Megatron splits attention by heads: 8 heads do not split 3 ways
    with pytest.raises(PolicyError, match=r"parallel.tp=3 .*8 heads of 32.* 3 does not "
                                          r"divide 8"):
        whatif(tp1, {"parallel.tp": 3})
    # a CPU run: its gloo all-reduces need a calibration of t ranks
    with pytest.raises(PolicyError, match=r"parallel.tp=2 on a CPU run: .*no collective.*"
                                          r"retime calibrate -n 2"):
        whatif(tp1, {"parallel.tp": 2})
    from retime.collectors.calibrate import attach, read_calibration
    cal = read_calibration(TP_PAIR / "cal-gloo-2.json")
    with pytest.raises(PolicyError, match=r"measured 2 ranks, the TP group has 4"):
        whatif(attach(tp1, cal), {"parallel.tp": 4})


def _self_ns(path):
    """Per innermost GEMM / attention call of the raw file: its span less its children's
    (the host compute Kineto does not cover with an op), summed, in ns."""
    import gzip
    import json
    ev = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
          if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    tot = 0.0
    for e in ev:
        if e["name"] not in _WORK:
            continue
        s, end = e["ts"], e["ts"] + e["dur"]
        kids = sorted((k["ts"], k["ts"] + k["dur"]) for k in ev
                      if k is not e and k["tid"] == e["tid"] and s <= k["ts"] < end)
        covered, reach = 0.0, s
        for a, b in kids:  # the union of the children's spans (they nest)
            covered += max(0.0, min(b, end) - max(a, reach))
            reach = max(reach, min(b, end))
        tot += (e["dur"] - covered) * 1e3
    return tot


def test_real_tp_pair_cpu_step_retimed_from_host_gaps_and_calibrated_gloo():
    """On the CPU run the split calls' host compute (their spans less their leaf ops) halves
    and each TP all-reduce costs alpha + bytes / busbw of this machine's gloo calibration
    (2 ranks: 2(t-1)/t = 1); the single-threaded step moves by exactly that."""
    from retime.collectors.calibrate import attach, read_calibration
    from retime.replay.policies.cluster_cal import sweep_fit
    tp1 = ingest_cached(TP_PAIR / "tp1")
    cal = read_calibration(TP_PAIR / "cal-gloo-2.json")
    fit = sweep_fit(cal)
    base = replay(tp1)
    r = whatif(attach(tp1, cal), {"parallel.tp": 2})
    fx = r.meta["scenario"][0]["tp_effect"]
    half = _self_ns(TP_PAIR / "tp1" / "rank-0.pt.trace.json.gz") / 2
    # nested calls (linear -> addmm) count once: only the innermost are in _WORK
    assert fx["host_compute_saved_ns"] == pytest.approx(half, abs=200)
    ar = 8 * (fit["alpha_us"] * 1e3 + 512 * 256 * F32 / fit["busbw_gbps"])
    assert fx["tp_allreduces"] == 8 and fx["tp_allreduce_ns"] == pytest.approx(ar, abs=2)
    assert base.step_time_ns - r.step_time_ns == pytest.approx(half - ar, rel=0.01)
    lo, hi = prediction_range(r)
    assert lo < r.step_time_ns < hi
    a = " ".join(r.meta["whatif"]["assumed"])
    assert "2 attention block(s) by heads" in a and "cal-gloo-2.json" in a


# -- attention on a GPU trace: a minimal Kineto file of one transformer block ----------------
_BF = "c10::BFloat16"


def _block_calls(qkv: str, m=2048, h=1024, f=4096, b=2, heads=16, core="sdpa", kv=None):
    """(phase, name, dims) of one pre-norm block's GEMM / attention calls, forward then
    backward in reverse, as PyTorch records them (bf16); ``core="bmm"``: eager attention
    (``Q K^T``, softmax, ``P V`` as batched GEMMs over ``b H``); ``kv``: grouped-query
    attention's key / value heads (the k / v projections ``kv d`` wide, the SDPA key and
    value ``[b, kv, s, d]``)."""
    s, d = m // b, h // heads
    kv = kv or heads
    q = [b, heads, s, d]
    k = [b, kv, s, d]
    bh = b * heads
    sdpa_f = [("forward", "aten::_scaled_dot_product_flash_attention", [q, k, k, [], [], [], []])]
    sdpa_b = [("backward", "aten::_scaled_dot_product_flash_attention_backward",
               [q, q, k, k, q, [b, heads, s], [], [], [], [], []])]
    if core == "bmm":
        sdpa_f = [("forward", "aten::bmm", [[bh, s, d], [bh, d, s]]),
                  ("forward", "aten::_softmax", [[b, heads, s, s], [], []]),
                  ("forward", "aten::bmm", [[bh, s, s], [bh, s, d]])]
        sdpa_b = [("backward", "aten::bmm", [[bh, s, d], [bh, d, s]]),
                  ("backward", "aten::bmm", [[bh, s, s], [bh, s, d]]),
                  ("backward", "aten::_softmax_backward_data", [[b, heads, s, s]] * 2 + [[]] * 2),
                  ("backward", "aten::bmm", [[bh, s, s], [bh, s, d]]),
                  ("backward", "aten::bmm", [[bh, s, s], [bh, s, d]])]
    widths = [h + 2 * kv * d] if qkv == "fused" else [h, kv * d, kv * d]
    proj = [("forward", "aten::addmm", [[n], [m, h], [h, n], [], []]) for n in widths]
    fwd = proj + sdpa_f + [
        ("forward", "aten::mm", [[m, h], [h, h]]),
        ("forward", "aten::addmm", [[f], [m, h], [h, f], [], []]),
        ("forward", "aten::mm", [[m, f], [f, h]])]
    bwd = [("backward", "aten::mm", [[m, h], [h, f]]), ("backward", "aten::mm", [[h, m], [m, f]]),
           ("backward", "aten::mm", [[m, f], [f, h]]), ("backward", "aten::mm", [[f, m], [m, h]]),
           ("backward", "aten::mm", [[m, h], [h, h]]), ("backward", "aten::mm", [[h, m], [m, h]]),
           *sdpa_b]
    for n in reversed(widths):
        bwd += [("backward", "aten::mm", [[m, n], [n, h]]),
                ("backward", "aten::mm", [[n, m], [m, h]])]
    return fwd + bwd


def _gpu_block_trace(path, qkv: str, core: str = "sdpa", kv=None):
    """A Kineto JSON of :func:`_block_calls` on an H100: each call one kernel, its time its
    work at 300 TFLOP/s plus 5 us; host calls 20 us apart."""
    import json
    ev, t_cpu, t_gpu = [], 1000.0, 1000.0
    spans = {}
    for i, (ph, name, dims) in enumerate(_block_calls(qkv, core=core, kv=kv)):
        types = [_BF if x else "Scalar" for x in dims]
        if "softmax" in name:
            types = [_BF if x else "int" for x in dims]
        dur = op_cost(name, dims, types)[0] / 300e12 * 1e6 + 5.0
        t_gpu = max(t_gpu, t_cpu + 10) + 2
        ev += [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": t_cpu,
                "dur": 15, "args": {"External id": i + 1, "Input Dims": dims,
                                    "Input type": types, "Concrete Inputs": [""] * len(dims)}},
               {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                "tid": 1, "ts": t_cpu + 5, "dur": 5, "args": {"correlation": 100 + i}},
               {"ph": "X", "cat": "kernel", "name": f"k_{name.split('::')[1]}_{i}", "pid": 0,
                "tid": 7, "ts": t_gpu, "dur": dur, "args": {"correlation": 100 + i,
                                                            "device": 0, "stream": 7}}]
        lo, hi = spans.get(ph, (t_cpu, t_cpu))
        spans[ph] = (min(lo, t_cpu - 1), t_cpu + 16)
        t_cpu, t_gpu = t_cpu + 20, t_gpu + dur
    ev += [{"ph": "X", "cat": "user_annotation", "name": ph, "pid": 1, "tid": 1, "ts": lo,
            "dur": hi - lo} for ph, (lo, hi) in spans.items()]
    ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1,
               "tid": 1, "ts": 990.0, "dur": t_gpu - 980})
    path.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [
        {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 84929347584,
         "computeMajor": 9, "computeMinor": 0, "numSms": 132}], "traceEvents": ev}))
    return path


@pytest.mark.parametrize("qkv", ["fused", "q, k, v"])
def test_gpu_attention_block_splits_by_heads(tmp_path, qkv):
    from retime.collectors.ingest import read
    tr = read([_gpu_block_trace(tmp_path / "rank-0.pt.trace.json", qkv)])
    lay = tp_layout(tr, 2)
    assert [b["heads"] for b in lay.attention] == [16]
    assert lay.attention[0]["core_bwd"] is not None
    n = 1 if qkv == "fused" else 3
    assert [L["kind"] for L in lay.layers] == ["column"] * n + ["row", "column", "row"]
    # forward: the out-projection's and the MLP's outputs; backward: the QKV input's gradient
    # (once, also for q, k, v) and the MLP input's: 2048 x 1024 bf16 each
    assert sorted(p for _c, _b, p in lay.allreduces) == ["backward"] * 2 + ["forward"] * 2
    assert {b for _c, b, _p in lay.allreduces} == {2048 * 1024 * 2}
    base = replay(tr)
    r = whatif(tr, {"parallel.tp": 2})
    fx = r.meta["scenario"][0]["tp_effect"]
    # every GEMM and both attention calls split: exactly half the block's FLOPs
    assert fx["flops_new"] == fx["flops_old"] / 2
    # three GEMMs per split layer (forward, input and weight gradient), two attention calls
    assert fx["split_calls"] == (n + 3) * 3 + 2
    names = np.asarray([str(x) for x in tr.names()])
    core = np.flatnonzero(np.char.startswith(names, "k__scaled_dot"))
    assert len(core) == 2
    ratio = r.dur_ns[core] / base.dur_ns[core]
    # half the heads: at least half the time, less than all of it
    assert ((ratio >= 0.5) & (ratio < 0.8)).all()
    a = " ".join(r.meta["whatif"]["assumed"])
    assert (f"1 attention block(s): QKV {1 if n == 1 else 0} fused, {0 if n == 1 else 1} as "
            "q, k, v; 16 -> 8 heads per rank") in a
    assert (f"{(n + 3) * 3 + 2} forward/backward GEMM and attention call(s) (100.0% of all "
            "GPU time, 100.0% of the compute kernels'") in a
    with pytest.raises(PolicyError, match=r"16 heads of 64.* 3 does not divide 16"):
        whatif(tr, {"parallel.tp": 3})


def test_cli_tp_on_the_cpu_run_reads_the_calibration(tmp_path, capsys):
    """``retime replay TP1 --set parallel.tp=2 --calibration FILE``: the calibration reaches
    the what-if on a whole (not windowed) load too."""
    from retime.cli import run

    d = tmp_path / "tp1.retime"
    ingest_cached(TP_PAIR / "tp1").save(d)
    capsys.readouterr()
    assert run(["replay", str(d), "--set", "parallel.tp=2", "--calibration",
                str(TP_PAIR / "cal-gloo-2.json")]) == 0
    out = capsys.readouterr().out
    assert "what-if" in out and "8 gloo all-reduce(s) of the TP group added (4.19 MB" in out


def test_gpu_eager_attention_splits_its_batched_gemms():
    """Eager attention (``Q K^T`` and ``P V`` as ``aten::bmm`` over b H = 32): both batched
    GEMMs and their four gradients run 16 of 32 batches at TP=2, the softmax forward and
    backward 8 of 16 heads."""
    import tempfile
    from pathlib import Path

    from retime.collectors.ingest import read
    with tempfile.TemporaryDirectory() as d:
        tr = read([_gpu_block_trace(Path(d) / "rank-0.pt.trace.json", "fused", "bmm")])
        lay = tp_layout(tr, 2)
        (blk,) = lay.attention
        assert (blk["axis"], blk["heads"], blk["axes"], blk["axes_bwd"]) == \
            ("b", 16, ["b", "h", "b"], ["b", "b", "h", "b", "b"])
        sk = shaped_kernels(tr)
        bmm = [x for x in lay.calls.tolist() if sk.names[x] == "aten::bmm"]
        assert len(bmm) == 6
        assert all(dd[0] == 16 for x in bmm
                   for dd in split_dims(sk.names[x], sk.dims[x], "b", 2) if dd)
        base = replay(tr)
        r = whatif(tr, {"parallel.tp": 2})
        fx = r.meta["scenario"][0]["tp_effect"]
        assert fx["flops_new"] == fx["flops_old"] / 2 and fx["split_calls"] == 4 * 3 + 8
        names = np.asarray([str(x) for x in tr.names()])
        soft = np.flatnonzero(np.char.startswith(names, "k__softmax"))
        kb = np.flatnonzero(np.char.startswith(names, "k_bmm"))
        assert len(soft) == 2 and len(kb) == 6
        ratio = r.dur_ns[np.r_[kb, soft]] / base.dur_ns[np.r_[kb, soft]]
        assert ((ratio >= 0.5) & (ratio < 0.8)).all()
        a = " ".join(r.meta["whatif"]["assumed"])
        assert "1 of them as batched GEMMs" in a and "5 core backward call(s)" in a


def test_dlrm_tp_on_the_same_gpus_reprices_every_gradient_allreduce_for_fewer_replicas(
        dlrm_trace):
    """``parallel.tp=2`` with ``parallel.dp=4`` on the 8-rank DLRM: 4 replicas of a 2-GPU
    TP group; each of the 16 gradient all-reduces (all DDP buckets of the MLPs) is priced
    at its TP=2 bytes for 4 ranks instead of its measured bytes for 8, the 8 others at their
    bytes for 4 ranks."""
    from retime.replay.policies.base import ranks_per_node_of
    from retime.replay.policies.nccl_trace import kernel_choice
    dlrm = dlrm_trace
    more = whatif(dlrm, {"parallel.tp": 2})
    same = whatif(dlrm, {"parallel.tp": 2, "parallel.dp": 4})
    fx = same.meta["scenario"][0]["tp_effect"]
    assert fx["dp_ranks"] == 4 and fx["dp_buckets_resized"] == 16
    lay = tp_layout(dlrm, 2)
    buckets = dp_buckets(dlrm, lay)
    c, _ = trace_cluster(dlrm, ranks_per_node=ranks_per_node_of(dlrm, None), world=8)
    from retime.replay.graph import build_graph
    g = build_graph(dlrm)
    dur = g.by_op(g.dur_ns)  # the graph's durations (a collective's without its peer wait)
    ar = int(CommOp.ALL_REDUCE)
    saved = 0.0
    o = dlrm.ops
    grads = np.flatnonzero((o["kind"].to_numpy() == OpKind.COLLECTIVE)
                           & (o["comm_op"].to_numpy() == ar))
    # 16 MLP buckets and 8 others of 448 B (not linear layers': their bytes stay)
    assert len(grads) == 24
    p = NcclPricer(c, forced=kernel_choice(dlrm.names()[grads]),
                   channels=measured_channels(dlrm))
    sizes = {op: (old, new) for op, old, new in buckets}
    for op in grads.tolist():
        old, new = sizes.get(op, (int(o["bytes"].iat[op]),) * 2)
        m8, m4 = p.time_ns(ar, old, 8), p.time_ns(ar, new, 4)
        d = float(dur[op])
        # the measured time less the model's saving, at least measured x the model's ratio
        saved += d - max(d - (m8 - m4), d * m4 / m8)
    assert fx["dp_saved_ns"] == pytest.approx(saved, abs=16)
    assert fx["dp_saved_ns"] > more.meta["scenario"][0]["tp_effect"]["dp_saved_ns"]
    assert same.step_time_ns <= more.step_time_ns
    a = " ".join(same.meta["whatif"]["assumed"])
    assert "from 8 to 4 ranks" in a and "4 replicas of a 2-GPU TP group" in a
    with pytest.raises(PolicyError, match=r"parallel.tp=2 with parallel.dp=2 .* tp x dp = "
                                          r"the trace's 8 ranks; set parallel.dp=4"):
        whatif(dlrm, {"parallel.tp": 2, "parallel.dp": 2})


def test_cpu_ddp_transformer_keeps_its_dp_collectives_and_refuses_fewer_replicas():
    """A 2-rank CPU DDP transformer (traces/pairs): parallel.tp=2 splits its layers, keeps
    its gloo gradient all-reduces (said), and refuses the same-GPUs option on gloo."""
    from retime.collectors.calibrate import attach, read_calibration
    tr = attach(ingest_cached(ROOT / "traces" / "pairs" / "transformer-bandwidth" / "A"),
                read_calibration(TP_PAIR / "cal-gloo-2.json"))
    r = whatif(tr, {"parallel.tp": 2})
    fx = r.meta["scenario"][0]["tp_effect"]
    lay = tp_layout(tr, 2)
    assert fx["split_layers"] == sum(L["kind"] != "replicated" for L in lay.layers) > 0
    assert fx["attention_blocks"] == len(lay.attention) > 0
    # nn.TransformerEncoderLayer(nhead=4) (examples/pairs/job.py): fused in-projection
    assert {b["heads"] for b in lay.attention} == {4}
    assert all(len(b["qkv"]) == 1 and b["core_bwd"] for b in lay.attention)
    a = " ".join(r.meta["whatif"]["assumed"])
    assert "data-parallel collective(s) keep their measured times" in a
    with pytest.raises(PolicyError, match=r"parallel.tp=2 with parallel.dp on a CPU run"):
        whatif(tr, {"parallel.tp": 2, "parallel.dp": 1})
