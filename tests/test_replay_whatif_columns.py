"""What-if replays read only the ops columns their policies declare (issue 30): on real
shared traces the projected read gives the same step times, ranges and notes as the full
read (``-o`` reads every column), and a policy that is not audited makes it read them all."""

from __future__ import annotations

import json

import pytest
from conftest import SHARED_CASES, ingest_cached

from retime.cli import run
from retime.collectors.trace import OPS_SCHEMA
from retime.replay.footprint import WHATIF_COLUMNS, footprint, scenario_columns
from retime.replay.policies.scenario import as_policies, scenario_from_cli

CASES = [
    ("h100-vgg13", ["hardware.compute_speedup=2"], True),
    ("h100-vgg13", ["hardware.gpu=b200"], True),
    ("dlrm-v100-8rank", ["network.intra_node_gbps=25"], True),
    ("dlrm-v100-8rank", ["network.inter_node_gbps=5", "hardware.gemm_speedup=1.5"], True),
    ("a100-ddp-nccl", ["overlap.bucket_mb=100"], False),
    ("h100-vgg13", ["parallel.micro_batch=2"], False),
]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("whatif-columns")
    out = {}
    for name in sorted({c[0] for c in CASES}):
        out[name] = ingest_cached(SHARED_CASES[name]).save(d / f"{name}.retime", layout="rank")
    return out


@pytest.mark.parametrize("name,sets,projected", CASES)
def test_projected_whatif_equals_the_full_read(stores, tmp_path, capsys, name, sets, projected):
    path = stores[name]
    args = [a for s in sets for a in ("--set", s)]
    assert run(["replay", str(path), "--json", *args]) == 0
    part = json.loads(capsys.readouterr().out)
    # -o reads every column (the written trace needs them all)
    assert run(["replay", str(path), "--json", *args, "-o", str(tmp_path / "o.retime")]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["memory"]["columns"] == "all"
    if projected:
        cols = part["memory"]["columns"]
        assert isinstance(cols, list) and set(WHATIF_COLUMNS) <= set(cols)
        assert len(cols) < len(OPS_SCHEMA)
        assert part["memory"]["estimated_peak_bytes"] < whole["memory"]["estimated_peak_bytes"]
    else:  # a policy that re-lays out ops declares every column
        assert part["memory"]["columns"] == "all"
    assert part["step_time_ns"]["per_step"]["replayed"] != part["step_time_ns"]["per_step"][
        "measured"] or not projected  # the what-if did change something
    for k in set(whole) - {"memory", "output"}:
        assert part[k] == whole[k], k


def test_scenario_columns_union_and_unaudited_keys():
    def cols(*sets):
        return scenario_columns(as_policies(scenario_from_cli(None, list(sets))))
    assert cols("network.intra_node_gbps=25") == tuple(c for c in OPS_SCHEMA
                                                       if c in WHATIF_COLUMNS)
    both = cols("network.intra_node_gbps=25", "hardware.gpu=h100-sxm")
    assert "flops" in both and set(WHATIF_COLUMNS) < set(both)
    # a key of an audited policy that is not itself audited, or another policy: all
    assert cols("hardware.slow_ranks=[1]", "hardware.rank_slowdown=2") is None
    assert cols("network.intra_node_gbps=25", "overlap.bucket_mb=50") is None


def test_footprint_counts_the_declared_columns(stores):
    path = stores["dlrm-v100-8rank"]
    c = scenario_columns(as_policies(scenario_from_cli(None, ["network.intra_node_gbps=25"])))
    some, every = footprint(path, full=True, columns=c), footprint(path, full=True)
    assert some.columns == len(c) and every.columns == len(OPS_SCHEMA)
    assert some.trace_bytes < every.trace_bytes
    assert f"{len(c)} of {len(OPS_SCHEMA)} ops columns" in some.line(None)
