"""The DDP parameters of a gloo trace: which old bucket each belongs to and their exact
sizes in the order their gradients became ready (used by :mod:`.bucketing_cpu`).

A plain ``torch.profiler`` trace recorded with ``record_shapes`` holds the sizes itself: the
reducer's per-parameter ``mul_out`` carries the gradient's ``Input Dims`` and dtype, in the
order the gradients became ready (:func:`trace_param_bytes`). Otherwise
``meta["ddp_param_bytes"]`` lists the gradient bytes of the model's parameters in
registration order; DDP buckets them in the order their gradients become ready, which is
reverse registration order except where a module's backward runs out of it (post-norm
transformer layers: norm1's gradients come after the FFN's). The order is the first of these
that reproduces every old bucket's bytes and puts the fewest large gradients on short copies
of the reducer: reverse registration order, the order given, reverse registration order with
the large gradients moved to the longest copies (:func:`local_order`), and, only if nothing
else fits, the sizes sorted by copy time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from retime.collectors.errors import PolicyError
from retime.collectors.trace import Trace

__all__ = ["bucket_of", "exact_sizes", "local_order", "LOCAL_WINDOW", "trace_param_bytes",
           "param_bytes"]

#: the DDP reducer's per-parameter copy of a ready gradient into its bucket
MUL_OUT = "torch::distributed::reducer::mul_out"
_STEP = "ProfilerStep#"


def trace_param_bytes(trace: Trace) -> list[int] | None:
    """The gradient bytes of every parameter DDP reduces, in the order they became ready,
    read from the trace's own Kineto source (the lowest rank's file): the ``Input Dims`` and
    ``Input type`` of the reducer's ``mul_out`` calls in the first profiler step that has
    them (``record_shapes=True``). None when the trace has no such source or records no
    shapes. Memoized per trace."""
    from .base import trace_memo

    memo = trace_memo(trace)
    if "trace_param_bytes" in memo:
        return memo["trace_param_bytes"]
    out = None
    srcs = sorted((s for s in trace.meta.get("sources", []) or []
                   if isinstance(s, dict) and s.get("format") == "kineto" and "rank" in s),
                  key=lambda s: int(s["rank"]))
    if srcs:
        try:
            out = _reducer_sizes(srcs[0]["path"])
        except (OSError, ValueError, TypeError, EOFError):
            out = None
    memo["trace_param_bytes"] = out
    return out


def _reducer_sizes(path: str) -> list[int] | None:
    import gzip

    import orjson

    from retime.collectors.collectives import DTYPE_BYTES

    raw = gzip.open(path, "rb").read() if str(path).endswith(".gz") else open(path, "rb").read()
    doc = orjson.loads(raw)
    ev = doc.get("traceEvents") if isinstance(doc, dict) else doc
    steps, calls = [], []
    for e in ev if isinstance(ev, list) else []:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        name = e.get("name")
        if name == MUL_OUT:
            a = e.get("args") or {}
            dims, types = a.get("Input Dims"), a.get("Input type")
            if not dims or not isinstance(dims[0], list):
                return None  # recorded without shapes
            n = 1
            for x in dims[0]:
                n *= int(x)
            t0 = types[0] if isinstance(types, list) and types else "float"
            calls.append((float(e["ts"]), n * DTYPE_BYTES.get(t0, 4)))
        elif isinstance(name, str) and name.startswith(_STEP) and e.get("cat") in (
                "user_annotation", "cpu_op", "python_function"):
            steps.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))))
    if not calls:
        return None
    calls.sort()
    ts = np.asarray([c[0] for c in calls])
    for lo, hi in sorted(steps):
        sel = (ts >= lo) & (ts < hi)
        if sel.any():
            return [int(calls[i][1]) for i in np.flatnonzero(sel)]
    return None if steps else [int(c[1]) for c in calls]


def param_bytes(trace: Trace) -> tuple[list[int] | None, bool]:
    """The parameters' gradient bytes and whether they are in ready order:
    ``meta["ddp_param_bytes"]`` where a user or a capture stated them (registration order),
    else the trace's own reducer shapes (:func:`trace_param_bytes`, ready order), else None."""
    given = trace.meta.get("ddp_param_bytes") if isinstance(trace.meta, dict) else None
    if given is not None:
        return given, False
    got = trace_param_bytes(trace)
    return (got, True) if got else (None, False)


def bucket_of(ids: np.ndarray, rdy: pd.DataFrame, issue_of: dict, start: np.ndarray
               ) -> np.ndarray:
    """Old bucket index of each parameter of a (rank, step): the bucket whose issue call is
    the first to start after the parameter's gradient was copied in."""
    istart = np.asarray([start[issue_of[int(i)]] for i in ids])
    return np.minimum(np.searchsorted(istart, rdy["end_ns"].to_numpy(), side="left"),
                      len(ids) - 1)


