"""Kernel / op cost from shapes: a roofline with an efficiency curve per kernel class and size.

* Matmul (and batched matmul, convolution as implicit GEMM): compute time at the GPU's
  published maximum achievable matmul rate (``mamf_tflops``, REFERENCES.md K1-K6; never
  exceeded) x a reduction-depth factor ``k / (k + k_half)`` (each output tile's prologue and
  epilogue) x the best tile shape's utilization (partial edge tiles and the last, partly
  filled wave of tiles over the SMs: wave quantization). Memory time: bytes over the
  published HBM triad bandwidth. The slower of the two, floored by the kernel's launch/tail.
  A convolution call of a measured trace is priced as the kernels the library runs for it
  (its implicit-GEMM passes, layout copies, launch floors): :mod:`collectors.costs.conv`.
* Attention (FlashAttention-style, fused): FLOPs ``4 b h s^2 d`` forward (half when causal),
  2.5x that backward; rate the published FlashAttention-2 TFLOP/s of the GPU (K2-K5) x a
  sequence-length curve ``s / (s + 256)`` (short sequences leave the tiles idle; assumed);
  backward at 0.8 of the forward rate (assumed).
* Streaming kernels (normalization, elementwise, embedding gathers, optimizer steps): bytes
  over HBM bandwidth x a size curve ``bytes / (bytes + bw x 0.6 us)`` (Little's law: a
  kernel needs about one memory latency's worth of bytes in flight to reach the bandwidth;
  assumed latency).

Every result carries the bound that held (compute, memory or latency), the efficiency used,
where it came from and a range.
"""

from __future__ import annotations

import math

from ..errors import ConfigError
from .attention import (  # noqa: F401 (re-exported)
    ATTN_KERNELS,
    FLASH_BWD_RATE,
    _mamf16,
    attention,
    attn_kernel_family,
    cudnn_fwd_tflops,
    head_dim_rates,
)
from .gpus import GpuSpec
from .kbase import _REL, DEFAULT_CURVES, Curves, OpCost, _eb, _finish, _positive, math_path
from .tiles import TILES, tile_utilization

__all__ = ["OpCost", "Curves", "DEFAULT_CURVES", "FITTED_CURVES", "matmul", "grouped_matmul",
           "conv2d", "implicit_gemm", "attention", "streaming",
           "memory_bound", "embedding", "optimizer_step", "tile_utilization", "TILES",
           "OPTIMIZER_BYTES", "LOWP_IN_BYTES", "QUANT_BYTES", "BLOCK_SCALE_US", "math_path",
           "FLASH_BWD_RATE", "FP8_SCALINGS", "TENSORWISE_CAST_BYTES", "head_dim_rates",
           "ATTN_KERNELS", "attn_kernel_family", "cudnn_fwd_tflops"]

