"""Re-synthesis is reused across what-ifs that ask for the same configs (sweeps)."""

from __future__ import annotations

import numpy as np

from collectors.synth import synthesize
from replay import whatif
from replay.policies import base


def _job():
    return synthesize("gpt3-125m", "a100-80gb", tp=1, pp=1, dp=16, global_batch=16,
                      micro_batch=1, bucket_mb=300)


def test_same_network_change_is_synthesized_once_and_gives_the_same_result(monkeypatch):
    import collectors.synth as cs
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
