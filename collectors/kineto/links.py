"""Kineto: one file's events -> columns of one rank (:class:`EventLoop`), then the rank's
lanes, ops and inferred dependencies (:func:`collectors.kineto.assemble.assemble`).

Dependencies inferred (DESIGN.md §3), all with ``dst.start >= src.end + lag_ns``:

- LAUNCH: runtime call -> the GPU op with the same ``correlation``;
  ``lag = min(0, gpu.start - call.end)`` (a kernel may start before its launch returns).
- SYNC: ``cuda_sync`` events (Stream Wait Event: last op on the recording stream issued
  before the ``cudaEventRecord`` -> first op on the waiting stream issued after the wait;
  Event Sync / Stream Sync / Context Sync: the GPU op waited for -> the host op right after
  the blocking call). Traces without ``cuda_sync`` events: blocking calls
  (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ``cudaEventSynchronize``,
  ``cudaMemcpy``, and any launch call that returns after its GPU op ended) -> edge from the
  latest GPU op issued before the call that ended before the call returned; a
  ``cudaStreamWaitEvent`` -> the next op launched from that thread waits for the op most
  recently issued to another stream of the same device (kept only when the measured times
  agree: that op ended before the waiting op started).
  CUPTI correlation ids grow in issue order, which is what "issued before" uses.
  ``lag = min(0, measured gap)``.
- HOST_ORDER: consecutive leaf host ops on one thread, ``lag`` = the measured gap (>= 0).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from ..enums import OpKind
from ..errors import TraceFormatError
from ..kernel_classes import is_comm_kernel
from ..trace import StringTable
from .assemble import assemble
from .deps import COMM_RANGE
from .drift import coerce_args, coerce_time
from .schema import (
    C_ANNOT,
    C_KERNEL,
    C_MEMSET,
    C_OTHER,
    C_RUNTIME,
    C_TRACE,
    CAT_CODE,
    DROP_PH,
    H_ANNOT,
    H_GLOO,
    KNOWN_PH,
    NOARGS,
    RankPart,
    drop_cat_reason,
    rank_and_source_from_name,
)

__all__ = ["build_rank_part"]


def _ns(ts: float, base: int) -> int:
    """Microseconds (float, maybe epoch-sized) -> integer ns without float rounding loss."""
    ti = int(ts)
    return base + ti * 1000 + int(round((ts - ti) * 1000.0))


def _ns_arr(ts: list, base: int) -> np.ndarray:
    t = np.asarray(ts, np.float64)
    ti = np.floor(t)
    return base + ti.astype(np.int64) * 1000 + np.rint((t - ti) * 1000.0).astype(np.int64)


def _dur_arr(dur: list) -> np.ndarray:
    return np.maximum(np.rint(np.asarray(dur, np.float64) * 1000.0).astype(np.int64), 0)


def build_rank_part(path: Path, doc, chunks=None) -> RankPart:
    """Columns of one rank from ``doc`` (a decoded file) or from ``chunks``.

    ``chunks`` is an iterable of ``(index of first event, list of events)`` (large files are
    decoded piece by piece so that only one piece of event objects is alive at a time);
    ``None`` means ``doc.traceEvents`` in one piece. Events needed after the pass (sync
    events, collectives, communication annotations) are kept by index in ``loop.keep``.
    """
    if doc.retimeExport is not None:
        from .export import build_export_part
        return build_export_part(path, doc)
    if chunks is None:
        chunks = [(0, doc.traceEvents)]
    loop = EventLoop(path)
    for off, evs in chunks:
        loop.n_events += len(evs)
        loop.feed(enumerate(evs, off))
        loop.flush()
    return finish_part(path, doc, loop)


def finish_part(path: Path, doc, loop: EventLoop) -> RankPart:
    """The rank's RankPart once every event went through ``loop`` (or into its parts)."""
    base = int(doc.baseTimeNanoseconds or 0)
    G, H, GR, syncs, mem, window = loop.finish(base)
    loop.kept["ops"] += len(G["idx"])  # GPU ops (host ops are counted after nesting)
    dist = doc.distributedInfo
    rank = dist.rank if dist is not None and dist.rank is not None else None
    rank_source = "distributedInfo"
    if rank is None:
        rank, rank_source = rank_and_source_from_name(path)
    if rank is None:
        rank, rank_source = 0, "default (single file)"

    part = assemble(path, doc, rank, rank_source, loop.strings, loop.kept, loop.dropped,
                     loop.thread_names, G, H, GR, syncs, mem, window, loop.keep, loop.n_events)
    if loop.coerced:  # values decoded from known format drift, by field (.drift)
        part.accounting["coerced"] = dict(sorted(loop.coerced.items()))
    return part


