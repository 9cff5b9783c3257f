"""collectors.intervals.interval_union against a point-by-point union."""

from __future__ import annotations

import numpy as np

from retime.collectors.intervals import interval_union


def test_interval_union_matches_the_covered_points():
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(0, 12))
        s = rng.integers(0, 60, n)
        e = s + rng.integers(0, 15, n)
        us, ue = interval_union(s, e)
        covered = np.zeros(80, bool)
        for a, b in zip(s, e):
            covered[a:b] = True
        got = np.zeros(80, bool)
        for a, b in zip(us, ue):
            got[a:b] = True
        assert (got == covered).all()
        # sorted, disjoint and not touching (touching intervals merge), int64
        assert us.dtype == ue.dtype == np.int64
        assert np.all(us[1:] > ue[:-1]) and np.all(ue >= us)


def test_interval_union_merges_touching_and_nested():
    us, ue = interval_union([5, 0, 10, 2], [10, 3, 12, 4])
    assert us.tolist() == [0, 5] and ue.tolist() == [4, 12]
    us, ue = interval_union([], [])
    assert len(us) == len(ue) == 0
