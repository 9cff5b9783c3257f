"""Op sequences of one pipeline item (a forward, backward, input- or weight-gradient pass of
one virtual stage for one micro-batch) and the pool that instantiates them.

A block is materialized once per (virtual stage, phase) and instantiated per micro-batch by
the builder (:mod:`collectors.synth.builder`); :func:`merge_blocks` interleaves a forward and
a backward block into one (DualPipe's overlapped F&B pairs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..enums import CommOp, OpKind, Phase
from ..trace import StringTable
from .expand import _EDP, _LANE

__all__ = ["Block", "VStage", "make_block", "merge_blocks", "comm_sm_stretch", "Pool",
           "grad_buckets", "DUALPIPE_COMM_SMS"]

_COMM_LANES = (_LANE["ep"], _LANE["tp"], _LANE["cp"])


@dataclass(frozen=True)
class VStage:
    """One virtual stage (model chunk): its layers and its neighbours along the chain."""

    index: int
    layers: range
    has_prev: bool  # receives activations (forward) from the previous virtual stage
    has_next: bool  # sends activations to the next virtual stage
    first: bool  # runs the embedding
    last: bool  # runs the head (final norm, logits, loss)


class Block:
    """Column arrays of one instantiable op sequence."""

    __slots__ = ("cols", "edges", "entry", "exit", "send", "grad_ops", "n", "first_compute",
                 "last_scatter")

    def __init__(self) -> None:
        self.cols: dict[str, list] = {k: [] for k in ("name", "lane", "kind", "dur", "flops",
                                                       "bytes", "comm", "layer", "phase",
                                                       "peer_stage", "gkind", "half")}
        self.edges: list[tuple[int, int]] = []
        self.entry = -1  # the pipeline receive op (first op), -1 none
        self.exit = -1  # op whose output is sent (last compute op)
        self.send = -1  # the pipeline send op, -1 none
        self.first_compute = -1
        # the last ZeRO-3 / FSDP gradient reduce-scatter issued in the block, -1 none: the
        # optimizer step reads the reduced gradients, so it waits for it
        self.last_scatter = -1
        # (op index, dense params, expert params): a layer's gradients are complete
        self.grad_ops: list[tuple[int, int, int]] = []
        self.n = 0

    def add(self, op, layer: int, phase: int, deps: list[int], peer_stage: int = -1,
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
        c["peer_stage"].append(peer_stage)
        c["gkind"].append(gkind)
        c["half"].append(0)
        for d in deps:
            if 0 <= d < i:
                self.edges.append((d, i))
        if self.first_compute < 0 and c["lane"][i] == _LANE["compute"]:
            self.first_compute = i
        self.n += 1
        return i

    def add_seq(self, ops, layer: int, phase: int, base: int) -> tuple[int, int]:
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
            "peer_stage": np.array(c["peer_stage"], np.int32),
            "gkind": np.array(c["gkind"], np.int8),
            "half": np.array(c["half"], np.int8),
            "esrc": np.array([a for a, _ in self.edges], np.int64),
            "edst": np.array([b for _, b in self.edges], np.int64),
        }


def _coll(name: str, lane: str, dur: int, nbytes: int, op: CommOp):
    from .builder import OpTemplate
    return OpTemplate(name, lane, int(dur), kind=int(OpKind.COLLECTIVE), bytes=int(nbytes),
                      comm_op=int(op))


def _gathers(blk: Block, lt, tpl, parallel, comm, prev_first: int, layer: int,
             phase: int, bwd: bool) -> list[int]:
    """ZeRO-3 / FSDP parameter all-gathers of one layer (dense over the data-parallel group,
    experts over the expert-data-parallel group), prefetched one layer ahead; with ODC
    point-to-point fetches from the owners."""
    out = []
    sfx = ".bwd" if bwd else ""
    odc = parallel.odc
    for params, group, gk in ((lt.params, "dp", 0), (lt.expert_params, "edp", _EDP)):
        if not params or comm.geometry[group].size <= 1:
            continue
        nbytes = params * tpl.param_bytes_per_param
        if odc:
            op = _coll("odc.fetch_params" + sfx, "dp", comm.odc_ns(nbytes, group), nbytes,
                       CommOp.ALL_GATHER)
        else:
            op = _coll("zero3.allgather_params" + sfx, "dp",
                       comm.collective_ns(CommOp.ALL_GATHER, nbytes, group), nbytes,
                       CommOp.ALL_GATHER)
        out.append(blk.add(op, layer, phase, [prev_first] if prev_first >= 0 else [],
                           gkind=gk))
    return out


def _scatters(blk: Block, lt, tpl, parallel, comm, last: int, layer: int, phase: int) -> None:
    """ZeRO-3 / FSDP gradient reduce-scatters of one layer (ODC: pushes to the owners);
    FSDP2 first copies the gradients into the reduce-scatter input on the compute lane
    (:mod:`.fsdp`)."""
    from .fsdp import copy_in, fsdp2, reduce_bytes_per_param
    for params, group, gk in ((lt.params, "dp", 0), (lt.expert_params, "edp", _EDP)):
        if not params or comm.geometry[group].size <= 1:
            continue
        nbytes = params * reduce_bytes_per_param(parallel, tpl)
        if fsdp2(parallel):
            last = blk.add(copy_in(comm.hw, tpl, parallel, params), layer, phase, [last],
                           gkind=gk)
        if parallel.odc:
            op = _coll("odc.push_grads", "dp", comm.odc_ns(nbytes, group, accumulate=True),
                       nbytes, CommOp.REDUCE_SCATTER)
        else:
            op = _coll("zero3.reduce_scatter_grads", "dp",
                       comm.collective_ns(CommOp.REDUCE_SCATTER, nbytes, group), nbytes,
                       CommOp.REDUCE_SCATTER)
        blk.last_scatter = blk.add(op, layer, phase, [last], gkind=gk)


def make_block(tpl, parallel, comm, vst: VStage, phase: int, recv_ns: int, send_ns: int,
               prev_stage: int = -1, next_stage: int = -1, scale: float = 1.0,
               zero3_comm: str = "layer") -> Block:
    """Ops of one item of virtual stage ``vst``: ``phase`` 0 forward, 1 whole backward,
    3 input-gradient pass, 2 weight-gradient pass (layers' ``wgrad`` sequences).
    ``prev_stage`` / ``next_stage`` are the pipeline ranks of the neighbouring virtual
    stages (the peers of the sends and receives); ``scale`` multiplies compute-kernel
    durations (sequence-length imbalance). ``zero3_comm`` (ZeRO-3 / FSDP only): ``"layer"``
    gathers each layer's parameters before it runs and reduce-scatters its gradients after
    its backward (every item); ``"gather"`` gathers only (the first forward of a pipelined
    stage, whose parameters then stay unsharded); ``"none"`` neither (the other items of a
    pipelined stage: the builder reduce-scatters after the stage's last backward)."""
    from .builder import OpTemplate
    from .fsdp import accumulate, copy_out, fsdp2
    if zero3_comm not in ("layer", "gather", "none"):
        raise ValueError(f"zero3_comm={zero3_comm!r}")
    blk = Block()
    zero3 = parallel.zero_stage == 3
    z3_gather = zero3 and zero3_comm != "none"
    z3_scatter = zero3 and zero3_comm == "layer"
    backward = phase != 0
    tphase = int(Phase.BWD if backward else Phase.FWD)
    prev = -1
    if phase in (0, 1, 3):
        has_recv = vst.has_prev if not backward else vst.has_next
        if has_recv:
            prev = blk.add(OpTemplate("pp.recv", "pp_recv", recv_ns, kind=int(OpKind.P2P),
                                      bytes=tpl.p2p_bytes, comm_op=int(CommOp.RECV)),
                           -1, tphase, [], prev_stage if not backward else next_stage)
            blk.entry = prev
    L = len(tpl.layers)
    pieces = []
    if not backward:
        if vst.first and tpl.embed is not None:
            pieces.append((tpl.embed, -1))
        pieces += [(tpl.layers[i], i) for i in vst.layers]
        if vst.last and tpl.head is not None:
            pieces.append((tpl.head, L))
    else:
        if vst.last and tpl.head is not None:
            pieces.append((tpl.head, L))
        pieces += [(tpl.layers[i], i) for i in reversed(vst.layers)]
        if vst.first and tpl.embed is not None:
            pieces.append((tpl.embed, -1))
    prev_first = -1
    # a layer's gradient reduce-scatters, issued on the dp lane only after the next layer's
    # parameter gathers: the backward prefetch (FSDP BACKWARD_PRE, Megatron-FSDP) issues the
    # next all-gather before the current reduce-scatter, so the gather overlaps this layer's
    # backward instead of queueing behind a reduction that waits for it to finish
    pending: list[tuple] = []
    for lt, layer in pieces:
        if phase == 0:
            seqs = [lt.fwd]
        elif phase == 1:
            seqs = [lt.bwd, lt.wgrad]
        elif phase == 3:
            seqs = [lt.bwd]
        else:
            seqs = [lt.wgrad]
        ops = tuple(o for s in seqs for o in s)
        if scale != 1.0:
            ops = tuple(OpTemplate(**{**o.__dict__, "dur_ns": int(o.dur_ns * scale)})
                        if o.lane == "compute" and o.kind == int(OpKind.KERNEL) else o
                        for o in ops)
        if not ops:
            continue
        base = prev
        gathers = (_gathers(blk, lt, tpl, parallel, comm, prev_first, layer, tphase,
                            backward) if z3_gather and phase in (0, 1, 3) else [])
        for args in pending:
            _scatters(blk, *args)
        pending = []
        if gathers and fsdp2(parallel):  # FSDP2's copy-out, on the compute lane
            for g in gathers:
                gk = blk.cols["gkind"][g]
                n = lt.expert_params if gk == _EDP else lt.params
                base = blk.add(copy_out(comm.hw, tpl, n), layer, tphase,
                               [g] + ([base] if base >= 0 else []), gkind=gk)
        first, last = blk.add_seq(ops, layer, tphase, base)
        for g in gathers:
            blk.edges.append((g, first))
        prev_first = first
        if base >= 0 and ops[0].deps != (-1,):
            blk.edges.append((base, first))
        prev = last
        grads_here = (phase in (1, 2)) or (phase == 3 and not lt.wgrad)
        if (grads_here and zero3 and zero3_comm == "none" and fsdp2(parallel)
                and (lt.params or lt.expert_params)):
            # FSDP2 under a pipeline: no reduce-scatter until the last backward, the new
            # gradients added into the unsharded accumulator on the compute lane (.fsdp)
            last = prev = blk.add(accumulate(comm.hw, tpl, parallel,
                                             lt.params + lt.expert_params),
                                  layer, tphase, [last])
        if grads_here and (lt.params or lt.expert_params):
            blk.grad_ops.append((last, lt.params, lt.expert_params))
            if z3_scatter:
                pending.append((lt, tpl, parallel, comm, last, layer, tphase))
    for args in pending:
        _scatters(blk, *args)
    # the op whose output leaves the stage: last op that is not on the dp lane
    lanes = blk.cols["lane"]
    ex = prev
    while ex >= 0 and lanes[ex] == _LANE["dp"]:
        ex -= 1
    blk.exit = ex
    if phase in (0, 1, 3):
        has_send = vst.has_next if not backward else vst.has_prev
        if has_send:
            blk.send = blk.add(OpTemplate("pp.send", "pp_send", send_ns, kind=int(OpKind.P2P),
                                          bytes=tpl.p2p_bytes, comm_op=int(CommOp.SEND)),
                               -1, tphase, [ex] if ex >= 0 else [],
                               next_stage if not backward else prev_stage)
    return blk


#: SMs DeepSeek-V3's all-to-all kernels hold while DualPipe overlaps them with computation:
#: "we employ the warp specialization technique and partition 20 SMs into 10 communication
#: channels" (arXiv 2412.19437 §3.2.2; §3.5.1: 20 of the H800's 132 SMs, "which will limit
#: the computational throughput"); DeepEP's ``Buffer.num_sms`` default is the same 20
#: (collectors/synth/REFERENCES.md R16).
DUALPIPE_COMM_SMS = 20


def comm_sm_stretch(hw) -> tuple[float, float]:
    """(factor, arithmetic intensity): a compute-bound kernel (FLOPs per HBM byte at least
    the GPU's BF16 ridge point) running beside DualPipe's communication kernels gets
    ``sm_count - DUALPIPE_COMM_SMS`` SMs and takes ``sm_count / (sm_count - 20)`` times as
    long; a memory-bound one still saturates HBM and is left as it is (FP16's ridge on GPUs
    without BF16)."""
    sms = int(hw.sm_count)
    if sms <= DUALPIPE_COMM_SMS:
        return 1.0, float("inf")
    pk = hw.peak_tflops
    ridge = (pk.get("bf16") or pk.get("fp16") or max(pk.values())) * 1e12 / (hw.hbm_gbps * 1e9)
    return sms / (sms - DUALPIPE_COMM_SMS), ridge


def _stretch_beside_comm(blk: Block, factor: float, ridge: float) -> None:
    """Stretch, by ``factor``, the compute kernels of ``blk`` (in issue order) that are
    issued while a communication op is in flight, from the op after it up to the first op
    that depends on it, and are compute-bound: FLOPs per byte at least ``ridge``, or flash
    attention."""
    c = blk.cols
    comm = [ln in _COMM_LANES for ln in c["lane"]]
    first_user = {}
    for s, d in blk.edges:
        if comm[s] and d < first_user.get(s, blk.n):
            first_user[s] = d
    beside = np.zeros(blk.n + 1, np.int64)
    for j in range(blk.n):
        if comm[j]:
            beside[j + 1] += 1
            beside[first_user.get(j, blk.n)] -= 1
    beside = np.cumsum(beside)[:blk.n] > 0
    comp = _LANE["compute"]
    for j in range(blk.n):
        # flash attention is compute-bound though its byte count holds the score tiles
        # (the cost layer prices it as GEMMs), so it is told by name
        if beside[j] and c["lane"][j] == comp and (
                c["flops"][j] >= ridge * max(c["bytes"][j], 1) or ".flash" in c["name"][j]):
            c["dur"][j] = int(round(c["dur"][j] * factor))


def merge_blocks(a: Block, b: Block, stretch: tuple[float, float] = (1.0, float("inf"))
                 ) -> tuple[Block, np.ndarray, np.ndarray]:
    """Interleave two blocks so that each one's communication (all-to-all, TP, CP) runs
    beside the other's computation (DualPipe's F&B chunk pairs): ``a``'s ops up to and
    including its next communication op, then ``b``'s likewise, and so on. ``stretch`` is
    :func:`comm_sm_stretch`'s (factor, intensity): a compute-lane kernel issued while a
    communication op is in flight (after it, before the first op that depends on it: the
    other half's segment, or the same half's independent work such as shared experts),
    whose FLOPs per byte reach the intensity, runs on fewer SMs and is stretched by the
    factor. Returns the merged block and the new index of every op of ``a`` and of ``b``."""
    def segments(blk: Block) -> list[list[int]]:
        segs, cur = [], []
        for i, ln in enumerate(blk.cols["lane"]):
            cur.append(i)
            if ln in _COMM_LANES:
                segs.append(cur)
                cur = []
        if cur:
            segs.append(cur)
        return segs
    sa, sb = segments(a), segments(b)
    order: list[tuple[int, int]] = []
    for k in range(max(len(sa), len(sb))):
        if k < len(sa):
            order += [(0, i) for i in sa[k]]
        if k < len(sb):
            order += [(1, i) for i in sb[k]]
    maps = [np.full(a.n, -1, np.int64), np.full(b.n, -1, np.int64)]
    out = Block()
    for new, (w, i) in enumerate(order):
        maps[w][i] = new
        src = (a, b)[w].cols
        for k in out.cols:
            out.cols[k].append(src[k][i] if k != "half" else w)
    out.n = len(order)
    for w, blk in enumerate((a, b)):
        out.edges += [(int(maps[w][s]), int(maps[w][d])) for s, d in blk.edges]
    if stretch[0] != 1.0:
        _stretch_beside_comm(out, *stretch)
    lanes = out.cols["lane"]
    out.first_compute = next((i for i, ln in enumerate(lanes) if ln == _LANE["compute"]), -1)
    out.grad_ops = [(int(maps[w][i]), p, e) for w, blk in enumerate((a, b))
                    for i, p, e in blk.grad_ops]
    return out, maps[0], maps[1]


def grad_buckets(grad_ops: list[tuple[int, int]], bucket_params: float) -> list[tuple[int, int]]:
    """Group layer gradients (in backward order) into buckets: (ready op, params)."""
    out, acc = [], 0
    for i, (op, params) in enumerate(grad_ops):
        acc += params
        if acc >= bucket_params or i == len(grad_ops) - 1:
            out.append((op, acc))
            acc = 0
    return [(op, n) for op, n in out if n > 0]


def owner_slices(sizes: list[float], parts: int) -> list[tuple[int, float]]:
    """DeepSpeed ZeRO-1/2's reduction of consecutive buckets of a flat gradient buffer split
    into ``parts`` equal partitions (one per data-parallel rank): one ``dist.reduce`` per
    (bucket, owning partition) overlap, as ``stage_1_and_2.py: average_tensor`` issues them.
    Returns (bucket index, elements) per call."""
    part = float(sum(sizes)) / parts
    out, pos = [], 0.0
    for i, n in enumerate(sizes):
        lo, hi = pos, pos + n
        k = int(lo // part) if part > 0 else 0
        while k < parts and k * part < hi:
            a, b = max(lo, k * part), min(hi, (k + 1) * part)
            if b > a:
                out.append((i, b - a))
            k += 1
        pos = hi
    return out


class Pool:
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
        self.p_mb2: list[int] = []
        self.p_chunk2: list[int] = []
        self.n = 0

    def add_block(self, blk: Block) -> int:
        self.blocks.append(blk.arrays(self.strings))
        return len(self.blocks) - 1

    def add_piece(self, b: int, mb: int, stage: int, chunk: int, mb2: int = -1,
                  chunk2: int = -1) -> int:
        """Instantiate block ``b``; returns the op id of its first op. A merged block's
        second item's ops get ``mb2`` / ``chunk2``."""
        base = self.n
        self.p_block.append(b)
        self.p_mb.append(mb)
        self.p_stage.append(stage)
        self.p_chunk.append(chunk)
        self.p_mb2.append(mb2)
        self.p_chunk2.append(chunk2)
        self.n += len(self.blocks[b]["dur_ns"])
        return base

    def add_ops(self, ops: list, stage: int, gkind: int = 0) -> int:
        """A block of independent ops, each ``(op, phase)`` or ``(op, phase, layer)``."""
        blk = Block()
        for op, phase, *layer in ops:
            blk.add(op, layer[0] if layer else -1, phase, [], gkind=gkind)
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
        half = cols.pop("half").astype(bool)
        cols["microbatch"] = np.where(half, np.repeat(np.asarray(self.p_mb2, np.int32), plen),
                                      np.repeat(np.asarray(self.p_mb, np.int32), plen))
        cols["stage"] = np.repeat(np.asarray(self.p_stage, np.int16), plen)
        cols["chunk"] = np.where(half, np.repeat(np.asarray(self.p_chunk2, np.int16), plen),
                                 np.repeat(np.asarray(self.p_chunk, np.int16), plen)
                                 ).astype(np.int16)
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
