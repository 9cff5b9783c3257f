"""NCCL's own corrections of its tuning model (``ncclTopoGetAlgoTime``, REFERENCES C51): the
tree all-reduce bandwidth table at medium sizes and the ring Simple latency across nodes."""

from __future__ import annotations

import pytest

from retime.collectors.costs import Collective, collective_cost, group_of, load_preset
from retime.collectors.costs import nccl as nccl
from retime.collectors.costs import nccl_params as P
from retime.collectors.costs.nccl_rates import Algo, Proto, _links

MiB = 1 << 20


@pytest.mark.parametrize(("proto", "nbytes", "want"), [
    (Proto.ll128, MiB, 0.6),      # log2(1 MiB >> 6) = 14
    (Proto.simple, MiB, 0.5),
    (Proto.ll, 4 * MiB, 0.7),     # index 16
    (Proto.simple, 64 * MiB, 0.8),  # index 20
    (Proto.simple, 1 << 30, 1.0),   # above the table (index 24)
    (Proto.ll, 32, 1.0),            # below it (32 >> 6 = 0)
    (Proto.simple, 64, 0.9),        # index 0
])
def test_tree_correction_reads_nccls_table(proto, nbytes, want):
    assert nccl.tree_correction(proto, nbytes) == pytest.approx(want)


def test_tree_all_reduce_bandwidth_is_corrected_at_medium_sizes():
    c = load_preset("dgx-a100").with_overrides(nodes=2)
    small = collective_cost(c, "all_reduce", MiB, algo="tree", proto="LL128")
    large = collective_cost(c, "all_reduce", 1 << 30, algo="tree", proto="LL128")
    assert small.bandwidth_gbps == pytest.approx(large.bandwidth_gbps * 0.6)


def test_ring_simple_latency_across_nodes_pays_the_plateau_factor():
    c = load_preset("dgx-h100").with_overrides(nodes=2)
    g = group_of(c, None)
    raw = nccl._latency_us(c, g, Collective.all_reduce, Algo.ring, Proto.simple)
    cc = collective_cost(c, "all_reduce", 64 * MiB, algo="ring", proto="Simple")
    assert cc.latency_us == pytest.approx(P.CALL_US.value + P.RING_NET_SIMPLE_LAT.value * raw)
    # not for all-gather, not for LL128, not inside one node
    ag = collective_cost(c, "all_gather", 64 * MiB, algo="ring", proto="Simple")
    raw_ag = nccl._latency_us(c, g, Collective.all_gather, Algo.ring, Proto.simple)
    assert ag.latency_us == pytest.approx(P.CALL_US.value + raw_ag)
    one = load_preset("dgx-h100")
    g1 = group_of(one, None)
    raw1 = nccl._latency_us(one, g1, Collective.all_reduce, Algo.ring, Proto.simple)
    cc1 = collective_cost(one, "all_reduce", 64 * MiB, algo="ring", proto="Simple")
    assert cc1.latency_us == pytest.approx(P.CALL_US.value + raw1)
    # below 64 bytes per rank and channel NCCL does not apply it
    L = _links(c, g)
    tiny = L.channels * g.ranks * 63
    assert nccl._net_lat_factor(c, g, L, Collective.all_reduce, Algo.ring, Proto.simple,
                                tiny) == 1.0
