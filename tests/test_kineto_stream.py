"""The streaming numba reader (collectors.kineto.scan) against the general msgspec path.

Both must give the same rank part, event for event, on every shared trace and on files
written here to hit the scanner's corners (escapes, UTF-8, field order, null args, duplicate
keys, exponents, block and row boundaries, multi-member gzip, a bare event list, the base
time after the events).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

import retime.collectors.kineto.reader as kin
import retime.collectors.kineto.scan as kf
from retime.collectors.errors import TraceFormatError
from retime.collectors.kineto import parse_kineto_file

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "kineto"
FILES = sorted(p for p in SHARED.rglob("*.json*") if "-et" not in p.parent.name
               and ".et." not in p.name)


def assert_same_parts(a: dict, b: dict) -> None:
    """Two :func:`_norm` views hold the same fields with equal values."""
    assert a.keys() == b.keys()
    for k in b:
        x, y = a[k], b[k]
        if isinstance(y, np.ndarray):
            assert len(x) == len(y) and np.array_equal(np.asarray(x), np.asarray(y)), k
        else:
            assert x == y, k


def _norm(p) -> dict:
    names = np.asarray(p.strings, object)
    d: dict = {}
    for t in ("ops", "ranges"):
        for k, v in getattr(p, t).items():
            d[f"{t}.{k}"] = names[v] if k == "name_id" else v
    for t in ("edges", "memory"):
        for k, v in getattr(p, t).items():
            d[f"{t}.{k}"] = v
    for k, v in p.comm.items():
        d[f"comm.{k}"] = v
    d.update(lanes=p.lanes, acc=p.accounting, window=p.window_ns, rank=p.rank)
    return d


def _general(path: Path, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(kin, "STREAMING", False)
        return parse_kineto_file(path)


def assert_same(path: Path, monkeypatch) -> None:
    fast = kf.parse_fast(path)
    assert fast is not None, f"{path.name}: the streaming reader fell back"
    a, b = _norm(fast), _norm(_general(path, monkeypatch))
    assert_same_parts(a, b)


@pytest.mark.parametrize("path", FILES, ids=[p.parent.name + "/" + p.name[:24] for p in FILES])
def test_identical_to_general_path_on_shared_traces(path, monkeypatch):
    assert_same(path, monkeypatch)


def test_block_and_row_boundaries(monkeypatch):
    # tiny blocks and row batches: every event straddles a boundary somewhere
    monkeypatch.setattr(kf, "BLOCK_BYTES", 777)
    monkeypatch.setattr(kf, "ROWS", 5)
    for path in (SHARED / "dlrm-v100-8rank").glob("worker0*"):
        assert_same(path, monkeypatch)
    assert_same(next((SHARED / "cpu-gloo-rank34").glob("*.json.gz")), monkeypatch)


def _events() -> list[dict]:
    ev = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "main"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::\u00e9t\u00e9 \"q\" \\ \u4e2d", "pid": 1,
         "tid": 2, "ts": 10.5, "dur": 5.25},
        {"ts": 11, "dur": 1, "name": "cudaLaunchKernel", "cat": "cuda_runtime", "ph": "X",
         "pid": 1, "tid": 2, "args": {"correlation": 7, "External id": 3, "x": [1, {"y": []}]}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 12.0004,
         "dur": 3.0006, "args": {"correlation": 7, "device": 0, "stream": 7, "bytes": 16}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1.6e1,
         "dur": 1, "args": {"device": None, "stream": None}},
        {"ph": "X", "cat": "cpu_op", "name": "dup", "name ": "x", "pid": 1, "tid": 2,
         "ts": 20, "dur": 1, "args": None},
        {"ph": "X", "cat": "cpu_op", "name": "twice", "pid": 1, "tid": 2, "ts": 22, "dur": 1,
         "args": {"External id": 5}},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 2, "ts": 23,
         "args": {"Device Type": 1, "Device Id": 0, "Bytes": -64, "Total Allocated": None}},
        {"ph": "i", "s": "t", "name": "marker", "pid": 1, "tid": 2, "ts": 23.5},
        {"ph": "B", "name": "region", "pid": 1, "tid": 2, "ts": 24},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 9,
         "ts": 24.5, "dur": 2},
        {"ph": "E", "pid": 1, "tid": 2, "ts": 30},
        {"ph": "s", "id": 1, "pid": 1, "tid": 2, "ts": 11, "cat": "ac2g", "name": "ac2g"},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": 1,
         "ts": 0, "dur": 40},
        {"ph": "C", "name": "counter", "pid": 1, "ts": 31, "args": {"v": 1}},
        {"ph": "X", "cat": "mystery", "name": "x", "pid": 1, "tid": 2, "ts": 32, "dur": 0},
    ]
    return ev


def _write(path: Path, text: bytes, gz: bool) -> Path:
    if gz:
        path = path.with_suffix(".json.gz")
        path.write_bytes(gzip.compress(text[: len(text) // 2]) + gzip.compress(text[len(text) // 2:]))
    else:
        path.write_bytes(text)
    return path


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip-2-members"])
def test_scanner_corners_match_general_path(tmp_path, monkeypatch, gz):
    ev = _events()
    body = json.dumps(ev, ensure_ascii=False).encode()
    # a duplicate key and the base time after the events (both legal JSON)
    body = body.replace(b'"name": "twice"', b'"name": "once", "name": "twice"')
    text = (b'{"schemaVersion": 1, "traceEvents": ' + body +
            b', "deviceProperties": [], "baseTimeNanoseconds": 1700000000000000000}')
    path = _write(tmp_path / "t", text, gz)
    monkeypatch.setattr(kf, "BLOCK_BYTES", 64)
    assert_same(path, monkeypatch)
    fast = kf.parse_fast(path)
    names = np.asarray(fast.strings, object)[np.concatenate([fast.ops["name_id"],
                                                             fast.ranges["name_id"]])]
    assert "aten::\u00e9t\u00e9 \"q\" \\ \u4e2d" in set(names)
    assert "twice" in set(names) and "once" not in set(names)
    assert fast.accounting["events_read"] == len(ev)


@pytest.mark.parametrize("block", [64, 777, 4 << 20])
def test_mapped_plain_file_reads_the_same(tmp_path, monkeypatch, block):
    """Ingest's workers map a plain file (scan._map) instead of reading it: the same part,
    whatever the block size (every carry across a block boundary is a view of the mapping);
    a file that cannot be mapped (empty) is read as before."""
    with gzip.open(next((SHARED / "dlrm-v100-8rank").glob("worker0*"))) as fh:
        path = _write(tmp_path / "w0", fh.read(), False)
    monkeypatch.setattr(kf, "BLOCK_BYTES", block)
    mapped = []
    real_map = kf._map
    monkeypatch.setattr(kf, "_map", lambda fh: mapped.append(real := real_map(fh)) or real)
    a = _norm(kf.parse_fast(path, mapped=True))
    assert len(mapped) == 1 and mapped[0] is not None
    b = _norm(kf.parse_fast(path))
    assert len(mapped) == 1  # reading does not map
    assert_same_parts(a, b)
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    assert kf.parse_fast(empty, mapped=True) is None  # falls back; the general path words it
    assert mapped[-1] is None
    with pytest.raises(TraceFormatError, match="empty"):
        parse_kineto_file(empty, mapped=True)


def test_bare_event_list(tmp_path, monkeypatch):
    path = tmp_path / "rank3.json"
    path.write_bytes(json.dumps(_events()).encode())
    assert_same(path, monkeypatch)
    assert kf.parse_fast(path).rank == 3


@pytest.mark.parametrize("text", [
    b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1}',
    b'{"traceEvents": [{"ph": "X", "name": "\xff\xfe", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]}',
    b'{"traceEvents": [{"ph": "X" "name": "a"}]}',
    b'{"traceEvents": [1, 2]}',
    b'{"nodes": [], "schema": "1.0"}',
    b'{"traceEvents": [],}',
], ids=["truncated", "bad-utf8", "missing-comma", "not-objects", "no-events", "trailing-comma"])
def test_damaged_files_fall_back_and_fail_clearly(tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_bytes(text)
    assert kf.parse_fast(path) is None  # the general path words the error
    with pytest.raises(TraceFormatError, match="bad.json"):
        parse_kineto_file(path)


def test_bad_event_field_names_event_and_field(tmp_path):
    ev = _events()
    ev[3]["ts"] = "soon"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    with pytest.raises(TraceFormatError, match=r"event 3: field 'ts' is invalid"):
        parse_kineto_file(path)


def test_intern_table_keeps_colliding_strings_apart():
    from retime.collectors.kineto import _scan_lex as X

    t = tuple(kf.intern_table(8, 64))
    buf = np.frombuffer(b"abcabdabcab", np.uint8)
    # the same hash for different bytes (a forced collision): different ids, each found again
    got = [X.intern(t, buf, s, e, 42) for s, e in ((0, 3), (3, 6), (6, 9), (3, 6), (9, 11))]
    assert got == [0, 1, 0, 1, 2]
    assert [kf.table_bytes(list(t), i) for i in range(3)] == [b"abc", b"abd", b"ab"]


def test_intern_tables_grow_while_reading(tmp_path, monkeypatch):
    # thousands of distinct names through tables that start with 4 slots and an 8-byte pool
    ev = [{"ph": "X", "cat": f"cpu_op{i % 3}" if i % 5 else "cpu_op", "name": f"op_{i}_\u00e9",
           "pid": 1, "tid": 1, "ts": i, "dur": 0.5} for i in range(3000)]
    path = tmp_path / "names.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    small = kf.intern_table
    monkeypatch.setattr(kf, "intern_table", lambda: small(4, 8))
    monkeypatch.setattr(kf, "ROWS", 100)
    assert_same(path, monkeypatch)
    fast = kf.parse_fast(path)
    assert len(set(fast.strings) & {f"op_{i}_\u00e9" for i in range(3000)}) == 3000


def test_host_order_equals_lexsort():
    from retime.collectors.kineto.assemble import _host_order

    rng = np.random.default_rng(7)
    for n in (0, 1, 2, 50, 5000):
        lane = rng.integers(0, 4, n)
        hs = 1_700_000_000_000_000_000 + rng.integers(0, 40, n) * 1000  # many equal starts
        he = hs + rng.integers(0, 3, n) * 500
        hc = rng.integers(0, 4, n).astype(np.int8)
        assert np.array_equal(_host_order(lane, hs, he, hc), np.lexsort((hc, -he, hs, lane)))
    big = np.array([0, 1 << 50], np.int64)  # too wide to pack: plain lexsort
    assert _host_order(np.zeros(2, np.int64), big, big, np.zeros(2, np.int8)).tolist() == [0, 1]
