"""The vectorized collective matcher and stream-wait SYNC edges against straightforward
references (the previous pandas / per-call loop implementations), on random inputs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from retime.collectors.collectives import _SIZE_KEYED, match_collectives
from retime.collectors.enums import Phase
from retime.collectors.intervals import interval_union
from retime.collectors.kineto.deps import (
    _BWD,
    _FWD,
    _OPT,
    _STEP_RE,
    _inside,
    _stream_wait_edges,
    attribute,
)


def _match_reference(rank, group, group_size, comm_op, nbytes, seq, order, ranks_present=None):
    n = len(rank)
    df = pd.DataFrame({"rank": rank, "group": group, "op": comm_op.astype(np.int64),
                       "size": np.where(np.isin(comm_op, list(_SIZE_KEYED)), nbytes, 0),
                       "seq": seq, "order": order, "i": np.arange(n)})
    use_seq = df.groupby("group")["seq"].transform(lambda s: bool((s >= 0).all()))
    df = df.sort_values(["rank", "order", "i"], kind="stable")
    df["k"] = df.groupby(["rank", "group", "op", "size"], sort=False).cumcount()
    df["key_op"] = np.where(use_seq.loc[df.index], -1, df["op"])
    df["key_size"] = np.where(use_seq.loc[df.index], -1, df["size"])
    df["key_k"] = np.where(use_seq.loc[df.index], df["seq"], df["k"])
    keys = df[["group", "key_op", "key_size", "key_k"]]
    cid = keys.groupby(list(keys.columns), sort=False).ngroup().to_numpy()
    out = np.empty(n, np.int64)
    out[df["i"].to_numpy()] = cid
    inst = pd.DataFrame({"cid": out, "rank": rank, "group": group, "gsize": group_size,
                         "op": comm_op})
    agg = inst.groupby("cid").agg(members=("rank", "size"), uranks=("rank", "nunique"),
                                  gsize=("gsize", "max"), group=("group", "first"),
                                  nops=("op", "nunique"))
    reasons: dict[str, int] = {}
    ok = np.ones(len(agg), bool)
    for j, row in enumerate(agg.itertuples()):
        why = None
        if row.uranks != row.members:
            why = "several ops of one rank in one instance (issue order differs across ranks)"
        elif row.nops > 1:
            why = "members disagree on the collective type"
        elif row.gsize > 0 and row.members != row.gsize:
            present = len(ranks_present.get(int(row.group), ())) if ranks_present else None
            if present is not None and present < row.gsize:
                why = f"ranks missing from trace ({present} of {row.gsize} group ranks ingested)"
            else:
                why = "member count differs from group size (a rank skipped or added a call)"
        if why:
            ok[j] = False
            reasons[why] = reasons.get(why, 0) + 1
    in_matched = np.isin(out, agg.index.to_numpy()[ok])
    return out, {"matched": int(ok.sum()), "unmatched": int((~ok).sum()),
                 "unmatched_reasons": reasons, "ops_matched": int(in_matched.sum()),
                 "ops_unmatched": int((~in_matched).sum())}


@pytest.mark.parametrize("seed", range(40))
def test_match_collectives_equals_reference_when_ranks_issue_the_same_calls(seed):
    """Every rank issues the same calls in the same order (a whole trace): the k-th call with
    the k-th, as the per-(op, size) issue counters of the reference pair them."""
    rng = np.random.default_rng(seed)
    n_ranks = int(rng.integers(1, 5))
    per = int(rng.integers(1, 60))
    g1 = rng.integers(0, 3, per).astype(np.int64)
    op1 = rng.integers(0, 12, per).astype(np.int8)
    b1 = rng.choice([0, 1024, 4096], per).astype(np.int64)
    s1 = np.where(g1 == 1, np.arange(per), -1).astype(np.int64)  # group 1 records Seq
    rank = np.repeat(np.arange(n_ranks), per).astype(np.int64)
    group, comm_op, nbytes, seq = (np.tile(x, n_ranks) for x in (g1, op1, b1, s1))
    order = np.concatenate([np.sort(rng.choice(10 * per, per, replace=False))
                            for _ in range(n_ranks)]).astype(np.int64)
    gsize = np.where(rng.random(len(rank)) < 0.9, n_ranks, rng.integers(-1, 6, len(rank)))
    present = ({g: set(range(int(rng.integers(0, n_ranks + 1)))) for g in range(3)}
               if seed % 3 else None)
    perm = rng.permutation(len(rank))  # the input order does not matter
    args = [x[perm] for x in (rank, group, gsize.astype(np.int64), comm_op, nbytes, seq,
                              order)]
    got = match_collectives(*args, present)
    want = _match_reference(*args, present)
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1] == want[1]
    assert list(got[1]["unmatched_reasons"]) == list(want[1]["unmatched_reasons"])


def _lcs(a: list, b: list) -> int:
    """Length of the longest common subsequence (plain DP)."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


