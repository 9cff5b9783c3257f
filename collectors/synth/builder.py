"""Assemble per-layer op templates + a parallel config into a multi-rank Trace.

This is the one place where a training step is laid out on ranks, used by
:func:`collectors.synth.synthesize` (modeled durations) and by what-if parallelism policies
(durations measured from an annotated trace). Input: a :class:`StepTemplate` (per-layer
forward/backward op sequences for ONE tensor/context-parallel rank and one micro-batch,
plus embedding and head/loss pieces and parameter counts), a :class:`ParallelConfig` and a
:class:`CommModel` (data-parallel, ZeRO and pipeline communication times). Output: a Trace
with start/end times from a list scheduler (O(N + E), topological).

Rank symmetry: all ranks of one pipeline stage (every data, context and tensor index) run
the same timeline, so only one representative rank per stage is built and scheduled; the
others are numpy copies with their own rank, lanes, ``coll_id``, ``group_id`` and ``peer``.
With ``expand="unique"`` only the representatives are emitted (``meta["synth"]
["rank_classes"]`` says which ranks each one stands for), which keeps memory bounded for
jobs of any size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..enums import CommOp, OpKind, Phase
from ..errors import ConfigError
from ..trace import StringTable
from .costs import CommModel
from .parallel import ParallelConfig

__all__ = ["OpTemplate", "LayerTemplate", "StepTemplate", "LANES", "build_trace"]

#: local lanes of every rank, in lane-id order (lane id = rank * len(LANES) + index)
LANES = ("compute", "tp", "cp", "dp", "pp_send", "pp_recv")
_LANE = {n: i for i, n in enumerate(LANES)}
_GROUP_OF_LANE = {"tp": "tp", "cp": "cp", "dp": "dp"}


@dataclass(frozen=True)
class OpTemplate:
    """One op of a layer's forward or backward sequence on one rank.

    ``deps`` are offsets (negative) to earlier ops of the same sequence; ``-1`` is the
    previous op. Offsets reaching before the first op of a layer refer to the previous
    layer's ops (the chain continues across layers); ``()`` means no data dependency
    (only the FIFO order of its lane).
    """

    name: str
    lane: str
    dur_ns: int
    kind: int = int(OpKind.KERNEL)
    flops: float = float("nan")
    bytes: int = 0
    comm_op: int = int(CommOp.NONE)
    deps: tuple[int, ...] = (-1,)

    def __post_init__(self) -> None:
        if self.lane not in _LANE:
            raise ConfigError(f"op template {self.name!r}: lane={self.lane!r}; use one of {LANES}")
        if self.dur_ns < 0:
            raise ConfigError(f"op template {self.name!r}: dur_ns={self.dur_ns} must be >= 0")


@dataclass(frozen=True)
class LayerTemplate:
    """Forward and backward op sequences of one layer (one micro-batch, one rank).

    ``params`` is the layer's parameter count on one rank (after tensor-parallel sharding);
    it sizes data-parallel gradient reduction, ZeRO-3 gathers and the optimizer.
    """

    fwd: tuple[OpTemplate, ...]
    bwd: tuple[OpTemplate, ...]
    params: int = 0


@dataclass(frozen=True)
class StepTemplate:
    """Everything the builder needs besides the parallel config.

    ``layers`` are the transformer layers in model order (split evenly over
    ``pp * chunks`` virtual stages); ``embed`` runs before the first layer (its backward after
    the last), ``head`` after the last layer (final norm, logits, loss). ``p2p_bytes`` is
    the activation (and gradient) size sent between pipeline stages per micro-batch.
    ``optimizer_bytes_per_param`` is the HBM traffic of the optimizer step per parameter
    (fused Adam with fp32 master weights and moments: 28). ``name`` labels the trace.
    """

    layers: tuple[LayerTemplate, ...]
    embed: LayerTemplate | None = None
    head: LayerTemplate | None = None
    p2p_bytes: int = 0
    grad_bytes_per_param: int = 2
    param_bytes_per_param: int = 2
    optimizer_bytes_per_param: float = 28.0
    name: str = "synth"
    meta: dict = field(default_factory=dict, compare=False)


class _Block:
    """Column arrays of one instantiable op sequence (a forward or backward item)."""

    __slots__ = ("cols", "edges", "entry", "exit", "grad_ops", "n")

    def __init__(self) -> None:
        self.cols: dict[str, list] = {k: [] for k in ("name", "lane", "kind", "dur", "flops",
                                                       "bytes", "comm", "layer", "phase",
                                                       "peer_dv")}
        self.edges: list[tuple[int, int]] = []
        self.entry = -1  # op that waits for the received input (first op), -1 none
        self.exit = -1  # op whose output is sent (last compute op)
        self.grad_ops: list[tuple[int, int]] = []  # (op index, params) layer grads ready
        self.n = 0

    def add(self, op: OpTemplate, layer: int, phase: int, deps: list[int], peer_dv: int = 0) -> int:
        i = self.n
        c = self.cols
        c["name"].append(op.name)
        c["lane"].append(_LANE[op.lane])
        c["kind"].append(op.kind)
        c["dur"].append(op.dur_ns)
        c["flops"].append(op.flops)
        c["bytes"].append(op.bytes)
        c["comm"].append(op.comm_op)
        c["layer"].append(layer)
        c["phase"].append(phase)
        c["peer_dv"].append(peer_dv)
        for d in deps:
            if 0 <= d < i:
                self.edges.append((d, i))
        self.n += 1
        return i

    def add_seq(self, ops: tuple[OpTemplate, ...], layer: int, phase: int, base: int) -> tuple[int, int]:
        """Append a layer's sequence; relative deps resolve inside the block. Returns
        (first, last) op indices."""
        first = self.n
        for op in ops:
            i = self.n
            deps = [i + d for d in op.deps]
            if i == first and op.deps == (-1,) and base >= 0:
                deps = [base]
            self.add(op, layer, phase, deps)
        return first, self.n - 1

    def arrays(self, strings: StringTable) -> dict[str, np.ndarray]:
        c = self.cols
        return {
            "name_id": np.array([strings.intern(s) for s in c["name"]], np.int32),
            "lane": np.array(c["lane"], np.int32), "kind": np.array(c["kind"], np.int8),
            "dur_ns": np.array(c["dur"], np.int64), "flops": np.array(c["flops"], np.float64),
            "bytes": np.array(c["bytes"], np.int64), "comm_op": np.array(c["comm"], np.int8),
            "layer": np.array(c["layer"], np.int32), "phase": np.array(c["phase"], np.int8),
            "peer_dv": np.array(c["peer_dv"], np.int32),
            "esrc": np.array([a for a, _ in self.edges], np.int64),
            "edst": np.array([b for _, b in self.edges], np.int64),
        }


def _zero3_gather(blk: _Block, params: int, tpl: StepTemplate, comm: CommModel,
                  prev_first: int, name: str) -> int:
    nbytes = params * tpl.param_bytes_per_param
    op = OpTemplate(name, "dp", comm.collective_ns(CommOp.ALL_GATHER, nbytes, "dp"),
                    kind=int(OpKind.COLLECTIVE), bytes=nbytes, comm_op=int(CommOp.ALL_GATHER))
    # prefetch depth 1: the gather of layer j is issued when layer j-1 starts
    return blk.add(op, -1, int(Phase.FWD), [prev_first] if prev_first >= 0 else [])


def _make_block(tpl: StepTemplate, parallel: ParallelConfig, comm: CommModel, vs: int,
                backward: bool, layer_range: range, recv_ns: int, send_ns: int) -> _Block:
    """Ops of one (forward or backward) item of virtual stage ``vs``."""
    V = parallel.virtual_stages
    blk = _Block()
    zero3 = parallel.zero_stage == 3 and parallel.dp * parallel.cp > 1
    phase = int(Phase.BWD if backward else Phase.FWD)
    prev = -1
    has_recv = (vs > 0) if not backward else (vs < V - 1)
    if has_recv:
        peer_dv = -1 if not backward else 1
        prev = blk.add(OpTemplate("pp.recv", "pp_recv", recv_ns, kind=int(OpKind.P2P),
                                  bytes=tpl.p2p_bytes, comm_op=int(CommOp.RECV)),
                       -1, phase, [], peer_dv)
        blk.entry = prev
    pieces: list[tuple[LayerTemplate, int]] = []
    if not backward:
        if vs == 0 and tpl.embed is not None:
            pieces.append((tpl.embed, -1))
        pieces += [(tpl.layers[i], i) for i in layer_range]
        if vs == V - 1 and tpl.head is not None:
            pieces.append((tpl.head, len(tpl.layers)))
    else:
        if vs == V - 1 and tpl.head is not None:
            pieces.append((tpl.head, len(tpl.layers)))
        pieces += [(tpl.layers[i], i) for i in reversed(layer_range)]
        if vs == 0 and tpl.embed is not None:
            pieces.append((tpl.embed, -1))
    prev_first = -1
    for lt, layer in pieces:
        ops = lt.bwd if backward else lt.fwd
        if not ops:
            continue
        base = prev
        if zero3 and lt.params:
            g = _zero3_gather(blk, lt.params, tpl, comm, prev_first,
                              "zero3.allgather_params" + (".bwd" if backward else ""))
            blk.cols["layer"][g] = layer
            blk.cols["phase"][g] = phase
            first, last = blk.add_seq(ops, layer, phase, base)
            blk.edges.append((g, first))
        else:
            first, last = blk.add_seq(ops, layer, phase, base)
        prev_first = first
        if base >= 0 and ops[0].deps != (-1,):
            blk.edges.append((base, first))
        prev = last
        if backward and lt.params:
            blk.grad_ops.append((last, lt.params))
            if zero3:
                nbytes = lt.params * tpl.grad_bytes_per_param
                rs = OpTemplate("zero3.reduce_scatter_grads", "dp",
                                comm.collective_ns(CommOp.REDUCE_SCATTER, nbytes, "dp"),
                                kind=int(OpKind.COLLECTIVE), bytes=nbytes,
                                comm_op=int(CommOp.REDUCE_SCATTER))
                blk.add(rs, layer, phase, [last])
    # the op whose output leaves the stage: last op that is not on the dp lane
    lanes = blk.cols["lane"]
    ex = prev
    while ex >= 0 and lanes[ex] == _LANE["dp"]:
        ex -= 1
    blk.exit = ex
    has_send = (vs < V - 1) if not backward else (vs > 0)
    if has_send:
        peer_dv = 1 if not backward else -1
        blk.add(OpTemplate("pp.send", "pp_send", send_ns, kind=int(OpKind.P2P),
                           bytes=tpl.p2p_bytes, comm_op=int(CommOp.SEND)),
                -1, phase, [ex] if ex >= 0 else [], peer_dv)
    return blk


def _grad_buckets(grad_ops: list[tuple[int, int]], bucket_params: float) -> list[tuple[int, int]]:
    """Group layer gradients (in backward order) into buckets: (ready op, params)."""
    out, acc = [], 0
    for i, (op, params) in enumerate(grad_ops):
        acc += params
        if acc >= bucket_params or i == len(grad_ops) - 1:
            out.append((op, acc))
            acc = 0
    return out
