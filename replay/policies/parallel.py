"""Parallelism what-ifs: DP / TP / PP / CP degree, micro-batching, pipeline schedule, ZeRO
stage / FSDP and sequence parallelism.

A changed layout is re-assembled by the synthesizer's builder (:func:`collectors.synth.
build_trace`) from per-layer op templates, so the new step has the right number of
micro-batches, pipeline bubbles, collectives and memory. The templates come from

* the synthesizer's cost model when the trace is a ``synthesize`` output (``meta["synth"]``
  holds the model, hardware and parallel configs): the run is re-synthesized;
* the trace's own ops when they carry layer / phase / micro-batch attribution and the
  trace says how it was laid out (``meta["synth"]["parallel"]``, e.g. a ``build_trace``
  output or an annotated capture): for every layer, the forward and backward op sequence of
  the lowest rank and micro-batch that ran it, with measured durations (see
  :func:`templates_from_trace`). Pipeline sends/receives keep their measured (median)
  durations; data-parallel and ZeRO communication is modeled by the alpha-beta model of the
  hardware profile in ``meta["synth"]["hardware"]`` (``a100-80gb`` when absent); the
  optimizer kernels keep their measured bandwidth, re-scaled to the new parameter shard.

* op-level traces (Megatron timers, ``meta["source_format"] == "oplevel"``): per-stage
  templates of the measured forward / backward compute, pipeline transfers, DP collectives
  and once-per-step ops, re-assembled in the op-level reader's dependency structure (see
  :mod:`replay.policies.parallel_oplevel`; ``durations`` picks the per-stage medians or the
  straggler-ideal durations).

Other traces raise PolicyError naming what is missing.

Synthesized runs also take the synthesizer's newer layout keys: ``ep`` (expert parallelism),
``moe_imbalance``, ``capacity_factor``, ``p2p`` (``sync`` / ``async`` pipeline transfers),
``stage_layers`` (a list of layers per stage, ``"even"``, ``"time"`` or ``"memory"``),
``stage_slack``, ``odc`` (on-demand ZeRO-3 transfers), ``seq_imbalance``, ``dtype``
(``bf16`` / ``fp16`` / ``fp8``), ``grad_overlap`` (data-parallel gradient reduction
overlapped with the last backward, or after it as Megatron-LM does by default),
``tp_comm_overlap`` (sequence-parallel TP exchanges beside their GEMMs) and ``offload_layers``
(activations of the first N layers offloaded over the host link); schedules
``zb-h1`` and ``dualpipe`` too. Measured traces
refuse them (their per-layer templates carry no expert, split-backward or FP8 costs).

The global batch is kept unless ``global_batch`` is given: changing ``dp`` changes the number
of micro-batches per pipeline (``global_batch / (micro_batch * dp)``), which must stay an
integer (PolicyError otherwise). ``microbatches`` sets the number of micro-batches per pipeline
directly (``global_batch = microbatches * micro_batch * dp``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from retime.collectors.errors import ConfigError, PolicyError

from .base import (
    STRUCTURE_COLUMNS,
    Policy,
    WhatIfState,
    check_choice,
    check_int,
    check_positive,
    known_fields,
)

__all__ = ["Parallel", "SCHEDULES"]

SCHEDULES = ("gpipe", "1f1b", "interleaved", "bfs", "zb-h1", "dualpipe")
_ALIASES = {"breadth-first": "bfs", "breadth_first": "bfs", "looped": "bfs",
            "interleaved-1f1b": "interleaved", "pipedream-flush": "1f1b", "zbh1": "zb-h1",
            "zb1p": "zb-h1", "zero-bubble": "zb-h1"}
#: keys only a synthesized run can re-lay out (the synthesizer models their costs)
_SYNTH_ONLY = ("ep", "moe_imbalance", "capacity_factor", "p2p", "stage_layers",
               "stage_slack", "odc", "seq_imbalance", "dtype", "grad_overlap", "tp_comm_overlap",
               "offload_layers")


@dataclass(frozen=True)
class Parallel(Policy):
    """Degrees and schedule of the re-laid-out step (``None`` = unchanged).

    ``microbatches`` is the number of micro-batches per pipeline (sets ``global_batch``);
    ``durations`` (op-level traces only) picks the template: ``"stage"`` (per-stage medians
    of the measured durations / transfer times, the default) or ``"ideal"`` (the straggler
    analysis' ideal durations; the unchanged layout then replays to its ideal step).
    """

    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    schedule: str | None = None
    chunks: int | None = None
    micro_batch: int | None = None
    global_batch: int | None = None
    zero: int | None = None
    fsdp: bool | None = None
    sequence_parallel: bool | None = None
    microbatches: int | None = None
    durations: str | None = None
    ep: int | None = None
    moe_imbalance: float | None = None
    capacity_factor: float | None = None
    p2p: str | None = None
    stage_layers: tuple[int, ...] | str | None = None
    stage_slack: float | None = None
    odc: bool | None = None
    seq_imbalance: float | None = None
    dtype: str | None = None
    grad_overlap: bool | None = None
    tp_comm_overlap: bool | None = None
    offload_layers: int | None = None
    table: ClassVar[str] = "parallel"

    def __post_init__(self) -> None:
        for f in ("dp", "tp", "pp", "cp", "chunks", "micro_batch", "global_batch",
                  "microbatches", "ep"):
            check_int("parallel", f, getattr(self, f))
        for f in ("moe_imbalance", "seq_imbalance"):
            v = getattr(self, f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not v >= 1):
                raise PolicyError(f"parallel.{f}={v!r} must be a number >= 1 (the most "
                                  "loaded one's work over the mean)")
        check_positive("parallel", "capacity_factor", self.capacity_factor, strict=False)
        check_positive("parallel", "stage_slack", self.stage_slack, strict=False)
        check_choice("parallel", "p2p", self.p2p, ("sync", "async"))
        check_choice("parallel", "dtype", self.dtype, ("bf16", "fp16", "fp8", "fp4"))
        sl = self.stage_layers
        if isinstance(sl, list):
            object.__setattr__(self, "stage_layers", tuple(sl))
            sl = self.stage_layers
        if sl is not None and not (
                (isinstance(sl, str) and sl in ("even", "time", "memory"))
                or (isinstance(sl, tuple) and sl and all(
                    isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in sl))):
            raise PolicyError(f"parallel.stage_layers={sl!r}: give layers per stage "
                              "([10, 12, 12, 10]) or one of even, time, memory")
        if self.schedule is not None:
            object.__setattr__(self, "schedule", _ALIASES.get(self.schedule, self.schedule))
        check_choice("parallel", "schedule", self.schedule, SCHEDULES)
        check_choice("parallel", "zero", self.zero, (0, 1, 2, 3))
        check_choice("parallel", "durations", self.durations, ("stage", "ideal"))
        if self.offload_layers is not None and (isinstance(self.offload_layers, bool) or not
                                                isinstance(self.offload_layers, int)
                                                or self.offload_layers < 0):
            raise PolicyError(f"parallel.offload_layers={self.offload_layers!r} must be an "
                              "integer >= 0 (layers whose activations go to host memory)")
        for f in ("fsdp", "sequence_parallel", "odc", "grad_overlap", "tp_comm_overlap"):
            v = getattr(self, f)
            if v is not None and not isinstance(v, bool):
                raise PolicyError(f"parallel.{f}={v!r} must be true or false")

    def refuse_on_measured(self) -> None:
        """Raise for the keys only a synthesized run supports (checked on a measured trace,
        also before it is loaded: replay/admission.py)."""
        kw = self.fields()
        bad = [f for f in _SYNTH_ONLY if kw.get(f) is not None] + (
            [f"schedule={self.schedule}"] if self.schedule in ("zb-h1", "dualpipe") else [])
        if bad:
            raise PolicyError(f"parallel: {', '.join(bad)} on a measured trace: the "
                              "synthesizer models these (expert all-to-alls, split "
                              "backward passes, FP8 GEMMs, stage splits, on-demand "
                              "transfers), measured templates do not carry their costs; "
                              "synthesize the job with `retime synth` and apply the "
                              "scenario to that")

    @classmethod
    def columns_for(cls, fields: frozenset[str]) -> tuple[str, ...] | None:
        """Another per-rank batch on a measured trace scales the step's work by phase
        (:mod:`.batch_measured`; an op-level trace is re-laid out by micro-batch and
        stage): :data:`.base.STRUCTURE_COLUMNS`. Another data-parallel width copies a
        measured rank's ops (:mod:`.parallel_dp`: ranks and lanes) or, on an op-level
        trace, re-lays out its stages, chunks and micro-batches
        (:mod:`.parallel_oplevel`). The other keys are not audited."""
        if not fields <= {"micro_batch", "dp"}:
            return None
        return STRUCTURE_COLUMNS if "micro_batch" in fields else ("microbatch", "stage", "chunk")

    @classmethod
    def synth_columns_for(cls, fields: frozenset[str]) -> tuple[str, ...] | None:
        """On a synthesized store every key changes the run's layout, which is
        re-synthesized from ``meta['synth']``: no ops column."""
        return () if fields <= known_fields(cls) else None

    def configure(self, state: WhatIfState) -> None:
        kw = self.fields()
        if not kw:
            return
        if not state.is_synth:
            self.refuse_on_measured()
        if state.trace.meta.get("source_format") == "oplevel" and not state.is_synth:
            from .parallel_oplevel import relayout_oplevel
            durations = kw.pop("durations", "stage")
            state.trace, state.notes["relayout"] = relayout_oplevel(state.trace, kw, durations)
            return
        if kw.pop("durations", None) is not None:
            raise PolicyError("parallel.durations applies to op-level traces only (the "
                              "template of this trace is per layer)")
        if "microbatches" in kw:
            cur = state.synth.parallel if state.is_synth else self._current_layout(state)
            mb = kw.get("micro_batch", cur.get("micro_batch", 1))
            dp = kw.get("dp", cur.get("dp", 1))
            gb = kw.pop("microbatches") * mb * dp
            if self.global_batch is not None and self.global_batch != gb:
                raise PolicyError(f"parallel.microbatches={self.microbatches} means "
                                  f"global_batch={gb} (micro_batch={mb}, dp={dp}), but "
                                  f"parallel.global_batch={self.global_batch}; give one")
            kw["global_batch"] = gb
        if not state.is_synth and kw and set(kw) <= {"dp", "micro_batch"}:
            # a measured data-parallel job with more or fewer ranks (parallel_dp.py) and/or
            # another per-rank batch (batch_measured.py, applied in phase 2)
            if "micro_batch" in kw:
                from .batch_measured import measured_batch
                measured_batch(state.trace)  # refuse early, naming what is missing
                state.notes["micro_batch"] = int(kw["micro_batch"])
            if "dp" in kw:
                from .parallel_dp import cpu_only, host_cores, relayout_dp
                orig = state.trace
                state.trace, state.notes["relayout"], tmpl = relayout_dp(
                    orig, kw["dp"], state.ranks_per_node)
                state.notes["template"] = (orig, tmpl)
                if cpu_only(orig) and host_cores(orig) is None:
                    state.notes.setdefault("assumed", []).append(
                        "each rank has a CPU core of its own, before and after (the trace "
                        "records no CPU sets); set topology.cores_per_node if a host's ranks "
                        "share its cores")
            return
        if not state.is_synth:
            if "tp" in kw and not self._current_layout(state):
                # a measured GPU trace without a layout: its linear layers split by shape
                # (tp_measured.py), re-timed in phase 2
                if set(kw) - {"tp", "dp"}:
                    raise PolicyError(
                        f"parallel.tp with parallel."
                        f"{', parallel.'.join(sorted(set(kw) - {'tp', 'dp'}))}"
                        " on a measured trace without a layout: the TP split re-prices its "
                        "GEMMs in place; change one key per what-if")
                if kw["tp"] > 1:
                    from .tp_measured import same_gpus_dp, tp_layout
                    tp_layout(state.trace, kw["tp"])  # refuse early, naming what is missing
                    if "dp" in kw:  # the same GPUs: fewer data-parallel replicas
                        state.notes["tp_dp"] = same_gpus_dp(state.trace, kw["tp"], kw["dp"])
                elif "dp" in kw:
                    raise PolicyError("parallel.dp with parallel.tp=1 on a measured trace: "
                                      "set parallel.dp alone to change the replicas")
                state.notes["tp"] = int(kw["tp"])
                return
            state.notes["relayout"] = self._relayout_measured(state, kw)
            return
        if self.schedule in ("interleaved", "bfs") and self.chunks is None \
                and state.synth.parallel.get("chunks", 1) == 1:
            kw["chunks"] = 2
        if self.schedule in ("gpipe", "1f1b", "zb-h1", "dualpipe") and self.chunks is None:
            kw["chunks"] = 1
        if "stage_layers" in kw and kw["stage_layers"] == "even":
            kw["stage_layers"] = ()
        if kw.get("stage_layers") is not None:
            kw["stage_layers"] = (list(kw["stage_layers"]) if isinstance(kw["stage_layers"], tuple)
                                  else kw["stage_layers"])
        if kw.get("fsdp"):
            kw["zero"] = 0 if self.zero is None else self.zero
        if self.zero is not None and self.zero != 3 and self.fsdp is None:
            kw["fsdp"] = False
        state.synth.set_parallel(**kw)
        from retime.collectors.synth import check_config, resolve_parallel
        try:
            par = resolve_parallel(dict(state.synth.parallel))
            check_config(state.synth.model, par)
        except ConfigError as exc:
            raise PolicyError(f"parallel: {exc}") from exc

    @staticmethod
    def _current_layout(state: WhatIfState) -> dict:
        syn = state.trace.meta.get("synth") if isinstance(state.trace.meta, dict) else None
        return dict(syn["parallel"]) if isinstance(syn, dict) and isinstance(
            syn.get("parallel"), dict) else {}

    def _relayout_measured(self, state: WhatIfState, kw: dict) -> dict:
        from retime.collectors.synth import CommModel, build_trace, resolve_parallel
        tpl, cur, info = templates_from_trace(state.trace)
        new = dict(cur)
        new.update(kw)
        if self.schedule in ("interleaved", "bfs") and self.chunks is None and cur["chunks"] == 1:
            new["chunks"] = 2
        if self.schedule in ("gpipe", "1f1b") and self.chunks is None:
            new["chunks"] = 1
        try:
            par = resolve_parallel(new)
        except ConfigError as exc:
            raise PolicyError(f"parallel: {exc}") from exc
        if par.pp > 1 and info["p2p_ns"] is None:
            raise PolicyError("parallel.pp > 1 on a trace without pipeline sends: their "
                              "duration is unknown; re-lay out a pipelined trace instead")
        if len(tpl.layers) % par.virtual_stages:
            raise PolicyError(f"parallel: the trace has {len(tpl.layers)} layers, not "
                              f"divisible by pp*chunks={par.pp}*{par.chunks}")
        comm = CommModel(info["hardware"], par)
        step = int(state.trace.ops["step"].min()) if state.trace.n_ops else 0
        try:
            state.trace = build_trace(tpl, par, comm, step=step, p2p_ns=info["p2p_ns"] or 0,
                                      recv_ns=info["recv_ns"] or 0)
        except ConfigError as exc:
            raise PolicyError(f"parallel: {exc}") from exc
        return {"layers": len(tpl.layers), "from": cur, "to": par.to_dict()}

    def apply(self, state: WhatIfState) -> None:
        tpl = state.notes.get("template")
        if tpl is not None:
            from .hardware import scale_host_work
            from .parallel_dp import shared_core_factor
            f = shared_core_factor(tpl[0], state.trace, tpl[1])
            if f is not None:
                scale_host_work(state, f)
        d = self.describe()
        if "micro_batch" in state.notes:
            from .batch_measured import scale_batch
            d["batch_effect"] = scale_batch(state, state.notes["micro_batch"])
        if state.notes.get("tp", 1) > 1:
            from .tp_measured import scale_tp
            d["tp_effect"] = scale_tp(state, state.notes["tp"], state.notes.get("cost_bound"))
        if self.fields():
            state.applied.append(d)


def templates_from_trace(trace):
    """Per-layer op templates measured from an annotated trace (see the module docstring).

    Returns ``(StepTemplate, current parallel config dict, info)`` with ``info`` holding
    ``p2p_ns``, ``recv_ns`` (median measured pipeline send / receive cost, not their spans,
    see :func:`_p2p_costs_ns`; None without a pipeline) and ``hardware`` (the profile used
    for modeled communication).
    """
    import numpy as np

    from retime.collectors.enums import OpKind, Phase
    from retime.collectors.synth import (
        LANES,
        LayerTemplate,
        OpTemplate,
        StepTemplate,
        load_hardware,
    )

    syn = trace.meta.get("synth") if isinstance(trace.meta, dict) else None
    if not isinstance(syn, dict) or not isinstance(syn.get("parallel"), dict):
        raise PolicyError(
            "parallel: re-laying out a measured trace needs its current layout "
            "(meta['synth']['parallel']: tp, pp, dp, micro-batches, schedule) and per-layer "
            "attribution of its ops; this trace has no layout: synthesize the job with "
            "`retime synth` and apply the scenario to that")
    o = trace.ops
    layer = o["layer"].to_numpy()
    phase = o["phase"].to_numpy()
    mb = o["microbatch"].to_numpy()
    rank = o["rank"].to_numpy()
    kind = o["kind"].to_numpy()
    if not ((layer >= 0) & (mb >= 0)).any():
        raise PolicyError("parallel: the trace's ops carry no layer / micro-batch attribution "
                          "(ops.layer and ops.microbatch are -1): per-layer templates cannot "
                          "be measured")
    names = trace.names()
    lane_name = dict(zip(trace.lanes["lane"].to_numpy().tolist(),
                         [str(x).replace(" stream", "") for x in trace.lanes["name"]], strict=True))
    lanes_of_ops = np.asarray([lane_name.get(int(x), "") for x in o["lane"].to_numpy()], object)
    skip = np.isin(lanes_of_ops, ["dp", "pp_send", "pp_recv"]) | (kind == OpKind.P2P) \
        | np.asarray([str(n).startswith("zero3.") for n in names])
    start = o["start_ns"].to_numpy()
    dur = o["dur_ns"].to_numpy()

    def seq(sel: np.ndarray) -> tuple:
        idx = np.flatnonzero(sel)
        if len(idx) == 0:
            return ()
        r0 = rank[idx].min()
        idx = idx[rank[idx] == r0]
        m0 = mb[idx].min()
        idx = idx[mb[idx] == m0]
        idx = idx[np.lexsort((idx, start[idx]))]
        out = []
        for i in idx.tolist():
            ln = lanes_of_ops[i] if lanes_of_ops[i] in LANES else (
                "tp" if kind[i] == OpKind.COLLECTIVE else "compute")
            out.append(OpTemplate(str(names[i]), ln, int(dur[i]), kind=int(kind[i]),
                                  flops=float(o["flops"].iat[i]), bytes=int(o["bytes"].iat[i]),
                                  comm_op=int(o["comm_op"].iat[i])))
        return tuple(out)

    body = ~skip & (mb >= 0)
    # the builder tags the head (final norm, logits, loss) with layer = number of layers
    is_head = np.asarray([str(n).startswith("head.") for n in names]) & body
    body_l = body & ~is_head
    L = int(layer[body_l & (layer >= 0)].max()) + 1 if (body_l & (layer >= 0)).any() else 0
    par = {k: v for k, v in syn["parallel"].items() if k not in ("world_size", "num_microbatches")}
    hwd = syn.get("hardware")
    if isinstance(hwd, dict):
        from .base import hardware_from_dict
        hw = hardware_from_dict(hwd)
    else:
        hw = load_hardware("a100-80gb")
    # params per layer from the gradient reduction / ZeRO gathers of the lowest rank
    r0 = rank.min()
    grads = (kind == OpKind.COLLECTIVE) & (lanes_of_ops == "dp") & (rank == r0) \
        & (phase == int(Phase.BWD))
    total_params = float(o["bytes"].to_numpy()[grads].sum()) / 2.0
    layers = []
    for li in range(L):
        f = seq(body_l & (layer == li) & (phase == int(Phase.FWD)))
        b = seq(body_l & (layer == li) & (phase == int(Phase.BWD)))
        layers.append(LayerTemplate(f, b, int(total_params / max(1, L))))
    embed = None
    if (body & (layer == -1)).any():
        embed = LayerTemplate(seq(body & (layer == -1) & (phase == int(Phase.FWD))),
                              seq(body & (layer == -1) & (phase == int(Phase.BWD))), 0)
    send = (kind == OpKind.P2P) & (o["comm_op"].to_numpy() == 7)
    recv = (kind == OpKind.P2P) & (o["comm_op"].to_numpy() == 8)
    p2p_bytes = int(np.median(o["bytes"].to_numpy()[send])) if send.any() else 0
    opt = (phase == int(Phase.OPT)) & (lanes_of_ops == "compute") & (rank == r0)
    opt_kernels: tuple = ()
    if opt.any() and total_params > 0:
        shard = total_params / (par.get("dp", 1) * par.get("cp", 1) if par.get("zero", 0) else 1)
        bw = hw.hbm_gbps * hw.memory_efficiency
        opt_kernels = tuple((str(names[i]), max(0.0, (dur[i] - hw.kernel_overhead_us * 1e3) * bw
                                                 / shard))
                            for i in np.flatnonzero(opt)[np.argsort(start[opt], kind="stable")])
    head = None
    if is_head.any():
        head = LayerTemplate(seq(is_head & (phase == int(Phase.FWD))),
                             seq(is_head & (phase == int(Phase.BWD))), 0)
    tpl = StepTemplate(layers=tuple(layers), embed=embed, head=head, p2p_bytes=p2p_bytes,
                       optimizer_kernels=opt_kernels, name="measured")
    p2p_ns, recv_ns = _p2p_costs_ns(o["coll_id"].to_numpy(), send, recv, start, dur)
    info = {"p2p_ns": p2p_ns, "recv_ns": recv_ns, "hardware": hw}
    return tpl, par, info


def _p2p_costs_ns(coll_id, send, recv, start, dur) -> tuple[int | None, int | None]:
    """Median pipeline send cost (the transfer) and receive cost once the data arrived.

    A send paired with its receive (one ``coll_id``, a rendezvous: each member starts when
    its rank is ready, so the one that waited holds its wait) costs its end minus the later
    member start, the receive its end minus the send's end; measured spans would count the
    wait. An unpaired send / receive (``coll_id`` -1, a send -> receive edge) costs its
    duration."""
    import numpy as np

    end = start + dur
    s_cost = dur[send].astype(np.int64)
    r_cost = dur[recv].astype(np.int64)
    sc, rc = coll_id[send], coll_id[recv]
    if (sc >= 0).any() and (rc >= 0).any():
        si = np.flatnonzero(send)[sc >= 0]
        order = np.argsort(coll_id[si], kind="stable")
        si, keys = si[order], coll_id[si][order]
        ri = np.flatnonzero(recv)
        at = np.searchsorted(keys, rc).clip(0, len(keys) - 1)
        hit = (rc >= 0) & (keys[at] == rc)
        peer_s = si[at[hit]]  # the send of each paired receive
        r_cost[hit] = end[ri[hit]] - end[peer_s]
        both = np.maximum(start[ri[hit]], start[peer_s])
        s_pos = np.searchsorted(np.flatnonzero(send), peer_s)
        s_cost[s_pos] = end[peer_s] - both
    return (int(np.median(s_cost)) if send.any() else None,
            int(np.median(r_cost)) if recv.any() else None)