@pytest.mark.parametrize("seed", range(60))
def test_match_collectives_keeps_every_ranks_issue_order(seed):
    """Ranks that issued different calls (partial traces, dropped calls, random orders):
    members of an instance are one call per rank with one (op, size); one order of the
    instances agrees with every rank's issue order; two ranks of one group match as many
    calls as their longest common subsequence when nothing crosses groups."""
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(1, 200))
    n_ranks = int(rng.integers(1, 4))
    one_group = seed % 2 == 0
    rank = rng.integers(0, n_ranks, n).astype(np.int64)
    group = np.zeros(n, np.int64) if one_group else rng.integers(0, 3, n).astype(np.int64)
    comm_op = rng.choice([1, 2, 4], n).astype(np.int8)
    nbytes = rng.choice([1024, 4096], n).astype(np.int64)
    seq = np.full(n, -1, np.int64)
    order = rng.integers(0, 400, n).astype(np.int64)
    cid, st = match_collectives(rank, group, np.full(n, n_ranks), comm_op, nbytes, seq, order)
    size = np.where(np.isin(comm_op, list(_SIZE_KEYED)), nbytes, 0)
    for c in np.unique(cid):
        m = cid == c
        assert len(set(rank[m].tolist())) == int(m.sum())  # one call per rank
        assert len({(int(g), int(o), int(z)) for g, o, z in zip(group[m], comm_op[m], size[m])}) == 1
    # one instance order for all ranks: the graph of consecutive calls is acyclic
    succ: dict[int, set[int]] = {}
    for r in range(n_ranks):
        idx = np.flatnonzero(rank == r)
        idx = idx[np.lexsort((idx, order[idx]))]
        for a, b in zip(cid[idx][:-1].tolist(), cid[idx][1:].tolist()):
            if a != b:
                succ.setdefault(a, set()).add(b)
    indeg: dict[int, int] = {c: 0 for c in np.unique(cid).tolist()}
    for vs in succ.values():
        for v in vs:
            indeg[v] += 1
    todo = [c for c, d in indeg.items() if d == 0]
    seen = 0
    while todo:
        c = todo.pop()
        seen += 1
        for v in succ.get(c, ()):
            indeg[v] -= 1
            if indeg[v] == 0:
                todo.append(v)
    assert seen == len(indeg)
    assert st["matched"] + st["unmatched"] == len(indeg)
    assert st["ops_matched"] + st["ops_unmatched"] == n
    if one_group and n_ranks == 2:
        seqs = []
        for r in range(2):
            idx = np.flatnonzero(rank == r)
            idx = idx[np.lexsort((idx, order[idx]))]
            seqs.append([(int(comm_op[i]), int(size[i])) for i in idx])
        pairs = sum(1 for c in np.unique(cid) if int((cid == c).sum()) == 2)
        assert pairs == _lcs(*seqs)


def _wait_reference(wr, corr, lane, start, end, n_h, rt_gpu, by_lane, lane_dev):
    src, dst = [], []
    for r in wr.tolist():
        c = int(corr[r])
        d = -1
        j = r + 1
        while j < n_h and lane[j] == lane[r] and j <= r + 64:
            if rt_gpu[j] >= 0:
                d = int(rt_gpu[j])
                break
            j += 1
        if d < 0:
            continue
        dev = lane_dev.get(int(lane[d]))
        best, best_c = -1, -1
        for ln, (ids, cs) in by_lane.items():
            if ln == lane[d] or lane_dev.get(ln) != dev:
                continue
            p = np.searchsorted(cs, c) - 1
            if p >= 0 and cs[p] > best_c:
                best, best_c = int(ids[p]), int(cs[p])
        if best >= 0 and end[best] <= start[d] + 1000:
            src.append(best)
            dst.append(d)
    return src, dst


@pytest.mark.parametrize("seed", range(40))
def test_stream_wait_edges_equal_reference(seed):
    rng = np.random.default_rng(seed)
    n_h = int(rng.integers(1, 400))
    n_g = int(rng.integers(1, 300))
    n_gl = int(rng.integers(1, 5))
    n = n_h + n_g
    lane = np.concatenate([np.sort(rng.integers(n_gl, n_gl + 3, n_h)),
                           rng.integers(0, n_gl, n_g)]).astype(np.int32)
    corr = rng.integers(-1, 200, n).astype(np.int64)  # duplicates and missing (-1) included
    start = rng.integers(0, 10_000, n).astype(np.int64)
    end = start + rng.integers(0, 3000, n)
    rt_gpu = np.full(n_h, -1, np.int64)
    launched = rng.choice(n_h, min(n_h, n_g, int(rng.integers(0, n_h + 1))), replace=False)
    rt_gpu[launched] = n_h + rng.choice(n_g, len(launched), replace=False)
    gpu = np.arange(n_h, n)
    by_lane = {}
    for ln in np.unique(lane[gpu]):
        ids = gpu[lane[gpu] == ln]
        o = np.argsort(corr[ids], kind="stable")
        by_lane[int(ln)] = (ids[o], corr[ids][o])
    lane_dev = {ln: int(rng.integers(0, 2)) for ln in by_lane}
    wr = np.sort(rng.choice(n_h, int(rng.integers(0, n_h + 1)), replace=False)).astype(np.int64)
    s, d = _stream_wait_edges(wr, corr, lane, start, end, n_h, rt_gpu, by_lane, lane_dev)
    rs, rd = _wait_reference(wr, corr, lane, start, end, n_h, rt_gpu, by_lane, lane_dev)
    assert s.tolist() == rs and d.tolist() == rd


