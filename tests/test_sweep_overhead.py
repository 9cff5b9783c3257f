"""The sweep's per-scenario kernels outside the replay (replay/_kernels.py: row metrics,
per-class scaling) against plain Python, including the inputs their fast paths skip
(blocks far from sorted, ties, empty ranks)."""

from __future__ import annotations

import numpy as np
import pytest

from retime.replay._kernels import _metric_spans, _scale_by_class


def _union(iv):
    tot, cs, ce = 0, None, None
    for a, b in sorted(iv):
        if ce is None or a > ce:
            tot += 0 if ce is None else ce - cs
            cs, ce = a, b
        else:
            ce = max(ce, b)
    return tot + (0 if ce is None else ce - cs)


def _spans(s, e, dev, dev_ptr, comp, other, ridx):
    n_r = len(dev_ptr) - 1
    lo = np.full(n_r, np.iinfo(np.int64).max, np.int64)
    hi = np.full(n_r, np.iinfo(np.int64).min, np.int64)
    both, x, has_x = np.zeros(n_r, np.int64), np.zeros(n_r, np.int64), np.zeros(n_r, bool)
    mb = int(np.diff(dev_ptr).max())
    _metric_spans(s, e, dev, dev_ptr, comp, other, ridx, lo, hi, both, x, has_x,
                  np.empty(mb, np.int64), np.empty(mb, np.int64), np.empty(mb, np.bool_))
    return lo, hi, both, x, has_x


@pytest.mark.parametrize("disorder", ["sorted", "nearly", "shuffled", "reversed", "ties"])
def test_metric_spans_match_plain_python(disorder):
    rng = np.random.default_rng(7)
    n_r, per = 5, 3000  # rank 3 has no device op: its span comes from its other ops only
    rank = np.repeat(np.arange(n_r), per)
    n = len(rank)
    s = np.sort(rng.integers(0, 10**9, n)).astype(np.int64)
    if disorder == "ties":
        s = (s // 10**7) * 10**7
    e = s + rng.integers(0, 10**6, n)
    is_dev = (rank != 3) & (rng.random(n) < 0.9)
    comp = rng.random(n) < 0.6
    ridx = rank.astype(np.int64)
    dev = np.flatnonzero(is_dev)
    dev = dev[np.lexsort((np.arange(len(dev)), ridx[dev]))]  # by rank, then op id
    blocks = [dev[ridx[dev] == r] for r in range(n_r)]
    for r, b in enumerate(blocks):  # the block's order: what a scenario leaves of it
        if disorder == "nearly":
            sw = rng.integers(0, len(b) - 1, 30) if len(b) > 1 else []
            for i in sw:
                b[i], b[i + 1] = b[i + 1], b[i]
        elif disorder == "shuffled":
            rng.shuffle(b)
        elif disorder == "reversed":
            blocks[r] = b[::-1].copy()
    dev = np.concatenate(blocks).astype(np.int64)
    dev_ptr = np.searchsorted(ridx[dev], np.arange(n_r + 1)).astype(np.int64)
    other = np.flatnonzero(~is_dev).astype(np.int64)
    lo, hi, both, x, has_x = _spans(s, e, dev, dev_ptr, np.ascontiguousarray(comp[dev]), other,
                                    ridx)
    for r in range(n_r):
        mine = rank == r
        assert lo[r] == s[mine].min() and hi[r] == e[mine].max()
        d = mine & is_dev
        assert both[r] == _union(list(zip(s[d].tolist(), e[d].tolist(), strict=True)))
        dc = d & comp
        assert x[r] == _union(list(zip(s[dc].tolist(), e[dc].tolist(), strict=True)))
        assert has_x[r] == bool(dc.any())
    assert not has_x[3] and both[3] == 0


def test_scale_by_class_equals_numpy():
    rng = np.random.default_rng(3)
    d = rng.random(10_001) * 1e6
    cls = rng.integers(0, 6, len(d)).astype(np.int8)
    f = 1.0 / np.asarray([1.3, 2.0, 0.7, 1.0, 3.0, 1.0])
    ref = d * f[cls]
    _scale_by_class(d, cls, f)
    np.testing.assert_array_equal(d, ref)  # bit for bit: the same products


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16, np.uint64])
def test_dense_inverse_equals_np_unique(dtype):
    from retime.replay.graph import _dense_inverse

    rng = np.random.default_rng(5)
    for x in (np.zeros(0, dtype), rng.integers(0, 100, 2000).astype(dtype),
              np.repeat(np.arange(7, dtype=dtype), 3)[::-1].copy()):
        k, inv = _dense_inverse(x)
        u, ref = np.unique(x, return_inverse=True)
        assert k == len(u) and inv.dtype == np.int64
        np.testing.assert_array_equal(inv, ref)
    wide = np.asarray([-5, 3, -5, 10**12], np.int64)  # a sparse range: np.unique itself
    assert _dense_inverse(wide)[0] == 3
    np.testing.assert_array_equal(_dense_inverse(wide)[1], [0, 1, 0, 2])


def test_lexsort_small_equals_np_lexsort():
    from retime.replay.graph import _lexsort_small

    rng = np.random.default_rng(9)
    for n, n_major, sort_minor in ((0, 1, False), (5000, 40, False), (5000, 40, True),
                                   (3000, 3, False), (3000, 1, True)):
        major = rng.integers(3, 3 + n_major, n).astype(np.int32)
        minor = rng.integers(0, 50, n).astype(np.int64)  # many ties: order by index
        if sort_minor:  # sorted, then a few out of place: the insertion sort's case
            minor = np.sort(minor)
            minor[rng.integers(0, n, 20)] = rng.integers(0, 50, 20)
        got = _lexsort_small((minor, major))
        np.testing.assert_array_equal(got, np.lexsort((minor, major)))
    far = np.asarray([10**12, 0, 10**12, 5])  # a sparse major key: np.lexsort itself
    np.testing.assert_array_equal(_lexsort_small((np.zeros(4), far)),
                                  np.lexsort((np.zeros(4), far)))
