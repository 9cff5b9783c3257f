"""Live capture of real runs (collectors.capture, `retime capture`).

The main fixture runs a REAL 2-process CPU DDP training job (examples/capture_ddp.py, gloo)
under `retime capture` as a subprocess, then checks the traces with plain json and through
retime's Kineto reader and replay engine.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import shutil
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from retime.cli import run
from retime.collectors.capture import ENV_PREFIX, CaptureConfig, trace_path
from retime.collectors.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "capture_ddp.py"
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason='torch is not importable; '
                                 'install it with pip install "retime[torch]"')

STEPS_RECORDED = [2, 3, 4]  # ProfilerStep numbers (0-based) of wait=1, warmup=1, active=3


def _retime_cmd() -> list[str]:
    exe = shutil.which("retime", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                       os.environ.get("PATH", "")]))
    return [exe] if exe else [sys.executable, "-c", "from retime.cli import main; main()"]


def _load(path: Path) -> dict:
    with gzip.open(path, "rb") as fh:
        return json.load(fh)


# -- no torch needed ---------------------------------------------------------------------------
def test_config_env_roundtrip_and_validation():
    cfg = CaptureConfig(out_dir="x/y", wait=2, warmup=0, active=4, repeat=2, with_stack=True)
    env = cfg.to_env()
    assert env[ENV_PREFIX + "OUT_DIR"] == "x/y" and env[ENV_PREFIX + "WITH_STACK"] == "1"
    assert CaptureConfig.from_env(env) == cfg
    assert CaptureConfig.from_env({}) is None
    assert CaptureConfig.from_env(env, active=7).active == 7
    assert cfg.steps_needed == 6
    with pytest.raises(ConfigError, match="active=0"):
        CaptureConfig(out_dir="x", active=0)
    with pytest.raises(ConfigError, match="RETIME_CAPTURE_WAIT='two'"):
        CaptureConfig.from_env({ENV_PREFIX + "OUT_DIR": "x", ENV_PREFIX + "WAIT": "two"})
    assert trace_path("o", 3, 0, 1) == Path("o/rank-3.pt.trace.json.gz")
    assert trace_path("o", 3, 2, 0, compress=False) == Path("o/cycle-2/rank-3.pt.trace.json")


# -- real captures -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ddp_capture(tmp_path_factory):
    """`retime capture -n 2` of a 4-layer MLP trained with DDP on gloo (CPU), 1 MB buckets."""
    import subprocess

    out = tmp_path_factory.mktemp("cap") / "ddp"
    cmd = [*_retime_cmd(), "capture", "-n", "2", "-o", str(out), "--json", "--",
           str(EXAMPLE), "--steps", "6", "--hidden", "512", "--layers", "4",
           "--bucket-cap-mb", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)  # exactly one JSON object on stdout
    return out, summary


@pytest.fixture(scope="module")
def ddp_trace(ddp_capture):
    """The two captured traces ingested by retime's reader (collectors.ingest.read)."""
    from retime.collectors.ingest import read

    return read(ddp_capture[0])


@pytest.mark.torch
@needs_torch
def test_capture_writes_one_trace_per_rank_with_metadata(ddp_capture):
    out, summary = ddp_capture
    assert sorted(Path(p).name for p in summary["traces"]) == [
        "rank-0.pt.trace.json.gz", "rank-1.pt.trace.json.gz"]
    for r in (0, 1):
        doc = _load(out / f"rank-{r}.pt.trace.json.gz")
        di = doc["distributedInfo"]
        assert (di["rank"], di["world_size"], di["backend"]) == (r, 2, "gloo")
        assert [g["ranks"] for g in di["pg_config"]] == [[0, 1]]
        rc = doc["retimeCapture"]
        assert rc["rank"] == r and rc["steps_recorded"] == STEPS_RECORDED
        steps = sorted(e["name"] for e in doc["traceEvents"]
                       if str(e.get("name", "")).startswith("ProfilerStep#"))
        assert steps == [f"ProfilerStep#{s}" for s in STEPS_RECORDED]
        # record_shapes: every gloo all-reduce says how many elements it reduced
        ar = [e for e in doc["traceEvents"] if e.get("name") == "gloo:all_reduce"]
        assert ar and all(e["args"]["Input Dims"][0][0] > 0 for e in ar)


def _allreduce_counts(out: Path) -> dict[int, int]:
    """gloo all-reduce executions per rank, counted with plain json."""
    counts = {}
    for r in (0, 1):
        doc = _load(out / f"rank-{r}.pt.trace.json.gz")
        counts[r] = Counter(e.get("name") for e in doc["traceEvents"])["gloo:all_reduce"]
    return counts