_K_HALF_REL = 0.25  # k_half is an assumed profile value
#: optimizer-step HBM bytes per parameter beyond the gradient: (fp32 state read+written)
OPTIMIZER_BYTES = {"adam": 4 * 6, "adamw": 4 * 6, "sgd": 4 * 4, "adafactor": 4 * 3}
_OPT_FLOPS = {"adam": 12.0, "adamw": 14.0, "sgd": 3.0, "adafactor": 10.0}
#: HBM bytes per input element a block-scaled GEMM reads: FP8 one byte; NVFP4 4 bits plus
#: one E4M3 scale per 16 elements (REFERENCES.md "Hardware profiles", assumed layout)
LOWP_IN_BYTES = {"fp8": 1.0, "fp4": 0.5625}
#: HBM bytes per element of a GEMM's activation input that its quantization moves in
#: training: read it in 16 bits, write the quantized copies (FP8: one; NVFP4: the row- and
#: column-wise copies the forward and the gradients read)
QUANT_BYTES = {"fp8": 3.0, "fp4": 2.0 + 2 * 0.5625}
#: FP8 scaling recipes a training GEMM's casts follow. ``fused``: the activation input is
#: cast in one pass (its scale from an amax the previous kernel or an amax history gives:
#: Transformer Engine, Megatron-LM's default), :data:`QUANT_BYTES`. ``tensorwise``: torchao's
#: dynamic tensorwise scaling (torchtitan's Float8, ``Float8Linear``): every GEMM casts
#: *both* its operands from 16 bits, each cast an amax pass (read 2 bytes per element) then
#: a cast pass (read 2, write 1), nothing kept across calls: the forward casts the input and
#: the weight, the input-gradient GEMM the output gradient and the weight again, the
#: weight-gradient GEMM the output gradient and the input again (torchao
#: ``float8_linear.matmul_with_hp_or_float8_args``: six ``hp_tensor_to_float8_dynamic``
#: calls per linear layer; REFERENCES.md K15)
FP8_SCALINGS = ("fused", "tensorwise")
TENSORWISE_CAST_BYTES = 2.0 + 2.0 + 1.0
#: per-call time (us) of an NVFP4 GEMM's block-scale handling, serial with its main loop:
#: fitted on one row, K5's FP4 1024^3 (7.48 us published, 3.35 us modeled without it); the
#: K5 rows 1024 x 2145 x 1024 and 2048^3 miss the model by the same 4.1-4.2 us while moving
#: 2x and 4x its bytes, so the cost is per call, not per byte (REFERENCES.md K5)
BLOCK_SCALE_US = {"fp4": 4.12}


#: efficiency curves the replay what-ifs and ``retime cost op --trace`` price with: the fit
#: of bench/kernel_loo.py on all three shared GPU traces with shapes (H100 VGG-13, V100
#: DLRM, MI300X ResNet), each kernel predicted as its price alone plus the slowdown the
#: replay charges where it overlapped NCCL / RCCL kernels (C12): a GEMM tile's fill (first
#: operands in, result out) takes at most 1.5 us in a SIMT kernel (fitted on the FP32
#: CUDA-core GEMM calls of the H100 and V100 traces: a latency shows in the small ones; it
#: shortens k_half on a V100's CUDA cores) and 3.0 us in a tensor / matrix-core kernel
#: (fitted on the MI300X bf16 GEMM calls, the grid's top: 2.5 before its ceiling became the
#: v2 MAMF table's 668.4 TFLOP/s, K28; at 3.0 it leaves the profile's k_half on every GPU's
#: tensor path, the MI300X's included, and the published GEMM sweeps of bench/cost.py as
#: they were); a convolution's weight-gradient pass sustains 0.6 of the rate the GEMM model gives
#: its shape (fitted on the ratio of each backward call's weight- to data-gradient kernel
#: time, REFERENCES.md K21); implicit-GEMM convolutions 0.96 of the GEMM model's rate
#: (fitted on the calls whose FLOPs at the ceiling take at least half their price); library
#: GEMMs stay at their bound, 1.0 (the fit says 0.98, on the H100's nine fp32 GEMM calls:
#: kept at the bound so that ``retime cost op matmul`` and the what-ifs price a GEMM alike);
#: HBM efficiency stays at its bound, 1.0; streaming kernels need 0.2 us of bytes in flight. In a ratio (new GPU / old GPU, new batch / old) most of this cancels; it matters
#: where the bound moves. Held-out accuracy: bench/kernel_loo.py and the README's "Kernels"
#: section
FITTED_CURVES = Curves(tile_fill_us=1.5, tile_fill_tc_us=3.0, conv_eff=0.96, wgrad_eff=0.6,
                       mem_latency_us=0.2,
                       source="fitted on 3 traces, bench/kernel_loo.py")




def _gemm_rate(g: GpuSpec, m: float, n: float, k: float, batch: int,
               dtype: str, curves: Curves = DEFAULT_CURVES, eff: float = 1.0,
               ceiling: tuple[float, str] | None = None) -> tuple[float, str, float]:
    """(TFLOP/s a GEMM reaches, where the efficiency came from, relative uncertainty);
    ``eff``: the class's sustained fraction of that (:class:`Curves`); ``ceiling`` (TFLOP/s,
    source) replaces the GPU's matmul ceiling when given."""
    return _groups_rate(g, [m] * batch, n, k, dtype, curves, eff, ceiling)


