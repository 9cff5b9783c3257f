"""Pipeline schedules: the order in which one pipeline rank runs its forward/backward items.

An item is ``(phase, microbatch, chunk)``. ``phase`` is :data:`F` (forward), :data:`B` (the
whole backward: input and weight gradients), :data:`BI` (the input-gradient half of a split
backward) or :data:`W` (the weight-gradient half, run later); ``F`` and ``B`` equal ``False``
and ``True``, so the orders of the classic schedules read as ``(is_backward, mb, chunk)``.
``chunk`` is the local model chunk: 0 for GPipe / 1F1B / ZB-H1, ``0..v-1`` for interleaved and
breadth-first (virtual stage ``chunk * p + stage``), and the direction (0: rank 0 -> p-1,
1: rank p-1 -> 0) for DualPipe.

Orders follow Megatron-LM (``forward_backward_pipelining_without / with_interleaving``),
Lamy-Poirier's breadth-first (looped) schedule, the zero-bubble ZB-H1 schedule (Qi et al.,
ICLR 2024) and DeepSeek's DualPipe (DeepSeek-V3 technical report, section 3.2.1).

Closed forms (uniform stages, free communication; ``F``, ``B``, ``W`` the per-micro-batch
times of one stage's forward, input-gradient and weight-gradient passes; :func:`bubble_time`):

* GPipe / 1F1B: each stage idles ``(p-1)(F+B+W)``: the fraction ``(p-1)/(m+p-1)``.
* interleaved / breadth-first (``v`` chunks of ``1/v`` of the stage each):
  ``(p-1)(F+B+W)/v``, the fraction ``(p-1)/(vm+p-1)``.
* ZB-H1 (the backward split: the input gradient ``B`` is sent upstream as soon as it is
  computed, the weight gradient ``W`` deferred to fill waits; 1F1B's ``p - i`` in-flight
  micro-batches on stage ``i``): the backward wave crosses a stage in ``B`` instead of
  ``B+W``. The last stage starts after ``(p-1)F`` and never waits again; the first stage
  waits ``(p-1)B`` for its first gradient and fills the cool-down's waits with deferred
  ``W``. With the paper's ``F = B = W`` the idle time is ``(p-1)(F+B-W) = (p-1)F``, one
  third of 1F1B's ``(p-1)(F+B+W)``; the order is built for those unit costs
  (:func:`_zb_h1_all`) and run with the real ones.
* DualPipe: the DeepSeek-V3 report gives ``(p/2-1)(F&B + B - 3W)`` (``B`` the whole
  backward there, ``F&B`` a forward and a backward chunk run overlapped); with free
  communication (``F&B = F + B``) and equal ``F = B_in = W`` this order idles
  ``(p/2-1)(F + B_in - W)``, below the report's bound. It keeps two copies of the
  parameters and ``p+1`` micro-batches of activations.

GPipe keeps ``m`` micro-batches of activations alive, 1F1B and ZB-H1 ``min(p-i, m)`` on stage
``i`` (:func:`max_in_flight` counts them from the order).
"""

from __future__ import annotations

from functools import lru_cache

from ..errors import ConfigError

__all__ = ["stage_order", "bubble_fraction", "bubble_time", "max_in_flight",
           "match_schedule", "overlapped_pairs", "call_after", "Item", "F", "B", "W", "BI",
           "SCHEDULES", "SPLIT_BACKWARD", "SYNC_SCHEDULES"]

Item = tuple[int, int, int]

#: item phases
F, B, W, BI = 0, 1, 2, 3
SCHEDULES = ("gpipe", "1f1b", "interleaved", "bfs", "zb-h1", "dualpipe")
#: schedules whose backward is split into input-gradient and weight-gradient items
SPLIT_BACKWARD = ("zb-h1", "dualpipe")
#: schedules whose pipeline send / receive can be blocking calls (``p2p = "sync"``); the
#: others deadlock that way (breadth-first) or overlap by design (ZB-H1, DualPipe)
SYNC_SCHEDULES = ("gpipe", "1f1b", "interleaved")


def _one_f_one_b(p: int, m: int, stage: int) -> list[Item]:
    warm = min(p - stage - 1, m)
    out: list[Item] = [(False, i, 0) for i in range(warm)]
    steady = m - warm
    for j in range(steady):
        out.append((False, warm + j, 0))
        out.append((True, j, 0))
    out.extend((True, j, 0) for j in range(steady, m))
    return out


