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

Model states use mixed-precision Adam: 2-byte weights, 2-byte gradients, 12 bytes of fp32
master weights and moments per parameter (16 bytes; ZeRO-1 shards the 12, ZeRO-2 also the
gradients, ZeRO-3/FSDP also the weights over the data-parallel ranks).
"""

from __future__ import annotations

from .models import ModelConfig
from .parallel import ParallelConfig
from .schedule import max_in_flight, stage_order

__all__ = ["layer_activation_bytes", "korthikanti_layer_bytes", "memory_per_stage",
           "memory_timeline"]


def layer_activation_bytes(model: ModelConfig, parallel: ParallelConfig,
                           recompute: str | None = None) -> int:
    """Activation bytes one layer keeps for its backward pass, per micro-batch, per rank."""
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
    replicated = (4 + 2 + 2 + 2 * drop) * sbh
    gate = 2 if model.gated_mlp else 1
    kv = model.kv_dim
    sharded = (2 * s * b * (h + 2 * kv) + 2 * sbh + 2 * s * b * model.ffn * gate
               + 2 * s * b * model.ffn)
    if model.attention == "unfused" and rc != "selective":
        sharded += (4 + drop) * model.heads * s * S * b
    elif model.attention == "flash":
        sharded += 4 * model.heads * s * b  # softmax statistics (fp32 logsumexp)
    return int(replicated * rep + sharded / t)


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


def memory_per_stage(model: ModelConfig, parallel: ParallelConfig, stage_params: list[int],
                     capacity_bytes: int, reserve_bytes: int, padded_vocab: int,
                     layer_params_rank: int) -> list[dict]:
    """Peak memory of the representative rank of each pipeline stage (bytes).

    ``stage_params`` are the parameters held by one rank of each stage (after TP sharding).
    """
    P = parallel
    dpg = P.dp * P.cp
    z = P.zero_stage
    per_chunk_layers = model.layers // P.virtual_stages
    act_layer = layer_activation_bytes(model, P)
    full_layer = layer_activation_bytes(model, P, "none")
    s = model.seq // P.cp
    b = P.micro_batch
    out = []
    for stage, params in enumerate(stage_params):
        order = stage_order(P.schedule, P.pp, P.num_microbatches, P.chunks, stage)
        inflight = max_in_flight(order)
        weights = 2 * params / (dpg if z >= 3 else 1)
        grads = 2 * params / (dpg if z >= 2 else 1)
        optim = 12 * params / (dpg if z >= 1 else 1)
        acts = inflight * per_chunk_layers * act_layer
        if P.recompute != "none":
            acts += full_layer  # the layer being recomputed holds its full activations
        extra = 0
        if stage == 0:  # embedding output (+ dropout mask) of each in-flight micro-batch
            extra += inflight * s * b * model.hidden * (3 if model.dropout else 2) / (
                P.tp if P.sequence_parallel else 1) / P.chunks
        if stage == P.pp - 1:  # fp32 logits of one micro-batch for the loss
            extra += 4 * s * b * padded_vocab / P.tp
        buffers = reserve_bytes
        if z >= 3 and dpg > 1:  # current + prefetched gathered layer
            buffers += 2 * 2 * layer_params_rank
        elif dpg > 1:
            buffers += int(P.bucket_mb * 1e6)
        total = weights + grads + optim + acts + extra + buffers
        out.append({
            "stage": stage,
            "params": int(params),
            "weights_bytes": int(weights),
            "grads_bytes": int(grads),
            "optimizer_bytes": int(optim),
            "activation_bytes": int(acts + extra),
            "activation_bytes_per_layer": int(act_layer),
            "in_flight_microbatches": int(inflight),
            "buffer_bytes": int(buffers),
            "total_bytes": int(total),
            "capacity_bytes": int(capacity_bytes),
            "oom": bool(total > capacity_bytes),
        })
    return out


def memory_timeline(ops, parallel: ParallelConfig, mem: list[dict], chunk_act_bytes: int,
                    ranks_per_stage: int, emitted) -> dict:
    """Allocator-like samples per emitted rank (``memory`` table columns).

    Model states and buffers are allocated at the step start; each forward item allocates
    ``chunk_act_bytes`` when its first compute op starts and its backward frees them when it
    ends. ``ops`` are the representative ranks' ops (rank ``stage * R``); ``emitted`` the
    ranks of the trace, which get their representative's samples.
    """
    import numpy as np
    import pandas as pd

    rank = ops["rank"].to_numpy()
    R = ranks_per_stage
    rep = (rank % R == 0) & (ops["lane"].to_numpy() % 6 == 0) & (ops["microbatch"].to_numpy() >= 0)
    ph = ops["phase"].to_numpy()
    rep &= (ph == 0) | (ph == 1)
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
    static = {r: mem[r // R]["total_bytes"] - mem[r // R]["activation_bytes"] for r in stage_r}
    ts = np.concatenate([np.full(len(stage_r), t0), fwd["start"].to_numpy(),
                         bwd["end"].to_numpy()]).astype(np.int64)
    rk = np.concatenate([stage_r, fwd["rank"].to_numpy(), bwd["rank"].to_numpy()])
    delta = np.concatenate([[static[r] for r in stage_r],
                            np.full(len(fwd), chunk_act_bytes),
                            np.full(len(bwd), -chunk_act_bytes)]).astype(np.int64)
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
