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

The attention core and multi-head latent attention (DeepSeek):
:mod:`collectors.synth.attention`; shapes and op constructors shared with it:
:mod:`collectors.synth.template_ctx`. Mixture-of-experts layers: :mod:`collectors.synth.moe`. FP8 (``dtype = "fp8"``): linear-layer GEMMs run at the
FP8 peak (with the quantization of their input); the attention core stays in BF16 (as in
DeepSeek-V3's recipe). FP4 (``dtype = "fp4"``, NVFP4): the same for the linear layers of
every transformer layer but the first / last ``fp4_first_high`` / ``fp4_last_high`` (in
``fp4_high_dtype``); the attention core and the output head stay in BF16. Zero-bubble and DualPipe schedules split every layer's backward:
``bwd`` holds the input-gradient ops and ``wgrad`` the weight-gradient GEMMs (with the
sequence-parallel re-gather of their inputs).
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..enums import CommOp
from .attention import (
    _attention_bwd,
    _attention_fwd,
    _mla_bwd,
    _mla_fwd,
    _mla_recompute,
    _torch_ring,
)
from .builder import LayerTemplate, OpTemplate, StepTemplate
from .costs import CommModel
from .framework import eager_template, op_recompute, tp_overlap_template
from .hardware import HardwareConfig
from .models import ModelConfig
from .parallel import ParallelConfig
from .ring import ring_bwd_comm, ring_bwd_ops, ring_fwd_ops, ring_kv_bytes
from .template_ctx import _C, _K, _S, _Ctx, _k, _norm, _overlap

__all__ = ["padded_vocab", "model_template"]


def padded_vocab(model: ModelConfig, tp: int) -> int:
    """Vocabulary padded to a multiple of ``128 * tp`` (Megatron-LM's default)."""
    mult = 128 * tp
    return int(math.ceil(model.vocab / mult) * mult)


def _layer_fwd(x: _Ctx, layer: int, prefix: str = "") -> list[OpTemplate]:
    m, t, T, h = x.m, x.t, x.T, x.h
    full = x.act * T * h  # bytes of one full [T, h] activation
    ops: list[OpTemplate] = [_norm(x, prefix + "attn.norm.fwd")]
    if x.sp:
        ops.append(x.tp_coll(prefix + "tp.allgather", CommOp.ALL_GATHER, full))
    if m.mla:
        ops += _mla_fwd(x, prefix)
    else:
        qkv_n = (m.heads * m.head_dim + 2 * m.kv_dim) // t
        ops.append(_k(prefix + "attn.qkv.fwd", x.g(T, qkv_n, h)))
        if m.positions == "rotary":
            ops.append(_k(prefix + "attn.rotary.fwd",
                          x.st(2 * x.act * T * (h + m.kv_dim) // t)))
    proj_k = m.heads * m.v_head_dim // t
    if x.par.cp > 1:
        kv = ring_kv_bytes(x) if _torch_ring(x) else x.act * 2 * x.b * x.S * m.kv_dim // t
        ops.append(x.cp_coll(prefix + "cp.allgather_kv", CommOp.ALL_GATHER, kv))
        att = ring_fwd_ops(x, prefix) if _torch_ring(x) else _attention_fwd(x, prefix)
        att[0] = OpTemplate(**{**att[0].__dict__, "deps": (-2,)})  # runs beside the gather
        if _torch_ring(x):  # step 1 waits for the gathered K/V (``next_buffer``)
            att[1] = OpTemplate(**{**att[1].__dict__, "deps": (-1, -2)})
        ops += att
        ops.append(_k(prefix + "attn.proj.fwd", x.g(T, h, proj_k), deps=(-1, -1 - len(att))))
    else:
        ops += _attention_fwd(x, prefix)
        ops.append(_k(prefix + "attn.proj.fwd", x.g(T, h, proj_k)))
    if t > 1:
        ops.append(x.tp_coll(prefix + ("tp.reduce_scatter" if x.sp else "tp.allreduce"),
                             CommOp.REDUCE_SCATTER if x.sp else CommOp.ALL_REDUCE, full))
    n = x.Tn * h
    ops.append(_k(prefix + "attn.residual.fwd",
                  x.st((3 * x.act + (1 if m.dropout else 0)) * n, 2.0 * n)))
    ops.append(_norm(x, prefix + "mlp.norm.fwd"))
    if m.is_moe_layer(layer):
        from .moe import moe_fwd
        ops += moe_fwd(x, prefix)
    else:
        ops += _mlp_fwd(x, m.ffn, prefix)
    ops.append(_k(prefix + "mlp.residual.fwd",
                  x.st((3 * x.act + (1 if m.dropout else 0)) * n, 2.0 * n)))
    return ops


def _mlp_fwd(x: _Ctx, ffn: int, prefix: str = "", name: str = "mlp") -> list[OpTemplate]:
    """A (gated) MLP of inner size ``ffn``, column- then row-parallel over TP ranks."""
    m, t, T, h = x.m, x.t, x.T, x.h
    full = x.act * T * h
    ops: list[OpTemplate] = []
    if x.sp:
        ops.append(x.tp_coll(prefix + "tp.allgather", CommOp.ALL_GATHER, full))
    gate = 2 if m.gated_mlp else 1
    f = ffn // t
    ops.append(_k(prefix + name + ".fc1.fwd", x.g(T, gate * f, h)))
    ops.append(_k(prefix + name + ".act.fwd", x.st(x.act * T * f * (gate + 1), 8.0 * T * f)))
    ops.append(_k(prefix + name + ".fc2.fwd", x.g(T, h, f)))
    if t > 1:
        ops.append(x.tp_coll(prefix + ("tp.reduce_scatter" if x.sp else "tp.allreduce"),
                             CommOp.REDUCE_SCATTER if x.sp else CommOp.ALL_REDUCE, full))
    return ops


def _column_bwd(x: _Ctx, name: str, n_out: int, k_in: int) -> list[OpTemplate]:
    """Backward of a column-parallel linear [T, k_in] -> [T, n_out]: dgrad, then the TP
    reduction of the input gradient beside the weight-gradient GEMM. With a split backward
    the reduction is exposed and the weight gradient (with the SP re-gather of its saved
    input) goes to the weight-gradient pass."""
    T, h = x.T, x.h
    full = x.act * T * h
    ops: list[OpTemplate] = []
    red_name = "tp.reduce_scatter" if x.sp else "tp.allreduce"
    red_op = CommOp.REDUCE_SCATTER if x.sp else CommOp.ALL_REDUCE
    if x.split:
        ops.append(_k(name + ".bwd_dgrad", x.g(T, k_in, n_out)))
        if x.t > 1:
            ops.append(x.tp_coll(red_name, red_op, full))
        if x.sp:
            x.w.append(x.tp_coll("tp.allgather", CommOp.ALL_GATHER, full))
        x.w.append(_k(name + ".bwd_wgrad", x.g(n_out, k_in, T)))
        return ops
    if x.sp:  # re-gather the saved (sharded) input for the weight gradient, beside dgrad
        ag, dg = _overlap(x, x.tp_coll("tp.allgather", CommOp.ALL_GATHER, full),
                          _k(name + ".bwd_dgrad", x.g(T, k_in, n_out), deps=(-2,)))
        ops += [ag, dg]
    else:
        ops.append(_k(name + ".bwd_dgrad", x.g(T, k_in, n_out)))
    if x.t > 1:
        red, wg = _overlap(x, x.tp_coll(red_name, red_op, full),
                           _k(name + ".bwd_wgrad", x.g(n_out, k_in, T),
                              deps=(-2, -3) if x.sp else (-2,)), x.serial_tp)
        ops += [red, wg]
        ops.append(OpTemplate("tp.wait", "compute", 0, kind=_S, flops=0.0, deps=(-1, -2)))
    else:
        ops.append(_k(name + ".bwd_wgrad", x.g(n_out, k_in, T)))
    return ops


def _mlp_bwd(x: _Ctx, ffn: int, name: str = "mlp") -> list[OpTemplate]:
    m, t, T, h = x.m, x.t, x.T, x.h
    full = x.act * T * h
    gate = 2 if m.gated_mlp else 1
    f = ffn // t
    ops: list[OpTemplate] = []
    if x.sp:
        ops.append(x.tp_coll("tp.allgather", CommOp.ALL_GATHER, full))
    ops.append(_k(name + ".fc2.bwd_dgrad", x.g(T, f, h)))
    x.wgrad(ops, _k(name + ".fc2.bwd_wgrad", x.g(h, f, T)))
    ops.append(_k(name + ".act.bwd", x.st(x.act * T * f * (2 * gate + 1), 10.0 * T * f)))
    ops += _column_bwd(x, name + ".fc1", gate * f, h)
    return ops


def _layer_bwd(x: _Ctx, layer: int) -> list[OpTemplate]:
    m, t, T, h = x.m, x.t, x.T, x.h
    full = x.act * T * h
    n = x.Tn * h
    ops: list[OpTemplate] = []
    if x.par.recompute == "full":
        ops += _layer_fwd(x, layer, prefix="recompute.")
    elif x.par.recompute == "op":  # torchtitan's op-level selective checkpointing
        ops += op_recompute(x, layer)
    ops.append(_k("mlp.residual.bwd", x.st((3 * x.act + (1 if m.dropout else 0)) * n)))
    if m.is_moe_layer(layer):
        from .moe import moe_bwd
        ops += moe_bwd(x)
    else:
        ops += _mlp_bwd(x, m.ffn)
    ops.append(_norm(x, "mlp.norm.bwd", bwd=True))
    ops.append(_k("attn.residual.bwd", x.st((3 * x.act + (1 if m.dropout else 0)) * n)))
    if x.sp:
        ops.append(x.tp_coll("tp.allgather", CommOp.ALL_GATHER, full))
    proj_k = m.heads * m.v_head_dim // t
    ops.append(_k("attn.proj.bwd_dgrad", x.g(T, proj_k, h)))
    x.wgrad(ops, _k("attn.proj.bwd_wgrad", x.g(proj_k, h, T)))
    if x.par.recompute == "selective" and m.attention == "unfused":
        ops += _attention_fwd(x, prefix="recompute.")
    if x.par.recompute == "selective" and m.mla:  # DeepSeek: norms and up-projections redone
        ops += _mla_recompute(x)
    att = ring_bwd_ops(x) if _torch_ring(x) else _attention_bwd(x)
    if x.par.cp > 1 and _torch_ring(x):  # gather, steps, fp32 dK/dV rotations (ring.py)
        ops += ring_bwd_comm(x, att)
    elif x.par.cp > 1:  # ring attention backward: K/V circulate again (beside the kernel),
        # then dK/dV are reduce-scattered back to their owners
        kv = x.act * 2 * x.b * x.S * m.kv_dim // t
        ops.append(x.cp_coll("cp.allgather_kv", CommOp.ALL_GATHER, kv))
        att[0] = OpTemplate(**{**att[0].__dict__, "deps": (-2,)})
        ops += att
        ops.append(x.cp_coll("cp.reduce_scatter_dkv", CommOp.REDUCE_SCATTER, kv,
                             deps=(-1, -1 - len(att))))
    else:
        ops += att
    if m.mla:
        ops += _mla_bwd(x)
    else:
        if m.positions == "rotary":
            ops.append(_k("attn.rotary.bwd", x.st(2 * x.act * T * (h + m.kv_dim) // t)))
        ops += _column_bwd(x, "attn.qkv", (m.heads * m.head_dim + 2 * m.kv_dim) // t, h)
    ops.append(_norm(x, "attn.norm.bwd", bwd=True))
    return ops


def _layer(x: _Ctx, layer: int) -> LayerTemplate:
    """A layer's template: forward, (input-gradient) backward, weight-gradient ops, and its
    dense / expert parameters on one rank."""
    m, P = x.m, x.par
    fwd = tuple(_layer_fwd(x, layer))
    x.w = []
    bwd = tuple(_layer_bwd(x, layer))
    w = tuple(x.w)
    x.w = []
    expert = 0
    if m.is_moe_layer(layer):
        expert = m.expert_params() // P.ep // P.tp
        dense = (m.layer_params(layer) - m.expert_params()) // P.tp
    else:
        dense = m.layer_params(layer) // P.tp
    return LayerTemplate(fwd, bwd, dense, wgrad=w, expert_params=expert)


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
    x.w = []
    if x.t > 1 and not x.split:
        op = CommOp.REDUCE_SCATTER if x.sp else CommOp.ALL_REDUCE
        bwd += _overlap(x, x.tp_coll("tp.reduce_scatter" if x.sp else "tp.allreduce", op, full),
                        _k("head.logits.bwd_wgrad", x.g(v, h, T), deps=(-2,)), x.serial_tp)
        bwd.append(OpTemplate("tp.wait", "compute", 0, kind=_S, flops=0.0, deps=(-1, -2)))
    else:
        if x.t > 1:
            op = CommOp.REDUCE_SCATTER if x.sp else CommOp.ALL_REDUCE
            bwd.append(x.tp_coll("tp.reduce_scatter" if x.sp else "tp.allreduce", op, full))
        x.wgrad(bwd, _k("head.logits.bwd_wgrad", x.g(v, h, T)))
    bwd.append(_norm(x, "head.norm.bwd", bwd=True))
    params = (0 if m.tied_embeddings and x.par.pp == 1 else vocab_p * h // x.t) + 2 * h
    w = tuple(x.w)
    x.w = []
    mfwd, mbwd, mw, mdense, mexp = _mtp(x, vocab_p)
    return LayerTemplate(tuple(mfwd) + tuple(fwd), tuple(bwd) + tuple(mbwd), params + mdense,
                         wgrad=w + tuple(mw), expert_params=mexp)


def _mtp(x: _Ctx, vocab_p: int) -> tuple[list, list, list, int, int]:
    """``mtp_depth`` multi-token-prediction modules before the head (DeepSeek-V3): each
    concatenates the hidden state with the next token's embedding, projects 2h -> h, runs
    one transformer layer (like the last one) and the shared output head with its loss.
    Returns forward, backward, weight-gradient ops and dense / expert params on one rank."""
    m, T, h = x.m, x.T, x.h
    fwd: list[OpTemplate] = []
    bwd: list[OpTemplate] = []
    w: list[OpTemplate] = []
    dense = expert = 0
    if not m.mtp_depth:
        return fwd, bwd, w, dense, expert
    last = m.layers - 1
    v = vocab_p // x.t
    for _ in range(m.mtp_depth):
        x.w = []
        fwd += [_norm(x, "mtp.norm.fwd"), _k("mtp.proj.fwd", x.g(T, h, 2 * h))]
        fwd += _layer_fwd(x, last, prefix="mtp.")
        fwd += [_k("mtp.logits.fwd", x.g(T, v, h)),
                _k("mtp.cross_entropy.fwd", x.st((x.act + 4 + 4) * T * v, 6.0 * T * v))]
        b = [_k("mtp.cross_entropy.bwd", x.st((4 + x.act) * T * v, 2.0 * T * v)),
             _k("mtp.logits.bwd_dgrad", x.g(T, h, v))]
        x.wgrad(b, _k("mtp.logits.bwd_wgrad", x.g(v, h, T)))
        b += _layer_bwd(x, last)
        b.append(_k("mtp.proj.bwd_dgrad", x.g(T, 2 * h, h)))
        x.wgrad(b, _k("mtp.proj.bwd_wgrad", x.g(2 * h, h, T)))
        bwd = b + bwd
        w = list(x.w) + w
        lt = _layer(x, last)
        dense += lt.params + (2 * h * h + 2 * h) // x.t
        expert += lt.expert_params
    x.w = []
    return fwd, bwd, w, dense, expert


def _accumulate(x: _Ctx, lt: LayerTemplate) -> LayerTemplate:
    """``lt`` with autograd's gradient accumulation when the weight-gradient GEMMs do not
    accumulate themselves (``grad_accum_fusion`` off): from the second micro-batch on each
    parameter's new 16-bit gradient is added into ``param.grad`` (read both, write one: 6
    bytes per parameter). The template is the same for every micro-batch, so the kernel is
    priced at ``(m - 1) / m`` of one pass (the step's total is exact)."""
    params = lt.params + lt.expert_params
    m = x.par.num_microbatches
    if x.par.grad_accum_fusion or params <= 0 or m <= 1:
        return lt
    op = _k("grad_accum", x.st(3 * x.act * params * (m - 1) / m))
    if lt.wgrad:
        return replace(lt, wgrad=lt.wgrad + (op,))
    return replace(lt, bwd=lt.bwd + (op,))


def _blocking(x: _Ctx, lt: LayerTemplate) -> LayerTemplate:
    """``lt`` under ``CUDA_LAUNCH_BLOCKING=1``: each op waits ``launch_blocking_us`` of host
    time after the previous one finished (the host issues it only then)."""
    gap = int(round(x.par.launch_blocking_us * 1e3))
    if gap <= 0:
        return lt

    def add(ops):
        return tuple(replace(o, dur_ns=o.dur_ns + gap) if o.kind in (_K, _C) else o
                     for o in ops)
    return replace(lt, fwd=add(lt.fwd), bwd=add(lt.bwd), wgrad=add(lt.wgrad))


def _finish(x: _Ctx, lt: LayerTemplate) -> LayerTemplate:
    """The framework's costs on top of the layer's kernels."""
    return _blocking(x, _accumulate(x, tp_overlap_template(x, eager_template(x, lt))))


def model_template(model: ModelConfig, hw: HardwareConfig, parallel: ParallelConfig,
                   comm: CommModel) -> StepTemplate:
    """Modeled per-layer op sequences (durations in ns) for :func:`build_trace`."""
    x = _Ctx(model, hw, parallel, comm)
    vocab_p = padded_vocab(model, parallel.tp)
    kinds: dict[str, tuple[LayerTemplate, LayerTemplate]] = {}
    L = model.layers
    for dt in sorted({parallel.linear_dtype(i, L) for i in range(L)}):
        x.dtype = dt  # FP4 runs: FP4 layers and the first / last ones kept in higher precision
        dense = _finish(x, _layer(x, 0))
        moe = _finish(x, _layer(x, model.dense_layers)) if model.moe and model.moe_layers \
            else dense
        kinds[dt] = (dense, moe)
    layers = tuple(kinds[parallel.linear_dtype(i, L)][1 if model.is_moe_layer(i) else 0]
                   for i in range(L))
    if parallel.offload_layers:
        from .offload import offload_model_layers
        layers = offload_model_layers(model, hw, parallel, layers)
    if parallel.dtype == "fp4":
        x.dtype = "bf16"  # the output head (and MTP modules) stay out of FP4
    # pipeline messages use Megatron's scatter/gather optimization: each TP rank sends 1/t
    # of the activation over its own NIC and the receiver all-gathers it over NVLink (with
    # SP the activation is already sharded, nothing to gather)
    p2p = x.act * x.T * x.h // x.t
    recv = int(hw.kernel_overhead_us * 1e3)
    if x.t > 1 and not x.sp:
        recv += comm.collective_ns(CommOp.ALL_GATHER, x.act * x.T * x.h, "tp")
    return StepTemplate(layers=layers, embed=_finish(x, _embed(x, vocab_p)),
                        head=_finish(x, _head(x, vocab_p)), p2p_bytes=int(p2p), recv_ns=recv,
                        tied_embedding_params=(vocab_p * x.h // x.t
                                               if model.tied_embeddings and parallel.pp > 1
                                               else 0),
                        name=model.name, meta={"padded_vocab": vocab_p})
