"""Rack-scale hardware: GB200/GB300 NVL72 profiles and presets, the NVLink domain as the
level that decides which collectives cross the network, and the 2025 accelerators."""

from __future__ import annotations

import dataclasses

import pytest

from retime.cli import run
from retime.collectors.costs import collective_cost, gpu_spec, load_preset, preset_names
from retime.collectors.enums import CommOp
from retime.collectors.errors import ConfigError
from retime.collectors.synth import CommModel, load_hardware, resolve_parallel
from retime.collectors.synth.hardware import job_domain

# dense peaks (TFLOP/s) from the datasheets' rack / system figures (REFERENCES.md H1-H5),
# derived here independently of the profiles: sparse | dense tables, or sparse / 2
DATASHEET = {
    "gb200": {"fp4": 1_440_000 / 72 / 2, "fp8": 720_000 / 72 / 2, "bf16": 360_000 / 72 / 2},
    "gb300": {"fp4": 1_080_000 / 72, "fp8": 720_000 / 72 / 2, "bf16": 360_000 / 72 / 2},
    "b300": {"fp4": 108_000 / 8, "fp8": 72_000 / 8 / 2, "bf16": 36_000 / 8 / 2},
    "mi325x": {"fp8": 2614.9, "bf16": 1307.4},
    "mi355x": {"fp4": 10066.3, "fp6": 10066.3, "fp8": 5033.2, "bf16": 2516.6},
}


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_profile_peaks_are_the_datasheets(name):
    hw = load_hardware(name)
    for dt, v in DATASHEET[name].items():
        assert hw.peak_tflops[dt] == pytest.approx(v, rel=1e-6), (name, dt)
        # the cost layer reads the same file: one source of truth
        assert gpu_spec(name).peak_tflops(dt) == hw.peak_tflops[dt]
    assert ("fp4" in hw.peak_tflops) == ("fp4" in DATASHEET[name])


def test_rack_profiles_carry_the_domain_and_the_host_link():
    gb200, gb300, b300 = (load_hardware(n) for n in ("gb200", "gb300", "b300"))
    assert (gb200.gpus_per_node, gb200.domain) == (4, 72)
    assert (gb300.gpus_per_node, gb300.domain) == (4, 72)
    assert b300.domain == b300.gpus_per_node == 8
    # NVLink-C2C: 450 GB/s per direction x 0.8, capped by the GPU's share of Grace's memory
    assert gb200.host_link == "c2c" and gb200.host_bytes_per_ns == pytest.approx(256.0)
    assert gb300.host_bytes_per_ns == pytest.approx(199.0)
    assert b300.host_link == "pcie5" and b300.host_bytes_per_ns == pytest.approx(51.2)
    # a profile without [host_link] keeps the earlier 25 GB/s of PCIe Gen4
    # H100: PCIe Gen5 x16 (H7), 64 GB/s per direction x the assumed 0.8; A100: Gen4's 25
    assert load_hardware("h100-sxm").host_bytes_per_ns == pytest.approx(64.0 * 0.8)
    assert load_hardware("a100-80gb").host_bytes_per_ns == pytest.approx(25.0)
    # one NIC per GPU: 400 Gb/s on GB200, 800 Gb/s ConnectX-8 on GB300 / B300
    assert gb200.inter.gbps == pytest.approx(50.0)
    assert gb300.inter.gbps == b300.inter.gbps == pytest.approx(100.0)


