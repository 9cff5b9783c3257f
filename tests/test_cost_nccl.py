"""The cluster description and the NCCL collective model (issues 27 and 32): closed forms,
the tuner's choices, published rows at their stated tolerance, bad clusters."""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

import pytest
import tomllib
from conftest import bench_module

from retime.collectors.costs import (
    Collective,
    Group,
    bus_factor,
    collective_cost,
    format_cluster,
    group_of,
    load_preset,
    preset_names,
    read_cluster,
)
from retime.collectors.costs import nccl as nccl
from retime.collectors.costs import nccl_params as P
from retime.collectors.costs.nccl import nvls_algbw, nvls_hop_us
from retime.collectors.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data" / "cost_published.toml"


def test_presets_cover_the_issue_and_round_trip(tmp_path):
    assert {"dgx-a100", "dgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72", "mi300x-8x",
            "pcie-4gpu", "pcie-8gpu"} <= set(preset_names())
    for name in preset_names():
        c = load_preset(name).with_overrides(nodes=3)
        f = tmp_path / f"{name}.toml"
        f.write_text(format_cluster(c))
        back = read_cluster(f)
        assert back == c and back.world_size == 3 * c.gpus_per_node


def test_nvl72_is_one_nvlink_domain_of_72():
    c = load_preset("gb200-nvl72")
    assert (c.gpus_per_node, c.nvlink_domain, c.world_size) == (4, 72, 72)


@pytest.mark.parametrize("kw, words", [
    ({"gpus_per_node": 16}, "only 8 GPUs per node"),
    ({"nvls": True, "gpu": "a100-80gb"}, "NVLS"),
    ({"intra_fabric": "xgmi"}, "no xgmi fabric for h100-sxm"),
    ({"sharp": True, "net_fabric": "roce"}, "SHARP"),
    ({"nodes": 2, "nics_per_node": 0}, "at least one NIC"),
    ({"gpu": "v100"}, "unknown GPU"),
])
def test_contradictory_clusters_are_refused(kw, words):
    with pytest.raises(ConfigError, match=words):
        load_preset("dgx-h100").with_overrides(**kw)


def test_intra_switch_takes_the_gpus_fabric():
    c = load_preset("dgx-h100").with_overrides(intra_fabric="pcie")
    assert (c.intra_generation, c.intra_gbps, c.nvls) == ("pcie5", 64.0, False)
    a = load_preset("dgx-h100").with_overrides(gpu="a100-80gb")
    assert (a.intra_generation, a.intra_gbps, a.nvls) == ("nvlink3", 300.0, False)


def test_bus_factors_are_nccl_tests():
    assert bus_factor(Collective.all_reduce, 8) == pytest.approx(1.75)
    assert bus_factor(Collective.all_gather, 8) == pytest.approx(0.875)
    assert bus_factor(Collective.reduce_scatter, 4) == pytest.approx(0.75)
    assert bus_factor(Collective.alltoall, 16) == pytest.approx(15 / 16)
    assert bus_factor(Collective.broadcast, 8) == 1.0


def _soft_min(s: float, i: float) -> float:
    return 1.0 / math.sqrt(1.0 / s**2 + 1.0 / i**2)


def test_forced_ring_simple_is_the_closed_form():
    """8 x A100, ring/Simple: 5 us call + 8.4 + 14 x 3.4 us latency + 2(n-1)/n S / B +
    one pass of the soft minimum of S and I = n x 24 channels x 64 KiB (12 MiB in flight)
    at the algorithm bandwidth."""
    c = load_preset("dgx-a100")
    B = 300.0 * 0.78  # GB/s == bytes/ns; / 1e3 -> bytes/us
    inflight = 8 * 24 * 65536
    for S in (2**20, 2**26, 2**30):
        r = collective_cost(c, "all_reduce", S, algo="ring", proto="Simple")
        algbw = B / 1.75
        t = 5.0 + 8.4 + 14 * 3.4 + (S + _soft_min(S, inflight)) / (algbw * 1e3)
        assert r.time_us == pytest.approx(t, rel=1e-12)
        assert r.busbw_gbps == pytest.approx(S / (t * 1e3) * 1.75, rel=1e-12)
        assert r.range_us[0] < r.time_us < r.range_us[1]
    # and the bus bandwidth approaches the link's effective rate from below
    big = collective_cost(c, "all_reduce", 2**36, algo="ring", proto="Simple")
    assert 0.99 * B < big.busbw_gbps < B


