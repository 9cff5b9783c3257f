"""PyTorch's ring attention (``torch.distributed.tensor.experimental.context_parallel``,
torchtitan's CP), priced kernel by kernel on the slowest context rank.

PyTorch's ``_templated_ring_attention`` (load-balanced, its default: each rank holds the
sequence chunks ``c`` and ``2 cp - 1 - c``) runs ``cp`` flash-attention calls per layer
instead of one: step 0 the local queries against the local keys (causal, ``s x s``), then
``cp - 1`` steps without a mask on half blocks (``s x s/2`` on the ranks whose step sees
earlier keys, ``s/2 x s`` on the others): the same FLOPs as one causal ``s x S`` kernel,
in smaller kernels. After each step ``_SDPAMerger`` merges the step's output and
log-sum-exp into running fp32 tensors in eager elementwise ops, and the backward
(``_templated_ring_attention_backward``) accumulates dQ, dK, dV in fp32 per step. Rank
``cp - 1`` moves the most bytes (all its later steps merge whole-length outputs), so it is
the one priced. Per element of the local output ``O = b * heads * s * v_dim`` (bf16 in,
fp32 running), of the local K+V ``KV`` and of the local queries ``Q``:

- forward: step 0 casts its output to fp32 (read 2, write 4: 6 bytes); each later step
  casts (6), ``out - block_out`` (12), ``sigmoid(.) * diff`` (8), ``out - prod`` (12): 38;
  the result is cast back to bf16 (6); per row (``b * heads * s``) each later step's
  log-sum-exp update is five fp32 elementwise ops on one value (52 bytes); each step but
  the last concatenates K and V for the rotation (bf16 read + write: 4 per KV element).
- backward: fp32 zeros for dQ, dK, dV (4); step 0 adds dK, dV (read 4 + 2, write 4: 10)
  and concatenates them for the rotation (fp32: 8); each later step adds its half-block dK,
  dV into the received fp32 buffer and re-concatenates the halves (``_partial_update``:
  10 on half the elements + 8: 13), concatenates for the rotation (8), and concatenates
  K, V (4) except at the last step; every step adds dQ (10 per Q element); dQ and dK, dV
  are cast back to bf16 at the end (6).

K and V are ``heads`` wide, not ``kv_heads``: torchtitan's Llama attention expands them with
``repeat_kv`` before ``F.scaled_dot_product_attention`` (R17), so the ring circulates,
concatenates and accumulates the expanded tensors. The backward rotates the fp32 dK/dV
accumulators to the next rank after every step (``dkv_rotater``: ``_RotateMethod.
ALL_TO_ALL``, a ``permute_tensor`` of the whole local buffer, ``cp`` transfers): the
transfer issued after step ``i`` is waited after step ``i + 1``'s kernel (beside it), the
last one after the loop (exposed) (:func:`dkv_rotation_bytes`); the forward and the
backward each all-gather the expanded K/V once (``rotate_method = ALL_GATHER``,
:func:`ring_kv_bytes`), issued before step 0 and waited before step 1 (``next_buffer``).

These counts are read off the source (``pytorch/pytorch``,
``torch/distributed/tensor/experimental/_attention.py``); the bytes are priced at the HBM
rate by the cost layer's :func:`memory_bound`, the step kernels by
:func:`~retime.collectors.costs.kernels.attention`; nothing is fitted.
Megatron-LM's CP (Transformer Engine's ``AttnFuncWithCPAndKVP2P``) has the same per-step
structure with fused correction kernels; the synthesizer's default (``cp_attention =
"fused"``) prices one flash kernel over the whole key range for it (a lower bound).
"""

from __future__ import annotations

from .costs import KernelCost

__all__ = ["ring_merge_bytes", "ring_kv_bytes", "dkv_rotation_bytes", "ring_fwd_ops",
           "ring_bwd_ops", "ring_bwd_comm"]


def ring_merge_bytes(cp: int, out_elems: int, rows: int, kv_elems: int, q_elems: int,
                     backward: bool) -> int:
    """HBM bytes of PyTorch ring attention's eager merge / accumulation ops on rank ``cp - 1``
    for one layer (module docstring): ``out_elems`` output elements, ``rows`` log-sum-exp
    rows, ``kv_elems`` K plus V elements, ``q_elems`` query elements (all local)."""
    later = cp - 1
    if not backward:
        return out_elems * (6 + 38 * later + 6) + rows * 52 * later + kv_elems * 4 * later
    return (q_elems * (4 + 10 * cp + 6)
            + kv_elems * (4 + 10 + 8 + (13 + 8) * later + 4 * later + 6))


