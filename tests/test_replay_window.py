"""A replay computed a window of the run at a time (replay/window.py, issue 30) equals the
whole graph's replay: per-op times and critical predecessors, the graph's statistics and gap
shares, with unexplained delays kept and dropped, on every shared trace and on synthesized
pipelines (cross-rank send/recv), at window sizes from a few to dozens of windows."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import SHARED_CASES, ingest_cached

from retime.cli import run
from retime.collectors.enums import LaneKind, OpKind
from retime.collectors.trace import Trace
from retime.replay import build_graph, simulate
from retime.replay.gaps import gap_shares
from retime.replay.window import _merged, replay_windows, window_cuts, windowed_replay


def _same_as_whole(t: Trace, parts: int) -> int:
    """Assert the windowed replay of ``t`` in about ``parts`` windows equals the whole
    graph's, kept and ideal; return the number of windows it used."""
    used = 0
    for ideal in (False, True):
        g = build_graph(t, ideal=ideal)
        whole = simulate(g)
        w = replay_windows(t, ideal=ideal, window_ops=max(1, g.n_ops // parts))
        assert w is not None
        np.testing.assert_array_equal(w["start_ns"], whole.start_ns)
        np.testing.assert_array_equal(w["end_ns"], whole.end_ns)
        np.testing.assert_array_equal(w["crit_pred"], whole.crit_pred)
        assert w["stats"] == {k: v for k, v in g.stats.items() if k != "relaxed"}
        assert w["gaps"] == gap_shares(g)
        used = w["windows"]
    return used


@pytest.mark.parametrize("name", sorted(SHARED_CASES))
def test_windowed_replay_equals_the_whole_graph_on_every_shared_trace(name):
    t = ingest_cached(SHARED_CASES[name])
    for parts in (5, 40):
        used = _same_as_whole(t, parts)
        # the traces with more than a handful of ops are really cut (collectives and
        # blocking waits leave exact cuts between steps and kernels)
        if len(t.ops) > 1000:
            assert used >= min(parts, 4), (name, parts, used)


@pytest.mark.parametrize("pp,schedule", [(4, "1f1b"), (2, "interleaved")])
def test_windowed_replay_equals_the_whole_graph_on_synthesized_pipelines(pp, schedule):
    import retime.collectors.synth as synth
    t = synth.synthesize("gpt3-125m", "a100-80gb", tp=1, pp=pp, dp=2, global_batch=8,
                         micro_batch=1, schedule=schedule,
                         **({"chunks": 2} if schedule == "interleaved" else {}))
    rank = t.ops["rank"].to_numpy()
    # cross-rank dependencies: blocking-p2p edges and the send/receive pairs (one coll_id)
    p2p = t.ops[(t.ops["kind"] == int(OpKind.P2P)) & (t.ops["coll_id"] >= 0)]
    pairs = int((p2p.groupby("coll_id")["rank"].nunique() == 2).sum())
    assert (rank[t.edges["src"].to_numpy()] != rank[t.edges["dst"].to_numpy()]).sum() + pairs > 50
    # a send/receive pair is a rendezvous no cut may split, from the first member's start
    # (it waits inside its op, as measured) to the last end: 1F1B's chains of pairs leave
    # 2 exact cuts at pp=4 (4 when the pairs were edges)
    assert _same_as_whole(t, 12) >= 2


def test_cuts_avoid_every_forbidden_interval_and_balance_the_windows():
    rng = np.random.default_rng(7)
    for _ in range(50):
        s = np.sort(rng.integers(0, 10_000, 3000))
        lo = rng.integers(0, 10_000, 40)
        hi = lo + rng.integers(0, 300, 40)
        cuts = window_cuts(s, lo, hi, window_ops=400)
        assert (np.diff(cuts) > 0).all()
        for t in cuts.tolist():  # brute force: no interval (lo, hi] holds a cut
            assert not ((lo < t) & (t <= hi)).any()
        a, b = _merged(lo, hi)
        assert (a[1:] > b[:-1]).all()  # disjoint, sorted
        for x in range(0, 10_300, 7):  # the union is the same set of points
            assert ((a < x) & (x <= b)).any() == ((lo < x) & (x <= hi)).any()
    s = np.arange(10_000)
    cuts = window_cuts(s, np.zeros(0, np.int64), np.zeros(0, np.int64), window_ops=1000)
    assert len(cuts) == 9 and np.diff(np.searchsorted(s, cuts)).max() <= 1100
    # one interval over everything: no exact cut, one window
    assert len(window_cuts(s, np.array([-1]), np.array([10_000]), window_ops=1000)) == 0


def _crossed() -> Trace:
    """Two collectives matched in opposite orders on two ranks (a dependency cycle), then a
    long tail of kernels, so that the run has windows."""
    lanes = {"lane": [0, 1], "rank": [0, 1], "device": [0, 0],
             "lane_kind": [int(LaneKind.GPU_STREAM)] * 2}
    k = 200
    ops = {"rank": [0, 0, 1, 1] + [0] * k, "lane": [0, 0, 1, 1] + [0] * k,
           "kind": [OpKind.COLLECTIVE] * 4 + [OpKind.KERNEL] * k,
           "name_id": [0, 1, 1, 0] + [2] * k,
           "start_ns": [0, 10, 0, 10] + list(range(100, 100 + 10 * k, 10)),
           "dur_ns": [5] * (4 + k), "coll_id": [1, 2, 2, 1] + [-1] * k}
    return Trace.build(ops=ops, lanes=lanes, strings=["allreduce_A", "allreduce_B", "k"])


def test_a_cycle_falls_back_to_the_whole_graph(tmp_path, capsys):
    t = _crossed()
    assert replay_windows(t, window_ops=20) is None  # relaxing is a choice over the run
    p = t.save(tmp_path / "crossed.retime", layout="rank")
    assert run(["replay", str(p), "--window-ops", "20"]) == 0
    cap = capsys.readouterr()
    err = cap.out + cap.err
    assert "dependency cycle" in err and "replaying the whole graph" in err
    assert run(["replay", str(p), "--json", "--window-ops", "20"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["relaxed"]["count"] == 1 and out["memory"]["windows"] == 1


def test_cli_identity_replay_is_windowed_and_prints_the_whole_graphs_figures(tmp_path, capsys):
    t = ingest_cached(SHARED_CASES["dlrm-v100-8rank"])
    p = t.save(tmp_path / "dlrm.retime", layout="rank")
    whole = simulate(build_graph(t)).summary()
    r = windowed_replay(t, window_ops=1000)
    assert r.graph is None and r.meta["windows"] >= 8
    assert r.summary() == whole
    for ideal in ([], ["--ideal"]):
        outs = []
        for w in (["--window-ops", "1000"], ["--window-ops", str(10**9)]):
            assert run(["replay", str(p), "--json", *ideal, *w]) == 0
            outs.append(json.loads(capsys.readouterr().out))
        assert outs[0]["memory"]["windows"] >= 8 and outs[1]["memory"]["windows"] == 1
        assert outs[0]["memory"]["graph_bytes"] < outs[1]["memory"]["graph_bytes"]
        for k in set(outs[0]) | set(outs[1]):
            if k != "memory":
                assert outs[0][k] == outs[1][k], k
        ref = simulate(build_graph(t, ideal=bool(ideal))).summary()
        for k in ref:
            assert outs[0][k] == ref[k], k
    # and the text output says the graph is built a window at a time
    assert run(["replay", str(p)]) == 0
    cap = capsys.readouterr()
    assert "per window, replayed a window at a time" in cap.out + cap.err


def test_rank_numbers_need_not_start_at_zero_and_bad_edges_are_left_to_the_whole_build(
        tmp_path, capsys):
    import dataclasses
    t = ingest_cached(SHARED_CASES["dlrm-v100-8rank"])
    ops = t.ops.copy()
    ops["rank"] = ops["rank"].to_numpy() - 3  # ranks -3..4
    shifted = dataclasses.replace(t, ops=ops)
    assert _same_as_whole(shifted, 8) >= 4
    edges = t.edges.copy()
    edges.loc[0, "dst"] = len(t.ops) + 5
    bad = dataclasses.replace(t, edges=edges)
    assert replay_windows(bad, window_ops=1500) is None
    p = bad.save(tmp_path / "dangling.retime", layout="rank")
    assert run(["replay", str(p), "--window-ops", "1500"]) == 2
    cap = capsys.readouterr()
    err = [x for x in (cap.out + cap.err).splitlines() if not x.startswith("replay: ")]
    assert len(err) == 1 and "dangling edge" in err[0], err