@pytest.mark.torch
@needs_torch
def test_ingest_matches_gloo_allreduces_across_ranks(ddp_capture, ddp_trace):
    out, _ = ddp_capture
    counts = _allreduce_counts(out)
    # 1 MB buckets over four 512x512 layers: several buckets per step, same on both ranks
    assert counts[0] == counts[1] and counts[0] % len(STEPS_RECORDED) == 0
    assert counts[0] >= 2 * len(STEPS_RECORDED)
    trace = ddp_trace
    assert [int(r) for r in trace.ranks] == [0, 1]
    assert trace.world_size == 2
    colls = trace.meta["collectives"]
    assert colls["matched"] == counts[0]
    assert colls["unmatched"] == 0


@pytest.mark.torch
@needs_torch
def test_identity_replay_reproduces_measured_step(ddp_capture, ddp_trace):
    if importlib.util.find_spec("retime.replay.engine") is None:
        pytest.skip("replay engine (replay/engine.py) not available in this checkout")
    from retime.replay import engine

    out, _ = ddp_capture
    trace = ddp_trace
    st = engine.replay(trace).step_times()
    assert sorted(st["rank"].tolist()) == [0, 1]
    for row in st.itertuples():
        # bounds derived independently from the raw JSON: the rank's ops span the raw
        # operator events (cpu_op: nested ones become ranges, so a few us may differ at the
        # edges) and lie within the span of all its complete events. (Not the ProfilerStep
        # span: the first step can open with milliseconds of Python before its first op.)
        doc = _load(out / f"rank-{row.rank}.pt.trace.json.gz")
        xs = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace"]
        all_ns = (max(e["ts"] + e["dur"] for e in xs) - min(e["ts"] for e in xs)) * 1e3
        cs = [e for e in xs if e.get("cat") == "cpu_op"]
        op_ns = (max(e["ts"] + e["dur"] for e in cs) - min(e["ts"] for e in cs)) * 1e3
        assert 0.99 * op_ns <= row.measured_ns <= all_ns + 1e3, (row, op_ns, all_ns)
        assert abs(row.replayed_ns - row.measured_ns) <= 0.03 * row.measured_ns, row


AUTO_SCRIPT = """
import torch
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
for _ in range(5):
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
print("auto script done")
"""


