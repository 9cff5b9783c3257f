"""The batch-independent part of a CPU job's GEMMs, from what the plain trace holds.

A host GEMM of a linear layer at a small per-rank batch does not take time in proportion to
its rows: it reads (and packs, i.e. copies) the layer's weight whatever the batch, and only
the rest of its work runs over the samples. On the MLP of ``traces/pairs/mlp-batch-32-16`` an
``aten::addmm`` of the 512 x 512 weight takes 268 us at batch 32 and 231 us at 16: about 195
us that do not depend on the batch plus 2.3 us per sample, where the 1 MB weight takes 145
us to copy at the rate the same trace's gradient copies run.

This module prices that part from the trace alone:

* **the host's copy rate**: the median over the trace's ``aten::copy_`` calls of at least
  :data:`COPY_MIN_BYTES` (same shape and type on both sides; in a DDP trace, the reducer's
  gradient copies) of bytes copied per second; a copy reads and writes each byte once;
* **the weight operand** of each ``aten::addmm`` / ``aten::mm`` (``Input Dims`` recorded with
  ``record_shapes``): a parameter's shape (the weight of the trace's ``aten::linear`` calls,
  either orientation) that is the GEMM's second operand (``x W^T``, ``dY W``) or, failing
  that, its result (``dY^T X``, a weight gradient);
* **the fixed part** of the GEMM: one copy of that operand at the copy rate (read and
  written once: the GEMM packs it), at most the time the profiler did not cover inside the
  GEMM's span (its compute: the gaps between the leaf ops inside it).

* **a parameter's zeroing**: a memset (``aten::fill_`` / ``aten::zero_``) whose tensor has
  a parameter's shape (a linear weight, or an embedding table: the first input of
  ``aten::embedding`` / ``aten::embedding_bag``) writes the same bytes at any batch. An
  embedding bag's dense backward zero-fills its rows x dim table gradient before it adds the
  batch's rows: on ``traces/pairs/emb-batch-64-16`` a 4000 x 64 fill takes a median of
  136 us at batch 64 and 132 us at 16 (48 fills per capture), while the scatter that follows
  scales. Such a fill keeps its time (``info["param_fills"]``).

The fixed part is spread over the host gaps inside the GEMM's span in proportion to their
overlap with it. :func:`host_split` also tells which host time is an operator's compute at
all: the part of a gap inside an operator's span (outside the DDP reducer's and
AccumulateGrad's ranges) scales with the batch; Python, the autograd engine's bookkeeping and
the gradients' handling do not (on the MLP at batch 16 they are most of the step's host
time). The batch what-if (``replay/policies/batch_measured.py``) keeps the fixed parts and
scales the rest. A trace with neither large copies nor recorded shapes gets no GEMM part (the
batch what-if says so in an ``assumed:`` line).
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

__all__ = ["COPY_MIN_BYTES", "GEMMS", "MEMSETS", "GemmSplit", "host_split", "weight_bytes"]

#: leaf operators that fill a tensor with a constant (``torch.zeros``' and ``zero_``'s memset)
MEMSETS = ("aten::fill_", "aten::zero_")
#: operators whose first input is a parameter table (the embedding's rows x dim weight)
_TABLES = ("aten::embedding", "aten::embedding_bag")
#: copies smaller than this are dominated by the per-call dispatch, not the memory rate
COPY_MIN_BYTES = 256 * 1024
GEMMS = ("aten::addmm", "aten::mm")
_ELEM = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "half": 2,
         "bfloat16": 2, "float32": 4, "float64": 8, "int": 4, "long int": 8, "int64": 8}


@dataclass
class GemmSplit:
    """Per op (op-id order): the GEMMs' fixed ns spread over the host gaps before each op
    (``gap_fixed_ns``), and what was used (``info``)."""

    gap_fixed_ns: np.ndarray
    info: dict


def _nbytes(dims, typ) -> int | None:
    e = _ELEM.get(str(typ))
    if e is None or not isinstance(dims, list) or not dims \
            or not all(isinstance(x, int) for x in dims):
        return None
    return int(np.prod(dims, dtype=np.int64)) * e


def weight_bytes(name: str, dims: list, types: list, weights: set) -> int:
    """Bytes of a GEMM's parameter-sized operand (module docstring), 0 without one."""
    off = 1 if name == "aten::addmm" else 0
    if len(dims) < off + 2:
        return 0
    a, b = dims[off], dims[off + 1]
    if not (isinstance(a, list) and isinstance(b, list) and len(a) == 2 and len(b) == 2):
        return 0
    typ = types[off + 1] if len(types) > off + 1 else "float"

    def is_w(s) -> bool:
        return tuple(s) in weights or tuple(s[::-1]) in weights

    if is_w(b):
        return _nbytes(b, typ) or 0
    c = [a[0], b[1]]
    return (_nbytes(c, typ) or 0) if is_w(c) else 0


