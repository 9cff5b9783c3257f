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
  All-gather and reduce-scatter run NVLS too, inside one NVLink domain only: one direction of
  each GPU's links carries the whole buffer, at the all-reduce's multicast rate (C39).

Ranks are grouped by NVLink domain, not by host: NCCL treats a multi-node NVLink domain (the
72 GPUs of a GB200 NVL72 rack) as one node and runs NVLS inside it; only traffic between
domains uses the NICs. A trace's measured channel count (its NCCL kernels' launch grid) can
replace the model's channel table (``channels=``).

Sizes follow nccl-tests: ``nbytes`` is the all-reduce buffer, the full gathered buffer of an
all-gather / reduce-scatter, each rank's send buffer of an alltoall, the broadcast buffer and
the message of a send/recv. Bus bandwidth uses nccl-tests' factors.

The rates (link rates, channels, each algorithm's bus and algorithm bandwidth) are in
:mod:`nccl_rates`; this module adds latency, pipeline fill, the choice and the entry points,
and re-exports the rates' public names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError
from . import nccl_params as P
from .cluster import Cluster
from .nccl_rates import (
    Algo,
    Collective,
    Group,
    Proto,
    _algbw,
    _busbw,  # noqa: F401  (tests reach it as nccl._busbw)
    _enabled,
    _Links,
    _links,
    _p2p_ll,
    bus_factor,
    efficiencies,
    group_of,
    nvls_algbw,
    nvls_channels,
    nvls_eff,
    nvls_gather_algbw,
    nvls_heads,
    nvls_hop_us,
    nvls_tree_net,
    p2p_channels,
    p2p_ll_rate,
)

__all__ = ["Collective", "Algo", "Proto", "CollectiveCost", "Group", "collective_cost",
           "bus_factor", "group_of", "alltoall_split_us", "efficiencies", "nvls_eff",
           "nvls_algbw", "nvls_gather_algbw", "nvls_hop_us", "nvls_channels", "nvls_heads",
           "nvls_tree_net", "fill_bytes", "p2p_channels", "p2p_ll_rate", "ring_fill_weight"]


_PROTO_IDX = {Proto.ll: 0, Proto.ll128: 1, Proto.simple: 2}


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


def tree_correction(p: Proto, nbytes: float) -> float:
    """NCCL's factor on a tree all-reduce's bandwidth at ``nbytes`` (C51): its table by
    protocol and ``log2(nbytes >> 6)``, 64 B to 256 MiB; 1 outside."""
    q = int(nbytes) >> 6
    i = q.bit_length() - 1
    return P.TREE_CORRECTION[_PROTO_IDX[p]][i] if 0 <= i < len(P.TREE_CORRECTION[0]) else 1.0


def _net_lat_factor(c: Cluster, g: Group, L: _Links, coll: Collective, a: Algo, p: Proto,
                    nbytes: float) -> float:
    """NCCL's "plateau effect of ring" (C51): a ring Simple all-reduce leaving its NVLink
    domain pays its latency x 1.4 (x 1.9 before Ampere) once a rank's share per channel is
    64 bytes or more."""
    if a != Algo.ring or p != Proto.simple or coll != Collective.all_reduce:
        return 1.0
    if g.nodes < 2 or g.domain or nbytes / (L.channels * g.ranks) < 64:
        return 1.0
    return 1.9 if c.spec.arch in ("volta", "pascal") else P.RING_NET_SIMPLE_LAT.value


def _time(c, g, L, coll, a, p, nbytes, measured=None) -> tuple[float, float, float, float]:
    """(tuner time, predicted time, latency, algbw) in us / GB/s. NCCL's own corrections of
    its model (``ncclTopoGetAlgoTime``, C51) apply to both: a tree all-reduce's bandwidth at
    medium sizes, a ring Simple all-reduce's latency across nodes."""
    bw = _algbw(c, g, L, coll, a, p)
    if bw <= 0:
        return math.inf, math.inf, 0.0, 0.0
    if a == Algo.tree and coll == Collective.all_reduce:
        bw *= tree_correction(p, nbytes)
    k = _net_lat_factor(c, g, L, coll, a, p, nbytes)
    lat = _latency_us(c, g, coll, a, p) * k
    t_tuner = _latency_us(c, g, coll, a, p, tuner=True) * k + nbytes / (bw * 1e3)
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
    if coll in (Collective.all_gather, Collective.reduce_scatter) and want != Algo.ring:
        return (f"--algo {want.value}: NCCL runs {coll.value} with ring, or with NVLS inside "
                "one NVLink domain with NVLink SHARP (tree, NVLS-tree and CollNet are "
                "all-reduce algorithms)")
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