def _steps(x, backward: bool) -> tuple[KernelCost, KernelCost]:
    """Step 0 (causal ``s x s``) and one later step (``s x s/2``, no mask), priced by the
    cost layer's flash model."""
    from ..costs.kernels import attention
    from .costs import _spec
    m = x.m
    out = []
    for sk, causal in ((x.s, True), (x.s // 2, False)):
        c = attention(_spec(x.hw), x.b, m.heads // x.t, x.s, m.qk_head_dim, causal=causal,
                      backward=backward, dtype=x.adtype, seq_k=sk, v_dim=m.v_head_dim)
        out.append(KernelCost(int(round(c.time_us * 1e3)), c.flops, int(c.bytes)))
    return out[0], out[1]


def _shapes(x) -> tuple[int, int, int, int]:
    """(local output elements, log-sum-exp rows, local K+V elements, query elements); K
    and V expanded to the query heads (``repeat_kv``, module docstring)."""
    m = x.m
    heads = m.heads // x.t
    rows = x.b * heads * x.s
    return (rows * m.v_head_dim, rows,
            x.b * heads * x.s * (m.qk_head_dim + m.v_head_dim),
            rows * m.qk_head_dim)


def ring_kv_bytes(x) -> int:
    """Bytes of the K/V all-gather of one layer (forward or backward): the expanded K and V
    of the whole sequence, 16-bit."""
    m = x.m
    return int(x.act * x.b * x.S * (m.heads // x.t) * (m.qk_head_dim + m.v_head_dim))


def dkv_rotation_bytes(x) -> int:
    """Bytes of one of the backward's ``cp`` dK/dV rotations: the rank's fp32 dK and dV
    accumulators (expanded heads)."""
    return 4 * _shapes(x)[2]


def _ops(x, prefix: str, backward: bool) -> list:
    from .template_ctx import _k
    cp = x.par.cp
    first, later = _steps(x, backward)
    d = "bwd" if backward else "fwd"
    rest = KernelCost(later.dur_ns * (cp - 1), later.flops * (cp - 1), later.bytes * (cp - 1))
    merge = x.st(ring_merge_bytes(cp, *_shapes(x), backward=backward))
    return [_k(f"{prefix}attn.flash.{d}", first),
            _k(f"{prefix}attn.flash_ring_steps.{d}", rest),
            _k(f"{prefix}attn.ring_merge.{d}", merge)]


def ring_fwd_ops(x, prefix: str = "") -> list:
    """The forward ring attention of one layer: step 0, the ``cp - 1`` later steps (one op
    of their summed time) and the merges (one streaming op of their bytes)."""
    return _ops(x, prefix, backward=False)


def ring_bwd_ops(x) -> list:
    """The backward ring attention of one layer (as :func:`ring_fwd_ops`)."""
    return _ops(x, "", backward=True)


def ring_bwd_comm(x, att: list) -> list:
    """The backward ring attention ``att`` (:func:`ring_bwd_ops`) with its communication:
    the K/V all-gather beside step 0 (the later steps wait for it), the ``cp - 1`` fp32
    dK/dV rotations beside the later steps (one op on the CP lane, from step 0 on) and the
    last rotation, exposed."""
    from ..enums import CommOp, OpKind
    from .builder import OpTemplate
    cp, n = x.par.cp, len(att)
    one = dkv_rotation_bytes(x)
    t1 = x.comm.p2p_ns(one, "cp")
    c, sr = int(OpKind.COLLECTIVE), int(CommOp.SEND_RECV)
    return [x.cp_coll("cp.allgather_kv", CommOp.ALL_GATHER, ring_kv_bytes(x)),
            OpTemplate(**{**att[0].__dict__, "deps": (-2,)}),
            OpTemplate(**{**att[1].__dict__, "deps": (-1, -2)}), *att[2:],
            OpTemplate("cp.rotate_dkv", "cp", (cp - 1) * t1, kind=c, bytes=(cp - 1) * one,
                       comm_op=sr, deps=(-n, -1 - n)),
            OpTemplate("cp.rotate_dkv.last", "cp", t1, kind=c, bytes=one, comm_op=sr,
                       deps=(-1, -2))]
