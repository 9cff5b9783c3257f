"""What a PyTorch-native trainer (torchtitan) runs that Megatron-LM's fused kernels do not.

Two behaviours of torchtitan's published runs (collectors/synth/REFERENCES.md R7) that the
Megatron-style layer templates of :mod:`.layers` do not have:

**Eager mode** (``ParallelConfig.eager``; ``retime synth --eager``): without
``torch.compile`` every elementwise op of the model code is its own kernel, reading and
writing whole tensors, and the norms and the loss run in fp32. Megatron-LM (Transformer
Engine / Apex fused kernels) and ``torch.compile`` fuse them; the layer templates price the
fused form. :data:`EAGER` lists, per op, the HBM bytes per element of the fused form (as
:mod:`.layers` prices it) and of torchtitan's eager code, kernel by kernel (bf16 = 2 bytes,
fp32 = 4; ``r`` read, ``w`` written; per element of the op's tensor):

- RMSNorm forward (torchtitan ``RMSNorm``: ``(x.float() * rsqrt(mean(x.float()**2) + eps))
  .type_as(x) * weight``): to fp32 r2 w4, pow r4 w4, mean r4, add + rsqrt (per row, ~0),
  mul r4 w4, to bf16 r4 w2, mul weight r2 w2 = 36 bytes, 7 kernels (fused: r2 w2 = 4).
- RMSNorm backward (autograd of that chain): grad x weight r2 w2, weight gradient (mul r2 r2
  w2, row reduction r2), to fp32 r2 w4, grad x rsqrt r4 w4, grad . x (mul r4 r4 w4, reduction
  r4), mean backward w4, pow backward r4 r4 w4, sum of the two input gradients r4 r4 w4, to
  bf16 r4 w2 = 76 bytes, 11 kernels (fused: 10).
- Rotary embedding (``apply_rotary_emb``: ``view_as_complex(x.float()) * freqs_cis``, then
  ``view_as_real(...).type_as(x)``), Q and K: to fp32 r2 w4, complex mul r4 w4, to bf16 r4
  w2 = 20 bytes, 3 kernels per tensor (fused: 4); the backward alike.
- SwiGLU (``silu(w1(x)) * w3(x)``), per element of the inner size: silu r2 w2, mul r2 r2 w2 =
  10 bytes, 2 kernels (fused: 6); backward: two products r2 r2 w2 each, silu backward r2 r2
  w2 = 18 bytes, 3 kernels (fused: 10).
- Cross entropy (``F.cross_entropy(pred.float(), labels)``), per logit: to fp32 r2 w4,
  log-softmax r4 w4 = 14 bytes, 3 kernels with the loss gather (fused: 10); backward: the
  loss gradient w4, log-softmax backward r4 r4 w4, to bf16 r4 w2 = 22 bytes, 3 kernels
  (fused: 6).

Residual adds, the embedding and flash attention are single kernels either way. Each eager
op is priced as the cost layer's streaming kernel over its eager bytes plus the launch/tail
of its extra kernels.

**torchtitan's torch.compile** (``ParallelConfig.compile_blocks``; ``retime synth
--compile-blocks``) at its December 2024 benchmarks (R7, commit 9dec370) did not fuse all
of the above: ``apply_compile`` compiles each ``TransformerBlock`` on its own, and

- the rotary embedding multiplies complex numbers (``view_as_complex(xq.float()) *
  freqs_cis``), for which Inductor generates no code ("Torchinductor does not support code
  generation for complex operators. Performance may be worse than eager", torchtitan issue
  #15): the cast, the complex product and the cast back stay eager kernels (20 bytes per
  element of Q and K, forward and backward, and in op-level checkpointing's recompute);
- the final norm and the output projection sit outside the compiled blocks and the loss is
  not compiled (``train.py``: "TODO: compiling loss function causes CUDA errors, turning off
  for now"): the final RMSNorm and the fp32 cross entropy run eager (the head's
  ``norm`` and ``cross_entropy`` ops).

Norms, SwiGLU products and residual adds inside the blocks are fused.

**Tensor-parallel communication overlapped with its GEMMs** (``ParallelConfig.tp_comm_overlap``;
``retime synth --tp-comm-overlap``): with sequence parallelism, the all-gather before a
column-parallel GEMM and the reduce-scatter after a row-parallel one are split into
per-peer pieces, each overlapped with the GEMM on the piece already there
(torchtitan's AsyncTP: ``fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter`` on
symmetric memory; Megatron-LM's ``--tp-comm-overlap`` with Transformer Engine's userbuffers,
off by default). Priced as the synthesizer's other overlapped pairs (:func:`.template_ctx._overlap`,
the profile's ``overlap`` fraction C3): the pair takes the longer op plus ``1 - overlap`` of
the shorter, and one piece of the collective (``1 / tp`` of it) stays exposed, since the
first GEMM piece of a reduce-scatter (or the last of an all-gather) has nothing to hide
behind. Collectives already overlapped (the backward's re-gather and input-gradient
reduction beside the weight-gradient GEMM) are left as they are.

**Op-level selective activation checkpointing** (``recompute = "op"``; ``retime synth
--recompute op``): torchtitan's ``selective_ac_option = "op"`` saves the outputs of the
matmuls, flash attention and the TP reduce-scatters of every layer *except every second
matmul* (``torchtitan/distributed/activation_checkpoint.py``: a per-layer count of forward
``mm`` calls, ``to_save = func in save_list and not (func == mm and count % 2 == 0)``) and
recomputes everything else in the layer's backward (with sequence parallelism also the
all-gathers of the norms' outputs): in torchtitan's Llama layer (``wq, wk,
wv, wo, w1, w3, w2`` in forward order) the 2nd, 4th and 6th matmuls (``wk``, ``wo``, ``w3``),
both RMSNorms, the rotary embedding of K and the SwiGLU product. Megatron's ``selective``
recomputes the attention core only (nothing with flash attention).
"""

