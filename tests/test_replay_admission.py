"""What-ifs refused before the store is loaded (replay/admission.py): the same refusal, word
for word, as the policies give on the loaded trace; scenarios the trace supports pass; and
`retime replay` refuses without reading the store's tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retime.cli import run
from retime.collectors.enums import OpKind
from retime.collectors.errors import PolicyError
from retime.collectors.ingest import read
from retime.collectors.store import part_file
from retime.collectors.trace import read_trace
from retime.replay import whatif
from retime.replay.admission import comm_sizes, refuse_early

ROOT = Path(__file__).resolve().parents[1]
KINETO = ROOT.parent / "shared" / "traces" / "kineto"
V100 = KINETO / "v100-ddp-sgd"  # NCCL kernels without message sizes
A100 = KINETO / "a100-ddp-nccl"  # sized NCCL collectives


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("adm")
    v = read(V100)
    return {"v100": v.save(d / "v100.retime", layout="rank"),
            "v100_single": v.save(d / "v100s.retime"),
            "a100": read(A100).save(d / "a100.retime", layout="rank")}


def late_refusal(path, scenario) -> str:
    with pytest.raises(PolicyError) as e:
        whatif(read_trace(path), scenario)
    return str(e.value)


@pytest.mark.parametrize("scenario", [
    {"network.inter_node_gbps": 100.0},
    {"network.latency_us": 3.0, "hardware.compute_speedup": 2.0},
    {"parallel.ep": 2},
    {"parallel.dtype": "fp8"},
])
def test_early_refusal_is_the_policy_refusal(stores, scenario):
    for key in ("v100", "v100_single"):
        with pytest.raises(PolicyError) as early:
            refuse_early(stores[key], scenario)
        assert str(early.value) == late_refusal(stores[key], scenario)


def test_supported_scenarios_pass(stores):
    n, sized = comm_sizes(stores["a100"])
    t = read_trace(stores["a100"])
    k = t.ops["kind"].to_numpy()
    is_comm = (k == OpKind.COLLECTIVE) | (k == OpKind.P2P)
    assert n == int(is_comm.sum()) and sized == int((t.ops["bytes"].to_numpy()[is_comm] > 0).sum())
    assert sized > 0
    for sc in ({"network.inter_node_gbps": 100.0}, {"hardware.compute_speedup": 2.0},
               {"network.latency_us": 5.0}):
        refuse_early(stores["a100"], sc)  # no refusal
        whatif(t, sc)  # and the policies agree
    # on the unsized trace, keys that may give collectives sizes of their own are left to
    # the policies (a re-bucketing what-if sizes its all-reduces)
    refuse_early(stores["v100"], {"network.inter_node_gbps": 100.0, "overlap.bucket_mb": 25})
    refuse_early(stores["v100"], {"hardware.compute_speedup": 2.0})


def test_cli_refuses_before_reading_the_tables(stores, tmp_path, capsys):
    """With an edges partition damaged, the refusal is still the policy's (the store's
    tables were never read), with exit 2 and one JSON line under --json."""
    import shutil
    bad = tmp_path / "bad.retime"
    shutil.copytree(stores["v100"], bad)
    part_file(bad, "edges", 1).write_bytes(b"not parquet")
    code = run(["replay", str(bad), "--set", "network.inter_node_gbps=100", "--json"])
    assert code == 2
    out = json.loads(capsys.readouterr().out)
    assert "carry no sizes" in out["error"]
    # the damaged store does fail once it is loaded
    assert run(["replay", str(bad)]) == 2
    assert "unreadable Parquet" in capsys.readouterr().err
