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

Multi-head latent attention (DeepSeek): low-rank Q (down, norm, up) and compressed KV
(down to ``kv_lora_rank`` + a shared rotary key, norm, up to per-head K and V), the down
projections replicated over TP ranks, the up projections column-parallel. Mixture-of-experts
layers: :mod:`collectors.synth.moe`. FP8 (``dtype = "fp8"``): linear-layer GEMMs run at the
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

from ..enums import CommOp, OpKind
from .builder import LayerTemplate, OpTemplate, StepTemplate
from .costs import CommModel, KernelCost, gemm, streaming
from .framework import eager_template, op_recompute, tp_overlap_template
from .hardware import HardwareConfig
from .models import ModelConfig
from .parallel import ParallelConfig
from .ring import ring_bwd_comm, ring_bwd_ops, ring_fwd_ops, ring_kv_bytes
from .schedule import SPLIT_BACKWARD

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
        self.adtype = "bf16" if par.dtype in ("fp8", "fp4") else par.dtype  # attention core
        self.split = par.schedule in SPLIT_BACKWARD
        # CUDA_LAUNCH_BLOCKING=1: a launch returns when its kernel or collective has
        # finished, so a collective issued "asynchronously" beside a GEMM still runs alone
        self.serial = par.launch_blocking_us > 0
        # the backward's TP reduction after the weight gradient, not beside it (R60)
        self.serial_tp = self.serial or not par.tp_async_allreduce
        self.w: list[OpTemplate] = []  # weight-gradient ops of the layer being built (split)

    def g(self, m: int, n: int, k: int, batch: int = 1) -> KernelCost:
        """A linear layer's GEMM (FP8 when the run is FP8, cast as its recipe scales)."""
        return gemm(self.hw, self.dtype, m, n, k, batch, self.par.fp8_scaling)

    def ga(self, m: int, n: int, k: int, batch: int = 1) -> KernelCost:
        """An attention-core GEMM (BF16 in FP8 runs)."""
        return gemm(self.hw, self.adtype, m, n, k, batch)

    def wgrad(self, ops: list[OpTemplate], *wops: OpTemplate) -> None:
        """Weight-gradient ops: inline (``ops``) or, with a split backward, to ``self.w``."""
        (self.w if self.split else ops).extend(wops)

    def st(self, nbytes: float, flops: float = 0.0) -> KernelCost:
        return streaming(self.hw, nbytes, flops)

    def tp_coll(self, name: str, op: CommOp, nbytes: int, deps=(-1,)) -> OpTemplate:
        return OpTemplate(name, "tp", self.comm.collective_ns(op, nbytes, "tp"), kind=_C,
                          bytes=int(nbytes), comm_op=int(op), deps=deps)

    def cp_coll(self, name: str, op: CommOp, nbytes: int, deps=(-1,)) -> OpTemplate:
        return OpTemplate(name, "cp", self.comm.collective_ns(op, nbytes, "cp"), kind=_C,
                          bytes=int(nbytes), comm_op=int(op), deps=deps)


def _flash(x: _Ctx, backward: bool) -> KernelCost:
    """A causal flash kernel of this rank's ``s`` queries over the ``S`` keys they attend
    to: the cost layer's one flash model (:func:`~retime.collectors.costs.kernels.
    attention`, the GPU's published FA2 rate, as for measured kernels)."""
    from ..costs.kernels import attention
    from .costs import _spec
    m = x.m
    heads, kvh = m.heads // x.t, max(1, m.kv_heads // x.t)  # K/V heads (GQA) per TP rank
    c = attention(_spec(x.hw), x.b, heads, x.s, m.qk_head_dim,
                  kvh if heads % kvh == 0 else None, causal=True, backward=backward,
                  dtype=x.adtype, seq_k=x.S, v_dim=m.v_head_dim)
    return KernelCost(int(round(c.time_us * 1e3)), c.flops, int(c.bytes))


def _torch_ring(x: _Ctx) -> bool:
    """PyTorch's ring attention (``cp_attention = "torch"``, module ``ring``) prices this
    layer's CP attention step by step."""
    return x.par.cp > 1 and x.par.cp_attention == "torch" and x.m.attention == "flash"