def kineto_cpu_ops(meta: dict):
    """Each readable Kineto source of a trace's ``meta`` with its ``cpu_op`` events, as
    ``(source, events)`` (files that cannot be read are passed over: the caller says what it
    falls back on)."""
    for s in (meta.get("sources") or []) if isinstance(meta, dict) else []:
        if not (isinstance(s, dict) and s.get("format") == "kineto"):
            continue
        try:
            raw = Path(str(s.get("path", ""))).read_bytes()
            doc = orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        except (OSError, orjson.JSONDecodeError, EOFError):
            continue
        ev = doc.get("traceEvents", []) if isinstance(doc, dict) else []
        yield s, [e for e in ev if isinstance(e, dict) and e.get("cat") == "cpu_op"]


def _events(trace) -> dict[int, list[dict]]:
    """The ``cpu_op`` events of each rank's Kineto file that this module reads."""
    out: dict[int, list[dict]] = {}
    for s, ev in kineto_cpu_ops(trace.meta):
        if "rank" in s:
            keep = [e for e in ev if e.get("name") in (*GEMMS, *MEMSETS, "aten::copy_",
                                                       "aten::linear", *_TABLES)]
            out.setdefault(int(s["rank"]), []).extend(keep)
    return out


def copy_rate(events: dict[int, list[dict]]) -> tuple[float | None, int]:
    """(bytes per ns of the trace's large copies, how many) -- module docstring."""
    rates = []
    for ev in events.values():
        for e in ev:
            if e.get("name") != "aten::copy_":
                continue
            a = e.get("args") or {}
            dims, types = a.get("Input Dims") or [], a.get("Input type") or []
            if len(dims) < 2 or len(types) < 2 or dims[0] != dims[1] or types[0] != types[1]:
                continue
            n = _nbytes(dims[0], types[0])
            dur = float(e.get("dur") or 0) * 1e3
            if n and n >= COPY_MIN_BYTES and dur > 0:
                rates.append(n / dur)
    return (float(np.median(rates)) if rates else None), len(rates)


def _weights(events: dict[int, list[dict]]) -> set:
    out = set()
    for ev in events.values():
        for e in ev:
            if e.get("name") == "aten::linear":
                dims = (e.get("args") or {}).get("Input Dims") or []
                if len(dims) > 1 and isinstance(dims[1], list) and len(dims[1]) == 2:
                    out.add(tuple(dims[1]))
    return out


def _param_fills(events: dict[int, list[dict]], weights: set) -> dict[int, list[tuple]]:
    """Per rank, each memset (:data:`MEMSETS`) in time order as ``(name, is_param)``:
    whether its tensor has a parameter's shape, a linear layer's weight or an embedding table
    (the first input of the trace's ``aten::embedding`` / ``aten::embedding_bag``). Such a
    fill is a gradient's zeroing (an embedding bag's dense backward zero-fills a rows x dim
    table before it scatters the batch's rows into it): its bytes, so its time, do not
    depend on the batch."""
    shapes = set(weights)
    for ev in events.values():
        for e in ev:
            if e.get("name") in _TABLES:
                dims = (e.get("args") or {}).get("Input Dims") or []
                if dims and isinstance(dims[0], list) and len(dims[0]) == 2:
                    shapes.add(tuple(dims[0]))
    out: dict[int, list[tuple]] = {}
    for rank, ev in events.items():
        ms = sorted((e for e in ev if e.get("name") in MEMSETS),
                    key=lambda e: (float(e.get("ts", 0)), -float(e.get("dur", 0))))
        # the leaves only (the trace's ops): a ``zero_`` that calls ``fill_`` is a range
        ms = [e for k, e in enumerate(ms) if not (
            k + 1 < len(ms) and ms[k + 1].get("tid") == e.get("tid")
            and float(ms[k + 1].get("ts", 0)) < float(e.get("ts", 0)) + float(e.get("dur", 0)))]
        out[rank] = []
        for e in ms:
            dims = (e.get("args") or {}).get("Input Dims") or []
            out[rank].append((e["name"], bool(dims) and isinstance(dims[0], list)
                              and tuple(dims[0]) in shapes))
    return out


def _is_operator(name: str) -> bool:
    """A framework operator whose uncovered time is its own compute (``aten::addmm``, a
    custom ``lib::op``), not Python (``file.py(N): f``, ``<built-in ...>``), the autograd
    engine's bookkeeping (``autograd::engine::...``, ``XBackward0``), a collective or a
    profiler/step range."""
    return ("::" in name and ".py(" not in name and not name.startswith(
        ("<", "autograd::", "torch::autograd::", "c10d::", "ProfilerStep", "## "))
        and not any(x in name for x in _FIXED_RANGES))


