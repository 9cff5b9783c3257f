"""Kernel and communication cost models: the synthesizer's front end to the cost layer.

Compute: the cost layer's kernel model (:mod:`retime.collectors.costs.kernels`, the one
``retime cost kernel`` prints). A 16-bit GEMM ``m x n x k`` runs at ``ceiling x k / (k +
k_half) x tiles/waves`` (partial edge tiles, the last partly filled wave over ``sm_count``
SMs, split-K when the reduction is deep, smaller tiles' lower reuse, unaligned rows) or at
the HBM roofline if that is slower, plus ``kernel_overhead_us``; the ceiling is the
profile's sustained training rate (:func:`_ceiling`). Grouped expert GEMMs share the waves
of one launch. Streaming (elementwise) kernels move their bytes at the HBM rate with the
cost layer's size curve (a small kernel cannot keep enough bytes in flight), floored by the
launch/tail. FP8 / FP4 GEMMs are the cost layer's too (block-scaled inputs, NVFP4's per-call
block-scale time, and the quantization of the activation input: ``quantize``), so ``retime
cost op matmul --dtype fp8 --training`` prints what the synthesizer charges.

Communication: the cost layer's NCCL model (:mod:`retime.collectors.costs.nccl`, the one
``retime cost collective`` prints), on the cluster this hardware profile describes
(:func:`~retime.collectors.costs.cluster.cluster_from_hardware`): a collective over ``n``
ranks moving a buffer of ``S`` bytes (the full, gathered size) takes the time of the
algorithm/protocol NCCL's tuner would pick for its group shape (members per node, nodes).
Groups that cross datacenters keep the alpha-beta model over the cross-DC link (the NCCL
model has no such level): ``base + steps * alpha + S * f(n) / busbw``, ``f = 2(n-1)/n`` for
all-reduce and ``(n-1)/n`` for all-gather / reduce-scatter. Ranks are grouped by the job's NVLink domain
(:func:`~retime.collectors.synth.hardware.job_domain`), not by host: a TP or CP group spanning
trays of one rack is one NVLink-domain group for the NCCL model.

FP8 / FP4 GEMMs read block-scaled inputs (FP8: 1 byte per element; NVFP4: 4 bits plus one
E4M3 scale per 16 elements, 0.5625 bytes) and pay the quantization of their activation input:
one HBM pass reading it in 16 bits and writing the quantized copies (FP8: one; FP4: the row-
and column-wise copies the forward and the gradients use):
:data:`~retime.collectors.costs.kernels.QUANT_BYTES`.

All-to-all (mixture-of-experts dispatch and combine) and on-demand point-to-point transfers
(ODC): each member's traffic split by destination, on-node peers over the intra-node fabric
and the rest through the GPU's own NIC share, concurrently (NCCL's alltoall rates,
:func:`~retime.collectors.costs.nccl.alltoall_split_us`); a gradient push also pays the
owner's accumulation into its fp32 shard (an HBM pass). Pipeline send/receive is NCCL's
send/recv between neighbouring stages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..enums import CommOp
from .hardware import HardwareConfig, LinkConfig, job_domain
from .parallel import ParallelConfig

__all__ = ["KernelCost", "gemm", "grouped_gemm", "streaming", "GroupGeometry", "CommModel"]

#: synthesizer comm ops priced by the NCCL model (REDUCE runs like a broadcast: ring, factor 1)
_NCCL_COLL = {int(CommOp.ALL_REDUCE): "all_reduce", int(CommOp.ALL_GATHER): "all_gather",
              int(CommOp.REDUCE_SCATTER): "reduce_scatter", int(CommOp.ALL_TO_ALL): "alltoall",
              int(CommOp.BROADCAST): "broadcast", int(CommOp.REDUCE): "broadcast"}


@dataclass(frozen=True)
class KernelCost:
    """Modeled duration (ns), FLOPs and HBM bytes of one kernel."""

    dur_ns: int
    flops: float
    bytes: int


#: dtypes whose GEMMs quantize their activation input in training (block-scaled inputs)
_LOWP = ("fp8", "fp4")
_SPECS: dict[int, tuple] = {}


def _spec(hw: HardwareConfig):
    """The cost layer's :class:`~retime.collectors.costs.gpus.GpuSpec` of ``hw`` (read once
    per profile object: what-ifs hand the synthesizer modified copies)."""
    hit = _SPECS.get(id(hw))
    if hit is None or hit[0] is not hw:
        from ..costs.gpus import spec_of
        hit = (hw, spec_of(hw))
        if len(_SPECS) > 64:
            _SPECS.clear()
        _SPECS[id(hw)] = hit
    return hit[1]


def _ceiling(hw: HardwareConfig, dtype: str) -> tuple[float, str]:
    """The GEMM ceiling the synthesizer prices at: the profile's ``gemm_max`` of the dtype's
    peak (A100: 0.79 x 312 = 246 TFLOP/s), capped by the published single-GPU maximum
    achievable matmul that ``retime cost kernel`` uses (K1: 267.9 on A100;
    :meth:`~retime.collectors.costs.gpus.GpuSpec.training_ceiling`). The MAMF is measured
    on one GPU running one shape back to back, while a training step runs eight GPUs at
    their power limit with NCCL kernels sharing the SMs (the profile's ``[efficiency]
    gemm_max``, set with the synthesizer's validation bench, bench/synth_validation.py), so
    the fraction is usually the lower; where it is not (MI300X, MI250X, GB200 FP8 / FP4) the
    published figure binds. Everything else about a GEMM (k depth, tiles and waves,
    split-K, alignment, HBM roofline) is the cost layer's."""
    hw.peak_flops(dtype)  # the synthesizer's own error when the GPU lacks the dtype
    return _spec(hw).training_ceiling(dtype)


def gemm(hw: HardwareConfig, dtype: str, m: int, n: int, k: int, batch: int = 1,
         scaling: str = "fused") -> KernelCost:
    """A (batched) GEMM ``[m, k] x [k, n]`` priced by the cost layer's
    :func:`~retime.collectors.costs.kernels.matmul` at the synthesizer's ceiling
    (:func:`_ceiling`); FP8 / FP4 GEMMs read block-scaled inputs and pay the quantization of
    their activation input (``quantize``: what ``retime cost op matmul --training``
    prints); ``scaling`` is the FP8 recipe's (:data:`~retime.collectors.costs.kernels.
    FP8_SCALINGS`)."""
    from ..costs.kernels import matmul
    c = matmul(_spec(hw), max(1, int(m)), max(1, int(n)), max(1, int(k)), batch, dtype,
               ceiling=_ceiling(hw, dtype), quantize=dtype in _LOWP,
               scaling=scaling if dtype == "fp8" else "fused")
    return KernelCost(int(round(c.time_us * 1e3)), c.flops, int(c.bytes))


def grouped_gemm(hw: HardwareConfig, dtype: str, ms: list[int], n: int, k: int,
                 scaling: str = "fused") -> KernelCost:
    """One grouped GEMM launch over experts: group ``i`` is ``[m_i, k] x [k, n]`` (its own
    weight); tiles of all groups share the waves over the SMs, so a group of few tokens
    wastes its partial tiles and a hot expert's extra tiles lengthen the kernel: the cost
    layer's :func:`~retime.collectors.costs.kernels.grouped_matmul` (FP8 / FP4 with the
    quantization of the tokens' input)."""
    from ..costs.kernels import grouped_matmul
    c = grouped_matmul(_spec(hw), [int(m) for m in ms], max(1, int(n)), max(1, int(k)),
                       dtype, ceiling=_ceiling(hw, dtype), quantize=dtype in _LOWP,
                       scaling=scaling if dtype == "fp8" else "fused")
    return KernelCost(int(round(c.time_us * 1e3)), c.flops, int(c.bytes))


def streaming(hw: HardwareConfig, nbytes: float, flops: float = 0.0) -> KernelCost:
    """A memory-bound kernel moving ``nbytes`` through HBM (elementwise, norm, softmax):
    the cost layer's :func:`~retime.collectors.costs.kernels.memory_bound`."""
    from ..costs.kernels import memory_bound
    if nbytes <= 0:
        return KernelCost(int(round(hw.kernel_overhead_us * 1e3)), float(flops), 0)
    c = memory_bound(_spec(hw), "streaming", float(flops), float(nbytes))
    return KernelCost(int(round(c.time_us * 1e3)), float(flops), int(nbytes))


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
        from ..costs.cluster import cluster_from_hardware

        self.hw = hw
        self.parallel = parallel
        self.cluster = cluster_from_hardware(hw)
        self._cache: dict[tuple, int] = {}
        p = parallel
        #: the job's GPUs per NVLink domain: rank r is in domain r // domain
        self.domain = job_domain(hw, p.world_size, p.nvlink_domain)
        dp_size = p.dp * p.cp  # gradients are reduced over data x context ranks
        self.geometry = {
            "tp": self.geometry_of(p.tp, 1),
            "cp": self.geometry_of(p.cp, p.tp),
            "dp": self.geometry_of(dp_size, p.tp),
            "pp": self.geometry_of(p.pp, p.tp * p.cp * p.dp),
        }
        # expert groups of the first replica block: ep consecutive data ranks, and the
        # ranks holding the same experts (d % ep equal, every context index)
        self.geometry["ep"] = self.geometry_of_ranks(
            [d * p.cp * p.tp for d in range(p.ep)])
        self.geometry["edp"] = self.geometry_of_ranks(
            [(d * p.cp + c) * p.tp for d in range(0, p.dp, p.ep) for c in range(p.cp)])

    def geometry_of_ranks(self, ranks: list[int]) -> GroupGeometry:
        """Geometry of an explicit set of global ranks (rank r is in NVLink domain
        r // domain; "node" below is that domain)."""
        g = self.domain
        nodes: dict[int, int] = {}
        for r in ranks:
            nodes[r // g] = nodes.get(r // g, 0) + 1
        dcs = 1
        if self.hw.nodes_per_dc > 0 and self.hw.cross_dc is not None:
            dcs = len({nd // self.hw.nodes_per_dc for nd in nodes})
        return GroupGeometry(len(ranks), max(nodes.values()), len(nodes), dcs)

    def geometry_of(self, size: int, stride: int) -> GroupGeometry:
        """Geometry of ``size`` ranks spaced ``stride`` apart (Megatron layout)."""
        g = self.domain
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

    @staticmethod
    def _group(geo: GroupGeometry):
        from ..costs.nccl import Group

        return Group(geo.size, geo.per_node, geo.nodes, geo.nodes <= 1)

    def collective_ns(self, comm_op: int, nbytes: float, group: str | GroupGeometry) -> int:
        """Duration of one collective of ``nbytes`` (full buffer) on a group kind or shape:
        the NCCL model's (cost layer) within a datacenter, alpha-beta across datacenters."""
        geo = self.geometry[group] if isinstance(group, str) else group
        n = geo.size
        if n <= 1 or nbytes <= 0:
            return 0
        coll = _NCCL_COLL.get(int(comm_op))
        if geo.datacenters <= 1 and coll is not None:
            key = (coll, int(nbytes), geo)
            t = self._cache.get(key)
            if t is None:
                from ..costs.nccl import collective_cost

                t = int(round(collective_cost(self.cluster, coll, max(1, int(nbytes)),
                                              group=self._group(geo)).time_us * 1e3))
                self._cache[key] = t
            return t
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

    def all_to_all_ns(self, intra_bytes: float, inter_bytes: float,
                      group: str | GroupGeometry = "ep") -> int:
        """An all-to-all in which each member sends ``intra_bytes`` to members on its own
        node (NVLink) and ``inter_bytes`` to other nodes (its NIC share), concurrently."""
        geo = self.geometry[group] if isinstance(group, str) else group
        if geo.size <= 1 or intra_bytes + inter_bytes <= 0:
            return 0
        if geo.datacenters <= 1:
            from ..costs.nccl import alltoall_split_us

            return int(round(alltoall_split_us(self.cluster, self._group(geo), intra_bytes,
                                               inter_bytes if geo.nodes > 1 else 0.0) * 1e3))
        hw = self.hw
        t = hw.intra.base_us * 1e3 + hw.intra.latency_us * 1e3 + intra_bytes / hw.intra.bus_bytes_per_ns
        if geo.nodes > 1:
            link = hw.cross_dc if geo.datacenters > 1 and hw.cross_dc is not None else hw.inter
            t = max(t, (link.base_us + link.latency_us + hw.intra.latency_us) * 1e3
                    + inter_bytes / link.bus_bytes_per_ns)
        return int(round(t))

    def odc_ns(self, nbytes: float, group: str = "dp", accumulate: bool = False) -> int:
        """On-demand point-to-point gather (or, ``accumulate``, gradient push) of a buffer of
        ``nbytes`` (full size) sharded over a group: ``(k-1)/n`` of it over NVLink and
        ``(n-k)/n`` through the GPU's own NIC share (``k`` members per node), concurrently;
        a push adds the owner's accumulation of ``n-1`` incoming shards into fp32."""
        geo = self.geometry[group]
        n, k = geo.size, geo.per_node
        if n <= 1 or nbytes <= 0:
            return 0
        t = self.all_to_all_ns(nbytes * (k - 1) / n, nbytes * (n - k) / n, geo)
        if accumulate:  # read each incoming 16-bit shard, read-modify-write the fp32 shard
            t += int(nbytes * (n - 1) / n / 2 * (2 + 8)
                     / (self.hw.hbm_gbps * self.hw.memory_efficiency))
        return t

    def p2p_ns(self, nbytes: float, group: str = "pp") -> int:
        """Point-to-point transfer between neighbouring ranks of a group kind."""
        if nbytes <= 0:
            return 0
        geo = self.geometry[group]
        if geo.datacenters <= 1 or self.hw.cross_dc is None:
            from ..costs.nccl import Group, collective_cost

            # neighbouring stages: same node when the stage stride fits in a node
            same = geo.nodes <= 1 or geo.per_node > 1
            g = Group(2, 2 if same else 1, 1 if same else 2, same)
            return int(round(collective_cost(self.cluster, "sendrecv", max(1, int(nbytes)),
                                             group=g).time_us * 1e3))
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
