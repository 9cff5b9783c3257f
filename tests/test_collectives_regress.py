"""Issue #28, collectives: pairing by time (members of one instance overlap; an all-to-all's
size is no key) and wait/skew from matched instances only, the unmatched ones listed.

On the hand-built reproduction of HTA's trace_filter sample (traces/regress/README.md);
expected figures from the numbers traces/regress/build.py writes.
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from conftest import ROOT

from retime.analysis.comm import collectives, rank_wait
from retime.cli import run
from retime.collectors.enums import OpKind
from retime.collectors.ingest import read

REGRESS = ROOT / "traces" / "regress"
_spec = importlib.util.spec_from_file_location("regress_build", REGRESS / "build.py")
B = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(B)
A2A = REGRESS / "all-to-all-off-by-one"
MS = 1_000_000


def _both() -> list[int]:
    return sorted(set(B.A2A_CALLS[0]) & set(B.A2A_CALLS[1]))


def _world2(tmp_path):
    """The same two ranks as a whole 2-rank job (every member of each call in the trace)."""
    out = tmp_path / "w2"
    out.mkdir()
    for f in A2A.glob("*.json"):
        d = json.loads(f.read_text())
        d["distributedInfo"].update(world_size=2, pg_config=[
            {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]}])
        for e in d["traceEvents"]:
            if "Group size" in e.get("args", {}):
                e["args"]["Group size"] = 2
        (out / f.name).write_text(json.dumps(d))
    return out


def test_all_to_all_pairs_with_the_call_that_ends_with_it():
    """Rank 0 holds calls 0-5, rank 1 calls 1-6. The k-th-with-k-th pairing put a 1,536 B
    call with a 339.7 MB one; each call now pairs with the other rank's call that ends at
    the same nanosecond, and the two calls only one rank holds stay alone."""
    t = read([A2A])
    o = t.ops
    c = o[o["kind"].to_numpy() == int(OpKind.COLLECTIVE)]
    assert len(c) == 12
    end = (c["start_ns"] + c["dur_ns"]).to_numpy()
    g = c.assign(end=end).groupby("coll_id")
    sizes = g.size()
    assert sorted(sizes.tolist()) == [1, 1] + [2] * len(_both())
    for _, m in g:
        if len(m) == 2:
            assert m["end"].nunique() == 1 and m["bytes"].nunique() == 1
    # the pairs are the calls both ranks hold, at the builder's times and sizes
    want = sorted((round(B.a2a_times_ms(k, 1)[1] * MS), B.A2A_BYTES[k % 2]) for k in _both())
    got = sorted((int(m["end"].iloc[0]), int(m["bytes"].iloc[0])) for _, m in g if len(m) == 2)
    assert got == want
    st = t.meta["collectives"]
    assert (st["matched"], st["unmatched"]) == (0, len(_both()) + 2)  # 2 of 128 ranks


def test_wait_and_skew_only_from_matched_instances(tmp_path, capsys):
    # 2 of 128 ranks: no instance has every member; no wait, skew or waiting rank
    t = read([A2A])
    co = collectives(t)
    assert not co["matched"].any()
    assert co["wait_ns"].isna().all() and co["skew_ns"].isna().all()
    assert len(rank_wait(t)) == 0
    src = t.save(tmp_path / "a.retime")
    assert run(["analyze", str(src), "--json"]) == 0
    an = json.loads(capsys.readouterr().out)
    (row,) = an["comm"]
    assert (row["instances"], row["matched"], row["unmatched"]) == (7, 0, 7)
    assert row["wait_ns"] is None and row["max_skew_ns"] is None
    assert an["rank_wait"] == []
    reasons = sorted(r["reason"] for r in an["comm_unmatched"])
    assert reasons == ["1 of 128 group members in the trace"] * 2 + [
        "2 of 128 group members in the trace"] * 5
    # the whole job (2 ranks): the 5 calls both hold are matched; rank 0 arrives first
    # by A2A_LATE_MS each time
    t2 = read([_world2(tmp_path)])
    co = collectives(t2)
    mt = co[co["matched"]]
    assert len(mt) == len(_both())
    late = round(B.A2A_LATE_MS * MS)
    assert (mt["skew_ns"] == late).all() and (mt["wait_ns"] == late).all()
    assert (mt["last_rank"] == 1).all()
    rw = rank_wait(t2).set_index("rank")
    assert rw.loc[0, "wait_ns"] == late * len(_both()) and rw.loc[1, "wait_ns"] == 0
    src2 = t2.save(tmp_path / "w2.retime")
    assert run(["analyze", str(src2), "--json"]) == 0
    an = json.loads(capsys.readouterr().out)
    (row,) = an["comm"]
    assert (row["matched"], row["unmatched"]) == (5, 2)
    assert row["wait_ns"] == pytest.approx(late * 5) and row["max_skew_ns"] == late
    assert sorted(r["reason"] for r in an["comm_unmatched"]) == [
        "1 of 2 group members in the trace"] * 2
    np.testing.assert_array_equal(sorted(r["bytes"] for r in an["comm_unmatched"]),
                                  sorted(B.A2A_BYTES[k % 2] for k in (0, 6)))
