"""Issue #28, disclosure: GPU work the step figures leave out (ops without a launch,
queued before the trace) and GPU work the trace cannot show (CUDA-graph replays) is named
in `analyze` (text and --json) and in the report's headline; no host-bound verdict is drawn
from GPU work the trace does not hold."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
from conftest import KINETO, ROOT, ingest_cached

from retime.analysis.report import build_report
from retime.cli import run
from retime.collectors.enums import EdgeKind, LaneKind
from retime.collectors.ingest import read
from retime.collectors.steps import step_windows

REGRESS = ROOT / "traces" / "regress"
_spec = importlib.util.spec_from_file_location("regress_build", REGRESS / "build.py")
B = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(B)


def test_gpu_ops_queued_before_the_trace_are_named(tmp_path, capsys):
    """mi300x-resnet-ddp (the pattern of TraceLens's H100/MI300X Qwen traces): 968 GPU ops,
    31.8% of GPU time, have no launch in the trace. Step figures leave them out while the
    critical path (80 ms against an 18.8 ms step) runs through them; both now say so."""
    t = ingest_cached(KINETO / "mi300x-resnet-ddp")
    o, e = t.ops, t.edges
    lk = t.lanes.set_index("lane")["lane_kind"]
    gpu = lk.reindex(o["lane"]).to_numpy() == int(LaneKind.GPU_STREAM)
    launched = np.zeros(len(o), bool)
    launched[e["dst"].to_numpy()[e["kind"].to_numpy() == int(EdgeKind.LAUNCH)]] = True
    nol = gpu & ~launched
    dur = o["dur_ns"].to_numpy()
    # GPU time outside every window, op by op
    w = step_windows(t)
    s = o["start_ns"].to_numpy()[gpu]
    en = s + dur[gpu]
    inside = np.zeros(int(gpu.sum()), np.int64)
    for a, b in zip(w["start_ns"].tolist(), w["end_ns"].tolist()):
        inside += np.clip(np.minimum(en, b) - np.maximum(s, a), 0, None)
    outside = int(dur[gpu].sum() - inside.sum())
    src = t.save(tmp_path / "mi.retime")
    for stream in ("--stream", "--no-stream"):
        assert run(["analyze", str(src), stream, "--json"]) == 0
        an = json.loads(capsys.readouterr().out)
        u = an["unseen"]
        assert u["without_launch_ops"] == int(nol.sum()) == 968
        assert u["without_launch_ns"] == int(dur[nol].sum())
        assert u["gpu_ns"] == int(dur[gpu].sum())
        assert u["outside_steps_ns"] == outside > 0
        assert not u["hidden_in_graph_replays"]
        assert any("968 GPU ops" in n for n in an["notes"])
    assert run(["analyze", str(src)]) == 0
    assert "note: 968 GPU ops" in capsys.readouterr().out
    assert run(["replay", str(src), "--json"]) == 0  # replay's step figures: the same note
    assert any("968 GPU ops" in n for n in json.loads(capsys.readouterr().out)["notes"])
    rep = build_report(t)
    head = {label: (value, note) for label, value, note in rep.headline}
    value, note = head["Excluded GPU work"]
    share = u["without_launch_ns"] / u["gpu_ns"]
    assert value == f"{share:.1%}" and note.startswith("of GPU time. 968 GPU ops")
    assert "critical path" in note
    assert "Excluded GPU work" in dict(rep.summary)


def test_graph_capture_is_disclosed_and_not_called_host_bound(tmp_path, capsys):
    """TraceLens's vLLM/SGLang graph captures: kernel launches recorded during a stream
    capture and graph launches, with almost no GPU ops. The report used to conclude
    "host-bound ... a faster host or fewer, larger kernels help"."""
    t = read([REGRESS / "graph-capture"])
    src = t.save(tmp_path / "g.retime")
    assert run(["analyze", str(src), "--json"]) == 0
    u = json.loads(capsys.readouterr().out)["unseen"]
    assert u["captured_launches"] == B.CAP_LAUNCHES and u["captures"] == 1
    assert u["graph_launches"] == len(B.CAP_GRAPH_LAUNCH_MS) and u["graph_launch_gpu_ops"] == 0
    assert u["gpu_ops"] == len(B.CAP_COPIES_MS) and u["hidden_in_graph_replays"]
    rep = build_report(t)
    assert not any("is host-bound" in f or "faster host" in f for f in rep.findings)
    assert "graph replays is not in the trace" in rep.findings[0]
    head = {label: (value, note) for label, value, note in rep.headline}
    assert head["Unseen GPU work"][0] == f"{len(B.CAP_GRAPH_LAUNCH_MS)} graph launches"
    assert head["Unseen GPU work"][1].startswith(f"{B.CAP_LAUNCHES} launches captured")
    assert "not a conclusion" in head["Largest part"][1]
    out = tmp_path / "g.html"
    assert run(["report", str(src), "-o", str(out), "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert "Unseen GPU work" in js["summary"]
    assert not any("is host-bound" in f or "faster host" in f for f in js["findings"])