def _attribute_reference(names_arr, r_name, r_start, r_end, start, launch_of, n_h):

    n = len(start)
    t = start.copy()
    has_launch = launch_of >= 0
    t[has_launch] = start[launch_of[has_launch]]  # GPU ops: attribute by their launch time
    step = np.full(n, -1, np.int32)
    step_no = np.full(len(names_arr), -1, np.int64)
    cls = np.zeros((3, len(names_arr)), bool)
    for i, s in enumerate(names_arr):
        m = _STEP_RE.match(s)
        if m:
            step_no[i] = int(m.group(1))
        bwd = bool(_BWD.search(s))
        cls[0, i] = bool(_FWD.search(s)) and not bwd
        cls[1, i] = bwd
        cls[2, i] = bool(_OPT.search(s))
    if len(r_name):
        rs = step_no[r_name]
        sel = rs >= 0
        if sel.any():
            o = np.argsort(r_start[sel], kind="stable")
            ss, se, sn = r_start[sel][o], r_end[sel][o], rs[sel][o]
            p = np.searchsorted(ss, t, side="right") - 1
            ok = p >= 0
            ok[ok] = t[ok] < se[p[ok]]
            step[ok] = sn[p[ok]]
    phase = np.full(n, int(Phase.UNKNOWN), np.int8)
    phase[step >= 0] = int(Phase.OTHER)
    for k, ph in enumerate((Phase.FWD, Phase.BWD, Phase.OPT)):
        sel = cls[k][r_name] if len(r_name) else np.zeros(0, bool)
        us, ue = interval_union(r_start[sel], r_end[sel])
        phase[_inside(t, us, ue)] = int(ph)
    return step, phase



def test_attribute_prefilter_equals_regexes():
    """Names for the ASCII lower-case prefilter: mixed case, patterns mid-name, non-ASCII
    letters that re.I folds onto ASCII ones (long s, Kelvin sign)."""
    names = ["ProfilerStep#3", "profilerstep#4", "ProfilerStep#5x", "aten::mm", "Forward",
             "DDP.FORWARD", "nn.Module: Linear_0 backward", "autograd::engine::evaluate_function: X",
             "x autograd::engine::evaluate_function", "Optimizer.step#SGD.step", "a Optimizer.x",
             "## optimizer ##", "OPTIMIZER.STEP", "Zero_Grad", "backward\u017f", "bac\u212award", "Bac\u212aWard",
             "Optimizer.\u017ftep", "for\u017fward", "f\u00f6rward", "", "forwar", "ProfilerStep#"]
    n_nm = len(names)
    names_arr = np.asarray(names, dtype=object)
    r_name = np.concatenate([[0, 1], np.arange(n_nm)]).astype(np.int32)
    r_start = np.concatenate([[0, 10_000], np.arange(n_nm) * 100]).astype(np.int64)
    r_end = np.concatenate([[10_000, 20_000], np.arange(n_nm) * 100 + 50]).astype(np.int64)
    start = np.arange(0, n_nm * 100, 25).astype(np.int64)
    launch_of = np.full(len(start), -1, np.int64)
    got = attribute(names_arr, r_name, r_start, r_end, start, launch_of, len(start))
    want = _attribute_reference(names_arr, r_name, r_start, r_end, start, launch_of, len(start))
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert set(np.unique(want[1]).tolist()) >= {int(Phase.FWD), int(Phase.BWD), int(Phase.OPT)}


@pytest.mark.parametrize("seed", range(20))
def test_latest_done_matches_the_per_call_scan(seed):
    """The offline Fenwick answer equals the former per-call scan: among GPU ops launched
    before the call (0 <= corr < c) that ended by its end (+1 us), the one that ends last,
    the first such op on a tie; -1 if none."""
    from retime.collectors._kernels import latest_done

    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(0, 60)), int(rng.integers(0, 30))
    corr = rng.integers(-2, 40, n)
    end = rng.integers(0, 30, n) * 1000  # many ties
    qc = rng.integers(-1, 45, m)
    qc[: m // 4] = np.iinfo(np.int64).max  # blocking calls without a correlation
    qt = rng.integers(-5, 35, m) * 1000
    got = latest_done(corr, end, qc, qt)
    ids = np.arange(n)
    for q in range(m):
        cand = ids[(corr >= 0) & (corr < qc[q]) & (end <= qt[q])]
        assert got[q] == (int(cand[np.argmax(end[cand])]) if len(cand) else -1)
