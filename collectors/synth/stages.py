"""Pipeline stages: which layers each virtual stage holds, where it runs, who its neighbours
are, and the choice of uneven splits (``parallel.stage_layers``).

Virtual stages (model chunks) are numbered along the pipeline chain(s). Interleaved and
breadth-first schedules: chunk ``c`` of pipeline rank ``s`` is virtual stage ``c * p + s``
and one chain runs through all ``p * v`` of them (the last rank's chunk ``c`` feeds the first
rank's chunk ``c + 1``). DualPipe: two chains of ``p`` stages each over the same layers, the
first from rank 0 to rank ``p-1`` (virtual stages ``0..p-1``), the second back from rank
``p-1`` to rank 0 (virtual stages ``p..2p-1``): rank ``s`` holds stage ``s`` of the first and
stage ``p-1-s`` of the second, so every layer's parameters live on two ranks.

Uneven stages (DawnPiper-style repartitioning): ``stage_layers`` gives the layers of each
stage of one chain, in order. ``"time"`` picks the split that minimizes the slowest stage's
time per micro-batch (forward + backward of its layers, plus the embedding on the first and
the head on the last stage); ``"memory"`` the split that minimizes the largest stage's peak
memory among the splits whose step-time estimate (the 1F1B makespan
``sum_i t_i + (m - 1) max_i t_i``) is within ``stage_slack`` of the time split's. Both are
exact min-max partitions of the layer sequence (dynamic programming), so they handle layers
of different cost (a MoE model's leading dense layers, say).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from ..errors import ConfigError
from .blocks import VStage

__all__ = ["PipelineLayout", "pipeline_layout", "even_split", "balanced_splits",
           "makespan_ns"]


@dataclass(frozen=True)
class PipelineLayout:
    """Virtual stages of a step: ``vstages[i]`` (layers, chain neighbours) and the pipeline
    rank ``rank_of[i]`` running it; ``counts`` are the layers per stage of one chain."""

    vstages: tuple[VStage, ...]
    rank_of: tuple[int, ...]
    counts: tuple[int, ...]
    chains: int = 1

    def vs_of(self, schedule: str, p: int, chunk: int, stage: int) -> int:
        """Virtual stage of local chunk ``chunk`` on pipeline rank ``stage``."""
        if schedule == "dualpipe":
            return chunk * p + (stage if chunk == 0 else p - 1 - stage)
        return chunk * p + stage

    def prev_vs(self, vs: int) -> int:
        return vs - 1 if self.vstages[vs].has_prev else -1

    def next_vs(self, vs: int) -> int:
        return vs + 1 if self.vstages[vs].has_next else -1


def even_split(L: int, n: int) -> tuple[int, ...]:
    """``L`` layers over ``n`` stages, as even as possible (the extra layers go to the middle
    stages, away from the embedding and the head)."""
    base, extra = divmod(L, n)
    out = [base] * n
    # give the extra layers to the stages nearest the middle
    order = sorted(range(n), key=lambda i: (abs(i - (n - 1) / 2), i))
    for i in order[:extra]:
        out[i] += 1
    return tuple(out)


def pipeline_layout(parallel, L: int, counts: tuple[int, ...] | None = None) -> PipelineLayout:
    """The virtual stages of ``parallel`` over ``L`` layers (``counts``: layers per stage of
    one chain; default: ``parallel.stage_layers`` if it is a list, else :func:`even_split`)."""
    p, v = parallel.pp, parallel.chunks
    dual = parallel.schedule == "dualpipe"
    n = p if dual else p * v
    if counts is None:
        sl = parallel.stage_layers
        if isinstance(sl, tuple) and sl:
            counts = sl
        elif L < n:
            raise ConfigError(f"layers={L} cannot fill pp*chunks={p}*{v}={n} stages; lower pp "
                              "or chunks")
        else:  # as even as possible (the extra layers on the middle stages)
            counts = even_split(L, n)
    counts = tuple(int(c) for c in counts)
    if len(counts) != n:
        raise ConfigError(f"stage_layers has {len(counts)} entries; this layout has {n} "
                          f"stages per chain (pp={p}" + (f" x chunks={v}" if v > 1 else "")
                          + "): give one layer count per stage")
    if sum(counts) != L:
        raise ConfigError(f"stage_layers {list(counts)} sums to {sum(counts)}, but the model "
                          f"has {L} layers")
    starts = [0, *accumulate(counts)]
    vst, rank = [], []
    for d in range(2 if dual else 1):
        for j in range(n):
            idx = d * n + j
            vst.append(VStage(idx, range(starts[j], starts[j + 1]), j > 0, j < n - 1,
                              j == 0, j == n - 1))
            rank.append((j if d == 0 else p - 1 - j) if dual else j % p)
    return PipelineLayout(tuple(vst), tuple(rank), counts, 2 if dual else 1)


def makespan_ns(stage_ns: list[float], m: int) -> float:
    """1F1B-style estimate of a pipeline's compute makespan: every micro-batch crosses every
    stage once and the slowest stage paces the other ``m - 1``: ``sum t_i + (m-1) max t_i``."""
    return sum(stage_ns) + (m - 1) * max(stage_ns)


def _minmax_partition(L: int, n: int, cost, feasible=None) -> tuple[float, tuple[int, ...]]:
    """Split layers ``0..L`` into ``n`` contiguous non-empty stages minimizing the largest
    ``cost(i, a, b)`` (stage ``i`` holding layers ``a..b-1``; vectorized over ``a``), with
    ``feasible(i, a, b)`` (same shape, bool) restricting the stages allowed. Dynamic
    program over (stage, end layer): O(n L^2)."""
    import numpy as np
    INF = float("inf")
    f = np.full((n + 1, L + 1), INF)
    arg = np.zeros((n + 1, L + 1), np.int64)
    f[0, 0] = -INF
    for i in range(n):
        for b in range(i + 1, L - (n - i - 1) + 1):
            a = np.arange(i, b)
            c = cost(i, a, b)
            if feasible is not None:
                c = np.where(feasible(i, a, b), c, INF)
            val = np.maximum(f[i, a], c)
            j = int(np.argmin(val))
            f[i + 1, b] = val[j]
            arg[i + 1, b] = a[j]
    if not np.isfinite(f[n, L]):
        return INF, ()
    out, b = [], L
    for i in range(n, 0, -1):
        a = int(arg[i, b])
        out.append(b - a)
        b = a
    return float(f[n, L]), tuple(reversed(out))


def balanced_splits(layer_ns, first_ns: float, last_ns: float, m: int, n: int,
                    layer_state_bytes, layer_act_bytes, static_bytes, in_flight,
                    slack: float) -> dict:
    """The ``"time"`` and ``"memory"`` splits of the model's layers over ``n`` stages.

    ``layer_ns[l]`` is layer ``l``'s forward + backward time per micro-batch,
    ``first_ns`` / ``last_ns`` what the first / last stage adds (embedding / head).
    Stage ``i`` holding layers ``a..b-1`` needs ``static_bytes[i] + sum state + in_flight[i] *
    sum act`` bytes (model states per layer, activations per layer and micro-batch).
    ``"time"`` minimizes the slowest stage (the makespan ``sum t + (m-1) max t`` has a fixed
    sum); ``"memory"`` minimizes the largest stage's memory among splits whose makespan is
    within ``1 + slack`` of the time split's. Returns the three splits (``even`` too), their
    makespans (``*_ns``) and largest-stage bytes (``*_bytes``)."""
    import numpy as np
    L = len(layer_ns)
    T = np.concatenate([[0.0], np.cumsum(layer_ns)])
    Sb = np.concatenate([[0.0], np.cumsum(layer_state_bytes)])
    Ab = np.concatenate([[0.0], np.cumsum(layer_act_bytes)])
    extra = np.zeros(n)
    extra[0] += first_ns
    extra[-1] += last_ns

    def t_cost(i, a, b):
        return T[b] - T[a] + extra[i]

    def m_cost(i, a, b):
        return static_bytes[i] + Sb[b] - Sb[a] + in_flight[i] * (Ab[b] - Ab[a])

    def span(c):
        st = [0, *accumulate(c)]
        ts = [t_cost(i, st[i], st[i + 1]) for i in range(n)]
        return makespan_ns(ts, m)

    def mem(c):
        st = [0, *accumulate(c)]
        return max(m_cost(i, st[i], st[i + 1]) for i in range(n))

    even = even_split(L, n)
    _, t_best = _minmax_partition(L, n, t_cost)
    total = float(T[L] + extra.sum())
    bound = span(t_best) * (1 + slack)
    t_max = (bound - total) / (m - 1) if m > 1 else float("inf")
    _, m_best = _minmax_partition(L, n, m_cost, lambda i, a, b: t_cost(i, a, b) <= t_max + 1e-6)
    if not m_best:
        m_best = t_best
    return {"even": even, "time": t_best, "memory": m_best,
            "even_ns": span(even), "time_ns": span(t_best), "memory_ns": span(m_best),
            "even_bytes": mem(even), "time_bytes": mem(t_best), "memory_bytes": mem(m_best),
            "bound_ns": bound}