from __future__ import annotations

from dataclasses import replace

from ..enums import CommOp, OpKind

__all__ = ["EAGER", "COMPILE_BLOCKS_EAGER", "COMPILE_BLOCKS_EAGER_HEAD", "eager_template",
           "op_recompute", "tp_overlap_template"]

#: op kind (last two name components) -> (fused bytes/element as :mod:`.layers` prices it,
#: eager bytes/element, eager kernels); see the module docstring for the kernel-by-kernel
#: counts. ``act`` entries hold for gated (SwiGLU) MLPs only.
EAGER: dict[str, tuple[float, float, int]] = {
    "norm.fwd": (4.0, 36.0, 7),
    "norm.bwd": (10.0, 76.0, 11),
    "rotary.fwd": (4.0, 20.0, 6),
    "rotary.bwd": (4.0, 20.0, 6),
    "act.fwd": (6.0, 10.0, 2),
    "act.bwd": (10.0, 18.0, 3),
    "cross_entropy.fwd": (10.0, 14.0, 3),
    "cross_entropy.bwd": (6.0, 22.0, 3),
}

_K = int(OpKind.KERNEL)


def _eager_key(name: str, gated: bool) -> str | None:
    parts = name.split(".")
    key = ".".join(parts[-2:])
    if key not in EAGER or (key.startswith("act.") and not gated):
        return None
    return key


#: op kinds torchtitan's per-block ``torch.compile`` leaves eager (module docstring): the
#: rotary embedding everywhere, the norm and the loss of the head (outside the blocks)
COMPILE_BLOCKS_EAGER = ("rotary.fwd", "rotary.bwd")
COMPILE_BLOCKS_EAGER_HEAD = ("norm.fwd", "norm.bwd", "cross_entropy.fwd", "cross_entropy.bwd")


def _compile_blocks_eager(name: str, key: str) -> bool:
    return key in COMPILE_BLOCKS_EAGER or (name.startswith("head.")
                                           and key in COMPILE_BLOCKS_EAGER_HEAD)


def eager_template(x, lt):
    """``lt`` (a :class:`~.builder.LayerTemplate`) with its norms, rotary embeddings, SwiGLU
    products and loss priced as PyTorch eager runs them (:data:`EAGER`); with
    ``x.par.compile_blocks`` only the ops torchtitan's per-block ``torch.compile`` leaves
    eager (module docstring); unchanged otherwise. ``x`` is the layer builder's context
    (:class:`~.template_ctx._Ctx`)."""
    if not (x.par.eager or x.par.compile_blocks):
        return lt
    some = not x.par.eager
    from .costs import streaming
    over = int(round(x.hw.kernel_overhead_us * 1e3))
    gated = bool(x.m.gated_mlp)

    def conv(ops):
        out = []
        for o in ops:
            key = _eager_key(o.name, gated) if o.kind == _K else None
            if key is not None and some and not _compile_blocks_eager(o.name, key):
                key = None
            if key is None or o.bytes <= 0:
                out.append(o)
                continue
            fused, eager, kernels = EAGER[key]
            c = streaming(x.hw, o.bytes * eager / fused, o.flops)
            out.append(replace(o, dur_ns=int(c.dur_ns + (kernels - 1) * over),
                               bytes=int(c.bytes)))
        return tuple(out)
    return replace(lt, fwd=conv(lt.fwd), bwd=conv(lt.bwd), wgrad=conv(lt.wgrad))


