"""NCCL model, part 1: the rates. The collective, algorithm and protocol names, how ranks group
by NVLink domain, nccl-tests' bus factors, the per-GPU link rates of a cluster (intra-node,
network, channels), the algorithms and protocols NCCL would consider, and each one's bus and
algorithm bandwidth (NVLS by domain size, NVLS-tree's network leg, point-to-point LL and Simple).
Latency, pipeline fill, the choice and the public entry points are in :mod:`nccl`, which
re-exports these names; see its docstring for the model as a whole and ``REFERENCES.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from ..errors import ConfigError
from . import nccl_params as P
from .cluster import Cluster

__all__ = ["Collective", "Algo", "Proto", "Group", "bus_factor", "group_of", "efficiencies",
           "nvls_eff", "nvls_algbw", "nvls_gather_algbw", "nvls_hop_us", "nvls_channels",
           "nvls_heads", "nvls_tree_net", "p2p_channels", "p2p_ll_rate"]


class Collective(str, Enum):
    all_reduce = "all_reduce"
    all_gather = "all_gather"
    reduce_scatter = "reduce_scatter"
    alltoall = "alltoall"
    broadcast = "broadcast"
    sendrecv = "sendrecv"


class Algo(str, Enum):
    ring = "ring"
    tree = "tree"
    nvls = "nvls"
    nvls_tree = "nvls_tree"
    collnet = "collnet"
    p2p = "p2p"  # alltoall and send/recv: grouped point-to-point, no algorithm choice


class Proto(str, Enum):
    ll = "LL"
    ll128 = "LL128"
    simple = "Simple"


@dataclass(frozen=True)
class Group:
    """Ranks of one collective on the cluster: total, per NVLink domain (``per_node``),
    domains (``nodes``; a domain is one node except on multi-node NVLink racks); ``domain``:
    whether all ranks share one NVLink domain (no network hop)."""

    ranks: int
    per_node: int
    nodes: int
    domain: bool


def group_of(cluster: Cluster, ranks: int | None = None) -> Group:
    """The group of ``ranks`` consecutive ranks (default: the whole cluster), grouped by
    NVLink domain, not by node: NCCL treats the GPUs of one multi-node NVLink domain (an
    MNNVL clique, e.g. the 72 GPUs of a GB200 NVL72 rack) as one node (C16), so ``per_node``
    is the ranks per domain and ``nodes`` the domains the group spans."""
    n = cluster.world_size if ranks is None else ranks
    if n < 2:
        raise ConfigError(f"a collective needs at least 2 ranks; the cluster has {n} "
                          f"({cluster.gpus_per_node} GPUs per node x {cluster.nodes} nodes); "
                          "raise --nodes or --gpus-per-node")
    per_node = min(n, cluster.nvlink_domain)
    nodes = math.ceil(n / per_node)
    return Group(n, per_node, nodes, nodes == 1)


def bus_factor(coll: Collective, n: int) -> float:
    """nccl-tests' busbw / algbw factor (doc/PERFORMANCE.md, REFERENCES.md C8)."""
    if coll == Collective.all_reduce:
        return 2.0 * (n - 1) / n
    if coll in (Collective.all_gather, Collective.reduce_scatter, Collective.alltoall):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class _Links:
    """Achievable per-GPU rates (GB/s) of one cluster, with the params behind them."""

    intra: float
    intra_p: P.Param
    net_node: float  # per node, over the NICs the group's ranks use
    net_gpu: float  # one GPU's own NIC share
    net_p: P.Param
    channels: int
    hop: str  # "nvlink" | "pcie"


def efficiencies(c: Cluster) -> tuple[P.Param, P.Param]:
    """(intra-node link, NIC) efficiency parameters: the cluster's stated values where it
    has them, else the cited ones per link generation / fabric."""
    ip = P.LINK_EFF[c.intra_generation] if c.intra_eff is None \
        else P.Param(c.intra_eff, "stated", "cluster [intra_node] efficiency")
    npar = P.NET_EFF[c.net_fabric] if c.net_eff is None \
        else P.Param(c.net_eff, "stated", "cluster [network] efficiency")
    return ip, npar


def nvls_eff(c: Cluster) -> P.Param:
    """NVLS algorithm bandwidth / nominal NVLink rate for the cluster's NVLink generation,
    as measured on :data:`nccl_params.NVLS_REF_RANKS` ranks (see :func:`nvls_algbw`)."""
    return P.NVLS_EFF.get(c.intra_generation, P.NVLS_EFF["nvlink4"])


