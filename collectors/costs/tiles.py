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
    10% fix-up cost; with less than one wave of tiles it splits the reduction into as many
    slices as fill the SMs (each at least ``2 k_half`` deep). With ``k = 0`` only the wave count is modeled (the synthesizer's use)."""
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
            elif tiles < sm_count and k >= 4 * k_half:
                # too few output tiles to fill the SMs: split the reduction into s slices
                # (cuBLAS split-K, CUTLASS stream-K) of at least 2 k_half each, reduced by a
                # second pass (10%); each slice pays its own prologue
                sl = min(sm_count // tiles, int(k // (2 * k_half)))
                if sl >= 2:
                    ks = k / sl
                    f = (ks / (ks + k_half)) / (k / (k + k_half))
                    util = max(util, edge * tiles * sl / sm_count * 0.9 * f)
            util *= min(1.0, (tm * tn / (tm + tn)) / 64.0)
        best = max(best, util)
    return best
