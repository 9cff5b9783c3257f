"""Corners of the word-at-a-time Kineto scanner (collectors/kineto/_scan_kernels.py) and of the
streaming reader's block handling (collectors/kineto/scan.py), each checked against the
general msgspec path, event for event.
"""

from __future__ import annotations

import gzip
import json
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import numpy as np
import pytest
from test_kineto_stream import _norm, assert_same_parts  # the same field-by-field view of a parse

import retime.collectors.kineto.reader as kin
import retime.collectors.kineto.scan as kf
from retime.collectors.errors import TraceFormatError
from retime.collectors.kineto import _scan_lex as X
from retime.collectors.kineto import parse_kineto_file

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "kineto"


def _same_as_general(path: Path, monkeypatch):
    fast = kf.parse_fast(path)
    assert fast is not None, f"{path.name}: the streaming reader fell back"
    with monkeypatch.context() as m:
        m.setattr(kin, "STREAMING", False)
        gen = parse_kineto_file(path)
    a, b = _norm(fast), _norm(gen)
    assert_same_parts(a, b)
    return fast


def _x(name: str, ts: float, **kw) -> dict:
    ev = {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 2, "ts": ts, "dur": 1.5}
    ev.update(kw)
    return ev


def test_keys_near_the_known_ones(tmp_path, monkeypatch):
    # keys that start like, end like or extend the keys the scanner reads by their words
    ev = [
        _x("a", 1, phase="Y", names="n", argsx={"correlation": 5}, pid_=3, ts2=9.5, durx=1,
           args={"correlation_id": 1, "Device Idx": 2, "Total Allocatedx": 3, "Total Reserve": 4,
                 "bytes ": 5, "External": 6, "External id ": 7, "Device Typ": 8, "stream": 3}),
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 2, "dur": 1,
         "args": {"correlation": 11, "External id": 12, "device": 0, "stream": 7, "bytes": 64,
                  "Device Type": 1, "Device Id": 0, "Bytes": 8, "Total Allocated": 1,
                  "Total Reserved": 2}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2,
         "ts": 1.9, "dur": 0.5, "args": {"correlation": 11, "External id": 12}},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 2, "ts": 3,
         "args": {"Device Type": 1, "Device Id": 0, "Bytes": 64, "Total Allocated": 128,
                  "Total Reserved": 256}},
    ]
    path = tmp_path / "keys.json"
    text = json.dumps({"traceEvents": ev}).encode()
    # escaped spellings of known keys: read the general way
    text = text.replace(b'"phase"', b'"ph\\u0061se"').replace(b'"durx"', b'"d\\u0075r"')
    path.write_bytes(text)
    fast = _same_as_general(path, monkeypatch)
    assert fast.accounting["events_read"] == len(ev)


@pytest.mark.parametrize("ph", ['"X"', '"\\u0058"', '"XX"', '""', '"x"'])
def test_phase_spellings(tmp_path, monkeypatch, ph):
    body = json.dumps([_x("a", 1), _x("b", 2), _x("c", 3)]).encode()
    body = body.replace(b'"ph": "X", "cat": "cpu_op", "name": "b"',
                        b'"ph": ' + ph.encode() + b', "cat": "cpu_op", "name": "b"')
    path = tmp_path / "ph.json"
    path.write_bytes(b'{"traceEvents": ' + body + b"}")
    try:
        parse_kineto_file(path)
    except TraceFormatError as exc:  # an unknown phase: both paths say the same
        with monkeypatch.context() as m:
            m.setattr(kin, "STREAMING", False)
            with pytest.raises(TraceFormatError) as gen:
                parse_kineto_file(path)
        assert str(gen.value) == str(exc)
        assert ph not in ('"X"', '"\\u0058"')
        return
    _same_as_general(path, monkeypatch)


def test_compact_and_pretty_whitespace(tmp_path, monkeypatch):
    ev = [_x(f"op{i}", i + 0.0004 * (i % 7), args={"External id": i}) for i in range(300)]
    for indent, seps in ((None, (",", ":")), (4, (", ", ": ")), ("\t", (" ,", " :  "))):
        path = tmp_path / "w.json"
        path.write_text(json.dumps({"traceEvents": ev}, indent=indent, separators=seps))
        _same_as_general(path, monkeypatch)


