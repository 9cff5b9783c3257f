"""What a new user met on the shared traces (user pass 8), each checked against a recount of
the raw trace with gzip + json (or sqlite3) and plain Python, none of the reader's code:

- a what-if's report and `analyze` of the replayed store said "64 of them ran before the
  first launched GPU op (queued before the trace started)" where `retime replay` of the very
  same what-if (and the raw DLRM files) say 125: the queue is a fact of the recording, and
  the replayed store recounted it on the what-if's times (host 2x faster moves rank 1's
  first launched copy ahead of its recorded backlog).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from retime.cli import run

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
DLRM = TRACES / "kineto" / "dlrm-v100-8rank"

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _raw_queue(folder: Path) -> tuple[int, int, dict[int, int]]:
    """GPU ops whose correlation id no runtime call of the file has; and per rank how many
    of those start before the rank's first GPU op that has one."""
    total = ns = 0
    before: dict[int, int] = {}
    for f in sorted(folder.glob("*.json.gz")):
        d = json.load(gzip.open(f))
        ev = d["traceEvents"]
        calls = {e["args"]["correlation"] for e in ev
                 if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in
                 e.get("args", {})}
        gpu = [e for e in ev if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
        orphan = [e for e in gpu if e["args"].get("correlation") not in calls]
        first = min(e["ts"] for e in gpu if e["args"].get("correlation") in calls)
        total += len(orphan)
        ns += sum(round(e["dur"] * 1000) for e in orphan)
        n = sum(1 for e in orphan if e["ts"] < first)
        if n:
            before[d["distributedInfo"]["rank"]] = n
    return total, ns, before


@pytest.fixture(scope="module")
def dlrm_whatif(tmp_path_factory):
    d = tmp_path_factory.mktemp("u8")
    assert run(["ingest", str(DLRM), "-o", str(d / "m.retime")]) == 0
    assert run(["replay", str(d / "m.retime"), "--set", "hardware.host_speedup=2",
                "-o", str(d / "w.retime")]) == 0
    return d


def test_replayed_store_says_the_recorded_queue(dlrm_whatif, capsys):
    total, ns, before = _raw_queue(DLRM)
    assert (total, before) == (128, {1: 61, 3: 64})
    q = sum(before.values())
    capsys.readouterr()
    for store in ("m.retime", "w.retime"):
        assert run(["analyze", str(dlrm_whatif / store), "--json"]) == 0
        u = json.loads(capsys.readouterr().out)["unseen"]
        assert (u["without_launch_ops"], u["queued_before_trace_ops"]) == (total, q), store
        assert u["without_launch_ns"] == ns
    assert run(["replay", str(dlrm_whatif / "m.retime"), "--set", "hardware.host_speedup=2"]) == 0
    assert f"{q} of them ran before the first launched GPU op" in capsys.readouterr().out
    out = dlrm_whatif / "r.html"
    assert run(["report", str(dlrm_whatif / "w.retime"), "--baseline",
                str(dlrm_whatif / "m.retime"), "-o", str(out)]) == 0
    assert f"{q} of them ran before the first launched GPU op" in out.read_text()


@pytest.mark.parametrize("argv", [["demo", "-o", "{f}"],
                                  ["export", "{store}", "--chakra", "{f}", "--json"]])
def test_a_file_where_an_output_folder_goes_is_named_as_in_the_way(dlrm_whatif, tmp_path,
                                                                   capsys, argv):
    """`export --chakra FILE` and `demo -o FILE` said "is a file, not a NAME.retime store;
    ingest it first": the file is the output's place, not an input to ingest."""
    f = tmp_path / "keep.json.gz"
    raw = (DLRM / "worker0_step_12.1694128201545.pt.trace.json.gz").read_bytes()
    f.write_bytes(raw)
    capsys.readouterr()
    a = [x.format(f=f, store=dlrm_whatif / "m.retime") for x in argv]
    assert run(a) == 2
    cap = capsys.readouterr()
    line = cap.err.strip()
    assert "\n" not in line and "Traceback" not in cap.err
    assert "ingest it first" not in line and "is a file" in line and "folder" in line
    assert f.read_bytes() == raw and sorted(tmp_path.iterdir()) == [f]
    if "--json" in a:
        assert json.loads(cap.out)["exit_code"] == 2
