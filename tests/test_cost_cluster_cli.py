"""One machine description for synth, replay and sweep (issue 32): `--cluster F.toml` gives
what the equivalent hardware profile / `--set` keys give, `--set` wins for the same key, bad
cluster files are one line and exit 2 (JSON with --json)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from retime.cli import run
from retime.collectors.costs import cluster_hardware, load_preset
from retime.collectors.errors import PolicyError
from retime.collectors.synth import load_hardware
from retime.replay.policies.scenario import CLUSTER_KEYS, cluster_keys

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = ["--tp", "2", "--pp", "2", "--dp", "4", "--global-batch", "16", "--micro-batch", "1"]
# hgx-h200 preset as keys, written out by hand: the H200 profile, 8 GPUs per NVLink domain,
# NVLink4 450 GB/s per GPU, 8 NICs x 400 Gbit/s = 8 x 50 GB/s shared by 8 GPUs
H200_KEYS = ["hardware.gpu=h200", "topology.ranks_per_node=8",
             "network.intra_node_gbps=450", "network.inter_node_gbps=50"]


def _one_json(out: str) -> dict:
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out
    return json.loads(lines[0])


def _sets(keys: list[str]) -> list[str]:
    return [a for k in keys for a in ("--set", k)]


def _json_run(argv: list[str], capsys) -> dict:
    capsys.readouterr()
    assert run([*argv, "--json"]) == 0
    return _one_json(capsys.readouterr().out)


def _fails(argv: list[str], capsys, *msgs: str) -> None:
    """Exit 2 with one line naming ``msgs``; with --json one JSON object with the same line."""
    capsys.readouterr()
    assert run(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for m in msgs:
        assert m in err, err
    assert run([*argv, "--json"]) == 2
    d = _one_json(capsys.readouterr().out)
    assert d["exit_code"] == 2
    for m in msgs:
        assert m in d["error"] + " " + (d.get("hint") or "")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cluster")
    model = d / "tiny.toml"
    model.write_text("hidden = 1024\nffn = 4096\nheads = 16\nlayers = 8\nseq = 1024\n"
                     "vocab = 32000\n")
    out = {"dir": d, "model": model}
    for preset, nodes in (("dgx-h100", 2), ("hgx-h200", 2), ("dgx-a100", 1)):
        f = d / f"{preset}.toml"
        assert run(["cost", "cluster", "--preset", preset, "--nodes", str(nodes),
                    "-o", str(f)]) == 0
        out[preset] = f
    run_h100 = d / "h100.retime"
    assert run(["synth", "--model-file", str(model), "--hardware", "h100-sxm", *LAYOUT,
                "-o", str(run_h100)]) == 0
    out["h100_run"] = run_h100
    return out


def test_cluster_hardware_maps_the_preset_fields():
    h100 = load_hardware("h100-sxm")
    hw = cluster_hardware(load_preset("dgx-h100"))
    # the GPU profile unchanged: compute, HBM, efficiencies, link alphas
    for f in ("name", "peak_tflops", "hbm_gbps", "memory_gib", "gemm_max", "sm_count",
              "kernel_overhead_us", "cross_dc"):
        assert getattr(hw, f) == getattr(h100, f), f
    assert hw.intra.latency_us == h100.intra.latency_us
    assert hw.inter.bus_efficiency == h100.inter.bus_efficiency
    # the links from the preset: 450 GB/s NVLink4, 8 x 400 Gbit/s = 8 x 50 GB/s over 8 GPUs
    assert (hw.gpus_per_node, hw.intra.gbps, hw.inter.gbps, hw.nics, hw.nic_gbps) == \
        (8, 450.0, 50.0, 8, 50.0)
    # a 4-GPU PCIe box with one 200 Gbit/s NIC: 25 GB/s shared by 4 GPUs
    pc = cluster_hardware(load_preset("pcie-4gpu"))
    assert (pc.name, pc.gpus_per_node, pc.intra.gbps, pc.inter.gbps, pc.nics) == \
        ("h100-pcie", 4, 64.0, 6.25, 1)
    # GB200 NVL72: 72 GPUs share NVLink (the intra level), 4 x 400 Gbit/s per 4-GPU tray
    nv = cluster_hardware(load_preset("gb200-nvl72"))
    assert (nv.gpus_per_node, nv.intra.gbps, nv.inter.gbps, nv.nics) == (72, 900.0, 50.0, 72)


def test_synth_cluster_equals_the_profile_with_the_same_links(files, capsys):
    base = ["synth", "--model-file", str(files["model"]), *LAYOUT]
    d = files["dir"]
    prof = _json_run([*base, "--hardware", "h100-sxm", "-o", str(d / "p.retime")], capsys)
    clu = _json_run([*base, "--cluster", str(files["dgx-h100"]), "-o", str(d / "c.retime")],
                    capsys)
    assert clu["step_time_ns"] == prof["step_time_ns"]
    assert clu["hardware"] == "h100-sxm"
    assert clu["cluster"] == {"name": "dgx-h100", "file": str(files["dgx-h100"]), "nodes": 2,
                              "gpus_per_node": 8}
    # other links: 4 NICs of 100 Gbit/s per node = 50 GB/s over 8 GPUs = 6.25 GB/s per GPU;
    # the same profile edited by hand to 4 NICs x 12.5 GB/s must agree
    slow = d / "slow.toml"
    slow.write_text(files["dgx-h100"].read_text().replace("nics_per_node = 8",
                                                          "nics_per_node = 4")
                    .replace("nic_gbit = 400.0", "nic_gbit = 100.0"))
    prof_file = d / "h100-slow-nic.toml"
    src = (ROOT / "collectors" / "synth" / "hardware" / "h100-sxm.toml").read_text()
    assert "nics = 8\nnic_gbps = 50.0" in src
    prof_file.write_text(src.replace("nics = 8\nnic_gbps = 50.0", "nics = 4\nnic_gbps = 12.5"))
    a = _json_run([*base, "--cluster", str(slow), "-o", str(d / "s1.retime")], capsys)
    b = _json_run([*base, "--hardware-file", str(prof_file), "-o", str(d / "s2.retime")],
                  capsys)
    assert a["step_time_ns"] == b["step_time_ns"] > prof["step_time_ns"]


def test_synth_cluster_bad_input(files, capsys):
    d = files["dir"]
    base = ["synth", "--model-file", str(files["model"]), "-o", str(d / "bad.retime")]
    # 2 nodes x 8 GPUs = 16, the layout asks for 32
    _fails([*base, *LAYOUT, "--tp", "4", "--cluster", str(files["dgx-h100"])], capsys,
           "16 GPUs", "tp*pp*dp*cp", "= 32", "nodes = 4")
    _fails([*base, *LAYOUT, "--cluster", str(files["dgx-h100"]), "--hardware", "h100-sxm"],
           capsys, "exactly one of --hardware NAME, --hardware-file F.toml or --cluster")
    broken = d / "broken.toml"
    broken.write_text("gpu = \"h100-sxm\"\ngpus_per_node = [8\n")
    _fails([*base, *LAYOUT, "--cluster", str(broken)], capsys, "not valid TOML")
    nvls = d / "nvls.toml"
    nvls.write_text(files["dgx-a100"].read_text().replace("nvls = false", "nvls = true"))
    _fails([*base, *LAYOUT, "--cluster", str(nvls)], capsys, "NVLS", "set nvls = false")
    assert not (d / "bad.retime").exists()


def test_replay_cluster_equals_set_keys_on_a_synthesized_run(files, capsys):
    r = str(files["h100_run"])
    base = _json_run(["replay", r], capsys)["step_time_ns"]
    clu = _json_run(["replay", r, "--cluster", str(files["hgx-h200"])], capsys)
    keys = _json_run(["replay", r, *_sets(H200_KEYS)], capsys)
    assert clu["step_time_ns"]["replayed"] == keys["step_time_ns"]["replayed"]
    assert clu["step_time_ns"]["replayed"] < base["replayed"]  # H200: faster HBM
    assert clu["cluster"]["keys"] == {"hardware.gpu": "h200", "topology.ranks_per_node": 8,
                                      "network.intra_node_gbps": 450.0,
                                      "network.inter_node_gbps": 50.0}
    assert clu["cluster"]["left_out"] == {}
    # re-synthesized on the cluster = synthesized on it (H100 and H200 share link alphas)
    d = files["dir"]
    on = d / "h200.retime"
    assert run(["synth", "--model-file", str(files["model"]), *LAYOUT, "--cluster",
                str(files["hgx-h200"]), "-o", str(on)]) == 0
    assert _json_run(["replay", str(on)], capsys)["step_time_ns"]["replayed"] == \
        clu["step_time_ns"]["replayed"]
    # --set wins over the cluster for the same key
    slow = _json_run(["replay", r, "--cluster", str(files["hgx-h200"]), "--set",
                      "network.inter_node_gbps=5"], capsys)
    ref = _json_run(["replay", r, *_sets(H200_KEYS[:3] + ["network.inter_node_gbps=5"])],
                    capsys)
    assert slow["step_time_ns"]["replayed"] == ref["step_time_ns"]["replayed"] > \
        clu["step_time_ns"]["replayed"]
    assert slow["cluster"]["overridden"] == ["network.inter_node_gbps"]
    assert clu["cluster"]["overridden"] == []
    # so does a --scenario file
    sc = d / "sc.toml"
    sc.write_text("[network]\ninter_node_gbps = 5\n")
    via_file = _json_run(["replay", r, "--cluster", str(files["hgx-h200"]), "--scenario",
                          str(sc)], capsys)
    assert via_file["step_time_ns"]["replayed"] == ref["step_time_ns"]["replayed"]


def test_replay_cluster_equals_set_keys_on_a_real_trace(files, shared_traces, capsys):
    d = files["dir"]
    dl = d / "dlrm.retime"
    assert run(["ingest", str(shared_traces / "kineto" / "dlrm-v100-8rank"), "-o",
                str(dl)]) == 0
    a100 = str(files["dgx-a100"])
    # a GPU without a built-in profile (the V100 renamed): the GPU swap needs
    # hardware.from_gpu, and the error says the cluster set hardware.gpu
    meta = json.loads((dl / "meta.json").read_text())
    (dl / "meta.json").write_text(json.dumps(meta).replace("V100", "Z100"))
    _fails(["replay", str(dl), "--cluster", a100], capsys, f"--cluster {a100} sets "
           "hardware.gpu=a100-80gb", "hardware.from_gpu")
    clu = _json_run(["replay", str(dl), "--cluster", a100, "--set",
                     "hardware.from_gpu=a100-40gb"], capsys)
    # dgx-a100 by hand: A100 80GB, 8 per node, NVLink3 300 GB/s, 8 x 200 Gbit/s over 8 GPUs
    keys = _json_run(["replay", str(dl), *_sets(
        ["hardware.gpu=a100-80gb", "hardware.from_gpu=a100-40gb", "topology.ranks_per_node=8",
         "network.intra_node_gbps=300", "network.inter_node_gbps=25"])], capsys)
    assert clu["step_time_ns"] == keys["step_time_ns"]
    assert clu["whatif"]["assumed"] == keys["whatif"]["assumed"]
    assert set(clu["cluster"]["keys"]) == set(CLUSTER_KEYS)
    # a slower NVLink stated with --set wins, and moves the step
    slow = _json_run(["replay", str(dl), "--cluster", a100, "--set",
                      "hardware.from_gpu=a100-40gb", "--set", "network.intra_node_gbps=1"],
                     capsys)
    assert slow["step_time_ns"]["replayed"] > clu["step_time_ns"]["replayed"]


def test_cluster_keys_fit_the_trace(files, shared_traces):
    from conftest import ingest_cached

    from retime.collectors.trace import read_trace

    # an op-level (Megatron timer) trace: collectives without sizes, the links cannot apply
    op = ingest_cached(shared_traces / "oplevel" / "megatron-ST-8rank")
    ck = cluster_keys(load_preset("dgx-a100"), op)
    assert ck.keys == {"hardware.gpu": "a100-80gb"}
    assert set(ck.left_out) == set(CLUSTER_KEYS) - {"hardware.gpu"}
    assert "carry no sizes" in ck.left_out["network.intra_node_gbps"]
    # 16 ranks on one 8-GPU node: refused
    with pytest.raises(PolicyError, match="16 ranks but the cluster only 8 GPUs"):
        cluster_keys(load_preset("dgx-h100"), read_trace(files["h100_run"]))


def test_sweep_cluster_rows_equal_replay_with_the_keys(files, capsys):
    d = files["dir"]
    grid = d / "grid.toml"
    grid.write_text('[grid]\n"overlap.mode" = ["serial", "async"]\n'
                    '"network.inter_node_gbps" = [12.5]\n')
    out = d / "s.parquet"
    s = _json_run(["sweep", str(files["h100_run"]), "--grid", str(grid), "--cluster",
                   str(files["hgx-h200"]), "-o", str(out), "--workers", "1"], capsys)
    assert s["failed"] == 0 and s["cluster"]["name"] == "hgx-h200"
    df = pd.read_parquet(out)
    assert df["hardware.gpu"].tolist() == ["h200", "h200"]
    assert df["network.inter_node_gbps"].tolist() == [12.5, 12.5]  # the grid wins
    for mode, got in zip(df["overlap.mode"], df["step_time_ns"], strict=True):
        ref = _json_run(["replay", str(files["h100_run"]), *_sets(
            H200_KEYS[:3] + ["network.inter_node_gbps=12.5", f"overlap.mode={mode}"])],
            capsys)
        assert int(got) == ref["step_time_ns"]["replayed"]
    broken = d / "broken-net.toml"
    broken.write_text(files["hgx-h200"].read_text().replace('fabric = "infiniband"',
                                                            'fabric = "ethernet"'))
    _fails(["sweep", str(files["h100_run"]), "--grid", str(grid), "--cluster", str(broken),
            "-o", str(d / "never.parquet")], capsys, "'ethernet'", "infiniband")
    assert not (d / "never.parquet").exists()


def test_synth_cluster_as_a_subprocess(files, tmp_path):
    p = subprocess.run([sys.executable, "-m", "retime", "synth", "--model-file",
                        str(files["model"]), *LAYOUT, "--tp", "1", "--cluster",
                        str(files["dgx-h100"]), "-o", str(tmp_path / "x.retime"), "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2
    d = _one_json(p.stdout)
    assert "8 GPUs" in d["error"] or "= 8" in d["error"]
    assert not (tmp_path / "x.retime").exists()
