"""Activation checkpointing on a host-bound H200 trace recorded with Python stacks (pair
gpu-ckpt: traces/gpu_pairs/g1/gpt-b8 and gpt-b8-ckpt), recounted by hand from the raw JSON.

* ``loss.backward()`` is a Python frame (``run_backward``) on the main thread that waits for
  the autograd engine's device thread: the ingest ties its end to that thread's last op, so
  a what-if that changes the backward moves the step (before: its measured 64.5 ms held);
* ``cache.recompute=none`` removes the checkpoint's hooks, its recompute and its wrapper
  frames around each checkpointed module (the ``torch/utils/checkpoint.py`` time outside the
  nested ``nn.Module`` ranges), on both threads;
* ``cache.recompute=full`` re-runs each block's forward host work on the thread that runs the
  backward (the autograd thread), not on the forward's thread.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest

import retime
from retime.collectors.intervals import interval_union
from retime.replay import whatif
from retime.replay.graph import BLOCKING_CALL_PATTERN
from retime.replay.policies.recompute_measured import checkpoint_spans

ROOT = Path(__file__).resolve().parents[1]
G1 = ROOT / "traces" / "gpu_pairs" / "g1"
A = G1 / "gpt-b8" / "rep1.pt.trace.json.gz"
B = G1 / "gpt-b8-ckpt" / "rep1.pt.trace.json.gz"
_HOOK = re.compile(r"torch/utils/checkpoint\.py\(\d+\): (unpack_hook|pack_hook|recompute_fn)$")


def _events(p: Path) -> list[dict]:
    return [e for e in json.load(gzip.open(p))["traceEvents"] if e.get("ph") == "X"]


def _threads(ev: list[dict]) -> tuple[int, int]:
    """(main thread, autograd thread): the thread with ``run_backward``, the other thread
    with CPU ops."""
    main = next(e["tid"] for e in ev if "run_backward of torch._C._EngineBase" in e["name"])
    other = {e["tid"] for e in ev if e.get("cat") == "cpu_op"} - {main}
    assert len(other) == 1
    return main, other.pop()


def _ns_union(spans) -> int:
    s, e = interval_union(np.asarray([a for a, _ in spans], np.int64),
                          np.asarray([b for _, b in spans], np.int64))
    return int((e - s).sum())


@pytest.fixture(scope="module")
def ckpt():
    return retime.load(str(B)), _events(B)


def test_checkpoint_host_spans_recounted_from_the_raw_json(ckpt):
    t, ev = ckpt
    main, auto = _threads(ev)
    cs = checkpoint_spans(t)

    def us_ns(e):  # the ingest's integer ns of a Kineto us timestamp
        return int(round(e["ts"] * 1000)), int(round((e["ts"] + e["dur"]) * 1000))

    py = [e for e in ev if e.get("cat") == "python_function"]
    # hooks and recompute frames, per thread
    hooks = {tid: [us_ns(e) for e in py if e["tid"] == tid and _HOOK.search(e["name"])]
             for tid in (main, auto)}
    # wrapper: checkpoint.py frames minus the module ranges nested in them (hand loop)
    wrap = {}
    for tid in (main, auto):
        fr = interval_union(*map(np.asarray, zip(*[us_ns(e) for e in py if e["tid"] == tid
                                                   and "torch/utils/checkpoint.py(" in e["name"]],
                                                 strict=True)))
        mods = [us_ns(e) for e in py if e["tid"] == tid and e["name"].startswith("nn.Module: ")]
        out = []
        for a, b in zip(*fr, strict=True):
            inner = sorted((u, v) for u, v in mods if a <= u and v <= b)
            if not inner:
                continue
            cur = a
            for u, v in inner:
                if u > cur:
                    out.append((cur, u))
                cur = max(cur, v)
            if cur < b:
                out.append((cur, b))
        wrap[tid] = out
    lanes = {}
    for (_r, ln), (s, e) in cs["spans"].items():
        lanes[ln] = int((e - s).sum())
    got = sorted(lanes.values())
    want = sorted(_ns_union(hooks[tid] + wrap[tid]) for tid in (main, auto))
    np.testing.assert_allclose(got, want, atol=2000 * 600)  # ns rounding of ~600 frames
    # per step (3 steps): main thread 9.6 ms (hooks 4.2 + wrapper 5.4), autograd 31.7 ms
    assert got[0] / 3e6 == pytest.approx(9.62, abs=0.05)
    assert got[1] / 3e6 == pytest.approx(31.69, abs=0.05)
    assert cs["n_recompute"] == sum(1 for e in py if e["name"].endswith(": recompute_fn")) == 24


def test_backward_call_waits_for_the_autograd_thread(ckpt):
    t, ev = ckpt
    res = whatif(t, {"cache.recompute": "none"})
    o = t.ops
    names = np.asarray(t.strings, dtype=object)[o["name_id"].to_numpy()]
    calls = np.flatnonzero(["run_backward of torch._C._EngineBase" in str(x) for x in names])
    assert len(calls) == 3
    main_lane = int(o["lane"].to_numpy()[calls[0]])
    lane = o["lane"].to_numpy()
    s = o["start_ns"].to_numpy()
    e = s + o["dur_ns"].to_numpy()
    host = np.isin(o["kind"].to_numpy(), [5, 6])
    for c in calls.tolist():
        inside = np.flatnonzero(host & (lane != main_lane) & (s >= s[c]) & (e <= e[c]))
        last = inside[np.argmax(e[inside])]
        tail = e[c] - e[last]  # measured: the call returns this long after the thread's end
        assert 0 <= tail < 200_000
        assert res.end_ns[c] == res.end_ns[last] + tail
        # the backward call shrank (measured: 64.5 -> 41.4 ms in the second step)
        assert res.end_ns[c] - res.start_ns[c] < 0.75 * (e[c] - s[c])
    # the step shrinks by most of the removed host time (before this model: -4 ms)
    step = res.summary()["step_time_ns"]["per_step"]
    assert step["measured"] - step["replayed"] > 30e6  # measured: 101.8 -> 67.0 ms


def test_full_recompute_runs_the_forward_host_work_on_the_backward_thread():
    t = retime.load(str(A))
    ev = _events(A)
    main, auto = _threads(ev)
    blocks = [e for e in ev if e["tid"] == main and re.match(r"nn\.Module: Block_\d+$", e["name"])]
    assert len(blocks) == 24  # 8 blocks x 3 steps
    fwd_host_ns = sum(e["dur"] for e in blocks) * 1000
    base = whatif(t)
    res = whatif(t, {"cache.recompute": "full"})
    eff = res.meta["scenario"][0]
    assert eff["layers"] == "8 x Block"
    # the added time: the blocks' host ranges (13.2 ms per step) plus the GPU work they launched
    assert eff["added_ns"] > fwd_host_ns - 24 * 1000
    o = t.ops
    ph = o["phase"].to_numpy()
    lane = o["lane"].to_numpy()
    # (the backward() call itself waits longer: a blocking call, not counted)
    waits = np.asarray([bool(BLOCKING_CALL_PATTERN.search(x)) for x in t.names()])
    grew = np.flatnonzero((res.dur_ns > base.dur_ns + 1000) & ~waits)
    host = np.isin(o["kind"].to_numpy(), [5, 6])
    assert (ph[grew] == 1).all()
    auto_lane = np.unique(lane[host & (ph == 1)], return_counts=True)
    auto_lane = int(auto_lane[0][np.argmax(auto_lane[1])])
    assert set(lane[grew[host[grew]]].tolist()) == {auto_lane}
    added_host = float((res.dur_ns - base.dur_ns)[grew[host[grew]]].sum())
    assert added_host == pytest.approx(fwd_host_ns, abs=24 * 1000)
    step = res.summary()["step_time_ns"]["per_step"]
    # the step grows by the recompute's host time: host-bound (measured 58.1 -> 71.3 ms)
    assert step["replayed"] - step["measured"] > 0.9 * fwd_host_ns / 3