def _groups_rate(g: GpuSpec, ms: list[float], n: float, k: float, dtype: str,
                 curves: Curves = DEFAULT_CURVES, eff: float = 1.0,
                 ceiling: tuple[float, str] | None = None) -> tuple[float, str, float]:
    """:func:`_gemm_rate` for one launch over groups ``m_i x n x k`` (a batch, or a grouped
    GEMM's experts): their tiles share the waves over the SMs."""
    ceil_tf, ceil_src = g.mamf(dtype) if ceiling is None else ceiling
    # the tile pipeline's prologue/epilogue is a fixed number of k-steps of fixed bytes, so
    # in elements it is longer for narrower dtypes (k_half is given for 16-bit inputs)
    k_half = g.hw.gemm_k_half * 2.0 / min(_eb(dtype), 2.0) * curves.k_half_scale
    if _eb(dtype) > 2:
        # 32-bit GEMMs (fp32 on the CUDA cores, tf32) run fewer FLOPs per k-step than the
        # 16-bit tensor-core path k_half was given for: the prologue/epilogue (loading the
        # first tiles, writing the last) takes the same time, so fewer k-steps
        half = g.mamf_tflops.get("bf16") or g.mamf_tflops.get("fp16") or (
            g.peak_tflops("fp16") * g.hw.gemm_max)
        k_half *= min(1.0, ceil_tf / half)
    fill = curves.tile_fill(math_path(g, dtype))
    if fill > 0:
        # a tile's fill (its first operands in, its result out) takes at most this time:
        # in k-steps of a 128 x 128 tile at the ceiling's per-SM rate, fewer on a slow
        # path (fp32 on a V100's CUDA cores: 11) than the profile's k-step count says
        k_half = min(k_half, fill * 1e-6 * ceil_tf * 1e12 / g.sm_count / (2.0 * 128 * 128))
    f_k = k / (k + k_half)
    util = tile_utilization(g.sm_count, list(ms), n, k, k_half)
    # tensor-core kernels need 16-byte aligned rows; others run slower paths (assumed 0.75)
    aligned = all((d * _eb(dtype)) % 16 == 0 for d in (n, k))
    rate = ceil_tf * f_k * util * (1.0 if aligned else 0.75) * eff  # <= published ceiling
    what = "max achievable" if ceiling is None else "in-training"
    src = (f"{what} {dtype} matmul {ceil_tf:.1f} TFLOP/s ({ceil_src}"
           f"{', K1-K6' if ceil_src in ('published', 'derived') else ''}) x k-depth {f_k:.2f} "
           f"(k_half {k_half:.0f}, {curves.source}) x tiles/waves {util:.2f} "
           f"({g.sm_count} SMs){'' if aligned else ' x unaligned 0.75 (assumed)'}"
           f"{'' if eff == 1 else f' x class efficiency {eff:.2f} ({curves.source})'}")
    return rate, src, math.hypot(_REL[ceil_src], _K_HALF_REL * (1 - f_k), 0.08)


