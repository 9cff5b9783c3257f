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
from .blocks import (
    Block,
    Pool,
    comm_sm_stretch,
    grad_buckets,
    make_block,
    merge_blocks,
    owner_slices,
)
from .costs import CommModel, streaming
from .expand import _EDP, _EMB, _LANE, _MP, LANES, expand_ranks, no_hugepages
from .hardware import HardwareConfig, resolve_hardware
from .p2p import own_ready_starts, sync_edges
from .parallel import ParallelConfig, resolve_parallel
from .schedule import (
    BI,
    SPLIT_BACKWARD,
    SYNC_SCHEDULES,
    B,
    F,
    W,
    call_after,
    overlapped_pairs,
    stage_order,
)
from .stages import pipeline_layout

__all__ = ["OpTemplate", "LayerTemplate", "StepTemplate", "LANES", "build_trace",
           "stage_params"]


#: Megatron-LM's mixed-precision Adam step (fp32 main grads, master weights and moments),
#: bytes of HBM traffic per parameter: copy 16-bit grads to fp32 (2 + 4), unscale and check
#: for inf/nan (4 + 4), grad norm (4), fused Adam (read param, grad, m, v; write param, m, v:
#: 28), copy fp32 params back to 16-bit (4 + 2), zero the grad buffer (4).
#: DeepSpeed ZeRO-1/2 defaults (elements): reduce_bucket_size and allgather_bucket_size
#: (``zero_reduce = "reduce"``; BigScience's configs set neither; REFERENCES.md R30)
DS_BUCKET = 5e8

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

    ``params`` is the layer's dense parameter count on one rank (after tensor-parallel
    sharding); it sizes data-parallel gradient reduction, ZeRO-3 gathers and the optimizer.
    ``expert_params`` are its routed experts' parameters on one rank (reduced over the
    expert-data-parallel group). ``wgrad`` holds the weight-gradient ops when the backward is
    split (zero-bubble schedules): ``bwd`` then computes only input gradients.
    """

    fwd: tuple[OpTemplate, ...]
    bwd: tuple[OpTemplate, ...]
    params: int = 0
    wgrad: tuple[OpTemplate, ...] = ()
    expert_params: int = 0


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


def stage_params(tpl: StepTemplate, layout, stage: int) -> tuple[int, int]:
    """(dense, expert) parameters held by one rank of pipeline rank ``stage`` (all its
    virtual stages: chunks, or DualPipe's two copies)."""
    dense = expert = 0
    for vs, vst in enumerate(layout.vstages):
        if layout.rank_of[vs] != stage:
            continue
        for i in vst.layers:
            dense += tpl.layers[i].params
            expert += tpl.layers[i].expert_params
        if vst.first and tpl.embed is not None:
            dense += tpl.embed.params
        if vst.last and tpl.head is not None:
            dense += tpl.head.params
            expert += tpl.head.expert_params
    return dense, expert


def build_trace(template: StepTemplate, parallel: ParallelConfig | dict,
                comm: CommModel | HardwareConfig | str, *,
                step: int = 0, expand: str = "auto", max_ops: int = 12_000_000,
                p2p_ns: int | None = None, recv_ns: int | None = None,
                meta: dict | None = None, stage_layers: tuple[int, ...] | None = None,
                scale: float = 1.0) -> Trace:
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
    stage_layers : tuple of int, optional
        Layers per stage of one pipeline chain (default: ``parallel.stage_layers`` when it
        is a list, else an even split).
    scale : float
        Multiplies every compute kernel of the forward / backward passes (the slowest
        data-parallel rank's share under sequence-length imbalance).

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
    sched = parallel.schedule
    layout = pipeline_layout(parallel, len(template.layers), stage_layers)
    hw = comm.hw
    send_ns = comm.p2p_ns(template.p2p_bytes) if p2p_ns is None else int(p2p_ns)
    if recv_ns is None:
        recv_ns = template.recv_ns
    recv_ns = int(hw.kernel_overhead_us * 1e3) if recv_ns is None else int(recv_ns)
    strings = StringTable()
    pool = Pool(strings)
    split = sched in SPLIT_BACKWARD
    phases = (F, BI, W, B) if split else (F, B)
    zero = parallel.zero_stage
    # FSDP / ZeRO-3 under a pipeline (PyTorch pipelining, as torchtitan runs it): a stage's
    # parameters are gathered in its first forward and kept unsharded over the step's
    # micro-batches (``reshard_after_forward=False`` with PP; no reshard after a backward but
    # the last), gradients accumulate unsharded and are reduce-scattered once, after the
    # stage's last backward (REFERENCES.md R13)
    from .fsdp import reduce_bytes_per_param
    piped = zero == 3 and p > 1 and not parallel.odc
    z3 = "none" if piped else "layer"
    blocks: dict[tuple[int, int], tuple[Block, int]] = {}
    for vs, vst in enumerate(layout.vstages):
        pv, nv = layout.prev_vs(vs), layout.next_vs(vs)
        for ph in phases + ((-F - 1,) if piped else ()):
            blk = make_block(template, parallel, comm, vst, ph if ph >= 0 else F, recv_ns,
                             send_ns, layout.rank_of[pv] if pv >= 0 else -1,
                             layout.rank_of[nv] if nv >= 0 else -1, scale,
                             zero3_comm=z3 if ph >= 0 else "gather")
            blocks[(vs, ph)] = (blk, pool.add_block(blk) if blk.n else -1)
    merged: dict[tuple, tuple[Block, int, np.ndarray, np.ndarray]] = {}
    dp_group = parallel.dp * parallel.cp
    reduce_grads = zero < 3 or piped
    # a bucket holds bucket_mb MB of the reduced gradients (fp32 main gradients: half the
    # parameters of a 16-bit bucket)
    bucket_params = parallel.bucket_mb * 1e6 / reduce_bytes_per_param(parallel, template)
    ds_reduce = zero in (1, 2) and parallel.zero_reduce == "reduce"
    # ZeRO-2 keeps only a shard of the gradients: every micro-batch's backward reduces
    # them (DeepSpeed, without overlap_comm in the backward's hooks; REFERENCES.md R46)
    per_mb = zero == 2
    sync_p2p = parallel.p2p in ("sync", "serial") and sched in SYNC_SCHEDULES and p > 1
    esrc: list[np.ndarray] = []
    edst: list[np.ndarray] = []
    ekind: list[np.ndarray] = []
    # (direction, mb, vs) -> op id; direction 0 forward (activations), 1 backward (grads)
    send_id: dict[tuple[int, int, int], int] = {}
    recv_id: dict[tuple[int, int, int], int] = {}
    recv_post: dict[tuple[int, int, int], int] = {}  # sync: the receiver's call point

    def add_edges(s, d, kind=EdgeKind.DATA):
        s = np.asarray(s, np.int64)
        esrc.append(s)
        edst.append(np.asarray(d, np.int64))
        ekind.append(np.full(len(s), int(kind), np.int8))

    def reduce_ops(grad_ops, base, stage, after=-1, blk=None):
        """Bucketed gradient reductions of one virtual stage after its last backward:
        dense gradients over the data-parallel group, expert gradients over the
        expert-data-parallel group. Each bucket waits for its gradients, and for ``after``
        (the stage's last compute op) when the reduction is not overlapped."""
        ids = []
        op_kind = CommOp.ALL_REDUCE if zero == 0 else CommOp.REDUCE_SCATTER
        cname = "dp.allreduce_grads" if zero == 0 else "dp.reduce_scatter_grads"
        if piped:  # FSDP: one reduce-scatter per layer (its parameter group)
            cname = "zero3.reduce_scatter_grads"
        if ds_reduce:  # DeepSpeed ZeRO-1/2: one reduce per owner's slice of each bucket
            op_kind, cname = CommOp.REDUCE, "dp.reduce_grads"
        # in the main gradients' dtype (Megatron-LM: fp32 unless fp16), FSDP2 in its
        # reduce_dtype (torchtitan: fp32; .fsdp)
        gbytes = reduce_bytes_per_param(parallel, template)
        for col, group, gk, name in ((1, "dp", 0, cname), (2, "edp", _EDP, cname + ".experts")):
            if comm.geometry[group].size <= 1:
                continue
            gops = [(g[0], g[col]) for g in grad_ops if g[col]]
            if not gops:
                continue
            ops, deps = [], []
            bks = grad_buckets(gops, 1 if piped else DS_BUCKET if ds_reduce else bucket_params)
            calls = (owner_slices([n for _, n in bks], comm.geometry[group].size) if ds_reduce
                     else list(enumerate(n for _, n in bks)))
            for i, params in calls:
                ready = bks[i][0]
                nbytes = int(params * gbytes)
                layer = blk.cols["layer"][ready] if blk is not None else -1
                ops.append((OpTemplate(name, "dp", comm.collective_ns(op_kind, nbytes, group),
                                       kind=int(OpKind.COLLECTIVE), bytes=nbytes,
                                       comm_op=int(op_kind)), int(Phase.BWD), layer))
                deps.append(base + ready)
            first = pool.add_ops(ops, stage, gkind=gk)
            new = np.arange(first, first + len(ops))
            add_edges(deps, new)
            if after >= 0:
                add_edges([after] * len(new), new)
            ids.extend(new.tolist())
        return ids

    emb_ops: list[int] = []
    mp_ops: list[int] = []
    for stage in range(p):
        order = stage_order(sched, p, m, v, stage)
        pairs = set(overlapped_pairs(sched, p, m, stage))
        # the last item of each virtual stage that completes gradients
        last_grad: dict[int, int] = {}
        for k, (ph, _mb, c) in enumerate(order):
            vs = layout.vs_of(sched, p, c, stage)
            if blocks[(vs, ph)][0].grad_ops:
                last_grad[vs] = k
        sync_ops: list[int] = []
        deferred: list[tuple[list, int]] = []  # reductions waiting for the last backward
        blocking: list[int] = []  # ZeRO-2 reductions the next item's compute waits for
        last_compute = -1
        last_scatter = -1
        # per item: (recv, send, exit, first compute) op ids, -1 none
        item_ids: list[tuple[int, int, int, int]] = []
        gathered: set[int] = set()  # pipelined FSDP: virtual stages already gathered

        def key_of(vs, ph, gathered=gathered):
            if piped and ph == F and vs not in gathered:
                gathered.add(vs)
                return (vs, -F - 1)
            return (vs, ph)
        k = 0
        while k < len(order):
            ph, mb, c = order[k]
            vs = layout.vs_of(sched, p, c, stage)
            if k in pairs:  # DualPipe: a forward and a backward chunk overlapped
                ph2, mb2, c2 = order[k + 1]
                vs2 = layout.vs_of(sched, p, c2, stage)
                ka, kb = key_of(vs, ph), key_of(vs2, ph2)
                key = (ka, kb)
                if key not in merged:
                    mblk, ma, mbm = merge_blocks(blocks[ka][0], blocks[kb][0],
                                                  comm_sm_stretch(comm.hw))
                    merged[key] = (mblk, pool.add_block(mblk), ma, mbm)
                mblk, bid, ma, mbm = merged[key]
                base = pool.add_piece(bid, mb, stage, c, mb2, c2)
                parts = [(order[k], vs, blocks[ka][0], ma),
                         (order[k + 1], vs2, blocks[kb][0], mbm)]
                grad_blk = (mblk, base)
                k_next = k + 2
            else:
                blk, bid = blocks[key_of(vs, ph)]
                base = pool.add_piece(bid, mb, stage, c) if bid >= 0 else pool.n
                parts = [(order[k], vs, blk, None)]
                grad_blk = (blk, base)
                k_next = k + 1
            for (iph, imb, _ic), ivs, blk, mp in parts:
                def at(i, mp=mp, base=base):
                    return -1 if i < 0 else base + (int(mp[i]) if mp is not None else i)
                d = 0 if iph == F else 1
                if blk.entry >= 0:
                    recv_id[(d, imb, ivs)] = at(blk.entry)
                if blk.send >= 0:
                    send_id[(d, imb, ivs)] = at(blk.send)
                if blk.exit >= 0:
                    last_compute = at(blk.exit)
                if blk.last_scatter >= 0:
                    last_scatter = at(blk.last_scatter)
                item_ids.append((at(blk.entry), at(blk.send), at(blk.exit),
                                 at(blk.first_compute)))
                if blocking and blk.first_compute >= 0:
                    add_edges(blocking, [at(blk.first_compute)] * len(blocking))
                    blocking = []
            gblk, gbase = grad_blk
            if reduce_grads and dp_group > 1 and gblk.grad_ops and any(
                    per_mb or last_grad.get(ivs) == kk for kk, (_, ivs, _, _) in
                    zip(range(k, k_next), parts, strict=True)):
                for kk, (_, ivs, blk, mp) in zip(range(k, k_next), parts, strict=True):
                    if not blk.grad_ops or not (per_mb or last_grad.get(ivs) == kk):
                        continue
                    gops = [((int(mp[i]) if mp is not None else i), dn, ex)
                            for i, dn, ex in blk.grad_ops]
                    ex_ = blk.exit if mp is None else int(mp[blk.exit])
                    if piped:  # FSDP's post-backward, run once the whole backward is done
                        sync_ops.extend(reduce_ops(gops, gbase, stage, after=gbase + ex_,
                                                   blk=gblk))
                    elif parallel.grad_overlap:
                        sync_ops.extend(reduce_ops(gops, gbase, stage))
                    elif per_mb and last_grad.get(ivs) != kk:  # on the compute stream
                        blocking = reduce_ops(gops, gbase, stage, after=gbase + ex_)
                        sync_ops.extend(blocking)
                    else:
                        deferred.append((gops, gbase))
            k = k_next
        for gops, gbase in deferred:  # Megatron-LM: after the stage's last backward
            sync_ops.extend(reduce_ops(gops, gbase, stage, after=last_compute))
        if sync_p2p:
            sync_edges(order, item_ids, call_after(sched, order, p, m, v, stage), layout, sched, p,
                       stage, add_edges, recv_post, serial=parallel.p2p == "serial")
        if p > 1 and template.tied_embedding_params and stage in (0, p - 1) \
                and layout.chains == 1:
            nbytes = int(template.tied_embedding_params
                         * reduce_bytes_per_param(parallel, template))
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
        if p > 1 and template.optimizer_kernels:
            # Megatron's optimizer first all-reduces the squared gradient norm (and the
            # fp16 inf check) over the replica's model-parallel ranks: every stage's step
            # waits for the last backward of the whole pipeline
            geo = comm.geometry_of_ranks([s_ * parallel.dp * parallel.cp * parallel.tp + t
                                          for s_ in range(p) for t in range(parallel.tp)])
            gn = pool.add_ops([(OpTemplate("optimizer.grad_norm_allreduce", "dp",
                                           comm.collective_ns(CommOp.ALL_REDUCE, 8, geo),
                                           kind=int(OpKind.COLLECTIVE), bytes=8,
                                           comm_op=int(CommOp.ALL_REDUCE)), int(Phase.OPT))],
                              stage, gkind=_MP)
            add_edges(sync_ops + ([last_compute] if last_compute >= 0 else []),
                      [gn] * (len(sync_ops) + (last_compute >= 0)))
            mp_ops.append(gn)
            sync_ops.append(gn)
        # optimizer step (sharded over data-parallel ranks with ZeRO >= 1; experts over the
        # expert-data-parallel ranks)
        dense, expert = stage_params(template, layout, stage)
        shard = dense / (dp_group if zero >= 1 else 1) \
            + expert / (parallel.edp if zero >= 1 else 1)
        ops = []
        for kname, bpp in template.optimizer_kernels:
            if kname == "optimizer.copy_grads" and reduce_bytes_per_param(parallel, template) == 4:
                continue  # fp32 main gradients: the optimizer takes them as they are
            if kname == "optimizer.adam_step" and parallel.moment_dtype == "bf16":
                bpp -= 8.0  # m and v read and written in 2 bytes instead of 4 (R54)
            kc = streaming(hw, bpp * shard)
            ops.append((OpTemplate(kname, "compute", kc.dur_ns, bytes=kc.bytes,
                                   kind=int(OpKind.KERNEL)), int(Phase.OPT)))
        n_opt = len(ops)
        gathers = []
        if zero in (1, 2):
            for params, group, gk in ((dense, "dp", 0), (expert, "edp", _EDP)):
                if params and comm.geometry[group].size > 1:
                    # DeepSpeed gathers in shards of allgather_bucket_size elements
                    shards = max(1, int(params // DS_BUCKET)) if ds_reduce else 1
                    nbytes = int(params / shards * template.param_bytes_per_param)
                    gathers += [(OpTemplate("dp.allgather_params", "dp",
                                            comm.collective_ns(CommOp.ALL_GATHER, nbytes, group),
                                            kind=int(OpKind.COLLECTIVE), bytes=nbytes,
                                            comm_op=int(CommOp.ALL_GATHER)), gk)] * shards
        if not ops and not gathers:
            continue
        # the optimizer reads reduced gradients: it waits for the stage's last in-block FSDP
        # reduce-scatter too (FSDP2's post-backward callback makes the compute stream wait
        # for the reduce-scatter stream before the step; one lane runs them in issue order)
        deps = sync_ops + [i for i in (last_compute, last_scatter) if i >= 0]
        prev_last = -1
        if ops:
            n = pool.add_ops(ops, stage)
            add_edges(deps, [n] * len(deps))
            add_edges(np.arange(n, n + n_opt - 1), np.arange(n + 1, n + n_opt))
            prev_last = n + n_opt - 1
        prev_gather = -1
        for op, gk in gathers:  # parameter all-gathers after the (sharded) optimizer step
            g = pool.add_ops([(op, int(Phase.OPT))], stage, gkind=gk)
            add_edges([prev_last] if prev_last >= 0 else deps,
                      [g] * (1 if prev_last >= 0 else len(deps)))
            if prev_gather >= 0:  # DeepSpeed's shards: one after the other
                add_edges([prev_gather], [g])
            prev_gather = g
    # pipeline p2p pairs: the send of (dir, mb, vs) and the receive of the next virtual stage
    # (forward) or the previous one (backward) are one transfer, a two-member instance that
    # starts together, as measured sends/receives pair (collectors/oplevel.py): no send ->
    # receive edge, which would make the receiver pay the transfer a second time
    ps, pd_, rs, rd = [], [], [], []
    for (d, mb, vs), sid in send_id.items():
        peer_vs = layout.next_vs(vs) if d == 0 else layout.prev_vs(vs)
        rid = recv_id.get((d, mb, peer_vs))
        if rid is not None:
            ps.append(sid)
            pd_.append(rid)
            post = recv_post.get((d, mb, peer_vs), -1)
            if post >= 0:  # blocking p2p: the transfer starts when the receiver calls
                rs.append(post)
                rd.append(sid)
    add_edges(rs, rd)
    rep, isrc, idst = pool.materialize()
    n = pool.n
    pair = np.full(n, -1, np.int64)  # pair index of each send/receive (-1: not a pair)
    pair[np.asarray(ps, np.int64)] = np.arange(len(ps))
    pair[np.asarray(pd_, np.int64)] = np.arange(len(ps))
    rep["p2p_pair"] = pair
    src = np.concatenate([isrc] + esrc)
    dst = np.concatenate([idst] + edst)
    kinds = np.concatenate([np.full(len(isrc), int(EdgeKind.DATA), np.int8)] + ekind)
    lag = np.zeros(len(src), np.int64)
    nl = len(LANES)
    rep_lane = rep["stage"].astype(np.int32) * nl + rep["lane"]
    group = np.full(n, -1, np.int64)
    group[emb_ops] = 0  # the cross-stage collectives among representatives
    group[mp_ops] = 1 if emb_ops else 0
    paired = pair >= 0
    group[paired] = int(bool(emb_ops)) + int(bool(mp_ops)) + pair[paired]
    dur0 = np.ascontiguousarray(rep["dur_ns"])
    dur = dur0.copy()
    # a receive holds the transfer (its send's duration) and then its own cost: both members
    # record the transfer, not a wait, and the receiver goes on once the data arrived
    dur[np.asarray(pd_, np.int64)] += dur0[np.asarray(ps, np.int64)]
    start, done = _list_schedule(dur, rep_lane, p * nl, src, dst, lag, group)
    p2p_pairs = "instances" if len(ps) else "none"
    if done != n and len(ps):
        # a schedule whose FIFO send and receive lanes order the pairs inconsistently
        # (DualPipe's two directions) would deadlock with start-together pairs: each
        # receive waits for its send instead (sends/receives keep coll_id -1)
        group[paired] = -1
        rep["p2p_pair"] = np.full(n, -1, np.int64)
        src = np.concatenate([src, np.asarray(ps, np.int64)])
        dst = np.concatenate([dst, np.asarray(pd_, np.int64)])
        kinds = np.concatenate([kinds, np.full(len(ps), int(EdgeKind.P2P), np.int8)])
        lag = np.zeros(len(src), np.int64)
        dur = dur0
        start, done = _list_schedule(dur, rep_lane, p * nl, src, dst, lag, group)
        p2p_pairs = "edges"
    if done != n:
        raise RuntimeError(f"synth builder produced a dependency cycle ({n - done} ops "
                           "unscheduled); this is a bug")
    if p2p_pairs == "instances":
        start, dur = own_ready_starts(start, dur, rep_lane, src, dst, lag, paired)
    rep["start_ns"] = start
    rep["dur_ns"] = dur
    meta = dict(meta or {})
    meta.setdefault("stage_layers", list(layout.counts))
    meta["p2p_pairs"] = p2p_pairs
    with no_hugepages():
        return expand_ranks(rep, src, dst, kinds, parallel, strings, step, expand, max_ops,
                            meta)
