"""Convolution calls priced as the kernels the library runs (collectors/costs/conv.py), the
derived tf32 / fp32 ceilings and the GEMM tile fill as a time (issue 27)."""

from __future__ import annotations

import json

import pytest

from retime.cli import run
from retime.collectors.costs.conv import (
    conv2d_call,
    conv_passes,
    kernel_pass,
    kernel_role,
    pass_costs,
    price_conv,
)
from retime.collectors.costs.gpus import gpu_spec
from retime.collectors.costs.kernels import DEFAULT_CURVES, FITTED_CURVES, Curves, math_path, matmul
from retime.collectors.costs.ops import op_cost, price_op
from retime.collectors.errors import ConfigError

# kernel names as the shared traces record them (h100-vgg13: cuDNN 9 on H100; mi300x: MIOpen)
NCHW2NHWC = ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, "
             "(cudnnKernelDataType_t)0>(cudnn::ops::nchw2nhwc_params_t<float>, float const*)")
NHWC2NCHW = ("void cudnn::ops::nhwcToNchwKernel<float, float, float, true, false, "
             "(cudnnKernelDataType_t)0>(cudnn::ops::nhwc2nchw_params_t<float>, float const*)")
FPROP = ("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize256x64x32_"
         "warpgroupsize1x1x1_g1_execute_segment_k_off_kernel__5x_cudnn")
X = [512, 64, 224, 224]
W = [64, 64, 3, 3]
T = ["float", "float"]


def test_kernel_roles_of_cudnn_and_miopen_names():
    assert kernel_role(NCHW2NHWC) == kernel_role(NHWC2NCHW) == "layout"
    assert kernel_role("batched_transpose_16x32_half") == "layout"
    assert kernel_role("transpose_NCHW2CNHW_V2_2D_WG_off64") == "layout"
    assert kernel_role("SubTensorOpWithCastTensor1d") == "layout"
    assert kernel_role("Memset (Device)") == "aux"
    assert kernel_role("SubTensorOpWithScalar1d") == "aux"
    assert kernel_role("void splitKreduce_kernel<32, 16, int, float>") == "aux"
    assert kernel_role(FPROP) == "main"
    assert kernel_role("igemm_wrw_gtcx3_nhwc_bf16_bx0_ex1_bt256x128x16_gkgs") == "main"


def test_conv_passes_are_the_three_implicit_gemms():
    # forward: M = N P Q, N = K, K = C R S
    f = 2.0 * 512 * 64 * 64 * 9 * 224 * 224
    passes, acts = conv_passes("cudnn_convolution", [(X, "float"), (W, "float")], f)
    assert [(p[0], p[1], p[2], p[3]) for p in passes] == [
        ("fprop", 512 * 224 * 224, 64, 64 * 9)]
    assert acts == [512 * 64 * 224 * 224] * 2
    # backward of a 256 -> 512 3x3 convolution: data gradient M = N H W, N = C, K = K R S;
    # weight gradient M = K, N = C R S, K = N P Q
    go, x, w = [32, 512, 14, 14], [32, 256, 14, 14], [512, 256, 3, 3]
    f1 = 2.0 * 32 * 512 * 256 * 9 * 14 * 14
    ts = [(go, "float"), (x, "float"), (w, "float")]
    passes, acts = conv_passes("convolution_backward", ts, 2 * f1)
    assert [(p[0], round(p[1]), p[2], p[3]) for p in passes] == [
        ("dgrad", 32 * 14 * 14, 256, 512 * 9), ("wgrad", 512, 256 * 9, 32 * 14 * 14)]
    assert len(acts) == 4
    # an image input (3 channels) gets no gradient: the weight gradient only, even when the
    # recorded work (no output mask in the trace) counts both
    ts = [([32, 64, 224, 224], "float"), ([32, 3, 224, 224], "float"),
          ([64, 3, 3, 3], "float")]
    passes, _ = conv_passes("convolution_backward", ts, 2 * 2.0 * 32 * 64 * 27 * 224 * 224)
    assert [p[0] for p in passes] == ["wgrad"]
    # one GEMM kernel launched: one pass
    passes, _ = conv_passes("convolution_backward", [(go, "float"), (x, "float"),
                                                     (w, "float")], 2 * f1, mains=1)
    assert [p[0] for p in passes] == ["wgrad"]


