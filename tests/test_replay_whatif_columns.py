"""Replays read only the ops columns they need (issue 30): on real shared traces the
projected read gives the same JSON (step times, ranges, notes, cluster lines) as a read of
every column (``--all-columns``), for what-ifs of every audited policy, ``--cluster`` and
``--calibration``; ``-o`` writes the same trace either way (the columns the replay did not
read are added afterwards, or, for a what-if that re-laid out the ops, it is replayed from a
full read); a key that is not audited makes it read them all."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import SHARED_CASES, ingest_cached

from retime.cli import run
from retime.collectors.calibrate import FORMAT
from retime.collectors.costs import read_cluster
from retime.collectors.trace import OPS_SCHEMA, read_trace
from retime.replay.footprint import (
    IDENTITY_COLUMNS,
    WHATIF_COLUMNS,
    footprint,
    key_columns,
    scenario_columns,
)
from retime.replay.policies.base import STRUCTURE_COLUMNS
from retime.replay.policies.cluster_cal import cluster_record
from retime.replay.policies.scenario import as_policies, scenario_from_cli
from retime.replay.projection import replay_columns


def _sets(*kv):
    return [a for s in kv for a in ("--set", s)]


SYNTH_OFFLOAD = ("phase", "layer", "microbatch", "chunk")
SYNTH = ["--model", "megatron-22b", "--tp", "2", "--pp", "2", "--dp", "2", "--global-batch",
         "16", "--micro-batch", "1", "--hardware", "h100-sxm"]

# (store, arguments, ops columns the projected read is expected to add to WHATIF_COLUMNS);
# "CLUSTER" / "CAL" stand for the files of the ``files`` fixture
CASES = [
    ("h100-vgg13", _sets("hardware.compute_speedup=2"), ("flops",)),
    ("h100-vgg13", _sets("hardware.gpu=b200"), ("flops",)),
    ("dlrm-v100-8rank", _sets("network.intra_node_gbps=25"), ()),
    ("dlrm-v100-8rank", _sets("network.inter_node_gbps=5", "hardware.gemm_speedup=1.5"),
     ("flops",)),
    ("a100-ddp-nccl", _sets("overlap.bucket_mb=100"), STRUCTURE_COLUMNS),
    ("a100-ddp-nccl", _sets("overlap.bucket_mb=5", "overlap.sm_share=0.2"), STRUCTURE_COLUMNS),
    ("dlrm-v100-8rank", _sets("overlap.mode=serial"), STRUCTURE_COLUMNS),
    ("h100-vgg13", _sets("parallel.micro_batch=64"), STRUCTURE_COLUMNS),
    ("dlrm-v100-8rank", _sets("parallel.micro_batch=32"), STRUCTURE_COLUMNS),
    ("mi300x-resnet-ddp", _sets("cache.recompute=none"), STRUCTURE_COLUMNS),
    ("dlrm-v100-8rank", _sets("topology.ranks_per_node=4", "network.inter_node_gbps=12.5"), ()),
    ("dlrm-v100-8rank", _sets("stragglers.slow_ranks=[1]", "stragglers.slowdown=1.5"), ()),
    ("dlrm-v100-8rank", _sets("stragglers.ideal_durations=true"), ()),
    ("cpu-gloo-rank34", _sets("stragglers.ideal=true"), ()),
    ("a100-ddp-nccl", ["--cluster", "CLUSTER"], ("flops",)),
    ("a100-ddp-nccl", ["--cluster", "CLUSTER", "--calibration", "CAL"], ("flops",)),
    ("dlrm-v100-8rank", ["--calibration", "CAL", *_sets("network.inter_node_gbps=5")], ()),
    # slow ranks, host speed, CUDA graphs (hardware)
    ("dlrm-v100-8rank", _sets("hardware.slow_ranks=[1]", "hardware.rank_slowdown=2"), ()),
    ("pairs/mlp-host-speed/A", _sets("hardware.host_speedup=2"), ()),
    ("h100-vgg13", _sets("hardware.cuda_graphs=step"), ("phase",)),
    ("a100-ddp-nccl", _sets("hardware.cuda_graphs=forward_backward",
                            "hardware.graph_launch_us=3"), ("phase",)),
    # data-parallel width (measured ranks copied; an op-level trace re-laid out), cores
    ("pairs/mlp-dp/A", _sets("parallel.dp=4", "topology.ranks_per_node=2",
                             "topology.cores_per_node=1"), ("microbatch", "stage", "chunk")),
    ("megatron-oplevel", _sets("parallel.dp=4"), ("microbatch", "stage", "chunk")),
    ("pairs/mlp-ranks-per-host/A", _sets("topology.ranks_per_node=2",
                                         "topology.cores_per_node=2"), ()),
    # offloads (cache) and recompute where the trace has checkpoints or op-level passes
    ("mi300x-resnet-ddp", _sets("cache.offload_optimizer=true", "cache.host_gbps=50"),
     ("phase",)),
    ("a100-ddp-nccl", _sets("cache.offload_optimizer=true", "cache.pcie_gbps=50"), ("phase",)),
    ("pairs/mlp-checkpoint/B", _sets("cache.recompute=none"), STRUCTURE_COLUMNS),
    # a CPU trace's batch: the GEMM split and the parameter-shaped zero-fills (batch_cpu)
    ("pairs/emb-batch-64-16/B", _sets("parallel.micro_batch=64"), STRUCTURE_COLUMNS),
    ("h100-vgg13", _sets("cache.offload_activations=true"), ("phase",)),
    ("megatron-oplevel", _sets("cache.recompute=full"), STRUCTURE_COLUMNS),
    # a synthesized store: what each table reads of the loaded run (most re-synthesize it)
    ("synth", _sets("parallel.tp=4", "parallel.dp=1"), ()),
    ("synth", _sets("parallel.schedule=interleaved"), ()),
    ("synth", _sets("cache.recompute=full", "cache.offload_optimizer=true"), ()),
    ("synth", _sets("cache.offload_activations=true", "cache.pcie_gbps=50"), SYNTH_OFFLOAD),
    ("synth", _sets("overlap.bucket_mb=50", "overlap.sm_share=0.2"), ()),
    ("synth", _sets("overlap.prefetch=1", "parallel.zero=3"), SYNTH_OFFLOAD),
    ("synth-z3", _sets("overlap.prefetch=1"), SYNTH_OFFLOAD),
    ("synth", _sets("stragglers.slow_ranks=[1]", "stragglers.slowdown=1.5"), ()),
    ("synth", _sets("stragglers.ideal=true"), ()),
    ("synth", _sets("topology.nics=4", "topology.ranks_per_node=4",
                    "topology.cores_per_node=4"), ()),
    ("synth", _sets("compression.dp=4", "compression.codec_gbps=100"), ()),
    ("synth", _sets("hardware.cuda_graphs=step", "hardware.host_speedup=2"), ("phase",)),
]

# what-ifs a trace lacks the information for: the same refusal (exit code and JSON) from a
# projected read as from a full one
REFUSED = [
    ("dlrm-v100-8rank", _sets("cache.fcdp=true")),
    ("a100-ddp-nccl", _sets("parallel.dp=4")),
    ("synth", _sets("cache.fcdp=true")),
    ("synth", _sets("overlap.prefetch=1")),
]

PAIRS = Path(__file__).resolve().parents[1] / "traces"


def _source(name: str) -> Path:
    """A shared trace by name, or a pair's capture (``pairs/NAME/A``)."""
    return PAIRS / name if name.startswith("pairs/") else SHARED_CASES[name]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("whatif-columns")
    out = {}
    for name in sorted({c[0] for c in CASES + REFUSED}):
        if name.startswith("synth"):  # "synth-z3": the same run with ZeRO-3
            out[name] = d / f"{name}.retime"
            z3 = ["--zero", "3"] if name == "synth-z3" else []
            assert run(["synth", "-o", str(out[name]), *SYNTH, *z3]) == 0
            continue
        out[name] = ingest_cached(_source(name)).save(
            d / f"{name.replace('/', '-')}.retime", layout="rank")
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A DGX H100 cluster file and an NCCL calibration measured on it (8 ranks on one host,
    all-reduce at 20 us + bytes / 360 GB/s)."""
    d = tmp_path_factory.mktemp("whatif-columns-cluster")
    cl = d / "h100.toml"
    assert run(["cost", "cluster", "--preset", "dgx-h100", "-o", str(cl)]) == 0
    rows = []
    for k in range(20, 28):
        t = 20_000.0 + 2 ** k * 2.0 * 7 / 8 / 360.0
        rows.append({"bytes": 2 ** k, "ns_by_rank": [[t, t - 50, t]] + [[t - 100] * 3] * 7})
    cal = {"format": FORMAT, "backend": "nccl", "world_size": 8, "hosts": ["h0"] * 8,
           "ranks_per_host": 8, "collectives": {"all_reduce": rows}}
    cal["cluster"] = cluster_record(read_cluster(cl), cal)
    f = d / "nccl.json"
    f.write_text(json.dumps(cal))
    return {"CLUSTER": str(cl), "CAL": str(f)}


def _json(argv, capsys) -> dict:
    capsys.readouterr()
    assert run([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name,args,adds", CASES, ids=[" ".join(c[1])[:60] for c in CASES])
def test_projected_replay_equals_the_full_read(stores, files, capsys, name, args, adds):
    path = stores[name]
    argv = ["replay", str(path), *[files.get(a, a) for a in args]]
    part = _json(argv, capsys)
    whole = _json([*argv, "--all-columns"], capsys)
    assert whole["memory"]["columns"] == "all"
    cols = part["memory"]["columns"]
    assert cols == [c for c in OPS_SCHEMA if c in set(WHATIF_COLUMNS) | set(adds)]
    assert len(cols) < len(OPS_SCHEMA)
    assert part["memory"]["estimated_peak_bytes"] < whole["memory"]["estimated_peak_bytes"]
    assert set(part) == set(whole)
    for k in set(whole) - {"memory"}:
        assert part[k] == whole[k], k


@pytest.mark.parametrize("name,args", REFUSED, ids=[" ".join(c[1]) for c in REFUSED])
def test_refusals_are_the_same_from_a_projected_read(stores, capsys, name, args):
    argv = ["replay", str(stores[name]), *args, "--json"]
    out = []
    for extra in ([], ["--all-columns"]):
        capsys.readouterr()
        rc = run([*argv, *extra])
        out.append((rc, json.loads(capsys.readouterr().out)))
    assert out[0] == out[1]
    assert out[0][0] == 2 and out[0][1]["exit_code"] == 2


# each column these declarations add is needed: a read without it fails or changes the JSON
# (parallel.dp's `microbatch` only on an op-level store ingested before its meta recorded
# the layout: replay/policies/parallel_oplevel.py, oplevel_layout; a re-synthesized run has
# every column, so overlap.prefetch needs them on a run that is ZeRO-3 already)
NEEDED = [
    ("megatron-oplevel", _sets("parallel.dp=4"), ("stage", "chunk")),
    ("h100-vgg13", _sets("hardware.cuda_graphs=step"), ("phase",)),
    ("a100-ddp-nccl", _sets("cache.offload_optimizer=true"), ("phase",)),
    ("synth", _sets("cache.offload_activations=true"), SYNTH_OFFLOAD),
    ("synth-z3", _sets("overlap.prefetch=1"), SYNTH_OFFLOAD),
]


@pytest.mark.parametrize("name,args,needed", NEEDED, ids=[" ".join(c[1]) for c in NEEDED])
def test_each_declared_column_is_needed(stores, capsys, monkeypatch, name, args, needed):
    import retime.replay.projection as projection
    argv = ["replay", str(stores[name]), *args, "--json"]
    capsys.readouterr()
    assert run(argv) == 0
    whole = json.loads(capsys.readouterr().out)
    declared = projection.key_columns
    for c in needed:
        monkeypatch.setattr(projection, "key_columns", lambda k, synth=False, c=c: tuple(
            x for x in declared(k, synth=synth) if x != c))
        rc = run(argv)
        out = json.loads(capsys.readouterr().out)
        assert rc != 0 or {k: v for k, v in out.items() if k != "memory"} != \
            {k: v for k, v in whole.items() if k != "memory"}, c
    monkeypatch.setattr(projection, "key_columns", declared)


# -o: the identity replay, a re-timing what-if (the columns it did not read are added to
# the written trace), a re-laid-out one (replayed from a full read), a cluster and a
# re-synthesized run (a new trace of every column, written as it is)
OUTPUT_CASES = [
    ("dlrm-v100-8rank", [], "identity"),
    ("h100-vgg13", _sets("hardware.compute_speedup=2"), "projected"),
    ("dlrm-v100-8rank", _sets("stragglers.slow_ranks=[1]", "stragglers.slowdown=1.5"),
     "projected"),
    ("a100-ddp-nccl", _sets("overlap.bucket_mb=100"), "all"),
    ("a100-ddp-nccl", ["--cluster", "CLUSTER"], "projected"),
    ("h100-vgg13", _sets("hardware.cuda_graphs=step"), "projected"),
    ("pairs/mlp-dp/A", _sets("parallel.dp=4", "topology.cores_per_node=1"), "all"),
    ("synth", _sets("parallel.tp=4", "parallel.dp=1"), "resynthesized"),
    ("synth", _sets("stragglers.slow_ranks=[1]", "stragglers.slowdown=1.5"), "projected"),
]


@pytest.mark.parametrize("name,args,read", OUTPUT_CASES,
                         ids=[" ".join(c[1])[:40] or "identity" for c in OUTPUT_CASES])
def test_written_trace_equals_the_full_reads(stores, files, tmp_path, capsys, name, args, read):
    path = stores[name]
    argv = ["replay", str(path), *[files.get(a, a) for a in args]]
    part = _json([*argv, "-o", str(tmp_path / "p.retime")], capsys)
    whole = _json([*argv, "--all-columns", "-o", str(tmp_path / "w.retime")], capsys)
    assert whole["memory"]["columns"] == "all" and "output_columns" not in whole["memory"]
    if read == "all":  # re-laid out from the columns read: replayed again from all
        assert part["memory"]["columns"] == "all"
    elif read == "resynthesized":  # a new run, with every column: written as it is
        assert part["memory"]["columns"] != "all" and "output_columns" not in part["memory"]
    else:
        cols = part["memory"]["columns"]
        cols = list(IDENTITY_COLUMNS) if cols == "identity" else cols
        assert read == "identity" or cols != "identity"
        assert part["memory"]["output_columns"] == [c for c in OPS_SCHEMA if c not in cols]
    for k in set(whole) - {"memory", "output"}:
        assert part[k] == whole[k], k
    p, w = read_trace(tmp_path / "p.retime"), read_trace(tmp_path / "w.retime")
    assert list(p.ops.columns) == list(OPS_SCHEMA)
    for t in ("ops", "lanes", "edges", "ranges", "memory", "groups"):
        pd.testing.assert_frame_equal(getattr(p, t), getattr(w, t), obj=t)
    assert p.strings == w.strings and p.meta == w.meta
    src = read_trace(path)  # the columns no replay changes are the store's
    for c in ("op_id", "flops", "external_id", "layer"):
        if len(p.ops) == len(src.ops) and read in ("identity", "projected"):
            assert p.ops[c].equals(src.ops[c]), c


def test_scenario_columns_union_and_unaudited_keys():
    def cols(*sets):
        return scenario_columns(as_policies(scenario_from_cli(None, list(sets))))
    assert cols("network.intra_node_gbps=25") == tuple(c for c in OPS_SCHEMA
                                                       if c in WHATIF_COLUMNS)
    both = cols("network.intra_node_gbps=25", "hardware.gpu=h100-sxm")
    assert "flops" in both and set(WHATIF_COLUMNS) < set(both)
    assert set(cols("overlap.bucket_mb=50")) == set(WHATIF_COLUMNS) | set(STRUCTURE_COLUMNS)
    assert cols("stragglers.ideal=true") == cols("network.intra_node_gbps=25")
    assert cols("hardware.slow_ranks=[1]", "hardware.rank_slowdown=2") == \
        cols("network.intra_node_gbps=25")
    assert set(cols("hardware.cuda_graphs=step", "hardware.gpu=h100-sxm")) == \
        set(WHATIF_COLUMNS) | {"phase", "flops"}
    assert set(cols("parallel.dp=4")) == set(WHATIF_COLUMNS) | {"microbatch", "stage", "chunk"}
    assert set(cols("parallel.dp=4", "parallel.micro_batch=8")) == \
        set(WHATIF_COLUMNS) | set(STRUCTURE_COLUMNS)
    assert set(cols("cache.fcdp=true")) == set(WHATIF_COLUMNS) | {"phase"}
    assert cols("topology.cores_per_node=4") == cols("network.intra_node_gbps=25")
    # a key of an audited policy that is not itself audited, or another policy: all
    assert cols("hardware.kernel_pricing=flat") is None
    assert cols("network.intra_node_gbps=25", "overlap.prefetch=1") is None
    assert cols("parallel.tp=2") is None and key_columns({"cache.nonsense"}) is None
    # a synthesized store: each policy's synth declaration
    pols = as_policies(scenario_from_cli(None, ["overlap.bucket_mb=50"]))
    assert scenario_columns(pols, synth=True) == cols("network.intra_node_gbps=25")
    pols = as_policies(scenario_from_cli(None, ["cache.offload_activations=true"]))
    assert set(scenario_columns(pols, synth=True)) == set(WHATIF_COLUMNS) | set(SYNTH_OFFLOAD)
    assert key_columns({"parallel.odc", "cache.fcdp"}, synth=True) == \
        tuple(c for c in OPS_SCHEMA if c in set(WHATIF_COLUMNS) | {"microbatch"})
    assert key_columns({"cache.nonsense"}, synth=True) is None
    assert key_columns({"hardware.gpu"}, synth=True) == cols("hardware.gpu=h100-sxm")
    # by key names alone (a cluster's keys): the same as the policies'
    assert key_columns({"overlap.bucket_mb", "hardware.gpu"}) == \
        cols("overlap.bucket_mb=50", "hardware.gpu=h100-sxm")


def test_replay_columns_of_identity_cluster_and_calibration(stores):
    path = stores["dlrm-v100-8rank"]
    assert replay_columns(path, set()) == IDENTITY_COLUMNS
    assert replay_columns(path, set(), calibration=True) == IDENTITY_COLUMNS
    c = replay_columns(path, set(), cluster=True, calibration=True)
    assert c == key_columns({"hardware.gpu", "network.inter_bus_efficiency"})
    assert replay_columns(path, {"parallel.pp"}, cluster=True) is None


def test_footprint_counts_the_declared_columns(stores):
    path = stores["dlrm-v100-8rank"]
    c = scenario_columns(as_policies(scenario_from_cli(None, ["network.intra_node_gbps=25"])))
    some, every = footprint(path, full=True, columns=c), footprint(path, full=True)
    assert some.columns == len(c) and every.columns == len(OPS_SCHEMA)
    assert some.trace_bytes < every.trace_bytes
    assert f"{len(c)} of {len(OPS_SCHEMA)} ops columns" in some.line(None)
    # -o reads the memory table too
    assert footprint(path, full=True, columns=c, memory=True).trace_bytes >= some.trace_bytes


def test_cache_whatifs_read_the_memory_table(stores, capsys):
    """The cache.* policies price from the allocator samples: the CLI must load the memory
    table for them (it skips it otherwise), and print what the library prints on the
    trace read whole. h100-vgg13 holds 464 [memory] events."""
    import retime
    path = stores["h100-vgg13"]
    got = _json(["replay", str(path), *_sets("cache.offload_activations=true")], capsys)
    full = read_trace(path)
    assert len(full.memory) > 0
    res = retime.whatif(full, {"cache": {"offload_activations": True}})
    assert got["step_time_ns"]["replayed"] == int(res.step_time_ns)
