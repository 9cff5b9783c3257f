"""NVLS all-gather and reduce-scatter inside one NVLink domain (issue 32, REFERENCES.md C39):
the rate from the device code's traffic (one direction of each GPU's links carries the full
buffer S, the all-reduce S (1 + 1/k)), NCCL's rule for where NVLS runs (one node only), and
the tuner's choice between NVLS and the ring."""

from __future__ import annotations

import pytest

from retime.collectors.costs import collective_cost, load_preset
from retime.collectors.costs import nccl_params as P
from retime.collectors.costs.nccl import nvls_algbw, nvls_gather_algbw
from retime.collectors.errors import ConfigError


@pytest.mark.parametrize("gpus", [4, 8])
@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
def test_nvls_gather_rate_is_the_all_reduces_link_rate_on_s_not_s_1_plus_1_over_k(coll, gpus):
    """H100 (NVLS_EFF 0.61 of 450 GB/s at 8 ranks, C2): the all-reduce moves S (1 + 1/k)
    each way at 450 x 0.61 x 9/8 = 308.8 GB/s, so its algbw is that x k/(k+1); an
    all-gather / reduce-scatter moves S one way at the same rate: algbw 308.8 GB/s, whatever
    k (closed form, recomputed from the parameters, not from the model's output)."""
    c = load_preset("dgx-h100").with_overrides(gpus_per_node=gpus)
    link = 450.0 * P.NVLS_EFF["nvlink4"].value * 9 / 8  # GB/s per direction, multicast
    assert nvls_gather_algbw(c, gpus) == pytest.approx(link)
    assert nvls_algbw(c, gpus) == pytest.approx(link * gpus / (gpus + 1))
    r = collective_cost(c, coll, 2**33, algo="nvls")
    assert (r.algorithm, r.protocol, r.channels) == ("nvls", "Simple", 16)
    assert r.bandwidth_gbps == pytest.approx(link)
    # the time: per-call cost + NVLS latency + S / rate + the fill pass of the data in flight
    inflight = gpus * 16 * 128 * 1024
    s = 2**33
    fill = s * inflight / (s**2 + inflight**2) ** 0.5
    lat = P.CALL_US.value + P.HOP_LAT_US["nvlink"]["nvls"][2] + P.NVLS_HEAD_US.value * (gpus - 8)
    assert r.time_us == pytest.approx(lat + (s + fill) / (link * 1e3))


def test_nvls_gather_runs_on_one_node_only():
    """NCCL enables NVLS for all-gather / reduce-scatter on one node (or one MNNVL domain);
    across nodes only with CollNet, which the model does not run for them (tuning.cc, C39)."""
    two = load_preset("dgx-h100").with_overrides(nodes=2)
    for coll in ("all_gather", "reduce_scatter"):
        with pytest.raises(ConfigError, match="spans 2 NVLink domains"):
            collective_cost(two, coll, 2**26, algo="nvls")
        assert collective_cost(two, coll, 2**26).algorithm == "ring"
        with pytest.raises(ConfigError, match="NVLS needs NVLink SHARP"):
            collective_cost(load_preset("dgx-a100"), coll, 2**26, algo="nvls")
        with pytest.raises(ConfigError, match="NVLS"):
            collective_cost(load_preset("dgx-h100"), coll, 2**26, algo="nvls", proto="LL128")
    # one NVL72 rack is one NVLink domain: NVLS is a candidate there
    nvl = load_preset("gb200-nvl72")
    assert collective_cost(nvl, "all_gather", 2**26, algo="nvls").channels == 24
    # alltoall and broadcast stay off NVLS
    with pytest.raises(ConfigError, match="ring algorithm only"):
        collective_cost(load_preset("dgx-h100"), "broadcast", 2**26, algo="nvls")