def test_protocol_ceilings_follow_the_tuner():
    c = load_preset("dgx-a100")
    ll = collective_cost(c, "all_reduce", 2**30, algo="ring", proto="LL")
    assert ll.busbw_gbps < min(87.7, 300 * 0.78 / 4) * 1.0001  # LL: a quarter, capped
    ll128 = collective_cost(c, "all_reduce", 2**34, algo="ring", proto="LL128")
    assert ll128.busbw_gbps < 300 * 0.78 * 0.92


def test_the_tuner_picks_like_nccl():
    h100, a100 = load_preset("dgx-h100"), load_preset("dgx-a100")
    assert collective_cost(h100, "all_reduce", 2**30).algorithm == "nvls"
    assert collective_cost(a100, "all_reduce", 2**30).algorithm == "ring"
    small = collective_cost(a100, "all_reduce", 4096)
    assert small.protocol == "LL"  # latency-bound sizes take the low-latency protocol
    multi = collective_cost(a100.with_overrides(nodes=16), "all_reduce", 2**16)
    assert multi.algorithm == "tree"  # log(nodes) hops beat 2 x nodes ring hops
    assert collective_cost(h100, "all_gather", 2**30).algorithm == "ring"
    # NVLS over a multi-node NVLink domain (MNNVL clique = one NCCL node, C16), 24 channels
    nvl = collective_cost(load_preset("gb200-nvl72"), "all_reduce", 2**30)
    assert (nvl.algorithm, nvl.channels) == ("nvls", 24)


def test_groups_are_nvlink_domains_not_trays():
    rack2 = load_preset("gb200-nvl72").with_overrides(nodes=36)  # two racks of 18 trays
    g = group_of(rack2)
    assert (g.ranks, g.per_node, g.nodes, g.domain) == (144, 72, 2, False)
    assert group_of(rack2, 72) == Group(72, 72, 1, True)  # one rack: no network hop
    assert group_of(rack2, 8) == Group(8, 8, 1, True)  # two trays: NVLink, not the NICs
    # a DGX is its own domain: nothing changes there
    assert group_of(load_preset("dgx-h100").with_overrides(nodes=4)) == Group(32, 8, 4, False)


def test_cross_rack_ring_is_bounded_by_the_domains_nics():
    # NCCL issue #1801 (C17): GB200 partitions of 4 / 8 GPUs on three racks, NVLS off, IB
    # between them: the ring's busbw is the partition's NICs (196.7 and 393.7 GB/s at 16 GB)
    base = load_preset("gb200-nvl72")
    for dom, nodes, pub in ((4, 3, 196.72), (8, 6, 393.66)):
        c = base.with_overrides(nodes=nodes, nvlink_domain=dom, nvls=False)
        r = collective_cost(c, "all_reduce", 16 * 2**30)
        assert r.algorithm == "ring"
        nic = dom * 50.0 * P.NET_EFF["infiniband"].value
        assert r.busbw_gbps == pytest.approx(nic, rel=0.02)
        assert r.busbw_gbps == pytest.approx(pub, rel=0.05)
    # full racks: 32 channels leave on 16 of a rack's 72 NICs (776 GB/s) > the NVLink ring's
    # 680: the cross-rack ring runs at NVLink's rate, not one tray's 4 NICs (194 GB/s)
    two = collective_cost(base.with_overrides(nodes=36), "all_reduce", 16 * 2**30,
                          algo="ring", proto="Simple")
    assert two.busbw_gbps > 600


def test_multi_node_ring_is_bounded_by_the_nics():
    c = load_preset("dgx-a100").with_overrides(nodes=4, nics_per_node=2)
    r = collective_cost(c, "all_reduce", 2**34, algo="ring", proto="Simple")
    nic = 2 * 25.0 * P.NET_EFF["infiniband"].value
    assert 0.9 * nic < r.busbw_gbps < nic