def nvls_algbw(c: Cluster, k: int) -> float:
    """NVLS all-reduce algorithm bandwidth (GB/s) of ``k`` ranks in one NVLink domain.

    Each of the k heads reduces 1/k of the buffer with one multicast load-reduce (the switch
    reads that slice from every GPU: S out of each GPU over the k heads) and stores the result
    with one multicast store (S/k out of the head, S into every GPU): every GPU sends and
    receives ``S (1 + 1/k)``, so the rate is the link's x ``k / (k + 1)`` (C21: 5 -> 8 H100
    reach 258 -> 273 GB/s algbw, the ratio this gives within 1%). The generation's efficiency
    was measured at ``NVLS_REF_RANKS`` ranks and is carried to ``k`` by that ratio."""
    ref = P.NVLS_REF_RANKS.get(c.intra_generation, P.NVLS_REF_RANKS["nvlink4"])
    return c.intra_gbps * nvls_eff(c).value * (k / (k + 1)) / (ref / (ref + 1))


def nvls_gather_algbw(c: Cluster, k: int) -> float:
    """NVLS all-gather / reduce-scatter algorithm bandwidth (GB/s; of the full gathered buffer
    S) of ``k`` ranks in one NVLink domain (C39). An all-gather rank multicast-stores its S/k
    once and the switch writes it into every GPU, so each GPU receives S; a reduce-scatter head
    load-reduces its slice from every GPU, so each GPU sends S. Either way one direction of
    each GPU's links carries S, where the all-reduce carries S (1 + 1/k) both ways
    (:func:`nvls_algbw`): the same multicast link rate, ``(k + 1) / k`` times the all-reduce's
    algorithm bandwidth. Nothing fitted: the rate is the all-reduce's (``NVLS_EFF``)."""
    return nvls_algbw(c, k) * (k + 1) / k


def nvls_hop_us(k: int) -> float:
    """NVLS per-step latency (us) of a domain of ``k`` ranks: NCCL's per-hop figure (C0, its
    8-GPU NVSwitch systems') moved by ``NVLS_HEAD_US`` per head more or fewer (C21: the
    scatter and gather of every step loop over the domain's heads one after another)."""
    base = P.HOP_LAT_US["nvlink"]["nvls"][2]
    return max(0.0, base + P.NVLS_HEAD_US.value * (k - P.NVLS_REF_HEADS))


def nvls_heads(g: Group) -> int:
    """NVLS heads NCCL runs in one NVLink domain: one per rank of the domain, at most
    ``NCCL_MAX_NVLS_ARITY`` (32; NCCL's NVLS graph search, C25)."""
    return max(1, min(int(P.NVLS_MAX_ARITY.value), g.per_node))


def nvls_tree_net(c: Cluster, g: Group) -> float:
    """GB/s per direction the NVLS-tree's network leg of one NVLink domain moves: each NVLS
    head sends and receives its slice through its own NIC (C25), so a domain uses
    ``min(heads, its NICs)`` NICs, not the two channels per NIC of a ring leaving the domain
    (``_links``): on a 64-GPU NVL72 rack with one NIC per GPU, 32 NICs rather than 16."""
    if not c.nics_per_node:
        return 0.0
    _, npar = efficiencies(c)
    dom_nics = g.per_node * c.nics_per_node / c.gpus_per_node
    return min(float(nvls_heads(g)), dom_nics) * c.nic_gbps * npar.value


def nvls_channels(c: Cluster, g: Group, measured: int | None = None) -> int:
    """NVLS channels (one CTA each) NCCL runs: 16 on Hopper; on Blackwell 24 inside one NVLink
    domain and 32 across domains (NCCL ``NVLS_NCHANNELS_SM*``, C16); ``measured`` (a trace's
    NCCL kernel grid) replaces the table."""
    if measured:
        return int(measured)
    if c.spec.arch == "blackwell":
        return 24 if g.nodes == 1 else 32
    return 16


