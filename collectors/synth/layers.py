"""Modeled per-layer op templates of a Megatron-style transformer (one rank, one micro-batch).

Tensor parallelism follows Megatron-LM: QKV and FC1 are column-parallel, projection and FC2
row-parallel, so the forward pass has one all-reduce after the attention block and one after
the MLP (with sequence parallelism: an all-gather before and a reduce-scatter after each
block, and norms/dropouts on ``1/t`` of the tokens). In the backward pass the input-gradient
all-reduce (reduce-scatter with SP) of column-parallel layers runs on the TP stream
concurrently with the weight-gradient GEMM, and with SP the all-gather of the saved input is
redone, overlapped with the data-gradient GEMM (Korthikanti et al. 2022, section 4.2.2).
Context parallelism (ring attention) all-gathers K/V on the CP stream concurrently with the
attention kernel and reduce-scatters dK/dV in backward.

Recompute: ``selective`` re-runs the attention core (scores, softmax, dropout) before its
backward; ``full`` re-runs the whole layer forward (including its TP communication) before
the layer's backward.
"""

from __future__ import annotations

import math

from ..enums import CommOp, OpKind
from .builder import LayerTemplate, OpTemplate, StepTemplate
from .costs import CommModel, KernelCost, gemm, streaming
from .hardware import HardwareConfig
from .models import ModelConfig
from .parallel import ParallelConfig

__all__ = ["padded_vocab", "model_template"]

_K = int(OpKind.KERNEL)
_C = int(OpKind.COLLECTIVE)
_S = int(OpKind.SYNC)  # zero-length join of the compute stream with a comm stream


def padded_vocab(model: ModelConfig, tp: int) -> int:
    """Vocabulary padded to a multiple of ``128 * tp`` (Megatron-LM's default)."""
    mult = 128 * tp
    return int(math.ceil(model.vocab / mult) * mult)


def _k(name: str, cost: KernelCost, deps: tuple[int, ...] = (-1,)) -> OpTemplate:
    return OpTemplate(name, "compute", cost.dur_ns, kind=_K, flops=cost.flops,
                      bytes=cost.bytes, deps=deps)


class _Ctx:
    """Shapes and cost helpers shared by the template functions."""

    def __init__(self, model: ModelConfig, hw: HardwareConfig, par: ParallelConfig,
                 comm: CommModel) -> None:
        self.m, self.hw, self.par, self.comm = model, hw, par, comm
        self.dtype = par.dtype
        self.t = par.tp
        self.sp = par.sequence_parallel
        self.b = par.micro_batch
        self.s = model.seq // par.cp  # local sequence length
        self.S = model.seq  # keys a local query attends to (full sequence)
        self.T = self.b * self.s  # tokens per rank per micro-batch
        self.Tn = self.T // self.t if self.sp else self.T  # tokens of norms / dropouts
        self.h = model.hidden
        self.act = 2  # activation element bytes (bf16/fp16)

    def g(self, m: int, n: int, k: int, batch: int = 1) -> KernelCost:
        return gemm(self.hw, self.dtype, m, n, k, batch)

    def st(self, nbytes: float, flops: float = 0.0) -> KernelCost:
        return streaming(self.hw, nbytes, flops)

    def tp_coll(self, name: str, op: CommOp, nbytes: int, deps=(-1,)) -> OpTemplate:
        return OpTemplate(name, "tp", self.comm.collective_ns(op, nbytes, "tp"), kind=_C,
                          bytes=int(nbytes), comm_op=int(op), deps=deps)

    def cp_coll(self, name: str, op: CommOp, nbytes: int, deps=(-1,)) -> OpTemplate:
        return OpTemplate(name, "cp", self.comm.collective_ns(op, nbytes, "cp"), kind=_C,
                          bytes=int(nbytes), comm_op=int(op), deps=deps)


def _attention_fwd(x: _Ctx, prefix: str = "") -> list[OpTemplate]:
    """Attention core after QKV: scores, softmax, dropout, weighted sum (or flash)."""
    m = x.m
    heads = m.heads // x.t
    hd = m.head_dim
    ops: list[OpTemplate] = []
    if m.attention == "flash":
        causal = 0.5 if x.par.cp == 1 else 0.5  # causal masking halves the work either way
        c = x.g(x.s, x.S, hd, batch=x.b * heads * 2)
        ops.append(_k(prefix + "attn.flash.fwd",
                      KernelCost(int(c.dur_ns * causal), c.flops * causal, c.bytes)))
        return ops
    elems = x.b * heads * x.s * x.S
    ops.append(_k(prefix + "attn.scores.fwd", x.g(x.s, x.S, hd, batch=x.b * heads)))
    ops.append(_k(prefix + "attn.softmax.fwd", x.st(2 * x.act * elems, 5.0 * elems)))
    if m.dropout:
        ops.append(_k(prefix + "attn.dropout.fwd", x.st((2 * x.act + 1) * elems)))
    ops.append(_k(prefix + "attn.context.fwd", x.g(x.s, hd, x.S, batch=x.b * heads)))
    return ops