def test_alltoall_off_node_goes_through_the_gpus_own_nic():
    c = load_preset("dgx-h100").with_overrides(nodes=2)
    r = collective_cost(c, "alltoall", 2**32)
    nic = 50.0 * 0.97  # one NIC per GPU
    # half the peers are off-node: time = S/2 / nic; busbw = S/t * 15/16
    assert r.busbw_gbps == pytest.approx(2 * nic * 15 / 16, rel=0.02)
    assert r.algorithm == "p2p"


@pytest.mark.parametrize("call, words", [
    (lambda: collective_cost(load_preset("dgx-h100").with_overrides(gpus_per_node=1),
                             "all_reduce", 2**20), "at least 2 ranks"),
    (lambda: collective_cost(load_preset("dgx-a100"), "all_reduce", 2**20, algo="nvls"),
     "NVLS"),
    (lambda: collective_cost(load_preset("dgx-h100"), "all_reduce", 2**20, algo="tree"),
     "several nodes"),
    (lambda: collective_cost(load_preset("dgx-h100"), "all_reduce", 2**20, algo="nvls",
                             proto="LL"), "Simple only"),
    (lambda: collective_cost(load_preset("dgx-h100"), "all_gather", 2**20, algo="tree"),
     "with ring, or with NVLS inside one NVLink domain"),
    (lambda: collective_cost(load_preset("dgx-h100"), "alltoall", 2**20, algo="tree"),
     "ring algorithm only"),
])
def test_impossible_requests_are_refused(call, words):
    with pytest.raises(ConfigError, match=words):
        call()


def test_time_grows_and_busbw_rises_with_size():
    for name in ("dgx-a100", "dgx-h100", "mi300x-8x", "pcie-8gpu"):
        c = load_preset(name).with_overrides(nodes=2)
        for coll in ("all_reduce", "all_gather", "alltoall", "broadcast", "sendrecv"):
            rs = [collective_cost(c, coll, 2**p) for p in range(10, 33, 2)]
            for a, b in zip(rs, rs[1:]):
                if (a.algorithm, a.protocol, b.protocol) == ("p2p", "LL", "Simple"):
                    # NCCL switches point-to-point from LL to Simple by size, not by time:
                    # the time drops there, as C19's published alltoall rows do (C24)
                    continue
                assert b.time_us > a.time_us, (name, coll, a.nbytes)
            assert rs[-1].busbw_gbps > rs[0].busbw_gbps


def _series():
    with open(DATA, "rb") as fh:
        return tomllib.load(fh)