def test_layout_kernels_are_hbm_copies_of_the_activations():
    g = gpu_spec("h100-sxm")
    work = op_cost("aten::cudnn_convolution", [X, W], T)
    kern = [NCHW2NHWC, NCHW2NHWC, "Memset (Device)", FPROP, NHWC2NCHW]
    c = price_op(g, "aten::cudnn_convolution", [X, W], T, work, FITTED_CURVES, kernels=kern)
    parts = dict(c.parts)
    assert set(parts) == {"main", "layout", "aux"}
    # two activations (input, output) of 512 x 64 x 224 x 224 fp32, each read and written
    # once at the published H100 triad (2.97 TB/s, K3); the trace measured 4735 and 4368 us
    one = 2 * 4 * 512 * 64 * 224 * 224 / 2970e9 * 1e6
    assert parts["layout"] == pytest.approx(2 * one, rel=0.01)
    assert 0.85 < parts["layout"] / (4735 + 4368) < 1.0
    # the weight's transpose and the memset: two launch floors
    assert parts["aux"] == pytest.approx(2 * g.hw.kernel_overhead_us)
    assert c.time_us == pytest.approx(sum(parts.values()))
    # without names: the GEMM pass and one floor per further kernel, no copies
    bare = price_op(g, "aten::cudnn_convolution", [X, W], T, work, FITTED_CURVES,
                    launches=5)
    assert bare.time_us == pytest.approx(parts["main"] + 4 * g.hw.kernel_overhead_us)


def test_image_input_tf32_convolution_runs_on_the_cuda_cores():
    g = gpu_spec("h100-sxm")
    x, w = [512, 3, 224, 224], [64, 3, 3, 3]
    work = op_cost("aten::cudnn_convolution", [x, w], T)
    assert work[2] == "tf32"
    c = price_conv(g, "cudnn_convolution", [(x, "float"), (w, "float")], work[0], "tf32",
                   4, DEFAULT_CURVES)
    assert "fp32 matmul" in c.efficiency_source
    aligned = price_conv(g, "cudnn_convolution", [([512, 4, 224, 224], "float"),
                                                  ([64, 4, 3, 3], "float")],
                         work[0] * 4 / 3, "tf32", 4, DEFAULT_CURVES)
    # four channels meet the tensor cores' alignment: no fp32 pricing (there, the layer is
    # bound by its bytes, not its FLOPs)
    assert "fp32" not in aligned.efficiency_source and aligned.bound == "memory"
    assert c.bound == "compute" and aligned.time_us < c.time_us / 1.5


