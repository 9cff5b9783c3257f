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

from ..enums import CommOp, EdgeKind, LaneKind, OpKind, Phase
from ..errors import ConfigError
from ..trace import StringTable, Trace
from ._kernels import _list_schedule
from .costs import CommModel, streaming
from .parallel import ParallelConfig
from .schedule import stage_order

__all__ = ["OpTemplate", "LayerTemplate", "StepTemplate", "LANES", "build_trace"]

#: local lanes of every rank, in lane-id order (lane id = rank * len(LANES) + index)
LANES = ("compute", "tp", "cp", "dp", "pp_send", "pp_recv")
_LANE = {n: i for i, n in enumerate(LANES)}
_GROUP_OF_LANE = {"tp": "tp", "cp": "cp", "dp": "dp"}


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
    the activation (and gradient) size sent between pipeline stages per micro-batch.
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


def _piece(arrs: dict[str, np.ndarray], mb: int, stage: int, chunk: int) -> dict[str, np.ndarray]:
    n = len(arrs["dur_ns"])
    out = {k: v for k, v in arrs.items() if k not in ("esrc", "edst")}
    out["microbatch"] = np.full(n, mb, np.int32)
    out["stage"] = np.full(n, stage, np.int16)
    out["chunk"] = np.full(n, chunk, np.int16)
    return out


def _small_piece(strings: StringTable, ops: list[tuple[OpTemplate, int]], stage: int) -> dict:
    """A piece from (op, phase) pairs with no intra-piece edges (edges are added by caller)."""
    blk = _Block()
    for op, phase in ops:
        blk.add(op, -1, phase, [])
    return _piece(blk.arrays(strings), -1, stage, -1)


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