def test_the_tuner_takes_nvls_for_mid_sizes_and_the_ring_for_large_ones_on_h100():
    """On 8 H100 the NVLS all-gather's 308.8 GB/s is under the ring's 450 x 0.82 x 8/7 =
    421.7 GB/s algbw, so NCCL's latency table (NVLS 23 us against ring LL128 14 + 7 x 1.9 and
    LL 6.6 + 7 x 0.6 at LL's 87.7 GB/s ceiling) makes NVLS the choice between LL's and LL128's
    ranges only: 2 and 4 MB NVLS, 1 MB LL, 1 GB ring Simple."""
    h100 = load_preset("dgx-h100")
    for coll in ("all_gather", "reduce_scatter"):
        got = {s: collective_cost(h100, coll, s) for s in (2**20, 2**21, 2**22, 2**30)}
        assert (got[2**20].algorithm, got[2**20].protocol) == ("ring", "LL")
        assert got[2**21].algorithm == got[2**22].algorithm == "nvls"
        assert (got[2**30].algorithm, got[2**30].protocol) == ("ring", "Simple")


def test_cli_prices_a_forced_nvls_all_gather_and_refuses_it_across_nodes(capsys):
    """`retime cost collective all_gather --algo nvls` runs the same function (one JSON row
    per size, algorithm nvls); across two nodes it is one line, exit 2, JSON under --json."""
    import json

    from retime.cli import run

    argv = ["cost", "collective", "all_gather", "--preset", "dgx-h100", "--algo", "nvls",
            "--sizes", "16M", "--json"]
    assert run(argv) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    ref = collective_cost(load_preset("dgx-h100"), "all_gather", 2**24, algo="nvls")
    assert [(r["algorithm"], r["time_us"]) for r in rows] == [("nvls", round(ref.time_us, 3))]
    assert run(argv[:-1] + ["--nodes", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "NVLink domain" in err and "Traceback" not in err
    # the table's assumed: lines say which NVLS rate an all-gather used
    assert run(argv[:-1]) == 0
    nvls_line = [ln for ln in capsys.readouterr().out.splitlines()
                 if ln.startswith("assumed: NVLS")]
    assert len(nvls_line) == 1 and "(k+1)/k" in nvls_line[0] and "C39" in nvls_line[0]


def test_held_out_gb200_two_rack_series_within_the_issues_15_percent():
    """C41 (held out, scored once at d76565c): CoreWeave's 2-rack GB200 NVL72 all_reduce,
    144 ranks in two NVLink domains of 72, 512 MB / 1 GB within the issue's 15% (-2.8 /
    -3.9%). The ranks are recounted from the source's last rank line ("Rank 143")."""
    from conftest import bench_module

    bench = bench_module("cost")
    s = next(s for s in bench.load()["collective"] if s["id"] == "C41")
    c = bench.cluster_of(s)
    assert c.world_size == 143 + 1 and c.nvlink_domain == 72
    rows = bench.collective_rows(s)
    assert [r["bytes"] for r in rows] == [2**29, 2**30]
    assert {(r["algorithm"], r["role"]) for r in rows} == {("nvls_tree", "judge")}
    assert max(abs(r["error"]) for r in rows) < 0.15


def test_held_out_h100_forced_ring_reduce_scatter_within_the_issues_15_percent():
    """C42 (held out, scored once at deae612): one 8 x H100 node's reduce_scatter with the
    ring forced (NVIDIA/nccl #1047), 128 MB - 1 GB, within the issue's 15% (worst -4.5%);
    the ring's bus rate there is 450 x 0.82 = 369 GB/s before fill and latency, above every
    published row (closed form: the rows climb towards it, 311 -> 349 GB/s)."""
    from conftest import bench_module

    bench = bench_module("cost")
    s = next(s for s in bench.load()["collective"] if s["id"] == "C42")
    rows = bench.collective_rows(s)
    assert [r["bytes"] for r in rows] == [2**p for p in range(27, 31)]
    assert {(r["algorithm"], r["protocol"]) for r in rows} == {("ring", "Simple")}
    assert all(r["published"] < 450 * P.LINK_EFF["nvlink4"].value for r in rows)
    assert max(abs(r["error"]) for r in rows) < 0.15
