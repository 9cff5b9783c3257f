"""GEMM tile and wave utilization, shared by the kernel model and the synthesizer (one
formula). No imports from the rest of the package: the synthesizer imports this module
while its own package is still initializing."""

from __future__ import annotations

import math

__all__ = ["TILES", "tile_utilization"]

#: output tile shapes (m x n) a GEMM library chooses from; the best one for a shape is used
TILES = ((256, 128), (128, 256), (128, 128), (64, 128), (128, 64), (64, 64))


def tile_utilization(sm_count: int, ms: list[float], n: float, k: float = 0.0,
                     k_half: float = 0.0) -> float:
    """Best tile shape's utilization for groups of ``m_i x n`` outputs in one launch: partial
    edge tiles, the last, partly filled wave of tiles over ``sm_count`` SMs, and the tile's
    own efficiency (a tile below 128 x 128 has less reuse per byte it loads: its arithmetic
    intensity ``tm tn / (tm + tn)`` relative to 128 x 128's, assumed). When there is at least
    one full wave and the reduction is deep (``k >= 4 k_half``), the library can split the
    reduction over the idle SMs (split-K / stream-K): the last wave is then balanced at a
    10% fix-up cost; with less than one wave of tiles it splits the reduction over the
    idle SMs (slices at least ``2 k_half`` deep) where that is faster; the price never falls
    as m, n or k grow. With ``k = 0`` only the wave count is modeled (the synthesizer's use)."""
    best = 0.0
    useful = sum(ms) * n
    if useful <= 0:
        return 1.0
    for tm, tn in TILES:
        nt = math.ceil(n / tn)
        tiles = sum(math.ceil(m / tm) for m in ms) * nt
        waves = math.ceil(tiles / sm_count)
        edge = useful / (tiles * tm * tn)
        util = edge * tiles / (waves * sm_count)
        if k > 0:
            if tiles >= sm_count and k >= 4 * k_half:
                util = max(util, edge * 0.9)
            elif tiles < sm_count and k_half > 0:
                # too few output tiles to fill the SMs: split the reduction into the
                # ``sm_count // tiles`` slices the idle SMs take (cuBLAS split-K, CUTLASS
                # stream-K), reduced by a second pass (10%), each slice at least 2 k_half
                # deep and paying its own prologue. The slice depth is
                # ``max(2 k_half, k / slices)``, never shrinking as k, m or n grow: the
                # former whole number of slices of >= 2 k_half (and a k >= 4 k_half
                # threshold) let a deeper or wider GEMM cost less (#27: MI300X FP32
                # 16x128x256 9.83 us > 16x256x512 8.98 us)
                sl = sm_count // tiles
                ks = max(2 * k_half, k / sl)
                if sl >= 2 and ks < k:
                    f = (ks / (ks + k_half)) / (k / (k + k_half))
                    util = max(util, edge * tiles * (k / ks) / sm_count * 0.9 * f)
            util *= min(1.0, (tm * tn / (tm + tn)) / 64.0)
        best = max(best, util)
    return best
