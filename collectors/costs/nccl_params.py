"""Parameters of the NCCL collective model, each with its value, where it came from and how
uncertain it is. Sources are keyed to ``collectors/costs/REFERENCES.md`` (C0 = NCCL's public
tuning model, ``src/graph/tuning.cc``; C1.. = published nccl-tests series and maintainer
statements). ``published`` figures are taken as printed, ``fitted`` ones were set from the
fit rows named in REFERENCES.md (never from the rows bench/cost.py judges), ``assumed`` ones
are physical guesses with a wide range.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Param", "LINK_EFF", "NET_EFF", "NVLS_EFF", "BASE_LAT_US", "HOP_LAT_US",
           "LL_MAX_BUSBW", "LL128_PER_CHANNEL", "CHANNELS", "CALL_US", "CHUNK_BYTES",
           "NVLS_FILL", "NVLS_CHUNK_BYTES", "LL_HALF_ARCHS", "P2P_EFF", "TREE_EFF",
           "NVLS_REF_RANKS", "NVLS_REF_HEADS", "NVLS_HEAD_US", "LL128_WALL_BASE_US",
           "P2P_LL_THRESHOLD", "NVLS_MAX_ARITY", "DUP_MIN_GBPS", "UNCERTAINTY",
           "TREE_CORRECTION", "RING_NET_SIMPLE_LAT"]

#: relative 1-sigma-ish half-width of the range a parameter of each source contributes
UNCERTAINTY = {"published": 0.05, "fitted": 0.10, "assumed": 0.25, "stated": 0.10}


@dataclass(frozen=True)
class Param:
    """One model parameter: value, source kind and the reference that backs it."""

    value: float
    source: str  # "published" | "fitted" | "assumed" | "stated" (a user's cluster / what-if)
    ref: str

    @property
    def rel(self) -> float:
        return UNCERTAINTY[self.source]


#: Simple-protocol ring bus bandwidth / nominal link rate, per intra-node link generation
LINK_EFF = {
    "nvlink2": Param(0.80, "assumed", "V100 NVLink2 (DGX-1 hybrid cube mesh), as PCIe"),
    "nvlink3": Param(0.78, "fitted", "C0 (A100 busbw cap 235 GB/s), C1 rows >= 2 GB"),
    "nvlink4": Param(0.82, "published", "C2: ~370 of 450 GB/s effective on NVLink4"),
    "nvlink5": Param(0.755, "fitted", "C3 rows >= 2 GB (GB200, 4 GPUs, ring)"),
    "pcie4": Param(0.80, "assumed", "PCIe 4.0 x16 DMA ~25 of 32 GB/s"),
    "pcie5": Param(0.80, "assumed", "PCIe 5.0 x16 DMA ~50 of 64 GB/s"),
    "xgmi3": Param(0.70, "assumed", "xGMI mesh: rings use a subset of the 7 links"),
    "xgmi4": Param(0.70, "assumed", "as xgmi3 (MI355X's 4th-gen mesh, same 7-link topology)"),
}
#: achievable / nominal per NIC, per network fabric
NET_EFF = {
    "infiniband": Param(0.97, "published", "C4: CX-7 NDR 400 Gb/s reaches 48-49 GB/s"),
    "roce": Param(0.95, "assumed", "RoCE v2 headers vs IB; lossless fabric"),
    "efa": Param(0.80, "assumed", "SRD transport over Ethernet"),
    "slingshot": Param(0.85, "assumed", "Slingshot-11 200 Gb/s NICs"),
}
#: NVLS all-reduce algorithm bandwidth / nominal NVLink rate (in-switch reduction), on the
#: domain size it was measured on (NVLS_REF_RANKS; another size: x k/(k+1), nccl.nvls_algbw)
NVLS_EFF = {
    "nvlink4": Param(0.61, "published", "C2: NVLS peak busbw ~480 GB/s, algbw ~275 GB/s of 450"),
    "nvlink5": Param(0.49, "fitted", "C10 rows 4 GB and 8 GB (72 GB200, NVLS plateau "
                     "835-839 GB/s busbw); NCCL's nvlsEfficiency ratio Blackwell/Hopper "
                     ".74/.85 would give 0.53 (C16)"),
}
#: the NVLink domain size each NVLS_EFF was measured on: the NVLS rate of n ranks scales as
#: n / (n + 1) (each GPU sends and receives S (1 + 1/n) through the switch, C21), so a rate
#: set at one size carries to another as ``(n/(n+1)) / (ref/(ref+1))``
NVLS_REF_RANKS = {"nvlink4": 8, "nvlink5": 72}
#: NVLS latency per head: the NVLS all-reduce runs one head per rank of the domain, and each
#: step's scatter and gather loop over the heads one after another (C21); NCCL's per-hop
#: figure (23 us, C0) is its 8-GPU NVSwitch system's (C7 fits it at 8 heads), so a domain of
#: k ranks pays ``23 + NVLS_HEAD_US x (k - 8)``
NVLS_REF_HEADS = 8
NVLS_HEAD_US = Param(0.6, "fitted", "C19 16 hosts (64 GB300, MNNVL) all_reduce 1 MB row")
#: NCCL_P2P_LL_THRESHOLD default: a send/recv whose message is at most p2pnChannelsPerPeer x
#: this many bytes runs LL (NCCL 2.27-era ``addP2pToPlan``; 512 KiB per peer with 32
#: channels per peer; C24)
P2P_LL_THRESHOLD = Param(16384, "published", "C24: NCCL_P2P_LL_THRESHOLD 16384 bytes, "
                         "thresholdLL = p2pnChannelsPerPeer x it (enqueue.cc)")
#: most NVLS heads NCCL runs in one NVLink domain: the NVLS graph search caps its channels, one
#: head GPU each, at ``min(NCCL_MAX_NVLS_ARITY, GPUs)`` (``src/graph/search.cc``), and
#: ``NCCL_MAX_NVLS_ARITY`` is 32 from NCCL 2.20 on (8 before; ``src/include/device.h``). Across
#: domains each head runs the NVLS-tree's network leg through its own NIC (``struct ncclNvls``:
#: "Number of parallel N<->1<->net operations"; headRank -1 "if I'm not a head rank (no local
#: NIC)"; C25)
NVLS_MAX_ARITY = Param(32, "published", "C25: NCCL_MAX_NVLS_ARITY 32 (NCCL > 2.20), "
                       "search.cc maxChannels = min(arity, GPUs)")
#: a ring channel is doubled into two only at this per-channel rate or more (GB/s)
DUP_MIN_GBPS = Param(25.0, "published", "C32: ncclTopoDupChannels, bwIntra < 25.0 -> no dup")
#: tree bandwidth factor (NCCL's busBw * .92 for trees)
TREE_EFF = Param(0.92, "published", "C0: tree busBw x 0.92")
#: NCCL's correction of the tree all-reduce bandwidth at medium sizes, per protocol (LL,
#: LL128, Simple) and ``log2((bytes >> 6))`` from 0 (64 B) to 22 (256 MiB); no correction
#: outside. ``ncclTopoGetAlgoTime`` multiplies the tree's bandwidth by it: "Trees are not
#: perfectly sticking to the model for medium sizes" (C51; the same table since NCCL 2.5)
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0,
     1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9,
     1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)
#: "Plateau effect of ring": a ring Simple all-reduce across nodes pays its latency x 1.4
#: (x 1.9 before compute capability 8.0) once each rank's share per channel is >= 64 bytes
#: (``ncclTopoGetAlgoTime``, C51)
RING_NET_SIMPLE_LAT = Param(1.4, "published", "C51: ncclTopoGetAlgoTime, ring Simple "
                            "all-reduce on several nodes, lat *= 1.4 (1.9 before sm80)")
#: point-to-point (send/recv, alltoall) bandwidth / ring bus bandwidth on the same links
P2P_EFF = Param(0.84, "fitted", "C5: A100 sendrecv 195 GB/s vs all-reduce 231.6 GB/s")

#: base latency (us) per algorithm and protocol (LL, LL128, Simple), NCCL 2.19 tuning table
BASE_LAT_US = {
    "tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0),
    "nvls_tree": (0.0, 0.0, 0.0), "collnet": (0.0, 0.0, 0.0),
}
#: ring LL128 base latency (us) charged as wall-clock time where the ring stays inside one
#: NVLink domain: LL's base of the same table. NCCL's tables rank protocols with an LL128 base
#: that was LL's in 2.5 (ring 3.6 / 3.6 us) and rose to 10 and then 14 us in later releases while
#: LL's stayed at 3.6-6.6 and the protocol's launch and completion did not change (C22), so the
#: tuner keeps 14 to choose and the predicted time pays LL's base. Across a network the table's
#: 14 us stays (an LL128 step through the NIC proxy moves whole buffer slots).
LL128_WALL_BASE_US = Param(6.6, "assumed", "C22: LL's ring base of the same table (NCCL 2.5: "
                           "LL128 = LL = 3.6 us; 2.19's LL128 14 us ranks protocols)")
#: per-hop latency (us) per link level, algorithm, protocol (LL, LL128, Simple), same table
HOP_LAT_US = {
    "nvlink": {"tree": (0.6, 1.25, 28.0), "ring": (0.6, 1.9, 3.4), "nvls": (0, 0, 23.0),
               "nvls_tree": (0, 0, 23.0), "collnet": (0, 0, 3.7)},
    "pcie": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7), "nvls": (0, 0, 0),
             "nvls_tree": (0, 0, 0), "collnet": (0, 0, 3.7)},
    "net": {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 14.0), "nvls": (0, 0, 18.0),
            "nvls_tree": (0, 0, 14.0), "collnet": (0, 0, 31.0)},
}
#: latency of the tuner's tables as wall-clock time is uncertain (they rank algorithms)
LATENCY = Param(1.0, "assumed", "C0 latencies used as wall-clock time")
#: fixed cost of one collective call beyond the tuner's latency (launch, event timing)
CALL_US = Param(5.0, "assumed", "kernel launch + completion as nccl-tests times it")

#: LL protocol bus-bandwidth ceilings (GB/s): single node by GPU generation, else by nodes
LL_MAX_BUSBW = {"volta": 39.0, "ampere": 87.7, "hopper": 87.7, "blackwell": 282.0,
                "cdna3": 39.0, "cdna4": 39.0, "nodes2": 39.0, "nodes3+": 20.4}
#: LL128 per-channel ring ceiling (GB/s) per generation (NCCL tuning table)
LL128_PER_CHANNEL = {"volta": 20.0, "ampere": 20.0, "hopper": 36.7, "blackwell": 73.4,
                     "cdna3": 20.0, "cdna4": 20.0}
#: channels per collective, by intra-node fabric and GPU generation
CHANNELS = {
    ("nvswitch", "ampere"): Param(24, "published", "C6: 24 channels on HGX A100"),
    ("nvswitch", "volta"): Param(8, "published", "C15: 4 NVLink rings on a DGX-1, each "
                                 "doubled into two channels"),
    ("nvswitch", "hopper"): Param(24, "published", "C52: NCCL log of one p5.48xlarge (8 x H100 "
                                  "NVSwitch): 24 coll channels"),
    ("nvswitch", "blackwell"): Param(32, "published", "C52: NCCL log of GB200 trays (NVLink5): "
                                     "32 coll channels"),
    ("pcie", None): Param(4, "assumed", "PCIe rings"),
    ("xgmi", None): Param(16, "assumed", "RCCL rings on the xGMI mesh"),
}
#: Simple/LL128 pipeline: bytes per channel in flight per ring step (the ramp of busbw with
#: message size: one extra ring traversal of the in-flight data, a soft minimum of the
#: message and ranks x channels x this; ``nccl.fill_bytes``)
CHUNK_BYTES = Param(64 * 1024, "fitted", "C1 rows 1 MB - 1 GB (A100; the fit series)")
#: NVLS pipeline fill: the fraction of one pass of the in-flight data (ranks x NVLS channels
#: x NVLS chunk; the cap fitted on C7 before, 16 MiB, is exactly 8 x 16 x 128 KiB)
NVLS_FILL = Param(1.0, "fitted", "C7 rows 1 MB - 1 GB (H100; the NVLS fit series)")
#: NCCL_NVLS_CHUNKSIZE default (src/transport/nvls.cc, C16)
NVLS_CHUNK_BYTES = Param(128 * 1024, "published", "C16: NCCL_NVLS_CHUNKSIZE 128 KiB")
#: architectures whose NCCL (>= 2.23, the first with Blackwell) runs ring LL at half the bus
#: rate (``busBw * .5``) instead of a quarter, with Blackwell's doubled LL/LL128 ceilings (C16)
LL_HALF_ARCHS = frozenset({"blackwell"})
