"""An identity replay read from a rank-partitioned store a window at a time
(replay/window_store.py, issue 30) equals the whole graph's replay: per-op times and
critical predecessors, and the ``retime replay --json`` summary (step times per rank, graph
statistics, gap shares, unseen-work notes) of the trace loaded whole; kept and ideal."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import SHARED_CASES, ingest_cached

from retime.analysis.coverage import unseen_work_by_rank
from retime.cli import run
from retime.collectors.steps import step_range_mask
from retime.collectors.trace import read_trace
from retime.replay import build_graph, simulate
from retime.replay.footprint import IDENTITY_COLUMNS
from retime.replay.window_store import replay_store

# traces with several ranks (several rank files), collectives, blocking waits and CPU-only
# ranks among them
CASES = ["dlrm-v100-8rank", "a100-ddp-nccl", "cpu-gloo-rank34", "event-sync-multi"]


def _store(tmp_path, name):
    t = ingest_cached(SHARED_CASES[name])
    p = tmp_path / f"{name}.retime"
    t.save(p, layout="rank")
    return t, p


def _light(p):
    """The trace as the in-memory identity replay reads it (9 columns, step annotations)."""
    t = read_trace(p, columns=list(IDENTITY_COLUMNS), fill_defaults=False, skip=("memory",))
    t.ranges = t.ranges[step_range_mask(t.ranges, t.strings)].reset_index(drop=True)
    return t


@pytest.mark.parametrize("name", CASES)
def test_store_replay_equals_the_whole_graph(tmp_path, name):
    t, p = _store(tmp_path, name)
    for ideal in (False, True):
        g = build_graph(t, ideal=ideal)
        whole = simulate(g)
        for parts in (1, 7):
            r = replay_store(p, ideal=ideal, window_ops=max(1, g.n_ops // parts),
                             results=True)
            assert r is not None
            if parts > 1 and len(t.ops) > 1000:
                assert r.meta["windows"] >= 3, (name, r.meta["windows"])
            np.testing.assert_array_equal(r.start_ns, whole.start_ns)
            np.testing.assert_array_equal(r.end_ns, whole.end_ns)
            np.testing.assert_array_equal(r.crit_pred, whole.crit_pred)
            s, sw = r.summary(), whole.summary()
            assert s == sw
            lt = _light(p)
            w = whole.step_windows()
            want = unseen_work_by_rank(lt, w.rename(columns={
                "measured_start_ns": "start_ns", "measured_end_ns": "end_ns"})[
                ["rank", "step", "start_ns", "end_ns"]])
            assert r.meta["unseen"] == want


def test_store_replay_cli_json_equals_the_loaded_replay(tmp_path, capsys):
    """The CLI's windowed replay (read from the store) prints what the whole graph's
    replay of the loaded trace prints, notes included, but for ``memory``."""
    _, p = _store(tmp_path, "dlrm-v100-8rank")
    outs = []
    for extra in ([], ["--window-ops", "2000"], ["--all-columns"]):
        assert run(["replay", str(p), "--json", *extra]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[1]["memory"]["windows"] > 3
    assert outs[2]["memory"]["windows"] == 1  # every column: the trace is loaded
    for d in outs:
        d.pop("memory")
    assert outs[0] == outs[1] == outs[2]


def test_single_file_store_is_left_to_the_loaded_path(tmp_path):
    t = ingest_cached(SHARED_CASES["dlrm-v100-8rank"])
    p = tmp_path / "one.retime"
    t.save(p)
    assert replay_store(p) is None


@pytest.mark.parametrize("name", ["dlrm-v100-8rank"])
def test_first_pass_step_windows_equal_a_second_read(tmp_path, name, monkeypatch):
    """An identity replay takes its step windows and unseen-work counts from the pass that
    reads the ops for the windows (a rank per batch here); a second read of the store (one
    batch of every rank) gives the same frame and counts."""
    import pandas as pd

    from retime.collectors.store import read_small_tables
    from retime.collectors.trace import SCHEMA_VERSION
    from retime.replay import window_store

    _, p = _store(tmp_path, name)
    monkeypatch.setattr(window_store, "_STEP_BATCH_OPS", 1)
    calls = []
    monkeypatch.setattr(window_store, "_by_rank_batch",
                        lambda *a, **k: calls.append(1))  # (never reached: identity)
    r = replay_store(p)
    assert r is not None and not calls
    monkeypatch.undo()
    monkeypatch.setattr(window_store, "_BATCH_OPS", 1 << 40)
    small = read_small_tables(p)
    meta = {k: v for k, v in small["meta"].items() if k not in ("layout", "partitions")}
    meta["schema_version"] = SCHEMA_VERSION
    w, unseen = window_store._by_rank_batch(p, small, meta, None)
    pd.testing.assert_frame_equal(r.step_windows(), w)
    assert r.meta["unseen"] == unseen
    assert len(w["rank"].unique()) > 1


def test_narrow_run_arrays_widen_when_a_value_does_not_fit():
    # ranks and lanes are held in 2 bytes, durations and collectives in 4, while they fit
    from retime.replay.window_store import _put

    a = np.full(4, -1, np.int16)
    a = _put(a, np.array([0, 2]), np.array([7, 32767]))
    assert a.dtype == np.int16 and a.tolist() == [7, -1, 32767, -1]
    a = _put(a, np.array([1, 3]), np.array([40000, -5]))
    assert a.dtype == np.int64 and a.tolist() == [7, 40000, 32767, -5]
    b = _put(np.zeros(2, np.int32), np.array([0, 1]), np.array([-(1 << 31) - 1, 3]))
    assert b.dtype == np.int64 and b.tolist() == [-(1 << 31) - 1, 3]
