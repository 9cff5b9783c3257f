"""The streaming Kineto reader's row kernels (collectors/kineto/_rows_kernels.py) against a
slow, obvious reference on random seeded rows (CONVENTIONS.md §3)."""

from __future__ import annotations

import numpy as np
import pytest

from retime.collectors.enums import OpKind
from retime.collectors.kineto import _rows_kernels as R
from retime.collectors.kineto import _scan_kernels as K
from retime.collectors.kineto.schema import (
    C_ANNOT,
    C_CPU,
    C_KERNEL,
    C_MEMCPY,
    C_MEMSET,
    C_RUNTIME,
    H_ANNOT,
    H_GLOO,
)

NEED = K.F_TS | K.F_DUR | K.F_NAME | K.F_CAT | K.F_PID | K.F_TID
CLASSES = [C_KERNEL, C_MEMCPY, C_MEMSET, C_RUNTIME, C_CPU, C_ANNOT, R.X_SYNC, R.X_GANNOT,
           R.X_TRACE, R.X_OTHER]


def ref_class(flags: int, ph: int) -> str:
    if flags & K.F_SLOW:
        return "slow"
    if ph == ord("X"):
        return "x" if flags & NEED == NEED else "slow"
    if ph in (ord("i"), ord("I")):
        return "i"
    if ph in (ord("s"), ord("f"), ord("t")):
        return "flow"
    return "slow"


def ref_new_ids(rows, k, sid, csid):
    new_n, new_c = [], []
    for j in range(k):
        c = ref_class(int(rows[K.EV_FLAGS, j]), int(rows[K.EV_PH, j]))
        if c == "x" or (c == "i" and rows[K.EV_FLAGS, j] & K.F_NAME):
            t = int(rows[K.EV_NAME, j])
            if sid[t] < 0 and t not in new_n:
                new_n.append(t)
        if c == "x":
            t = int(rows[K.EV_CAT, j])
            if csid[t] < 0 and t not in new_c:
                new_c.append(t)
    return new_n, new_c


def ref_split(rows, k, first, sid, ccode, nflag):
    """One event at a time, as the general path (collectors/kineto/links.py) sorts them."""
    none = int(K.NONE)
    g, h, gr, mem, keep, syncs, slow = [], [], [], [], [], [], []
    drop = [0] * len(ccode)
    cnt = {"flows": 0, "syncs": 0, "ranges": 0, "trace": 0, "memory": 0, "markers": 0,
           "last": -1}

    def v(f, j):
        return int(rows[f, j])

    def alt(f, g_, j):
        return v(f, j) if v(f, j) != none else v(g_, j)

    for j in range(k):
        c = ref_class(v(K.EV_FLAGS, j), v(K.EV_PH, j))
        i = first + j
        if c == "slow":
            slow.append(j)
        elif c == "flow":
            cnt["flows"] += 1
        elif c == "i":
            fl = v(K.EV_FLAGS, j)
            name = int(sid[v(K.EV_NAME, j)]) if fl & K.F_NAME else -1
            if fl & K.F_ARGS and fl & K.F_TS and name >= 0 and nflag[name] & R.N_MEMORY:
                dt, di = v(K.EV_DEVTYPE, j), v(K.EV_DEVID, j)
                mb, ta, tr = v(K.EV_MEMBYTES, j), v(K.EV_TALLOC, j), v(K.EV_TRES, j)
                mem.append([di if dt not in (none, 0) and di != none else -1, v(K.EV_TS, j),
                            0 if mb == none else mb, -1 if ta == none else ta,
                            -1 if tr == none else tr, i])
                cnt["memory"] += 1
            else:
                cnt["markers"] += 1
        else:
            name = int(sid[v(K.EV_NAME, j)])
            code = int(ccode[v(K.EV_CAT, j)])
            ts, dur = v(K.EV_TS, j), v(K.EV_DUR, j)
            if code in (C_KERNEL, C_MEMCPY, C_MEMSET):
                kind = code
                if code == C_KERNEL and nflag[name] & R.N_COMM_KERNEL:
                    kind = int(OpKind.COLLECTIVE)
                    keep.append(j)
                b = v(K.EV_BYTES, j)
                g.append([alt(K.EV_DEV, K.EV_PID, j), alt(K.EV_STREAM, K.EV_TID, j), kind, name,
                          ts, dur, v(K.EV_CORR, j), v(K.EV_EXT, j), 0 if b == none else b, i])
            elif code in (C_RUNTIME, C_CPU, C_ANNOT):
                hc = code - C_RUNTIME
                if hc == H_ANNOT and nflag[name] & R.N_GLOO:
                    hc = H_GLOO
                if hc == H_GLOO or nflag[name] & R.N_COMM_RANGE:
                    keep.append(j)
                h.append([v(K.EV_PID, j), v(K.EV_TID, j), hc, name, ts, ts + dur,
                          v(K.EV_CORR, j), v(K.EV_EXT, j), i])
            elif code == R.X_SYNC:
                syncs.append(i)
                keep.append(j)
                cnt["syncs"] += 1
            elif code == R.X_GANNOT:
                gr.append([alt(K.EV_DEV, K.EV_PID, j), alt(K.EV_STREAM, K.EV_TID, j), name, ts,
                           ts + dur, i])
                cnt["ranges"] += 1
            elif code == R.X_TRACE:
                cnt["trace"] += 1
                cnt["last"] = j
            else:
                drop[v(K.EV_CAT, j)] += 1
    return g, h, gr, mem, keep, syncs, slow, drop, cnt


