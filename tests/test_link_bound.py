"""A plain trace's link fit beyond the largest transfer it saw, bounded by the stated rate
(issue 26, batch 8's miss: link_fit.bound_by_stated_rate). Closed forms only."""

from __future__ import annotations

import numpy as np
import pytest

from retime.replay.policies.link_fit import TCP_GOODPUT, bound_by_stated_rate

# batch 8's conv net: old buckets of 332 KB fitted at 0.479 GB/s (the token bucket's burst),
# a 500 Mbit/s link (0.0625 GB/s) stated
SEEN, FIT, STATED, ALPHA = 332e3, 0.479, 0.0625, 200e3


def _fit(x):
    return ALPHA + np.asarray(x, np.float64) / FIT


def test_bytes_beyond_what_the_fit_saw_move_at_the_stated_rate():
    x = np.array([100e3, SEEN, 1.0e6])
    t, info = bound_by_stated_rate(x, _fit(x), ALPHA, 1.0 / FIT, SEEN, STATED)
    assert info["bounded"] is True
    # at or under what the fit saw: the fit, unchanged
    assert t[0] == pytest.approx(_fit(100e3)[()])
    assert t[1] == pytest.approx(_fit(SEEN)[()])
    # above it: the fit up to 332 KB, the other 668 KB as TCP goodput at 500 Mbit/s
    want = ALPHA + SEEN / FIT + (1.0e6 - SEEN) / (STATED * TCP_GOODPUT)
    assert t[2] == pytest.approx(want)
    assert want / 1e6 == pytest.approx(0.2 + 0.693 + 11.18, abs=0.01)  # ms, by hand


def test_without_a_stated_rate_the_fit_is_kept_and_said_unbounded():
    x = np.array([1.0e6])
    t, info = bound_by_stated_rate(x, _fit(x), ALPHA, 1.0 / FIT, SEEN, None)
    assert t[0] == _fit(1.0e6)
    assert info == {"seen_mb": pytest.approx(0.332), "largest_new_mb": 1.0, "fit_gbps": pytest.approx(FIT),
                    "stated_gbps": None, "bounded": False}


def test_a_fit_slower_than_the_stated_link_is_not_bounded():
    x = np.array([1.0e6])
    slow = 0.05  # below 0.0625 * TCP_GOODPUT: the fit already paces slower than the link
    t, info = bound_by_stated_rate(x, ALPHA + x / slow, ALPHA, 1.0 / slow, SEEN, STATED)
    assert t[0] == ALPHA + 1.0e6 / slow and info["bounded"] is False


def test_nothing_above_what_the_fit_saw():
    x = np.array([SEEN, 10e3])
    t, info = bound_by_stated_rate(x, _fit(x), ALPHA, 1.0 / FIT, SEEN, STATED)
    assert info is None and np.array_equal(t, _fit(x))


def test_batch_8_conv_net_range_reaches_the_measured_step():
    """Batch 8's miss (cnn-bucket-0.25-25-500mbit A -> B, plain trace): the stated link rate
    leaves the predicted step as the fit's and extends the range up to the bound, which now
    holds the 25 MiB capture's measured median (55.4 ms; the range was 45.1-51.9 ms)."""
    import json
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "bench"))
    from pairs import PAIRS, load_capture, whatif_summary

    name = "cnn-bucket-0.25-25-500mbit"
    spec = json.loads((PAIRS / "pairs.json").read_text())["pairs"][name]
    trace = load_capture(PAIRS / name / "A", plain=True)
    keys = {"overlap.bucket_mb": 26.2144}
    stated = {**keys, "network.measured_inter_node_gbps": 0.0625}
    plain, bounded = whatif_summary(trace, keys), whatif_summary(trace, stated)
    step = plain["step_time_ns"]["per_step"]["replayed"]
    assert bounded["step_time_ns"]["per_step"]["replayed"] == step  # the step is the fit's
    lo, hi = bounded["step_time_ns"]["range"]
    truth = spec["median_ns"]["B"]
    assert not plain["step_time_ns"]["range"][1] >= truth  # without the stated rate: outside
    assert lo <= truth <= hi
    assert any("at least what the fit saw" in a for a in bounded["whatif"]["assumed"])
    assert "unbounded" in plain["whatif"]  # the fit's extrapolation, said unbounded
