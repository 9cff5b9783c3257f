"""`retime export --chrome`: structure Perfetto can show (ranges, arrows, critical path,
measured and replayed timelines), checked against the trace-event format's rules for
slices and flows, and read back by `retime ingest`."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict

import numpy as np
import pytest
from conftest import SHARED, ingest_cached

from retime.analysis import critical_path
from retime.cli import run
from retime.collectors.chrome import CRITICAL_PID, REPLAYED_PID, write_chrome
from retime.collectors.enums import EdgeKind
from retime.collectors.trace import read_trace


def _ns(x: float) -> int:
    return int(round(x * 1000))


def check_format(doc: dict) -> dict:
    """Apply the trace-event rules; return {flow id: (bound src slice, bound dst slice)}.

    * complete events (``X``) of one thread (pid, tid) nest: none starts inside another and
      ends after it;
    * every flow id has exactly one start (``s``) and one end (``f`` with ``bp: "e"``);
    * a flow event binds to the innermost slice on its thread that encloses its timestamp
      (on equal intervals, the one written later, which nests inside); it must find one.
    """
    ev = doc["traceEvents"]
    slices: dict[tuple, list] = defaultdict(list)
    for i, e in enumerate(ev):
        assert e["ph"] in ("M", "X", "s", "f"), e
        if e["ph"] == "X":
            assert e["dur"] >= 0 and isinstance(e["ts"], float | int)
            s = _ns(e["ts"])
            slices[(e["pid"], e["tid"])].append((s, s + _ns(e["dur"]), i))
    for key, v in slices.items():
        v.sort(key=lambda x: (x[0], -(x[1] - x[0]), x[2]))
        stack: list = []
        for s, e, i in v:
            while stack and stack[-1][1] <= s:
                stack.pop()
            assert not stack or e <= stack[-1][1], f"slices overlap on {key}: {ev[i]['name']}"
            stack.append((s, e, i))
    flows: dict[int, list] = defaultdict(list)
    for e in ev:
        if e["ph"] in ("s", "f"):
            flows[e["id"]].append(e)
    bound = {}
    for fid, fs in flows.items():
        assert sorted(x["ph"] for x in fs) == ["f", "s"], fid
        pair = {}
        for x in fs:
            if x["ph"] == "f":
                assert x.get("bp") == "e"
            t = _ns(x["ts"])
            enc = [z for z in slices[(x["pid"], x["tid"])] if z[0] <= t <= z[1]]
            assert enc, f"flow {fid} ({x['ph']}) is not inside any slice of its thread"
            pair[x["ph"]] = ev[max(enc, key=lambda z: (z[0], -z[1], z[2]))[2]]
        bound[fid] = (pair["s"], pair["f"])
    return bound


def _expected_arrows(t) -> Counter:
    """The arrows the export promises, derived from the trace: every edge except host order,
    and for each collective instance, last arriver -> every other member."""
    e = t.edges
    keep = e["kind"].to_numpy() != int(EdgeKind.HOST_ORDER)
    out = Counter(zip(e["src"].to_numpy()[keep].tolist(), e["dst"].to_numpy()[keep].tolist()))
    o = t.ops
    for _, g in o[o["coll_id"] >= 0].groupby("coll_id"):
        ids, st = g["op_id"].to_numpy(), g["start_ns"].to_numpy()
        last = ids[np.lexsort((ids, -st))[0]]
        out.update((int(last), int(m)) for m in ids if m != last)
    return out


@pytest.fixture(scope="module")
def dlrm():
    return ingest_cached(SHARED / "kineto" / "dlrm-v100-8rank")


def test_measured_export_structure(dlrm, tmp_path):
    cp = critical_path(dlrm)
    path = tmp_path / "t.json"
    write_chrome(dlrm, path, critical_op_ids=cp["op_id"].to_numpy())
    doc = json.loads(path.read_text())
    bound = check_format(doc)
    ev = doc["traceEvents"]
    # flows bind to the two ops of each promised arrow, no more, no less
    got = Counter((a["args"]["op_id"], b["args"]["op_id"]) for a, b in bound.values())
    assert got == _expected_arrows(dlrm)
    # annotation ranges are slices on their threads
    ranges = [e for e in ev if e["ph"] == "X" and e.get("cat") == "user_annotation"]
    assert len(ranges) == len(dlrm.ranges) > 4000
    assert any(e["name"].startswith("ProfilerStep#") for e in ranges)
    # the critical path: its ops tagged, and a track holding the path at the top
    ops = [e for e in ev if e["ph"] == "X" and "op_id" in e.get("args", {})]
    assert len(ops) == dlrm.n_ops
    tagged = {e["args"]["op_id"] for e in ops if e["args"].get("critical_path")}
    assert tagged == set(cp["op_id"].tolist())
    track = [e for e in ev if e["ph"] == "X" and e["pid"] == CRITICAL_PID]
    assert len(track) == len(cp)
    names = {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
    assert names[CRITICAL_PID] == "critical path (measured)"
    assert names[3] == "rank 3"


def test_overlapping_slices_move_to_extra_tracks(tmp_path):
    # the vgg13 trace has ops that overlap on one stream and on the python thread
    t = ingest_cached(SHARED / "kineto" / "h100-vgg13" / "profiler_vgg13-iter41.json.gz")
    path = tmp_path / "v.json"
    write_chrome(t, path, critical_op_ids=critical_path(t)["op_id"].to_numpy())
    doc = json.loads(path.read_text())
    check_format(doc)
    extra = [e for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"
             and "(overlapping" in e["args"]["name"]]
    assert extra
    ops = [e for e in doc["traceEvents"] if e["ph"] == "X" and "op_id" in e.get("args", {})]
    assert len(ops) == t.n_ops  # nothing dropped: moved


def test_cli_exports_measured_and_replayed_side_by_side(dlrm, tmp_path, capsys):
    src = dlrm.save(tmp_path / "d.retime")
    out = tmp_path / "both.json.gz"
    assert run(["export", str(src), "--chrome", str(out), "--set", "hardware.host_speedup=2",
                "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["timelines"] == ["measured", "replayed: hardware.host_speedup=2.0"]
    doc = json.load(gzip.open(out))
    check_format(doc)
    ev = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
    for r in range(8):
        assert names[r] == f"rank {r}"
        assert names[REPLAYED_PID + r] == f"rank {r} (replayed: hardware.host_speedup=2.0)"
    ops = [e for e in ev if e["ph"] == "X" and "op_id" in e.get("args", {})]
    rep = [e for e in ops if e["args"].get("timeline") == "replayed"]
    assert len(rep) == len(ops) - len(rep) == dlrm.n_ops
    assert all(e["pid"] >= REPLAYED_PID for e in rep)
    # the replay's ops really are re-timed: host work twice as fast
    import retime.replay as replay
    w = replay.whatif(dlrm, {"hardware.host_speedup": 2.0})
    by_id = {e["args"]["op_id"]: e for e in rep}
    base = doc["baseTimeNanoseconds"]
    for i in (0, dlrm.n_ops // 2, dlrm.n_ops - 1):
        assert _ns(by_id[i]["ts"]) + base == w.start_ns[i]
    # read back: the measured ops and ranges only; the copies are counted, not ingested
    back = tmp_path / "back.retime"
    assert run(["ingest", str(out), "-o", str(back), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["ops"] == dlrm.n_ops and s["ranges"] == len(dlrm.ranges)
    assert (s["dropped"]["replayed timeline (a copy of the ops and ranges for viewing)"]
            == dlrm.n_ops + len(dlrm.ranges))
    b = read_trace(back)
    ka = np.lexsort((dlrm.ranges["start_ns"], dlrm.ranges["lane"], dlrm.ranges["rank"]))
    kb = np.lexsort((b.ranges["start_ns"], b.ranges["lane"], b.ranges["rank"]))
    for c in ("rank", "start_ns", "end_ns", "depth"):
        assert np.array_equal(dlrm.ranges[c].to_numpy()[ka], b.ranges[c].to_numpy()[kb]), c


def test_cli_export_options(dlrm, tmp_path, capsys):
    src = dlrm.save(tmp_path / "d.retime")
    out = tmp_path / "r.json"
    assert run(["export", str(src), "--chrome", str(out), "--ideal", "--timelines", "replayed",
                "--no-flows"]) == 0
    doc = json.loads(out.read_text())
    assert not [e for e in doc["traceEvents"] if e["ph"] in ("s", "f")]
    capsys.readouterr()
    assert run(["export", str(src), "--chrome", str(tmp_path / "x.json"), "--timelines",
                "replayed"]) == 2
    assert "--timelines needs a what-if" in capsys.readouterr().err
