"""Held-out published series of the NCCL model (issue 32: C27, C28, C33, C35 and the
rows each is held to) and the mechanisms chosen after seeing them (C30's NVLS-tree leg, C32's
one ring channel per slow NIC); split from test_cost_nccl.py, which keeps the closed forms,
the tuner's choices and the fit / judged series."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import tomllib
from conftest import bench_module

from retime.collectors.costs import group_of, load_preset
from retime.collectors.costs import nccl as nccl
from retime.collectors.costs import nccl_params as P
from retime.collectors.costs.nccl import nvls_algbw

DATA = Path(__file__).resolve().parents[1] / "bench" / "data" / "cost_published.toml"


def _series():
    with open(DATA, "rb") as fh:
        return tomllib.load(fh)


def _soft_min(s: float, i: float) -> float:
    return 1.0 / math.sqrt(1.0 / s**2 + 1.0 / i**2)


def _c27_rows():
    s = next(s for s in _series()["collective"] if s["id"] == "C27")
    return bench_module("cost").collective_rows(s)


def test_held_out_a3_mega_series_is_judged_on_sixteen_ranks():
    """C27 (held out, scored once): 11 judged rows, 1 MB - 1 GB, on 2 x 8 H100 with 8 x 200
    Gb/s per node; nothing in the model was set or chosen on it."""
    rows = _c27_rows()
    assert [r["bytes"] for r in rows] == [2**p for p in range(20, 31)]
    assert {r["role"] for r in rows} == {"judge"}
    c = load_preset("dgx-h100").with_overrides(nodes=2, nic_gbit=200.0, net_fabric="roce")
    assert group_of(c).ranks == 16


@pytest.mark.xfail(strict=True, reason="C27 held out, scored once at commit 9daf3bd: median "
                   "|error| 73.3%, worst 156.9% (1-32 MB +73..+157%: GPUDirect-TCPXO's ~120 us "
                   "floor; 256 MB - 1 GB -19..-38%: on 2 nodes the run beats the NICs' ring bound). "
                   "Since the 2-node NVLS-tree leg (C30, chosen after seeing it): 176.2% / 311.0% "
                   "(1 GB +7.4%, 1-64 MB +137..+311%); REFERENCES.md C27, C30")
def test_held_out_a3_mega_series_within_the_issues_15_percent():
    assert max(abs(r["error"]) for r in _c27_rows()) < 0.15


def _c28_series():
    return [s for s in _series()["collective"] if s["id"] == "C28"]


def test_held_out_b200_series_cover_four_collectives_on_one_and_two_nodes():
    """C28 (held out, scored once before any model change): all_reduce, all_gather,
    reduce_scatter and alltoall on 8 ranks (1 node) and 16 (2 nodes), 11 judged rows each,
    1 MB - 1 GB; priced as the dgx-b200 preset."""
    series = _c28_series()
    got = sorted((s["collective"], s.get("nodes", 1)) for s in series)
    want = sorted((c, n) for c in ("all_reduce", "all_gather", "reduce_scatter", "alltoall")
                  for n in (1, 2))
    assert got == want
    for s in series:
        rows = bench_module("cost").collective_rows(s)
        assert [r["bytes"] for r in rows] == [2**p for p in range(20, 31)]
        assert {r["role"] for r in rows} == {"judge"}
        c = load_preset("dgx-b200").with_overrides(nodes=s.get("nodes", 1))
        assert group_of(c).ranks == 8 * s.get("nodes", 1)


def test_nvls_tree_network_leg_carries_s_on_two_domains_and_2s_on_more():
    """NVLS-tree on 8 x 400 Gb/s InfiniBand per B200 node (8 heads, 8 NICs: 8 x 50 x 0.97 =
    388 GB/s per direction per node): on 2 nodes each node is the root of one tree and a leaf
    of the other, so its network leg carries S per direction: algbw = min(NVLS rate, 388 x
    0.92); on 3+ nodes an inner node carries 2S: half that (NCCL tuning.cc, REFERENCES C30).
    The pipeline fill's in-flight data is every rank's NVLS channels x 128 KiB: 16 x 32 x
    128 KiB = 64 MiB on 2 nodes (8 x 24 x 128 KiB inside one node)."""
    net = 8 * 50.0 * 0.97
    for nodes, legs in ((2, 1.0), (3, 2.0), (4, 2.0)):
        c = load_preset("dgx-b200").with_overrides(nodes=nodes)
        g = group_of(c)
        L = nccl._links(c, g)
        want = min(nvls_algbw(c, 8), net / legs * P.TREE_EFF.value)
        got = nccl._algbw(c, g, L, nccl.Collective.all_reduce, nccl.Algo.nvls_tree,
                          nccl.Proto.simple)
        assert got == pytest.approx(want, rel=1e-9)
        s = 2**30
        fill = nccl._fill_us(c, g, L, nccl.Collective.all_reduce, nccl.Algo.nvls_tree,
                             nccl.Proto.simple, s, got)
        inflight = 8 * nodes * 32 * 128 * 1024
        assert fill == pytest.approx(P.NVLS_FILL.value * _soft_min(s, inflight) / (got * 1e3))
    assert net * P.TREE_EFF.value < nvls_algbw(load_preset("dgx-b200"), 8)  # 2 nodes: NIC-bound


@pytest.mark.xfail(strict=True, reason="C28 2 x 8 B200 all_reduce, held out: first score 33.9% / "
                   "44.1% (ring); with the 2-node NVLS-tree leg and in-flight data (C30, chosen "
                   "after seeing it) 8.2% / 54.9%: 32 MB - 1 GB within 8.2%, 1-16 MB +28..+55% "
                   "(the run's 2-node NVLS-tree costs ~90 us at 1 MB, the model ~60)")
def test_held_out_b200_two_node_all_reduce_within_the_issues_15_percent():
    s = next(s for s in _c28_series() if s["collective"] == "all_reduce" and s.get("nodes") == 2)
    assert max(abs(r["error"]) for r in bench_module("cost").collective_rows(s)) < 0.15


def test_rings_on_nics_below_25_gbytes_take_one_channel_per_nic():
    """NCCL doubles a ring into two channels only where a channel runs at 25 GB/s or more
    (ncclTopoDupChannels, C32). 2 x 8 A100 with 16 x 100 Gb/s RoCE NICs (12.5 GB/s each):
    16 rings, one channel per NIC, so all 16 NICs carry them: 16 x 12.5 x 0.95 = 190 GB/s per
    node (two channels per NIC under A100's 24 would use 12 NICs: 142.5). With 8 x 200 Gb/s
    (25 GB/s): two channels per NIC, 16 channels on the 8 NICs."""
    assert P.DUP_MIN_GBPS.value == 25.0
    slow = load_preset("dgx-a100").with_overrides(gpu="a100-40gb", nodes=2, nics_per_node=16,
                                                   nic_gbit=100.0, net_fabric="roce")
    L = nccl._links(slow, group_of(slow))
    assert (L.channels, L.net_node) == pytest.approx((16, 16 * 12.5 * 0.95))
    fast = load_preset("dgx-a100").with_overrides(nodes=2)
    L = nccl._links(fast, group_of(fast))
    assert (L.channels, L.net_node) == pytest.approx((16, 8 * 25.0 * 0.97))


def test_held_out_h100_node_series_cover_four_collectives():
    """C33 (held out, scored once): all_reduce, all_gather, reduce_scatter, alltoall on one
    8 x H100 NVSwitch node, 11 judged rows each, 1 MB - 1 GB."""
    series = [s for s in _series()["collective"] if s["id"] == "C33"]
    assert sorted(s["collective"] for s in series) == sorted(
        ("all_reduce", "all_gather", "reduce_scatter", "alltoall"))
    for s in series:
        rows = bench_module("cost").collective_rows(s)
        assert [r["bytes"] for r in rows] == [2**p for p in range(20, 31)]
        assert {r["role"] for r in rows} == {"judge"}
        assert group_of(cost_cluster_of(s)).ranks == 8


def cost_cluster_of(series):
    return bench_module("cost").cluster_of(series)


def _held_out(sid: str, coll: str, nodes: int = 1) -> list[dict]:
    s = next(s for s in _series()["collective"] if s["id"] == sid and s["collective"] == coll
             and s.get("nodes", 1) == nodes)
    return bench_module("cost").collective_rows(s)


def _worst(rows: list[dict]) -> float:
    return max(abs(r["error"]) for r in rows)


def test_held_out_rows_within_the_issues_bars():
    """Held-out rows the model meets the issue's bars on (all_reduce within 15% per size,
    alltoall within 25%): C28's B200 node (all_reduce worst 14.7%, alltoall 16.8%), C29's
    2 x 8 H200 1 GB row (+7.5%), C31's 2 x 8 A100 1 GB rows (+8.1%, -1.1%) and C34's 2 x 8
    H200 RoCE all_gather (worst 11.8%)."""
    assert _worst(_held_out("C28", "all_reduce")) < 0.15
    assert _worst(_held_out("C28", "alltoall")) < 0.25
    assert _worst(_held_out("C29", "all_reduce", 2)) < 0.15
    for s in (s for s in _series()["collective"] if s["id"] == "C31"):
        assert _worst(bench_module("cost").collective_rows(s)) < 0.15
    assert _worst(_held_out("C34", "all_gather", 2)) < 0.15  # 2 x 8 H200 RoCE: 11.8%


@pytest.mark.parametrize("sid, coll, nodes, bar", [
    pytest.param("C28", "all_gather", 1, 0.15, marks=pytest.mark.xfail(strict=True, reason=(
        "C28 B200 node all_gather worst 24.5% (16 / 32 MB -24.5 / -17.1%: NVLS for all_gather "
        "on one node, not modelled; REFERENCES C28)"))),
    pytest.param("C28", "reduce_scatter", 1, 0.15, marks=pytest.mark.xfail(strict=True, reason=(
        "C28 B200 node reduce_scatter worst 39.5% (8 MB LL +39.5%, 16 MB -19.5%)"))),
    pytest.param("C28", "all_gather", 2, 0.15, marks=pytest.mark.xfail(strict=True, reason=(
        "C28 2 x 8 B200 all_gather worst 112.2% (the run's NICs at ~37.5 GB/s, REFERENCES C28)"))),
    pytest.param("C28", "alltoall", 2, 0.25, marks=pytest.mark.xfail(strict=True, reason=(
        "C28 2 x 8 B200 alltoall worst 113.7% (the run's 42 GB/s busbw, under half of 2 x NIC)"))),
    pytest.param("C35", "all_gather", 2, 0.15, marks=pytest.mark.xfail(strict=True, reason=(
        "C35 2 x 8 B200 RoCE all_gather worst 39.1% (1-16 MB LL128 +15..+39%; REFERENCES C35)"))),
    pytest.param("C33", "all_reduce", 1, 0.15, marks=pytest.mark.xfail(strict=True, reason=(
        "C33 H100 node all_reduce worst 29.8% (1 MB: the run's ~45 us floor, REFERENCES C33)"))),
    pytest.param("C33", "all_gather", 1, 0.15, marks=pytest.mark.xfail(strict=True, reason=(
        "C33 H100 node all_gather worst 79.5% (1-2 MB: the run's ~45 us floor; 8-16 MB -26%)"))),
    pytest.param("C33", "reduce_scatter", 1, 0.15, marks=pytest.mark.xfail(strict=True, reason=(
        "C33 H100 node reduce_scatter worst 66.1% (1 MB: the ~45 us floor; 16-32 MB -23%; "
        "NVLS at 2-4 MB since C39: median 17.4 -> 8.0%)"))),
    pytest.param("C43", "all_gather", 2, 0.15, marks=pytest.mark.xfail(strict=True, reason=(
        "C43 GKE A4 2 x 8 B200 RoCE all_gather, held out, scored once at 5b41753: median "
        "11.9%, worst 47.8% (1-8 MB +16..+48%, as C35; 256 MB - 1 GB within 4.0%)"))),
    pytest.param("C33", "alltoall", 1, 0.25, marks=pytest.mark.xfail(strict=True, reason=(
        "C33 H100 node alltoall worst 103.1% (1-8 MB: the run's ~75 us floor)"))),
])
def test_held_out_known_misses(sid, coll, nodes, bar):
    assert _worst(_held_out(sid, coll, nodes)) < bar


def test_held_out_gke_a4_all_gather_is_sixteen_ranks_and_holds_from_256_mb():
    """C43 (held out, scored once): cluster-toolkit's GKE A4 expected all-gather output. The
    rank count is recounted from the source's own 1 GB row, busbw / algbw = 358.32 / 382.20 =
    15/16 (all-gather's (n-1)/n): 16 ranks, the 2 x 8 B200 the bench prices. Its 256 MB -
    1 GB rows are within 5%; the 1-8 MB ones are the known miss (xfail above)."""
    assert round(1 / (1 - 358.32 / 382.20)) == 16
    s = next(s for s in _series()["collective"] if s["id"] == "C43")
    assert bench_module("cost").cluster_of(s).world_size == 16
    rows = bench_module("cost").collective_rows(s)
    assert [r["bytes"] for r in rows] == [2**p for p in range(20, 31)]
    assert {r["role"] for r in rows} == {"judge"}
    assert max(abs(r["error"]) for r in rows if r["bytes"] >= 2**28) < 0.05


def _series_of(sid: str, coll: str, nodes: int = 1, gpus_per_node: int | None = None) -> dict:
    return next(s for s in _series()["collective"] if s["id"] == sid
                and s["collective"] == coll and s.get("nodes", 1) == nodes
                and s.get("gpus_per_node") == gpus_per_node)


def test_held_out_oci_a100_series_rank_counts_from_their_own_rows():
    """C44 / C45 (held out, scored once at 947581f): OCI's BM.GPU4.8 tutorial. The rank counts
    are recounted from the source's 1 GB rows, all-reduce busbw / algbw = 2 (n - 1) / n:
    230.08 / 131.48 -> 8 ranks (one node), 70.26 / 37.47 -> 16 (two nodes), as priced."""
    assert round(2 / (2 - 230.08 / 131.48)) == 8
    assert round(2 / (2 - 70.26 / 37.47)) == 16
    cost = bench_module("cost")
    for sid, n in (("C44", 8), ("C45", 16)):
        s = next(s for s in _series()["collective"] if s["id"] == sid)
        assert cost.cluster_of(s).world_size == n
        rows = cost.collective_rows(s)
        assert [r["bytes"] for r in rows] == [2**p for p in range(20, 31)]
        assert {r["role"] for r in rows} == {"judge"}


def test_held_out_a100_node_all_reduce_holds_from_16_mb():
    """C44 (held out, scored once at 947581f): one 8 x A100-40GB node; its 16 MB - 1 GB rows
    are within 15% (worst 64 MB -10.1%); the 1-8 MB rows are the known miss below."""
    rows = bench_module("cost").collective_rows(_series_of("C44", "all_reduce"))
    assert _worst([r for r in rows if r["bytes"] >= 2**24]) < 0.15


@pytest.mark.xfail(strict=True, reason=(
    "C44 OCI 8 x A100-40GB all_reduce, held out, scored once at 947581f: median 4.4%, worst "
    "55.9% (1 / 2 / 4 / 8 MB +49.3 / +55.9 / +28.5 / +13.9%: the run pays ~77 us at 1 MB where "
    "the model's ring LL charges ~51 us; REFERENCES C44)"))
def test_held_out_a100_node_all_reduce_within_15_percent():
    assert _worst(bench_module("cost").collective_rows(_series_of("C44", "all_reduce"))) < 0.15


@pytest.mark.xfail(strict=True, reason=(
    "C45 OCI 2 x 8 A100-40GB on 16 x 100 Gb/s RoCE all_reduce, held out, scored once at "
    "947581f: median 133.6%, worst 536.8% (the run plateaus at ~71 GB/s busbw, 0.38 of C31's "
    "190 on the same shape, and dips at 16 / 64 - 256 MB; REFERENCES C45)"))
def test_held_out_oci_two_node_a100_all_reduce_within_15_percent():
    s = next(s for s in _series()["collective"] if s["id"] == "C45")
    assert _worst(bench_module("cost").collective_rows(s)) < 0.15


def test_held_out_ndm_a100_v4_rows_within_the_issues_bars():
    """C46 (held out, scored once at 947581f): Azure NDm A100 v4 at 1 GB, in-place. One node:
    all_gather -9.6%, all_reduce -0.8%, alltoall -23.2%; 2 x 8 on 8 x 200 Gb/s HDR IB:
    all_gather +6.6%, all_reduce +2.6%, alltoall +19.9% -- within 15% (25% for alltoall)."""
    cost = bench_module("cost")
    for nodes in (1, 2):
        for coll, bar in (("all_gather", 0.15), ("all_reduce", 0.15), ("alltoall", 0.25)):
            s = _series_of("C46", coll, nodes)
            assert cost.cluster_of(s).world_size == 8 * nodes
            assert _worst(cost.collective_rows(s)) < bar, (nodes, coll)


@pytest.mark.parametrize("coll, bar", [
    pytest.param("all_gather", 0.15, marks=pytest.mark.xfail(strict=True, reason=(
        "C46 2 nodes x 1 A100, all_gather at 1 GB, scored once at 947581f: +52.9% (published "
        "15.84 GB/s busbw, 0.65 of one 200 Gb/s NIC; REFERENCES C46)"))),
    pytest.param("all_reduce", 0.15, marks=pytest.mark.xfail(strict=True, reason=(
        "C46 2 nodes x 1 A100, all_reduce at 1 GB, scored once at 947581f: +29.8% (18.65)"))),
    pytest.param("alltoall", 0.25, marks=pytest.mark.xfail(strict=True, reason=(
        "C46 2 nodes x 1 A100, alltoall at 1 GB, scored once at 947581f: +56.5% (15.48)"))),
])
def test_held_out_ndm_a100_v4_one_gpu_per_node_misses(coll, bar):
    s = _series_of("C46", coll, 2, gpus_per_node=1)
    assert bench_module("cost").cluster_of(s).world_size == 2
    assert _worst(bench_module("cost").collective_rows(s)) < bar


def test_held_out_oci_gb200_two_racks_is_128_ranks():
    """C47 (held out, scored once at 947581f): OCI's oci-hpc-oke README, 32 GB200 hosts on
    two racks. The rank count is recounted from its 512 MB row, busbw / algbw = 411.01 /
    207.12 = 2 (n - 1) / n: 128 ranks, as priced (32 hosts x 4 GPUs)."""
    assert round(2 / (2 - 411.01 / 207.12)) == 128
    s = next(s for s in _series()["collective"] if s["id"] == "C47")
    assert bench_module("cost").cluster_of(s).world_size == 128
    rows = bench_module("cost").collective_rows(s)
    assert [r["bytes"] for r in rows] == [2**p for p in range(20, 31)]
    assert {r["role"] for r in rows} == {"judge"}


@pytest.mark.xfail(strict=True, reason=(
    "C47 OCI GB200-v3.4 on 2 racks (128 GPUs) all_reduce, held out, scored once at 947581f: "
    "median 108.2%, worst 212.6% (a ~180-290 us floor up to 8 MB, as C19's 2-rack rows, and "
    "1 GB at 284.6 GB/s below its own 512 MB row; REFERENCES C47)"))
def test_held_out_oci_gb200_two_racks_within_15_percent():
    s = next(s for s in _series()["collective"] if s["id"] == "C47")
    assert _worst(bench_module("cost").collective_rows(s)) < 0.15


def _c48(nodes: int) -> dict:
    return next(s for s in _series()["collective"] if s["id"] == "C48"
                and s.get("nodes", 1) == nodes)


def test_held_out_p4dn_one_node_row_within_15_percent():
    """C48 (held out, scored once at 947581f): one p4dn.24xlarge (8 x A100-40GB), all_reduce at
    1 GB: -0.5%."""
    s = _c48(1)
    assert bench_module("cost").cluster_of(s).world_size == 8
    assert _worst(bench_module("cost").collective_rows(s)) < 0.15


@pytest.mark.parametrize("nodes", [
    pytest.param(2, marks=pytest.mark.xfail(strict=True, reason=(
        "C48 2 x p4dn (4 x 100 Gb/s EFA) all_reduce 1 GB, scored once at 947581f: -30.3% (57.17 "
        "published, above the NICs' ring bound: a 2-node tree, as C27 / C30; REFERENCES C48)"))),
    pytest.param(3, marks=pytest.mark.xfail(strict=True, reason=(
        "C48 3 x p4dn all_reduce 1 GB, scored once at 947581f: +25.1% (31.77 published)"))),
    pytest.param(4, marks=pytest.mark.xfail(strict=True, reason=(
        "C48 4 x p4dn all_reduce 1 GB, scored once at 947581f: +34.0% (29.61 published)"))),
])
def test_held_out_p4dn_efa_rows_within_15_percent(nodes):
    s = _c48(nodes)
    assert bench_module("cost").cluster_of(s).world_size == 8 * nodes
    assert _worst(bench_module("cost").collective_rows(s)) < 0.15


def test_held_out_p4d_efa_series_is_sixteen_ranks():
    """C49 (held out, scored once at 947581f): aws-efa-eks's 2 x p4d.24xlarge all_reduce. The
    rank count is recounted from its 1 GB row, busbw / algbw = 32.71 / 17.44 = 2 x 15/16."""
    assert round(2 / (2 - 32.71 / 17.44)) == 16
    s = next(s for s in _series()["collective"] if s["id"] == "C49")
    assert bench_module("cost").cluster_of(s).world_size == 16
    rows = bench_module("cost").collective_rows(s)
    assert [r["bytes"] for r in rows] == [2**p for p in range(20, 31)]
    assert {r["role"] for r in rows} == {"judge"}


@pytest.mark.xfail(strict=True, reason=(
    "C49 2 x p4d (4 x 100 Gb/s EFA, NCCL 2.8.3) all_reduce, held out, scored once at 947581f: "
    "median 74.1%, worst 178.8% (a ~167 us floor at 8 B, 483 us at 1 MB; 1 GB +21.8%: the run "
    "moves 32.7 GB/s busbw, 0.65 of the 4 NICs' 50 GB/s; REFERENCES C49)"))
def test_held_out_p4d_efa_series_within_15_percent():
    s = next(s for s in _series()["collective"] if s["id"] == "C49")
    assert _worst(bench_module("cost").collective_rows(s)) < 0.15


def _c50(nodes: int) -> dict:
    return next(s for s in _series()["collective"] if s["id"] == "C50"
                and s.get("nodes", 1) == nodes)


def test_held_out_a3_mega_node_all_reduce_within_15_percent():
    """C50 (held out, scored once at 947581f): one A3 Mega node (8 x H100), all_reduce with
    one process driving 8 GPUs; busbw / algbw at 1 GB 466.26 / 266.43 = 2 x 7/8. Worst row
    1 MB +9.7%."""
    assert round(2 / (2 - 466.26 / 266.43)) == 8
    assert _worst(bench_module("cost").collective_rows(_c50(1))) < 0.15


def test_held_out_a3_mega_tcpxo_all_gather_holds_from_64_mb():
    """C50 (held out, scored once at 947581f): 2 x 8 H100 over GPUDirect-TCPXO, all_gather;
    16 ranks (183.13 / 195.34 = 15/16); 64 MB - 1 GB within 4.8%."""
    assert round(1 / (1 - 183.13 / 195.34)) == 16
    s = _c50(2)
    assert bench_module("cost").cluster_of(s).world_size == 16
    rows = bench_module("cost").collective_rows(s)
    assert _worst([r for r in rows if r["bytes"] >= 2**26]) < 0.15


@pytest.mark.xfail(strict=True, reason=(
    "C50 2 x 8 H100 GPUDirect-TCPXO all_gather, held out, scored once at 947581f: median 4.4%, "
    "worst 171.8% (1 / 4 / 16 MB +171.8 / +68.3 / +17.1%: TCPXO's ~110-145 us floor, as C27's; "
    "REFERENCES C50)"))
def test_held_out_a3_mega_tcpxo_all_gather_within_15_percent():
    assert _worst(bench_module("cost").collective_rows(_c50(2))) < 0.15
