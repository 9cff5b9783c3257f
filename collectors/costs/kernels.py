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
from dataclasses import dataclass

from ..errors import ConfigError
from .gpus import DTYPE_BYTES, GpuSpec
from .tiles import TILES, tile_utilization

__all__ = ["OpCost", "Curves", "DEFAULT_CURVES", "FITTED_CURVES", "matmul", "grouped_matmul",
           "conv2d", "implicit_gemm", "attention", "streaming",
           "memory_bound", "embedding", "optimizer_step", "tile_utilization", "TILES",
           "OPTIMIZER_BYTES", "LOWP_IN_BYTES", "QUANT_BYTES", "BLOCK_SCALE_US", "math_path",
           "FLASH_BWD_RATE", "FP8_SCALINGS", "TENSORWISE_CAST_BYTES", "head_dim_rates"]

_K_HALF_REL = 0.25  # k_half is an assumed profile value
_MEM_LATENCY_US = 0.6  # HBM load-to-use latency for the streaming size curve (assumed)
_ATTN_S_HALF = 256.0  # sequence length at which attention reaches half its rate (assumed)
_ATTN_TILE = 128  # FlashAttention-2's query/key tile rows: a causal mask's diagonal tiles (assumed)
_ANCHOR_SEQ = 8192  # sequence of the published FlashAttention-2 figures (K2-K5, K41)
#: sequence of a published forward rate (``flash_fwd_tflops``): FA4's B200 grid's longest
#: (K45; assumed: the paper's maxima are at its longest sequences; 1% from 8192 to 32768)
_FWD_ANCHOR_SEQ = 32768
#: a flash-attention backward's FLOP/s over its forward's at the same shape: FlashAttention-2
#: on H100 SXM5, head dim 128, sequence 16k, 322 / 370 TFLOP/s (FA3 paper, Shah et al. 2024,
#: arXiv 2407.08608, Figs. 5-6; cuDNN 516 / 595 and FlashAttention-3 561 / 648 give the same
#: 0.87; REFERENCES.md K14). The backward's extra softmax recomputation and its dS / dQ
#: accumulation (atomics in FA2) are not GEMM work, so it runs below the forward's rate.
FLASH_BWD_RATE = 0.87
#: optimizer-step HBM bytes per parameter beyond the gradient: (fp32 state read+written)
OPTIMIZER_BYTES = {"adam": 4 * 6, "adamw": 4 * 6, "sgd": 4 * 4, "adafactor": 4 * 3}
_OPT_FLOPS = {"adam": 12.0, "adamw": 14.0, "sgd": 3.0, "adafactor": 10.0}
_REL = {"published": 0.05, "derived": 0.08, "fitted": 0.10, "assumed": 0.25}
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