@pytest.mark.parametrize("preset", preset_names())
def test_presets_agree_with_their_gpu_profile(preset):
    """Cluster presets repeat the profile's link rates; this keeps the two equal."""
    c = load_preset(preset)
    hw = c.spec.hw
    if c.intra_fabric != "pcie":
        assert c.intra_gbps == hw.intra.gbps
    if hw.domain > hw.gpus_per_node:  # a rack GPU: the preset's domain is a rack of it
        assert c.nvlink_domain in (hw.domain, hw.domain // 2)  # NVL72, or NVL36
        assert c.gpus_per_node == hw.gpus_per_node


@pytest.mark.parametrize("world,expect", [(8, 72), (72, 72), (144, 72), (256, 64), (512, 64),
                                          (2496, 64), (5120, 64), (216, 72), (76, 4)])
def test_job_domain_places_jobs_evenly_over_racks(world, expect):
    assert job_domain(load_hardware("gb200"), world) == expect


@pytest.mark.parametrize("stated,world,msg", [(48, 64, "does not divide the job's 64"),
                                              (96, 192, "larger than gb200's NVLink domain")])
def test_stated_domain_is_checked(stated, world, msg):
    with pytest.raises(ConfigError, match=msg):
        job_domain(load_hardware("gb200"), world, stated)


def _cp_gather_ns(hw, **kw):
    p = resolve_parallel(None, **kw)
    comm = CommModel(hw, p)
    return comm, comm.collective_ns(CommOp.ALL_GATHER, 64e6, "cp")


def test_groups_spanning_trays_are_priced_on_nvlink():
    """TP4 x CP4 on GB200: a CP group's ranks sit on 4 trays of one rack -> NVLink; the same
    hardware with the domain cut to one tray prices it on the NICs."""
    hw = load_hardware("gb200")
    kw = dict(tp=4, cp=4, pp=8, dp=2, global_batch=16, micro_batch=1)
    comm, rack = _cp_gather_ns(hw, **kw)
    geo = comm.geometry["cp"]
    assert (geo.size, geo.nodes, geo.per_node) == (4, 1, 4)  # one domain
    assert comm.level(geo)[1] is hw.intra
    _, tray = _cp_gather_ns(dataclasses.replace(hw, nvlink_domain=0), **kw)
    assert tray > 3 * rack  # 50 GB/s of NIC against 900 of NVLink
    # pipeline neighbours 32 ranks apart on 256 GPUs in racks of 64: they cross racks
    pp = comm.geometry["pp"]
    assert comm.domain == 64 and pp.nodes == 4 and comm.level(pp)[1] is hw.inter


def test_cost_collective_rack_then_network():
    rack = load_preset("gb200-nvl72")
    one = collective_cost(rack, "all_reduce", 2**30)
    assert one.ranks == 72 and not any("network" in s for s in one.sources)
    two = collective_cost(rack.with_overrides(nodes=36), "all_reduce", 2**30)
    assert any("network" in s for s in two.sources)
    # grouped by NVLink domain (a rack of 72 GPUs and 72 NICs), not by tray of 4: NVLS-tree
    # leaves each rack on its 32 NVLS heads' NICs (C25), so the network is not one tray's 4
    # NICs (4 x 48.5 = 194 GB/s): it costs against one rack, but far less than a tray-bound
    # ring would (C16, C17)
    assert 4 * 48.5 < two.busbw_gbps < one.busbw_gbps
    assert two.algorithm == "nvls_tree" and one.algorithm == "nvls"
    assert one.busbw_gbps > 600  # NVLS over the 72-GPU domain (C10: 681 GB/s at 1 GB)


def test_cluster_whose_domain_does_not_divide_exits_2(capsys):
    rc = run(["cost", "collective", "all_reduce", "--preset", "gb200-nvl72", "--nodes", "64",
              "--sizes", "1G"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "nvlink_domain=72 does not divide the cluster's 256 GPUs" in err and "\n" not in err
    rc = run(["cost", "collective", "all_reduce", "--preset", "gb200-nvl72", "--nodes", "64",
              "--nvlink-domain", "64", "--sizes", "1G", "--json"])
    assert rc == 0


def test_new_presets_price_their_fabric():
    b300 = collective_cost(load_preset("dgx-b300"), "all_reduce", 2**30)
    assert b300.algorithm == "nvls"  # NVLink SHARP on one NVSwitch node
    mi355 = collective_cost(load_preset("mi355x-8x"), "all_reduce", 2**30)
    mi325 = collective_cost(load_preset("mi325x-8x"), "all_reduce", 2**30)
    assert mi355.busbw_gbps / mi325.busbw_gbps == pytest.approx(537.6 / 448.0, rel=0.05)


def test_a_traces_gpu_names_its_profile_and_host_link():
    from retime.collectors.synth.hardware import match_hardware
    devs = {"0": {"name": "NVIDIA GB200", "peak_flops": 2.5e15}}
    assert match_hardware(str(devs)).name == "gb200"  # not b200: the longest name wins
    assert match_hardware("NVIDIA B200").name == "b200"
    assert match_hardware("NVIDIA H100 80GB HBM3").host_bytes_per_ns == pytest.approx(51.2)
    assert match_hardware("a TPU") is None


def test_gb300_gemm_fractions_scale_with_board_power():
    """GB300 reuses GB200's measured GEMM fractions at 1400 W instead of 1200 W (H9): every
    sustained fraction is GB200's x 1400/1200, capped at the peak; GB200 itself is unscaled,
    and the cost layer's assumed ceiling for GB300 follows the same rule."""
    gb200, gb300 = load_hardware("gb200"), load_hardware("gb300")
    assert gb200.power_scale == 1.0
    assert gb300.power_scale == pytest.approx(1400 / 1200)
    for dt in ("bf16", "fp8", "fp4"):
        want = min(1.0, gb200.gemm_max_of(dt) * 1400 / 1200)
        assert gb300.gemm_max_of(dt) == pytest.approx(want), dt
        assert gb300.gemm_max_of(dt) <= 1.0
    ceil, src = gpu_spec("gb300").mamf("fp8")
    assert (ceil, src) == (pytest.approx(5000 * 0.6 * 1400 / 1200), "assumed")
    capped = dataclasses.replace(gb300, board_power_w=3000.0)
    assert capped.gemm_max_of("fp4") == 1.0


def test_power_without_a_board_limit_is_refused(tmp_path):
    from pathlib import Path

    src = Path(load_hardware("gb300").source).read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(src.replace("board_w = 1400.0", "board_w = 0.0"))
    with pytest.raises(ConfigError, match="board_w"):
        from retime.collectors.synth.hardware import read_hardware_file
        read_hardware_file(bad)