def _links(c: Cluster, g: Group, measured: int | None = None) -> _Links:
    ip, npar = efficiencies(c)
    nic = c.nic_gbps * npar.value
    per_gpu_nics = c.nics_per_node / c.gpus_per_node
    ch = P.CHANNELS.get((c.intra_fabric, c.spec.arch)) or P.CHANNELS.get((c.intra_fabric, None)) \
        or P.CHANNELS[("nvswitch", "hopper")]
    channels = int(measured) if measured else int(ch.value)
    # the NICs of the group's ranks in one NVLink domain (a GB200 NVL72 rack: one per GPU)
    dom_nics = g.per_node * per_gpu_nics
    if g.nodes > 1 and not g.domain and c.nics_per_node:
        # rings leaving the domain are built per NIC (two channels each), not per NVLink;
        # so at most channels / 2 of the domain's NICs carry them. NCCL doubles a ring into
        # two channels only where a channel runs at 25 GB/s or more (ncclTopoDupChannels,
        # C32): on slower NICs (a channel is at most one NIC) each NIC carries one channel
        per_nic = 2.0 if c.nic_gbps >= P.DUP_MIN_GBPS.value else 1.0
        if not measured:
            channels = max(2, min(channels, int(round(per_nic * dom_nics))))
        dom_nics = min(dom_nics, channels / per_nic)
    # point-to-point traffic (alltoall, send/recv) leaves through the GPU's own NIC: a share
    # of one where GPUs share NICs, never more than one where a GPU has several (C4:
    # "Alltoall cannot aggregate the bandwidth of multiple NICs")
    p2p_nics = min(max(per_gpu_nics, 1.0 / c.gpus_per_node), 1.0)
    return _Links(intra=c.intra_gbps * ip.value, intra_p=ip,
                  net_node=dom_nics * nic if c.nics_per_node else 0.0,
                  net_gpu=p2p_nics * nic, net_p=npar,
                  channels=channels, hop="nvlink" if c.intra_fabric == "nvswitch" else "pcie")


def _enabled(c: Cluster, g: Group, coll: Collective) -> list[tuple[Algo, Proto]]:
    """(algorithm, protocol) pairs NCCL would consider for this collective and cluster."""
    if coll in (Collective.alltoall, Collective.sendrecv):
        # NCCL picks LL or Simple by message size (:func:`_p2p_ll`), not by the tuner; LL
        # only where every peer is reached over NVLink (C24)
        ll = c.intra_fabric == "nvswitch" and (g.domain or g.nodes == 1)
        return ([(Algo.p2p, Proto.ll)] if ll else []) + [(Algo.p2p, Proto.simple)]
    nvidia_nvlink = c.intra_fabric == "nvswitch"
    protos = [Proto.ll, Proto.simple] + ([Proto.ll128] if nvidia_nvlink else [])
    out = [(Algo.ring, p) for p in protos]
    if coll == Collective.all_reduce:
        if g.nodes > 1 and not g.domain:
            out += [(Algo.tree, p) for p in protos]
            if c.nvls and g.per_node > 1:
                out.append((Algo.nvls_tree, Proto.simple))
            if c.sharp:
                out.append((Algo.collnet, Proto.simple))
    if coll in (Collective.all_reduce, Collective.all_gather, Collective.reduce_scatter) \
            and c.nvls and g.domain:
        # NVLS inside one NVLink domain, also one spanning trays (MNNVL, e.g. NVL72): NCCL
        # >= 2.25 counts an MNNVL clique as one node and enables NVLS there (C16; 2.19's
        # "MNNVL: NVLS not yet supported" of C0 is gone). All-gather and reduce-scatter run
        # NVLS too, on one node only (across nodes only with CollNet; C39)
        out.append((Algo.nvls, Proto.simple))
    return out


def _busbw(c: Cluster, g: Group, L: _Links, coll: Collective, a: Algo, p: Proto) -> float:
    """NCCL-style bus bandwidth (GB/s) of one algorithm/protocol, before conversion."""
    cross = g.nodes > 1 and not g.domain
    ring_bw = min(L.intra, L.net_node) if cross else L.intra
    if g.per_node == 1 and cross:
        ring_bw = L.net_node
    if a == Algo.ring:
        bw = ring_bw
    elif a == Algo.tree:
        bw = min(L.intra, L.net_node) * P.TREE_EFF.value
    elif a == Algo.collnet:  # in-network reduction: each node sends and receives S once
        bw = min(L.intra, L.net_node) * 0.9
    else:
        bw = ring_bw
    if p == Proto.ll:
        llmax = P.LL_MAX_BUSBW[c.spec.arch if not cross else
                               ("nodes2" if g.nodes == 2 else "nodes3+")]
        quarter = cross or coll == Collective.all_reduce
        if a == Algo.tree:
            bw = min(llmax, bw / 3.8)
        elif c.spec.arch in P.LL_HALF_ARCHS:  # NCCL >= 2.23 tuner: ring LL at half the rate
            bw = min(llmax, bw * 0.5)
        else:
            bw = min(llmax, bw / (4.0 if quarter else 3.0))
    elif p == Proto.ll128:
        eff = 0.7 if g.per_node < 2 else 0.92
        if a == Algo.tree:
            eff = 7.0 / 9.0 if g.nodes == 1 else 120.0 / 128.0
        bw = min(bw * eff, L.channels * P.LL128_PER_CHANNEL[c.spec.arch])
    return bw