@dataclass(frozen=True)
class Curves:
    """Efficiency-curve parameters per kernel class (all physical: an efficiency is a
    fraction <= 1 of the published ceiling it multiplies). The defaults are the model as
    documented above; ``bench/kernel_loo.py`` fits them on some traces and judges them on
    another, and the replay what-ifs use the fitted ones (``KERNEL_CURVES``).

    ``gemm_eff`` / ``conv_eff``: fraction of the modeled matmul rate (ceiling x k-depth x
    tiles) a library GEMM / an implicit-GEMM convolution sustains; ``wgrad_eff``: the
    further fraction a convolution's weight-gradient pass sustains (im2col-indexed operands,
    split-K partial sums: :mod:`collectors.costs.conv`); ``mem_eff``: fraction of
    the HBM triad bandwidth a streaming kernel sustains; ``mem_latency_us``: the bytes in
    flight a streaming kernel needs, as microseconds of bandwidth (its size curve);
    ``k_half_scale``: multiplies the profile's ``gemm_k_half``; ``tile_fill_us``: when
    set (> 0), the most a GEMM tile's prologue / epilogue may take (the same on every GPU:
    loading its first operands, writing its result): ``k_half`` is at most that time in
    k-steps of a 128 x 128 tile at the GPU's per-SM ceiling for the dtype (0: the profile's
    ``gemm_k_half`` x ``k_half_scale`` alone, what the synthesizer uses). One value per
    math path (:func:`math_path`), since the two pipelines differ: ``tile_fill_us`` for
    SIMT kernels (FP32 on NVIDIA's CUDA cores: CUTLASS's default SIMT GEMM is a 128 x 128 x 8
    tile in a 2-stage pipeline, operands through registers), ``tile_fill_tc_us`` for
    tensor / matrix-core kernels (16-bit, TF32, FP8; FP32 on AMD's matrix cores: a
    128 x 256 x 64 tile in a 3-stage asynchronous-copy pipeline on SM80), REFERENCES.md K12.
    """

    gemm_eff: float = 1.0
    conv_eff: float = 1.0
    wgrad_eff: float = 1.0
    mem_eff: float = 1.0
    mem_latency_us: float = _MEM_LATENCY_US
    k_half_scale: float = 1.0
    tile_fill_us: float = 0.0
    tile_fill_tc_us: float = 0.0
    source: str = "assumed"

    def __post_init__(self) -> None:
        for f in ("gemm_eff", "conv_eff", "wgrad_eff", "mem_eff"):
            v = getattr(self, f)
            if not 0.0 < v <= 1.0:
                raise ConfigError(f"Curves.{f}={v!r}: an efficiency must be in (0, 1]")
        if self.mem_latency_us < 0 or self.k_half_scale <= 0 or self.tile_fill_us < 0 \
                or self.tile_fill_tc_us < 0:
            raise ConfigError(f"Curves: mem_latency_us={self.mem_latency_us!r}, "
                              f"tile_fill_us={self.tile_fill_us!r} and tile_fill_tc_us="
                              f"{self.tile_fill_tc_us!r} must be >= 0 and "
                              f"k_half_scale={self.k_half_scale!r} > 0")

    def tile_fill(self, path: str) -> float:
        """The tile fill time (us, 0: none given) of math path ``path``
        (:func:`math_path`)."""
        return self.tile_fill_us if path == "simt" else self.tile_fill_tc_us


#: NVIDIA generations: their FP32 GEMMs run on the CUDA cores (SIMT); AMD's CDNA matrix
#: cores run FP32 GEMMs too (``v_mfma_f32_*_f32``)
_SIMT_FP32_ARCHES = ("volta", "ampere", "hopper", "blackwell")


def math_path(g: GpuSpec, dtype: str) -> str:
    """``simt`` (FP32 on an NVIDIA GPU's CUDA cores) or ``tensor`` (tensor / matrix-core
    kernels) for a GEMM in ``dtype`` on ``g``: the tile pipeline it runs
    (:class:`Curves`)."""
    return "simt" if dtype == "fp32" and g.arch in _SIMT_FP32_ARCHES else "tensor"


DEFAULT_CURVES = Curves()
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


@dataclass(frozen=True)
class OpCost:
    """One priced kernel (times in us, rates in TFLOP/s and GB/s)."""

    kind: str
    gpu: str
    time_us: float
    range_us: tuple[float, float]
    flops: float
    bytes: float
    tflops: float
    gbps: float
    bound: str  # "compute" | "memory" | "latency"
    efficiency: float  # fraction of the dtype's datasheet peak (compute) or of HBM peak
    efficiency_source: str
    #: (role, us) per kind of kernel a call is priced as, where it runs several kinds
    #: (convolutions: ``main`` GEMM passes, ``layout`` copies, ``aux`` launch floors)
    parts: tuple = ()

    def to_dict(self) -> dict:
        return {"kind": self.kind, "gpu": self.gpu, "time_us": round(self.time_us, 3),
                "range_us": [round(self.range_us[0], 3), round(self.range_us[1], 3)],
                "flops": self.flops, "bytes": self.bytes, "tflops": round(self.tflops, 2),
                "gbps": round(self.gbps, 1), "bound": self.bound,
                "efficiency": round(self.efficiency, 4),
                "efficiency_source": self.efficiency_source}