def build_trace(template: StepTemplate, parallel: ParallelConfig, comm: CommModel, *,
                step: int = 0, expand: str = "auto", max_ops: int = 20_000_000,
                p2p_ns: int | None = None, recv_ns: int | None = None,
                meta: dict | None = None) -> Trace:
    """Lay one training step out on ``parallel.world_size`` ranks and schedule it.

    Parameters
    ----------
    template : StepTemplate
        Per-layer op sequences of one rank and one micro-batch (durations in ns).
    parallel : ParallelConfig
        Degrees, schedule, micro-batching, ZeRO stage and bucket size.
    comm : CommModel
        Times of data-parallel, ZeRO and pipeline communication (and the optimizer's HBM
        bandwidth through ``comm.hw``).
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
    recv_ns = int(hw.kernel_overhead_us * 1e3) if recv_ns is None else int(recv_ns)
    strings = StringTable()
    blocks: dict[tuple[int, bool], tuple[_Block, dict[str, np.ndarray]]] = {}
    for vs in range(V):
        rng = range(vs * per, (vs + 1) * per)
        for bwd in (False, True):
            blk = _make_block(template, parallel, comm, vs, bwd, rng, recv_ns, send_ns)
            blocks[(vs, bwd)] = (blk, blk.arrays(strings))
    dp_group = parallel.dp * parallel.cp
    zero = parallel.zero_stage
    sync = dp_group > 1 and zero < 3
    bucket_params = parallel.bucket_mb * 1e6 / template.grad_bytes_per_param
    pieces: list[dict[str, np.ndarray]] = []
    esrc: list[np.ndarray] = []
    edst: list[np.ndarray] = []
    ekind: list[np.ndarray] = []
    send_id: dict[tuple[bool, int, int], int] = {}
    recv_id: dict[tuple[bool, int, int], int] = {}
    n = 0

    def add_edges(s, d, kind=EdgeKind.DATA):
        s = np.asarray(s, np.int64)
        esrc.append(s)
        edst.append(np.asarray(d, np.int64))
        ekind.append(np.full(len(s), int(kind), np.int8))

    for stage in range(p):
        sync_ops: list[int] = []
        last_compute = -1
        for bwd, mb, c in stage_order(parallel.schedule, p, m, v, stage):
            vs = c * p + stage
            blk, arrs = blocks[(vs, bwd)]
            pieces.append(_piece(arrs, mb, stage, c))
            add_edges(arrs["esrc"] + n, arrs["edst"] + n)
            if blk.entry >= 0:
                recv_id[(bwd, mb, vs)] = n + blk.entry
            if (vs < V - 1 if not bwd else vs > 0):
                send_id[(bwd, mb, vs)] = n + blk.n - 1
            if blk.exit >= 0:
                last_compute = n + blk.exit
            base = n
            n += blk.n
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
                pieces.append(_small_piece(strings, ops, stage))
                ids = np.arange(n, n + len(ops))
                add_edges(deps, ids)
                sync_ops.extend(ids.tolist())
                n += len(ops)
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
        pieces.append(_small_piece(strings, ops, stage))
        deps = sync_ops + ([last_compute] if last_compute >= 0 else [])
        add_edges(deps, [n] * len(deps))
        add_edges(np.arange(n, n + n_opt - 1), np.arange(n + 1, n + n_opt))
        if len(ops) > n_opt:  # parameter all-gather after the (sharded) optimizer step
            add_edges([n + n_opt - 1], [n + n_opt])
        n += len(ops)
    # pipeline p2p edges: send of (dir, mb, vs) feeds the receive of the next virtual stage
    ps, pd_ = [], []
    for (bwd, mb, vs), sid in send_id.items():
        rid = recv_id.get((bwd, mb, vs - 1 if bwd else vs + 1))
        if rid is not None:
            ps.append(sid)
            pd_.append(rid)
    add_edges(ps, pd_, EdgeKind.P2P)
    rep = {k: np.concatenate([pc[k] for pc in pieces]) for k in pieces[0]}
    src = np.concatenate(esrc)
    dst = np.concatenate(edst)
    kinds = np.concatenate(ekind)
    lag = np.zeros(len(src), np.int64)
    nl = len(LANES)
    rep_lane = rep["stage"].astype(np.int32) * nl + rep["lane"]
    start, done = _list_schedule(np.ascontiguousarray(rep["dur_ns"]), rep_lane, p * nl,
                                 src, dst, lag)
    if done != n:
        raise RuntimeError(f"synth builder produced a dependency cycle ({n - done} ops "
                           "unscheduled); this is a bug")
    rep["start_ns"] = start
    return _expand(rep, src, dst, kinds, template, parallel, strings, step, expand,
                   max_ops, meta)


_CLASS_OF_LANE = {0: "compute", 1: "tp_comm", 2: "cp_comm", 3: "dp_comm", 4: "pp_send",
                  5: "pp_recv"}


def _group_table(parallel: ParallelConfig) -> tuple[list[dict], dict[str, int]]:
    """Process groups of the layout and the group-id offset of each kind."""
    P = parallel
    W = P.world_size
    ranks = np.arange(W).reshape(P.pp, P.dp, P.cp, P.tp)
    rows: list[dict] = []
    offsets: dict[str, int] = {}
    kinds = (("tp", ranks.reshape(-1, P.tp)),
             ("cp", ranks.transpose(0, 1, 3, 2).reshape(-1, P.cp)),
             ("dp", ranks.transpose(0, 3, 1, 2).reshape(-1, P.dp * P.cp)),
             ("pp", ranks.transpose(1, 2, 3, 0).reshape(-1, P.pp)))
    for kind, mat in kinds:
        offsets[kind] = len(rows)
        if mat.shape[1] <= 1:
            continue
        for i, row in enumerate(mat):
            rows.append({"group_id": len(rows), "name": f"{kind}{i}", "ranks": row.tolist()})
    return rows, offsets


def _expand(rep: dict[str, np.ndarray], src: np.ndarray, dst: np.ndarray, kinds: np.ndarray,
            template: StepTemplate, parallel: ParallelConfig, strings: StringTable, step: int,
            expand: str, max_ops: int, meta: dict | None) -> Trace:
    P = parallel
    W = P.world_size
    R = P.dp * P.cp * P.tp
    N = len(rep["dur_ns"])
    if expand == "auto":
        expand = "all" if N * R <= max_ops else "unique"
    ks = np.arange(R, dtype=np.int64) if expand == "all" else np.zeros(1, np.int64)
    K = len(ks)
    stage = rep["stage"].astype(np.int64)
    lane_local = rep["lane"].astype(np.int64)
    kk = np.repeat(ks, N)
    rank = np.tile(stage, K) * R + kk
    t = kk % P.tp
    c = (kk // P.tp) % P.cp
    is_coll = rep["kind"] == int(OpKind.COLLECTIVE)
    j = np.cumsum(is_coll) - 1
    groups, goff = _group_table(P)
    lane_t = np.tile(lane_local, K)
    coll_t = np.tile(is_coll, K)
    coll_id = np.full(N * K, -1, np.int64)
    group_id = np.full(N * K, -1, np.int32)
    j_t = np.tile(j, K)
    for name, li in (("tp", _LANE["tp"]), ("cp", _LANE["cp"]), ("dp", _LANE["dp"])):
        sel = lane_t == li
        if not sel.any():
            continue
        r = rank[sel]
        if name == "tp":
            key = r - t[sel]
            gid = goff["tp"] + r // P.tp
        elif name == "cp":
            key = r - c[sel] * P.tp
            s_ = r // R
            d_ = (r % R) // (P.tp * P.cp)
            gid = goff["cp"] + (s_ * P.dp + d_) * P.tp + t[sel]
        else:
            key = (r // R) * R + t[sel]
            gid = goff["dp"] + (r // R) * P.tp + t[sel]
        cs = coll_t[sel]
        coll_id[np.flatnonzero(sel)[cs]] = (j_t[sel][cs] * W + key[cs])
        group_id[sel] = gid
    peer = np.full(N * K, -1, np.int32)
    pdv = rep["peer_dv"].astype(np.int64)
    is_p2p = pdv != 0
    if is_p2p.any():
        vs = rep["chunk"].astype(np.int64) * P.pp + stage
        peer_stage = np.where(is_p2p, (vs + pdv) % P.pp, -1)
        ps = np.tile(peer_stage, K)
        m_ = np.tile(is_p2p, K)
        peer[m_] = ps[m_] * R + kk[m_]
        group_id[m_] = goff["pp"] + kk[m_]
    ops = {
        "rank": rank.astype(np.int32),
        "lane": (rank * len(LANES) + lane_t).astype(np.int32),
        "kind": np.tile(rep["kind"], K),
        "name_id": np.tile(rep["name_id"], K),
        "start_ns": np.tile(rep["start_ns"], K),
        "dur_ns": np.tile(rep["dur_ns"], K),
        "step": np.full(N * K, step, np.int32),
        "phase": np.tile(rep["phase"], K),
        "layer": np.tile(rep["layer"], K),
        "microbatch": np.tile(rep["microbatch"], K),
        "stage": np.tile(rep["stage"], K),
        "chunk": np.tile(rep["chunk"], K),
        "coll_id": coll_id,
        "comm_op": np.tile(rep["comm_op"], K),
        "bytes": np.tile(rep["bytes"], K),
        "group_id": group_id,
        "peer": peer,
        "flops": np.tile(rep["flops"], K),
    }
    off = np.repeat(np.arange(K, dtype=np.int64) * N, len(src))
    edges = {"src": np.tile(src, K) + off, "dst": np.tile(dst, K) + off,
             "kind": np.tile(kinds, K)}
    # lanes: every rank gets the lanes its stage uses
    used = np.zeros((P.pp, len(LANES)), bool)
    used[stage, lane_local] = True
    lr, ll = [], []
    ranks_emitted = np.unique(rank)
    for r in ranks_emitted:
        li = np.flatnonzero(used[r // R])
        lr.append(np.full(len(li), r))
        ll.append(li)
    lr_a = np.concatenate(lr)
    ll_a = np.concatenate(ll)
    lanes = {"lane": (lr_a * len(LANES) + ll_a).astype(np.int32), "rank": lr_a.astype(np.int32),
             "device": lr_a.astype(np.int32),
             "lane_kind": np.full(len(lr_a), int(LaneKind.GPU_STREAM), np.int8),
             "native_id": ll_a.astype(np.int64),
             "name": np.asarray([f"{LANES[i]} stream" for i in ll_a], dtype=object)}
    # per-class busy time of each stage's representative rank
    end = rep["start_ns"] + rep["dur_ns"]
    step_ns = int(end.max() - rep["start_ns"].min()) if N else 0
    classes: dict[str, list[int]] = {}
    for li, cname in _CLASS_OF_LANE.items():
        sel = rep["lane"] == li
        if sel.any():
            classes[cname] = np.bincount(stage[sel], weights=rep["dur_ns"][sel],
                                         minlength=P.pp).astype(np.int64).tolist()
    names = np.asarray(strings.names, dtype=object)
    by_name: dict[str, int] = {}
    s0 = stage == 0
    if s0.any():
        tot = np.bincount(rep["name_id"][s0], weights=rep["dur_ns"][s0], minlength=len(names))
        by_name = {str(names[i]): int(tot[i]) for i in np.flatnonzero(tot)}
    busy = classes.get("compute", [0] * P.pp)
    synth = {
        "step_time_ns": step_ns,
        "world_size": W,
        "parallel": P.to_dict(),
        "expand": expand,
        "ranks_emitted": int(len(ranks_emitted)),
        "rank_classes": [{"stage": s, "representative": s * R,
                          "ranks": [s * R, (s + 1) * R - 1]} for s in range(P.pp)],
        "op_class_ns": classes,
        "op_name_ns_stage0": by_name,
        "bubble_fraction": [1.0 - b / step_ns if step_ns else 0.0 for b in busy],
        "ops_per_rank": np.bincount(stage, minlength=P.pp).tolist(),
    }
    synth.update(meta or {})
    m = {"source_format": "synth", "world_size": W, "synth": synth,
         "accounting": {"synth": {"events_read": 0, "kept": {"ops": int(N * K)}, "dropped": {}}},
         "collectives": {"matched": int(len(np.unique(coll_id[coll_id >= 0]))), "unmatched": 0}}
    return Trace.build(ops=ops, lanes=lanes, strings=strings, edges=edges, groups=groups,
                       meta=m)