def _attention_bwd(x: _Ctx) -> list[OpTemplate]:
    m = x.m
    heads = m.heads // x.t
    hd = m.head_dim
    if m.attention == "flash":
        c = x.g(x.s, x.S, hd, batch=x.b * heads * 5)  # 5 GEMMs of the forward's size
        return [_k("attn.flash.bwd", KernelCost(int(c.dur_ns * 0.5), c.flops * 0.5, c.bytes))]
    elems = x.b * heads * x.s * x.S
    ops = [_k("attn.context.bwd_dprobs", x.g(x.s, x.S, hd, batch=x.b * heads)),
           _k("attn.context.bwd_dv", x.g(x.S, hd, x.s, batch=x.b * heads))]
    if m.dropout:
        ops.append(_k("attn.dropout.bwd", x.st((2 * x.act + 1) * elems)))
    ops.append(_k("attn.softmax.bwd", x.st(3 * x.act * elems, 4.0 * elems)))
    ops.append(_k("attn.scores.bwd_dq", x.g(x.s, hd, x.S, batch=x.b * heads)))
    ops.append(_k("attn.scores.bwd_dk", x.g(x.S, hd, x.s, batch=x.b * heads)))
    return ops


def _norm(x: _Ctx, name: str, bwd: bool = False) -> OpTemplate:
    n = x.Tn * x.h
    return _k(name, x.st((3 if bwd else 2) * x.act * n + (4 * n if bwd else 0), 8.0 * n))