def test_judged_published_series_hold_their_tolerance():
    """Judged rows only (no parameter was set from them). H200 NVLS (C9): median within 5%,
    every judged row within the issue's 15% (its 16 MB row is fit since the fill's soft
    corner); GB200 ring (C3) rows of 32 MB - 1 GB within 15%."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import cost as bench
    finally:
        sys.path.pop(0)
    by_id = {s["id"]: s for s in _series()["collective"]}
    h200 = bench.collective_rows(by_id["C9"])
    errs = [abs(r["error"]) for r in h200 if r["role"] == "judge"]
    assert len(errs) == 10 and statistics.median(errs) < 0.05 and max(errs) < 0.15
    gb = [r for r in bench.collective_rows(by_id["C3"]) if r["bytes"] >= 2**25]
    assert max(abs(r["error"]) for r in gb) < 0.15
    a100_multi = bench.collective_rows(by_id["C11"])[0]
    assert abs(a100_multi["error"]) < 0.20


def test_every_parameter_is_sourced():
    refs = (ROOT / "collectors" / "costs" / "REFERENCES.md").read_text()
    params = [*P.LINK_EFF.values(), *P.NET_EFF.values(), *P.NVLS_EFF.values(), P.TREE_EFF,
              P.P2P_EFF, *P.CHANNELS.values(), P.CHUNK_BYTES, P.NVLS_FILL, P.NVLS_CHUNK_BYTES,
              P.CALL_US, P.NVLS_MAX_ARITY]
    for p in params:
        assert p.source in ("published", "fitted", "assumed")
        ids = [w.strip(":,()") for w in p.ref.split() if w[:1] in "CK" and w[1:2].isdigit()]
        for i in ids:
            assert f"| {i} |" in refs, i
        if p.source != "assumed":
            assert ids, p
    assert math.isclose(P.UNCERTAINTY["published"] * 5, P.UNCERTAINTY["assumed"])


def test_fill_pass_is_a_soft_minimum():
    """The fill pass is min(S, I) far from S = I and I / sqrt(2) at it: no corner."""
    from retime.collectors.costs import fill_bytes

    inflight = 16 * 2**20
    assert fill_bytes(inflight, inflight) == pytest.approx(inflight / math.sqrt(2))
    assert fill_bytes(2**14, inflight) == pytest.approx(2**14, rel=1e-6)
    assert fill_bytes(2**40, inflight) == pytest.approx(inflight, rel=1e-6)
    sizes = [2**p for p in range(16, 34)]
    passes = [fill_bytes(s, inflight) for s in sizes]
    assert all(b > a for a, b in zip(passes, passes[1:]))  # rising, never above either
    assert all(f < min(s, inflight) for s, f in zip(sizes, passes))


def test_nvls_fill_is_the_data_in_flight():
    """NVLS time = call + latency + (S + softmin(S, ranks x NVLS channels x 128 KiB)) / algbw:
    16 MiB in flight on 8 H100 (16 channels; the cap C7 once fitted), 216 MiB on 72 GB200
    (24 channels inside one MNNVL domain, C16); the latency is NCCL's 23 us at 8 heads plus
    the per-head cost beyond them (C21). Both at the size their NVLS rate was measured on."""
    for preset, ranks, ch, gbps, eff in (("dgx-h100", 8, 16, 450.0, 0.61),
                                         ("gb200-nvl72", 72, 24, 900.0, 0.49)):
        c = load_preset(preset)
        a = gbps * eff * 1e3  # bytes per us
        lat = 23.0 + P.NVLS_HEAD_US.value * (ranks - 8)
        for s in (2**20, 2**30):
            r = collective_cost(c, "all_reduce", s, algo="nvls")
            want = P.CALL_US.value + lat + (s + _soft_min(s, ranks * ch * 128 * 1024)) / a
            assert r.channels == ch
            assert r.time_us == pytest.approx(want, rel=1e-9)


def test_alltoall_cannot_aggregate_a_gpus_several_nics():
    """C4: an alltoall's off-node traffic leaves through one NIC per GPU even where a GPU
    has two (OCI GB300: 8 x 400 Gb/s per 4-GPU host); a ring all-gather uses them all."""
    one = load_preset("dgx-h100").with_overrides(nodes=2, gpus_per_node=4, nvlink_domain=4,
                                                 nics_per_node=4)
    two = one.with_overrides(nics_per_node=8)
    a1, a2 = (collective_cost(c, "alltoall", 2**32) for c in (one, two))
    assert a2.busbw_gbps == pytest.approx(a1.busbw_gbps, rel=1e-9)
    # half the peers off-node through one NIC at 0.97: busbw = 2 x 48.5 x 7/8
    assert a1.busbw_gbps == pytest.approx(2 * 50.0 * 0.97 * 7 / 8, rel=0.02)
    g1, g2 = (collective_cost(c, "all_gather", 2**32) for c in (one, two))
    assert g2.busbw_gbps > 1.5 * g1.busbw_gbps


def test_judged_all_gather_and_alltoall_series():
    """All-gather over RoCE on 2 x 8 H200 (C18, 1 MB - 1 GB): every judged row within the
    issue's 15% and their median within 10%; the 16 MB row, which the fill's soft corner was
    chosen on, is fit (printed, not judged) and within 10% too. Alltoall inside one NVL72
    rack (C19, 4, 8 and 64 GB300) within the issue's 25% at every size but the 64-GPU 1 MB
    row (16 KiB per peer: its ~30 us floor grows with the peers, which the model's LL latency
    does not; REFERENCES.md C24); LL up to 512 KiB per peer, Simple above (C24)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import cost as bench
    finally:
        sys.path.pop(0)
    series = _series()["collective"]
    ag = bench.collective_rows(next(s for s in series if s["id"] == "C18"))
    assert len(ag) == 11 and {r["algorithm"] for r in ag} == {"ring"}
    assert [r["bytes"] for r in ag if r["role"] == "fit"] == [16 * 2**20]
    errs = [abs(r["error"]) for r in ag if r["role"] == "judge"]
    assert len(errs) == 10 and statistics.median(errs) < 0.10 and max(errs) < 0.15
    assert abs(next(r for r in ag if r["role"] == "fit")["error"]) < 0.10
    in_rack = [s for s in series if s["id"] == "C19" and s["collective"] == "alltoall"
               and "2 racks" not in s["title"]]
    assert len(in_rack) == 3
    for s in in_rack:
        rows = bench.collective_rows(s)
        assert len(rows) == 13 and {r["role"] for r in rows} == {"judge"}
        n = 4 * s["nodes"]
        for r in rows:
            assert r["algorithm"] == "p2p"
            assert r["protocol"] == ("LL" if r["bytes"] / n <= 512 * 1024 else "Simple")
            if not (n == 64 and r["bytes"] == 2**20):
                assert abs(r["error"]) < 0.25, (s["title"], r)


