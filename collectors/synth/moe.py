"""Mixture-of-experts layers: routing load, token dispatch / combine and grouped expert GEMMs.

One MoE layer on one rank, per micro-batch (Megatron-Core's all-to-all token dispatcher,
experts sharded over ``ep`` expert-parallel ranks and, inside an expert, over the TP ranks):

1. the router (a ``[tokens, hidden] x [hidden, experts]`` GEMM, softmax / top-k) picks
   ``top_k`` experts per token; with ``tp > 1`` each TP rank routes ``1/tp`` of the tokens;
2. permute (gather each token once per chosen expert), then the dispatch all-to-all over the
   EP group (FP8 payload in FP8 runs); with ``tp > 1`` an all-gather over the TP ranks gives
   every TP shard of an expert all of its tokens;
3. grouped GEMMs over the rank's ``experts / ep`` local experts (FC1, activation, FC2), then
   the TP reduce-scatter and the combine all-to-all back (BF16), unpermute and the weighted
   sum; shared experts are a dense MLP that runs on the compute stream while the dispatch is
   in flight.

Backward mirrors it: two more all-to-alls per layer (the combine's and the dispatch's
gradients), the grouped GEMMs' input and weight gradients. With DeepSeek-V3's selective
recompute (latent attention, ``recompute = "selective"``) the routed experts keep only the
SwiGLU input, in FP8 in FP8 runs, and the backward recomputes the SwiGLU output before the
FC2 gradients (report §3.3.3, synth REFERENCES.md R58); shared experts keep theirs.

Load: ``n = tokens * top_k / experts`` tokens per expert on average. ``moe_imbalance`` ``r``
is the most loaded expert's tokens over the mean; the slowest rank holds it and
``experts/ep - 1`` average experts (the others shrink so that the total is kept:
``(E - r) / (E - 1)`` of the mean each), and every all-to-all and GEMM of the layer waits for
that rank. ``capacity_factor`` ``c > 0`` pads every expert to ``c * n`` tokens and drops the
rest (GShard / Switch): all ranks then carry ``c`` times the mean.

Traffic: with plain all-to-all a token copy for an expert on another node crosses the
network, ``top_k (N-1)/N`` copies per token for ``N`` nodes in the EP group. With
node-limited routing (``route_nodes`` ``M``, DeepSeek-V3) a token is sent once to each of
at most ``M`` nodes, ``min(M, N(1-(1-1/N)^k)) (N-1)/N`` network copies per token (``k``
uniformly chosen experts reach that many distinct nodes on average), then fans out over
NVLink on the destination node.
"""

from __future__ import annotations

from .costs import grouped_gemm

__all__ = ["moe_load", "moe_fwd", "moe_bwd", "moe_activation_bytes", "dispatch_bytes"]


def _ops():
    from ..enums import CommOp, OpKind
    from .builder import OpTemplate
    return CommOp, OpKind, OpTemplate