@lru_cache(maxsize=64)
def _zb_h1_all(p: int, m: int) -> tuple[tuple[Item, ...], ...]:
    """ZB-H1 orders of all ``p`` stages: a greedy list schedule with the paper's unit costs
    (``F = B = W``): each stage runs, among what it can start earliest, an input-gradient
    pass first, then a forward, then a deferred weight-gradient pass, with at most ``p - i``
    micro-batches forwarded but not yet through their input-gradient pass on stage ``i``
    (1F1B's activation memory). Weight gradients thus fill the time a stage would wait for
    the next gradient, mostly in the cool-down."""
    t = [0.0] * p
    f_end = [[-1.0] * m for _ in range(p)]
    b_end = [[-1.0] * m for _ in range(p)]
    nf, nb = [0] * p, [0] * p
    pend: list[list[int]] = [[] for _ in range(p)]
    orders: list[list[Item]] = [[] for _ in range(p)]
    for _ in range(3 * m * p):
        best = None
        for s in range(p):
            cands = []
            j = nb[s]
            if j < nf[s]:
                rdy = b_end[s + 1][j] if s < p - 1 else f_end[s][j]
                if rdy >= 0:
                    cands.append((max(t[s], rdy), 0))
            if nf[s] < m and nf[s] - nb[s] < p - s:
                rdy = f_end[s - 1][nf[s]] if s > 0 else 0.0
                if rdy >= 0:
                    cands.append((max(t[s], rdy), 1))
            if pend[s]:
                cands.append((t[s], 2))
            if cands:
                c = min(cands)
                if best is None or (c[0], s) < (best[0][0], best[1]):
                    best = (c, s)
        (start, kind), s = best
        if kind == 0:
            j = nb[s]
            nb[s] += 1
            b_end[s][j] = start + 1
            pend[s].append(j)
            orders[s].append((BI, j, 0))
        elif kind == 1:
            i = nf[s]
            nf[s] += 1
            f_end[s][i] = start + 1
            orders[s].append((F, i, 0))
        else:
            orders[s].append((W, pend[s].pop(0), 0))
        t[s] = start + 1
    return tuple(tuple(o) for o in orders)