def _serial(c: OpCost, g: GpuSpec, dtype: str, act_elems: float, quantize: bool,
            curves: Curves, scaling: str = "fused", other_elems: float = 0.0) -> OpCost:
    """``c`` plus the serial work of a block-scaled GEMM: NVFP4's per-call block-scale
    handling (:data:`BLOCK_SCALE_US`) and, in training (``quantize``), the quantization of
    its activation input (``act_elems`` elements, :data:`QUANT_BYTES`, at the HBM rate);
    with ``scaling="tensorwise"`` (FP8) of both operands (``act_elems + other_elems``) at
    :data:`TENSORWISE_CAST_BYTES`."""
    if scaling not in FP8_SCALINGS:
        raise ConfigError(f"fp8 scaling {scaling!r}: choose one of {', '.join(FP8_SCALINGS)}")
    if scaling != "fused" and dtype != "fp8":
        raise ConfigError(f"fp8 scaling {scaling!r} with dtype {dtype!r}: tensorwise scaling "
                          "is an FP8 recipe (torchao Float8); use --dtype fp8 or drop it")
    parts = [("main", c.time_us)]
    scale = BLOCK_SCALE_US.get(dtype, 0.0)
    if scale:
        parts.append(("block_scale", scale))
    if quantize and dtype in QUANT_BYTES:
        bw = g.hbm_gbps()[0] * curves.mem_eff
        qb = (TENSORWISE_CAST_BYTES * (act_elems + other_elems) if scaling == "tensorwise"
              else QUANT_BYTES[dtype] * act_elems)
        parts.append(("quantize", qb / (bw * 1e3)))
    if len(parts) == 1:
        return c
    extra = sum(us for _, us in parts[1:])
    t = c.time_us + extra
    lo, hi = c.range_us
    src = c.efficiency_source + "".join(
        f" + {role} {us:.2f} us" + (" (fitted, K5 1024^3)" if role == "block_scale" else
                                    " (bytes at the HBM rate)") for role, us in parts[1:])
    return OpCost(c.kind, c.gpu, t, (lo + extra, hi + extra), c.flops, c.bytes,
                  c.flops / (t * 1e6), c.bytes / (t * 1e3), c.bound, c.efficiency, src,
                  tuple(parts))


#: the largest small dimension (the batch rows of a linear layer) of an FP32 GEMM that cuBLAS
#: runs as a GEMV-based "small N" kernel on NVIDIA's CUDA cores: the shared V100 DLRM trace's
#: batch-16 FP32 linears launch ``gemmSN_TN_kernel<float, 128, 16, ...>`` /
#: ``gemmSN_NN_kernel`` (REFERENCES.md K35)
SMALL_N = 16


def _small_n(g: GpuSpec, kind: str, m: float, n: float, dtype: str, flops: float,
             nbytes: float, curves: Curves, ceiling: tuple[float, str] | None) -> OpCost | None:
    """A SIMT GEMM with ``min(m, n) <= SMALL_N`` priced as the library's small-N kernel: it
    streams the large operand once and does only the useful FLOPs (no output tile padded to
    64+ rows), so its roofline is the HBM bytes against the useful FLOPs at the dtype's
    ceiling (K35). Returned only where that roofline is memory-bound above the launch floor
    (the stream bounds it); below, the kernel's own latency (a serial reduction the model
    has no term for: the DLRM trace's small-N calls take 5-19 us) is not modeled and the
    tiled price stands. None otherwise."""
    if math_path(g, dtype) != "simt" or min(m, n) > SMALL_N:
        return None
    ceil_tf, ceil_src = g.mamf(dtype) if ceiling is None else ceiling
    c = _finish(kind, g, flops, nbytes, flops / (ceil_tf * 1e6), "", 1.0, _REL[ceil_src],
                curves)
    if c.bound != "memory":
        return None
    return OpCost(c.kind, c.gpu, c.time_us, c.range_us, c.flops, c.bytes, c.tflops,
                  c.gbps, c.bound, c.efficiency,
                  f"small-N GEMV-based kernel (min(m, n) {int(min(m, n))} <= {SMALL_N}, K35): "
                  + c.efficiency_source)


