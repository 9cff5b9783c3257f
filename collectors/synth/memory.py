"""Memory per rank of a modeled run: weights, gradients, optimizer states, activations.

Activations follow Korthikanti et al. 2022 (arXiv 2205.05198), generalized to grouped-query
attention, gated MLPs, models without dropout and flash attention. Per layer and micro-batch,
with ``s`` the local sequence, ``b`` the micro-batch, ``h`` the hidden size, ``a`` heads, ``t``
the tensor-parallel size (2-byte activations, 1-byte dropout masks)::

    replicated across TP (divided by t with sequence parallelism):
        2 norm inputs 4sbh, QKV input 2sbh, FC1 input 2sbh, 2 dropout masks 2sbh   -> 10 sbh
    sharded over TP:
        Q, K, V 6sbh, projection input 2sbh, FC1 output 8sbh, FC2 input 8sbh    -> 24 sbh / t
        unfused attention: softmax output 2as^2b, dropout mask as^2b, its output 2as^2b
                                                                                -> 5 as^2 b / t

which gives ``sbh(10 + 24/t + 5as/(ht))``; ``sbh/t (34 + 5as/h)`` with SP; ``34 sbh/t`` with
selective recompute and SP; and ``2sbh`` (``/t`` with SP) per layer with full recompute,
plus one layer's full activations while it is recomputed. A pipeline rank holds these for
every micro-batch it has forwarded but not yet backwarded (from the schedule's order: 1F1B
keeps ``min(p - i, m)``, GPipe ``m``).

FP8 runs keep the inputs of their linear layers (norm outputs, projection and FC2 inputs,
dispatched tokens) in one byte, as their quantized copies are what the backward GEMMs read;
FP4 layers keep them in NVFP4 (4 bits + one E4M3 scale per 16 elements: 0.5625 bytes) and
hold the quantized copies of their weights (row- and column-wise, 2 x 0.5625 bytes per
parameter) beside the 16-bit weights for the whole step (Transformer Engine caches them
across micro-batches).
Activation offload (``offload_layers``): those layers keep nothing on the GPU between their
forward and backward; two layers' worth of staging buffers stay (:mod:`collectors.synth.offload`).
With latent attention, ``selective`` recompute is DeepSeek-V3's: the norms and the MLA
up-projections are recomputed in the backward, so their outputs (norm outputs, per-head Q,
K, V) are not kept, and the routed experts keep only their SwiGLU input (FP8 in FP8 runs;
:func:`collectors.synth.moe.moe_activation_bytes`).

Model states use mixed-precision Adam (:func:`state_bytes_per_param`): 2-byte weights,
gradients in the main-gradient dtype (``ParallelConfig.grad_bytes``: 2 bytes for fp16 runs, 4
for bf16 / FP8 / FP4 ones under Megatron-LM's rule; FSDP2 runs 2), 12 bytes of fp32 master
weights and moments per parameter (8 with bf16 moments; 16 or 18 bytes in all; ZeRO-1 shards
the 12, ZeRO-2 also the gradients, ZeRO-3/FSDP also the weights over the data-parallel
ranks). 16-bit main gradients are copied to fp32 for the optimizer step (Megatron-LM's
``main_grad.float()``, 4 bytes per parameter of the optimizer's shard, freed after the step):
they count at the step, when the activations are gone, so they raise the peak only where they
outgrow the activations. Routed experts are
held by ``1/ep`` of the ranks and their states shard over the expert-data-parallel group
(``dp/ep * cp`` ranks). A MoE layer's MLP activations are those of its dispatched tokens on
the most loaded rank (:func:`collectors.synth.moe.moe_activation_bytes`); all-to-all send and
receive buffers of one dispatch count as buffers. Latent attention (MLA) keeps its Q, K, V
(per-head widths) and its two latents. With ODC the owners also keep an fp32 accumulation
shard of the gradients pushed to them.
"""

from __future__ import annotations

from .models import ModelConfig
from .parallel import ParallelConfig
from .schedule import BI, B, F, stage_order

__all__ = ["layer_activation_bytes", "korthikanti_layer_bytes", "memory_per_stage",
           "memory_timeline", "state_bytes_per_param"]


