"""Tensor-parallel communication overlapped with GEMMs (Megatron-LM's ``--tp-comm-overlap``).

With sequence parallelism each transformer layer all-gathers its (sequence-sharded) input
before the column-parallel GEMMs (QKV, FC1) and reduce-scatters the output of the
row-parallel ones (attention projection, FC2); in the backward it all-gathers the incoming
gradient before the row-parallel layers' data-gradient GEMMs. Without overlap these sit on
the critical path (:mod:`collectors.synth.layers`). Transformer Engine's userbuffers split
the GEMM into chunks pipelined with the exchange (ring-exchange all-gather: the local chunk
first; pipelined reduce-scatter: each chunk's partial sums leave while the next chunk is
computed), so the exchange runs beside the GEMM that consumes or produces it. The pair is
priced as every other communication/computation pair of the synthesizer
(:func:`collectors.synth.layers._overlap`: ``max + (1 - f) * min`` with the hardware's
``overlap`` efficiency ``f``, C3); the backward pairs that Megatron-LM already overlaps
(the weight gradient's re-gather beside the data gradient, the input gradient's reduction
beside the weight gradient) are unchanged. The output layer (a plain column-parallel linear,
not a Transformer Engine module) is not overlapped.
"""

from __future__ import annotations

from dataclasses import replace

from ..enums import OpKind
from .builder import LayerTemplate, OpTemplate

__all__ = ["tp_overlapped", "overlap_ops"]

#: GEMMs whose input all-gather is overlapped (the gather, on the tp stream, precedes them)
_AG_GEMMS = ("attn.qkv.fwd", "mlp.fc1.fwd", "mlp.fc2.bwd_dgrad", "attn.proj.bwd_dgrad")
#: GEMMs whose output reduce-scatter is overlapped (the scatter follows them)
_RS_GEMMS = ("attn.proj.fwd", "mlp.fc2.fwd")
_SYNC = int(OpKind.SYNC)


def _pair(comm: OpTemplate, gemm: OpTemplate, f: float) -> tuple[int, int]:
    """Durations (comm, gemm) of a pair running side by side: the longer one is stretched
    by ``(1 - f)`` of the shorter (the synthesizer's interference rule)."""
    a, b = comm.dur_ns, gemm.dur_ns
    if a <= b:
        return a, int(b + (1 - f) * a)
    return int(a + (1 - f) * b), b


def overlap_ops(ops: tuple[OpTemplate, ...], f: float) -> tuple[OpTemplate, ...]:
    """``ops`` (one layer's forward or backward sequence) with every all-gather -> GEMM and
    GEMM -> reduce-scatter pair of :data:`_AG_GEMMS` / :data:`_RS_GEMMS` run side by side,
    joined by a ``tp.wait`` before the next op. Relative dependencies are rewritten for the
    inserted joins (offsets reaching the previous layer keep pointing at it)."""
    n = len(ops)
    out: list[tuple[OpTemplate, list[int]]] = []  # (op, absolute deps in the old indexing)
    new_of: dict[int, int] = {}
    i = 0
    while i < n:
        op = ops[i]
        nxt = ops[i + 1] if i + 1 < n else None
        abs_deps = [i + d for d in op.deps]
        ag = (nxt is not None and op.lane == "tp" and op.name.endswith("tp.allgather")
              and nxt.lane == "compute" and nxt.deps == (-1,)
              and nxt.name.endswith(_AG_GEMMS))
        rs = (nxt is not None and op.lane == "compute" and op.name.endswith(_RS_GEMMS)
              and nxt.lane == "tp" and nxt.name.endswith("tp.reduce_scatter")
              and nxt.deps == (-1,))
        if ag or rs:
            comm, gemm = (op, nxt) if ag else (nxt, op)
            dc, dg = _pair(comm, gemm, f)
            first, second = (comm, gemm) if ag else (gemm, comm)
            d1, d2 = (dc, dg) if ag else (dg, dc)
            new_of[i] = len(out)
            out.append((replace(first, dur_ns=d1), abs_deps))
            new_of[i + 1] = len(out)
            out.append((replace(second, dur_ns=d2), abs_deps))  # beside, same inputs
            join = OpTemplate("tp.wait", "compute", 0, kind=_SYNC, flops=0.0)
            # the op after the pair waits for both: it depends on the pair's last op (i+1)
            # in the old indexing, which now means the join
            out.append((join, [-10**9, i, i + 1]))
            new_of[i + 1] = len(out) - 1  # later references to i+1 go to the join
            i += 2
            continue
        new_of[i] = len(out)
        out.append((op, abs_deps))
        i += 1
    result = []
    for pos, (op, deps) in enumerate(out):
        if deps and deps[0] == -10**9:  # a join: depends on the two ops just before it
            result.append(replace(op, deps=(-1, -2)))
            continue
        rel = []
        for a in deps:
            if a < 0:  # the previous layer's ops: same offset from this sequence's start
                rel.append(a - pos)
            else:
                target = new_of[a]
                # a pair member referring to its partner's inputs keeps the old target
                rel.append(target - pos)
        result.append(replace(op, deps=tuple(rel)))
    return tuple(result)


def tp_overlapped(lt: LayerTemplate, f: float) -> LayerTemplate:
    """``lt`` with its sequence-parallel exchanges overlapped with their GEMMs."""
    return replace(lt, fwd=overlap_ops(lt.fwd, f), bwd=overlap_ops(lt.bwd, f))