def matmul(g: GpuSpec, m: int, n: int, k: int, batch: int = 1,
           dtype: str = "bf16", curves: Curves = DEFAULT_CURVES,
           ceiling: tuple[float, str] | None = None, quantize: bool = False,
           scaling: str = "fused") -> OpCost:
    """A (batched) GEMM ``[batch, m, k] x [batch, k, n]`` in ``dtype`` (output in 16-bit
    for fp8/fp4 inputs, else the input dtype). ``ceiling`` = (TFLOP/s, source) replaces
    the GPU's published matmul ceiling (the synthesizer's sustained-in-training rate).
    FP8 / FP4 inputs are block-scaled (:data:`LOWP_IN_BYTES`); NVFP4 adds its per-call
    block-scale time; ``quantize`` (training) adds the quantization of the ``[m, k]``
    activation input, or of both operands with ``scaling="tensorwise"`` (:func:`_serial`,
    :data:`FP8_SCALINGS`)."""
    _positive(m=m, n=n, k=k, batch=batch)
    eb = _eb(dtype)
    ib = LOWP_IN_BYTES.get(dtype, eb)
    flops = 2.0 * m * n * k * batch
    out_eb = 2 if eb < 2 else eb
    nbytes = batch * (ib * (m * k + k * n) + out_eb * m * n)
    rate, src, rel = _gemm_rate(g, m, n, k, batch, dtype, curves, curves.gemm_eff, ceiling)
    kind = "matmul" if batch == 1 else "bmm"
    c = _finish(kind, g, flops, nbytes, flops / (rate * 1e6),
                src, rate / g.peak_tflops(dtype), rel, curves)
    sn = _small_n(g, kind, m, n, dtype, flops, nbytes, curves, ceiling)
    if sn is not None and sn.time_us < c.time_us:
        c = sn
    return _serial(c, g, dtype, float(batch) * m * k, quantize, curves, scaling,
                   float(batch) * k * n)


def grouped_matmul(g: GpuSpec, ms: list[int], n: int, k: int, dtype: str = "bf16",
                   curves: Curves = DEFAULT_CURVES,
                   ceiling: tuple[float, str] | None = None, quantize: bool = False,
                   scaling: str = "fused") -> OpCost:
    """One grouped GEMM launch (mixture-of-experts): group ``i`` is ``[m_i, k] x [k, n]``
    with its own weight; the tiles of all groups share the waves over the SMs, so a group
    of few tokens wastes its partial tiles and a hot expert's extra tiles lengthen it."""
    _positive(n=n, k=k)
    eb = _eb(dtype)
    ib = LOWP_IN_BYTES.get(dtype, eb)
    M = float(sum(ms))
    out_eb = 2 if eb < 2 else eb
    nbytes = ib * (M * k + len(ms) * k * n) + out_eb * M * n
    flops = 2.0 * M * n * k
    if M <= 0:
        return _finish("grouped_matmul", g, 0.0, nbytes, 0.0, "", 0.0, 0.0, curves)
    rate, src, rel = _groups_rate(g, [float(m) for m in ms], n, k, dtype, curves,
                                  curves.gemm_eff, ceiling)
    c = _finish("grouped_matmul", g, flops, nbytes, flops / (rate * 1e6), src,
                rate / g.peak_tflops(dtype), rel, curves)
    return _serial(c, g, dtype, M * k, quantize, curves, scaling, float(len(ms)) * k * n)


def conv_output(height: int, width: int, kernel: int, stride: int,
                padding: int | None) -> tuple[int, int]:
    """Output height and width ``(P, Q)`` of a ``kernel x kernel`` convolution (padding
    ``kernel // 2`` unless given); refuses a filter that leaves no output."""
    pad = kernel // 2 if padding is None else padding
    p = (height + 2 * pad - kernel) // stride + 1
    q = (width + 2 * pad - kernel) // stride + 1
    if p < 1 or q < 1:
        raise ConfigError(f"conv2d: a {kernel}x{kernel} filter with stride {stride} and "
                          f"padding {pad} leaves no output on a {height}x{width} input")
    return p, q


def conv2d(g: GpuSpec, batch: int, in_ch: int, height: int, width: int, out_ch: int,
           kernel: int = 3, stride: int = 1, padding: int | None = None,
           dtype: str = "bf16") -> OpCost:
    """A 2-D convolution (NCHW input, ``kernel x kernel`` filter) as an implicit GEMM:
    ``M = batch x P x Q``, ``N = out_ch``, ``K = in_ch x kernel^2``."""
    _positive(batch=batch, in_ch=in_ch, height=height, width=width, out_ch=out_ch,
              kernel=kernel, stride=stride)
    p, q = conv_output(height, width, kernel, stride, padding)
    m, n, k = batch * p * q, out_ch, in_ch * kernel * kernel
    eb = _eb(dtype)
    nbytes = eb * (batch * in_ch * height * width + out_ch * k + batch * out_ch * p * q)
    return implicit_gemm(g, m, n, k, dtype, nbytes, "conv2d")


