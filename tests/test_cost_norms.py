"""Batch norm's channel-per-block kernels (collectors/costs/norms.py, REFERENCES.md K22):
PyTorch's native kernels reduce each channel in one block of 512 threads (256 on ROCm), one
memory latency per step over the channel's N x H x W elements."""

from __future__ import annotations

import pytest

from retime.collectors.costs.gpus import gpu_spec
from retime.collectors.costs.kernels import FITTED_CURVES
from retime.collectors.costs.norms import block_threads, channel_pass_us, channel_passes
from retime.collectors.costs.ops import op_cost, price_op

BWD = ["void at::native::batch_norm_backward_kernel<c10::BFloat16, c10::BFloat16, float>"]
FWD = ["void at::native::batch_norm_collect_statistics_kernel<at::native::InvStd, c10::BFloat16>",
       "void at::native::(anonymous namespace)::unrolled_elementwise_kernel<...>",
       "void at::native::batch_norm_transform_input_kernel<c10::BFloat16, float, float>"]


def _bn_bwd(x):
    c = [x[1]]
    return [x, x, c, c, c, c, c, [], [], []], ["c10::BFloat16"] * 2 + ["float"] * 5 + [""] * 3


def test_passes_and_threads_follow_the_kernels_and_the_platform():
    assert channel_passes(BWD) == 2  # reduction, then the input gradient, in one kernel
    assert channel_passes(FWD) == 1  # statistics; the transform streams with a full grid
    assert channel_passes(["void at::native::batch_norm_backward_reduce_kernel<float>"]) == 1
    assert channel_passes(["void at::native::vectorized_elementwise_kernel<4>"]) == 0
    assert channel_passes(None) == 0
    assert block_threads(gpu_spec("mi300x")) == 256 and block_threads(gpu_spec("h100-sxm")) == 512
    # 64 channels of 10 x 112 x 112 on an MI300X: ceil(125440 / 256) = 490 steps, one wave
    assert channel_pass_us(gpu_spec("mi300x"), 10, 64, 112 * 112, 0.2) == pytest.approx(98.0)
    # more channels than resident blocks (132 SMs x 4 blocks of 512): a second wave
    assert channel_pass_us(gpu_spec("h100-sxm"), 1, 600, 512, 1.0) == pytest.approx(2.0)


def test_steps_follow_the_launch_grid_of_normalization_cuh():
    # K27: threads(tf, max(1, MAX_BLOCK_SIZE / tf)), tf = getNumThreads(H W); a thread walks
    # ceil(N / ty) batch rows x ceil(H W / tf) image strides, not ceil(N H W / threads)
    from retime.collectors.costs.norms import block_shape, channel_steps

    mi, h = gpu_spec("mi300x"), gpu_spec("h100-sxm")
    assert block_shape(mi, 14 * 14) == (256, 1) and channel_steps(mi, 10, 196) == 10  # not 8
    assert block_shape(mi, 28 * 28) == (256, 1) and channel_steps(mi, 10, 784) == 40  # not 31
    assert block_shape(mi, 7 * 7) == (64, 4) and channel_steps(mi, 10, 49) == 3  # not 2
    assert block_shape(h, 7 * 7) == (64, 8) and channel_steps(h, 10, 49) == 2  # not 1
    assert block_shape(h, 100) == (128, 4) and channel_steps(h, 256, 100) == 64
    assert channel_steps(mi, 10, 112 * 112) == 490  # ceil(12544 / 256) = 49 per row
    # 256 channels of 10 x 14 x 14: one wave (304 CUs x 8 blocks), 10 steps x 0.2 us
    assert channel_pass_us(mi, 10, 256, 196, 0.2) == pytest.approx(2.0)


def test_few_channel_large_image_backward_is_latency_bound():
    x = [10, 64, 112, 112]
    dims, types = _bn_bwd(x)
    name = "aten::native_batch_norm_backward"
    w = op_cost(name, dims, types)
    g = gpu_spec("mi300x")
    plain = price_op(g, name, dims, types, w, FITTED_CURVES)
    c = price_op(g, name, dims, types, w, FITTED_CURVES, kernels=BWD)
    # 2 passes x 490 steps x 0.2 us (the fitted latency of the streaming size curve) + the
    # 4 us launch floor; its bytes at the HBM rate take ~11 us
    assert c.time_us == pytest.approx(2 * 490 * 0.2 + 4.0)
    assert plain.time_us < 15 and c.bound == "latency" and "K22" in c.efficiency_source
    # on an H100 the block holds 512 threads: 10 rows x ceil(12544 / 512) = 250 steps (K27),
    # and a shorter floor
    h = price_op(gpu_spec("h100-sxm"), name, dims, types, w, FITTED_CURVES, kernels=BWD)
    assert h.time_us == pytest.approx(2 * 250 * 0.2 + 2.5)


def test_many_channel_batch_norm_keeps_its_streaming_price():
    x = [256, 512, 7, 7]
    name = "aten::native_batch_norm"
    dims = [x, [512], [512], [512], [512], [], [], []]
    types = ["float"] * 5 + [""] * 3
    w = op_cost(name, dims, types)
    g = gpu_spec("h100-sxm")
    a = price_op(g, name, dims, types, w, FITTED_CURVES, kernels=FWD)
    b = price_op(g, name, dims, types, w, FITTED_CURVES, launches=3)
    # 512 blocks x 25 steps: the whole grid streams faster than the bandwidth allows
    assert a.time_us == pytest.approx(b.time_us) and a.bound == "memory"