def test_derived_ceilings_and_the_tile_fill_time():
    h = gpu_spec("h100-sxm")
    # H100's tf32 ceiling: K1's bf16 one x the tf32 / fp16 cuBLAS ratio at 8192^3 (K20)
    assert h.mamf("tf32") == (pytest.approx(792.1 * 412.04 / 749.89, abs=0.05), "published")
    # elsewhere the published bf16 ceiling's fraction of its peak (792.1 / 989.4, K1) on
    # tf32 / fp32
    assert h.mamf("fp32") == (pytest.approx(792.1 / 989.4 * 67.0), "derived")
    a = gpu_spec("a100-80gb")
    assert a.mamf("tf32") == (pytest.approx(267.9 / 312.0 * 156.0), "derived")
    v = gpu_spec("v100-sxm2")
    assert v.mamf("fp32") == (11.9, "published")  # K6 stays
    # 2.5 us of tile fill is 11 k-steps of a 128 x 128 fp32 tile on a V100 SM (11.9 TFLOP/s
    # over 80 SMs): it caps the profile's 27.5 there; 458 of a bf16 one on an H100 SM (792.1
    # over 132) leave the profile's 192; on an MI300X CU (668.4 over 304, K28) it is 168, and
    # 3 us (201) leave the 192
    c = Curves(tile_fill_us=2.5, tile_fill_tc_us=2.5)
    assert "k_half 28," in matmul(v, 512, 512, 512, dtype="fp32").efficiency_source
    assert "k_half 11," in matmul(v, 512, 512, 512, dtype="fp32", curves=c).efficiency_source
    m = gpu_spec("mi300x")
    assert "k_half 168," in matmul(m, 512, 512, 512, dtype="bf16", curves=c).efficiency_source
    c3 = Curves(tile_fill_us=2.5, tile_fill_tc_us=3.0)
    assert "k_half 192," in matmul(m, 512, 512, 512, dtype="bf16", curves=c3).efficiency_source
    assert matmul(h, 4096, 4096, 4096, curves=c).time_us == pytest.approx(
        matmul(h, 4096, 4096, 4096).time_us)
    # a longer fill makes a shallow GEMM slower, never faster
    short = matmul(m, 4096, 4096, 256, curves=Curves(tile_fill_tc_us=0.5)).time_us
    assert matmul(m, 4096, 4096, 256, curves=c).time_us > short
    with pytest.raises(ConfigError, match="tile_fill_us"):
        Curves(tile_fill_us=-1.0)
    with pytest.raises(ConfigError, match="tile_fill_tc_us"):
        Curves(tile_fill_tc_us=-1.0)


def test_the_tile_fill_is_per_math_path():
    v, h, m = gpu_spec("v100-sxm2"), gpu_spec("h100-sxm"), gpu_spec("mi300x")
    # FP32 runs on NVIDIA's CUDA cores (SIMT); AMD runs it on its matrix cores, and every
    # 16-bit / TF32 GEMM runs on tensor cores
    assert [math_path(g, "fp32") for g in (v, h, m)] == ["simt", "simt", "tensor"]
    assert {math_path(g, dt) for g in (v, h, m) for dt in ("bf16", "fp16", "tf32")} == \
        {"tensor"}
    # each path's fill moves only its own GEMMs: 0.5 us is 2 k-steps of a 128 x 128 fp32
    # tile on a V100 SM (11.9 TFLOP/s / 80), 34 of a bf16 one on an MI300X CU (668.4 / 304)
    simt, tc = Curves(tile_fill_us=0.5), Curves(tile_fill_tc_us=0.5)
    assert "k_half 2," in matmul(v, 512, 512, 512, dtype="fp32", curves=simt).efficiency_source
    assert "k_half 28," in matmul(v, 512, 512, 512, dtype="fp32", curves=tc).efficiency_source
    assert "k_half 34," in matmul(m, 512, 512, 512, dtype="bf16", curves=tc).efficiency_source
    assert "k_half 192," in matmul(m, 512, 512, 512, dtype="bf16", curves=simt).efficiency_source
    # the V100 has no bf16 / tf32: its fp16 tensor-core GEMMs take the tensor-core fill
    assert matmul(v, 256, 256, 256, dtype="fp16", curves=simt).time_us == pytest.approx(
        matmul(v, 256, 256, 256, dtype="fp16").time_us)
    assert matmul(v, 256, 256, 256, dtype="fp16", curves=tc).time_us < \
        matmul(v, 256, 256, 256, dtype="fp16").time_us
    with pytest.raises(ConfigError, match="wgrad_eff"):
        Curves(wgrad_eff=1.2)