def _algbw(c: Cluster, g: Group, L: _Links, coll: Collective, a: Algo, p: Proto) -> float:
    """Algorithm bandwidth (GB/s): bytes / time in the bandwidth-bound limit."""
    n = g.ranks
    if a == Algo.nvls:
        if coll == Collective.all_reduce:
            return nvls_algbw(c, g.per_node)
        return nvls_gather_algbw(c, g.per_node)
    if a == Algo.nvls_tree:  # NVLS inside each node, a tree of nodes over the heads' NICs
        # each domain's network leg carries S per direction on 2 domains (each is the root of
        # one of the two trees and a leaf of the other), 2S on more (NCCL's tuning.cc:
        # ``nNodes <= 2 ? bwInter : bwInter/2``; REFERENCES.md C30)
        legs = 1.0 if g.nodes <= 2 else 2.0
        return min(nvls_algbw(c, g.per_node), nvls_tree_net(c, g) / legs * P.TREE_EFF.value)
    if a in (Algo.tree, Algo.collnet):
        # a double binary tree (or the switch's reduction tree) moves the buffer up and down
        # once: each link direction carries S, so algbw is half the bus rate (NCCL's .5)
        return _busbw(c, g, L, coll, a, p) / 2.0
    if a == Algo.p2p:
        if p == Proto.ll:
            rate = p2p_ll_rate(c, g, L)
            return rate if coll == Collective.sendrecv else rate / ((n - 1) / n)
        return _p2p_algbw(g, L, coll)
    return _busbw(c, g, L, coll, a, p) / bus_factor(coll, n)


def p2p_channels(L: _Links) -> tuple[int, int]:
    """(p2pnChannels, p2pnChannelsPerPeer) as NCCL's init sets them inside an NVSwitch domain
    (C24): the collective channel count rounded up to a power of two; the per-peer count is
    the least any peer allows, rounded up and capped at p2pnChannels, and an NVSwitch peer
    allows at least as many, so both are equal (32 and 32 with 24 or 32 collective channels)."""
    n = 1 << (max(1, L.channels) - 1).bit_length()
    return n, n


def _p2p_ll(c: Cluster, g: Group, L: _Links, coll: Collective, nbytes: float) -> bool:
    """Whether NCCL moves these point-to-point messages with LL (C24, NCCL 2.27
    ``addP2pToPlan``): where every peer is over NVLink, when a peer's message is at most
    ``p2pnChannelsPerPeer x NCCL_P2P_LL_THRESHOLD`` (32 x 16 KiB = 512 KiB)."""
    if (Algo.p2p, Proto.ll) not in _enabled(c, g, coll):
        return False
    per_peer = nbytes if coll == Collective.sendrecv else nbytes / g.ranks
    return per_peer <= p2p_channels(L)[1] * P.P2P_LL_THRESHOLD.value


def p2p_ll_rate(c: Cluster, g: Group, L: _Links) -> float:
    """GB/s one GPU sends to its peers with LL point-to-point (C24): the
    channels busy (each peer on ``nChannelsMin`` of them, halved from p2pnChannelsPerPeer
    until ``nChannelsMin x ranks <= p2pnChannels``; at most p2pnChannels in all) x half a ring
    LL channel's rate (the model's ring LL bus rate / its channels): the p2p kernel gives half
    of a channel's warps to the sends and half to the receives (``sendrecv.h``)."""
    n_p2p, ch_min = p2p_channels(L)
    while ch_min * g.ranks > n_p2p and ch_min > 1:
        ch_min //= 2
    busy = min(n_p2p, (g.ranks - 1) * ch_min)
    ring_ll = _busbw(c, g, L, Collective.alltoall, Algo.ring, Proto.ll)
    return busy * ring_ll / L.channels / 2.0


def _p2p_algbw(g: Group, L: _Links, coll: Collective) -> float:
    """alltoall / send-recv: on-node peers over the intra fabric, the rest over the GPU's own
    NIC share (an alltoall cannot spread one GPU's traffic over the node's other NICs, C4)."""
    n, k = g.ranks, g.per_node
    intra = L.intra * P.P2P_EFF.value
    if coll == Collective.sendrecv:
        return intra if g.nodes == 1 or g.domain else L.net_gpu
    if g.domain or g.nodes == 1:
        return intra / ((n - 1) / n)
    t_intra = (k - 1) / n / intra
    t_net = (n - k) / n / L.net_gpu
    return 1.0 / max(t_intra, t_net)