def moe_load(model, parallel) -> dict:
    """Token counts of one MoE layer on the slowest rank, per micro-batch.

    Returns ``tokens`` (routed by this rank), ``per_expert`` (list of the local experts'
    token counts after dispatch, before the TP all-gather), ``load`` (their sum over
    ``tokens * top_k``: the rank's share relative to a balanced one), ``mean_per_expert``
    and ``dropped`` (fraction of token copies dropped by the capacity)."""
    P = parallel
    T = P.micro_batch * model.seq // P.cp
    routed = -(-T // P.tp)  # each TP rank routes its 1/tp of the tokens
    E, k = model.experts, model.top_k
    e_loc = E // P.ep
    mean = routed * k * P.ep / E  # copies reaching one expert from the ep ranks of its group
    r, c = float(P.moe_imbalance), float(P.capacity_factor)
    dropped = 0.0
    if c > 0:
        per = [c * mean] * e_loc
        dropped = max(0.0, r - c) / E
    else:
        other = mean * (E - r) / (E - 1) if E > 1 else mean
        per = [r * mean] + [other] * (e_loc - 1)
    load = sum(per) / (routed * k) if routed * k else 1.0
    return {"tokens": routed, "per_expert": per, "load": load, "dropped": dropped,
            "mean_per_expert": mean, "local_experts": e_loc}


def dispatch_bytes(model, parallel, comm, elem_bytes: float) -> tuple[float, float, float]:
    """(intra-node, inter-node) bytes the slowest rank receives in one dispatch (or
    combine) all-to-all of ``elem_bytes`` per value, and the total."""
    P = parallel
    ld = moe_load(model, P)
    geo = comm.geometry["ep"]
    copies = ld["tokens"] * ld["load"] * model.top_k  # token copies the rank receives
    h = model.hidden
    n, per_node, N = geo.size, geo.per_node, geo.nodes
    if n <= 1:
        return 0.0, 0.0, 0.0
    if model.route_nodes and N > 1:
        k = model.top_k
        nodes_hit = min(float(model.route_nodes), N * (1 - (1 - 1 / N) ** k))
        inter = copies / k * nodes_hit * (N - 1) / N * h * elem_bytes
        intra = copies * (per_node - 1) / n * h * elem_bytes + inter  # local part + fan-out
    else:
        inter = copies * (n - per_node) / n * h * elem_bytes
        intra = copies * (per_node - 1) / n * h * elem_bytes
    return intra, inter, copies * h * elem_bytes


def _a2a(x, name: str, elem_bytes: float, deps=(-1,)):
    CommOp, OpKind, OpTemplate = _ops()
    intra, inter, total = dispatch_bytes(x.m, x.par, x.comm, elem_bytes)
    return OpTemplate(name, "ep", x.comm.all_to_all_ns(intra, inter, "ep"),
                      kind=int(OpKind.COLLECTIVE), bytes=int(total),
                      comm_op=int(CommOp.ALL_TO_ALL), deps=deps)


def _shape(x) -> tuple[list[float], int, int, int]:
    """Per-local-expert token counts after the TP all-gather, FC1 width, expert ffn shard,
    gate factor."""
    ld = moe_load(x.m, x.par)
    ms = [int(round(v * x.t)) for v in ld["per_expert"]]
    gate = 2 if x.m.gated_mlp else 1
    f = x.m.expert_ffn // x.t
    return ms, gate * f, f, gate


class _Seq:
    """Ops with dependencies given as absolute positions (``None``: the op before the
    sequence), turned into the builder's relative offsets."""

    def __init__(self) -> None:
        self.ops: list = []

    def add(self, op, deps=None) -> int:
        _, _, OpTemplate = _ops()
        i = len(self.ops)
        rel = (-1,) if deps is None else tuple(d - i for d in deps)
        self.ops.append(OpTemplate(**{**op.__dict__, "deps": rel}))
        return i

    def extend(self, ops, first_deps=None) -> int:
        """Append a chain whose first op depends on ``first_deps``; returns its last index."""
        for j, op in enumerate(ops):
            if j == 0:
                self.add(op, first_deps)
            else:  # the chain's own offsets stay valid: it is appended contiguously
                self.ops.append(op)
        return len(self.ops) - 1


def moe_fwd(x, prefix: str = "") -> list:
    """Ops of a MoE MLP's forward after its norm (see the module docstring)."""
    from .layers import _mlp_fwd
    from .template_ctx import _k
    CommOp, _, _ = _ops()
    m, h = x.m, x.h
    ld = moe_load(m, x.par)
    Tr = ld["tokens"]
    E, k = m.experts, m.top_k
    ms, n1, f, gate = _shape(x)
    M = sum(ms)
    disp_eb = 1 if x.dtype == "fp8" else x.act
    q = _Seq()
    q.add(_k(prefix + "moe.router.fwd", x.g(Tr, E, h)))
    q.add(_k(prefix + "moe.topk.fwd", x.st(4 * 3 * Tr * E, 4.0 * Tr * E)))
    tok = q.add(_k(prefix + "moe.permute.fwd", x.st(2 * x.act * Tr * k * h)))
    if x.par.ep > 1:
        tok = q.add(_a2a(x, prefix + "ep.dispatch", disp_eb), (tok,))
    shared_last = -1
    if m.shared_experts:  # beside the dispatch: needs only the norm output
        shared_last = q.extend(_mlp_fwd(x, m.shared_experts * m.expert_ffn, prefix,
                                        "moe.shared"), (-1,))
    if x.t > 1:
        tok = q.add(x.tp_coll(prefix + "tp.allgather", CommOp.ALL_GATHER, x.act * M * h),
                    (tok,))
    q.add(_k(prefix + "moe.experts.fc1.fwd", grouped_gemm(x.hw, x.dtype, ms, n1, h)), (tok,))
    q.add(_k(prefix + "moe.experts.act.fwd", x.st(x.act * M * f * (gate + 1), 8.0 * M * f)))
    last = q.add(_k(prefix + "moe.experts.fc2.fwd", grouped_gemm(x.hw, x.dtype, ms, h, f)))
    if x.t > 1:
        last = q.add(x.tp_coll(prefix + "tp.reduce_scatter", CommOp.REDUCE_SCATTER,
                               x.act * M * h))
    if x.par.ep > 1:
        last = q.add(_a2a(x, prefix + "ep.combine", x.act))
    q.add(_k(prefix + "moe.unpermute.fwd", x.st(3 * x.act * Tr * k * h, 2.0 * Tr * k * h)),
          (last, shared_last) if shared_last >= 0 else (last,))
    if x.t > 1 and not x.sp:  # the TP ranks' token slices back together
        q.add(x.tp_coll(prefix + "tp.allgather", CommOp.ALL_GATHER, x.act * x.T * h))
    return q.ops


def moe_bwd(x) -> list:
    """Backward of :func:`moe_fwd`: combine-gradient all-to-all, grouped GEMM input
    gradients (weight gradients beside the dispatch-gradient all-to-all, or in the split
    weight-gradient pass), dispatch-gradient all-to-all, router backward; the shared experts'
    backward beside the all-to-alls."""
    from .layers import _mlp_bwd
    from .template_ctx import _k
    CommOp, _, _ = _ops()
    m, h = x.m, x.h
    ld = moe_load(m, x.par)
    Tr = ld["tokens"]
    E, k = m.experts, m.top_k
    ms, n1, f, gate = _shape(x)
    M = sum(ms)
    q = _Seq()
    if x.t > 1 and not x.sp:
        q.add(_k("moe.slice.bwd", x.st(2 * x.act * Tr * h)))
    start = q.add(_k("moe.unpermute.bwd", x.st(3 * x.act * Tr * k * h, 2.0 * Tr * k * h)))
    tok = start
    if x.par.ep > 1:
        tok = q.add(_a2a(x, "ep.combine.bwd", x.act), (tok,))
    shared_last = -1
    if m.shared_experts:
        shared_last = q.extend(_mlp_bwd(x, m.shared_experts * m.expert_ffn, "moe.shared"),
                               (-1,))
    if x.t > 1:
        tok = q.add(x.tp_coll("tp.allgather", CommOp.ALL_GATHER, x.act * M * h), (tok,))
    if swiglu_recompute(m, x.par):  # the SwiGLU output again, from its cached input
        eb = 1 if x.dtype == "fp8" else x.act
        tok = q.add(_k("recompute.moe.experts.act.fwd", x.st(eb * M * f * (gate + 1),
                                                              8.0 * M * f)), (tok,))
    fc2d = q.add(_k("moe.experts.fc2.bwd_dgrad", grouped_gemm(x.hw, x.dtype, ms, f, h)),
                 (tok,))
    w = [_k("moe.experts.fc2.bwd_wgrad", _grouped_wgrad(x, ms, h, f))]
    q.add(_k("moe.experts.act.bwd", x.st(x.act * M * f * (2 * gate + 1), 10.0 * M * f)),
          (fc2d,))
    last = q.add(_k("moe.experts.fc1.bwd_dgrad", grouped_gemm(x.hw, x.dtype, ms, h, n1)))
    w.append(_k("moe.experts.fc1.bwd_wgrad", _grouped_wgrad(x, ms, n1, h)))
    dgrad = last
    if x.t > 1:
        last = q.add(x.tp_coll("tp.reduce_scatter", CommOp.REDUCE_SCATTER, x.act * M * h))
    if x.par.ep > 1:
        last = q.add(_a2a(x, "ep.dispatch.bwd", x.act))
    if x.split:
        x.w.extend(w)
    else:  # the weight gradients run while the reduction / dispatch gradient is in flight
        q.add(w[0], (dgrad,))
        q.add(w[1])
    q.add(_k("moe.permute.bwd", x.st(2 * x.act * Tr * k * h)), (last,))
    q.add(_k("moe.router.bwd_dgrad", x.g(Tr, h, E)))
    rw = [_k("moe.router.bwd_wgrad", x.g(E, h, Tr))]
    if x.split:
        x.w.extend(rw)
    else:
        q.add(rw[0])
    if shared_last >= 0:
        q.add(_k("moe.shared.join", x.st(3 * x.act * x.Tn * h, float(x.Tn * h))),
              (len(q.ops) - 1, shared_last))
    return q.ops


def _grouped_wgrad(x, ms: list, n_out: int, k_in: int):
    """Weight gradients of the local experts: ``[n_out, k_in]`` per expert, reduced over its
    tokens; one grouped launch (the reduction depth is the expert's token count)."""
    from .costs import KernelCost
    hw = x.hw
    M = float(sum(ms))
    if M <= 0:
        return KernelCost(int(hw.kernel_overhead_us * 1e3), 0.0, 0)
    kbar = M / len(ms)
    return grouped_gemm(hw, x.dtype, [n_out] * len(ms), k_in, int(max(1, kbar)))


def swiglu_recompute(model, parallel) -> bool:
    """DeepSeek-V3's recipe (selective recompute with latent attention): the routed experts
    cache the SwiGLU input (FP8 in FP8 runs) and recompute its output in the backward."""
    return bool(model.mla and parallel.recompute == "selective" and model.gated_mlp)


def moe_activation_bytes(model, parallel) -> float:
    """Activation bytes a MoE MLP keeps for its backward (slowest rank, one micro-batch),
    replacing the dense MLP's ``FC1 input + FC1 output + activation output``: the router's
    fp32 scores and probabilities, the dispatched tokens, the grouped FC1 output and the
    activation output on every local expert, and the shared experts' like a dense MLP."""
    P = parallel
    ld = moe_load(model, P)
    M = sum(ld["per_expert"]) * P.tp  # tokens in the local experts' GEMMs
    gate = 2 if model.gated_mlp else 1
    f = model.expert_ffn / P.tp
    T = P.micro_batch * model.seq / P.cp
    lin = 1.0 if P.dtype == "fp8" else 2.0  # FP8 keeps the GEMM inputs in one byte
    out = 8.0 * ld["tokens"] * model.experts  # router logits + probabilities (fp32)
    if swiglu_recompute(model, P):  # DeepSeek-V3: the SwiGLU input only, in FP8 (R58)
        out += lin * M * model.hidden + lin * M * f * gate
    else:
        out += lin * M * model.hidden + 2.0 * M * f * gate + lin * M * f
    if model.shared_experts:
        fs = model.shared_experts * model.expert_ffn / P.tp
        out += 2.0 * T * fs * gate + lin * T * fs
    return out