def state_bytes_per_param(parallel: ParallelConfig) -> dict[str, int]:
    """Model-state bytes per parameter before any data-parallel sharding.

    ``weights`` (16-bit), ``grads`` (the main-gradient buffer: ``grad_bytes``, FSDP2 2),
    ``optimizer`` (fp32 master weights + the two Adam moments: 12, or 8 with bf16 moments,
    ``moment_dtype``, REFERENCES.md R54) and ``step_copy`` (the
    fp32 copy of 16-bit main gradients the optimizer step makes, 4, or 0 when the buffer is
    already fp32 or FSDP2 holds fp32 sharded gradients). With the distributed optimizer
    (ZeRO-1) over ``d`` ranks a rank holds ``weights + grads + (optimizer + step_copy) / d``
    at the step: NVIDIA/Megatron-LM ``docs/api-guide/dist_optimizer.md``'s table, 4 + 16/d
    for fp16 gradients and 6 + 12/d for fp32 ones (20 and 18 without it; REFERENCES.md R53).
    """
    from .fsdp import fsdp2
    f2 = fsdp2(parallel)
    gb = 2 if f2 else parallel.grad_bytes
    moments = 2 * (2 if parallel.moment_dtype == "bf16" else 4)
    return {"weights": 2, "grads": gb, "optimizer": 4 + moments,
            "step_copy": 4 if gb == 2 and not f2 else 0}


def layer_activation_bytes(model: ModelConfig, parallel: ParallelConfig,
                           recompute: str | None = None, layer: int = 0) -> int:
    """Activation bytes layer ``layer`` keeps for its backward pass, per micro-batch, per
    rank."""
    rc = parallel.recompute if recompute is None else recompute
    t = parallel.tp
    sp = parallel.sequence_parallel
    s = model.seq // parallel.cp
    S = model.seq
    b = parallel.micro_batch
    h = model.hidden
    rep = 1.0 / t if sp else 1.0
    sbh = s * b * h
    if rc == "full":
        return int(2 * sbh * rep)
    drop = 1 if model.dropout else 0
    # FP8 training keeps the (quantized) inputs of its linear layers in one byte
    # (torchao's tensorwise Float8 keeps the 16-bit input and casts it again: 2 bytes)
    lin = {"fp8": 1, "fp4": 0.5625}.get(parallel.linear_dtype(layer, model.layers), 2)
    if parallel.fp8_scaling == "tensorwise":
        lin = 2
    mla_rc = model.mla and rc == "selective"  # DeepSeek: norms and MLA up-projections redone
    # torchtitan's op-level checkpointing: norm outputs, K, the MLP's w3 output and the
    # SwiGLU product are recomputed, not kept (collectors/synth/framework.py)
    op_rc = rc == "op" and not model.mla and not model.is_moe_layer(layer)
    norm_out = 0 if (mla_rc or op_rc) else lin + lin  # QKV (down) input, FC1 / router input
    replicated = (4 + norm_out + 2 * drop) * sbh
    gate = 2 if model.gated_mlp else 1
    a = model.heads
    if model.mla:  # Q, K (qk width), V per head, and the latents (replicated over TP)
        qkv = 0 if mla_rc else a * (2 * model.qk_head_dim + model.v_head_dim)
        replicated += lin * s * b * (model.q_lora_rank + model.kv_lora_rank
                                     + model.qk_rope_dim)
    else:
        qkv = a * model.head_dim + (1 if op_rc else 2) * model.kv_dim
    sharded = 2 * s * b * qkv + lin * s * b * a * model.v_head_dim
    if model.is_moe_layer(layer):
        from .moe import moe_activation_bytes
        sharded += moe_activation_bytes(model, parallel) * t
    elif op_rc:  # the w1 output (and w2's input, the product, is recomputed)
        sharded += 2 * s * b * model.ffn * (gate - 1 if model.gated_mlp else 1)
    else:
        sharded += 2 * s * b * model.ffn * gate + lin * s * b * model.ffn
    if model.attention == "unfused" and rc != "selective":
        sharded += (4 + drop) * model.heads * s * S * b
    elif model.attention == "flash":
        sharded += 4 * model.heads * s * b  # softmax statistics (fp32 logsumexp)
    return int(replicated * rep + sharded / t)


