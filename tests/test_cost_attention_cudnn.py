"""cuDNN's Hopper fused attention (issue 27; REFERENCES.md K50-K52): the kernel family a traced
call's kernel names show picks the model; cuDNN's rates are the FA3 paper's published H100
bars (Fig. 5), its backward K14's 0.87 of the forward plus its two streaming passes."""

from __future__ import annotations

import pytest

from retime.cli import run
from retime.collectors.costs import kernels as K
from retime.collectors.costs.gpus import gpu_spec
from retime.collectors.costs.ops import price_op
from retime.collectors.kernel_classes import CLASS_NAMES, classify_name

_FWD = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1"
_BWD = ["cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1",
        "void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*, void const*)",
        "void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*, unsigned int)"]


@pytest.mark.parametrize("d,causal,bars", [
    (64, False, (335, 373, 395, 408, 412, 413)), (64, True, (225, 288, 334, 363, 379, 388)),
    (128, False, (497, 574, 617, 609, 600, 595)), (128, True, (315, 410, 484, 518, 529, 539))])
def test_cudnn_rates_are_the_published_h100_bars(d, causal, bars):
    g = gpu_spec("h100-sxm")
    for s, bar in zip((512, 1024, 2048, 4096, 8192, 16384), bars):
        assert K.cudnn_fwd_tflops(g, d, s, causal) == pytest.approx(bar)
    # log2-interpolated between bars, flat past 16k, lower below 512
    mid = K.cudnn_fwd_tflops(g, d, 1448, causal)  # ~ 2^10.5
    assert min(bars[1:3]) <= mid <= max(bars[1:3])
    assert K.cudnn_fwd_tflops(g, d, 65536, causal) == pytest.approx(bars[-1])
    assert K.cudnn_fwd_tflops(g, d, 256, causal) < bars[0]


def test_head_dim_between_bars_and_h200_scaled_by_its_mamf():
    h100, h200 = gpu_spec("h100-sxm"), gpu_spec("h200")
    r96 = K.cudnn_fwd_tflops(h100, 96, 4096, False)
    assert r96 == pytest.approx((408 + 609) / 2)
    assert K.cudnn_fwd_tflops(h200, 128, 4096, True) == pytest.approx(518 * 794.5 / 792.1)


def test_forward_time_is_flops_at_the_bar():
    g = gpu_spec("h100-sxm")
    c = K.attention(g, 2, 16, 4096, 128, causal=True, kernel="cudnn")
    flops = 4.0 * 2 * 16 * 4096 ** 2 * 128 / 2
    assert c.flops == flops
    assert c.time_us == pytest.approx(flops / 518e6 + g.hw.kernel_overhead_us)
    assert c.bound == "compute"


def test_backward_adds_its_two_streaming_passes():
    g = gpu_spec("h200")
    b, h, s, d = 8, 16, 1024, 128
    c = K.attention(g, b, h, s, d, causal=True, backward=True, kernel="cudnn")
    fwd = K.cudnn_fwd_tflops(g, d, s, True)
    flops = 2.5 * 4.0 * b * h * s * s * d / 2
    rows = b * h * s
    passes = (rows * d * 2 * 2 + rows * 4 + rows * d * (4 + 2)) / (g.hbm_gbps()[0] * 1e3)
    assert c.time_us == pytest.approx(flops / (fwd * K.FLASH_BWD_RATE * 1e6) + passes
                                      + g.hw.kernel_overhead_us)


def test_traced_kernel_names_pick_the_family():
    q = [8, 16, 1024, 128]
    types = ["c10::BFloat16"] * 3
    flops = 4.0 * 8 * 16 * 1024 ** 2 * 128 / 2
    work = (flops, 1.0, "bf16")
    h200, a100 = gpu_spec("h200"), gpu_spec("a100-80gb")
    name = "aten::_scaled_dot_product_cudnn_attention"
    cud = price_op(h200, name, [q] * 3, types, work, kernels=[_FWD])
    assert cud.time_us == pytest.approx(
        K.attention(h200, 8, 16, 1024, 128, causal=True, kernel="cudnn").time_us)
    fa = price_op(h200, name, [q] * 3, types, work,
                  kernels=["void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64>>"])
    assert fa.time_us == pytest.approx(K.attention(h200, 8, 16, 1024, 128, causal=True).time_us)
    assert cud.time_us < fa.time_us
    # the bars are Hopper's: another architecture keeps the FlashAttention-2 model
    a = price_op(a100, name, [q] * 3, types, work, kernels=[_FWD])
    assert a.time_us == pytest.approx(K.attention(a100, 8, 16, 1024, 128, causal=True).time_us)
    assert K.attn_kernel_family(h200, _BWD) == "cudnn"
    assert K.attn_kernel_family(h200, None) == "flash2"


def test_backward_helpers_are_attention_and_embedding_backward_is_embedding():
    for n in _BWD[1:]:
        assert CLASS_NAMES[classify_name(n)] == "attention"
    for n in ("void at::native::(anonymous namespace)::compute_grad_weight<float, long>(long)",
              "void at::native::(anonymous namespace)::krn_partials_per_segment<long>(long*)",
              "void at::native::(anonymous namespace)::krn_partial_segment_offset<long>(long*)"):
        assert CLASS_NAMES[classify_name(n)] == "embedding"


@pytest.mark.parametrize("argv,words", [
    (["--gpu", "a100-80gb", "--attn-kernel", "cudnn"], "Hopper"),
    (["--gpu", "h200", "--attn-kernel", "fa9"], "choose one of"),
])
def test_bad_attention_kernel_is_one_line_exit_2(argv, words, capsys):
    base = ["cost", "op", "attention", "--batch", "2", "--heads", "16", "--seq", "4096",
            "--head-dim", "128"]
    assert run(base + argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err