def _attention_fwd(x: _Ctx, prefix: str = "") -> list[OpTemplate]:
    """Attention core after QKV: scores, softmax, dropout, weighted sum (or flash)."""
    m = x.m
    heads = m.heads // x.t
    hd = m.head_dim
    ops: list[OpTemplate] = []
    if m.attention == "flash":
        ops.append(_k(prefix + "attn.flash.fwd", _flash(x, False)))
        return ops
    elems = x.b * heads * x.s * x.S
    ops.append(_k(prefix + "attn.scores.fwd", x.ga(x.s, x.S, hd, batch=x.b * heads)))
    ops.append(_k(prefix + "attn.softmax.fwd", x.st(2 * x.act * elems, 5.0 * elems)))
    if m.dropout:
        ops.append(_k(prefix + "attn.dropout.fwd", x.st((2 * x.act + 1) * elems)))
    ops.append(_k(prefix + "attn.context.fwd", x.ga(x.s, hd, x.S, batch=x.b * heads)))
    return ops


def _attention_bwd(x: _Ctx) -> list[OpTemplate]:
    m = x.m
    heads = m.heads // x.t
    hd = m.head_dim
    if m.attention == "flash":  # recomputed scores, dP, dV, dQ, dK in one kernel
        return [_k("attn.flash.bwd", _flash(x, True))]
    elems = x.b * heads * x.s * x.S
    ops = [_k("attn.context.bwd_dprobs", x.ga(x.s, x.S, hd, batch=x.b * heads)),
           _k("attn.context.bwd_dv", x.ga(x.S, hd, x.s, batch=x.b * heads))]
    if m.dropout:
        ops.append(_k("attn.dropout.bwd", x.st((2 * x.act + 1) * elems)))
    ops.append(_k("attn.softmax.bwd", x.st(3 * x.act * elems, 4.0 * elems)))
    ops.append(_k("attn.scores.bwd_dq", x.ga(x.s, hd, x.S, batch=x.b * heads)))
    ops.append(_k("attn.scores.bwd_dk", x.ga(x.S, hd, x.s, batch=x.b * heads)))
    return ops


def _mla_fwd(x: _Ctx, prefix: str) -> list[OpTemplate]:
    """Multi-head latent attention's projections up to Q, K, V (and their rotary part)."""
    m, T, h = x.m, x.T, x.h
    a = m.heads // x.t
    ops: list[OpTemplate] = []
    if m.q_lora_rank:
        r = m.q_lora_rank
        ops += [_k(prefix + "attn.q_down.fwd", x.g(T, r, h)),
                _k(prefix + "attn.q_norm.fwd", x.st(2 * x.act * T * r, 8.0 * T * r)),
                _k(prefix + "attn.q_up.fwd", x.g(T, a * m.qk_head_dim, r))]
    else:
        ops.append(_k(prefix + "attn.q.fwd", x.g(T, a * m.qk_head_dim, h)))
    r = m.kv_lora_rank
    ops += [_k(prefix + "attn.kv_down.fwd", x.g(T, r + m.qk_rope_dim, h), deps=(-1 - len(ops),)),
            _k(prefix + "attn.kv_norm.fwd", x.st(2 * x.act * T * r, 8.0 * T * r)),
            _k(prefix + "attn.kv_up.fwd", x.g(T, a * (m.head_dim + m.v_head_dim), r)),
            _k(prefix + "attn.rotary.fwd", x.st(2 * x.act * T * (a + 1) * m.qk_rope_dim),
               deps=(-1, -4))]
    return ops


def _mla_recompute(x: _Ctx) -> list[OpTemplate]:
    """DeepSeek-V3's selective recompute for latent attention: the attention norm, the latent
    norms and the up-projections (and the rotary embedding) rerun before the attention
    backward, from the kept input and latents."""
    m, T = x.m, x.T
    a = m.heads // x.t
    ops = [_norm(x, "recompute.attn.norm.fwd")]
    if m.q_lora_rank:
        r = m.q_lora_rank
        ops += [_k("recompute.attn.q_norm.fwd", x.st(2 * x.act * T * r, 8.0 * T * r)),
                _k("recompute.attn.q_up.fwd", x.g(T, a * m.qk_head_dim, r))]
    r = m.kv_lora_rank
    ops += [_k("recompute.attn.kv_norm.fwd", x.st(2 * x.act * T * r, 8.0 * T * r)),
            _k("recompute.attn.kv_up.fwd", x.g(T, a * (m.head_dim + m.v_head_dim), r)),
            _k("recompute.attn.rotary.fwd", x.st(2 * x.act * T * (a + 1) * m.qk_rope_dim))]
    return ops


