"""CLI: ingest / info / export, bad input handling (exit 2, one line, nothing left behind)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import KINETO, ROOT

from retime.cli import run
from retime.collectors import read_trace
from retime.collectors.ingest import read

DLRM = KINETO / "dlrm-v100-8rank"


def _good_events() -> list[dict]:
    return [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 11.0, "dur": 2.0, "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 14.0, "dur": 3.0,
         "args": {"correlation": 7, "device": 0, "stream": 7}},
    ]


def _write(path, events, *, raw: bytes | None = None, gz=False):
    data = raw if raw is not None else json.dumps(
        {"distributedInfo": {"rank": 0}, "traceEvents": events}).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


BAD_CASES = {
    "truncated_json": lambda p: _write(p, None, raw=json.dumps({"traceEvents": _good_events()}).encode()[:-40]),
    "corrupt_gzip": lambda p: _write(p, None, raw=b"\x1f\x8b\x08\x00" + b"\x00garbage" * 50),
    "truncated_gzip": lambda p: _write(p, None, raw=gzip.compress(json.dumps({"traceEvents": _good_events() * 50}).encode())[:-60]),
    "empty_file": lambda p: _write(p, None, raw=b""),
    "missing_dur": lambda p: _write(p, [*_good_events(), {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 30.0}]),
    "negative_dur": lambda p: _write(p, [*_good_events(), {"ph": "X", "cat": "cpu_op", "name": "k", "pid": 1, "tid": 1, "ts": 30.0, "dur": -4.0}]),
    "non_numeric_ts": lambda p: _write(p, [*_good_events(), {"ph": "X", "cat": "cpu_op", "name": "k", "pid": 1, "tid": 1, "ts": "soon", "dur": 1.0}]),
    "unknown_ph": lambda p: _write(p, [*_good_events(), {"ph": "Z", "name": "what", "pid": 1, "tid": 1, "ts": 30.0}]),
    "invalid_utf8": lambda p: _write(p, None, raw=b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "bad\xff\xfe", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0}]}'),
    "not_a_trace": lambda p: _write(p, None, raw=b"hello, I am a text file\n"),
}
EXPECT = {
    "truncated_json": "truncated", "corrupt_gzip": "gzip", "truncated_gzip": "gzip",
    "empty_file": "empty", "missing_dur": "event 3", "negative_dur": "event 3",
    "non_numeric_ts": "event 3", "unknown_ph": "unknown ph 'Z'", "invalid_utf8": "UTF-8",
    "not_a_trace": "not a known trace format",
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_input_one_line_exit_2(case, tmp_path, capsys):
    f = BAD_CASES[case](tmp_path / f"{case}.json")
    out = tmp_path / "out.retime"
    rc = run(["ingest", str(f), "-o", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    assert str(f) in err or case == "not_a_trace" and f.name in err
    assert EXPECT[case] in err, err
    assert "Traceback" not in err
    assert not out.exists()
    assert not any(p.name.startswith(".out.retime") for p in tmp_path.iterdir())


def test_empty_directory(tmp_path, capsys):
    d = tmp_path / "nothing"
    d.mkdir()
    (d / "notes.txt").write_text("no traces here")
    assert run(["ingest", str(d), "-o", str(tmp_path / "o.retime")]) == 2
    assert "no PyTorch profiler traces found" in capsys.readouterr().err


def test_good_minimal_trace_edges(tmp_path):
    f = _write(tmp_path / "ok.json", _good_events())
    t = read([f])
    # aten::mm encloses the launch call: it becomes a range, the call and kernel are ops
    assert t.n_ops == 2 and len(t.ranges) == 1
    assert t.edges["kind"].tolist() == [0] and t.edges["lag_ns"].tolist() == [0]  # LAUNCH
    assert t.meta["accounting"][str(f)] == {
        "events_read": 3, "kept": {"ops": 2, "ranges": 1}, "dropped": {}, "rank": 0,
        "rank_source": "distributedInfo", "gpu_ops_without_launch": 0}


def test_ingest_info_json(tmp_path, capsys):
    out = tmp_path / "dlrm.retime"
    assert run(["ingest", str(DLRM), "-o", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    for k in ("ranks", "events_read", "ops", "edges", "dropped", "collectives"):
        assert k in s
    raw = sum(len(json.load(gzip.open(f))["traceEvents"]) for f in DLRM.glob("*.json.gz"))
    assert s["events_read"] == raw
    assert s["ranks"] == list(range(8))
    assert s["collectives"] == {"matched": 8, "unmatched": 0, "unmatched_reasons": {}}
    assert run(["info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["ops"] == s["ops"] and info["ops_by_kind"]["COLLECTIVE"] == 64
    assert len(info["span_ns"]) == 8


def test_export_roundtrip_keeps_ops(tmp_path, capsys):
    src = tmp_path / "dlrm.retime"
    assert run(["ingest", str(DLRM), "-o", str(src)]) == 0
    chrome = tmp_path / "dlrm.chrome.json.gz"
    assert run(["export", str(src), "--chrome", str(chrome), "--json"]) == 0
    capsys.readouterr()
    doc = json.load(gzip.open(chrome))
    assert {e["ph"] for e in doc["traceEvents"]} == {"M", "X", "s", "f"}  # slices and arrows
    back = tmp_path / "back.retime"
    assert run(["ingest", str(chrome), "-o", str(back)]) == 0
    a, b = read_trace(src), read_trace(back)
    assert a.n_ops == b.n_ops
    ka = np.lexsort((a.ops["start_ns"], a.ops["lane"], a.ops["rank"]))
    kb = np.lexsort((b.ops["start_ns"], b.ops["lane"], b.ops["rank"]))
    for c in ("rank", "start_ns", "dur_ns", "kind"):
        assert np.array_equal(a.ops[c].to_numpy()[ka], b.ops[c].to_numpy()[kb]), c
    assert list(a.names()[ka]) == list(b.names()[kb])
    # lanes keep their identity (kind, native id, name) per rank
    la = a.lanes.set_index("lane").loc[a.ops["lane"].to_numpy()[ka], ["rank", "lane_kind", "native_id", "name"]]
    lb = b.lanes.set_index("lane").loc[b.ops["lane"].to_numpy()[kb], ["rank", "lane_kind", "native_id", "name"]]
    assert np.array_equal(la.to_numpy(), lb.to_numpy())


def test_subprocess_error_and_help(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"traceEvents": [')
    p = subprocess.run([sys.executable, "-m", "retime", "ingest", str(bad), "-o", str(tmp_path / "x.retime")],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2
    assert p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and "truncated" in p.stderr
    h = subprocess.run([sys.executable, "-m", "retime", "--help"], capture_output=True, text=True)
    assert h.returncode == 0 and "ingest" in h.stdout


def test_ingest_ends_without_a_last_collection_only_in_its_own_process(tmp_path):
    """skip_exit_collection: the command line's own `retime ingest` freezes the collector
    once its store is written (the store reads back whole); run() in a test leaves it on."""
    import gc

    out = tmp_path / "f.retime"
    code = ("import gc, sys\nfrom retime.cli import main\nmain(sys.argv[1:])\n"
            "print(gc.isenabled(), gc.get_freeze_count() > 0)")
    p = subprocess.run([sys.executable, "-c", code, "ingest", str(DLRM), "-o", str(out),
                        "--jobs", "2"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "False True"
    assert read_trace(out).n_ops == read(DLRM).n_ops
    assert run(["ingest", str(DLRM), "-o", str(tmp_path / "g.retime"), "--force"]) == 0
    assert gc.isenabled()


@pytest.mark.parametrize("argv", [["info", "/nonexistent/x.retime"], ["ingest"], ["bogus-command"],
                                  ["ingest", str(DLRM), "-o", "x.retime", "--format", "pdf"]])
def test_usage_errors_are_one_line_exit_2(argv, capsys):
    assert run(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("retime: error:") and "--help" in err