def _eb(dtype: str) -> float:
    eb = DTYPE_BYTES.get(dtype)
    if eb is None:
        raise ConfigError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPE_BYTES)}")
    return eb


def _positive(**kw: float) -> None:
    for k, v in kw.items():
        if not (isinstance(v, int | float) and v > 0):
            raise ConfigError(f"--{k.replace('_', '-')} {v!r}: must be a positive number")


def _finish(kind: str, g: GpuSpec, flops: float, nbytes: float, t_comp: float,
            comp_src: str, comp_eff: float, comp_rel: float,
            curves: Curves = DEFAULT_CURVES) -> OpCost:
    """Roofline: the slower of compute (us, plus the tile pipeline's ramp and tail, one
    kernel overhead) and memory, floored by the launch/tail."""
    if t_comp > 0:
        t_comp += g.hw.kernel_overhead_us
    bw, bw_src = g.hbm_gbps()
    bw *= curves.mem_eff
    lat = curves.mem_latency_us
    bw_eff = bw * nbytes / (nbytes + bw * 1e3 * lat) if nbytes > 0 else bw
    t_mem = nbytes / (bw_eff * 1e3) if nbytes > 0 else 0.0
    floor = g.hw.kernel_overhead_us
    t = max(t_comp, t_mem, floor)
    if t == t_comp and t_comp > 0:
        bound, eff, src, rel = "compute", comp_eff, comp_src, comp_rel
    elif t == t_mem and t_mem > 0:
        bound, eff = "memory", bw_eff / g.hw.hbm_gbps
        src = (f"HBM {bw:.0f} GB/s ({bw_src}{', K2-K4' if bw_src == 'published' else ''}"
               f"{'' if curves.mem_eff == 1 else f' x {curves.mem_eff:.2f} {curves.source}'}"
               f") x size curve {bw_eff / bw:.2f} ({curves.source} {lat:g} us in flight)")
        rel = math.hypot(_REL[bw_src], 0.10 if bw_eff / bw > 0.8 else 0.25)
    else:
        bound, eff, rel = "latency", 0.0, 0.5
        src = f"launch + ramp/tail {floor} us (assumed, hardware profile)"
    return OpCost(kind, g.name, t, (t * (1 - rel * 0.8), t * (1 + rel)), flops, nbytes,
                  flops / (t * 1e6), nbytes / (t * 1e3), bound, eff, src)


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


def _fb_per_fwd() -> float:
    """A flash kernel's forward + backward FLOP/s over its forward's: 3.5x the forward FLOPs
    over the forward's time plus the backward's (2.5x the FLOPs at ``FLASH_BWD_RATE``)."""
    return 3.5 / (1.0 + 2.5 / FLASH_BWD_RATE)


