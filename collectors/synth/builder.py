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

from ..enums import CommOp, EdgeKind, OpKind, Phase
from ..errors import ConfigError
from ..trace import StringTable, Trace
from ._kernels import _list_schedule
from .costs import CommModel, streaming
from .expand import _EMB, _LANE, LANES, expand_ranks, no_hugepages
from .hardware import HardwareConfig, resolve_hardware
from .parallel import ParallelConfig, resolve_parallel
from .schedule import stage_order

__all__ = ["OpTemplate", "LayerTemplate", "StepTemplate", "LANES", "build_trace"]



#: Megatron-LM's mixed-precision Adam step (fp32 main grads, master weights and moments),
#: bytes of HBM traffic per parameter: copy 16-bit grads to fp32 (2 + 4), unscale and check
#: for inf/nan (4 + 4), grad norm (4), fused Adam (read param, grad, m, v; write param, m, v:
#: 28), copy fp32 params back to 16-bit (4 + 2), zero the grad buffer (4).
MIXED_PRECISION_ADAM: tuple[tuple[str, float], ...] = (
    ("optimizer.copy_grads", 6.0), ("optimizer.unscale_check_inf", 8.0),
    ("optimizer.grad_norm", 4.0), ("optimizer.adam_step", 28.0),
    ("optimizer.copy_params", 6.0), ("optimizer.zero_grad", 4.0))


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
    the activation (and gradient) size sent between pipeline stages per micro-batch, and
    ``recv_ns`` the receiving rank's cost once it arrived (default: one kernel overhead).
    ``tied_embedding_params`` (per rank) > 0 adds Megatron's all-reduce of the word-embedding
    gradients between the first and the last pipeline stage, which both hold a copy.
    ``optimizer_kernels`` are the optimizer step's kernels as (name, HBM bytes moved per
    local parameter), run after the gradients are reduced. ``name`` labels the trace.
    """

    layers: tuple[LayerTemplate, ...]
    embed: LayerTemplate | None = None
    head: LayerTemplate | None = None
    p2p_bytes: int = 0
    grad_bytes_per_param: int = 2
    param_bytes_per_param: int = 2
    optimizer_kernels: tuple[tuple[str, float], ...] = MIXED_PRECISION_ADAM
    recv_ns: int | None = None
    tied_embedding_params: int = 0
    name: str = "synth"
    meta: dict = field(default_factory=dict, compare=False)


class _Block:
    """Column arrays of one instantiable op sequence (a forward or backward item)."""

    __slots__ = ("cols", "edges", "entry", "exit", "grad_ops", "n")

    def __init__(self) -> None:
        self.cols: dict[str, list] = {k: [] for k in ("name", "lane", "kind", "dur", "flops",
                                                       "bytes", "comm", "layer", "phase",
                                                       "peer_dv", "gkind")}
        self.edges: list[tuple[int, int]] = []
        self.entry = -1  # op that waits for the received input (first op), -1 none
        self.exit = -1  # op whose output is sent (last compute op)
        self.grad_ops: list[tuple[int, int]] = []  # (op index, params) layer grads ready
        self.n = 0

    def add(self, op: OpTemplate, layer: int, phase: int, deps: list[int], peer_dv: int = 0,
            gkind: int = 0) -> int:
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
        c["gkind"].append(gkind)
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
            "gkind": np.array(c["gkind"], np.int8),
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


class _Pool:
    """Unique op sequences (blocks) and the pieces (block instances) of the step.

    Ops are materialized once per block; pieces are (block, microbatch, stage, chunk)
    and expand to op columns by one gather at the end (no per-piece arrays)."""

    def __init__(self, strings: StringTable) -> None:
        self.strings = strings
        self.blocks: list[dict[str, np.ndarray]] = []
        self.p_block: list[int] = []
        self.p_mb: list[int] = []
        self.p_stage: list[int] = []
        self.p_chunk: list[int] = []
        self.n = 0

    def add_block(self, blk: _Block) -> int:
        self.blocks.append(blk.arrays(self.strings))
        return len(self.blocks) - 1

    def add_piece(self, b: int, mb: int, stage: int, chunk: int) -> int:
        """Instantiate block ``b``; returns the op id of its first op."""
        base = self.n
        self.p_block.append(b)
        self.p_mb.append(mb)
        self.p_stage.append(stage)
        self.p_chunk.append(chunk)
        self.n += len(self.blocks[b]["dur_ns"])
        return base

    def add_ops(self, ops: list[tuple[OpTemplate, int]], stage: int, gkind: int = 0) -> int:
        blk = _Block()
        for op, phase in ops:
            blk.add(op, -1, phase, [], gkind=gkind)
        return self.add_piece(self.add_block(blk), -1, stage, -1)

    def materialize(self) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Op columns of all pieces in order, and the intra-block edges (src, dst)."""
        lens = np.array([len(b["dur_ns"]) for b in self.blocks], np.int64)
        elens = np.array([len(b["esrc"]) for b in self.blocks], np.int64)
        offs = np.concatenate([[0], np.cumsum(lens)[:-1]])
        eoffs = np.concatenate([[0], np.cumsum(elens)[:-1]])
        pb = np.asarray(self.p_block, np.int64)
        plen = lens[pb]
        pstart = np.concatenate([[0], np.cumsum(plen)[:-1]])
        idx = _ranges(offs[pb], plen)
        cols = {k: np.concatenate([b[k] for b in self.blocks])[idx]
                for k in self.blocks[0] if k not in ("esrc", "edst")}
        cols["microbatch"] = np.repeat(np.asarray(self.p_mb, np.int32), plen)
        cols["stage"] = np.repeat(np.asarray(self.p_stage, np.int16), plen)
        cols["chunk"] = np.repeat(np.asarray(self.p_chunk, np.int16), plen)
        pe = elens[pb]
        eidx = _ranges(eoffs[pb], pe)
        shift = np.repeat(pstart, pe)
        src = np.concatenate([b["esrc"] for b in self.blocks])[eidx] + shift
        dst = np.concatenate([b["edst"] for b in self.blocks])[eidx] + shift
        return cols, src, dst


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + l)`` for each (s, l), vectorized."""
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    ends = np.cumsum(lens)
    out = np.ones(total, np.int64)
    nz = lens > 0
    st, ln, en = starts[nz], lens[nz], ends[nz]
    out[0] = st[0]
    out[(en - ln)[1:]] = st[1:] - (st[:-1] + ln[:-1] - 1)
    return np.cumsum(out)


def _stage_params(tpl: StepTemplate, parallel: ParallelConfig, stage: int, per: int) -> int:
    p, V = parallel.pp, parallel.virtual_stages
    total = 0
    for c in range(parallel.chunks):
        vs = c * p + stage
        total += sum(lt.params for lt in tpl.layers[vs * per:(vs + 1) * per])
        if vs == 0 and tpl.embed is not None:
            total += tpl.embed.params
        if vs == V - 1 and tpl.head is not None:
            total += tpl.head.params
    return total


def build_trace(template: StepTemplate, parallel: ParallelConfig | dict,
                comm: CommModel | HardwareConfig | str, *,
                step: int = 0, expand: str = "auto", max_ops: int = 12_000_000,
                p2p_ns: int | None = None, recv_ns: int | None = None,
                meta: dict | None = None) -> Trace:
    """Lay one training step out on ``parallel.world_size`` ranks and schedule it.

    Parameters
    ----------
    template : StepTemplate
        Per-layer op sequences of one rank and one micro-batch (durations in ns).
    parallel : ParallelConfig
        Degrees, schedule, micro-batching, ZeRO stage and bucket size.
    comm : CommModel, HardwareConfig or str
        Times of data-parallel, ZeRO and pipeline communication (and the optimizer's HBM
        bandwidth through ``comm.hw``); a hardware profile or its name builds one.
    step : int
        Value of the ``step`` column.
    expand : {"auto", "all", "unique"}
        ``all`` emits every rank; ``unique`` one representative rank per pipeline stage
        (rank ``stage * dp * cp * tp``); ``auto`` is ``all`` up to ``max_ops`` ops.
    p2p_ns, recv_ns : int, optional
        Override the modeled pipeline send duration and the receive op's duration.
    meta : dict, optional
        Extra entries for ``meta["synth"]``.

    Returns
    -------
    Trace
        Ops with start/dur filled, DATA and P2P edges, groups, and ``meta["synth"]`` with
        ``step_time_ns``, ``world_size``, ``parallel``, ``op_class_ns`` and ``rank_classes``.
    """
    parallel = resolve_parallel(parallel)
    if not isinstance(comm, CommModel):
        comm = CommModel(resolve_hardware(comm), parallel)
    if expand not in ("auto", "all", "unique"):
        raise ConfigError(f"expand={expand!r}; use auto, all or unique")
    p, v, m = parallel.pp, parallel.chunks, parallel.num_microbatches
    V = p * v
    L = len(template.layers)
    if L % V:
        raise ConfigError(f"layers={L} is not divisible by pp*chunks={p}*{v}={V}; choose pp "
                          "and chunks whose product divides the number of layers")
    per = L // V
    hw = comm.hw
    send_ns = comm.p2p_ns(template.p2p_bytes) if p2p_ns is None else int(p2p_ns)
    if recv_ns is None:
        recv_ns = template.recv_ns
    recv_ns = int(hw.kernel_overhead_us * 1e3) if recv_ns is None else int(recv_ns)
    strings = StringTable()
    pool = _Pool(strings)
    blocks: dict[tuple[int, bool], tuple[_Block, int]] = {}
    for vs in range(V):
        rng = range(vs * per, (vs + 1) * per)
        for bwd in (False, True):
            blk = _make_block(template, parallel, comm, vs, bwd, rng, recv_ns, send_ns)
            blocks[(vs, bwd)] = (blk, pool.add_block(blk))
    dp_group = parallel.dp * parallel.cp
    zero = parallel.zero_stage
    sync = dp_group > 1 and zero < 3
    bucket_params = parallel.bucket_mb * 1e6 / template.grad_bytes_per_param
    esrc: list[np.ndarray] = []
    edst: list[np.ndarray] = []
    ekind: list[np.ndarray] = []
    send_id: dict[tuple[bool, int, int], int] = {}
    recv_id: dict[tuple[bool, int, int], int] = {}

    def add_edges(s, d, kind=EdgeKind.DATA):
        s = np.asarray(s, np.int64)
        esrc.append(s)
        edst.append(np.asarray(d, np.int64))
        ekind.append(np.full(len(s), int(kind), np.int8))

    emb_ops: list[int] = []
    for stage in range(p):
        sync_ops: list[int] = []
        last_compute = -1
        for bwd, mb, c in stage_order(parallel.schedule, p, m, v, stage):
            vs = c * p + stage
            blk, bid = blocks[(vs, bwd)]
            base = pool.add_piece(bid, mb, stage, c)
            if blk.entry >= 0:
                recv_id[(bwd, mb, vs)] = base + blk.entry
            if (vs < V - 1 if not bwd else vs > 0):
                send_id[(bwd, mb, vs)] = base + blk.n - 1
            if blk.exit >= 0:
                last_compute = base + blk.exit
            if bwd and mb == m - 1 and sync and blk.grad_ops:
                op_kind = CommOp.ALL_REDUCE if zero == 0 else CommOp.REDUCE_SCATTER
                ops, deps = [], []
                for ready, params in _grad_buckets(blk.grad_ops, bucket_params):
                    nbytes = int(params * template.grad_bytes_per_param)
                    ops.append((OpTemplate("dp.allreduce_grads" if zero == 0 else
                                           "dp.reduce_scatter_grads", "dp",
                                           comm.collective_ns(op_kind, nbytes, "dp"),
                                           kind=int(OpKind.COLLECTIVE), bytes=nbytes,
                                           comm_op=int(op_kind)), int(Phase.BWD)))
                    deps.append(base + ready)
                first = pool.add_ops(ops, stage)
                ids = np.arange(first, first + len(ops))
                add_edges(deps, ids)
                sync_ops.extend(ids.tolist())
        if p > 1 and template.tied_embedding_params and stage in (0, p - 1):
            nbytes = int(template.tied_embedding_params * template.grad_bytes_per_param)
            geo = comm.geometry_of(2, (p - 1) * parallel.dp * parallel.cp * parallel.tp)
            emb = pool.add_ops([(OpTemplate("pp.allreduce_embedding_grads", "dp",
                                            comm.collective_ns(CommOp.ALL_REDUCE, nbytes, geo),
                                            kind=int(OpKind.COLLECTIVE), bytes=nbytes,
                                            comm_op=int(CommOp.ALL_REDUCE)), int(Phase.BWD))],
                               stage, gkind=_EMB)
            add_edges(sync_ops + ([last_compute] if last_compute >= 0 else []),
                      [emb] * (len(sync_ops) + (last_compute >= 0)))
            emb_ops.append(emb)
            sync_ops.append(emb)
        # optimizer step (sharded over data-parallel ranks with ZeRO >= 1)
        params = _stage_params(template, parallel, stage, per)
        shard = params / (dp_group if zero >= 1 else 1)
        ops = []
        for kname, bpp in template.optimizer_kernels:
            kc = streaming(hw, bpp * shard)
            ops.append((OpTemplate(kname, "compute", kc.dur_ns, bytes=kc.bytes,
                                   kind=int(OpKind.KERNEL)), int(Phase.OPT)))
        n_opt = len(ops)
        if dp_group > 1 and zero in (1, 2):
            nbytes = int(params * template.param_bytes_per_param)
            ops.append((OpTemplate("dp.allgather_params", "dp",
                                   comm.collective_ns(CommOp.ALL_GATHER, nbytes, "dp"),
                                   kind=int(OpKind.COLLECTIVE), bytes=nbytes,
                                   comm_op=int(CommOp.ALL_GATHER)), int(Phase.OPT)))
        if not ops:
            continue
        n = pool.add_ops(ops, stage)
        deps = sync_ops + ([last_compute] if last_compute >= 0 else [])
        add_edges(deps, [n] * len(deps))
        add_edges(np.arange(n, n + n_opt - 1), np.arange(n + 1, n + n_opt))
        if len(ops) > n_opt:  # parameter all-gather after the (sharded) optimizer step
            add_edges([n + n_opt - 1], [n + n_opt])
    # pipeline p2p edges: send of (dir, mb, vs) feeds the receive of the next virtual stage
    ps, pd_ = [], []
    for (bwd, mb, vs), sid in send_id.items():
        rid = recv_id.get((bwd, mb, vs - 1 if bwd else vs + 1))
        if rid is not None:
            ps.append(sid)
            pd_.append(rid)
    add_edges(ps, pd_, EdgeKind.P2P)
    rep, isrc, idst = pool.materialize()
    n = pool.n
    src = np.concatenate([isrc] + esrc)
    dst = np.concatenate([idst] + edst)
    kinds = np.concatenate([np.full(len(isrc), int(EdgeKind.DATA), np.int8)] + ekind)
    lag = np.zeros(len(src), np.int64)
    nl = len(LANES)
    rep_lane = rep["stage"].astype(np.int32) * nl + rep["lane"]
    group = np.full(n, -1, np.int64)
    group[emb_ops] = 0  # the one cross-stage collective among representatives
    start, done = _list_schedule(np.ascontiguousarray(rep["dur_ns"]), rep_lane, p * nl,
                                 src, dst, lag, group)
    if done != n:
        raise RuntimeError(f"synth builder produced a dependency cycle ({n - done} ops "
                           "unscheduled); this is a bug")
    rep["start_ns"] = start
    with no_hugepages():
        return expand_ranks(rep, src, dst, kinds, parallel, strings, step, expand, max_ops,
                            meta)