def op_recompute(x, layer: int) -> list:
    """The ops torchtitan's op-level selective checkpointing reruns at the start of a dense
    layer's backward (module docstring): both norms, the K projection and its rotary
    embedding, the attention output projection, the MLP's up projection (``w3``) and the
    SwiGLU product. Mixture-of-experts and latent-attention layers are not torchtitan Llama
    layers: they recompute nothing here."""
    from .template_ctx import _k, _norm
    m, t, T, h = x.m, x.t, x.T, x.h
    if m.mla or m.is_moe_layer(layer):
        return []
    kv = m.kv_dim // t
    full = x.act * T * h
    ops = [_norm(x, "recompute.attn.norm.fwd")]
    if x.sp:  # the all-gather of the norm's output is not in the save list either
        ops.append(x.tp_coll("recompute.tp.allgather", CommOp.ALL_GATHER, full))
    ops.append(_k("recompute.attn.k.fwd", x.g(T, kv, h)))
    if m.positions == "rotary":
        ops.append(_k("recompute.attn.rotary.fwd", x.st(2 * x.act * T * kv)))
    ops.append(_k("recompute.attn.proj.fwd", x.g(T, h, m.heads * m.v_head_dim // t)))
    ops.append(_norm(x, "recompute.mlp.norm.fwd"))
    if x.sp:
        ops.append(x.tp_coll("recompute.tp.allgather", CommOp.ALL_GATHER, full))
    f = m.ffn // t
    if m.gated_mlp:
        ops.append(_k("recompute.mlp.fc1_up.fwd", x.g(T, f, h)))
        ops.append(_k("recompute.mlp.act.fwd", x.st(x.act * T * f * 3, 8.0 * T * f)))
    return ops


def _is_gemm(o) -> bool:
    return o.kind == _K and o.lane == "compute" and o.name.endswith(
        (".fwd", ".bwd_dgrad", ".bwd_wgrad")) and o.flops == o.flops and o.flops > 0 \
        and not o.name.endswith(("norm.fwd", "act.fwd", "rotary.fwd", "cross_entropy.fwd",
                                 "residual.fwd", "lookup.fwd", "flash.fwd"))


def _overlap_seq(x, ops: tuple) -> tuple:
    """``ops`` with every (all-gather, GEMM) and (GEMM, reduce-scatter) pair on the TP lane
    run side by side (module docstring), joined by a zero-length wait; dependency offsets
    of the later ops are re-pointed past the inserted waits."""
    from .builder import OpTemplate
    from .template_ctx import _overlap
    t = x.t
    AG, RS = int(CommOp.ALL_GATHER), int(CommOp.REDUCE_SCATTER)
    out: list = []  # (op, its index in ``ops`` or None when its offsets are new ones)
    new_of: dict[int, int] = {}  # index in ``ops`` -> index in the result
    i, n = 0, len(ops)

    def put(o, old, fixed=False):
        if old is not None:
            new_of[old] = len(out)
        out.append((o, None if fixed else old))

    while i < n:
        a = ops[i]
        b = ops[i + 1] if i + 1 < n else None
        pair = None
        if b is not None and a.deps == (-1,) and b.deps == (-1,):
            if a.lane == "tp" and a.comm_op == AG and _is_gemm(b):
                pair = "ag"
            elif b.lane == "tp" and b.comm_op == RS and _is_gemm(a):
                pair = "rs"
        if pair is None:
            put(a, i)
            i += 1
            continue
        comm, gemm = (a, b) if pair == "ag" else (b, a)
        exposed = comm.dur_ns // t
        c2, g2 = _overlap(x, replace(comm, dur_ns=comm.dur_ns - exposed), gemm)
        c2 = replace(c2, dur_ns=c2.dur_ns + exposed)
        if pair == "ag":  # the GEMM starts on the local piece beside the gather
            put(c2, i, fixed=True)
            put(replace(g2, deps=(-2,)), i + 1, fixed=True)
        else:  # the reduce-scatter starts with the GEMM's first piece
            put(g2, i, fixed=True)
            put(replace(c2, deps=(-2,)), i + 1, fixed=True)
        put(OpTemplate("tp.wait", "compute", 0, kind=int(OpKind.SYNC), flops=0.0,
                       deps=(-1, -2)), None, fixed=True)
        i += 2
    res = []
    for j, (o, old) in enumerate(out):
        if old is None or o.deps in ((), (-1,)):
            res.append(o)  # new offsets, or "the previous op" (a join after a pair)
            continue
        deps = []
        for d in o.deps:
            tgt = old + d  # < 0: an op of the previous layer, counted from this one's start
            deps.append(new_of[tgt] - j if tgt >= 0 else tgt - j)
        res.append(replace(o, deps=tuple(deps)))
    return tuple(res)


def tp_overlap_template(x, lt):
    """``lt`` with its sequence-parallel TP collectives overlapped with their GEMMs
    (module docstring); unchanged unless ``x.par.tp_comm_overlap`` with ``tp > 1`` and
    sequence parallelism, and unchanged under synchronous launches (``x.serial``: each
    launch waits for its kernel, so the pieces cannot run side by side)."""
    if not (x.par.tp_comm_overlap and x.t > 1 and x.sp) or x.serial:
        return lt
    return replace(lt, fwd=_overlap_seq(x, lt.fwd), bwd=_overlap_seq(x, lt.bwd),
                   wgrad=_overlap_seq(x, lt.wgrad))
