"""GPU what-ifs priced from recorded shapes through the cost layer (issue 27): hardware.gpu
and parallel.micro_batch on the shared measured GPU traces."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import KINETO, ingest_cached

from retime.collectors.costs.conv import kernel_role
from retime.collectors.costs.gpus import gpu_spec
from retime.collectors.enums import OpKind
from retime.collectors.errors import PolicyError
from retime.replay import prediction_range, replay, whatif
from retime.replay.policies.kernel_cost import scaled_dims, shaped_kernels, trace_gpu

VGG = KINETO / "h100-vgg13" / "profiler_vgg13-iter41.json.gz"


@pytest.fixture(scope="module")
def vgg():
    return ingest_cached(VGG)


@pytest.fixture(scope="module")
def dlrm():
    return ingest_cached(KINETO / "dlrm-v100-8rank")


def _names(t):
    return np.asarray(t.strings, dtype=object)[t.ops["name_id"].to_numpy()]


def _host(t):
    """Host ops that do not wait for the GPU (a synchronize call lasts until the GPU is
    done, so a GPU change moves it through the replay, not through its own work)."""
    k = t.ops["kind"].to_numpy()
    sync = np.asarray(["Synchronize" in str(n) for n in _names(t)])
    return ((k == OpKind.CPU_OP) | (k == OpKind.RUNTIME)) & ~sync


def test_trace_gpus_are_profiles(vgg, dlrm):
    assert trace_gpu(vgg).name == "h100-sxm"
    assert trace_gpu(dlrm).name == "v100-sxm2"
    a100 = ingest_cached(KINETO / "a100-ddp-nccl")  # "NVIDIA A100-PG509-200", 42 GB
    assert trace_gpu(a100).name == "a100-40gb"


def test_vgg13_h100_to_a100_by_class_physics(vgg):
    base = replay(vgg)
    r = whatif(vgg, {"hardware.gpu": "a100-80gb"})
    ratio = r.dur_ns / np.maximum(base.dur_ns, 1)
    names, host = _names(vgg), _host(vgg)
    # a GPU change never moves the host
    np.testing.assert_array_equal(r.dur_ns[host], base.dur_ns[host])
    sk = shaped_kernels(vgg)
    big = np.zeros(vgg.n_ops, bool)
    big[sk.op_ids] = base.dur_ns[sk.op_ids] > 1_000_000
    # long streaming kernels (ReLU backward) move by the published HBM triad ratio
    # (2.97 / 1.70 TB/s, REFERENCES K2, K3)
    relu = big & np.asarray(["threshold" in str(n) for n in names])
    assert relu.sum() >= 10
    assert np.median(ratio[relu]) == pytest.approx(2970 / 1700, rel=0.03)
    # long TF32 convolution GEMM kernels move by the TF32 ceiling ratio (each GPU's
    # published tf32 ceiling: K1, K20), within the tile / wave
    # differences; the same calls' NCHW <-> NHWC layout kernels by the HBM ratio
    h, a = gpu_spec("h100-sxm"), gpu_spec("a100-80gb")
    tf32 = h.mamf("tf32")[0] / a.mamf("tf32")[0]
    # H100: K1 x the measured tf32 / fp16 cuBLAS ratio (K20); A100: K1 x the datasheet ratio
    assert (h.mamf("tf32")[1], a.mamf("tf32")[1]) == ("published", "derived")
    convish = np.asarray([any(s in str(n) for s in ("conv", "wgrad", "dgrad", "sm90",
                                                     "xmma", "cudnn")) for n in names])
    layout = np.asarray([kernel_role(str(n)) == "layout" for n in names])
    conv = big & convish & ~layout
    assert conv.sum() >= 10
    assert np.median(ratio[conv]) == pytest.approx(tf32, rel=0.10)
    assert (big & layout).sum() >= 10
    assert np.median(ratio[big & layout]) == pytest.approx(2970 / 1700, rel=0.03)
    # the step lands between the two regimes (not the flat 2.2x of peaks mixed by class)
    step = r.step_time_ns / base.step_time_ns
    assert 2970 / 1700 < step < tf32
    a_ = " ".join(r.meta["whatif"]["assumed"])
    assert "recorded shapes (86.0% of GPU time)" in a_
    assert "without a recorded shape (14.0% of GPU time)" in a_
    # the range reaches the flat class ratio of peaks (the rule the model refines), which
    # is the what-if with hardware.kernel_pricing = "flat"
    flat = whatif(vgg, {"hardware.gpu": "a100-80gb", "hardware.kernel_pricing": "flat"})
    # the flat rule prices GEMM/conv kernels by their own math mode's peaks: the FP32 SIMT
    # GEMMs by 67 / 19.5 TFLOP/s (was the 16-bit ratio 989.4 / 312: 774.857 ms then)
    fp32 = np.asarray(["sm80_xmma_gemm_f32f32" in str(n) for n in names]) \
        & (base.dur_ns > 100_000)
    assert fp32.sum() >= 5
    np.testing.assert_allclose(flat.dur_ns[fp32] / base.dur_ns[fp32], 67 / 19.5, rtol=1e-3)
    assert flat.step_time_ns == pytest.approx(779.585e6, rel=1e-4)
    lo, hi = prediction_range(r)
    assert lo < min(flat.step_time_ns, r.step_time_ns) <= max(flat.step_time_ns,
                                                              r.step_time_ns) < hi


def test_gpu_swap_refuses_what_the_trace_cannot_support(vgg):
    gloo = ingest_cached(KINETO / "cpu-gloo-rank34")
    with pytest.raises(PolicyError, match="no GPU kernels"):
        whatif(gloo, {"hardware.gpu": "h100-sxm"})
    # V100 has no tf32 units: the fp32 trace's convolutions run on the CUDA cores there
    r = whatif(vgg, {"hardware.gpu": "v100-sxm2"})
    assert any("no tf32 units" in a for a in r.meta["whatif"]["assumed"])
    # closed-form floor: every convolution FLOP at Winograd's 2.25x fewer products (K34) at
    # the V100's FP32 peak; and far slower than the H100 (TF32 tensor cores)
    from retime.collectors.costs.gpus import gpu_spec
    from retime.replay.policies.kernel_cost import shaped_kernels
    sk = shaped_kernels(vgg)
    conv = sum(w[0] for n, w in zip(sk.names, sk.work)
               if w is not None and "conv" in n.split("::")[-1])
    peak = gpu_spec("v100-sxm2").hw.peak_tflops["fp32"] * 1e12
    assert conv > 3e13 and r.step_time_ns > conv / 2.25 / peak * 1e9
    assert r.step_time_ns > 5 * replay(vgg).step_time_ns


def test_dlrm_double_batch_keeps_host_time(dlrm):
    base = replay(dlrm)
    r = whatif(dlrm, {"parallel.micro_batch": 32})
    host = _host(dlrm)
    np.testing.assert_array_equal(r.dur_ns[host], base.dur_ns[host])
    # the host-bound DLRM step barely moves (it was +36% when host time scaled by b'/b)
    assert r.step_time_ns == pytest.approx(base.step_time_ns, rel=0.02)
    sk = shaped_kernels(dlrm)
    ratio = r.dur_ns[sk.op_ids] / np.maximum(base.dur_ns[sk.op_ids], 1)
    changed = ratio[np.abs(ratio - 1) > 1e-3]
    # kernels of 16-row GEMMs sit on their launch floor: twice the rows costs far less
    # than twice the time
    assert len(changed) and (changed > 0.99).all() and (changed < 2.0).all()
    fx = r.meta["scenario"][0]["batch_effect"]
    assert fx["measured_batch"] == 16 and fx["shaped_kernels"] > 500
    a = " ".join(r.meta["whatif"]["assumed"])
    assert "without a recorded shape" in a and "scale linearly (x2)" in a


def test_vgg_smaller_batch_scales_big_kernels_with_their_work(vgg):
    base = replay(vgg)
    r = whatif(vgg, {"parallel.micro_batch": 64})
    sk = shaped_kernels(vgg)
    big = sk.op_ids[base.dur_ns[sk.op_ids] > 2_000_000]
    ratio = r.dur_ns[big] / base.dur_ns[big]
    # a 512 -> 64 batch on kernels of milliseconds: close to linear, never below it
    assert np.median(ratio) == pytest.approx(64 / 512, rel=0.15)
    assert (ratio > 64 / 512 * 0.97).all()
    assert 64 / 512 < r.step_time_ns / base.step_time_ns < 0.3


def test_scaled_dims_moves_only_the_batch():
    w = {(512, 512, 3, 3)}
    # a convolution's input, not its filters (512 filters == batch 512 by coincidence)
    assert scaled_dims("aten::cudnn_convolution", [[512, 256, 28, 28], [512, 256, 3, 3]],
                       512, 64, w)[:2] == [[64, 256, 28, 28], [512, 256, 3, 3]]
    # backward: output gradient and input
    assert scaled_dims("aten::convolution_backward",
                       [[512, 512, 7, 7], [512, 256, 14, 14], [512, 256, 3, 3]], 512, 64,
                       w) == [[64, 512, 7, 7], [64, 256, 14, 14], [512, 256, 3, 3]]
    # GEMMs: rows of the activations; a weight gradient X^T dY reduces over the batch
    assert scaled_dims("aten::mm", [[16, 512], [512, 256]], 16, 32, set()) == \
        [[32, 512], [512, 256]]
    assert scaled_dims("aten::mm", [[256, 16], [16, 512]], 16, 32, set()) == \
        [[256, 32], [32, 512]]
    assert scaled_dims("aten::addmm", [[256], [16, 512], [512, 256]], 16, 8, set()) == \
        [[256], [8, 512], [512, 256]]
    # streaming ops: every batch-led tensor but parameters
    assert scaled_dims("aten::add_", [[512, 512, 3, 3], [512, 512, 3, 3]], 512, 64, w) == \
        [[512, 512, 3, 3], [512, 512, 3, 3]]
    assert scaled_dims("aten::relu", [[512, 64, 224, 224]], 512, 64, w) == \
        [[64, 64, 224, 224]]


def test_mi300x_rocm_trace_to_mi250x_and_double_batch():
    t = ingest_cached(KINETO / "mi300x-resnet-ddp")
    assert trace_gpu(t).name == "mi300x"
    base = replay(t)
    r = whatif(t, {"hardware.gpu": "mi250x"})
    host = _host(t)
    np.testing.assert_array_equal(r.dur_ns[host], base.dur_ns[host])
    sk = shaped_kernels(t)
    ok = base.dur_ns[sk.op_ids] > 0
    ratio = r.dur_ns[sk.op_ids][ok] / base.dur_ns[sk.op_ids][ok]
    # one MI250X GCD is behind an MI300X in every ceiling (147 vs 668 bf16 TFLOP/s, K1, K28;
    # 1.6 vs 5.3 TB/s) and launches no faster: none beyond the ratio of matmul ceilings, and
    # every kernel but the tiny GEMMs of test_no_kernel_gets_faster_on_a_mi250x (a known
    # miss) at least as slow (rounding to whole nanoseconds aside)
    assert (ratio < 668.4 / 147.0 * 1.01).all()
    big = base.dur_ns[sk.op_ids][ok] >= 20_000
    assert big.sum() > 100 and (ratio[big] > 0.999).all()
    a = " ".join(r.meta["whatif"]["assumed"])
    assert "mi300x -> mi250x" in a and "without a recorded shape" in a
    assert r.step_time_ns > base.step_time_ns
    b2 = whatif(t, {"parallel.micro_batch": 20})
    fx = b2.meta["scenario"][0]["batch_effect"]
    assert fx["measured_batch"] == 10 and fx["shaped_kernels"] > 1000
    # batch-10 ResNet kernels are mostly launch-bound: doubling the batch adds far less
    # than doubling the kernels' time
    assert 1.0 <= fx["ratio_median"] < 1.5 and fx["ratio_max"] <= 2.0 + 1e-9



def test_no_kernel_gets_faster_on_a_mi250x():
    t = ingest_cached(KINETO / "mi300x-resnet-ddp")
    base = replay(t)
    r = whatif(t, {"hardware.gpu": "mi250x"})
    sk = shaped_kernels(t)
    ok = base.dur_ns[sk.op_ids] > 0
    ratio = r.dur_ns[sk.op_ids][ok] / base.dur_ns[sk.op_ids][ok]
    assert (ratio > 0.999).all(), f"fastest ratio {ratio.min():.3f}"

def test_cli_replay_prints_the_pricing_and_its_range(vgg, tmp_path, capsys):
    import json

    from retime.cli import run

    d = tmp_path / "vgg.retime"
    vgg.save(d)
    capsys.readouterr()
    assert run(["replay", str(d), "--set", "hardware.gpu=a100-80gb", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    st = js["step_time_ns"]
    lo, hi = st["range"]
    assert lo < st["replayed"] < hi and hi > 775e6  # reaches past the flat rule's 775 ms
    assert any("re-timed as measured x model(new) / model(old)" in a
               for a in js["whatif"]["assumed"])
    assert run(["replay", str(d), "--set", "hardware.kernel_pricing=cubic"]) == 2
    assert "hardware.kernel_pricing='cubic'" in capsys.readouterr().err


def test_floor_scaled_moves_only_the_work_above_the_launch_floor():
    from retime.replay.policies.kernel_cost import floor_scaled
    d = np.array([1_000.0, 3_000.0, 5_000.0, 103_000.0])
    # V100 (3 us) -> MI300X (4 us) at a ratio of 0.5: the floor is the new GPU's, the work
    # above it halves; a kernel at or below the old floor is all floor (x 4 / 3)
    np.testing.assert_allclose(floor_scaled(d, 0.5, 3.0, 4.0),
                               [4_000 / 3, 4_000.0, 5_000.0, 54_000.0])
    # a batch change (same floor, x2): launch-bound kernels keep their time
    np.testing.assert_allclose(floor_scaled(d, 2.0, 3.0, 3.0), [1_000, 3_000, 7_000, 203_000])


def test_unshaped_kernels_keep_the_new_gpus_launch_floor(dlrm):
    """V100 -> MI300X on DLRM: the shaped kernels (the cost layer) get slower on the MI300X's
    longer launch floor; the kernels without shapes never drop below it (x0.17 by HBM
    would take a 3 us kernel to 0.5 us)."""
    base = replay(dlrm)
    r = whatif(dlrm, {"hardware.gpu": "mi300x"})
    k = dlrm.ops["kind"].to_numpy()
    kern = k == OpKind.KERNEL
    un = kern.copy()
    un[shaped_kernels(dlrm).op_ids] = False
    names = _names(dlrm)
    un &= ~np.asarray(["nccl" in str(n).lower() for n in names])
    assert un.sum() > 100
    b, n = base.dur_ns[un], r.dur_ns[un]
    floor_old, floor_new = 3_000.0, 4_000.0  # v100-sxm2, mi300x kernel_overhead_us
    low = b <= floor_old
    assert low.sum() > 50 and (~low).sum() > 50
    np.testing.assert_allclose(n[low], b[low] * floor_new / floor_old, rtol=1e-6, atol=1.0)
    assert (n[~low] >= floor_new - 1).all() and (n[~low] <= b[~low] + floor_new).all()
    a = " ".join(r.meta["whatif"]["assumed"])
    assert "above their launch floor, which becomes the new GPU's (3 -> 4 us" in a
    # the flat pricing (the range's other end) keeps the plain ratio
    f = whatif(dlrm, {"hardware.gpu": "mi300x", "hardware.kernel_pricing": "flat"})
    assert (f.dur_ns[un & (base.dur_ns > 0)] < base.dur_ns[un & (base.dur_ns > 0)]).all()


def test_double_batch_keeps_launch_bound_kernels_without_shapes(dlrm):
    base = replay(dlrm)
    r = whatif(dlrm, {"parallel.micro_batch": 32})
    k = dlrm.ops["kind"].to_numpy()
    un = k == OpKind.KERNEL
    un[shaped_kernels(dlrm).op_ids] = False
    moved = un & (r.dur_ns != base.dur_ns)
    assert moved.sum() > 50
    b, n = base.dur_ns[moved], r.dur_ns[moved]
    # the work above the 3 us floor doubles, the floor does not
    np.testing.assert_allclose(n, 3_000 + (b - 3_000) * 2, rtol=1e-6, atol=1.0)
    kept = un & (base.dur_ns <= 3_000) & (base.dur_ns > 0)
    np.testing.assert_array_equal(r.dur_ns[kept], base.dur_ns[kept])
    a = " ".join(r.meta["whatif"]["assumed"])
    assert "above their launch floor (3 us on v100-sxm2" in a


def test_gpu_swap_after_a_batch_change_is_priced_at_the_new_shapes(vgg):
    """parallel.micro_batch + hardware.gpu: the swap's ratio is the cost layer's at the
    batch that runs. VGG-13's first classifier GEMM (forward, [b, 25088] x [25088, 4096],
    FP32 on the CUDA cores) is compute-bound at the recorded batch 512 (A100 / H100 by
    their FP32 rates, 3.4x) and memory-bound at 12 (its 411 MB weight at each GPU's HBM
    triad, K35): measured x model(H100, 12) / model(H100, 512) x model(A100, 12) /
    model(H100, 12), in closed form the measured time x the A100's stream over the H100's
    batch-512 price."""
    from retime.collectors.costs import kernels as K
    names = _names(vgg)
    k = vgg.ops["kind"].to_numpy() == OpKind.KERNEL
    i = int(np.flatnonzero(k & np.asarray(["gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8"
                                           in str(n) for n in names]))[0])
    meas = float(vgg.ops["dur_ns"].iat[i])
    assert meas == 2020e3  # the raw file's first FP32 tn GEMM: the fc1 forward, 2020 us
    h, a = gpu_spec("h100-sxm"), gpu_spec("a100-80gb")
    c = K.FITTED_CURVES
    p = {(g.name, b): K.matmul(g, b, 4096, 25088, dtype="fp32", curves=c).time_us
         for g in (h, a) for b in (12, 512)}
    nbytes = 4 * (12 * 25088 + 25088 * 4096 + 12 * 4096)
    assert p["a100-80gb", 12] == pytest.approx(nbytes / (1700.0 * 1e3), rel=1e-3)
    r = whatif(vgg, {"parallel.micro_batch": 12, "hardware.gpu": "a100-80gb"})
    both = float(np.asarray(r.dur_ns)[i])
    assert both == pytest.approx(meas * p["a100-80gb", 12] / p["h100-sxm", 512], abs=1.0)  # ns
    # not the recorded shapes' ratio (3.4x, compute-bound): that would be 2x slower
    swap512 = p["a100-80gb", 512] / p["h100-sxm", 512]
    assert swap512 > 3.0 and both < 0.6 * meas * p["h100-sxm", 12] / p["h100-sxm", 512] * swap512