def test_gzip_carry_and_huge_events(tmp_path, monkeypatch):
    # gzip blocks joined to the carry in the reused buffer, with events longer than a block
    ev = [_x(f"op{i}", i, args={"External id": i, "Input Dims": [[i] * (2000 if i % 97 == 5 else 3)]})
          for i in range(2000)]
    path = tmp_path / "big.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": ev}).encode()))
    monkeypatch.setattr(kf, "BLOCK_BYTES", 4096)
    fast = _same_as_general(path, monkeypatch)
    assert fast.accounting["events_read"] == len(ev)
    for p in (SHARED / "dlrm-v100-8rank").glob("worker0*"):
        _same_as_general(p, monkeypatch)


def test_bad_kept_event_is_named_as_alone(tmp_path):
    # NCCL kernels are decoded together per block; a bad one is still reported by index
    ev = [{"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "pid": 0, "tid": 7,
           "ts": i, "dur": 1, "args": {"correlation": i, "device": 0, "stream": 7, "Seq": i}}
          for i in range(20)]
    ev[13]["args"]["Seq"] = [1]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    with pytest.raises(TraceFormatError, match=r"bad.json: event 13: field 'args.Seq' is invalid"):
        parse_kineto_file(path)


def test_hash_reads_the_same_bytes_wherever_the_string_is():
    # the word-at-a-time hash masks the tail: equal strings hash equally at any offset and
    # next to any neighbour bytes, up to the end of the buffer
    s = b"aten::linear_backward"
    for pad in range(0, 9):
        for tail in (b"", b"x", b"\"}]xxxxxxxxx"):
            buf = np.frombuffer(b"#" * pad + s + tail, np.uint8)
            t = tuple(kf.intern_table(8, 256))
            h0 = X.hash_of(np.frombuffer(s, np.uint8), 0, len(s))
            assert X.hash_of(buf, pad, pad + len(s)) == h0
            assert X.intern(t, buf, pad, pad + len(s), h0) == 0


def test_many_duplicate_names_in_one_event(tmp_path, monkeypatch):
    # duplicate keys send an event the general way (the last one wins there); the scanner
    # interns at most one name per event, so tiny intern tables never overflow
    dups = ", ".join(f'"name": "n{i}"' for i in range(3000))
    text = ('{"traceEvents": [' + json.dumps(_x("a", 1))[:-1] + ", " + dups + "}, " +
            json.dumps(_x("b", 2)) + "]}")
    path = tmp_path / "dups.json"
    path.write_text(text)
    small = kf.intern_table
    monkeypatch.setattr(kf, "intern_table", lambda: small(4, 8))
    fast = _same_as_general(path, monkeypatch)
    nid = np.concatenate([fast.ops["name_id"], fast.ranges["name_id"]])
    assert set(np.asarray(fast.strings, object)[nid]) == {"n2999", "b"}


def test_long_timestamps(tmp_path, monkeypatch):
    # integer digits are read eight at a time: 16-digit epochs with and without fractions
    # agree with the general path where its float is exact, and are exact decimal -> ns
    # (the fourth decimal rounds half up) where it is not
    exact = ["1669783687464181", "1700000000000015.0", "1669783687464181.5", "12345678",
             "123456789", "9000000000000000", "8999999999999999", "99999999.125"]
    tricky = ["1234567812345678.125", "0.0005", "1669783687.4641815", "99999999.99949"]
    for ts, same in ((exact, True), (tricky, False)):
        ev = [_x(f"op{i}", 1, tid=i) for i in range(len(ts))]  # one lane each: all ops
        text = json.dumps({"traceEvents": ev}, separators=(",", ":"))
        for t in ts:
            text = text.replace('"ts":1,', '"ts":' + t + ",", 1)
        path = tmp_path / "ts.json"
        path.write_text(text)
        fast = _same_as_general(path, monkeypatch) if same else kf.parse_fast(path)
        names = np.asarray(fast.strings, object)[fast.ops["name_id"]]
        got = dict(zip(names.tolist(), fast.ops["start_ns"].tolist()))
        want = {f"op{i}": int((Decimal(t) * 1000).quantize(Decimal(1), ROUND_HALF_UP))
                for i, t in enumerate(ts)}
        assert got == want
