"""Re-synthesis is reused across what-ifs that ask for the same configs (sweeps)."""

from __future__ import annotations

import numpy as np

from retime.collectors.synth import synthesize
from retime.replay import whatif
from retime.replay.policies import base


def _job():
    return synthesize("gpt3-125m", "a100-80gb", tp=1, pp=1, dp=16, global_batch=16,
                      micro_batch=1, bucket_mb=300)


def test_same_network_change_is_synthesized_once_and_gives_the_same_result(monkeypatch):
    import retime.collectors.synth as cs
    calls = []
    real = cs.synthesize

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(cs, "synthesize", counting)
    base._SYNTH_CACHE.clear()
    t = _job()
    calls.clear()
    a = whatif(t, {"network.inter_node_gbps": 12.5})
    b = whatif(t, {"network.inter_node_gbps": 12.5, "hardware.compute_speedup": 2.0})
    c = whatif(t, {"network.inter_node_gbps": 12.5})
    assert len(calls) == 1  # one re-synthesis for three what-ifs
    assert np.array_equal(a.end_ns, c.end_ns)
    assert b.step_time_ns < a.step_time_ns
    whatif(t, {"network.inter_node_gbps": 6.25})
    assert len(calls) == 2  # another network: synthesized


def test_a_cached_run_edited_in_place_is_not_reused():
    base._SYNTH_CACHE.clear()
    t = _job()
    a = whatif(t, {"network.inter_node_gbps": 12.5})
    (cached, _fp), = base._SYNTH_CACHE.values()
    cached.ops["dur_ns"] = cached.ops["dur_ns"] * 2  # somebody edits the returned trace
    b = whatif(t, {"network.inter_node_gbps": 12.5})
    assert np.array_equal(a.end_ns, b.end_ns)  # re-synthesized, not the edited copy


def test_sweep_worker_drops_the_last_groups_runs_when_it_moves_on():
    import weakref

    from retime.replay import sweep as sw
    t = _job()
    base._SYNTH_CACHE.clear()
    base._GRAPH_CACHE.clear()
    sw._WORKER.clear()
    sw._WORKER.update(trace=t, run=None)
    try:
        sw._run_in_worker(3, {"hardware.compute_speedup": 1.5})  # the shipped trace's graph
        rows = [sw._run_in_worker(0, {"network.inter_node_gbps": 12.5}),
                sw._run_in_worker(1, {"network.inter_node_gbps": 12.5,
                                      "hardware.compute_speedup": 2.0})]
        (run_a, _fp), = base._SYNTH_CACHE.values()  # one re-synthesis for the group
        gone = weakref.ref(run_a)
        del run_a, _fp
        assert any(ref() is gone() for ref, _g in base._GRAPH_CACHE.values())  # its graph
        rows.append(sw._run_in_worker(2, {"network.inter_node_gbps": 6.25}))
        assert gone() is None  # the first group's run (and its graph) are freed
        assert len(base._SYNTH_CACHE) == 1
        # the shipped trace's graph stays (a measured trace's scenarios all use it)
        assert any(ref() is t for ref, _g in base._GRAPH_CACHE.values())
        assert all(r["error"] is None for r in rows)
        assert rows[1]["step_time_ns"] < rows[0]["step_time_ns"]
    finally:
        sw._WORKER.clear()