def test_two_rack_alltoall_is_the_c20_formula_on_the_stated_nics():
    """C19's 2-rack alltoall (128 GB300, 64 per rack, OCI's 8 x 400 Gb/s ports per host) is
    priced by the maintainer's formula (C20): half of each rank's bytes leave the rack through
    one 400 Gb/s port (C4) at RoCE's 0.95, so busbw = 2 x 47.5 x 127/128 within the NVLink
    leg's few percent; the published 47.5 GB/s is half of that (REFERENCES.md C19)."""
    base = load_preset("gb300-nvl72")
    oci = base.with_overrides(nodes=32, nvlink_domain=64, net_fabric="roce", nics_per_node=8,
                              nic_gbit=400.0)
    r = collective_cost(oci, "alltoall", 16 * 2**30)
    port = 50.0 * P.NET_EFF["roce"].value
    assert r.busbw_gbps == pytest.approx(2 * port * 127 / 128, rel=0.02)
    # the preset's description of the same NICs (4 x 800 Gb/s per tray, H2/H11): one NIC each
    tray = collective_cost(base.with_overrides(nodes=32, nvlink_domain=64), "alltoall",
                           16 * 2**30)
    assert tray.busbw_gbps == pytest.approx(2 * r.busbw_gbps, rel=0.03)


