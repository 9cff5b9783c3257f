"""What the kernel cost models share: the priced-kernel record, the efficiency curves, the
roofline that finishes every price (:func:`_finish`). :mod:`.kernels` and :mod:`.attention`
both import it (neither imports the other's internals), and :mod:`.kernels` re-exports it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError
from .gpus import DTYPE_BYTES, GpuSpec

__all__ = ["OpCost", "Curves", "DEFAULT_CURVES", "math_path"]

_MEM_LATENCY_US = 0.6  # HBM load-to-use latency for the streaming size curve (assumed)
_REL = {"published": 0.05, "derived": 0.08, "fitted": 0.10, "assumed": 0.25}



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
