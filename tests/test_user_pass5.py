"""User pass 5: figures the CLI prints against recounts of the raw traces (gzip + json,
sqlite3; no retime code in the recount)."""

from __future__ import annotations

import gzip
import html
import json
import re
from pathlib import Path

import pytest

from retime.cli import run

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
MI300X = TRACES / "kineto" / "mi300x-resnet-ddp" / "resnet_act_checkpoint.json.gz"


def _raw_events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


@pytest.fixture(scope="module")
def mi300x_store(tmp_path_factory):
    out = tmp_path_factory.mktemp("u5") / "mi300x.retime"
    assert run(["ingest", str(MI300X), "-o", str(out)]) == 0
    return out


def test_report_timeline_says_the_step_ops_it_leaves_out(mi300x_store, tmp_path, capsys):
    """On the MI300X trace the host runs ahead: ProfilerStep#15's host range ends 13.3 ms
    before the first GPU op it launched starts, so the drawn step window holds exactly the
    GPU ops launched from that range, and the page says how many of the step's ops it leaves
    out (it used to say the window ran 'from its first op on any rank to its last')."""
    ev = _raw_events(MI300X)
    rng = next(e for e in ev if e.get("name") == "ProfilerStep#15"
               and e.get("cat") == "user_annotation")
    lo, hi = rng["ts"], rng["ts"] + rng["dur"]
    corr = {e["args"]["correlation"] for e in ev if e.get("cat") == "cuda_runtime"
            and lo <= e["ts"] <= hi and "correlation" in e.get("args", {})}
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
           and e["args"].get("correlation") in corr]
    assert len(gpu) == 895 and min(e["ts"] for e in gpu) > hi  # all GPU work after the range
    out = tmp_path / "r.html"
    assert run(["report", str(mi300x_store), "-o", str(out)]) == 0
    text = html.unescape(out.read_text())
    m = re.search(r"The whole of step 15, the median of 3 steps by duration: [\d.]+ ms from the "
                  r"earliest rank's step start to the latest rank's step end;.*? ([\d,]+) of "
                  r"the step's ([\d,]+) ops ran outside this window and are not drawn: "
                  r"([\d,]+) before it", text)
    assert m, "timeline paragraph"
    outside, total, before = (int(g.replace(",", "")) for g in m.groups())
    assert outside == before and total - outside == len(gpu)
    assert "from its first op on any rank to its last" not in text