# weight- and data-gradient kernels as the shared traces name them
WGRAD = ["sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x"
         "128x32_warpgroupsize1x1x1_g1_execute_segment_k_on_kernel_cudnn_train",
         "void cutlass_cudnn_train::Kernel<cutlass_tensorop_s1688wgrad_optimized_tf32_256x64_"
         "16x4_nhwc_align4>(cutlass_tensorop_s1688wgrad_optimized_tf32_256x64_16x4_nhwc_"
         "align4::Params)",
         "void wgrad_alg0_engine<float, 128, 5, 5, 3, 3, 3, false, 512>(int, int, int)",
         "igemm_wrw_gtcx3_nhwc_bf16_bx0_ex1_bt64x64x64_wt32x32x8_ws1x1_wr1x1_ta1x4x1x4_1x16x1x16_"
         "tb1x4x1x4_1x16x1x16_gkgs",
         "_ZN2ck16tensor_operation6device37kernel_batched_gemm_xdlops_bwd_weightINS_47Gridwise"]
DGRAD = ["sm90_xmma_dgrad_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x256x32_"
         "cgasize2x1x1_warpgroupsize2x1x1_g1_execute_segment_k_off_kernel_cudnn_infer",
         "igemm_bwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x32_wt32x32x8_ws1x1_wr2x2_ta1x8x2x1_1x4x1x64_"
         "tb1x8x1x2_1x4x1x64_mh_gkgs",
         "Cijk_Ailk_Bjlk_BBS_BH_MT32x32x64_MI16x16x16x1_SN_1LDSB0_APM1_ABV0_ACED0", FPROP]


def test_kernel_pass_tells_the_weight_gradient_kernels_by_name():
    assert {kernel_pass(k) for k in WGRAD} == {"wgrad"}
    assert {kernel_pass(k) for k in DGRAD} == {"other"}
    # a layout kernel is never a pass, whatever its template arguments say
    assert kernel_pass(NCHW2NHWC) == kernel_pass("Memset (Device)") == "other"


def test_pass_costs_are_the_main_part_of_the_call_and_wgrad_eff_acts_on_wgrad_only():
    g = gpu_spec("h100-sxm")
    ts = [([512, 128, 56, 56], "float"), ([512, 64, 112, 112], "float"),
          ([128, 64, 3, 3], "float")]
    fl = op_cost("aten::convolution_backward", [t for t, _ in ts], T + ["float"])[0]
    priced, acts = pass_costs(g, "convolution_backward", ts, fl, "tf32", 4, FITTED_CURVES, 2)
    assert [p for p, _ in priced] == ["dgrad", "wgrad"] and len(acts) == 4
    c = price_conv(g, "convolution_backward", ts, fl, "tf32", 4, FITTED_CURVES,
                   [DGRAD[0], WGRAD[0]])
    assert dict(c.parts)["main"] == pytest.approx(sum(x.time_us for _, x in priced))
    slow = Curves(wgrad_eff=0.5)
    p2, _ = pass_costs(g, "convolution_backward", ts, fl, "tf32", 4, slow, 2)
    base, _ = pass_costs(g, "convolution_backward", ts, fl, "tf32", 4, DEFAULT_CURVES, 2)
    assert p2[0][1].time_us == pytest.approx(base[0][1].time_us)  # dgrad unchanged
    assert p2[1][1].time_us > 1.5 * base[1][1].time_us  # compute-bound: ~2x


