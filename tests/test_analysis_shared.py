"""Analysis invariants on every shared trace that ingests (Kineto files and folders, the nsys
export, the op-level folder): breakdown parts add up to the step time exactly and match a
plain-Python interval union; kernel and communication stats are consistent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import KINETO, SHARED, ingest_cached, kineto_trace_files
from naive_steps import naive_rank_totals, naive_windows

from retime.analysis import (
    PARTS,
    breakdown,
    busbw_factor,
    class_stats,
    collectives,
    critical_path,
    kernel_stats,
    summarize_breakdown,
)
from retime.collectors.enums import CommOp, LaneKind, OpKind
from retime.collectors.errors import RetimeError


def _inputs() -> list[Path]:
    # every Kineto file on its own (folders such as a100-event-sync hold unrelated runs),
    # except the 8 DLRM ranks: worker0 alone plus the folder with all 8 ranks together
    out = [f for f in kineto_trace_files()
           if f.parent.name != "dlrm-v100-8rank" or f.name.startswith("worker0")]
    out.append(KINETO / "dlrm-v100-8rank")
    out.append(SHARED / "nsys" / "h100-2gpu-fastvideo.sqlite")
    out.append(SHARED / "oplevel" / "megatron-ST-8rank")
    return out


def _load(path: Path):
    try:
        return ingest_cached(path)
    except (RetimeError, ImportError) as exc:  # a reader not landed, or a file it refuses
        pytest.skip(f"{path.name} does not ingest: {exc}")


def _ids(p: Path) -> str:
    return f"{p.parent.name}/{p.name}"


def naive_union(iv: list[tuple[int, int]]) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(iv):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


@pytest.mark.parametrize("path", _inputs(), ids=_ids)
def test_breakdown_parts_sum_to_step_time(path):
    t = _load(path)
    for by in ("step", "rank"):
        bd = breakdown(t, by=by)
        assert len(bd) > 0
        parts = bd[list(PARTS)].to_numpy()
        assert (parts >= 0).all(), f"negative part in {by} breakdown"
        assert (parts.sum(axis=1) == bd["step_ns"].to_numpy()).all()
        assert ((bd["gpu_busy_frac"] >= 0) & (bd["gpu_busy_frac"] <= 1)).all()
    # the windows are the step definition's (tests/naive_steps.py); the per-rank window is
    # the rank's windows end to end
    ref = naive_windows(t)
    bd = breakdown(t, by="step")
    got = {(int(r), int(k)): (int(a), int(b)) for r, k, a, b in
           zip(bd["rank"], bd["step"], bd["start_ns"], bd["end_ns"])}
    assert got == ref
    tot = naive_rank_totals(t)
    bd = breakdown(t, by="rank").set_index("rank")
    assert bd["step_ns"].to_dict() == tot
    s = summarize_breakdown(breakdown(t))
    fr = s[[p.replace("_ns", "_frac") for p in PARTS]].sum(axis=1)
    assert np.allclose(fr[s["step_ns"] > 0], 1.0)


@pytest.mark.parametrize("path", _inputs(), ids=_ids)
def test_breakdown_matches_plain_python_unions(path):
    t = _load(path)
    o = t.ops
    lk = dict(zip(t.lanes["lane"].tolist(), t.lanes["lane_kind"].tolist()))
    lane_rank = dict(zip(t.lanes["lane"].tolist(), t.lanes["rank"].tolist()))
    bd = breakdown(t, by="rank").set_index("rank")
    win = naive_windows(t)
    start = o["start_ns"].to_numpy()
    end = start + o["dur_ns"].to_numpy()
    # a matched send/recv (same coll_id) moves data once both sides have started: before
    # that it waits on its peer (pipeline bubble), which is no communication
    later: dict[int, int] = {}
    for k, c, s0 in zip(o["kind"].tolist(), o["coll_id"].tolist(), start.tolist()):
        if k == int(OpKind.P2P) and c >= 0:
            later[c] = max(later.get(c, s0), s0)
    start = np.array([min(max(s0, later[c]), e0) if k == int(OpKind.P2P) and c >= 0 else s0
                      for k, c, s0, e0 in zip(o["kind"].tolist(), o["coll_id"].tolist(),
                                              start.tolist(), end.tolist())], np.int64)
    for rank in bd.index[:4]:
        m = o["rank"].to_numpy() == rank
        lanes_k = np.array([lk[ln] for ln in o["lane"].to_numpy()[m]])
        kind = o["kind"].to_numpy()[m]
        w0 = min(a for (r, _), (a, b) in win.items() if r == rank)
        w1 = max(b for (r, _), (a, b) in win.items() if r == rank)
        iv = [(max(a, w0), min(b, w1)) for a, b in zip(start[m].tolist(), end[m].tolist())]
        iv = [(a, b) if b > a else (w0, w0) for a, b in iv]  # outside: an empty interval
        dev = lanes_k != int(LaneKind.CPU_THREAD)
        cpu_only = not dev.any()
        if cpu_only:
            dev = np.ones(len(kind), bool)
        comp_k = {int(OpKind.KERNEL), int(OpKind.COMPUTE)}
        if cpu_only:
            comp_k |= {int(OpKind.CPU_OP), int(OpKind.RUNTIME)}
        C = [iv[i] for i in range(len(iv)) if dev[i] and kind[i] in comp_k]
        M = [iv[i] for i in range(len(iv)) if dev[i] and kind[i] in (3, 4)]
        Y = [iv[i] for i in range(len(iv)) if dev[i] and kind[i] in (1, 2)]
        H = [iv[i] for i in range(len(iv)) if not dev[i] and kind[i] in (5, 6)]
        # enclosing host ranges count as host time (step markers do not), CPU-only too
        rg = t.ranges
        for ln, nid, s, e in zip(rg["lane"].tolist(), rg["name_id"].tolist(),
                                 rg["start_ns"].tolist(), rg["end_ns"].tolist()):
            if (lk[ln] == int(LaneKind.CPU_THREAD) and lane_rank[ln] == rank
                    and not t.strings[nid].startswith("ProfilerStep#")):
                s, e = max(s, w0), min(e, w1)
                if e > s:
                    H.append((s, e))
        u_c, u_m, u_cm = naive_union(C), naive_union(M), naive_union(C + M)
        row = bd.loc[rank]
        assert row["compute_ns"] == u_cm - u_m
        assert row["overlapped_comm_ns"] == u_c + u_m - u_cm
        assert row["exposed_comm_ns"] == u_cm - u_c
        assert row["memcpy_ns"] == naive_union(C + M + Y) - u_cm
        assert row["host_bound_ns"] == naive_union(C + M + Y + H) - naive_union(C + M + Y)


@pytest.mark.parametrize("path", _inputs(), ids=_ids)
def test_kernel_and_comm_stats_consistent(path):
    t = _load(path)
    ks = kernel_stats(t)
    dev_kinds = [int(k) for k in (OpKind.KERNEL, OpKind.COMPUTE, OpKind.COLLECTIVE, OpKind.P2P,
                                  OpKind.MEMCPY, OpKind.MEMSET)]
    if len(ks):
        assert ks["share"].sum() == pytest.approx(1.0)
        assert (ks["min_ns"] <= ks["mean_ns"]).all() and (ks["mean_ns"] <= ks["max_ns"]).all()
        cls = class_stats(t)
        assert cls["total_ns"].sum() == ks["total_ns"].sum()
        assert ks["count"].sum() <= int(np.isin(t.ops["kind"], dev_kinds).sum())
    co = collectives(t)
    n_comm = int(np.isin(t.ops["kind"], [int(OpKind.COLLECTIVE), int(OpKind.P2P)]).sum())
    assert co["members"].sum() == n_comm
    if len(co):
        mt = co["matched"].to_numpy(bool)  # wait and skew only where every member is seen
        assert (co["skew_ns"][mt] >= 0).all() and (co["wait_ns"][mt] >= 0).all()
        assert co["skew_ns"][~mt].isna().all() and co["wait_ns"][~mt].isna().all()
        assert (co["members"][mt] == co["n_ranks"][mt]).all()
        assert (co["transfer_ns"] >= 0).all()
        ok = co["busbw_gbps"].notna()
        ops = np.array([CommOp[c].value for c in co.loc[ok, "comm_op"]])
        f = busbw_factor(ops, co.loc[ok, "n_ranks"].to_numpy())
        assert np.allclose(co.loc[ok, "busbw_gbps"], co.loc[ok, "algbw_gbps"] * f)
    cp = critical_path(t)
    assert int(cp["dur_ns"].sum() + cp["wait_ns"].sum()) == cp.attrs["length_ns"]
