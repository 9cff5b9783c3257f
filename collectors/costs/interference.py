"""Compute-communication interference on one GPU: what overlapping NCCL kernels cost.

NCCL runs one thread block per channel and a block holds its SM alone for the collective's
whole duration (REFERENCES.md C13: "NCCL CTAs won't share an SM with compute kernels"), so a
collective with ``c`` channels takes ``c / SMs`` of the GPU's SMs from the compute kernels
beside it; both also share HBM bandwidth and caches (C14: a 1-block send/recv next to a GEMM
still ran up to 2x slower). C3 (C12, Agrawal et al., MI300X) measured the sum of both on
real GEMM + collective pairs as the fraction ``f`` of the ideal overlap speed-up achieved
(``f = (T_serial - T_overlap) / (T_serial - max(T_comp, T_comm))``):

* 0.21 on average when run as-is (the library's default channels, i.e. its default share of
  the SMs: :data:`SM_SHARE_REF`),
* 0.72 with the collectives offloaded to DMA engines (ConCCL: no SMs taken; what is left is
  memory and cache contention).

The replay's contention path runs compute and communication at ``1 / (1 + i)`` of their
rates while they overlap on a device, which achieves exactly ``f = 1 - i`` for any pair of
lengths. The slowdown is split into a memory part (the DMA-offload floor, present whatever
the SM share) and an SM part proportional to the share NCCL takes::

    i(p) = I_MEM + (I_NAIVE - I_MEM) * p / SM_SHARE_REF

so ``i(0) = 0.28`` (DMA offload), ``i(SM_SHARE_REF) = 0.79`` (C3's naive runs). C3's
third figure, 0.42 with prioritization and CU partitioning, lies between and is not a
separate point of the model (partitioning changes which SMs, not how many). C3 reports the
pair's overlap, not each side's slowdown: both sides are slowed alike (assumed).

C3's pairs are GEMMs: compute-bound kernels. A kernel's own side depends on where it sits
against the GPU's ridge point (:func:`kernel_slowdowns`; roofline: ridge = matmul ceiling /
HBM bandwidth, REFERENCES.md K1-K4). While NCCL moves data it takes a share ``b`` of the HBM
bandwidth (:func:`nccl_hbm_share`: its bus rate x the HBM bytes each byte on the wire costs);
a kernel needing ``u`` of the bandwidth at its full rate (``u = min(1, ridge / intensity)``)
is slowed by ``max(0, u + b - 1) / (1 - b)`` more (C14: "you may not compete for SMs but
still compete for memory bandwidth"), and loses only ``min(1, intensity / ridge)`` of the
SM part (a memory-bound kernel saturates HBM with fewer SMs than it has: the SMs NCCL holds
cost it only where its compute binds). A compute-bound kernel (``u <= 1 - b``) keeps C3's
figure exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .nccl_params import Param

__all__ = ["I_MEM", "I_NAIVE", "SM_SHARE_REF", "HBM_PER_WIRE_BYTE", "Interference",
           "interference", "kernel_slowdowns", "nccl_hbm_share"]

#: slowdown left with collectives on DMA engines (no SMs): 1 - 0.72 (C12)
I_MEM = Param(0.28, "published", "C12: ConCCL (DMA-offloaded collectives) reach 72% of the "
              "ideal overlap speed-up")
#: slowdown of collectives at the library's default SM share: 1 - 0.21 (C12)
I_NAIVE = Param(0.79, "published", "C12: concurrent GEMM + collective reach 21% of the ideal "
                "overlap speed-up on average")
#: share of the SMs the library's default channels take in C3's naive runs (not stated
#: there): ~24 channels of 108 A100 SMs (C6), 16 of 132 H100 SMs (C13: "16 SMs" on a DGX),
#: tens of channels of MI300X's 304 CUs
SM_SHARE_REF = Param(0.2, "assumed", "default NCCL/RCCL channels over the SM count (C6, C13)")
#: HBM bytes an NCCL ring step moves per byte on the wire, per GPU: it reads what it sends,
#: the bytes it receives land in its memory and are read back to reduce or forward them
HBM_PER_WIRE_BYTE = Param(3.0, "assumed", "ring step: one read to send, one write on arrival, "
                          "one read to reduce / forward (C0's Simple protocol path)")


@dataclass(frozen=True)
class Interference:
    """Slowdown ``i`` of compute and communication while they overlap, and where it came
    from (``source``: the weakest of its parameters' sources)."""

    sm_share: float
    slowdown: float
    source: str
    rel: float  # relative half-width of the slowdown's range

    @property
    def overlap_fraction(self) -> float:
        """C3's fraction of the ideal overlap speed-up this slowdown achieves."""
        return max(0.0, 1.0 - self.slowdown)


def interference(sm_share: float, *, bound: str | None = None,
                 active: float = 1.0) -> Interference:
    """The slowdown of overlapped compute and NCCL kernels when NCCL holds ``sm_share`` of
    the SMs (0: offloaded to DMA engines). ``active``: the share of the NCCL kernels' time
    spent moving data; the rest they spin waiting for peers, holding their SMs but not
    memory bandwidth, so the memory part scales with it. ``bound`` ``"low"`` / ``"high"``
    moves it to the ends of its range (the assumed reference share: +-25%)."""
    p = min(max(float(sm_share), 0.0), 1.0)
    a = min(max(float(active), 0.0), 1.0)
    sm_part = (I_NAIVE.value - I_MEM.value) * p / SM_SHARE_REF.value
    rel = SM_SHARE_REF.rel if p > 0 else I_MEM.rel
    if bound == "low":
        sm_part *= 1 - SM_SHARE_REF.rel
    elif bound == "high":
        sm_part *= 1 + SM_SHARE_REF.rel
    source = "published" if p == 0 else "assumed"
    return Interference(p, I_MEM.value * a + sm_part, source, rel)


def nccl_hbm_share(busbw_gbps: float, hbm_gbps: float) -> float:
    """Share of the GPU's HBM bandwidth NCCL takes while moving data at ``busbw_gbps``
    (:data:`HBM_PER_WIRE_BYTE` per byte on the wire), at most 0.9."""
    if hbm_gbps <= 0:
        return 0.0
    return float(min(0.9, max(0.0, HBM_PER_WIRE_BYTE.value * busbw_gbps / hbm_gbps)))


def kernel_slowdowns(base: Interference, intensity, ridge, hbm_share: float,
                     active: float = 1.0) -> np.ndarray:
    """Per compute kernel, its slowdown next to NCCL (module docstring). ``base``: C3's
    slowdown at the SM share (a compute-bound kernel's, :func:`interference` with the same
    ``active``); ``intensity``: each kernel's FLOPs per HBM byte (NaN: unknown, keeps
    ``base``); ``ridge``: the GPU's FLOPs per byte at the kernel's dtype; ``hbm_share``:
    NCCL's share of the bandwidth while it moves data; ``active``: the share of its time it
    moves data (its memory traffic scales with it)."""
    ai = np.asarray(intensity, np.float64)
    r = np.broadcast_to(np.asarray(ridge, np.float64), ai.shape)
    known = np.isfinite(ai) & (r > 0)
    x = np.where(known, np.maximum(ai, 0.0) / np.where(r > 0, r, 1.0), np.inf)
    u = np.minimum(1.0, 1.0 / np.maximum(x, 1e-12))  # share of HBM it needs at full rate
    b = min(max(float(hbm_share), 0.0), 0.9)
    a = min(max(float(active), 0.0), 1.0)
    mem = min(I_MEM.value * a, base.slowdown)
    sm_part = base.slowdown - mem
    bw = np.maximum(u + b - 1.0, 0.0) / (1.0 - b) * a
    return np.where(known, mem + sm_part * np.minimum(x, 1.0) + bw, base.slowdown)