def test_cost_op_conv2d_prints_what_a_whatif_charges(capsys):
    """`retime cost op conv2d` is the what-ifs' price of the same traced call: price_op on
    the shapes Kineto records, with the fitted curves and the kernels the library runs."""
    g = gpu_spec("h100-sxm")
    dims = [[512, 256, 56, 56], [256, 256, 3, 3], [], [1, 1], [1, 1], [1, 1], 1]
    types = ["float", "float", "", "", "", "", ""]
    work = op_cost("aten::cudnn_convolution", dims, types, ["", "", "[1, 1]", "[1, 1]"])
    traced = price_op(g, "aten::cudnn_convolution", dims, types, work, FITTED_CURVES,
                      kernels=[NCHW2NHWC, NCHW2NHWC, FPROP])
    argv = ["cost", "op", "conv2d", "--gpu", "h100-sxm", "--dtype", "tf32", "--batch", "512",
            "--in-channels", "256", "--height", "56", "--width", "56", "--out-channels", "256"]
    assert run([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["time_us"] == pytest.approx(traced.time_us, abs=1e-3)
    assert conv2d_call(g, 512, 256, 56, 56, 256, dtype="tf32").time_us == pytest.approx(
        traced.time_us)
    # channels_last: no layout kernels; the human output names the kernels' shares
    nhwc = conv2d_call(g, 512, 256, 56, 56, 256, dtype="tf32", channels_last=True)
    assert dict(nhwc.parts) == {"main": pytest.approx(dict(traced.parts)["main"])}
    assert run(argv) == 0
    assert "kernels   main " in capsys.readouterr().out
    # an image input in tf32 runs a CUDA-core kernel on NCHW: no layout kernels either
    first = conv2d_call(g, 512, 3, 224, 224, 64, dtype="tf32", backward=True)
    assert [r for r, _ in first.parts] == ["main"]
    with pytest.raises(ConfigError, match="--dtype 'fp8'"):
        conv2d_call(g, 1, 8, 8, 8, 8, dtype="fp8")
    assert run([*argv[:-2], "--out-channels", "0"]) == 2


def test_winograd_on_the_cuda_cores_is_2_25x_fewer_flops_and_never_slower():
    """K34: a 3x3 stride-1 FP32 convolution on V100 (CUDA cores) takes the faster of the
    implicit GEMM and Winograd F(2x2,3x3), whose GEMMs do 16 / 36 of the direct products; a
    tf32 one on A100 (tensor cores), a stride-2 one and a 1x1 one are not Winograd's."""
    from retime.collectors.costs.conv import winograd_eligible, winograd_gemm
    for name, (m, n, k) in (("fprop", (1e5, 64, 576)), ("dgrad", (1e5, 64, 576)),
                            ("wgrad", (64, 576, 1e5))):
        wm, wn, wk = winograd_gemm(name, m, n, k)
        assert 2 * m * n * k / (2 * wm * wn * wk) == pytest.approx(2.25)
    f = [([12, 64, 56, 56], "float"), ([64, 64, 3, 3], "float")]
    assert winograd_eligible("cudnn_convolution", f)
    assert not winograd_eligible("cudnn_convolution", [f[0], ([64, 64, 1, 1], "float")])
    b = [([12, 64, 28, 28], "float"), ([12, 64, 56, 56], "float"), ([64, 64, 3, 3], "float")]
    assert not winograd_eligible("convolution_backward", b)  # stride 2
    from retime.collectors.costs.conv import pass_costs
    v, a = gpu_spec("v100-sxm2"), gpu_spec("a100-80gb")
    bts = [([12, 64, 56, 56], "float"), ([12, 64, 56, 56], "float"), ([64, 64, 3, 3], "float")]
    for base, ts in (("cudnn_convolution", f), ("convolution_backward", bts)):
        fl = 2.0 * 12 * 64 * 64 * 9 * 56 * 56 * (2 if base == "convolution_backward" else 1)
        w, _ = pass_costs(v, base, ts, fl, "fp32", 4, FITTED_CURVES)
        d, _ = pass_costs(v, base, ts, fl, "fp32", 4, FITTED_CURVES, winograd=False)
        assert [p for p, _ in w] == [p for p, _ in d]
        for (_p, cw), (_q, cd) in zip(w, d):
            assert cw.time_us <= cd.time_us
            if cw.time_us < cd.time_us:
                assert cw.flops == pytest.approx(cd.flops / 2.25)
                assert cw.efficiency_source.startswith("Winograd F(2x2, 3x3)")
        assert sum(c.time_us for _, c in w) < sum(c.time_us for _, c in d)
        t, _ = pass_costs(a, base, ts, fl, "tf32", 4, FITTED_CURVES)
        assert not any("Winograd" in c.efficiency_source for _, c in t)
