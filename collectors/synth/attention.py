"""Attention in the synthesizer's layer templates (one rank, one micro-batch).

The attention core after the QKV projection: unfused (scores, softmax, dropout, weighted
sum) or one flash kernel, forward and backward. Multi-head latent attention (DeepSeek):
low-rank Q (down, norm, up) and compressed KV (down to ``kv_lora_rank`` + a shared rotary
key, norm, up to per-head K and V), the down projections replicated over TP ranks, the up
projections column-parallel, with DeepSeek-V3's selective recompute. Used by
:mod:`.layers`.
"""

from __future__ import annotations

from ..enums import CommOp
from .builder import OpTemplate
from .costs import KernelCost
from .template_ctx import _S, _Ctx, _k, _norm


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