def head_dim_rates(fwd_anchor: float, anchor_dim: int, exp_tops: float,
                   dims: float, mamf: float = math.inf) -> tuple[float, float]:
    """(forward, backward) TFLOP/s of a flash kernel whose query/key and value widths sum to
    ``dims``, from the forward rate ``fwd_anchor`` published at head dim ``anchor_dim``
    (query = key = value width) on a GPU computing ``exp_tops`` tera-exponentials per second.

    A score costs ``2 (d_qk + d_v)`` tensor-core FLOPs forward and one exponential on the
    special-function units, serial with them in FlashAttention-2 (FA3 paper, arXiv
    2407.08608, section 3: H100 SXM5 989 TFLOP/s of matmul, 3.9 T exponentials/s;
    REFERENCES.md K43): ``t = 2 (d_qk + d_v) / R + 1 / E``; the anchor fixes ``R``. The
    backward computes 2.5x the forward's FLOPs per score and recomputes the exponential
    once: ``t_b = 5 (d_qk + d_v) / R_b + 1 / E``, ``R_b`` set so the backward runs at
    :data:`FLASH_BWD_RATE` of the forward at the anchor (K14, measured at head dim 128).

    Bound (K46): ``R`` and ``R_b`` never exceed ``mamf``, the GPU's 16-bit maximum
    achievable matmul rate (K1: no matmul beats it, the two inside a flash kernel
    included). Where the anchor would need a faster ``R``, the exponentials cannot all be
    serial (they overlap the tensor-core work, as FA3's interleaved matmul and softmax
    do): ``R = mamf`` and the exposed exponential time per score is only the anchor's time
    not covered by the matmuls at ``mamf``, ``t_anchor - 4 d_anchor / mamf`` (at most
    ``1 / E``, never negative); the overlap fraction ``1 - exposed E`` is derived from the
    anchor, not fitted. A100 (K2 anchor at head dim 64): ``R`` 305 -> 267.9, 28% of
    the exponential hidden."""
    t_exp = 1.0 / exp_tops  # ps per score (FLOPs / TFLOP/s = ps)
    fa = 4.0 * anchor_dim
    t_fa = fa / fwd_anchor
    t_ba = 2.5 * t_fa / FLASH_BWD_RATE
    if t_fa <= t_exp or t_ba <= t_exp:
        raise ConfigError(f"[published] exp_tops={exp_tops}: its exponentials alone take longer "
                          f"than the published flash rate's score time; check the profile")
    r_f, e_f = _bounded(fa, t_fa, t_exp, mamf)
    r_b, e_b = _bounded(2.5 * fa, t_ba, t_exp, mamf)
    f = 2.0 * dims
    return f / (f / r_f + e_f), 2.5 * f / (2.5 * f / r_b + e_b)


def _bounded(flops: float, t: float, t_exp: float, mamf: float) -> tuple[float, float]:
    """(matmul TFLOP/s, exposed exponential ps per score) of a score of ``flops`` tensor
    FLOPs taking ``t`` ps with an exponential of ``t_exp`` ps: all of the exponential
    serial unless that needs a matmul rate above ``mamf`` (K46); then the matmuls at
    ``mamf`` and only the rest of ``t`` exposed (never negative)."""
    r = flops / (t - t_exp)
    if r <= mamf:
        return r, t_exp
    return mamf, max(0.0, t - flops / mamf)


def _mamf16(g: GpuSpec) -> float:
    """The 16-bit matmul ceiling the published flash rates (16-bit) are bounded by (K46)."""
    return g.mamf("bf16" if g.hw.peak_tflops.get("bf16") else "fp16")[0]


