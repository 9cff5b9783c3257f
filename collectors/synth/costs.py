"""Kernel and communication cost models.

Compute: a roofline with size-dependent efficiency. A GEMM ``m x n x k`` runs at
``peak * gemm_max * k / (k + gemm_k_half) * tile_utilization`` where the utilization counts
partial edge tiles and the partly filled last wave of output tiles over the GPU's
``sm_count`` multiprocessors (for the best of a few usual tile shapes), or at the HBM
roofline if that is slower; streaming (elementwise) kernels run at
``hbm_gbps * memory_efficiency``. Every kernel also pays ``kernel_overhead_us`` (launch,
ramp-up and tail on the GPU timeline).

Communication: alpha-beta per link level with nccl-tests bus-bandwidth semantics. A
collective over ``n`` ranks moving a buffer of ``S`` bytes takes
``base + steps * alpha + S * f(n) / busbw`` with ``f = 2(n-1)/n`` for all-reduce and
``(n-1)/n`` for all-gather / reduce-scatter (``S`` is the full, gathered size), ``steps`` the
ring's ``2(n-1)`` or ``n-1`` (or a tree's ``2 log2 n`` for all-reduce, whichever is faster).
``busbw`` is the slowest level the group crosses: intra-node (NVLink/NVSwitch), inter-node
(``k`` members per node each drive their own NIC share) or a cross-datacenter link.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..enums import CommOp
from .hardware import HardwareConfig, LinkConfig
from .parallel import ParallelConfig

__all__ = ["KernelCost", "gemm", "streaming", "GroupGeometry", "CommModel"]


@dataclass(frozen=True)
class KernelCost:
    """Modeled duration (ns), FLOPs and HBM bytes of one kernel."""

    dur_ns: int
    flops: float
    bytes: int


#: output tile shapes a GEMM library chooses from (m x n); the best one for a shape is used
_TILES = ((256, 128), (128, 256), (128, 128), (64, 128), (128, 64), (64, 64))


def _gemm_efficiency(hw: HardwareConfig, m: float, n: float, k: float, batch: int = 1) -> float:
    """Fraction of peak reached by a GEMM: ``gemm_max`` x the reduction-depth factor
    ``k / (k + gemm_k_half)`` (prologue/epilogue of each tile) x the best tile's utilization
    (partial edge tiles and the last, partly filled wave of tiles over ``sm_count`` SMs)."""
    best = 0.0
    for tm, tn in _TILES:
        mt, nt = math.ceil(m / tm), math.ceil(n / tn)
        tiles = mt * nt * batch
        waves = math.ceil(tiles / hw.sm_count)
        util = (m * n * batch) / (mt * tm * nt * tn * batch) * tiles / (waves * hw.sm_count)
        best = max(best, util)
    return hw.gemm_max * k / (k + hw.gemm_k_half) * best


def gemm(hw: HardwareConfig, dtype: str, m: int, n: int, k: int, batch: int = 1,
         elem_bytes: int = 2) -> KernelCost:
    """A (batched) GEMM ``[m, k] x [k, n]``: roofline with size-dependent efficiency."""
    flops = 2.0 * m * n * k * batch
    nbytes = int(elem_bytes * batch * (m * k + k * n + m * n))
    t_compute = flops / (hw.peak_flops(dtype) * _gemm_efficiency(hw, m, n, k, batch))
    t_memory = nbytes / (hw.hbm_gbps * hw.memory_efficiency)  # GB/s == bytes/ns
    dur = max(t_compute * 1e9, t_memory) + hw.kernel_overhead_us * 1e3
    return KernelCost(int(round(dur)), flops, nbytes)


def streaming(hw: HardwareConfig, nbytes: float, flops: float = 0.0) -> KernelCost:
    """A memory-bound kernel moving ``nbytes`` through HBM (elementwise, norm, softmax)."""
    dur = nbytes / (hw.hbm_gbps * hw.memory_efficiency) + hw.kernel_overhead_us * 1e3
    return KernelCost(int(round(dur)), float(flops), int(nbytes))


@dataclass(frozen=True)
class GroupGeometry:
    """Shape of a process group on the cluster: size, members per node, nodes, DCs."""

    size: int
    per_node: int
    nodes: int
    datacenters: int


class CommModel:
    """Alpha-beta collective / p2p times for the groups of one parallel layout.

    Parameters
    ----------
    hw : HardwareConfig
        Links and per-GPU bandwidths.
    parallel : ParallelConfig
        Gives the rank stride of each group kind (``tp``, ``cp``, ``dp``, ``pp``).
    """

    def __init__(self, hw: HardwareConfig, parallel: ParallelConfig) -> None:
        self.hw = hw
        self.parallel = parallel
        p = parallel
        dp_size = p.dp * p.cp  # gradients are reduced over data x context ranks
        self.geometry = {
            "tp": self.geometry_of(p.tp, 1),
            "cp": self.geometry_of(p.cp, p.tp),
            "dp": self.geometry_of(dp_size, p.tp),
            "pp": self.geometry_of(p.pp, p.tp * p.cp * p.dp),
        }

    def geometry_of(self, size: int, stride: int) -> GroupGeometry:
        """Geometry of ``size`` ranks spaced ``stride`` apart (Megatron layout)."""
        g = self.hw.gpus_per_node
        per_node = max(1, min(size, g // stride)) if stride < g else 1
        nodes = math.ceil(size / per_node)
        dcs = 1
        if self.hw.nodes_per_dc > 0 and self.hw.cross_dc is not None:
            node_stride = max(1, stride // g)
            span_nodes = (nodes - 1) * node_stride + 1
            dcs = math.ceil(span_nodes / self.hw.nodes_per_dc)
        return GroupGeometry(size, per_node, nodes, dcs)

    def level(self, geo: GroupGeometry) -> tuple[float, LinkConfig]:
        """(bus bandwidth in bytes/ns, slowest link) for a group."""
        hw = self.hw
        if geo.nodes <= 1:
            return hw.intra.bus_bytes_per_ns, hw.intra
        # k members per node each drive their share of the node's NICs (rail-optimized)
        bw = min(hw.intra.bus_bytes_per_ns, hw.inter.bus_bytes_per_ns * geo.per_node)
        link = hw.inter
        if geo.datacenters > 1 and hw.cross_dc is not None:
            bw = min(bw, hw.cross_dc.bus_bytes_per_ns * geo.per_node)
            link = hw.cross_dc
        return bw, link

    def collective_ns(self, comm_op: int, nbytes: float, group: str | GroupGeometry) -> int:
        """Duration of one collective of ``nbytes`` (full buffer) on a group kind or shape."""
        geo = self.geometry[group] if isinstance(group, str) else group
        n = geo.size
        if n <= 1 or nbytes <= 0:
            return 0
        bw, link = self.level(geo)
        alpha = link.latency_us * 1e3
        if comm_op == CommOp.ALL_REDUCE:
            ring = 2 * (n - 1) * alpha + nbytes * 2 * (n - 1) / n / bw
            tree = 2 * math.ceil(math.log2(n)) * alpha + nbytes * 2 * (n - 1) / n / bw
            t = min(ring, tree)
        elif comm_op in (CommOp.ALL_GATHER, CommOp.REDUCE_SCATTER, CommOp.ALL_TO_ALL):
            t = (n - 1) * alpha + nbytes * (n - 1) / n / bw
        elif comm_op in (CommOp.BROADCAST, CommOp.REDUCE):
            t = math.ceil(math.log2(n)) * alpha + nbytes / bw
        else:
            t = (n - 1) * alpha
        return int(round(link.base_us * 1e3 + t))

    def p2p_ns(self, nbytes: float, group: str = "pp") -> int:
        """Point-to-point transfer between neighbouring ranks of a group kind."""
        if nbytes <= 0:
            return 0
        geo = self.geometry[group]
        link = self.hw.intra if geo.nodes <= 1 else self.hw.inter
        if geo.datacenters > 1 and self.hw.cross_dc is not None:
            link = self.hw.cross_dc
        bw = link.gbps * link.bus_efficiency
        return int(round(link.base_us * 1e3 + link.latency_us * 1e3 + nbytes / bw))

    @staticmethod
    def busbw_gbps(comm_op: int, nbytes: float, n: int, dur_ns: float) -> float:
        """nccl-tests bus bandwidth of a measured collective (GB/s)."""
        if dur_ns <= 0 or n <= 1:
            return float("nan")
        algbw = nbytes / dur_ns
        if comm_op == CommOp.ALL_REDUCE:
            return algbw * 2 * (n - 1) / n
        if comm_op in (CommOp.ALL_GATHER, CommOp.REDUCE_SCATTER):
            return algbw * (n - 1) / n
        return algbw
