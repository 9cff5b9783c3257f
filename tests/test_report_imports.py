"""The report's what-the-run-is parts (scenario keys, roofline peaks) of a measured or
synthesized run do not import the replay package: 0.17-0.4 s of every `retime report`'s
start-up (issue 30: the 128-rank report's CPU budget; its stragglers section does not
import it either there, while a small run's does)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = """
import sys
from retime.collectors.synth import synthesize
from retime.analysis.report_run import scenario_of
from retime.analysis.roofline import roofline_peaks
t = synthesize("gpt3-125m", "a100-80gb", dict(tp=2, pp=1, dp=1, global_batch=2,
               micro_batch=1))
assert scenario_of(t, t) == []
assert roofline_peaks(t)["source"] == "synthesized run"
print(sorted(m for m in sys.modules if m.startswith("retime.replay")))
"""


def test_report_of_a_run_leaves_replay_unimported():
    r = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True,
                       text=True, env={"PYTHONPATH": str(ROOT), "RETIME_PROGRESS": "0",
                                       "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]"
