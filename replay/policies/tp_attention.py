"""Shaped operator calls and Megatron's attention split for ``parallel.tp`` (tp_measured).

Two things :mod:`.tp_measured` needs besides the MLP chains:

* :class:`Calls`: the trace's operator calls with recorded shapes, each with its rank, its
  start and its phase, from either source: a GPU trace's shaped calls (the kernels each
  launched, :func:`.kernel_cost.shaped_kernels`) or, on a trace without GPU kernels (a CPU
  run), the innermost ``cpu_op`` events with ``Input Dims`` of the Kineto sources
  (:func:`cpu_calls`). CPU calls carry no device ops: the layout is read from them and
  :mod:`.tp_cpu` re-times the host gaps inside their spans.
* :func:`attention_blocks`: Megatron-LM's attention split (Shoeybi et al. 2019, REFERENCES
  K23/K36) recognized from the forward's shapes: an attention core call (``aten::
  scaled_dot_product_attention`` and its flash / efficient / cuDNN / CPU variants) with a
  query ``[b, H, s, d]``, preceded by its QKV projection -- one linear of ``m = b s`` rows
  and ``3 H d`` outputs (fused) or three of ``H d`` outputs each (``q``, ``k``, ``v``) --
  and followed by the out-projection (``m`` rows, ``H d`` inputs). At TP=t the QKV
  projection is column-parallel (``H / t`` heads per rank), the core runs ``H / t`` heads,
  the out-projection is row-parallel with one all-reduce of its output (forward) and one of
  the QKV input's gradient (backward). ``H % t != 0`` is refused. Grouped-query attention
  (``H_kv < H`` key / value heads: a fused projection of ``(H + 2 H_kv) d`` outputs, ``k``
  and ``v`` linears of ``H_kv d``, an SDPA key of ``H_kv`` heads) splits the key / value
  heads with their query groups, ``H_kv / t`` per rank; ``H_kv % t != 0`` is refused.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from retime.collectors.enums import OpKind
from retime.collectors.errors import PolicyError

__all__ = ["Calls", "ATTN_FWD", "ATTN_BWD", "gpu_calls", "cpu_calls", "attention_blocks",
           "attention_backward", "split_heads", "kv_heads", "split_batch", "heads_of", "is_core"]

#: attention cores (base names): the query is ``[b, H, s, d]`` (the cost layer's reading)
ATTN_FWD = frozenset({"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                      "_scaled_dot_product_efficient_attention",
                      "_scaled_dot_product_cudnn_attention", "_flash_attention_forward",
                      "_efficient_attention_forward",
                      "_scaled_dot_product_flash_attention_for_cpu"})
ATTN_BWD = frozenset({"_scaled_dot_product_flash_attention_backward",
                      "_scaled_dot_product_efficient_attention_backward",
                      "_scaled_dot_product_cudnn_attention_backward",
                      "_flash_attention_backward", "_efficient_attention_backward",
                      "_scaled_dot_product_flash_attention_for_cpu_backward"})
_GEMM = frozenset({"addmm", "linear", "mm"})
_BMM = frozenset({"bmm", "baddbmm"})
#: the softmax over ``[b, H, s, s2]`` scores of eager attention (forward, backward)
_SOFTMAX = frozenset({"_softmax", "softmax", "_safe_softmax", "_masked_softmax"})
_SOFTMAX_BWD = frozenset({"_softmax_backward_data", "_masked_softmax_backward"})
_ES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "half": 2,
       "bfloat16": 2, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1}


def _base(name: str) -> str:
    return str(name).rsplit("::", 1)[-1]


@dataclass(frozen=True)
class Calls:
    """Shaped operator calls: per call ``names``, ``dims``, ``types``, ``es`` (bytes per
    element of its first tensor), and int64 arrays ``rank``, ``first`` (start, ns) and
    ``phase`` (:class:`Phase`, -1 unknown); ``end`` (CPU calls: the end of each span, ns).
    ``device``: whether the calls own GPU ops (the
    indices are then :func:`.kernel_cost.shaped_kernels`' call indices)."""

    names: list
    dims: list
    types: list
    es: list
    rank: np.ndarray
    first: np.ndarray
    phase: np.ndarray
    device: bool
    end: np.ndarray | None = None


def _es(types: list) -> int:
    return next((_ES[t] for t in types if t in _ES), 4)


def gpu_calls(trace, sk, first: np.ndarray, phase: np.ndarray) -> Calls:
    """:class:`Calls` of a GPU trace's shaped calls ``sk`` (their first kernel's start and
    phase given)."""
    return Calls(list(sk.names), list(sk.dims), list(sk.types),
                 [_es(t) for t in sk.types], np.asarray(sk.rank, np.int64),
                 np.asarray(first, np.int64), np.asarray(phase, np.int64), True)


def _wanted(name: str) -> bool:
    b = _base(name)
    return (b in _GEMM or b in _BMM or b in ATTN_FWD or b in ATTN_BWD or b in _SOFTMAX
            or b in _SOFTMAX_BWD)


def cpu_calls(trace) -> Calls | None:
    """:func:`_cpu_calls`, memoized per trace (the Kineto files are read once)."""
    from .base import trace_memo
    memo = trace_memo(trace)
    if "tp_cpu_calls" not in memo:
        memo["tp_cpu_calls"] = _cpu_calls(trace)
    return memo["tp_cpu_calls"]


def _cpu_calls(trace) -> Calls | None:
    """:class:`Calls` of a trace without GPU kernels: the innermost wanted ``cpu_op`` events
    (2-D GEMMs, attention cores) with ``Input Dims`` of its Kineto sources; the phase of
    each is the phase of the ingested ops inside its span on its rank (the first). None
    when the trace records no Kineto sources or no such call."""
    srcs = [s for s in (trace.meta.get("sources", []) if isinstance(trace.meta, dict) else [])
            or [] if isinstance(s, dict) and s.get("format") == "kineto" and "rank" in s]
    o = trace.ops
    o_rank, o_st = o["rank"].to_numpy(), o["start_ns"].to_numpy()
    o_ph = o["phase"].to_numpy()
    o_cpu = o["kind"].to_numpy() == OpKind.CPU_OP
    rows: list[tuple] = []
    for s in srcs:
        p = Path(s["path"])
        if not p.is_file():
            return None
        raw = p.read_bytes()
        doc = orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        base_ns = int(doc.get("baseTimeNanoseconds", 0) or 0)
        ev = [e for e in doc.get("traceEvents", []) if isinstance(e, dict)
              and e.get("ph") == "X" and e.get("cat") == "cpu_op"
              and "Input Dims" in (e.get("args") or {}) and _wanted(e.get("name", ""))]
        ev.sort(key=lambda e: (str(e.get("tid")), float(e["ts"]), -float(e.get("dur", 0))))
        for i, e in enumerate(ev):
            a, st = e["args"], float(e["ts"])
            end = st + float(e.get("dur", 0))
            nxt = ev[i + 1] if i + 1 < len(ev) else None
            if (nxt is not None and nxt.get("tid") == e.get("tid")
                    and float(nxt["ts"]) < end):
                continue  # it encloses another wanted call: the inner one is the work
            rows.append((int(s["rank"]), str(e["name"]), a.get("Input Dims") or [],
                         a.get("Input type") or [], base_ns + int(round(st * 1e3)),
                         base_ns + int(round(end * 1e3))))
    if not rows:
        return None
    rank = np.asarray([r[0] for r in rows], np.int64)
    first = np.asarray([r[4] for r in rows], np.int64)
    phase = np.full(len(rows), -1, np.int64)
    offs = trace.meta.get("clock_offsets_ns") if isinstance(trace.meta, dict) else None
    for i, r in enumerate(rows):
        sh = int((offs or {}).get(str(r[0]), 0) or 0) if isinstance(offs, dict) else 0
        inside = np.flatnonzero(o_cpu & (o_rank == r[0]) & (o_st >= r[4] + sh) & (o_st < r[5] + sh))
        if len(inside):
            phase[i] = int(o_ph[inside[np.argmin(o_st[inside])]])
    return Calls([r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows],
                 [_es(r[3]) for r in rows], rank, first, phase, False,
                 np.asarray([r[5] for r in rows], np.int64))


def is_core(name: str) -> bool:
    """Whether a call may be (part of) an attention core: SDPA-family, batched GEMM or
    softmax."""
    return _base(name) in ATTN_FWD or _base(name) in _BMM or _base(name) in _SOFTMAX


def has_device_ops(trace) -> bool:
    k = trace.ops["kind"].to_numpy()
    return bool(((k == OpKind.KERNEL) | (k == OpKind.MEMSET)).any())


def heads_of(dims: list) -> tuple[int, int, int, int] | None:
    """``(b, H, s, d)`` of an attention call's query (its first tensor), or None."""
    q = next((d for d in dims if isinstance(d, list) and d), None)
    return tuple(int(x) for x in q) if q is not None and len(q) == 4 else None


def kv_heads(name: str, dims: list) -> int | None:
    """The key's heads ``H_kv`` of an SDPA-family call: its key ``[b, H_kv, s2, d]`` is the
    second operand forward (query, key, value, ..) and the third backward (grad_out, query,
    key, ..); None when that operand is not 4-D or its heads do not divide the query's."""
    q = heads_of(dims)
    i = 2 if _base(name) in ATTN_BWD else 1
    k = dims[i] if i < len(dims) else None
    if q is None or not isinstance(k, list) or len(k) != 4 or k[0] != q[0] or not k[1] \
            or q[1] % int(k[1]):
        return None
    return int(k[1])


def split_heads(dims: list, t: int, kv: int | None = None) -> list:
    """An attention call's ``dims`` with the heads (the second extent of every 4-D
    ``[b, H, s, d]`` tensor and of the 3-D ``[b, H, s]`` log-sum-exp) divided by ``t``;
    with grouped-query attention (``kv``: the key / value heads ``H_kv < H``) the key's and
    value's ``[b, H_kv, s2, d]`` too: each rank keeps ``H / t`` query heads and the
    ``H_kv / t`` key / value heads of their groups."""
    q = heads_of(dims)
    hs = {q[1], kv} if q is not None and kv else {q[1]} if q is not None else set()
    out = []
    for d in dims:
        if isinstance(d, list) and q is not None and d and d[0] == q[0] and (
                (len(d) in (3, 4) and d[1] == q[1]) or (len(d) == 4 and d[1] in hs)):
            d = [d[0], d[1] // t, *d[2:]]
        out.append(list(d) if isinstance(d, list) else d)
    return out


def _bmm(c: Calls, x: int) -> tuple[int, int, int, int] | None:
    """``(batch, m, n, k)`` of a 3-D batched GEMM call, else None."""
    if _base(c.names[x]) not in _BMM:
        return None
    from retime.collectors.costs.ops import gemm_dims, tensors
    try:
        return tuple(int(v) for v in gemm_dims(_base(c.names[x]),
                                               tensors(c.dims[x], c.types[x])))
    except (IndexError, TypeError, ValueError):
        return None


def _core(c: Calls, fwd: list[int], i: int, mkn: list, used: set):
    """The attention core starting at ``fwd[i]``: ``(calls, axis, (b or None, H or B, s,
    d, s2), H_kv or None)`` for an SDPA-family call (axis ``h``; ``H_kv``: its key's heads)
    or a pair of batched GEMMs ``S = Q K^T`` ``[B, s, d] x [B, d, s2]`` then ``O = P V``
    ``[B, s, s2] x [B, s2, d]`` (axis ``b``, ``B = b H``), else None."""
    a = fwd[i]
    if _base(c.names[a]) in ATTN_FWD:
        q = heads_of(c.dims[a])
        return None if q is None else ([a], "h", (*q, q[2]), kv_heads(c.names[a], c.dims[a]))
    one = _bmm(c, a)
    if one is None or a in used:
        return None
    j = next((j for j in range(i + 1, len(fwd)) if mkn[fwd[j]] is not None
              or _bmm(c, fwd[j]) is not None), None)
    nxt = fwd[j] if j is not None else None
    two = _bmm(c, nxt) if nxt is not None else None
    bt, s, s2, d = one
    if two is None or two != (bt, s, d, s2):
        return None
    soft = [x for x in fwd[i + 1:j] if _scores(c, x, bt, s, s2)]
    return [a, *soft, nxt], "b", (None, bt, s, d, s2), None


def _scores(c: Calls, x: int, bt: int, s: int, s2: int) -> bool:
    """Whether call ``x`` is a softmax (forward or backward) over ``[b, H, s, s2]`` scores
    with ``b H = bt``."""
    if _base(c.names[x]) not in _SOFTMAX | _SOFTMAX_BWD:
        return False
    q = heads_of(c.dims[x])
    return q is not None and q[0] * q[1] == bt and q[2:] == (s, s2)


def attention_blocks(c: Calls, fwd: list[int], mkn: list, t: int) -> list[dict]:
    """Megatron attention blocks among one rank's forward calls ``fwd`` (indices into
    ``c`` in issue order; ``mkn``: per call its 2-D GEMM ``(m, k, n)`` or None): per block
    ``qkv`` (1 or 3 call indices), ``core`` (its forward calls), ``axis`` (``h``: split the
    heads of an SDPA call, ``b``: the batch ``b H`` of batched GEMMs), ``out``, ``heads``,
    ``kv_heads`` (``H_kv``, :func:`_projection`), ``m``, ``hd`` (``H d``). Raises
    PolicyError when ``t`` does not divide a recognized block's heads or its ``H_kv``."""
    out: list[dict] = []
    used: set[int] = set()
    for i, a in enumerate(fwd):
        got = _core(c, fwd, i, mkn, used)
        if got is None:
            continue
        core, axis, (b, heads, s, d, s2), kvc = got
        before = [x for x in fwd[:i] if mkn[x] is not None and x not in used]
        if not before:
            continue
        if b is None:  # batched GEMMs: B = b H, b from the projection's rows
            m0 = mkn[before[-1]][0]
            if m0 % s or heads % (m0 // s):
                continue
            b, heads = m0 // s, heads // (m0 // s)
        m, hd = b * s, heads * d
        qkv, kv = _projection(mkn, before, m, heads, d, kvc)
        after = [x for x in fwd[i + 1:] if mkn[x] is not None]
        if not qkv or not after or mkn[after[0]][0] != m or mkn[after[0]][1] != hd:
            continue
        what = (f"QKV {'fused' if len(qkv) == 1 else 'as q, k, v'}, {heads} heads of {d}"
                + (f", {kv} key/value heads" if kv != heads else "")
                + f", rank {int(c.rank[a])}")
        if heads % t:
            raise PolicyError(
                f"parallel.tp={t} on a measured trace: its attention block ({what}) splits "
                f"by heads, and {t} does not divide {heads}; choose a degree that divides "
                f"{heads}")
        if kv % t:
            raise PolicyError(
                f"parallel.tp={t} on a measured trace: its attention block ({what}) is "
                f"grouped-query, whose key/value heads split with their query groups "
                f"(Megatron requires num_query_groups divisible by the TP degree), and {t} "
                f"does not divide {kv}; choose a degree that divides {kv}")
        used.update(qkv + core + [after[0]])
        axes = ["h" if _base(c.names[x]) in _SOFTMAX else axis for x in core]
        out.append({"qkv": qkv, "core": core, "axis": axis, "axes": axes, "out": after[0],
                    "heads": heads, "kv_heads": kv, "m": m, "hd": hd, "d": d, "b": b,
                    "s": s, "s2": s2})
    return out


def _projection(mkn: list, before: list[int], m: int, heads: int, d: int,
                kvc: int | None) -> tuple[list[int], int]:
    """``(QKV projection calls, H_kv)`` of the linear(s) just before a core of ``heads``
    query heads of ``d`` over ``m`` rows: one fused linear of ``(H + 2 H_kv) d`` outputs or
    three (``q``: ``H d``; ``k``, ``v``: ``H_kv d`` each) of one input width, ``H_kv``
    dividing ``H`` (``H_kv = H``: multi-head; fewer: grouped-query, also when the core's key
    was repeated to ``H`` heads before it); ``kvc``: the core's own key heads where it
    records them (an SDPA call with ``enable_gqa``), which must then agree. ``([], H)``
    when none fits."""
    def ok(kv: int) -> bool:
        return 0 < kv <= heads and heads % kv == 0 and kvc in (None, heads, kv)
    last = mkn[before[-1]]
    if last[0] == m and last[2] % d == 0 and (last[2] // d - heads) % 2 == 0 \
            and ok((last[2] // d - heads) // 2):
        return [before[-1]], (last[2] // d - heads) // 2
    if len(before) >= 3:
        q, k, v = (mkn[x] for x in before[-3:])
        if all(x[0] == m and x[1] == last[1] for x in (q, k, v)) and q[2] == heads * d \
                and k[2] == v[2] and k[2] % d == 0 and ok(k[2] // d):
            return before[-3:], k[2] // d
    return [], heads


def attention_backward(c: Calls, blocks: list[dict], bwd: list[int]) -> None:
    """Match each block's core backward calls (backward runs in reverse: latest block
    first): an :data:`ATTN_BWD` call whose query-shaped first tensor is the forward's query;
    for a batched-GEMM core, the four batched GEMMs of its gradients (batch ``b H``, other
    extents among ``s`` and ``d``) and its softmax's backward. Sets ``block["core_bwd"]``
    (a list, empty when none) and ``block["axes_bwd"]`` (each one's split axis)."""
    for blk in blocks:
        blk["core_bwd"], blk["axes_bwd"] = [], []
    for x in bwd:
        q = heads_of(c.dims[x]) if _base(c.names[x]) in ATTN_BWD else None
        g = _bmm(c, x)
        for blk in reversed(blocks):
            if blk["axis"] == "b" and _scores(c, x, blk["b"] * blk["heads"], blk["s"],
                                              blk["s2"]) \
                    and "h" not in blk["axes_bwd"]:
                blk["core_bwd"].append(x)
                blk["axes_bwd"].append("h")
                break
            if blk["axis"] == "h" and q is not None and len(blk["core_bwd"]) < 1 \
                    and heads_of(c.dims[blk["core"][0]]) == q:
                blk["core_bwd"].append(x)
                blk["axes_bwd"].append("h")
                break
            if blk["axis"] == "b" and g is not None and blk["axes_bwd"].count("b") < 4 \
                    and g[0] == blk["b"] * blk["heads"] \
                    and set(g[1:]) <= {blk["s"], blk["s2"], blk["d"]}:
                blk["core_bwd"].append(x)
                blk["axes_bwd"].append("b")
                break


def split_batch(dims: list, t: int) -> list:
    """A batched GEMM call's ``dims`` with its batch ``b H`` (the first extent of every 3-D
    operand) divided by ``t``: ``t`` ranks, ``H / t`` heads each."""
    bt = next((d[0] for d in dims if isinstance(d, list) and len(d) == 3), None)
    return [[d[0] // t, *d[1:]] if isinstance(d, list) and len(d) == 3 and d[0] == bt
            else (list(d) if isinstance(d, list) else d) for d in dims]
