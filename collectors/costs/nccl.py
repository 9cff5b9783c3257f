"""NCCL collective cost model.

Structure follows NCCL's public tuning model (``src/graph/tuning.cc``; ideas and numbers, see
``REFERENCES.md`` C0): for each algorithm (ring, tree, NVLS, NVLS-tree, CollNet) and protocol
(LL, LL128, Simple) a latency ``base[algo][proto] + hops x hop[level][algo][proto]`` and a
bus bandwidth (link rate x channels, cut by the protocol's efficiency and per-channel
ceilings), converted to an algorithm bandwidth. The algorithm/protocol NCCL's tuner would
pick is the one with the least ``latency + bytes / algbw``; ``--algo``/``--proto`` force one
as ``NCCL_ALGO``/``NCCL_PROTO`` do.

Where this model departs from the tuner (it predicts wall-clock time, the tuner only ranks):

* link rates are the cluster's nominal figures x a per-generation efficiency
  (:mod:`nccl_params`), so a user states what the datasheet says;
* a pipeline-fill term: a Simple/LL128 ring moves each channel's data in chunks, and the
  first chunk must cross the whole ring before the pipeline runs full, which costs one more
  traversal of the data in flight, ``I = n x channels x chunk``, or of the whole message
  when it is smaller (this is why bus bandwidth keeps rising up to hundreds of MB); NVLS's
  in-flight data is ranks x NVLS channels x NCCL's 128 KiB NVLS chunk (16 MiB on 8 H100,
  216 MiB on a 72-GPU NVL72 rack). The pass is a soft minimum of S and I,
  ``S I / sqrt(S^2 + I^2)`` (:func:`fill_bytes`), not ``min(S, I)``: NCCL does not switch
  from "one partial loop" to "whole chunks" at one size; it shrinks the chunk in halving
  steps as the message shrinks (NVLS 128 -> 64 -> 32 -> 16 KiB at 64x, 8x and 2x the
  concurrent ops' chunk bytes, ``src/enqueue.cc``, C16), and the last of several loops is a
  remainder, so the in-flight data moves through a staircase whose envelope has no corner.
  The hard corner put both fit series' worst rows at S = I (C7 16 MB, C1 4-8 MB). A ring
  that leaves its NVLink domain fills its NVLink hops at the NVLink rate and only its network
  hops at the bottleneck (:func:`ring_fill_weight`: a pipeline fills in the sum of its
  stages' times);
* a fixed per-call cost (launch, completion), and inside one NVLink domain a ring LL128
  collective pays LL's base latency, not the table's LL128 figure, which NCCL raised from LL's
  (2.5) to 14 us (2.18+) to rank protocols (C22; the tuner still ranks with 14);
* NVLS by domain size (C21): the rate of k ranks goes as k/(k+1) (every GPU sends and
  receives S (1 + 1/k) through the switch), carried from the size each generation's rate was
  measured on; the latency pays NVLS_HEAD_US per head beyond NCCL's 8 (each step's scatter and
  gather visit the heads in turn). NCCL's tuner ranks with its table's NVLS latency whatever
  k, so the choice of algorithm uses the table and only the predicted time pays the heads.

Ranks are grouped by NVLink domain, not by host: NCCL treats a multi-node NVLink domain (the
72 GPUs of a GB200 NVL72 rack) as one node and runs NVLS inside it; only traffic between
domains uses the NICs. A trace's measured channel count (its NCCL kernels' launch grid) can
replace the model's channel table (``channels=``).

Sizes follow nccl-tests: ``nbytes`` is the all-reduce buffer, the full gathered buffer of an
all-gather / reduce-scatter, each rank's send buffer of an alltoall, the broadcast buffer and
the message of a send/recv. Bus bandwidth uses nccl-tests' factors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from ..errors import ConfigError
from . import nccl_params as P
from .cluster import Cluster

__all__ = ["Collective", "Algo", "Proto", "CollectiveCost", "Group", "collective_cost",
           "bus_factor", "group_of", "alltoall_split_us", "efficiencies", "nvls_eff",
           "nvls_algbw", "nvls_hop_us", "nvls_channels", "nvls_heads", "nvls_tree_net",
           "fill_bytes", "p2p_channels", "p2p_ll_rate", "ring_fill_weight"]


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


_PROTO_IDX = {Proto.ll: 0, Proto.ll128: 1, Proto.simple: 2}


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
class CollectiveCost:
    """One priced collective: time (us), bandwidths (GB/s), the choice and a range."""

    collective: str
    nbytes: int
    ranks: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    algorithm: str
    protocol: str
    channels: int
    range_us: tuple[float, float]
    latency_us: float
    bandwidth_gbps: float  # the algorithm bandwidth the time used (before pipeline fill)
    sources: tuple[str, ...]

    def to_row(self) -> dict:
        return {"bytes": self.nbytes, "time_us": round(self.time_us, 3),
                "algbw_gbps": round(self.algbw_gbps, 3), "busbw_gbps": round(self.busbw_gbps, 3),
                "algorithm": self.algorithm, "protocol": self.protocol,
                "channels": self.channels,
                "range_us": [round(self.range_us[0], 3), round(self.range_us[1], 3)]}


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
        if c.nvls and g.domain:
            # NVLS inside one NVLink domain, also one spanning trays (MNNVL, e.g. NVL72): NCCL
            # >= 2.25 counts an MNNVL clique as one node and enables NVLS there (C16; 2.19's
            # "MNNVL: NVLS not yet supported" of C0 is gone)
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
        return nvls_algbw(c, g.per_node)
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


def _latency_us(c: Cluster, g: Group, coll: Collective, a: Algo, p: Proto,
                tuner: bool = False) -> float:
    """NCCL's latency structure: base + intra hops x intra latency + inter hops x net latency.
    ``tuner``: as NCCL's tuner ranks algorithms, with its table's NVLS figure for every
    domain size (the per-head cost of :func:`nvls_hop_us` is paid in time, not ranked)."""
    i = _PROTO_IDX[p]
    hop = "nvlink" if c.intra_fabric == "nvswitch" else "pcie"
    cross = g.nodes > 1 and not g.domain
    n, k, nodes = g.ranks, g.per_node, (g.nodes if cross else 1)
    if a == Algo.p2p:  # the ring columns of the table, for the protocol run (LL or Simple)
        key = "ring"
        intra = P.HOP_LAT_US[hop][key][i] if c.intra_hop_us is None else c.intra_hop_us
        inter = P.HOP_LAT_US["net"][key][i] if c.net_hop_us is None else c.net_hop_us
        peers_far = n - k if cross else 0
        steps = 1 if coll == Collective.sendrecv else math.ceil(math.log2(n))
        return P.BASE_LAT_US["ring"][i] + steps * (inter if peers_far else intra)
    base = P.BASE_LAT_US[a.value][i]
    if a == Algo.ring and p == Proto.ll128 and not cross and not tuner:
        base = P.LL128_WALL_BASE_US.value  # the table's 14 us ranks; time pays LL's (C22)
    intra = P.HOP_LAT_US[hop][a.value][i] if c.intra_hop_us is None else c.intra_hop_us
    if a in (Algo.nvls, Algo.nvls_tree) and c.intra_hop_us is None and not tuner:
        intra = nvls_hop_us(k)
    inter = P.HOP_LAT_US["net"][a.value][i] if c.net_hop_us is None else c.net_hop_us
    if a == Algo.ring:
        if coll == Collective.all_reduce:
            steps, inter_steps = 2 * (n - 1), (2 * nodes if nodes > 1 else 0)
        elif coll == Collective.broadcast:
            steps, inter_steps = n - 1, nodes - 1
        else:
            steps, inter_steps = n - 1, nodes - 1
        if nodes > 1:  # inter-node rings still post each step to the NIC proxy (~1-3 us)
            intra = max(intra, 3.0 if p == Proto.simple else 1.0)
        return base + (steps - inter_steps) * intra + inter_steps * inter
    if a == Algo.tree:
        return base + 2 * ((k - 1) * intra + math.log2(nodes) * inter)
    if a == Algo.nvls:
        return base + intra + (inter if cross else 0.0)
    if a == Algo.nvls_tree:
        return base + intra + 2 * math.log2(nodes) * inter
    return base + 2 * (k - 1) * 0.4 + 2 * min(1, k - 1) * intra + inter  # collnet direct


def fill_bytes(nbytes: float, inflight: float) -> float:
    """Bytes of the pipeline-fill pass: the soft minimum ``S I / sqrt(S^2 + I^2)`` of the
    message ``S`` and the data in flight ``I`` (``min(S, I)`` far from ``S = I``, ``I / sqrt 2``
    at it; see the module docstring for why the corner is soft)."""
    return nbytes * inflight / math.hypot(nbytes, inflight)


def _fill_us(c: Cluster, g: Group, L: _Links, coll: Collective, a: Algo, p: Proto,
             nbytes: float, algbw: float, measured: int | None = None) -> float:
    """Pipeline fill: one more traversal of the in-flight data (see the module docstring)."""
    if p == Proto.ll or a == Algo.p2p:
        return 0.0
    if a in (Algo.nvls, Algo.nvls_tree):
        # NVLS moves NVLS_CHUNK per channel per rank of the domain in each step: that much is
        # in flight before the pipeline runs full (8 H100 x 16 x 128 KiB = 16 MiB)
        inflight = g.per_node * nvls_channels(c, g, measured) * P.NVLS_CHUNK_BYTES.value
        if a == Algo.nvls_tree:  # the tree's pipeline spans every domain's heads (C30)
            inflight *= g.nodes
        return P.NVLS_FILL.value * fill_bytes(nbytes, inflight) / (algbw * 1e3)
    inflight = g.ranks * L.channels * P.CHUNK_BYTES.value
    if a == Algo.ring:
        inflight *= ring_fill_weight(g, L)
    return fill_bytes(nbytes, inflight) / (algbw * 1e3)


def ring_fill_weight(g: Group, L: _Links) -> float:
    """Share of the ring's data in flight that the fill pass pays at the ring's bottleneck
    rate. The first chunk of a channel crosses the ring hop by hop, each hop at its own link's
    rate (a pipeline fills in the sum of its stages' times, not in stages x the slowest one):
    a ring leaving its NVLink domain has one network hop per domain and NVLink hops for the
    rest, so where the NICs are the bottleneck the NVLink hops fill faster, in
    ``bottleneck / NVLink rate`` of the time. 1 for a ring inside one domain (every hop alike)
    and for one GPU per domain (every hop on the network)."""
    if g.nodes < 2 or g.domain or g.per_node < 2 or L.net_node <= 0:
        return 1.0
    slow = min(L.intra, L.net_node)
    net_hops = g.nodes
    return ((g.ranks - net_hops) * slow / L.intra + net_hops * slow / L.net_node) / g.ranks


def _time(c, g, L, coll, a, p, nbytes, measured=None) -> tuple[float, float, float, float]:
    """(tuner time, predicted time, latency, algbw) in us / GB/s."""
    bw = _algbw(c, g, L, coll, a, p)
    if bw <= 0:
        return math.inf, math.inf, 0.0, 0.0
    lat = _latency_us(c, g, coll, a, p)
    t_tuner = _latency_us(c, g, coll, a, p, tuner=True) + nbytes / (bw * 1e3)
    t = P.CALL_US.value + lat + nbytes / (bw * 1e3) \
        + _fill_us(c, g, L, coll, a, p, nbytes, bw, measured)
    return t_tuner, t, lat, bw


def _range(c: Cluster, g: Group, L: _Links, a: Algo, t: float, lat: float) -> tuple[float, float]:
    """Range from the sources of the parameters this prediction used: latency terms are
    'assumed' (the tuner's tables as wall-clock time), bandwidth terms carry the link
    efficiency's and (off-node) the NIC efficiency's uncertainty."""
    lat_part = lat + P.CALL_US.value
    bw_part = max(t - lat_part, 0.0)
    rels = [L.intra_p.rel]
    if g.nodes > 1 and not g.domain:
        rels.append(L.net_p.rel)
    if a in (Algo.nvls, Algo.nvls_tree):
        rels.append(nvls_eff(c).rel)
    if a == Algo.p2p:
        rels.append(P.P2P_EFF.rel)
    rb = math.sqrt(sum(r * r for r in rels)) + P.CHUNK_BYTES.rel * 0.5
    rl = P.LATENCY.rel * 2
    return (lat_part * (1 - rl * 0.6) + bw_part * (1 - rb) / 1.0,
            lat_part * (1 + rl) + bw_part * (1 + rb))


def collective_cost(cluster: Cluster, collective: str | Collective, nbytes: int,
                    ranks: int | None = None, algo: str | None = None,
                    proto: str | None = None, group: Group | None = None,
                    channels: int | None = None) -> CollectiveCost:
    """Predict one collective of ``nbytes`` (nccl-tests size) over ``ranks`` ranks of
    ``cluster`` (default all; or an explicit ``group`` shape, as the synthesizer's parallel
    groups are), optionally forcing the algorithm / protocol. ``channels``: the channel count
    NCCL ran with where a trace measured it (its kernels' launch grid, one CTA per channel);
    it replaces the model's table (per-channel LL128 ceiling, data in flight, NICs reached).

    Raises ConfigError for a group of one rank, a size below 1 byte, or a forced algorithm
    the cluster cannot run (NVLS without NVLink SHARP, CollNet without SHARP, ...).
    """
    coll = Collective(collective)
    if nbytes < 1:
        raise ConfigError(f"message size {nbytes} bytes: must be >= 1")
    if group is not None and group.ranks < 2:
        raise ConfigError(f"a collective needs at least 2 ranks; the group has {group.ranks}")
    g = group if group is not None else group_of(cluster, ranks)
    if coll == Collective.sendrecv:
        g = Group(2, 2 if g.per_node > 1 else 1, 1 if g.per_node > 1 else 2,
                  g.per_node > 1 or g.domain)
    if channels is not None and channels < 1:
        raise ConfigError(f"channels={channels}: a collective runs on at least one channel")
    L = _links(cluster, g, channels)
    cands = _enabled(cluster, g, coll)
    if algo is not None:
        want = Algo(algo.lower())
        picked = [(a, p) for a, p in cands if a == want]
        if not picked:
            raise ConfigError(_why_not(cluster, g, coll, want))
        cands = picked
    if proto is not None:
        wantp = {q.value.lower(): q for q in Proto}.get(proto.lower())
        if wantp is None:
            raise ConfigError(f"--proto {proto!r}: choose LL, LL128 or Simple")
        picked = [(a, p) for a, p in cands if p == wantp]
        if not picked:
            raise ConfigError(f"--proto {wantp.value}: not available for {coll.value} with "
                              f"{', '.join(sorted({a.value for a, _ in cands}))} on "
                              f"{cluster.intra_fabric} (LL128 needs NVLink; NVLS and CollNet run "
                              "Simple only; point-to-point runs LL or Simple, LL only where "
                              "every peer is over NVLink)")
        cands = picked
    if cands[0][0] == Algo.p2p and len(cands) == 2:  # NCCL's size rule, not the tuner (C24)
        cands = cands[:1] if _p2p_ll(cluster, g, L, coll, nbytes) else cands[1:]
    best = None
    for a, p in cands:
        tt, t, lat, bw = _time(cluster, g, L, coll, a, p, nbytes, channels)
        if best is None or tt < best[0]:
            best = (tt, t, lat, bw, a, p)
    _, t, lat, bw, a, p = best
    algbw = nbytes / (t * 1e3)
    lo, hi = _range(cluster, g, L, a, t, lat)
    srcs = (f"intra {cluster.intra_generation} x {L.intra_p.value} ({L.intra_p.source}: "
            f"{L.intra_p.ref})",)
    if g.nodes > 1 and not g.domain:
        srcs += (f"network {cluster.net_fabric} x {L.net_p.value} ({L.net_p.source}: "
                 f"{L.net_p.ref})",)
    if channels:
        srcs += (f"{int(channels)} channels (measured: the trace's NCCL kernel grid)",)
    return CollectiveCost(coll.value, int(nbytes), g.ranks, t, algbw,
                          algbw * bus_factor(coll, g.ranks), a.value, p.value,
                          L.channels if a not in (Algo.nvls, Algo.nvls_tree)
                          else nvls_channels(cluster, g, channels),
                          (lo, hi), lat + P.CALL_US.value, bw, srcs)


def _why_not(c: Cluster, g: Group, coll: Collective, want: Algo) -> str:
    if want == Algo.nvls and c.nvls and g.nodes > 1:
        return (f"--algo nvls: the group spans {g.nodes} NVLink domains; NVLS runs inside one "
                "domain (across domains NCCL uses NVLS-tree, tree or ring)")
    if want in (Algo.nvls, Algo.nvls_tree) and not c.nvls:
        return (f"--algo {want.value}: NVLS needs NVLink SHARP (Hopper or newer GPUs on "
                f"NVSwitch3+); cluster {c.name} ({c.gpu}, {c.intra_fabric}) has nvls = false")
    if want == Algo.collnet and not c.sharp:
        return (f"--algo collnet: needs SHARP in-network reduction; cluster {c.name} has "
                "sharp = false")
    if coll != Collective.all_reduce and want != Algo.ring:
        return (f"--algo {want.value}: NCCL runs {coll.value} with the ring algorithm only "
                "(alltoall and send/recv are point-to-point)")
    return (f"--algo {want.value}: not used for {coll.value} on {g.ranks} ranks in "
            f"{g.nodes} node(s) of {c.name} (tree, NVLS-tree and CollNet need several nodes; "
            "NVLS needs one NVLink domain)")


def alltoall_split_us(cluster: Cluster, group: Group, intra_bytes: float,
                      inter_bytes: float) -> float:
    """An alltoall whose per-rank traffic is given split by destination (mixture-of-experts
    dispatch with uneven routing): ``intra_bytes`` to peers in the rank's NVLink domain,
    ``inter_bytes`` to the others through the GPU's own NIC share, concurrently; the same
    rates, latency and per-call cost as :func:`collective_cost`'s alltoall."""
    L = _links(cluster, group)
    # LL where every peer is over NVLink and a peer's share is small (C24), as collective_cost
    per_peer = intra_bytes / max(1, group.per_node - 1) * group.ranks
    ll = inter_bytes <= 0 and _p2p_ll(cluster, group, L, Collective.alltoall, per_peer)
    intra = p2p_ll_rate(cluster, group, L) if ll else L.intra * P.P2P_EFF.value
    t = max(intra_bytes / (intra * 1e3) if intra_bytes > 0 else 0.0,
            inter_bytes / (L.net_gpu * 1e3) if inter_bytes > 0 and L.net_gpu > 0 else 0.0)
    return P.CALL_US.value + _latency_us(cluster, group, Collective.alltoall, Algo.p2p,
                                         Proto.ll if ll else Proto.simple) + t