def attention(g: GpuSpec, batch: int, heads: int, seq: int, head_dim: int,
              kv_heads: int | None = None, causal: bool = False, backward: bool = False,
              dtype: str = "bf16", seq_k: int | None = None,
              v_dim: int | None = None) -> OpCost:
    """Fused (FlashAttention-style) attention: ``seq`` queries over ``seq_k`` keys (default
    ``seq``), query/key width ``head_dim`` and value width ``v_dim`` (default ``head_dim``);
    GQA when ``kv_heads < heads`` (fewer K/V bytes, same FLOPs). The one flash-attention
    model: what-ifs price measured flash kernels with it and the synthesizer its own.

    Rate: the GPU's published FlashAttention-2 figure (K2-K5) is a forward + backward rate
    at sequence 8192 (the flash-attention repository's benchmark, K41), converted to the
    forward's rate with the backward at :data:`FLASH_BWD_RATE` (K14) and the sequence
    curve at 8192; x the sequence curve at ``seq_k`` (s_half 256, assumed); a causal mask
    computes its diagonal tiles whole: of ``n = seq_k / 128`` key tiles per query row of
    tiles it wastes half of one, efficiency ``n / (n + 1)`` (FlashAttention-2's 128-row
    tiles, assumed); the backward at :data:`FLASH_BWD_RATE` of the forward's rate."""
    kvh = heads if kv_heads is None else kv_heads
    sk = seq if seq_k is None else seq_k
    vd = head_dim if v_dim is None else v_dim
    _positive(batch=batch, heads=heads, seq=seq, head_dim=head_dim, kv_heads=kvh,
              seq_k=sk, v_dim=vd)
    if heads % kvh:
        raise ConfigError(f"--kv-heads {kvh}: must divide --heads {heads}")
    eb = _eb(dtype)
    flops = 2.0 * batch * heads * seq * sk * (head_dim + vd) * (0.5 if causal else 1.0)
    q_o = batch * seq * heads * (head_dim + vd) * eb
    k_v = batch * sk * kvh * (head_dim + vd) * eb
    nbytes = q_o + k_v  # read q, k, v; write o (+ small softmax statistics)
    if backward:
        flops *= 2.5
        nbytes = 2 * nbytes + q_o + k_v  # read q,k,v,o,do; write dq,dk,dv
    hd_src = ""
    if g.flash_attn_tflops > 0 or g.flash_fwd_tflops > 0:
        if g.flash_fwd_tflops > 0:
            fwd = g.flash_fwd_tflops / (_FWD_ANCHOR_SEQ / (_FWD_ANCHOR_SEQ + _ATTN_S_HALF))
            src0 = (f"fwd {fwd:.1f} from the published forward {g.flash_fwd_tflops:.1f} "
                    "(Blackwell: cuDNN, K45)")
        else:
            fwd = g.flash_attn_tflops / _fb_per_fwd() / (
                _ANCHOR_SEQ / (_ANCHOR_SEQ + _ATTN_S_HALF))
            src0 = (f"fwd {fwd:.1f} from the published fwd+bwd {g.flash_attn_tflops:.1f}, "
                    "K2-K5, K41")
        pas = "bwd" if backward else "fwd"
        if g.exp_tops > 0 and g.flash_attn_head_dim > 0:
            fwd_d, bwd_d = head_dim_rates(fwd, g.flash_attn_head_dim, g.exp_tops,
                                          head_dim + vd, _mamf16(g))
            rate = bwd_d if backward else fwd_d
            t_a = 4.0 * g.flash_attn_head_dim / fwd * (2.5 / FLASH_BWD_RATE if backward else 1)
            r_m, e_x = _bounded(4.0 * g.flash_attn_head_dim * (2.5 if backward else 1.0), t_a,
                                1.0 / g.exp_tops, _mamf16(g))
            cap = (f"; R capped at the 16-bit MAMF {r_m:.1f}, {e_x * g.exp_tops:.0%} of 1 / E "
                   "exposed, K46" if e_x < 1.0 / g.exp_tops else "")
            hd_src = (f" -> {pas} {rate:.1f} at head dims {head_dim}+{vd} (per score "
                      f"2(d_qk + d_v) / R + 1 / E, E {g.exp_tops:g} T exp/s, anchor head dim "
                      f"{g.flash_attn_head_dim}; K43{cap})")
        else:
            rate = fwd * (FLASH_BWD_RATE if backward else 1.0)
    else:
        fwd, src0 = g.peak_tflops(dtype) * 0.35, "assumed 35% of peak"
        rate = fwd * (FLASH_BWD_RATE if backward else 1.0)
    curve = sk / (sk + _ATTN_S_HALF)
    n = sk / _ATTN_TILE
    mask = n / (n + 1.0) if causal else 1.0
    rate = rate * curve * mask
    rate = min(rate, g.mamf(dtype)[0])
    kern = "flash attention" if g.flash_fwd_tflops > 0 else "FlashAttention-2"
    src = (f"{kern} {src0}{hd_src} x sequence curve {curve:.2f} (s_half 256, "
           f"assumed){f' x causal tiles {mask:.3f} (128-row tiles, assumed)' if causal else ''}"
           f"{f' x backward {FLASH_BWD_RATE} (published, K14)' if backward and not hd_src else ''}")
    rel = math.hypot(0.05 if g.flash_attn_tflops or g.flash_fwd_tflops else 0.25, 0.15)
    return _finish("attention", g, flops, nbytes, flops / (rate * 1e6), src,
                   rate / g.peak_tflops(dtype), rel)


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
