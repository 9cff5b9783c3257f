"""collectors.arrays: unique / isin give numpy's results (values, dtypes, shapes) on random
integer, unsigned and boolean arrays, with every return_* combination numpy has."""

from __future__ import annotations

import numpy as np
import pytest

from retime.collectors.arrays import isin, unique

KWS = ({}, {"return_inverse": True}, {"return_counts": True},
       {"return_inverse": True, "return_counts": True}, {"return_index": True})


@pytest.mark.parametrize("dt", [np.int64, np.int32, np.int8, np.uint64, bool])
def test_unique_and_isin_equal_numpy(dt):
    rng = np.random.default_rng(11)
    for _ in range(200):
        n, m = int(rng.integers(0, 400)), int(rng.integers(0, 300))
        x = rng.integers(0, 60, n).astype(dt)
        y = rng.integers(0, 70, m).astype(dt)
        for kw in KWS:
            a, b = unique(x, **kw), np.unique(x, **kw)
            a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
            assert len(a) == len(b)
            for p, q in zip(a, b, strict=True):
                assert p.dtype == q.dtype and p.shape == q.shape and np.array_equal(p, q)
        assert np.array_equal(isin(x, y), np.isin(x, y))
        assert np.array_equal(isin(x, y.astype(np.int64)), np.isin(x, y.astype(np.int64)))


def test_other_inputs_go_to_numpy():
    f = np.array([1.0, np.nan, 1.0, np.nan, 0.5])
    assert np.array_equal(unique(f), np.unique(f), equal_nan=True)
    o = np.array(["b", "a", "b"], dtype=object)
    assert unique(o).tolist() == ["a", "b"]
    m = np.array([[1, 2], [1, 2], [0, 3]])
    assert np.array_equal(unique(m, axis=0), np.unique(m, axis=0))
    assert isin(np.array([1, 5]), [5]).tolist() == [False, True]


@pytest.mark.parametrize("lo,hi", [(-40, 40), (0, 1 << 40), (-(1 << 40), 1 << 40), (5, 6)])
def test_unique_dense_and_sorted_paths_equal_numpy(lo, hi):
    """Values in a small range (counted) and spread wide (sorted / factorized), negative too:
    both give numpy's results."""
    rng = np.random.default_rng(7)
    for _ in range(100):
        x = rng.integers(lo, hi, int(rng.integers(1, 500)), dtype=np.int64)
        for kw in KWS:
            a, b = unique(x, **kw), np.unique(x, **kw)
            a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
            for p, q in zip(a, b, strict=True):
                assert p.dtype == q.dtype and p.shape == q.shape and np.array_equal(p, q)