def random_rows(rng, k, cap, n_names, n_cats):
    rows = rng.integers(0, 1 << 40, size=(K.EV_FIELDS, cap), dtype=np.int64)
    flags = rng.integers(0, 256, size=cap)
    flags[rng.random(cap) < 0.6] |= NEED  # most X rows complete
    flags[rng.random(cap) < 0.8] &= ~K.F_SLOW
    rows[K.EV_FLAGS] = flags
    rows[K.EV_PH] = rng.choice([ord(x) for x in "XXXXiIsftMB"], size=cap)
    rows[K.EV_NAME] = rng.integers(0, n_names, size=cap)
    rows[K.EV_CAT] = rng.integers(0, n_cats, size=cap)
    for f in range(K.EV_DEV, K.EV_FIELDS):  # optional fields: often absent
        rows[f, rng.random(cap) < 0.4] = K.NONE
    rows[K.EV_DEVTYPE, rng.random(cap) < 0.3] = 0
    return rows


@pytest.mark.parametrize("seed", range(40))
def test_kernels_match_reference(seed):
    rng = np.random.default_rng(seed)
    n_names, n_cats = int(rng.integers(1, 40)), int(rng.integers(1, 12))
    cap = int(rng.integers(1, 400))
    k = int(rng.integers(0, cap + 1))
    rows = random_rows(rng, k, cap, n_names, n_cats)
    sid = np.where(rng.random(n_names) < 0.5, rng.permutation(n_names), -1).astype(np.int64)
    csid = np.where(rng.random(n_cats) < 0.5, np.arange(n_cats), -1).astype(np.int64)

    new_n, new_c = R.new_ids(rows, k, sid, csid)
    ref_n, ref_c = ref_new_ids(rows, k, sid, csid)
    assert new_n.tolist() == ref_n and new_c.tolist() == ref_c

    sid = np.where(sid >= 0, sid, n_names + np.arange(n_names))  # now every name is mapped
    ccode = rng.choice(CLASSES, size=n_cats).astype(np.int64)
    nflag = rng.integers(0, 16, size=2 * n_names).astype(np.uint8)
    first = int(rng.integers(0, 10**6))
    g, h, gr, mem, keep, syncs, slow, drop, cnt = R.split_rows(rows, k, first, sid, ccode, nflag)
    rg, rh, rgr, rmem, rkeep, rsyncs, rslow, rdrop, rcnt = ref_split(rows, k, first, sid, ccode,
                                                                     nflag)
    assert g.T.tolist() == rg and g.shape[0] == 10
    assert h.T.tolist() == rh and h.shape[0] == 9
    assert gr.T.tolist() == rgr and gr.shape[0] == 6
    assert mem.tolist() == rmem and mem.shape[1] == 6
    assert keep.tolist() == rkeep and syncs.tolist() == rsyncs and slow.tolist() == rslow
    assert drop.tolist() == rdrop
    assert cnt.tolist() == [rcnt[x] for x in ("flows", "syncs", "ranges", "trace", "memory",
                                              "markers", "last")]
    # every row is in exactly one place
    n_x = len(rg) + len(rh) + len(rgr) + rcnt["syncs"] + rcnt["trace"] + sum(rdrop)
    assert n_x + len(rmem) + rcnt["markers"] + rcnt["flows"] + len(rslow) == k


def test_rows_must_be_the_scanner_buffer():
    rows = np.zeros((K.EV_FIELDS, 8), np.int64)
    z = np.zeros(1, np.int64)
    with pytest.raises(ValueError, match="C-contiguous"):
        R.split_rows(rows[:, :4], 4, 0, z, z, np.zeros(1, np.uint8))
    with pytest.raises(ValueError, match="cap >= k=9"):
        R.new_ids(rows, 9, z, z)


def test_gather_spans_joins_event_text():
    buf = np.frombuffer(b'xx{"a": 1}yy{"b": [2]} {}', np.uint8)
    out = R.gather_spans(buf, np.array([2, 12, 23]), np.array([10, 22, 25]))
    assert out.tobytes() == b'[{"a": 1},{"b": [2]},{}]'
    assert R.gather_spans(buf, np.zeros(0, np.int64), np.zeros(0, np.int64)).tobytes() == b"[]"
    with pytest.raises(ValueError, match="spans must lie in buf"):
        R.gather_spans(buf, np.array([20]), np.array([40]))


def test_first_index_equals_unique():
    from retime.collectors.kineto.deps import _first_index

    rng = np.random.default_rng(1)
    for _ in range(200):
        v = rng.integers(0, int(rng.integers(1, 60)), size=int(rng.integers(0, 300)))
        u, f = _first_index(v)
        ru, rf = np.unique(v, return_index=True)
        assert u.tolist() == ru.tolist() and f.tolist() == rf.tolist()


def test_streaming_parse_leaves_no_reference_cycles():
    """The reader is freed as soon as the parse returns (no cycle waits for the garbage
    collector): an ingest worker's memory stays flat rank after rank."""
    import gc
    from pathlib import Path

    from retime.collectors.kineto.reader import parse_kineto_file
    from retime.collectors.kineto.scan import parse_fast

    path = Path(__file__).resolve().parents[1] / "traces" / "dlrm-v100-8rank"
    f = sorted(path.glob("*.json*"))[0]
    assert parse_fast(f) is not None  # the streaming reader reads it
    parse_kineto_file(f)
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        part = parse_fast(f)
        del part
        assert gc.collect() == 0
    finally:
        if was:
            gc.enable()
