"""Scenarios: TOML files, --set parsing, the key vocabulary, errors, and the replay CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from retime.cli import run
from retime.collectors.errors import PolicyError
from retime.collectors.synth import synthesize
from retime.replay import Scenario, load_scenario, parse_set, whatif
from retime.replay.policies import Network, Overlap, vocabulary

DESIGN_KEYS = ["hardware.compute_speedup", "hardware.gemm_speedup", "hardware.gpu",
               "network.intra_node_gbps", "network.inter_node_gbps", "network.latency_us",
               "topology.ranks_per_node", "overlap.mode", "overlap.bucket_mb",
               "overlap.interference", "parallel.dp", "parallel.tp", "parallel.pp",
               "parallel.schedule", "parallel.micro_batch", "parallel.zero", "cache.fcdp",
               "cache.recompute", "stragglers.ideal"]


def test_vocabulary_has_every_design_key():
    assert set(DESIGN_KEYS) <= set(vocabulary())


def test_parse_set_types():
    d = parse_set(["network.inter_node_gbps=25", "overlap.mode=serial", "cache.fcdp=true",
                   "stragglers.slow_ranks=[1, 3]", "hardware.gpu=h100-sxm",
                   "overlap.interference=0.42", "stragglers.slowdown=1.5"])
    assert d == {"network.inter_node_gbps": 25, "overlap.mode": "serial", "cache.fcdp": True,
                 "stragglers.slow_ranks": [1, 3], "hardware.gpu": "h100-sxm",
                 "overlap.interference": 0.42, "stragglers.slowdown": 1.5}
    sc = Scenario.from_dict(d)
    assert [p.table for p in sc.policies] == ["cache", "hardware", "network", "overlap",
                                              "stragglers"]
    assert sc.to_dict()["network.inter_node_gbps"] == 25.0
    assert isinstance(sc.to_dict()["network.inter_node_gbps"], float)
    for bad, msg in (("network.inter_node_gbps", "key=value"), ("gbps=3", "table.field")):
        with pytest.raises(PolicyError, match=msg):
            parse_set([bad])


def test_unknown_keys_and_impossible_values_are_named():
    with pytest.raises(PolicyError, match="unknown table 'netwrk'"):
        Scenario.from_dict({"netwrk.inter_node_gbps": 1})
    with pytest.raises(PolicyError, match="unknown field 'gbps' of \\[network\\]"):
        Scenario.from_dict({"network": {"gbps": 1}})
    with pytest.raises(PolicyError, match="inter_node_gbps=0"):
        Scenario.from_dict({"network.inter_node_gbps": 0})
    with pytest.raises(PolicyError, match="schedule='zigzag'"):
        Scenario.from_dict({"parallel.schedule": "zigzag"})
    with pytest.raises(PolicyError, match="ranks_per_node=2.5"):
        Scenario.from_dict({"topology.ranks_per_node": 2.5})


def test_toml_file_with_tables_and_overrides(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('[network]\ninter_node_gbps = 25\nlatency_us = 8\n[overlap]\nmode = "serial"\n'
                 '"stragglers.ideal" = true\n')
    with pytest.raises(PolicyError, match="unknown field 'stragglers.ideal' of \\[overlap\\]"):
        load_scenario(f)
    f.write_text('"stragglers.ideal" = true\n[network]\ninter_node_gbps = 25\n[overlap]\n'
                 'mode = "serial"\n')
    sc = load_scenario(f, ["network.inter_node_gbps=12.5"])
    assert sc.name == "s"
    assert sc.to_dict() == {"network.inter_node_gbps": 12.5, "overlap.mode": "serial",
                            "stragglers.ideal": True}
    (tmp_path / "bad.toml").write_text("[network\n")
    with pytest.raises(PolicyError, match="not valid TOML"):
        load_scenario(tmp_path / "bad.toml")
    with pytest.raises(PolicyError, match="cannot read"):
        load_scenario(tmp_path / "none.toml")


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("s") / "dp.retime"
    synthesize("gpt3-125m", "a100-80gb", tp=1, pp=1, dp=16, global_batch=16,
               micro_batch=1).save(d)
    return d


def test_whatif_meta_lists_every_policy(synth_dir):
    from retime.collectors.trace import read_trace
    t = read_trace(synth_dir)
    r = whatif(t, [Network(inter_node_gbps=12.5), Overlap(mode="serial")])
    assert r.meta["scenario"] == [{"policy": "network", "inter_node_gbps": 12.5},
                                  {"policy": "overlap", "mode": "serial"}]
    assert r.summary()["scenario"] == r.meta["scenario"]
    with pytest.raises(PolicyError, match="cannot use int"):
        whatif(t, 3)


def test_cli_replay_scenario_and_set(synth_dir, tmp_path, capsys):
    f = tmp_path / "half.toml"
    f.write_text("[network]\ninter_node_gbps = 12.5\n")
    assert run(["replay", str(synth_dir), "--json"]) == 0
    base = json.loads(capsys.readouterr().out)
    assert run(["replay", str(synth_dir), "--scenario", str(f), "--set", "overlap.mode=serial",
                "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["scenario"] == [{"policy": "network", "inter_node_gbps": 12.5},
                             {"policy": "overlap", "mode": "serial"}]
    assert d["step_time_ns"]["replayed"] > base["step_time_ns"]["replayed"]
    assert d["whatif"]["baseline_measured_step_time_ns"] == base["step_time_ns"]["measured"]
    assert run(["replay", str(synth_dir), "--set", "network.bogus=1"]) == 2
    err = capsys.readouterr().err
    assert "unknown field 'bogus'" in err and len(err.strip().splitlines()) == 1
    p = subprocess.run([sys.executable, "-m", "retime", "replay", str(synth_dir), "--set",
                        "hardware.compute_speedup=2", "--json"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    d2 = json.loads(p.stdout)
    assert d2["scenario"] == [{"policy": "hardware", "compute_speedup": 2.0}]
    assert d2["step_time_ns"]["replayed"] < base["step_time_ns"]["replayed"]
