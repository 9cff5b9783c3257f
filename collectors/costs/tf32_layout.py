"""TF32 GEMMs on Hopper whose operands are both MN-major (cuBLAS ``nt``) run slower.

Hopper's warpgroup MMA reads FP32/TF32 operands from shared memory K-major only: CUTLASS's
SM90 TensorOp kernels list ``{f32, tf32}`` GEMMs for the ``T x N`` layout alone, while
16-bit ones take every ``{N, T} x {N, T}`` combination (REFERENCES.md K56). A TF32 GEMM whose
operands are not K-major is transposed on the way into the tensor cores, and where neither is
(cuBLAS's column-major ``nt``: in a PyTorch training step, the weight gradient
``dW = dY^T X``) that costs throughput. The kernel name tells the layout
(``sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_...``; the FP32 SIMT kernels of the same call say
it too: ``..._f32f32_f32f32_f32_nt_n_...``, ``cutlass_80_simt_sgemm_..._nt_align1``), so a
call priced as TF32 on a Hopper GPU whose main GEMM kernel is ``nt`` is priced at
:data:`NT_TF32_RATE` of the tile model's compute rate (K57: measured on one H200, fitted,
in-sample). FP32 on the CUDA cores and 16-bit GEMMs are not moved; neither are ``nn`` / ``tn``
TF32 GEMMs (one or no MN-major operand: within ~15% of the model on the same trace), nor
GEMMs below the TF32 roofline ridge (memory-bound: the transpose overlaps the loads), nor
other architectures (no measurement here).
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["NT_TF32_RATE", "gemm_layout", "tf32_layout"]

#: a Hopper TF32 GEMM with both operands MN-major (``nt``) reaches this fraction of the tile
#: model's rate: K57 (the H200 fp32big-tf32 trace's weight-gradient GEMMs, 0.58-0.61 of the
#: model in five shape groups, time-weighted 0.595; fitted, in-sample)
NT_TF32_RATE = 0.60

_LAYOUT = re.compile(r"_(nn|nt|tn|tt)(?=_|>|$)")


def gemm_layout(kernels: list[str] | None) -> str | None:
    """cuBLAS layout (``nn`` / ``nt`` / ``tn`` / ``tt``) of a call's 32-bit GEMM kernel, read
    from its name (``*_f32_<ab>_<c>_*`` cuBLAS xmma kernels, ``cutlass_*_simt_sgemm_*_<ab>_*``,
    ``ampere_sgemm_*_<ab>``);
    None when no kernel tells or they disagree."""
    seen = set()
    for k in kernels or ():
        head = k.split("(")[0]
        m = _LAYOUT.search(head)
        if m and "gemm" in head:
            seen.add(m.group(1))
    return seen.pop() if len(seen) == 1 else None


def tf32_layout(g, dtype: str, kernels: list[str] | None, c):
    """``c`` (a GEMM's :class:`OpCost` priced in ``dtype`` on GPU spec ``g``) slowed to
    :data:`NT_TF32_RATE` of its compute rate when it is a TF32 GEMM on a Hopper GPU and its
    kernels say ``nt``; else ``c`` unchanged."""
    if dtype != "tf32" or g.arch != "hopper" or c.bound != "compute" \
            or gemm_layout(kernels) != "nt":
        return c
    # only above the roofline's ridge (FLOPs per HBM byte at the tf32 ceiling): below it the
    # kernel waits on memory and the operand transpose overlaps the loads (a 16-row GEMM
    # with the tensor cores mostly idle); K57's GEMMs sit at ~600 FLOP/B, the ridge ~105
    ridge = g.mamf("tf32")[0] * 1e12 / (g.hbm_gbps()[0] * 1e9)
    if c.bytes <= 0 or c.flops / c.bytes < ridge:
        return c
    # the tile math alone runs slower: the launch floor and fixed latencies do not move
    extra = c.flops / (c.tflops * 1e6) * (1.0 / NT_TF32_RATE - 1.0) if c.tflops > 0 else 0.0
    t = c.time_us + extra
    f = t / c.time_us
    return dataclasses.replace(
        c, time_us=t, range_us=(c.range_us[0] * f, c.range_us[1] * f),
        tflops=c.tflops * NT_TF32_RATE, efficiency=c.efficiency * NT_TF32_RATE,
        efficiency_source=c.efficiency_source + f" x TF32 nt layout {NT_TF32_RATE:g} (K56, K57)")