@pytest.mark.torch
@needs_torch
def test_auto_capture_counts_optimizer_steps_without_touching_the_script(tmp_path, capsys):
    script = tmp_path / "plain_train.py"
    script.write_text(AUTO_SCRIPT)
    out = tmp_path / "auto"
    rc = run(["capture", "-o", str(out), "--wait", "1", "--warmup", "1", "--active", "2",
              "--json", "--", str(script)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    summary = json.loads(captured.out)
    assert summary["traces"] == [str(out / "rank-0.pt.trace.json.gz")]
    doc = _load(out / "rank-0.pt.trace.json.gz")
    # no process group in the script: rank/world size come from torchrun's environment
    assert doc["distributedInfo"]["rank"] == 0 and doc["distributedInfo"]["world_size"] == 1
    assert doc["retimeCapture"]["steps_recorded"] == [2, 3]
    names = Counter(e.get("name") for e in doc["traceEvents"])
    assert names["Optimizer.step#SGD.step"] == 2  # exactly the two active steps


@pytest.mark.torch
@needs_torch
def test_capture_cli_errors_are_one_line_exit_2(tmp_path, capsys):
    rc = run(["capture", "-o", str(tmp_path / "o"), "--", str(tmp_path / "missing.py")])
    err = capsys.readouterr().err
    assert rc == 2 and "missing.py: no such script" in err and "Traceback" not in err
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "rank-0.pt.trace.json.gz").write_bytes(b"")
    script = tmp_path / "s.py"
    script.write_text("raise SystemExit(3)\n")
    rc = run(["capture", "-o", str(tmp_path / "o"), "--", str(script)])
    assert rc == 2 and "--overwrite" in capsys.readouterr().err
    # --no-auto: the child never imports torch, which keeps this case quick
    rc = run(["capture", "-o", str(tmp_path / "o"), "--overwrite", "--no-auto", "--",
              str(script)])
    err = capsys.readouterr().err
    assert rc == 2 and "exited with code" in err
    assert not (tmp_path / "o" / "rank-0.pt.trace.json.gz").exists()


@pytest.mark.torch
@needs_torch
def test_in_process_capture_cycles_and_too_few_steps(tmp_path, monkeypatch):
    import torch

    from retime.collectors.capture import Capture

    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_step():
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()

    # repeat=2: each cycle (wait, warmup, active) gets its own folder, ingestable as one run
    with Capture(tmp_path / "cyc", wait=1, warmup=1, active=1, repeat=2) as cap:
        for _ in range(7):
            train_step()
            cap.step()
    assert cap.paths == [tmp_path / "cyc" / f"cycle-{k}" / "rank-0.pt.trace.json.gz"
                         for k in (0, 1)]
    assert [_load(p)["retimeCapture"]["steps_recorded"] for p in cap.paths] == [[2], [5]]
    assert all(_load(p)["distributedInfo"]["world_size"] == 1 for p in cap.paths)
    # the loop ends before the active window: nothing is written, and the user is told why
    with pytest.warns(RuntimeWarning, match="wrote no trace: the loop ran 2 step"):
        with Capture(tmp_path / "short", wait=2, warmup=1, active=1) as cap:
            for _ in range(2):
                train_step()
                cap.step()
    assert cap.paths == [] and not list((tmp_path / "short").glob("*.json*"))
    # disabled when neither out_dir nor RETIME_CAPTURE_OUT_DIR is given
    monkeypatch.delenv(ENV_PREFIX + "OUT_DIR", raising=False)
    with Capture() as cap:
        cap.step()
    assert not cap.enabled and cap.steps == 0


@pytest.mark.torch
@needs_torch
def test_each_gloo_allreduce_depends_on_its_issuing_call(ddp_trace):
    import numpy as np

    trace = ddp_trace
    o = trace.ops_frame()
    names = o["name"].astype(str).to_numpy()
    lane = o["lane"].to_numpy()
    issue = np.flatnonzero(names == "c10d::allreduce_")
    execs = np.flatnonzero(names == "gloo:all_reduce")
    assert len(issue) and len(execs) == len(issue)  # one execution per issuing call
    e = trace.edges
    src, dst = e["src"].to_numpy(), e["dst"].to_numpy()
    linked = np.isin(src, issue) & np.isin(dst, execs) & (lane[src] != lane[dst])
    # every gloo execution has an incoming edge from an issuing call on another thread
    assert set(dst[linked].tolist()) == set(execs.tolist())


@pytest.mark.torch
@needs_torch
def test_capture_repairs_unescaped_control_characters_from_the_profiler(tmp_path, monkeypatch):
    """torch's exporter sometimes writes uninitialized bytes into a string (a raw control
    character, seen once in CI with torch 2.13 on a loopback gloo job): the capture repairs
    them (escaped; invalid UTF-8 replaced), says how many, and writes valid JSON."""
    import torch

    from retime.collectors.capture import Capture

    real_export = torch.profiler.profile.export_chrome_trace

    def export_with_raw_control_char(self, path):
        real_export(self, path)
        raw = Path(path).read_bytes()
        Path(path).write_bytes(raw.replace(b'"aten::add', b'"aten::\x01add', 1)
                               .replace(b'"aten::ones', b'"aten::\xffones', 1))

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace",
                        export_with_raw_control_char)
    with Capture(tmp_path / "cc", wait=0, warmup=1, active=1) as cap:
        for _ in range(2):
            torch.ones(4).add(1)
            cap.step()
    (path,) = cap.paths
    doc = _load(path)
    assert doc["retimeCapture"]["repaired"] == {"invalid_utf8_replaced": 1,
                                                "control_chars_escaped": 1}
    names = {e.get("name") for e in doc["traceEvents"]}
    assert "aten::\x01add" in names and "aten::\ufffdones" in names


def test_gloo_completion_edges_never_run_against_time():
    """gloo runs a rank's all-reduces on two worker threads, so one can start well after it
    was issued. The op DDP's wait resumed with is found after the execution started: on a
    capture where the earlier rule picked a gap before it (a cycle, replay refused), every
    completion edge now points forward in time and the trace replays exactly."""
    from retime.collectors.enums import EdgeKind
    from retime.collectors.ingest import read
    from retime.replay import replay

    t = read(ROOT / "traces" / "regress" / "gloo-two-workers")
    e, st = t.edges, t.ops["start_ns"].to_numpy()
    sync = e["kind"].to_numpy() == EdgeKind.SYNC
    src, dst = e["src"].to_numpy()[sync], e["dst"].to_numpy()[sync]
    assert len(src) >= 10 and (st[dst] > st[src]).all()
    r = replay(t)
    assert np.array_equal(r.end_ns, (t.ops["start_ns"] + t.ops["dur_ns"]).to_numpy())