class EventLoop:
    """The general per-event path: decoded (msgspec) events -> rows, flushed to columns.

    Timestamps are kept relative to the file's ``baseTimeNanoseconds`` until
    :meth:`finish` (a file may give the base after its events). The fast scanner of
    :mod:`collectors.kineto.scan` adds its column parts to :attr:`parts` and feeds only the
    events it does not model itself, so the two paths share every rule.
    """

    def __init__(self, path: Path):
        self.path = path
        self.strings = StringTable()
        self.comm_flag: list[bool] = []  # per name id: a communication annotation
        self.comm_kernel: list[bool] = []  # per name id: a communication kernel name
        self.keep: dict[int, object] = {}
        self.n_events = 0
        self.kept: Counter = Counter()
        self.dropped: Counter = Counter()
        self.coerced: Counter = Counter()  # values decoded from known drift (.drift)
        self.thread_names: dict = {}
        # one tuple per event (one append), columns made per piece in flush()
        self.g_rows: list[tuple] = []  # GPU ops: dev, stream, kind, name, ts, dur, corr, ext, bytes, idx
        self.h_rows: list[tuple] = []  # host events: pid, tid, code, name, ts, dur, corr, ext, idx
        self.gr_rows: list[tuple] = []  # gpu ranges: dev, stream, name, ts, dur, idx
        self.syncs: list[int] = []
        self.mem: list[tuple] = []  # dev, ts_ns, bytes, allocated, reserved, idx
        self.mem_parts: list[np.ndarray] = []  # the same as (n, 6) int64 blocks
        self.window: tuple | None = None  # (idx, start_ns, end_ns) of the last Trace event
        self.be_stack: dict = {}
        self.cat_code = dict(CAT_CODE)
        self.parts: list[tuple[dict, dict, dict]] = []
        self.sorted = True  # False once parts may interleave (fast + general paths)

    def intern(self, name: str) -> int:
        nid = self.strings.intern(name)
        if nid == len(self.comm_flag):
            self.comm_flag.append(bool(COMM_RANGE.match(name)))
            self.comm_kernel.append(is_comm_kernel(name))
        return nid

    def feed(self, pairs) -> None:  # noqa: C901 - one pass over the events
        """Consume ``(event index, event)`` pairs."""
        path = self.path
        keep, kept, dropped = self.keep, self.kept, self.dropped
        g_add, h_add, gr_add = self.g_rows.append, self.h_rows.append, self.gr_rows.append
        ids_get = self.strings._ids.get
        intern, comm_flag, cat_code = self.intern, self.comm_flag, self.cat_code
        be_stack = self.be_stack
        coerced = self.coerced
        for i, e in pairs:
            ph = e.ph
            if ph == "X":
                ts, dur = e.ts, e.dur
                if ts.__class__ is str or dur.__class__ is str:
                    ts, dur = self._times(e, i)
                if ts is None:
                    raise TraceFormatError(f"{path}: event {i} ('{e.name}'): missing 'ts'; "
                                           "complete events need ts and dur in microseconds")
                code = cat_code.get(e.cat)
                if code is None:
                    code = cat_code[e.cat] = CAT_CODE.get((e.cat or "").lower(), C_OTHER)
                if dur is None or dur < 0:
                    if code == C_TRACE and dur is None:
                        kept["markers"] += 1
                        continue
                    what = "missing 'dur'" if dur is None else f"negative dur {dur}"
                    raise TraceFormatError(f"{path}: event {i} ('{e.name}', cat {e.cat}): {what}; "
                                           "complete (ph X) events need a duration >= 0 in "
                                           "microseconds — fix or remove the event")
                name = e.name
                if name.__class__ is not str:
                    name = str(name)
                nid = ids_get(name)
                if nid is None:
                    nid = intern(name)
                a = e.args or NOARGS
                if (a.correlation.__class__ is str or a.stream.__class__ is str
                        or a.device.__class__ is str or a.external_id.__class__ is str):
                    coerce_args(a, coerced, path, i)
                if code <= C_MEMSET:  # GPU op
                    dev = a.device if a.device is not None else e.pid
                    st = a.stream if a.stream is not None else e.tid
                    if dev.__class__ is not int or st.__class__ is not int:
                        dropped["GPU event without integer device/stream"] += 1
                        continue
                    k = code
                    if k == C_KERNEL and self.comm_kernel[nid]:
                        k = int(OpKind.COLLECTIVE)
                        coerce_args(a, coerced, path, i)
                        keep[i] = e
                    b = a.bytes
                    if b is None:
                        b = 0
                    elif b.__class__ is str:
                        b = int(b) if b.isdigit() else 0
                    g_add((dev, st, k, nid, ts, dur, a.correlation, a.external_id, int(b), i))
                    continue
                if code <= C_ANNOT:  # host event
                    hc = code - C_RUNTIME  # H_RUNTIME, H_CPU or H_ANNOT
                    if hc == H_ANNOT and name.startswith("gloo:"):
                        hc = H_GLOO
                    if hc == H_GLOO or comm_flag[nid]:
                        coerce_args(a, coerced, path, i)
                        keep[i] = e
                    h_add((e.pid, e.tid, hc, nid, ts, dur, a.correlation, a.external_id, i))
                    continue
                cat = (e.cat or "").lower()
                if cat == "cuda_sync":
                    coerce_args(a, coerced, path, i)
                    self.syncs.append(i)
                    keep[i] = e
                    kept["sync_events"] += 1
                    continue
                if cat == "gpu_user_annotation":
                    dev = a.device if a.device is not None else e.pid
                    st = a.stream if a.stream is not None else e.tid
                    gr_add((dev if isinstance(dev, int) else -1, st if isinstance(st, int) else -1,
                            intern(name), ts, dur, i))
                    kept["ranges"] += 1
                    continue
                if cat == "trace":
                    t0 = _ns(ts, 0)
                    if self.window is None or i > self.window[0]:
                        self.window = (i, t0, t0 + int(round(dur * 1000.0)))
                    kept["markers"] += 1
                    continue
                dropped[drop_cat_reason(e.cat)] += 1
            elif ph == "M":
                if e.name in ("thread_name", "process_name", "process_labels") and e.args is not None:
                    key = (e.pid, e.tid if e.name == "thread_name" else None)
                    val = e.args.name if e.args.name is not None else e.args.labels
                    if val is not None:  # the first name wins (Kineto may repeat a tid
                        self.thread_names.setdefault((e.name, key), val)  # later as "python")
                kept["metadata"] += 1
            elif ph in ("s", "f", "t"):
                kept["flows"] += 1
            elif ph in ("i", "I"):
                a = e.args
                if e.name == "[memory]" and a is not None and e.ts is not None:
                    coerce_args(a, coerced, path, i)
                    if e.ts.__class__ is str:
                        e.ts = coerce_time(e.ts, "ts", coerced, path, i, e.name)
                    dev = a.dev_id if (a.dev_type or 0) != 0 and a.dev_id is not None else -1
                    self.mem.append((dev, _ns(e.ts, 0), int(a.mem_bytes or 0),
                                     -1 if a.total_alloc is None else int(a.total_alloc),
                                     -1 if a.total_reserved is None else int(a.total_reserved), i))
                    kept["memory"] += 1
                else:
                    kept["markers"] += 1
            elif ph in ("B", "E"):
                key = (e.pid, e.tid)
                if e.ts.__class__ is str:
                    e.ts = coerce_time(e.ts, "ts", coerced, path, i, e.name)
                if e.ts is None:
                    raise TraceFormatError(f"{path}: event {i} ('{e.name}'): missing 'ts'")
                if ph == "B":
                    be_stack.setdefault(key, []).append((i, e))
                elif be_stack.get(key):
                    _, b = be_stack[key].pop()
                    bn = intern(b.name if isinstance(b.name, str) else str(b.name))
                    if comm_flag[bn]:
                        keep[i] = b
                    h_add((b.pid, b.tid, H_ANNOT, bn, b.ts, max(0.0, e.ts - b.ts), -1, -1, i))
                    kept["metadata"] += 1  # the E event; the B event is counted with the range
                else:
                    dropped["E event without matching B"] += 1
            elif ph in DROP_PH:
                dropped[DROP_PH[ph]] += 1
            elif ph is None:
                raise TraceFormatError(f"{path}: event {i} ('{e.name}'): missing 'ph'; every trace "
                                       "event needs a phase (X for complete events)")
            else:
                if ph not in KNOWN_PH:
                    raise TraceFormatError(
                        f"{path}: event {i} ('{e.name}'): unknown ph {ph!r}; the Chrome trace format "
                        "knows X B E i I s t f M C b e n O N D P R — fix or remove the event")
                dropped[f"ph {ph} events are not used"] += 1

    def _times(self, e, i: int) -> tuple:
        """``ts``/``dur`` of an event that writes them as strings (coerced, counted)."""
        if e.ts.__class__ is str:
            e.ts = coerce_time(e.ts, "ts", self.coerced, self.path, i, e.name)
        if e.dur.__class__ is str:
            e.dur = coerce_time(e.dur, "dur", self.coerced, self.path, i, e.name)
        return e.ts, e.dur

    def flush(self) -> None:
        """Turn the rows fed so far into a column part (exact integer ns, relative to base)."""
        if self.g_rows or self.h_rows or self.gr_rows or not self.parts:
            self.parts.append(_flush(self.g_rows, self.h_rows, self.gr_rows))

    def finish(self, base: int):
        """Concatenated columns (absolute ns) and the other per-event results."""
        for stack in self.be_stack.values():
            self.dropped["B event without matching E"] += len(stack)
        self.be_stack = {}
        if not self.parts:
            self.flush()
        G, H, GR = ({k: np.concatenate([p[j][k] for p in self.parts]) for k in self.parts[0][j]}
                    for j in range(3))
        self.parts = []
        if not self.sorted:  # restore event order (what the general path alone produces)
            for d in (G, H, GR):
                idx = d["idx"]
                if len(idx) > 1 and not (idx[1:] > idx[:-1]).all():
                    o = np.argsort(idx, kind="stable")
                    for k in d:
                        d[k] = d[k][o]
        if base:
            for d, cols in ((G, ("start",)), (H, ("start", "end")), (GR, ("start", "end"))):
                for c in cols:
                    d[c] = d[c] + base
        mem = np.asarray(self.mem, dtype=np.int64).reshape(-1, 6)
        if self.mem_parts:
            mem = np.concatenate([mem, *self.mem_parts])
        mem = mem[np.argsort(mem[:, 5], kind="stable")]
        mem[:, 1] += base
        syncs = sorted(self.syncs)
        window = None if self.window is None else (self.window[1] + base, self.window[2] + base)
        return G, H, GR, syncs, mem[:, :5], window


