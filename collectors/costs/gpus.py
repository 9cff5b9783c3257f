"""GPU facts for the cost layer, read from the one set of hardware profiles
(``collectors/synth/hardware/*.toml``): peaks per dtype, HBM, SM count, architecture, and the
published measured ceilings (``[published]``: maximum achievable matmul TFLOP/s, HBM triad
bandwidth) that cap the kernel model. Nothing here is a second copy of a profile: a
:class:`GpuSpec` wraps the parsed :class:`~retime.collectors.synth.hardware.HardwareConfig`
and adds the keys that parser does not read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import tomllib

from ..errors import ConfigError
from ..synth.hardware import HardwareConfig, hardware_names, load_hardware, read_hardware_file

__all__ = ["GpuSpec", "gpu_spec", "gpu_names", "spec_of", "ARCHES", "DTYPE_BYTES"]

#: GPU generations the NCCL model knows (order matters: later = newer)
ARCHES = ("volta", "ampere", "hopper", "blackwell", "cdna3", "cdna4")

#: bytes per element of each dtype name accepted by ``--dtype``
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "fp6": 0.75, "fp4": 0.5,
               "int8": 1, "int32": 4, "int64": 8, "fp64": 8}


@dataclass(frozen=True)
class GpuSpec:
    """One GPU profile plus the cost layer's extra keys.

    ``mamf_tflops`` maps dtype -> published maximum achievable matmul TFLOP/s (a hard cap
    on any modeled GEMM); ``stream_gbps`` is the published HBM triad bandwidth (0 when
    none is published: the profile's ``memory`` efficiency is used, an assumption);
    ``flash_attn_tflops`` the published FlashAttention-2 rate (bf16/fp16, long sequence),
    measured at head dim ``flash_attn_head_dim``; ``exp_tops`` the GPU's exponential
    (special-function unit) throughput, tera-exponentials per second (0: not stated, no
    head-dim term in :func:`~retime.collectors.costs.kernels.attention`);
    ``flash_fwd_tflops`` a published *forward* rate of the attention kernel the GPU's
    frameworks run (long sequence, head dim ``flash_attn_head_dim``; Blackwell: cuDNN, since
    FlashAttention-2 is an Ampere-era kernel there), used instead of ``flash_attn_tflops``.
    """

    hw: HardwareConfig
    arch: str
    mamf_tflops: dict[str, float] = field(default_factory=dict)
    stream_gbps: float = 0.0
    flash_attn_tflops: float = 0.0
    flash_attn_head_dim: int = 0
    exp_tops: float = 0.0
    flash_fwd_tflops: float = 0.0

    @property
    def name(self) -> str:
        return self.hw.name

    @property
    def sm_count(self) -> int:
        return self.hw.sm_count

    def peak_tflops(self, dtype: str) -> float:
        """Dense datasheet peak for ``dtype`` (fp16 stands in for bf16 and back)."""
        p = self.hw.peak_tflops
        v = p.get(dtype) or (p.get("fp16") if dtype == "bf16" else p.get("bf16")
                             if dtype == "fp16" else None)
        if not v:
            raise ConfigError(f"gpu {self.name!r} has no {dtype} peak; available: "
                              f"{', '.join(sorted(p))}; pick another --dtype")
        return float(v)

    def mamf(self, dtype: str) -> tuple[float, str]:
        """(ceiling TFLOP/s for matmuls in ``dtype``, its source): the published maximum
        achievable matmul rate where one exists; for tf32 / fp32 without one, the
        published 16-bit rate's fraction of its peak x the dtype's peak (derived); else
        ``peak * gemm_max`` (assumed)."""
        v = self.mamf_tflops.get(dtype)
        if v:
            return float(v), "published"
        half = self.mamf_tflops.get("bf16") or self.mamf_tflops.get("fp16")
        if dtype in ("tf32", "fp32") and half and self.hw.peak_tflops.get(dtype):
            # the published 16-bit ceiling's fraction of its peak (clocks under load, the
            # same power limit) applied to the datasheet's tf32 / fp32 peak (REFERENCES.md
            # K1; the H100 VGG-13 trace's largest tf32 convolutions and fp32 GEMMs reach
            # 0.91 and 0.82 of their peaks, above the 0.80 this gives)
            frac = half / (self.hw.peak_tflops.get("bf16") or self.peak_tflops("fp16"))
            return frac * self.peak_tflops(dtype), "derived"
        return self.peak_tflops(dtype) * self.hw.gemm_max_of(dtype), "assumed"

    def training_ceiling(self, dtype: str) -> tuple[float, str]:
        """(TFLOP/s, source) a GEMM sustains inside a training step: the profile's
        ``gemm_max`` fraction of the dtype's peak (with its ``[power]`` scaling), set with
        the synthesizer's validation benches (:func:`collectors.synth.costs._ceiling` says
        why it differs from :meth:`mamf`), never above :meth:`mamf` (a training step cannot
        beat one GPU running one shape back to back: MI300X 784.4 -> 668.4 (K28), MI250X
        147.5 -> 147.0 (K1), GB200 FP8 3000 -> 2906.9 and FP4 8000 -> 7627.6 (K5)).
        ``retime cost op --training`` and the synthesizer price with it."""
        fit = self.peak_tflops(dtype) * self.hw.gemm_max_of(dtype)
        cap, src = self.mamf(dtype)
        return (cap, src) if cap < fit else (fit, "fitted")

    def hbm_gbps(self) -> tuple[float, str]:
        """(achievable HBM bandwidth GB/s, source): published triad, else
        ``hbm_gbps * memory`` efficiency (assumed)."""
        if self.stream_gbps > 0:
            return self.stream_gbps, "published"
        return self.hw.hbm_gbps * self.hw.memory_efficiency, "assumed"

    @property
    def nvls_capable(self) -> bool:
        """NVLink SHARP needs a Hopper-or-newer GPU (and NVSwitch3+, checked by the cluster)."""
        return self.arch in ("hopper", "blackwell")


def _extra(path: str) -> dict:
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def spec_of(hw: HardwareConfig) -> GpuSpec:
    """The :class:`GpuSpec` of any hardware profile (built-in, a file, or one a what-if
    changed): the cost layer's keys are read from its source file when it has one."""
    return _spec(hw)


