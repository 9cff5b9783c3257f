"""Known drift in real Kineto files (collectors/kineto/drift.py): string-typed numeric args
("stream": "0x0", "size": "2560", hex ids), string ts/dur, launch calls under other names
(cudaLaunchKernelExC, hipExtModuleLaunchKernel, hipModuleLaunchKernel), cudaGraphLaunch with
its graph's kernels, renamed NCCL kernels, no ProfilerStep, and folders holding a run's own
JSON config. Decoded where the meaning is clear and counted; refused with the field named
where it is not. Both readers (streaming scanner, general msgspec path) agree."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import KINETO, ingest_cached
from test_kineto_scan import _same_as_general

import retime.collectors.kineto.reader as kin
from retime.cli import run
from retime.collectors.enums import EdgeKind, OpKind
from retime.collectors.errors import TraceFormatError
from retime.collectors.ingest import read
from retime.collectors.steps import step_windows
from retime.replay import build_graph, simulate

MI300X = KINETO / "mi300x-resnet-ddp" / "resnet_act_checkpoint.json.gz"


def _drifted_mi300x(path: Path) -> dict[str, int]:
    """The real MI300X trace with the drift of a ROCm 6.2 export written into it: HIP launch
    calls carry ``"stream": "0x0"`` and memcpy calls ``"size": "<n>"`` (strings); GPU ops
    carry device, stream and correlation as strings (stream in hex); every 7th host op has
    its ts as a string. Returns how many values were turned into strings, by field."""
    with gzip.open(MI300X, "rt") as fh:
        doc = json.load(fh)
    n = {"args.stream (string)": 0, "args.device (string)": 0,
         "args.correlation (string)": 0, "ts (string)": 0}
    for i, e in enumerate(doc["traceEvents"]):
        a = e.get("args")
        cat = e.get("cat")
        if cat == "cuda_runtime" and e["name"].startswith("hip") and a is not None:
            a["stream"] = "0x0"
            n["args.stream (string)"] += 1
            if "Memcpy" in e["name"]:
                a["size"] = "2560"
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            a["stream"] = hex(a["stream"])
            a["device"] = str(a["device"])
            a["correlation"] = str(a["correlation"])
            n["args.stream (string)"] += 1
            n["args.device (string)"] += 1
            n["args.correlation (string)"] += 1
        elif cat == "cpu_op" and i % 7 == 0:
            e["ts"] = repr(e["ts"])
            n["ts (string)"] += 1
    path.write_text(json.dumps(doc))
    return n


def test_string_typed_args_of_a_rocm_trace_decode_to_the_same_trace(tmp_path, monkeypatch):
    f = tmp_path / "resnet_rocm62.json"
    want = _drifted_mi300x(f)
    part = _same_as_general(f, monkeypatch)  # both readers, identical results
    assert part.accounting["coerced"] == want
    t = read([f])
    ref = ingest_cached(KINETO / "mi300x-resnet-ddp")
    for table in ("ops", "edges", "ranges", "lanes"):  # name ids follow interning order
        a, b = getattr(t, table), getattr(ref, table)
        if "name_id" in a.columns:
            a = a.assign(name_id=np.asarray(t.strings, object)[a["name_id"].to_numpy()])
            b = b.assign(name_id=np.asarray(ref.strings, object)[b["name_id"].to_numpy()])
        pd.testing.assert_frame_equal(a, b)
    assert set(t.strings) == set(ref.strings)
    acc = next(iter(t.meta["accounting"].values()))
    assert acc["events_read"] == sum(acc["kept"].values()) + sum(acc["dropped"].values())


def _doc() -> dict:
    """A one-rank trace with the launch spellings of newer CUDA and of HIP, a CUDA graph
    (one launch, three kernels with its correlation id) and a renamed NCCL kernel; no
    ProfilerStep."""
    ev = []
    t0 = 1000.0

    def launch(name, ts, corr, **args):
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 10, "tid": 11,
                   "ts": ts, "dur": 5.0, "args": {"correlation": corr, **args}})

    def kernel(name, ts, corr, stream=3, dur=15.0, cat="kernel", **args):
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": 2, "tid": stream, "ts": ts,
                   "dur": dur, "args": {"correlation": corr, "device": 2, "stream": stream,
                                        **args}})

    launch("hipExtModuleLaunchKernel", t0 + 5, 21, stream="0x0")
    kernel("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32", t0 + 20, 21, dur=30.0)
    launch("cudaLaunchKernelExC", t0 + 60, "0x16", stream="0x7f00")
    kernel("void at::native::vectorized_elementwise_kernel<4>", t0 + 70, "22")
    launch("cudaGraphLaunch", t0 + 90, 30)
    for j in range(3):
        kernel(f"graph_kernel_{j}", t0 + 100 + 20 * j, 30)
    launch("hipModuleLaunchKernel", t0 + 170, 40)
    kernel("void ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
           t0 + 180, 40, stream=4, dur=40.0)
    launch("hipMemcpyAsync", "1230.5", 41, size="2560", stream="0x0")
    ev[-1]["dur"] = "3.5"
    kernel("Memcpy DtoD (Device -> Device)", t0 + 240, 41, cat="gpu_memcpy", dur=5.0,
           bytes="2560")
    return {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1},
            "traceEvents": ev}


def test_launch_spellings_graphs_and_renamed_nccl(tmp_path, monkeypatch):
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(_doc()))
    part = _same_as_general(f, monkeypatch)
    assert part.accounting["coerced"] == {
        "args.correlation (string)": 2, "args.stream (string)": 3, "dur (string)": 1,
        "ts (string)": 1}
    t = read([f])
    names = t.names()
    e = t.edges[t.edges["kind"] == int(EdgeKind.LAUNCH)]
    pairs = sorted(zip(names[e["src"]].tolist(), names[e["dst"]].tolist()))
    assert pairs == sorted([
        ("hipExtModuleLaunchKernel", "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32"),
        ("cudaLaunchKernelExC", "void at::native::vectorized_elementwise_kernel<4>"),
        ("cudaGraphLaunch", "graph_kernel_0"), ("cudaGraphLaunch", "graph_kernel_1"),
        ("cudaGraphLaunch", "graph_kernel_2"),
        ("hipModuleLaunchKernel",
         "void ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
        ("hipMemcpyAsync", "Memcpy DtoD (Device -> Device)")])
    o = t.ops
    nccl = names == "void ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    assert o["kind"].to_numpy()[nccl].tolist() == [int(OpKind.COLLECTIVE)]
    assert o["bytes"].to_numpy()[names == "Memcpy DtoD (Device -> Device)"].tolist() == [2560]
    # the string ts/dur of the memcpy call: 1230.5 us for 3.5 us
    call = names == "hipMemcpyAsync"
    assert o["start_ns"].to_numpy()[call].tolist() == [1_230_500]
    assert o["dur_ns"].to_numpy()[call].tolist() == [3_500]
    # no ProfilerStep: one window, the whole rank; identity replay exact
    w = step_windows(t)
    assert w[["step", "start_ns", "end_ns"]].values.tolist() == [[-1, 1_005_000, 1_245_000]]
    r = simulate(build_graph(t))
    np.testing.assert_array_equal(r.end_ns, (o["start_ns"] + o["dur_ns"]).to_numpy())


@pytest.mark.parametrize("field,value,msg", [
    ("stream", "three", r"event 1: field 'args.stream' is invalid \('three' is not a number\)"),
    ("stream", [3], r"event 1: field 'args.stream' is invalid \(Expected `int \| str \| null`"),
    ("ts", "soon", r"event 1: field 'ts' is invalid \('soon' is not a number"),
])
@pytest.mark.parametrize("streaming", [True, False])
def test_unreadable_values_name_the_field(tmp_path, monkeypatch, field, value, msg, streaming):
    doc = _doc()
    ev = doc["traceEvents"][1]  # the Cijk kernel
    if field == "ts":
        ev["ts"] = value
    else:
        ev["args"][field] = value
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(doc))
    monkeypatch.setattr(kin, "STREAMING", streaming)
    with pytest.raises(TraceFormatError, match=msg) as ei:
        read([f])
    assert "\n" not in str(ei.value)


def test_a_folder_with_a_run_config_ingests_the_traces_and_lists_the_rest(tmp_path, capsys):
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank0.json").write_text(json.dumps(_doc()))
    (d / "capture.json").write_text(json.dumps({"world_size": 1, "steps": [3, 4, 5],
                                                "profile": {"active": 3}}))
    (d / "list.json").write_text(json.dumps([1, 2, 3]))
    assert run(["ingest", str(d), "-o", str(tmp_path / "r.retime"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sources"] == [str(d / "rank0.json")]
    assert sorted(Path(p).name for p in out["skipped_files"]) == ["capture.json", "list.json"]
    assert all("not a profiler trace" in v for v in out["skipped_files"].values())
    assert out["coerced"]["args.stream (string)"] == 3
    # a folder with no trace at all is refused, naming what it holds
    (d / "rank0.json").unlink()
    assert run(["ingest", str(d), "-o", str(tmp_path / "s.retime")]) == 2
    err = capsys.readouterr().err
    assert "no PyTorch profiler traces among its 2 JSON file(s)" in err
    assert err.count("\n") == 1 and not (tmp_path / "s.retime").exists()


def test_raw_control_characters_in_names_are_escaped_and_counted(tmp_path, monkeypatch):
    """Kineto writes some names without escaping them (a tab or a stray control byte in a
    Python frame or thread name): invalid JSON, but the meaning is clear. Both readers read
    the names with the characters in them and count them; the capture writer repairs them."""
    from retime.collectors.kineto.events import escape_control_chars

    doc = _doc()
    names = ["linear\tfwd", "step\x01one", 'quoted "name"\x1f']
    for j, name in enumerate(names):
        doc["traceEvents"].append(_x_cpu(name, 1300.0 + 10 * j))
    clean = json.dumps(doc).encode()
    raw = clean
    for name in names:  # the writer's bug: the characters go out raw
        raw = raw.replace(json.dumps(name).encode(), b'"' + name.replace('"', '\\"').encode()
                          + b'"')
    assert raw != clean
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)
    fixed, n = escape_control_chars(raw)
    assert n == 3 and json.loads(fixed) == json.loads(clean)
    assert escape_control_chars(clean) == (clean, 0)  # whitespace between tokens untouched
    # quotes after runs of backslashes: odd runs escape the quote, even runs do not
    for text, want in [(b'{"a":"x\\\\"}\n', 0), (b'{"a":"x\\"\ty"}', 1),
                       (b'["\\\\\\\\",\n"\x02"]', 1), (b'{"k\x03":1}\r\n', 1),
                       (b'"\\\\\\"\x01"', 1)]:
        fixed_text, k = escape_control_chars(text)
        assert k == want, text
        json.loads(fixed_text)
    f = tmp_path / "raw.json"
    f.write_bytes(raw)
    with monkeypatch.context() as m:
        m.setattr(kin, "STREAMING", False)
        part = kin.parse_kineto_file(f)
    assert part.accounting["coerced"]["raw control characters in strings (escaped)"] == 3
    assert set(names) <= set(part.strings)
    t = read([f])
    assert set(names) <= set(t.strings)


def _x_cpu(name: str, ts: float) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 10, "tid": 11, "ts": ts,
            "dur": 2.0, "args": {"External id": 900 + int(ts) % 97}}