def _fp4_share(model: ModelConfig, parallel: ParallelConfig) -> float:
    """Fraction of the transformer layers whose linear GEMMs run in FP4."""
    n = model.layers
    return sum(parallel.linear_dtype(i, n) == "fp4" for i in range(n)) / max(n, 1)


def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, t: int, sp: bool,
                            recompute: str) -> float:
    """The paper's closed forms (GPT layers, ffn = 4h, dropout, unfused attention)."""
    if recompute == "full":
        return 2 * s * b * h / (t if sp else 1)
    if recompute == "selective":
        return 34 * s * b * h / t if sp else s * b * h * (10 + 24 / t)
    if sp:
        return s * b * h / t * (34 + 5 * a * s / h)
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


def memory_per_stage(model: ModelConfig, parallel: ParallelConfig,
                     stage_params: list[tuple[int, int]], capacity_bytes: int,
                     reserve_bytes: int, padded_vocab: int, layer_params_rank: tuple[int, int],
                     layout=None, comm=None) -> list[dict]:
    """Peak memory of the representative rank of each pipeline stage (bytes).

    ``stage_params`` are the (dense, expert) parameters held by one rank of each stage
    (after TP / EP sharding), ``layer_params_rank`` those of the largest layer (ZeRO-3
    gather buffers), ``layout`` the :class:`~collectors.synth.stages.PipelineLayout` (which
    layers each of the rank's chunks holds; even split when None). The activations alive at
    once follow the schedule's order: each forward item adds its chunk's bytes, each
    (input-gradient) backward frees them (:func:`chunk_activation_bytes`).
    """
    from .stages import pipeline_layout
    P = parallel
    dpg = P.dp * P.cp
    edp = P.edp
    z = P.zero_stage
    sb = state_bytes_per_param(P)
    gb = sb["grads"]  # main gradients (Megatron-LM: fp32 unless fp16)
    if layout is None:
        layout = pipeline_layout(P, model.layers)
    weights_by_vs = chunk_activation_bytes(model, P, layout)
    act_layer = layer_activation_bytes(model, P, layer=model.layers - 1)
    full_layer = max(layer_activation_bytes(model, P, "none", layer=i)
                     for i in {0, model.layers - 1})
    s = model.seq // P.cp
    b = P.micro_batch
    dispatch = 0.0
    if model.moe and P.ep > 1 and comm is not None:
        from .moe import dispatch_bytes
        dispatch = 2 * dispatch_bytes(model, P, comm, 2)[2]  # send + receive buffers
    out = []
    for stage, (dense, expert) in enumerate(stage_params):
        order = stage_order(P.schedule, P.pp, P.num_microbatches, P.chunks, stage)
        live = peak = 0
        n_live = n_peak = 0
        for ph, _, c in order:
            vs = layout.vs_of(P.schedule, P.pp, c, stage)
            if ph == F:
                live += weights_by_vs[vs]
                n_live += 1
            elif ph in (B, BI):
                live -= weights_by_vs[vs]
                n_live -= 1
            peak = max(peak, live)
            n_peak = max(n_peak, n_live)
        weights = 2 * (dense / (dpg if z >= 3 else 1) + expert / (edp if z >= 3 else 1))
        if P.dtype == "fp4":  # quantized weight copies of the FP4 layers (whole, not sharded)
            weights += 2 * 0.5625 * (dense + expert) * _fp4_share(model, P)
        grads = gb * (dense / (dpg if z >= 2 else 1) + expert / (edp if z >= 2 else 1))
        opt_share = dense / (dpg if z >= 1 else 1) + expert / (edp if z >= 1 else 1)
        optim = sb["optimizer"] * opt_share
        step_copy = sb["step_copy"] * opt_share  # at the step, after the activations
        fixed = 0.0
        if P.recompute != "none":
            fixed += full_layer  # the layer being recomputed holds its full activations
        holds_last = any(layout.rank_of[vs] == stage and vst.last
                         for vs, vst in enumerate(layout.vstages))
        if P.offload_layers:  # staging buffers: one layer leaving, one arriving
            fixed += 2 * max(layer_activation_bytes(model, P, layer=i)
                             for i in range(P.offload_layers))
        if holds_last:  # fp32 logits of one micro-batch for the loss
            fixed += 4 * s * b * padded_vocab / P.tp
        buffers = reserve_bytes + dispatch
        lp_dense, lp_expert = layer_params_rank
        if z >= 3 and P.pp > 1 and not P.odc and (dpg > 1 or edp > 1):
            # under a pipeline the stage's parameters stay gathered over the step and its
            # gradients accumulate unsharded until the last backward (builder.py, R13), in
            # FSDP2's reduce dtype (fp32 by default: .fsdp, R22)
            from .fsdp import accumulator_bytes_per_param, fsdp2
            acc = accumulator_bytes_per_param(P) if fsdp2(P) else gb
            buffers += (2 + acc) * (dense + expert)
        elif z >= 3 and (dpg > 1 or edp > 1):  # current + prefetched gathered layer
            buffers += 2 * 2 * (lp_dense + lp_expert)
            if P.odc:  # fp32 accumulation shard of the gradients pushed to this owner
                buffers += 4 * (dense / dpg + expert / edp)
        elif dpg > 1:
            buffers += int(P.bucket_mb * 1e6)
        # the fp32 gradient copy is made at the optimizer step, after every backward freed
        # its activations (and the recompute / logits buffers)
        total = weights + grads + optim + max(peak + fixed, step_copy) + buffers
        out.append({
            "stage": stage,
            "params": int(dense + expert),
            "expert_params": int(expert),
            "weights_bytes": int(weights),
            "grads_bytes": int(grads),
            "optimizer_bytes": int(optim),
            "step_copy_bytes": int(step_copy),
            "activation_bytes": int(peak + fixed),
            "dynamic_activation_bytes": int(peak),
            "activation_bytes_per_layer": int(act_layer),
            "in_flight_microbatches": int(n_peak),
            "buffer_bytes": int(buffers),
            "total_bytes": int(total),
            "capacity_bytes": int(capacity_bytes),
            "oom": bool(total > capacity_bytes),
        })
    return out