#: ranges whose operators move the parameters' gradients, not the batch
_FIXED_RANGES = ("reducer", "AccumulateGrad")


def _union(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if not len(s):
        return s, e
    o = np.argsort(s, kind="stable")
    s, e = s[o], np.maximum.accumulate(e[o])
    new = np.r_[True, s[1:] > e[:-1]]
    grp = np.cumsum(new) - 1
    ends = np.zeros(int(grp[-1]) + 1, e.dtype)
    np.maximum.at(ends, grp, e)
    return s[new], ends


def _covered(us: np.ndarray, ue: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Length of the union (``us``, ``ue``: disjoint, sorted) before each ``x``."""
    if not len(us):
        return np.zeros(len(x))
    cum = np.r_[0.0, np.cumsum((ue - us).astype(np.float64))]
    j = np.searchsorted(us, x, side="right")
    jm = np.maximum(j - 1, 0)
    part = np.where(j > 0, np.clip(x - us[jm], 0, (ue - us)[jm]), 0)
    return cum[jm] * (j > 0) + part


def host_split(trace, work: np.ndarray) -> GemmSplit:
    """Per op (op-id order) of ``work`` (the batch what-if's forward/backward host ops): the
    part of the gap before it that does NOT scale with the batch (``gap_fixed_ns``) and
    whether the op's own time scales (``info["op_scales"]``, a bool array).

    A gap's time inside an operator's span (:func:`_is_operator`, outside the DDP reducer's
    and AccumulateGrad's ranges) is the operator's compute and scales, less the weight copy
    of a GEMM (module docstring) spread over the gaps inside its span in proportion to their
    overlap; the rest of the gap (Python, the autograd engine's bookkeeping, the gradients'
    handling) keeps its time. A leaf op scales when it is itself such an operator."""
    n_ops = len(trace.ops)
    names = np.asarray(trace.strings, dtype=object)
    o = trace.ops
    o_rank, o_lane = o["rank"].to_numpy(), o["lane"].to_numpy()
    o_start = o["start_ns"].to_numpy().astype(np.int64)
    o_end = o_start + o["dur_ns"].to_numpy().astype(np.int64)
    o_name = names[o["name_id"].to_numpy()]
    r = trace.ranges
    r_name = names[r["name_id"].to_numpy()]
    r_rank, r_lane = r["rank"].to_numpy(), r["lane"].to_numpy()
    r_s, r_e = r["start_ns"].to_numpy().astype(np.int64), r["end_ns"].to_numpy().astype(np.int64)
    is_op_r = np.fromiter((_is_operator(str(x)) for x in r_name), bool, len(r_name))
    is_fx_r = np.fromiter((any(f in str(x) for f in _FIXED_RANGES) for x in r_name), bool,
                          len(r_name))
    leaf_op = np.fromiter((_is_operator(str(x)) for x in o_name), bool, n_ops)
    scaled = np.zeros(n_ops)
    gap = np.zeros(n_ops)
    events = _events(trace)
    rate, n_copies = copy_rate(events)
    weights = _weights(events)
    info = {"copy_rate_gbps": None if rate is None else round(rate, 3), "copies": n_copies,
            "weight_shapes": len(weights), "gemms": 0, "gemms_with_weight": 0,
            "fixed_ns": 0.0, "gemm_ns": 0.0, "unmatched_ranks": [], "gap_ns": 0.0,
            "gap_scaled_ns": 0.0}
    lanes: dict[tuple, tuple] = {}
    for key in sorted(set(zip(o_rank[work].tolist(), o_lane[work].tolist()))):
        lid = np.flatnonzero((o_rank == key[0]) & (o_lane == key[1]))
        lid = lid[np.argsort(o_start[lid], kind="stable")]
        st = o_start[lid]
        prev = np.r_[st[0], np.maximum.accumulate(o_end[lid])[:-1]]
        g_lo = np.minimum(prev, st)
        rs = (r_rank == key[0]) & (r_lane == key[1])
        ou, oe = _union(r_s[rs & is_op_r], r_e[rs & is_op_r])
        fu, fe = _union(r_s[rs & is_fx_r], r_e[rs & is_fx_r])
        # operator spans less the gradients' ranges: union(op) - union(op & fixed); the
        # fixed ranges contain operators (reducer::mul_out > aten::mul), so op & fixed = the
        # fixed ranges' own coverage of operator spans, bounded by both
        c_op = _covered(ou, oe, st) - _covered(ou, oe, g_lo)
        c_fx = _covered(fu, fe, st) - _covered(fu, fe, g_lo)
        s_i = np.clip(c_op - c_fx, 0, None)
        gap[lid] = st - g_lo
        scaled[lid] = s_i
        lanes[key] = (lid, st, g_lo)
    gap_fixed = gap - scaled
    gemm_fixed = np.zeros(n_ops)
    info["gemm_fixed"] = gemm_fixed
    info["gap_ns"] = float(gap[work].sum())
    info["gap_scaled_ns"] = float(scaled[work].sum())
    fixed_in = _in_fixed(trace, o_rank, o_lane, o_start, is_fx_r)
    # the trace's memset ops matched to their Kineto events in time order, rank by rank,
    # as the GEMMs are below (a rank whose sequences differ keeps every fill scaling)
    param_fill = np.zeros(n_ops, bool)
    is_m = np.isin(o_name, MEMSETS)
    o_dur = o["dur_ns"].to_numpy().astype(np.int64)
    for rank, fl in _param_fills(events, weights).items():
        sel = np.flatnonzero(is_m & (o_rank == rank))
        sel = sel[np.lexsort((-o_dur[sel], o_start[sel]))]
        if len(sel) != len(fl) or any(o_name[i] != n for i, (n, _) in zip(sel, fl)):
            info["unmatched_ranks"].append(int(rank))
            continue
        param_fill[sel[[p for _, p in fl]]] = True
    info["op_scales"] = work & leaf_op & ~fixed_in & ~param_fill
    info["ops_scaled"] = int(info["op_scales"].sum())
    info["param_fills"] = int((work & param_fill).sum())
    info["param_fill_ns"] = float(o["dur_ns"].to_numpy()[work & param_fill].sum())
    if rate is None or not weights:
        return GemmSplit(gap_fixed, info)
    is_g = np.isin(r_name, GEMMS)
    for rank, ev in events.items():
        gm = sorted((e for e in ev if e.get("name") in GEMMS),
                    key=lambda e: (float(e.get("ts", 0)), -float(e.get("dur", 0))))
        sel = np.flatnonzero(is_g & (r_rank == rank))
        sel = sel[np.lexsort((-r_e[sel], r_s[sel]))]
        if len(sel) != len(gm) or any(r_name[i] != e.get("name") for i, e in zip(sel, gm)):
            info["unmatched_ranks"].append(int(rank))
            continue
        for i, e in zip(sel.tolist(), gm):
            a = e.get("args") or {}
            wb = weight_bytes(str(e["name"]), a.get("Input Dims") or [],
                              a.get("Input type") or [], weights)
            info["gemms"] += 1
            s, en = int(r_s[i]), int(r_e[i])
            info["gemm_ns"] += en - s
            key = (int(rank), int(r_lane[i]))
            if not wb or key not in lanes:
                continue
            lid, st, g_lo = lanes[key]
            j0 = int(np.searchsorted(st, s, side="right"))
            j1 = min(int(np.searchsorted(st, en, side="left")) + 1, len(lid))
            if j1 <= j0:
                continue
            js = np.arange(j0, j1)
            ov = np.clip(np.minimum(st[js], en) - np.maximum(g_lo[js], s), 0, None) \
                .astype(np.float64) * work[lid[js]]
            u = float(ov.sum())
            if u <= 0:
                continue
            m = min(wb / rate, u)
            ids = lid[js]
            # the weight copy: a part of the gaps' scaled (operator) time
            add = np.minimum(m * ov / u, scaled[ids])
            gap_fixed[ids] += add
            gemm_fixed[ids] += add
            info["gemms_with_weight"] += 1
            info["fixed_ns"] += m
    return GemmSplit(gap_fixed, info)


def _in_fixed(trace, rank, lane, start, is_fx_r) -> np.ndarray:
    """Whether each op starts inside a DDP reducer / AccumulateGrad range of its lane."""
    r = trace.ranges
    out = np.zeros(len(start), bool)
    if not is_fx_r.any():
        return out
    rr, rl = r["rank"].to_numpy()[is_fx_r], r["lane"].to_numpy()[is_fx_r]
    rs, re_ = r["start_ns"].to_numpy()[is_fx_r], r["end_ns"].to_numpy()[is_fx_r]
    for k in set(zip(rr.tolist(), rl.tolist())):
        m = (rr == k[0]) & (rl == k[1])
        us, ue = _union(rs[m].astype(np.int64), re_[m].astype(np.int64))
        ids = np.flatnonzero((rank == k[0]) & (lane == k[1]))
        j = np.searchsorted(us, start[ids], side="right") - 1
        out[ids] = (j >= 0) & (start[ids] < ue[np.maximum(j, 0)])
    return out