def _flush(g_rows, h_rows, gr_rows) -> tuple[dict, dict, dict]:
    """Turn one piece's rows into column arrays (exact integer ns) and empty the lists."""
    gc_ = list(zip(*g_rows)) if g_rows else [()] * 10
    G = dict(dev=np.asarray(gc_[0], np.int64), stream=np.asarray(gc_[1], np.int64),
             kind=np.asarray(gc_[2], np.int8), name=np.asarray(gc_[3], np.int32),
             start=_ns_arr(gc_[4], 0), dur=_dur_arr(gc_[5]), corr=np.asarray(gc_[6], np.int64),
             ext=np.asarray(gc_[7], np.int64), bytes=np.asarray(gc_[8], np.int64),
             idx=np.asarray(gc_[9], np.int64))
    hc_ = list(zip(*h_rows)) if h_rows else [()] * 9
    pid, tid = _ids(hc_[0], len(h_rows)), _ids(hc_[1], len(h_rows))
    hs = _ns_arr(hc_[4], 0)
    H = dict(pid=pid, tid=tid, code=np.asarray(hc_[2], np.int8), name=np.asarray(hc_[3], np.int32),
             start=hs, end=hs + _dur_arr(hc_[5]), corr=np.asarray(hc_[6], np.int64),
             ext=np.asarray(hc_[7], np.int64), idx=np.asarray(hc_[8], np.int64))
    rc_ = list(zip(*gr_rows)) if gr_rows else [()] * 6
    grs = _ns_arr(rc_[3], 0)
    GR = dict(dev=np.asarray(rc_[0], np.int64), stream=np.asarray(rc_[1], np.int64),
              name=np.asarray(rc_[2], np.int32), start=grs, end=grs + _dur_arr(rc_[4]),
              idx=np.asarray(rc_[5], np.int64))
    for lst in (g_rows, h_rows, gr_rows):
        lst.clear()
    return G, H, GR


def _ids(vals, n: int) -> np.ndarray:
    """pid / tid values: int64 when all are integers, else objects (names like "Spans")."""
    if all(v.__class__ is int for v in vals):
        try:
            return np.asarray(vals, np.int64).reshape(n)
        except OverflowError:  # ids beyond int64: keep them as Python ints
            pass
    out = np.empty(n, object)
    out[:] = vals
    return out