def exact_sizes(trace: Trace, per: dict, weight: np.ndarray, issue_of: dict,
                start: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray | None, str]:
    """The parameters' exact bytes in ready order from ``meta["ddp_param_bytes"]``
    (module docstring), or ``(None, "copy times")`` without that key."""
    given, ready = param_bytes(trace)
    if given is None:
        return None, "copy times"
    if ready:
        sizes = np.asarray(given, np.float64)
        if len(sizes) == len(weight) and all(
                np.array_equal(np.bincount(bucket_of(ids, rdy, issue_of, start), weights=sizes,
                                           minlength=len(ids)), nbytes[ids].astype(np.float64))
                for ids, _m, rdy, _b in per.values()):
            return sizes, "the trace's reducer shapes (ready order)"
        given = given[::-1]  # not this trace's buckets: treat as registration order
    try:
        sizes = np.asarray([int(x) for x in given], np.int64)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"overlap.bucket_mb: meta['ddp_param_bytes'] must list integers "
                          f"(the gradient bytes of each parameter), got {given!r:.80}") from exc
    n = len(weight)
    if len(sizes) != n or (sizes < 0).any():
        raise PolicyError(
            f"overlap.bucket_mb: meta['ddp_param_bytes'] lists {len(sizes)} parameter sizes "
            f"but the trace's DDP reducer copies {n} gradients per step; give the bytes of "
            "every parameter DDP reduces ([p.numel() * p.element_size() for p in "
            "model.parameters() if p.requires_grad]) or drop the key")
    rank_order = np.empty(n, np.int64)
    rank_order[np.argsort(weight, kind="stable")] = np.arange(n)
    candidates = (("exact sizes (reverse registration order)", sizes[::-1]),
                  ("exact sizes (in the order given)", sizes),
                  ("exact sizes (reverse registration order, reordered locally by copy time)",
                   local_order(sizes[::-1], weight)),
                  ("exact sizes (matched by copy time)", np.sort(sizes)[rank_order]))
    fits = [(source, cand) for source, cand in candidates
            if all(np.array_equal(np.bincount(bucket_of(ids, rdy, issue_of, start),
                                              weights=cand, minlength=len(ids)),
                                  nbytes[ids].astype(np.float64))
                   for ids, _m, rdy, _b in per.values())]
    if fits:
        # of the orders the old buckets allow (with one bucket: all of them), the first that
        # puts the fewest large gradients on short copies (a one-bucket trace of post-norm
        # transformer layers: norm1's gradients are ready after the FFN's, not before, as
        # reverse registration would have them); sizes sorted by copy time only when nothing
        # else fits (a few-byte parameter swaps with a few-KB one)
        slots = _big_slots(sizes[::-1], weight) if sizes.max() > 0 else None
        ordered = [f for f in fits if f[0] != candidates[-1][0]] or fits
        if slots is not None:
            miss = [_class_mismatch(c, slots) for _s, c in ordered]
            source, cand = ordered[int(np.argmin(miss))]
        else:
            source, cand = ordered[0]
        return cand.astype(np.float64), source
    # the list is not DDP's ready order in any of these forms (a model whose gradients become
    # ready out of reverse registration order, e.g. post-norm transformer layers): estimate
    # the sizes from the copy times instead of refusing, and say so
    return None, ("copy times (meta['ddp_param_bytes'] matched no ready order: the old "
                  "buckets' bytes differ from the sums of their parameters')")


#: how far (positions) the ready order may move a parameter from reverse registration order
#: (a module's parameters: a transformer layer has 12)
LOCAL_WINDOW = 8


def _large(sizes: np.ndarray) -> np.ndarray:
    """The large gradients: at least half the largest."""
    return sizes >= 0.5 * sizes.max()


def _big_slots(sizes: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Which ready-order positions copied a large gradient (at least half the largest
    size): as many as there are large sizes, those with the longest copy times. The step's
    first copy says nothing about its size (it is slow whatever it moves: 40 us for the
    4-byte head bias on the paired captures), so it counts as large only if the first size
    in reverse registration order is."""
    big = _large(sizes)
    w = weight.astype(np.float64).copy()
    w[0] = np.inf if big[0] else -np.inf
    out = np.zeros(len(sizes), bool)
    out[np.argsort(-w, kind="stable")[:int(big.sum())]] = True
    return out


def _class_mismatch(cand: np.ndarray, slots: np.ndarray) -> int:
    """Positions where an order puts a large gradient on a short copy or a small one on a
    long copy."""
    return int((_large(cand) != slots).sum())


def local_order(sizes: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """The sizes in reverse registration order, the large ones (at least half the largest)
    moved to the positions whose copies took longest (:func:`_big_slots`), each class kept
    in its order; unchanged if that moves one more than :data:`LOCAL_WINDOW` positions."""
    slots = _big_slots(sizes, weight)
    big = _large(sizes)
    out = np.empty_like(sizes)
    out[slots] = sizes[big]
    out[~slots] = sizes[~big]
    moved = np.abs(np.flatnonzero(slots) - np.flatnonzero(big))
    return out if (moved.max(initial=0) <= LOCAL_WINDOW) else sizes.copy()