def implicit_gemm(g: GpuSpec, m: float, n: float, k: float, dtype: str, nbytes: float,
                  kind: str = "conv", curves: Curves = DEFAULT_CURVES,
                  eff: float | None = None) -> OpCost:
    """A kernel that runs as an ``m x n x k`` GEMM over operands it reads itself
    (convolutions: ``M = batch x output pixels``, ``N = filters``, ``K = channels x filter
    area``); ``nbytes`` is what it moves through HBM; ``eff``: the class efficiency
    (default ``curves.conv_eff``)."""
    _positive(m=m, n=n, k=k)
    flops = 2.0 * m * n * k
    rate, src, rel = _gemm_rate(g, m, n, k, 1, dtype, curves,
                                curves.conv_eff if eff is None else eff)
    return _finish(kind, g, flops, nbytes, flops / (rate * 1e6), "implicit GEMM: " + src,
                   rate / g.peak_tflops(dtype), rel, curves)


def memory_bound(g: GpuSpec, kind: str, flops: float, nbytes: float,
                 curves: Curves = DEFAULT_CURVES) -> OpCost:
    """A streaming kernel given its FLOPs and HBM bytes (normalization, softmax,
    elementwise, reductions: the FLOPs never bind)."""
    if nbytes <= 0:
        raise ConfigError(f"{kind}: moves no bytes; nothing to price")
    return _finish(kind, g, float(flops), float(nbytes), 0.0, "", 0.0, 0.0, curves)




def streaming(g: GpuSpec, elements: int, dtype: str = "bf16", reads: int = 1,
              writes: int = 1, flops_per_element: float = 1.0,
              kind: str = "elementwise") -> OpCost:
    """A memory-bound kernel reading ``reads`` and writing ``writes`` tensors of
    ``elements`` each (normalization: reads=1 (+ weight), writes=1, ~8 FLOPs/element)."""
    _positive(elements=elements)
    if reads < 0 or writes < 0 or reads + writes == 0:
        raise ConfigError(f"--reads {reads} --writes {writes}: at least one tensor moves")
    nbytes = elements * _eb(dtype) * (reads + writes)
    return _finish(kind, g, elements * flops_per_element, nbytes, 0.0, "", 0.0, 0.0)


def embedding(g: GpuSpec, tokens: int, dim: int, dtype: str = "bf16") -> OpCost:
    """An embedding lookup: gather ``tokens`` rows of ``dim`` (row reads waste the rest of a
    32-byte sector when a row is shorter), write the ``tokens x dim`` output."""
    _positive(tokens=tokens, dim=dim)
    eb = _eb(dtype)
    row = dim * eb
    read = tokens * math.ceil(row / 32) * 32 + tokens * 8  # rows + int64 indices
    return _finish("embedding", g, 0.0, read + tokens * row, 0.0, "", 0.0, 0.0)


def optimizer_step(g: GpuSpec, params: int, optimizer: str = "adam",
                   dtype: str = "bf16") -> OpCost:
    """A fused optimizer step over ``params`` parameters with fp32 master weights and
    states, ``dtype`` gradients and a ``dtype`` copy of the weights written back."""
    _positive(params=params)
    opt = optimizer.lower()
    if opt not in OPTIMIZER_BYTES:
        raise ConfigError(f"--optimizer {optimizer!r}: choose one of "
                          f"{', '.join(OPTIMIZER_BYTES)}")
    eb = _eb(dtype)
    nbytes = params * (OPTIMIZER_BYTES[opt] + 2 * eb)
    return _finish("optimizer", g, params * _OPT_FLOPS[opt], nbytes, 0.0, "", 0.0, 0.0)
