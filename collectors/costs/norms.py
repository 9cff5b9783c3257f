"""Batch norm as PyTorch's native CUDA / HIP kernels run it on channels-first tensors.

``aten/src/ATen/native/cuda/Normalization.cuh`` (``batch_norm_cuda_template``,
``batch_norm_backward_cuda_template``; REFERENCES.md K22) reduces each channel in one
thread block: "for the reduction, we cannot use blocks for the batch dim" -- the grid is
``dim3 blocks(input.size(1))``, each block ``threads(tf, max(1, MAX_BLOCK_SIZE / tf))`` with
``tf = getNumThreads(H W)``, the smallest of ``{32, 64, 128, 256, 512}`` (ROCm: ``{16, 32,
64, 128, 256}``) that covers the image, ``MAX_BLOCK_SIZE`` 512 on CUDA, 256 on ROCm. Each
thread walks ``x`` over the image in strides of ``tf`` inside a loop over the batch in
strides of ``ty = MAX_BLOCK_SIZE / tf``, one load per tensor in flight per step:
``ceil(N / ty) x ceil(H W / tf)`` steps (not ``ceil(N H W / threads)``: a 14 x 14 image on
ROCm takes 256 threads wide, one batch row at a time, 10 steps at batch 10, not 8). The statistics kernel (``batch_norm_collect_statistics_kernel``) does
one such pass over the input; the legacy backward kernel (``batch_norm_backward_kernel``)
two (the reduction over the output gradient and the input, then the input gradient); the
newer ``batch_norm_backward_reduce_kernel`` one. A pass therefore holds at most
``channels x threads`` loads in flight and, by Little's law, takes one memory latency per
step: those steps x the latency, per wave of resident blocks. With few
channels and large images (ResNet's first stages at a small batch) that is far slower than
the bandwidth: the MI300X ResNet trace's 64-channel 112 x 112 backward takes 396 us where
its bytes at the HBM rate take 11.

The latency is the streaming size curve's (``Curves.mem_latency_us``: the bytes in flight a
streaming kernel needs, as microseconds of bandwidth, i.e. the memory latency of Little's
law), so nothing here is fitted on its own. The other kernels of the call (the elementwise
transform, the running-statistics update) stream with the whole grid: the call's price is
the slower of the streaming price of its bytes and the channel passes plus one launch floor.
"""

from __future__ import annotations

import math

__all__ = ["CHANNEL_PASSES", "channel_passes", "block_threads", "block_shape", "channel_steps",
           "channel_pass_us"]

#: kernels that reduce one channel per block, and how many passes over the channel's
#: elements each makes (Normalization.cuh, K22)
CHANNEL_PASSES = {"batch_norm_collect_statistics_kernel": 1,
                  "batch_norm_backward_reduce_kernel": 1,
                  "batch_norm_backward_kernel": 2}
#: threads per block a GPU thread block can hold at most (resident blocks per SM / CU)
_THREADS_PER_SM = 2048


def channel_passes(kernels: list[str] | None) -> int:
    """Channel-per-block passes the launched ``kernels`` make (0: none of them is one)."""
    n = 0
    for k in kernels or ():
        for name, p in CHANNEL_PASSES.items():
            if name in str(k):
                n += p
                break
    return n


def block_threads(g) -> int:
    """``MAX_BLOCK_SIZE`` of Normalization.cuh on ``g``: 256 on ROCm (AMD), 512 on CUDA."""
    return 256 if str(g.arch).startswith("cdna") else 512


def block_shape(g, spatial: int) -> tuple[int, int]:
    """``(tf, ty)``: the block Normalization.cuh launches on ``g`` for images of ``spatial``
    elements: ``tf = getNumThreads(spatial)`` threads along the image (the smallest of five
    sizes up to ``MAX_BLOCK_SIZE`` that covers it, else ``MAX_BLOCK_SIZE``) and
    ``max(1, MAX_BLOCK_SIZE / tf)`` along the batch (K22)."""
    mx = block_threads(g)
    sizes = (16, 32, 64, 128, mx) if mx == 256 else (32, 64, 128, 256, mx)
    tf = next((s for s in sizes if spatial <= s), mx)
    return tf, max(1, mx // tf)


def channel_steps(g, batch: int, spatial: int) -> int:
    """Serial steps one thread makes over a channel of ``batch x spatial`` elements:
    ``ceil(batch / ty) x ceil(spatial / tf)`` (:func:`block_shape`)."""
    tf, ty = block_shape(g, spatial)
    return math.ceil(batch / ty) * math.ceil(spatial / tf)


def channel_pass_us(g, batch: int, channels: int, spatial: int, latency_us: float) -> float:
    """One pass of a channel-per-block kernel over ``batch x spatial`` elements per channel
    on ``g``: :func:`channel_steps` steps of one memory latency each, per wave of resident
    blocks."""
    tf, ty = block_shape(g, spatial)
    resident = g.sm_count * max(1, _THREADS_PER_SM // (tf * ty))
    waves = math.ceil(channels / resident)
    return channel_steps(g, batch, spatial) * latency_us * waves