def _mla_bwd(x: _Ctx) -> list[OpTemplate]:
    """Backward of :func:`_mla_fwd`: the up projections' and down projections' input and
    weight gradients, then the TP reduction of the input gradient (beside the weight
    gradients, or exposed with a split backward)."""
    m, T, h = x.m, x.T, x.h
    a = m.heads // x.t
    r, rq = m.kv_lora_rank, m.q_lora_rank
    kv_up = a * (m.head_dim + m.v_head_dim)
    ops = [_k("attn.rotary.bwd", x.st(2 * x.act * T * (a + 1) * m.qk_rope_dim)),
           _k("attn.kv_up.bwd_dgrad", x.g(T, r, kv_up)),
           _k("attn.kv_norm.bwd", x.st(3 * x.act * T * r, 8.0 * T * r)),
           _k("attn.kv_down.bwd_dgrad", x.g(T, h, r + m.qk_rope_dim))]
    w = [_k("attn.kv_up.bwd_wgrad", x.g(kv_up, r, T)),
         _k("attn.kv_down.bwd_wgrad", x.g(r + m.qk_rope_dim, h, T))]
    if rq:
        ops += [_k("attn.q_up.bwd_dgrad", x.g(T, rq, a * m.qk_head_dim)),
                _k("attn.q_norm.bwd", x.st(3 * x.act * T * rq, 8.0 * T * rq)),
                _k("attn.q_down.bwd_dgrad", x.g(T, h, rq))]
        w += [_k("attn.q_up.bwd_wgrad", x.g(a * m.qk_head_dim, rq, T)),
              _k("attn.q_down.bwd_wgrad", x.g(rq, h, T))]
    else:
        ops.append(_k("attn.q.bwd_dgrad", x.g(T, h, a * m.qk_head_dim)))
        w.append(_k("attn.q.bwd_wgrad", x.g(a * m.qk_head_dim, h, T)))
    if x.t > 1:
        full = x.act * T * h
        red = x.tp_coll("tp.reduce_scatter" if x.sp else "tp.allreduce",
                        CommOp.REDUCE_SCATTER if x.sp else CommOp.ALL_REDUCE, full)
        if x.split:
            ops.append(red)
            x.w.extend(w)
        else:
            ops.append(red)
            ops += [OpTemplate(**{**o.__dict__,
                                  "deps": (-2,) if i == 0 and not x.serial_tp else (-1,)})
                    for i, o in enumerate(w)]
            ops.append(OpTemplate("tp.wait", "compute", 0, kind=_S, flops=0.0,
                                  deps=(-1, -1 - len(w))))
    else:
        x.wgrad(ops, *w)
    return ops


def _norm(x: _Ctx, name: str, bwd: bool = False) -> OpTemplate:
    n = x.Tn * x.h
    return _k(name, x.st((3 if bwd else 2) * x.act * n + (4 * n if bwd else 0), 8.0 * n))


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


def _overlap(x: _Ctx, comm: OpTemplate, comp: OpTemplate,
             serial: bool | None = None) -> tuple[OpTemplate, OpTemplate]:
    """A communication kernel running beside a compute kernel: both slow down because they
    share SMs and HBM. With ``f`` the fraction of the ideal overlap achieved (C3, Agrawal et
    al. 2024), the pair takes ``max + (1 - f) * min`` instead of ``max``; the longer op is
    stretched by ``(1 - f) * min``. Under synchronous launches (``x.serial``) the compute
    op waits for the collective instead: the pair takes ``a + b`` (``serial``: the same for
    one pair, e.g. the backward's TP reduction without the asynchronous all-reduce)."""
    if x.serial if serial is None else serial:
        return comm, replace(comp, deps=(-1,))
    f = x.hw.overlap_efficiency
    a, b = comm.dur_ns, comp.dur_ns
    if a <= b:
        return comm, OpTemplate(**{**comp.__dict__, "dur_ns": int(b + (1 - f) * a)})
    return OpTemplate(**{**comm.__dict__, "dur_ns": int(a + (1 - f) * b)}), comp


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
