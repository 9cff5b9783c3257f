"""GPU swaps of kernels without shapes priced by their math mode (issue 27): FP32 SIMT
kernels by the FP32 peaks, TF32 kernels by the TF32 peaks, and ``hardware.allow_tf32``.

Expected ratios are the datasheet peaks of collectors/costs/REFERENCES.md K10, written out
here (V100 SXM2: FP32 15.7; A100: FP32 19.5, TF32 156; H100 SXM: FP32 67, TF32 494.7
TFLOP/s) and HBM bandwidths (V100 900, A100 40GB 1555, H100 SXM 3350 GB/s); the kernels are
picked by plain substrings of their names, not by the module's rules. The ratio moves a
kernel's time above its launch floor, which becomes the new GPU's (the profiles'
``kernel_overhead_us``: V100 and A100 3.0, H100 2.5 us), as the cost layer prices a kernel."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import KINETO, ingest_cached

from retime.cli import run
from retime.collectors.enums import OpKind
from retime.collectors.errors import PolicyError
from retime.replay import prediction_range, replay, whatif
from retime.replay.policies.keys import key_rows

V100_FP32, A100_FP32, A100_TF32, H100_FP32, H100_TF32 = 15.7, 19.5, 156.0, 67.0, 494.7
#: launch floors (us) of the profiles: v100-sxm2, a100-40gb, h100-sxm
V100, A100, H100 = 3.0, 3.0, 2.5


@pytest.fixture(scope="module")
def sgd():
    return ingest_cached(KINETO / "v100-ddp-sgd")


@pytest.fixture(scope="module")
def cnn():
    return ingest_cached(KINETO / "a100-ddp-nccl")


def _names(t):
    return np.asarray(t.strings, dtype=object)[t.ops["name_id"].to_numpy()]


def _has(t, *subs):
    return np.asarray([any(s in str(n) for s in subs) for n in _names(t)])


def _ratio(t, r, base, mask, floors=(0.0, 0.0), least=5):
    """The ratio the kernels' work above the launch floor moved by (``floors``: old and
    new floor, us; none for kernels the cost layer prices from their shapes)."""
    long = mask & (base.dur_ns > 20_000)  # ns rounding of short kernels aside
    assert long.sum() >= least
    fo, fn = floors[0] * 1e3, floors[1] * 1e3
    return (r.dur_ns[long] - fn) / (base.dur_ns[long] - fo)


def test_v100_fp32_simt_gemms_move_by_the_fp32_peaks(sgd):
    base = replay(sgd)
    r = whatif(sgd, {"hardware.gpu": "h100-sxm"})
    sgemm = _has(sgd, "volta_sgemm", "magma_sgemm")
    np.testing.assert_allclose(_ratio(sgd, r, base, sgemm, (V100, H100)),
                               V100_FP32 / H100_FP32, rtol=1e-3)
    # not the 16-bit tensor peak ratio the flat rule used (125 -> 989.4: 0.126)
    helpers = _has(sgd, "splitKreduce", "epilogue::impl")
    np.testing.assert_allclose(_ratio(sgd, r, base, helpers, (V100, H100)), 900 / 3350,
                               rtol=1e-3)
    host = (sgd.ops["kind"].to_numpy() == OpKind.CPU_OP)
    np.testing.assert_array_equal(r.dur_ns[host], base.dur_ns[host])
    fx = r.meta["scenario"][0]["gpu_effect"]
    kern = sgd.ops["kind"].to_numpy() == OpKind.KERNEL
    dur = sgd.ops["dur_ns"].to_numpy()
    share = dur[sgemm & kern].sum() / dur[kern | (sgd.ops["kind"].to_numpy()
                                                  == OpKind.MEMSET)].sum()
    fp32 = [m for m in fx["modes"] if m["from"] == "fp32"]
    assert sum(m["share"] for m in fp32) == pytest.approx(share, abs=1e-4)
    assert sum(m["kernels"] for m in fp32) == int((sgemm & kern).sum())
    a = " ".join(r.meta["whatif"]["assumed"])
    assert "fp32 64.5% of GPU time" in a and "x0.23 (15.7 -> 67 TFLOP/s)" in a
    # no TF32 units on the V100: the setting is PyTorch's default (GEMMs FP32) and the range
    # replays the other one
    assert "hardware.allow_tf32 not given: PyTorch's defaults" in a
    assert r.meta["whatif"]["range_variants"] == [{"hardware.allow_tf32": True}]


def test_allow_tf32_true_moves_them_to_the_tf32_peak(sgd):
    base = replay(sgd)
    r = whatif(sgd, {"hardware.gpu": "h100-sxm", "hardware.allow_tf32": True})
    sgemm = _has(sgd, "volta_sgemm")
    np.testing.assert_allclose(_ratio(sgd, r, base, sgemm, (V100, H100)),
                               V100_FP32 / H100_TF32, rtol=1e-3)
    assert "range_variants" not in r.meta["whatif"]  # stated: nothing to bound
    a = " ".join(r.meta["whatif"]["assumed"])
    assert "hardware.allow_tf32 = true: FP32 GEMMs and convolutions run on TF32" in a


def test_a100_tf32_kernels_run_fp32_on_a_v100(cnn):
    base = replay(cnn)
    r = whatif(cnn, {"hardware.gpu": "v100-sxm2"})
    tf32 = _has(cnn, "tf32", "s1688gemm")
    np.testing.assert_allclose(_ratio(cnn, r, base, tf32, (A100, V100)),
                               A100_TF32 / V100_FP32, rtol=1e-3)
    simt = _has(cnn, "ampere_sgemm", "simt_sgemm", "scudnn")
    got = _ratio(cnn, r, base, simt, (A100, V100), least=1)
    assert np.median(got) == pytest.approx(A100_FP32 / V100_FP32, rel=1e-3)
    a = " ".join(r.meta["whatif"]["assumed"])
    assert "tf32 -> fp32" in a and "no TF32 units" in a
    assert "range_variants" not in r.meta["whatif"]
    assert r.step_time_ns > base.step_time_ns


def test_ampere_trace_keeps_its_measured_math_unless_stated(cnn):
    base = replay(cnn)
    tf32 = _has(cnn, "tf32", "s1688gemm")
    simt = _has(cnn, "ampere_sgemm", "simt_sgemm", "scudnn")
    r = whatif(cnn, {"hardware.gpu": "h100-sxm"})
    np.testing.assert_allclose(_ratio(cnn, r, base, tf32, (A100, H100)),
                               A100_TF32 / H100_TF32, rtol=1e-3)
    assert "range_variants" not in r.meta["whatif"]  # the trace shows the setting
    off = whatif(cnn, {"hardware.gpu": "h100-sxm", "hardware.allow_tf32": False})
    np.testing.assert_allclose(_ratio(cnn, off, base, tf32, (A100, H100)),
                               A100_TF32 / H100_FP32, rtol=1e-3)
    on = whatif(cnn, {"hardware.gpu": "h100-sxm", "hardware.allow_tf32": True})
    long = simt & (base.dur_ns > 20_000)
    assert long.sum() >= 1
    np.testing.assert_allclose((on.dur_ns[long] - H100 * 1e3)
                               / (base.dur_ns[long] - A100 * 1e3),
                               A100_FP32 / H100_TF32, rtol=1e-3)
    # the math alone on the same GPU: TF32 off makes the TF32 kernels 8x slower (156 / 19.5)
    same = whatif(cnn, {"hardware.gpu": "a100-40gb", "hardware.allow_tf32": False})
    np.testing.assert_allclose(_ratio(cnn, same, base, tf32, (A100, A100)),
                               A100_TF32 / A100_FP32, rtol=1e-3)
    assert off.step_time_ns >= r.step_time_ns


def test_default_range_covers_the_other_setting(sgd):
    r = whatif(sgd, {"hardware.gpu": "h100-sxm"})
    on = whatif(sgd, {"hardware.gpu": "h100-sxm", "hardware.allow_tf32": True})
    lo, hi = prediction_range(r)
    assert lo <= on.step_times()["replayed_step_ns"].max() <= hi


def test_shaped_calls_follow_allow_tf32():
    vgg = ingest_cached(KINETO / "h100-vgg13" / "profiler_vgg13-iter41.json.gz")
    base = replay(vgg)
    gemm = _has(vgg, "sm80_xmma_gemm_f32f32")  # the FP32 SIMT GEMMs of the linear layers
    d = whatif(vgg, {"hardware.gpu": "a100-80gb"})
    on = whatif(vgg, {"hardware.gpu": "a100-80gb", "hardware.allow_tf32": True})
    rd, ro = _ratio(vgg, d, base, gemm), _ratio(vgg, on, base, gemm)
    # TF32 on the A100 (156) beats FP32 (19.5): the same GEMMs take less time than by default
    assert (ro < rd).all()
    # the H100 trace shows its setting (FP32 GEMMs, TF32 convolutions): the range does not
    # replay allow_tf32 (its variants are the flat pricing's)
    assert d.meta["whatif"]["range_variants"] == [{"hardware.kernel_pricing": "flat"}]


def test_allow_tf32_refused_where_it_means_nothing(sgd, tmp_path, capsys):
    with pytest.raises(PolicyError, match="needs hardware.gpu"):
        whatif(sgd, {"hardware.allow_tf32": True})
    with pytest.raises(PolicyError, match="must be true or false"):
        whatif(sgd, {"hardware.gpu": "h100-sxm", "hardware.allow_tf32": "yes"})
    d = tmp_path / "sgd.retime"
    sgd.save(d)
    capsys.readouterr()
    assert run(["replay", str(d), "--set", "hardware.allow_tf32=true", "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hardware.allow_tf32" in err[0] and "Traceback" not in err[0]
    assert run(["replay", str(d), "--set", "hardware.gpu=h100-sxm", "--set",
                "hardware.allow_tf32=true", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["scenario"][0]["allow_tf32"] is True


def test_key_is_listed():
    row = {r["key"]: r for r in key_rows("hardware")}["hardware.allow_tf32"]
    assert row["unit"] == "bool" and row["values"] == "true | false"
    assert "PyTorch's defaults" in row["default"]


def test_volta_trace_with_shapes_bounds_its_gemms_by_the_other_setting(dlrm_trace):
    # DLRM on V100 records shapes: its FP32 GEMM calls are priced by the cost layer, FP32
    # on the H100 by PyTorch's default; the V100 could not show the setting, so the range
    # replays allow_tf32 = true (with the flat pricing, the shape model's own bound)
    base = replay(dlrm_trace)
    d = whatif(dlrm_trace, {"hardware.gpu": "h100-sxm"})
    assert {"hardware.allow_tf32": True} in d.meta["whatif"]["range_variants"]
    on = whatif(dlrm_trace, {"hardware.gpu": "h100-sxm", "hardware.allow_tf32": True})
    sgemm = _has(dlrm_trace, "volta_sgemm")
    long = sgemm & (base.dur_ns > 5_000)
    assert long.sum() >= 5
    # 16-row GEMMs sit near their launch floor: TF32 saves little per kernel (the cost
    # layer's 32-bit tile fill even prices a few of them slightly slower), but in all less
    assert on.dur_ns[long].sum() < 0.95 * d.dur_ns[long].sum()


def test_allow_tf32_refused_on_a_synthesized_run():
    from retime.collectors.synth import synthesize
    t = synthesize("gpt3-125m", "a100-80gb", tp=1, pp=1, dp=2, global_batch=2, micro_batch=1)
    with pytest.raises(PolicyError, match="synthesized run: its math is its --dtype"):
        whatif(t, {"hardware.gpu": "h100-sxm", "hardware.allow_tf32": True})


def test_shaped_calls_run_the_math_their_kernels_show():
    # VGG-13 on an H100: cuDNN runs the convolutions of 3-channel images on the CUDA cores
    # (an ..._ffma_ kernel) and the others on TF32 tensor cores; the linear layers' GEMMs
    # are FP32 SIMT (matmul TF32 off). Read from the kernels each call launched.
    from retime.collectors.costs.ops import op_class, tensors
    from retime.replay.policies.kernel_cost import _measured_math, shaped_kernels
    vgg = ingest_cached(KINETO / "h100-vgg13" / "profiler_vgg13-iter41.json.gz")
    sk = shaped_kernels(vgg)
    seen = {"gemm": set(), "conv3": set(), "conv": set()}
    for j, name in enumerate(sk.names):
        c = op_class(name)
        if c == "gemm":
            seen["gemm"].add(_measured_math(sk.kernels[j]))
        elif c == "conv":
            ts = tensors(sk.dims[j], sk.types[j])
            x = ts[1][0] if name.endswith("backward") else ts[0][0]
            seen["conv3" if x[1] == 3 else "conv"].add(_measured_math(sk.kernels[j]))
    assert seen == {"gemm": {"fp32"}, "conv3": {"fp32"}, "conv": {"tf32"}}


def test_shaped_tf32_work_runs_fp32_where_the_new_gpu_has_no_tf32_units():
    """A call whose work is TF32 moves to FP32 on a GPU without TF32 units PyTorch uses
    (``tf32_capable`` false: V100, AMD), even where its profile lists a TF32 peak (MI300X's
    XF32, 653.7), as the ``assumed:`` line says; on a TF32 GPU it keeps TF32."""
    from types import SimpleNamespace

    from retime.replay.policies.kernel_cost import _tf32_work
    sk = SimpleNamespace(work=[(1e12, 1e9, "tf32"), (1e12, 1e9, "fp32"), (1e9, 1e6, "bf16")],
                         names=["aten::convolution", "aten::mm", "aten::mm"], kernels=None)
    _, new, kinds = _tf32_work(sk, None, True, False)
    assert [w[2] for w in new] == ["fp32", "fp32", "bf16"]
    assert kinds == {"conv", "gemm"}
    assert _tf32_work(sk, None, True, True)[1] is None  # TF32 target: unchanged


def test_h100_tf32_convolutions_on_mi300x_price_at_its_fp32_peak():
    """h100-vgg13's TF32 convolutions (batch 512: compute-bound on both GPUs) on MI300X run
    FP32 (163.4 TFLOP/s matrix peak, no TF32 units PyTorch uses) against the H100's TF32
    (494.7): at least that peak ratio, less 10% for the GPUs' different efficiency curves
    (0.72 vs 0.6 of peak at large sizes would make it larger, not smaller). Before the fix
    they were priced at MI300X's listed XF32 peak: x1.31."""
    vgg = ingest_cached(KINETO / "h100-vgg13" / "profiler_vgg13-iter41.json.gz")
    base = replay(vgg)
    conv = _has(vgg, "implicit_gemm_f32f32_tf32f32", "implicit_gemm_tf32f32_tf32f32")
    r = whatif(vgg, {"hardware.gpu": "mi300x"})
    got = r.dur_ns[conv].sum() / base.dur_ns[conv].sum()
    assert got >= 0.9 * H100_TF32 / 163.4
    assert "run FP32 on mi300x" in " ".join(r.meta["whatif"]["assumed"])


def test_small_fp32_gemm_time_grows_with_its_work():
    """A GEMM with more work in every dimension never costs less: DLRM's small FP32 linears
    (once MI300X 16 x 128 x 256 9.83 us > 16 x 256 x 512 8.98 us, V100 16 x 64 x 64 5.79 >
    16 x 128 x 256 5.57: a whole number of split-K slices made a deeper GEMM's slices
    shallower; tiles.py now shares the k-steps evenly, stream-K style, #27)."""
    from retime.collectors.costs.gpus import gpu_spec
    from retime.collectors.costs.ops import price_op
    from retime.replay.policies.kernel_cost import KERNEL_CURVES

    def t(g, k, n):
        w = (2.0 * 16 * k * n, 4.0 * (16 * k + k * n + 16 * n), "fp32")
        return price_op(gpu_spec(g), "aten::mm", [[16, k], [k, n]], ["float", "float"], w,
                        KERNEL_CURVES, launches=1).time_us

    for g in ("v100-sxm2", "mi300x"):
        sizes = [(64, 64), (128, 256), (256, 512), (512, 1024)]
        times = [t(g, k, n) for k, n in sizes]
        assert times == sorted(times), (g, times)