def _layer_fwd(x: _Ctx, prefix: str = "") -> list[OpTemplate]:
    m, t, T, h = x.m, x.t, x.T, x.h
    full = x.act * T * h  # bytes of one full [T, h] activation
    ops: list[OpTemplate] = [_norm(x, prefix + "attn.norm.fwd")]
    if x.sp:
        ops.append(x.tp_coll(prefix + "tp.allgather", CommOp.ALL_GATHER, full))
    qkv_n = (h + 2 * m.kv_dim) // t
    ops.append(_k(prefix + "attn.qkv.fwd", x.g(T, qkv_n, h)))
    if m.positions == "rotary":
        ops.append(_k(prefix + "attn.rotary.fwd", x.st(2 * x.act * T * (h + m.kv_dim) // t)))
    if x.par.cp > 1:
        kv = x.act * 2 * x.b * x.S * m.kv_dim // t
        ops.append(x.cp_coll(prefix + "cp.allgather_kv", CommOp.ALL_GATHER, kv))
        att = _attention_fwd(x, prefix)
        att[0] = OpTemplate(**{**att[0].__dict__, "deps": (-2,)})  # runs beside the gather
        ops += att
        ops.append(_k(prefix + "attn.proj.fwd", x.g(T, h, h // t), deps=(-1, -1 - len(att))))
    else:
        ops += _attention_fwd(x, prefix)
        ops.append(_k(prefix + "attn.proj.fwd", x.g(T, h, h // t)))
    if t > 1:
        ops.append(x.tp_coll(prefix + ("tp.reduce_scatter" if x.sp else "tp.allreduce"),
                             CommOp.REDUCE_SCATTER if x.sp else CommOp.ALL_REDUCE, full))
    n = x.Tn * h
    ops.append(_k(prefix + "attn.residual.fwd",
                  x.st((3 * x.act + (1 if m.dropout else 0)) * n, 2.0 * n)))
    ops.append(_norm(x, prefix + "mlp.norm.fwd"))
    if x.sp:
        ops.append(x.tp_coll(prefix + "tp.allgather", CommOp.ALL_GATHER, full))
    gate = 2 if m.gated_mlp else 1
    f = m.ffn // t
    ops.append(_k(prefix + "mlp.fc1.fwd", x.g(T, gate * f, h)))
    ops.append(_k(prefix + "mlp.act.fwd", x.st(x.act * T * f * (gate + 1), 8.0 * T * f)))
    ops.append(_k(prefix + "mlp.fc2.fwd", x.g(T, h, f)))
    if t > 1:
        ops.append(x.tp_coll(prefix + ("tp.reduce_scatter" if x.sp else "tp.allreduce"),
                             CommOp.REDUCE_SCATTER if x.sp else CommOp.ALL_REDUCE, full))
    ops.append(_k(prefix + "mlp.residual.fwd",
                  x.st((3 * x.act + (1 if m.dropout else 0)) * n, 2.0 * n)))
    return ops


def _overlap(x: _Ctx, comm: OpTemplate, comp: OpTemplate) -> tuple[OpTemplate, OpTemplate]:
    """A communication kernel running beside a compute kernel: both slow down because they
    share SMs and HBM. With ``f`` the fraction of the ideal overlap achieved (C3, Agrawal et
    al. 2024), the pair takes ``max + (1 - f) * min`` instead of ``max``; the longer op is
    stretched by ``(1 - f) * min``."""
    f = x.hw.overlap_efficiency
    a, b = comm.dur_ns, comp.dur_ns
    if a <= b:
        return comm, OpTemplate(**{**comp.__dict__, "dur_ns": int(b + (1 - f) * a)})
    return OpTemplate(**{**comm.__dict__, "dur_ns": int(a + (1 - f) * b)}), comp


def _column_bwd(x: _Ctx, name: str, n_out: int, k_in: int) -> list[OpTemplate]:
    """Backward of a column-parallel linear [T, k_in] -> [T, n_out]: dgrad, then the TP
    reduction of the input gradient beside the weight-gradient GEMM."""
    T, h = x.T, x.h
    full = x.act * T * h
    ops: list[OpTemplate] = []
    if x.sp:  # re-gather the saved (sharded) input for the weight gradient, beside dgrad
        ag, dg = _overlap(x, x.tp_coll("tp.allgather", CommOp.ALL_GATHER, full),
                          _k(name + ".bwd_dgrad", x.g(T, k_in, n_out), deps=(-2,)))
        ops += [ag, dg]
    else:
        ops.append(_k(name + ".bwd_dgrad", x.g(T, k_in, n_out)))
    if x.t > 1:
        red, wg = _overlap(x, x.tp_coll("tp.reduce_scatter" if x.sp else "tp.allreduce",
                                        CommOp.REDUCE_SCATTER if x.sp else CommOp.ALL_REDUCE,
                                        full),
                           _k(name + ".bwd_wgrad", x.g(n_out, k_in, T),
                              deps=(-2, -3) if x.sp else (-2,)))
        ops += [red, wg]
        ops.append(OpTemplate("tp.wait", "compute", 0, kind=_S, flops=0.0, deps=(-1, -2)))
    else:
        ops.append(_k(name + ".bwd_wgrad", x.g(n_out, k_in, T)))
    return ops


def _layer_bwd(x: _Ctx) -> list[OpTemplate]:
    m, t, T, h = x.m, x.t, x.T, x.h
    full = x.act * T * h
    n = x.Tn * h
    gate = 2 if m.gated_mlp else 1
    f = m.ffn // t
    ops: list[OpTemplate] = []
    if x.par.recompute == "full":
        ops += _layer_fwd(x, prefix="recompute.")
    ops.append(_k("mlp.residual.bwd", x.st((3 * x.act + (1 if m.dropout else 0)) * n)))
    if x.sp:
        ops.append(x.tp_coll("tp.allgather", CommOp.ALL_GATHER, full))
    ops.append(_k("mlp.fc2.bwd_dgrad", x.g(T, f, h)))
    ops.append(_k("mlp.fc2.bwd_wgrad", x.g(h, f, T)))
    ops.append(_k("mlp.act.bwd", x.st(x.act * T * f * (2 * gate + 1), 10.0 * T * f)))
    ops += _column_bwd(x, "mlp.fc1", gate * f, h)
    ops.append(_norm(x, "mlp.norm.bwd", bwd=True))
    ops.append(_k("attn.residual.bwd", x.st((3 * x.act + (1 if m.dropout else 0)) * n)))
    if x.sp:
        ops.append(x.tp_coll("tp.allgather", CommOp.ALL_GATHER, full))
    ops.append(_k("attn.proj.bwd_dgrad", x.g(T, h // t, h)))
    ops.append(_k("attn.proj.bwd_wgrad", x.g(h // t, h, T)))
    if x.par.recompute == "selective" and m.attention == "unfused":
        ops += _attention_fwd(x, prefix="recompute.")
    att = _attention_bwd(x)
    if x.par.cp > 1:  # ring attention backward: K/V circulate again (beside the kernel),
        # then dK/dV are reduce-scattered back to their owners
        kv = x.act * 2 * x.b * x.S * m.kv_dim // t
        ops.append(x.cp_coll("cp.allgather_kv", CommOp.ALL_GATHER, kv))
        att[0] = OpTemplate(**{**att[0].__dict__, "deps": (-2,)})
        ops += att
        ops.append(x.cp_coll("cp.reduce_scatter_dkv", CommOp.REDUCE_SCATTER, kv,
                             deps=(-1, -1 - len(att))))
    else:
        ops += att
    if m.positions == "rotary":
        ops.append(_k("attn.rotary.bwd", x.st(2 * x.act * T * (h + m.kv_dim) // t)))
    ops += _column_bwd(x, "attn.qkv", (h + 2 * m.kv_dim) // t, h)
    ops.append(_norm(x, "attn.norm.bwd", bwd=True))
    return ops


def _embed(x: _Ctx, vocab_p: int) -> LayerTemplate:
    m, T, h = x.m, x.T, x.h
    full = x.act * T * h
    n = x.Tn * h
    fwd = [_k("embed.lookup.fwd", x.st(2 * x.act * T * h))]
    bwd: list[OpTemplate] = []
    if x.t > 1:
        op = CommOp.REDUCE_SCATTER if x.sp else CommOp.ALL_REDUCE
        fwd.append(x.tp_coll("tp.reduce_scatter" if x.sp else "tp.allreduce", op, full))
        if x.sp:
            bwd.append(x.tp_coll("tp.allgather", CommOp.ALL_GATHER, full))
    if m.dropout:
        fwd.append(_k("embed.dropout.fwd", x.st((2 * x.act + 1) * n)))
        bwd.append(_k("embed.dropout.bwd", x.st((2 * x.act + 1) * n)))
    bwd.append(_k("embed.lookup.bwd", x.st(x.act * T * h + 4 * T * h * 2)))
    params = vocab_p * h // x.t + (m.seq * h if m.positions == "learned" else 0)
    return LayerTemplate(tuple(fwd), tuple(bwd), params)


def _head(x: _Ctx, vocab_p: int) -> LayerTemplate:
    m, T, h = x.m, x.T, x.h
    v = vocab_p // x.t
    full = x.act * T * h
    fwd = [_norm(x, "head.norm.fwd")]
    if x.sp:
        fwd.append(x.tp_coll("tp.allgather", CommOp.ALL_GATHER, full))
    fwd.append(_k("head.logits.fwd", x.g(T, v, h)))
    # vocab-parallel cross entropy: fp32 softmax over the local vocabulary shard plus three
    # small all-reduces (max, sum-exp, target logit) of [T] floats
    fwd.append(_k("head.cross_entropy.fwd", x.st((x.act + 4 + 4) * T * v, 6.0 * T * v)))
    if x.t > 1:
        for _ in range(3):
            fwd.append(x.tp_coll("tp.allreduce", CommOp.ALL_REDUCE, 4 * T))
    bwd = [_k("head.cross_entropy.bwd", x.st((4 + x.act) * T * v, 2.0 * T * v)),
           _k("head.logits.bwd_dgrad", x.g(T, h, v))]
    if x.t > 1:
        op = CommOp.REDUCE_SCATTER if x.sp else CommOp.ALL_REDUCE
        bwd += _overlap(x, x.tp_coll("tp.reduce_scatter" if x.sp else "tp.allreduce", op, full),
                        _k("head.logits.bwd_wgrad", x.g(v, h, T), deps=(-2,)))
        bwd.append(OpTemplate("tp.wait", "compute", 0, kind=_S, flops=0.0, deps=(-1, -2)))
    else:
        bwd.append(_k("head.logits.bwd_wgrad", x.g(v, h, T)))
    bwd.append(_norm(x, "head.norm.bwd", bwd=True))
    params = (0 if m.tied_embeddings and x.par.pp == 1 else vocab_p * h // x.t) + 2 * h
    return LayerTemplate(tuple(fwd), tuple(bwd), params)


def model_template(model: ModelConfig, hw: HardwareConfig, parallel: ParallelConfig,
                   comm: CommModel) -> StepTemplate:
    """Modeled per-layer op sequences (durations in ns) for :func:`build_trace`."""
    x = _Ctx(model, hw, parallel, comm)
    vocab_p = padded_vocab(model, parallel.tp)
    layer = LayerTemplate(tuple(_layer_fwd(x)), tuple(_layer_bwd(x)),
                          model.layer_params() // parallel.tp)
    # pipeline messages use Megatron's scatter/gather optimization: each TP rank sends 1/t
    # of the activation over its own NIC and the receiver all-gathers it over NVLink (with
    # SP the activation is already sharded, nothing to gather)
    p2p = x.act * x.T * x.h // x.t
    recv = int(hw.kernel_overhead_us * 1e3)
    if x.t > 1 and not x.sp:
        recv += comm.collective_ns(CommOp.ALL_GATHER, x.act * x.T * x.h, "tp")
    return StepTemplate(layers=(layer,) * model.layers, embed=_embed(x, vocab_p),
                        head=_head(x, vocab_p), p2p_bytes=int(p2p), recv_ns=recv,
                        tied_embedding_params=(vocab_p * x.h // x.t
                                               if model.tied_embeddings and parallel.pp > 1
                                               else 0),
                        name=model.name, meta={"padded_vocab": vocab_p})