def test_c19_series_read_ocis_deployment_from_a_cluster_file():
    """C19's deployment (OCI BM.GPU.GB300.4: 8 x 400 Gb/s RoCE ports per host, two racks of
    16 hosts; REFERENCES.md C19) is stated as a user would, in a cluster file beside the
    published rows, and every C19 series reads it. It is not the gb300-nvl72 preset (4 x 800
    Gb/s per tray), and it prices exactly what the preset with OCI's NICs overridden prices."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import cost as bench
    finally:
        sys.path.pop(0)
    oci = read_cluster(ROOT / "bench" / "data" / "oci-gb300-4.toml")
    assert (oci.gpus_per_node, oci.nodes, oci.nvlink_domain, oci.net_fabric,
            oci.nics_per_node, oci.nic_gbit) == (4, 32, 64, "roce", 8, 400.0)
    preset = load_preset("gb300-nvl72")
    assert (preset.nics_per_node, preset.nic_gbit) != (oci.nics_per_node, oci.nic_gbit)
    c19 = [s for s in _series()["collective"] if s["id"] == "C19"]
    assert len(c19) == 8 and all(s["cluster"] == "oci-gb300-4.toml" for s in c19)
    for s in c19:
        c = bench.cluster_of(s)
        spelled = preset.with_overrides(
            net_fabric="roce", nics_per_node=8, nic_gbit=400.0,
            **{k: s[k] for k in ("nodes", "gpus_per_node", "nvlink_domain") if k in s},
            **({"nvlink_domain": 64} if s["nodes"] == 32 else {}))
        for nbytes in (2**20, 2**27, 2**30):
            a = collective_cost(c, s["collective"], nbytes)
            b = collective_cost(spelled, s["collective"], nbytes)
            assert (a.time_us, a.algorithm, a.protocol) == (b.time_us, b.algorithm, b.protocol)


def test_ll128_pays_lls_base_latency_inside_a_domain_and_the_tables_across_nodes():
    """C22: NCCL's tables rank protocols with a ring LL128 base latency that rose from LL's
    (2.5) to 14 us (2.18+); inside one NVLink domain the predicted time pays LL's base (6.6 us)
    while the choice still uses the table's 14; a ring leaving the node keeps the table's."""
    a100 = load_preset("dgx-a100")
    r = collective_cost(a100, "all_reduce", 4 * 2**20, proto="LL128")
    # call + LL's base + 2 (n - 1) NVLink LL128 hops
    assert r.latency_us == pytest.approx(P.CALL_US.value + P.LL128_WALL_BASE_US.value
                                         + 14 * P.HOP_LAT_US["nvlink"]["ring"][1])
    assert P.LL128_WALL_BASE_US.value == P.BASE_LAT_US["ring"][0] < P.BASE_LAT_US["ring"][1]
    # the choice is the tuner's: LL at 1 MB, LL128 at 2 MB, as on C1's rows
    assert [collective_cost(a100, "all_reduce", n).protocol for n in (2**20, 2**21)] == \
        ["LL", "LL128"]
    two = load_preset("dgx-h100").with_overrides(nodes=2)
    x = collective_cost(two, "all_gather", 4 * 2**20, proto="LL128")
    # across nodes: the table's 14 us, 14 intra hops (at least 1 us each) and one network step
    assert x.latency_us == pytest.approx(P.CALL_US.value + P.BASE_LAT_US["ring"][1]
                                         + 14 * 1.9 + P.HOP_LAT_US["net"]["ring"][1])


def test_p2p_runs_ll_up_to_channels_per_peer_times_the_threshold_inside_one_domain():
    """C24 (NCCL 2.27 enqueue.cc / init): inside one NVLink domain a peer's message of at most
    p2pnChannelsPerPeer x NCCL_P2P_LL_THRESHOLD (32 x 16 KiB = 512 KiB) runs LL; the LL rate
    is the channels busy (each peer on nChannelsMin of p2pnChannels = 32) x half a ring LL
    channel (sends and receives split a channel's warps); across domains always Simple."""
    rack = load_preset("gb300-nvl72")
    for n, busy in ((4, 24), (8, 28), (64, 32)):
        c = rack.with_overrides(nodes=n // 4, nvlink_domain=min(n, 72)) if n > 4 else \
            rack.with_overrides(nodes=1, nvlink_domain=4)
        assert collective_cost(c, "alltoall", n * 512 * 1024).protocol == "LL"
        assert collective_cost(c, "alltoall", n * 1024 * 1024).protocol == "Simple"
        assert collective_cost(c, "alltoall", n * 1024 * 1024, proto="LL").protocol == "LL"
        g = group_of(c)
        L = nccl._links(c, g)
        assert nccl.p2p_channels(L) == (32, 32)
        ring_ll = nccl._busbw(c, g, L, Collective.alltoall, nccl.Algo.ring, nccl.Proto.ll)
        assert nccl.p2p_ll_rate(c, g, L) == pytest.approx(busy * ring_ll / 32 / 2)
    two_racks = rack.with_overrides(nodes=32, nvlink_domain=64)
    assert collective_cost(two_racks, "alltoall", 2**20).protocol == "Simple"
    with pytest.raises(ConfigError, match="LL only where every peer is over NVLink"):
        collective_cost(two_racks, "alltoall", 2**20, proto="LL")


def test_nvls_rate_scales_as_heads_over_heads_plus_one():
    """C21 (NVIDIA/nccl #1455, 8 x H100, NCCL_ALGO=NVLS, 2-4 GB): 5, 6, 7, 8 GPUs reach
    258, ~265, ~270, 273 GB/s algbw; every GPU moves S (1 + 1/k), so the rate goes as
    k / (k + 1): the published ratios within 1%. The generation's rate holds at the size it
    was measured on (8 H100, C2; 72 GB200, C10)."""
    h100, gb200 = load_preset("dgx-h100"), load_preset("gb200-nvl72")
    for k, pub in ((5, 258.0), (6, 265.0), (7, 270.0)):
        assert nvls_algbw(h100, k) / nvls_algbw(h100, 8) == pytest.approx(pub / 273.0, rel=0.01)
    assert nvls_algbw(h100, 8) == pytest.approx(450.0 * 0.61, rel=1e-12)
    assert nvls_algbw(gb200, 72) == pytest.approx(900.0 * 0.49, rel=1e-12)
    assert nvls_algbw(gb200, 4) < nvls_algbw(gb200, 8) < nvls_algbw(gb200, 72)


def test_nvls_latency_grows_with_the_domain_but_the_tuner_ranks_with_the_table():
    """C21: a step's scatter and gather visit the domain's k heads one after another, so an
    NVLS all-reduce of k ranks pays 23 us + NVLS_HEAD_US per head beyond NCCL's 8 (C0, C7);
    NCCL's tuner ranks with the table's 23 us whatever k (C16), so the choice does not move."""
    assert nvls_hop_us(8) == pytest.approx(23.0, rel=1e-12)
    assert nvls_hop_us(64) - nvls_hop_us(8) == pytest.approx(56 * P.NVLS_HEAD_US.value)
    gb300 = load_preset("gb300-nvl72")
    small = {k: collective_cost(gb300.with_overrides(nodes=k // 4), "all_reduce", 1024,
                                algo="nvls") for k in (8, 64)}
    # at 1 KiB the bytes cost nothing: the 56 extra heads are the difference
    assert small[64].time_us - small[8].time_us == pytest.approx(56 * P.NVLS_HEAD_US.value,
                                                                 rel=0.01)
    assert small[64].latency_us == pytest.approx(P.CALL_US.value + nvls_hop_us(64))
    # 64 GPUs in one rack, 1 MB: NVLS still wins NCCL's ranking (23 us vs ring LL's 82 us)
    assert collective_cost(gb300.with_overrides(nodes=16), "all_reduce", 2**20).algorithm \
        == "nvls"
    # a stated per-hop latency replaces the table and the per-head term alike
    stated = gb300.with_overrides(nodes=16, intra_hop_us=10.0)
    assert collective_cost(stated, "all_reduce", 1024, algo="nvls").latency_us == \
        pytest.approx(P.CALL_US.value + 10.0)


def _bench():
    return bench_module("cost")


def test_nvls_tree_leaves_each_domain_on_one_nic_per_head():
    """NVLS-tree's network leg runs on the domain's NVLS heads, one NIC each (C25: NCCL's
    NVLS graph has min(NCCL_MAX_NVLS_ARITY = 32, GPUs) channels, one head GPU with its NIC
    each), not on the two channels per NIC of a ring leaving the domain: a 64-GPU rack with
    a NIC per GPU uses 32 NICs (a ring: 16); an 8-GPU, 8-NIC node uses its 8 either way."""
    oci = read_cluster(ROOT / "bench" / "data" / "oci-gb200-4.toml")
    g = group_of(oci)
    assert (g.ranks, g.per_node, g.nodes) == (128, 64, 2)
    assert nccl.nvls_heads(g) == 32
    nic = 50.0 * P.NET_EFF["roce"].value
    assert nccl.nvls_tree_net(oci, g) == pytest.approx(32 * nic)
    ring_nics = nccl._links(oci, g).net_node / nic
    assert ring_nics == pytest.approx(16)
    # the tree's network rate (32 NICs / 2 x 0.92 = 699 GB/s) exceeds the rack's NVLS rate,
    # so the 2-rack all-reduce runs at the in-rack NVLS rate
    r = collective_cost(oci, "all_reduce", 2**33, algo="nvls_tree")
    assert r.bandwidth_gbps == pytest.approx(nvls_algbw(oci, 64))
    dgx = load_preset("dgx-h100").with_overrides(nodes=2)
    gd = group_of(dgx)
    assert nccl.nvls_heads(gd) == 8
    assert nccl.nvls_tree_net(dgx, gd) == pytest.approx(nccl._links(dgx, gd).net_node)


def test_c25_gb200_series_read_ocis_deployment_and_hold_where_a_mechanism_is_known():
    """C25 (OCI GB200, 4 x 400 Gb/s RoCE per 4-GPU host, racks of 16 hosts; judged, 4 / 8 GB
    rows): every series reads bench/data/oci-gb200-4.toml; one host (ring all-reduce and
    alltoall) within 10%; the 2-rack alltoall is the C20 formula on one NIC per GPU (half
    of each rank's bytes through its 400 Gb/s NIC: 2 x 47.5 x 127/128) within 10%, and the
    2-rack all-reduce (NVLS-tree at the rack's NVLS rate) within 10%; every row within 25%."""
    bench = _bench()
    c25 = [s for s in _series()["collective"] if s["id"] == "C25"]
    assert len(c25) == 9 and all(s["cluster"] == "oci-gb200-4.toml" for s in c25)
    rows = {(s["collective"], s["nodes"]): bench.collective_rows(s) for s in c25}
    assert all(r["role"] == "judge" for rs in rows.values() for r in rs)
    for key in (("all_reduce", 1), ("alltoall", 1), ("alltoall", 32), ("all_reduce", 32)):
        assert max(abs(r["error"]) for r in rows[key]) < 0.10, key
    assert {r["algorithm"] for r in rows[("all_reduce", 32)]} == {"nvls_tree"}
    for r in rows[("alltoall", 32)]:
        assert r["predicted"] == pytest.approx(2 * 50.0 * P.NET_EFF["roce"].value * 127 / 128,
                                               rel=0.02)
    assert max(abs(r["error"]) for rs in rows.values() for r in rs) < 0.25


def test_c25_in_rack_all_reduce_is_64_ranks_by_its_own_bus_factor():
    """The guide prints this table under "2 Nodes on a Single Rack", but nccl-tests' busbw /
    algbw of its rows (855.95 / 434.77 and 891.64 / 452.90 GB/s) is 2 (n-1)/n for n = 64, not
    8 (1.75): the series is 16 hosts of one rack, and NVLS over 64 GPUs prices it within 10%."""
    for busbw, algbw in ((855.95, 434.77), (891.64, 452.90)):
        n = round(2 / (2 - busbw / algbw))
        assert n == 64 and busbw / algbw == pytest.approx(bus_factor(Collective.all_reduce, 64),
                                                           abs=1e-3)
    bench = _bench()
    s = next(s for s in _series()["collective"] if s["id"] == "C25"
             and s["collective"] == "all_reduce" and s["nodes"] == 16)
    rows = bench.collective_rows(s)
    assert {r["algorithm"] for r in rows} == {"nvls"}
    assert max(abs(r["error"]) for r in rows) < 0.10


def test_a_ring_leaving_the_node_fills_its_nvlink_hops_at_the_nvlink_rate():
    """The fill pass of a ring that leaves its NVLink domain: the first chunk crosses one
    network hop per node at the NIC-bound rate and the other hops at the NVLink rate (a
    pipeline fills in the sum of its stages' times). C11's cluster (3 x 8 A100, 4 HDR NICs
    per node: 8 channels, 4 x 25 x 0.97 = 97 GB/s per node, NVLink 300 x 0.78 = 234):
    weight (21 x 97 / 234 + 3) / 24; the ring's time is call + latency + (S + softmin(S,
    24 x 8 x 64 KiB x weight)) / algbw. Inside one node, and with one GPU per node, 1."""
    c = load_preset("dgx-a100").with_overrides(gpu="a100-40gb", nodes=3, nics_per_node=4)
    g = group_of(c)
    L = nccl._links(c, g)
    intra, net = 300.0 * 0.78, 4 * 25.0 * 0.97
    assert (L.intra, L.net_node, L.channels) == pytest.approx((intra, net, 8))
    w = (21 * net / intra + 3) / 24
    assert nccl.ring_fill_weight(g, L) == pytest.approx(w)
    s = 2**27
    r = collective_cost(c, "all_reduce", s, algo="ring", proto="Simple")
    algbw = net / bus_factor(Collective.all_reduce, 24)
    fill = _soft_min(s, 24 * 8 * 64 * 1024 * w)
    assert r.time_us == pytest.approx(r.latency_us + (s + fill) / (algbw * 1e3), rel=1e-9)
    one = load_preset("dgx-a100")
    assert nccl.ring_fill_weight(group_of(one), nccl._links(one, group_of(one))) == 1.0
    solo = load_preset("dgx-a100").with_overrides(nodes=4, gpus_per_node=1)
    assert nccl.ring_fill_weight(group_of(solo), nccl._links(solo, group_of(solo))) == 1.0