def _interleaved(p: int, m: int, v: int, stage: int) -> list[Item]:
    total = m * v

    def fwd(k: int) -> Item:
        g = k % (p * v)
        return (False, (k // (p * v)) * p + k % p, g // p)

    def bwd(k: int) -> Item:
        g = k % (p * v)
        return (True, (k // (p * v)) * p + k % p, v - 1 - g // p)

    warm = _interleaved_warmup(p, m, v, stage)
    out = [fwd(k) for k in range(warm)]
    steady = total - warm
    for j in range(steady):
        out.append(fwd(warm + j))
        out.append(bwd(j))
    out.extend(bwd(j) for j in range(steady, total))
    return out


def _dualpipe(p: int, m: int, stage: int) -> tuple[list[Item], list[int]]:
    """DualPipe's eight steps (DeepSeek-V3 report, Figure 5) on rank ``stage``.

    Each rank holds the stage ``stage`` of the direction-0 pipeline (micro-batches
    ``0..m/2-1`` flow from rank 0 to rank p-1) and the stage ``p-1-stage`` of the direction-1
    pipeline (micro-batches ``m/2..m-1`` flow back). ``h = min(stage, p-1-stage)``; local
    phase 0 is the direction that starts on this rank's half. Steps: ``2(p/2-h-1)`` F0;
    ``h+1`` x (F0, F1); ``p/2-h-1`` x (B1 split, W, F1); ``m/2-p+h+1`` x (F0&B1, F1&B0)
    overlapped pairs (the middle ranks run their first pair one after the other);
    ``p/2-h-1`` x (B1, F1&B0); ``h+1`` x (B1, B0), the second half of them split;
    ``p/2-h-1`` x (W, B0 split); ``h+1`` x W. A split backward's weight gradient waits in a
    FIFO for the next W item.

    Returns the items and the positions ``k`` where items ``k`` and ``k+1`` run overlapped.
    """
    half, hm = p // 2, m // 2
    h = min(stage, p - 1 - stage)
    second = stage >= half
    nxt = {0: 0, 1: 0}  # next forward / backward micro-batch per direction
    nbk = {0: 0, 1: 0}
    pending: list[tuple[int, int]] = []  # split backwards waiting for their W
    out: list[Item] = []
    pairs: list[int] = []

    def d(phase: int) -> int:
        return phase ^ int(second)

    def fwd(ph: int) -> Item:
        di = d(ph)
        it = (F, di * hm + nxt[di], di)
        nxt[di] += 1
        return it

    def bwd(ph: int, split: bool = False) -> Item:
        di = d(ph)
        mb = di * hm + nbk[di]
        nbk[di] += 1
        if split:
            pending.append((mb, di))
            return (BI, mb, di)
        return (B, mb, di)

    def wgt() -> Item:
        mb, di = pending.pop(0)
        return (W, mb, di)

    def pair(fph: int, bph: int) -> None:
        pairs.append(len(out))
        out.extend([fwd(fph), bwd(bph)])

    out += [fwd(0) for _ in range(2 * (half - h - 1))]
    for _ in range(h + 1):
        out += [fwd(0), fwd(1)]
    for _ in range(half - h - 1):
        out.append(bwd(1, split=True))
        out.append(wgt())
        out.append(fwd(1))
    for i in range(hm - p + h + 1):
        if i == 0 and h == half - 1:  # middle ranks: no overlap for the first pair
            out += [fwd(0), bwd(1)]
        else:
            pair(0, 1)
        pair(1, 0)
    for _ in range(half - h - 1):
        out.append(bwd(1))
        pair(1, 0)
    zb = False
    for i in range(h + 1):
        if i == (h + 1) // 2 and h % 2 == 1:
            zb = True
        out.append(bwd(1, split=zb))
        if i == (h + 1) // 2 and h % 2 == 0:
            zb = True
        out.append(bwd(0, split=zb))
    for _ in range(half - h - 1):
        out.append(wgt())
        out.append(bwd(0, split=True))
    for _ in range(h + 1):
        out.append(wgt())
    return out, pairs


def _check_dualpipe(p: int, m: int) -> None:
    if p % 2 or p < 2:
        raise ConfigError(f"dualpipe schedule needs an even pp >= 2 (got pp={p})")
    if m % 2 or m < 2 * p:
        raise ConfigError(f"dualpipe schedule needs an even number of micro-batches >= 2*pp "
                          f"(got {m} with pp={p}); raise the global batch")


def stage_order(schedule: str, p: int, m: int, v: int, stage: int) -> list[Item]:
    """Items run by pipeline rank ``stage`` in program order.

    Parameters
    ----------
    schedule : {"gpipe", "1f1b", "interleaved", "bfs", "zb-h1", "dualpipe"}
    p, m, v : int
        Pipeline ranks, micro-batches per step, model chunks per rank (1 for zb-h1;
        dualpipe's two directions are its chunks, ``v`` must be 1).
    stage : int
        0-based pipeline rank.
    """
    if schedule in ("gpipe", "1f1b", "zb-h1", "dualpipe") and v != 1:
        raise ConfigError(f"{schedule} schedule with chunks={v}; use chunks=1"
                          + (" (interleaved takes chunks > 1)" if schedule == "1f1b" else ""))
    if schedule == "gpipe":
        return [(False, i, 0) for i in range(m)] + [(True, i, 0) for i in range(m)]
    if schedule == "1f1b":
        return _one_f_one_b(p, m, stage)
    if schedule == "zb-h1":
        return list(_zb_h1_all(p, m)[stage])
    if schedule == "dualpipe":
        _check_dualpipe(p, m)
        return _dualpipe(p, m, stage)[0]
    if schedule == "interleaved":
        if p > 1 and m % p:
            raise ConfigError(f"interleaved schedule: micro-batches m={m} must be a multiple "
                              f"of pp={p}")
        return _interleaved(p, m, v, stage)
    if schedule == "bfs":
        out: list[Item] = []
        for c in range(v):
            out.extend((False, i, c) for i in range(m))
        for c in reversed(range(v)):
            out.extend((True, i, c) for i in range(m))
        return out
    raise ConfigError(f"unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}")


def overlapped_pairs(schedule: str, p: int, m: int, stage: int) -> list[int]:
    """Positions ``k`` of :func:`stage_order` whose items ``k`` (a forward) and ``k+1`` (a
    backward of the other direction) run overlapped (DualPipe's F&B pairs); empty for the
    other schedules."""
    if schedule != "dualpipe":
        return []
    _check_dualpipe(p, m)
    return _dualpipe(p, m, stage)[1]


def _interleaved_warmup(p: int, m: int, v: int, stage: int) -> int:
    total = m * v
    return total if m == p else min((p - stage - 1) * 2 + (v - 1) * p, total)


def call_after(schedule: str, order: list[Item], p: int = 1, m: int = 1, v: int = 1,
               stage: int = 0) -> list[bool]:
    """Where a rank calls its blocking pipeline send/receive (``p2p = "sync"``): after item
    ``k`` when ``call_after(...)[k]``. Megatron-LM sends and receives in one batched call
    after every item, except in the interleaved schedule's steady state, where one call
    follows each (forward, backward) pair: the forward's output leaves only after the
    backward that follows it (``send_forward_backward_recv_forward_backward``)."""
    out = [True] * len(order)
    if schedule == "interleaved":
        warm = _interleaved_warmup(p, m, v, stage)
        steady = m * v - warm
        for j in range(steady):
            out[warm + 2 * j] = False
    return out


def match_schedule(sequences: list[tuple[int, list[Item]]], p: int, m: int,
                   v: int) -> tuple[str, float]:
    """The schedule whose program order matches the most measured item sequences.

    ``sequences`` holds ``(stage, items in program order)`` of pipeline ranks (one per rank
    and step, say). Candidates: GPipe and 1F1B with one chunk, interleaved and breadth-first
    with several. Returns the best one and the fraction of sequences it matches exactly, or
    ``("unknown", 0.0)`` when none matches any.
    """
    if not sequences:
        return "unknown", 0.0
    cands = ("1f1b", "gpipe") if v == 1 else ("interleaved", "bfs")
    score = dict.fromkeys(cands, 0)
    for sched in cands:
        ref: dict[int, list[Item]] = {}
        for stage, items in sequences:
            if stage not in ref:
                try:
                    ref[stage] = stage_order(sched, p, m, v, stage)
                except ConfigError:  # impossible for this m (interleaved needs m % p == 0)
                    ref[stage] = []
            score[sched] += items == ref[stage]
    best = max(cands, key=lambda c: score[c])
    if not score[best]:
        return "unknown", 0.0
    return best, score[best] / len(sequences)


def max_in_flight(order: list[Item]) -> int:
    """Most (micro-batch, chunk) activations alive at once: forwarded, not yet through
    their (input-gradient) backward. A weight-gradient item frees nothing more."""
    live = peak = 0
    for phase, _, _ in order:
        if phase == F:
            live += 1
        elif phase in (B, BI):
            live -= 1
        peak = max(peak, live)
    return peak


def bubble_time(schedule: str, p: int, m: int, v: int = 1, f: float = 1.0, b: float = 2.0,
                w: float = 0.0) -> float:
    """Closed-form idle time of the busiest stage (see the module docstring).

    ``f``, ``b``, ``w`` are one stage's forward, input-gradient and weight-gradient times per
    micro-batch (whole stage: ``v`` chunks together); for schedules that do not split the
    backward only ``b + w`` matters. DualPipe's is the report's formula with ``F&B = f+b+w``
    (no communication to hide), an upper bound of the order's idle time.
    """
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) * (f + b + w)
    if schedule in ("interleaved", "bfs"):
        return (p - 1) * (f + b + w) / v
    if schedule == "zb-h1":
        return (p - 1) * (f + b - w)
    if schedule == "dualpipe":
        return (p / 2 - 1) * ((f + b + w) + (b + w) - 3 * w)
    raise ConfigError(f"unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}")


def bubble_fraction(schedule: str, p: int, m: int, v: int = 1) -> float:
    """Closed-form idle fraction of the step on uniform stages with free communication.

    GPipe / 1F1B: ``(p-1)/(m+p-1)``. Interleaved / breadth-first: the bubble is ``(p-1)/(v m)``
    of the ideal time, i.e. ``(p-1)/(v m + p - 1)`` of the step. Other schedules depend on
    the forward / backward split: use :func:`bubble_time`.
    """
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if schedule in ("interleaved", "bfs"):
        return (p - 1) / (v * m + p - 1)
    raise ConfigError(f"bubble_fraction({schedule!r}) depends on the stage times; use "
                      "bubble_time(schedule, p, m, v, f, b, w)")
