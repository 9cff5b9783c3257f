"""Pipeline schedules: the order in which one pipeline rank runs its forward/backward items.

An item is ``(is_backward, microbatch, chunk)``; ``chunk`` is the local model chunk (0 for
GPipe / 1F1B; ``0..v-1`` for interleaved and breadth-first, whose virtual stage is
``chunk * p + stage``). Orders follow Megatron-LM (``forward_backward_pipelining_without /
with_interleaving``) and Lamy-Poirier's breadth-first (looped) schedule.
"""

from __future__ import annotations

from ..errors import ConfigError

__all__ = ["stage_order", "bubble_fraction", "max_in_flight", "match_schedule", "Item"]

Item = tuple[bool, int, int]


def _one_f_one_b(p: int, m: int, stage: int) -> list[Item]:
    warm = min(p - stage - 1, m)
    out: list[Item] = [(False, i, 0) for i in range(warm)]
    steady = m - warm
    for j in range(steady):
        out.append((False, warm + j, 0))
        out.append((True, j, 0))
    out.extend((True, j, 0) for j in range(steady, m))
    return out


def _interleaved(p: int, m: int, v: int, stage: int) -> list[Item]:
    total = m * v

    def fwd(k: int) -> Item:
        g = k % (p * v)
        return (False, (k // (p * v)) * p + k % p, g // p)

    def bwd(k: int) -> Item:
        g = k % (p * v)
        return (True, (k // (p * v)) * p + k % p, v - 1 - g // p)

    if m == p:
        warm = total
    else:
        warm = min((p - stage - 1) * 2 + (v - 1) * p, total)
    out = [fwd(k) for k in range(warm)]
    steady = total - warm
    for j in range(steady):
        out.append(fwd(warm + j))
        out.append(bwd(j))
    out.extend(bwd(j) for j in range(steady, total))
    return out


def stage_order(schedule: str, p: int, m: int, v: int, stage: int) -> list[Item]:
    """Items run by pipeline rank ``stage`` in program order.

    Parameters
    ----------
    schedule : {"gpipe", "1f1b", "interleaved", "bfs"}
    p, m, v : int
        Pipeline ranks, micro-batches per step, model chunks per rank.
    stage : int
        0-based pipeline rank.
    """
    if schedule == "gpipe":
        if v != 1:
            raise ConfigError(f"gpipe schedule with chunks={v}; use chunks=1")
        return [(False, i, 0) for i in range(m)] + [(True, i, 0) for i in range(m)]
    if schedule == "1f1b":
        if v != 1:
            raise ConfigError(f"1f1b schedule with chunks={v}; use interleaved for chunks>1")
        return _one_f_one_b(p, m, stage)
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
    raise ConfigError(f"unknown schedule {schedule!r}; use gpipe, 1f1b, interleaved or bfs")


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
    """Most (micro-batch, chunk) activations alive at once: forwarded, not yet backwarded."""
    live = peak = 0
    for is_bwd, _, _ in order:
        live += -1 if is_bwd else 1
        peak = max(peak, live)
    return peak


def bubble_fraction(schedule: str, p: int, m: int, v: int = 1) -> float:
    """Closed-form idle fraction of the step on uniform stages with free communication.

    GPipe / 1F1B: ``(p-1)/(m+p-1)``. Interleaved / breadth-first: the bubble is ``(p-1)/(v m)``
    of the ideal time, i.e. ``(p-1)/(v m + p - 1)`` of the step.
    """
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    return (p - 1) / (v * m + p - 1)