def _spec(hw: HardwareConfig) -> GpuSpec:
    src = hw.source if hw.source and Path(hw.source).is_file() else ""
    raw = _extra(src) if src else {}
    if "peak_tflops" not in raw and hw.name in hardware_names():
        # rebuilt from a trace's metadata, or made from a cluster file (its source is the
        # cluster's TOML, not a profile): the GPU facts are the named profile's
        raw = _extra(load_hardware(hw.name).source)
    arch = str(raw.get("arch", "ampere")).lower()
    if arch not in ARCHES:
        raise ConfigError(f"{hw.source}: arch={arch!r} is not one of {', '.join(ARCHES)}")
    pub = raw.get("published", {})
    if float(pub.get("exp_tops", 0.0)) < 0 or int(pub.get("flash_attn_head_dim", 0)) < 0 \
            or float(pub.get("flash_fwd_tflops", 0.0)) < 0:
        raise ConfigError(f"{hw.source}: [published] exp_tops, flash_attn_head_dim and "
                          "flash_fwd_tflops must be >= 0 (0: not stated)")
    mamf = {str(k): float(v) for k, v in pub.get("mamf_tflops", {}).items()}
    return GpuSpec(hw=hw, arch=arch, mamf_tflops=mamf,
                   stream_gbps=float(pub.get("stream_gbps", 0.0)),
                   flash_attn_tflops=float(pub.get("flash_attn_tflops", 0.0)),
                   flash_attn_head_dim=int(pub.get("flash_attn_head_dim", 0)),
                   exp_tops=float(pub.get("exp_tops", 0.0)),
                   flash_fwd_tflops=float(pub.get("flash_fwd_tflops", 0.0)))


@cache
def _builtin_spec(name: str) -> GpuSpec:
    return _spec(load_hardware(name))


def gpu_names() -> list[str]:
    """Names of the built-in GPU profiles."""
    return hardware_names()


def gpu_spec(name: str | Path) -> GpuSpec:
    """A :class:`GpuSpec` from a built-in profile name or a hardware TOML path."""
    s = str(name)
    if s.endswith(".toml"):
        return _spec(read_hardware_file(s))
    if s.lower() not in hardware_names():
        raise ConfigError(f"unknown GPU {s!r}; built-in profiles: {', '.join(gpu_names())}; "
                          "or pass a hardware TOML (copy collectors/synth/hardware/*.toml)")
    return _builtin_spec(s.lower())