def chunk_activation_bytes(model: ModelConfig, parallel: ParallelConfig, layout) -> list[int]:
    """Activation bytes (int) one micro-batch leaves on each virtual stage until its
    backward: its layers' (:func:`layer_activation_bytes`) plus, on the first one, the
    embedding output (and its dropout mask)."""
    P = parallel
    # offloaded layers (``offload_layers``) keep nothing on the GPU until their backward
    per_layer = [0 if i < P.offload_layers else layer_activation_bytes(model, P, layer=i)
                 for i in range(model.layers)]
    s = model.seq // P.cp
    emb = P.micro_batch * s * model.hidden * (3 if model.dropout else 2) / (
        P.tp if P.sequence_parallel else 1)
    return [int(sum(per_layer[i] for i in vst.layers) + (emb if vst.first else 0))
            for vst in layout.vstages]


def memory_timeline(ops, parallel: ParallelConfig, mem: list[dict], chunk_act,
                    ranks_per_stage: int, emitted, wgrad=None) -> dict:
    """Allocator-like samples per emitted rank (``memory`` table columns).

    Model states and buffers are allocated at the step start; each forward item allocates
    ``chunk_act[stage][chunk]`` bytes when its first compute op starts and its backward frees
    them when its last compute op (not counting weight-gradient GEMMs, ``wgrad`` mask) ends;
    the optimizer's fp32 gradient copy (``step_copy_bytes``) is allocated when the rank's
    first optimizer op starts, when the fixed activation buffers (the recompute layer's, the
    logits) are released, and kept to the step's end (freed by the next ``zero_grad``).
    ``ops`` are the representative ranks' ops (rank ``stage * R``); ``emitted`` the ranks of
    the trace, which get their representative's samples.
    """
    import numpy as np
    import pandas as pd

    from .expand import LANES

    rank = ops["rank"].to_numpy()
    R = ranks_per_stage
    rep = (rank % R == 0) & (ops["lane"].to_numpy() % len(LANES) == 0) \
        & (ops["microbatch"].to_numpy() >= 0)
    ph = ops["phase"].to_numpy()
    rep &= (ph == 0) | (ph == 1)
    if wgrad is not None:
        rep &= ~np.asarray(wgrad, bool)
    df = pd.DataFrame({"rank": rank[rep], "mb": ops["microbatch"].to_numpy()[rep],
                       "chunk": ops["chunk"].to_numpy()[rep], "phase": ph[rep],
                       "start": ops["start_ns"].to_numpy()[rep],
                       "end": ops["start_ns"].to_numpy()[rep] + ops["dur_ns"].to_numpy()[rep]})
    g = df.groupby(["rank", "mb", "chunk", "phase"], sort=False).agg(
        start=("start", "min"), end=("end", "max")).reset_index()
    fwd = g[g["phase"] == 0]
    bwd = g[g["phase"] == 1]
    t0 = int(ops["start_ns"].min()) if len(ops) else 0
    stage_r = np.unique(np.concatenate([fwd["rank"].to_numpy(), bwd["rank"].to_numpy()])) \
        if len(g) else np.zeros(0, np.int64)
    def _copy(r):
        return mem[r // R].get("step_copy_bytes", 0)

    def _fixed(r):
        return mem[r // R]["activation_bytes"] - mem[r // R]["dynamic_activation_bytes"]
    static = {r: mem[r // R]["total_bytes"] + _fixed(r)
              - max(mem[r // R]["activation_bytes"], _copy(r)) for r in stage_r}
    # the optimizer step's first op per representative rank (compute lane)
    opt = (rank % R == 0) & (ops["lane"].to_numpy() % len(LANES) == 0) & (ph == 2)
    opt_start = pd.Series(ops["start_ns"].to_numpy()[opt]).groupby(rank[opt]).min()
    copy_r = [r for r in stage_r if _copy(r) and r in opt_start.index]
    ts = np.concatenate([np.full(len(stage_r), t0), fwd["start"].to_numpy(),
                         bwd["end"].to_numpy(),
                         np.asarray([opt_start[r] for r in copy_r], np.int64)]).astype(np.int64)
    rk = np.concatenate([stage_r, fwd["rank"].to_numpy(), bwd["rank"].to_numpy(),
                         np.asarray(copy_r, np.int64)])
    wf = [chunk_act[r // R][c] for r, c in zip(fwd["rank"].to_numpy(),
                                                fwd["chunk"].to_numpy(), strict=True)]
    wb = [chunk_act[r // R][c] for r, c in zip(bwd["rank"].to_numpy(),
                                                bwd["chunk"].to_numpy(), strict=True)]
    delta = np.concatenate([np.asarray([static[r] for r in stage_r], np.int64),
                            np.asarray(wf, np.int64), -np.asarray(wb, np.int64),
                            np.asarray([_copy(r) - _fixed(r) for r in copy_r], np.int64)])
    # at equal times frees first: a backward ends exactly when the next forward starts on
    # the same stream, so its activations are released before the new ones are allocated
    order = np.lexsort((delta, ts, rk))
    rk, ts, delta = rk[order], ts[order], delta[order]
    alloc = np.zeros(len(rk), np.int64)
    for r in stage_r:
        sel = rk == r
        alloc[sel] = np.cumsum(delta[sel])
    # replicate each representative's samples to the emitted ranks of its stage
    emitted = np.asarray(emitted, np.int64)
    out_r, out_t, out_d, out_a = [], [], [], []
    for r in stage_r:
        sel = rk == r
        peers = emitted[(emitted // R) == (r // R)]
        n = int(sel.sum())
        out_r.append(np.repeat(peers, n))
        out_t.append(np.tile(ts[sel], len(peers)))
        out_d.append(np.tile(delta[sel], len(peers)))
        out_a.append(np.tile(alloc[sel], len(peers)))
    if not out_r:
        return {"rank": np.zeros(0, np.int32), "ts_ns": np.zeros(0, np.int64)}
    rr = np.concatenate(out_r)
    return {"rank": rr.astype(np.int32), "device": rr.astype(np.int32),
            "ts_ns": np.concatenate(out_t), "bytes_delta": np.concatenate(out_d),
            "allocated_bytes": np.concatenate(out_a),
            "reserved_bytes": np.full(len(rr), -1, np.int64)}
