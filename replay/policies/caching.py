"""Caching what-ifs: FCDP host cache, keep-gathered-parameters, activation recompute, offload.

Host link: every host<->GPU transfer below runs at ``cache.pcie_gbps``, by default the
synthesized run's hardware profile's host link (PCIe, or NVLink-C2C to Grace on GB200/GB300:
450 GB/s per direction, capped by the GPU's share of Grace's memory bandwidth, about 256 GB/s,
against ~25 GB/s of PCIe Gen4), and the CPU's Adam at ``cache.host_gbps``, by default the
profile's host memory share; measured traces use the profile that names their GPU
(``meta["devices"]``; :func:`retime.collectors.synth.hardware.match_hardware`), else 25 and
100 GB/s.

* ``fcdp`` (fully cached data parallel, arXiv 2602.06499): ZeRO-3 gathers every layer's
  parameters across nodes twice per step (forward and backward). FCDP keeps the
  forward-gathered parameters in host memory and rebuilds them for backward with a
  host-to-GPU copy of the node's share (``S / k`` bytes per GPU over the host link, ``k`` data-parallel
  ranks per node) plus an intra-node all-gather, so backward moves no parameter bytes across
  nodes: inter-node all-gather traffic is exactly half of ZeRO-3's. GPU memory is unchanged;
  host memory grows by the node's gathered parameters (reported in
  ``meta["memory"]["host_cache_bytes"]``).
* ``keep_params``: keep the forward-gathered parameters in GPU memory (no backward gather at
  all); GPU memory grows by the unsharded parameters of the stage minus its shard.
* ``recompute``: ``none`` | ``selective`` | ``full`` (on a synthesized run: re-synthesized,
  recompute kernels and activation memory change together).
* ``offload_optimizer``: ZeRO-Offload style: fp32 master weights and Adam moments live in
  host memory and the Adam step runs on the CPU. Per step each GPU sends its gradient shard
  to the host and receives updated 16-bit parameters (``2 + 2`` bytes per parameter over
  PCIe) and the CPU streams Adam's 28 bytes per parameter through host memory
  (``cache.host_gbps``, default 100 GB/s); the GPU's copy-grads / Adam / copy-params kernels
  are replaced by that time, and GPU memory drops by the optimizer state.
* ``offload_activations``: each layer's saved activations go to host memory after its
  forward and come back before its backward, over PCIe on a copy engine that overlaps the
  next layer's compute: a layer takes ``max(T_compute, A / pcie_gbps)`` (``A`` its
  activation bytes per micro-batch) in forward and in backward, and GPU memory keeps two
  layers' activations instead of all in-flight ones.

Which keys work on which traces, and why:

* **Synthesized runs** (``meta["synth"]``): every key above. The layer sizes, the ZeRO-3
  gathers and the optimizer / activation bytes are known there.
* **Measured traces** (:mod:`replay.policies.caching_real`):

  - op-level Megatron timelines (measured, or re-laid out by ``parallel.*``):
    ``recompute=full`` re-runs each backward's own measured forward before it (the engine
    propagates it through the pipeline schedule); ``recompute=none`` undoes that on a trace
    whose backward/forward ratio shows it already recomputes; ``selective`` is refused (the
    attention core's share of a forward is not in the trace). Memory: unknown (no tensor
    sizes).
  - Kineto traces of a model with non-reentrant ``torch.utils.checkpoint``, recorded with
    Python stacks: ``recompute=none`` removes the checkpoint frames' host time (the
    ``recompute_fn`` re-running each segment's forward, the saved-tensor hooks) and the
    kernels they launched; memory from ``[memory]`` events when present, else unknown.
    ``full`` / ``selective`` are refused (which forward ops to re-run is not in a trace).
  - Kineto traces with GPU ``[memory]`` events and forward / backward phases:
    ``offload_activations`` (the bytes the forward leaves for the backward, over PCIe,
    hidden behind each phase's GPU work; a lower bound without layers in the trace).
  - Kineto DDP traces with sized gradient all-reduces and an ``Optimizer.step#NAME.step``
    range (SGD / Adam family): ``offload_optimizer`` (parameter bytes = the step's gradient
    all-reduce bytes; states per parameter from the optimizer).
  - ``fcdp`` / ``keep_params``: refused, no shared real trace has ZeRO-3/FSDP per-layer
    parameter all-gathers (the error says so); ``offload_*`` where the bytes are not in the
    trace (op-level traces; no ``[memory]`` events, phases or sized all-reduces): refused,
    the error names what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from retime.collectors.enums import CommOp, OpKind
from retime.collectors.errors import PolicyError

from .base import (
    STRUCTURE_COLUMNS,
    Policy,
    WhatIfState,
    check_choice,
    check_positive,
    known_fields,
)

__all__ = ["Cache", "BWD_GATHER_NAME"]

BWD_GATHER_NAME = "zero3.allgather_params.bwd"
DEFAULT_PCIE_GBPS = 25.0  # PCIe Gen4 x16, per GPU per direction, achieved
DEFAULT_HOST_GBPS = 100.0  # host DRAM bandwidth a CPU Adam step streams at


@dataclass(frozen=True)
class Cache(Policy):
    """Parameter caching and activation recompute (see the module docstring)."""

    fcdp: bool | None = None
    keep_params: bool | None = None
    recompute: str | None = None
    offload_optimizer: bool | None = None
    offload_activations: bool | None = None
    pcie_gbps: float | None = None
    host_gbps: float | None = None
    table: ClassVar[str] = "cache"

    def __post_init__(self) -> None:
        for f in ("fcdp", "keep_params", "offload_optimizer", "offload_activations"):
            v = getattr(self, f)
            if v is not None and not isinstance(v, bool):
                raise PolicyError(f"cache.{f}={v!r} must be true or false")
        if self.fcdp and self.keep_params:
            raise PolicyError("cache.fcdp and cache.keep_params both true: FCDP caches the "
                              "parameters in host memory, keep_params in GPU memory; pick one")
        check_choice("cache", "recompute", self.recompute, ("none", "selective", "full"))
        check_positive("cache", "pcie_gbps", self.pcie_gbps)
        check_positive("cache", "host_gbps", self.host_gbps)

    @classmethod
    def columns_for(cls, fields: frozenset[str]) -> tuple[str, ...] | None:
        """Recompute on a measured trace finds the forward and backward passes (and on an
        op-level one the micro-batches): :data:`.base.STRUCTURE_COLUMNS`. Offloads and
        parameter caching find the forward and backward phases and the gradient
        all-reduces (or refuse, naming what the trace lacks): the ops' phase."""
        if not fields <= {"fcdp", "keep_params", "recompute", "offload_optimizer",
                          "offload_activations", "pcie_gbps", "host_gbps"}:
            return None
        return STRUCTURE_COLUMNS if "recompute" in fields else ("phase",)

    @classmethod
    def synth_columns_for(cls, fields: frozenset[str]) -> tuple[str, ...] | None:
        """On a synthesized store recompute is re-synthesized and the rates are numbers;
        FCDP / keep_params size the backward gathers per stage by micro-batch, and
        activation offload sums the forward's layers per micro-batch and chunk."""
        if not fields <= known_fields(cls):
            return None
        need = set()
        if fields & {"fcdp", "keep_params"}:
            need.add("microbatch")
        if "offload_activations" in fields:
            need |= {"phase", "layer", "microbatch", "chunk"}
        return tuple(c for c in STRUCTURE_COLUMNS if c in need)

    def configure(self, state: WhatIfState) -> None:
        if not state.is_synth:
            from .caching_real import configure_measured
            configure_measured(self, state)
            return
        if self.recompute is not None:
            state.synth.set_parallel(recompute=self.recompute)
        if self.fcdp or self.keep_params:
            what = "fcdp" if self.fcdp else "keep_params"
            p = state.synth.parallel
            if not (p.get("zero") == 3 or p.get("fsdp")):
                raise PolicyError(f"cache.{what} caches ZeRO-3 gathered parameters but the run "
                                  f"uses zero={p.get('zero')} fsdp={p.get('fsdp')}; add "
                                  "parallel.zero=3 (or parallel.fsdp=true) to the scenario")
            if p.get("dp", 1) * p.get("cp", 1) <= 1:
                raise PolicyError(f"cache.{what}: the run has no data parallelism (dp=1), "
                                  "so ZeRO-3 gathers nothing")

    def apply(self, state: WhatIfState) -> None:
        if not state.is_synth:
            from .caching_real import apply_measured
            state.applied.append(self.describe() | apply_measured(self, state))
            return
        if self.fcdp or self.keep_params:
            self._rebuild_backward_gathers(state)
        if self.offload_optimizer:
            self._offload_optimizer(state)
        if self.offload_activations:
            self._offload_activations(state)
        state.applied.append(self.describe())

    def _rates(self, state: WhatIfState) -> tuple[float, float]:
        """(host link GB/s, host memory GB/s): stated, else the synthesized hardware's."""
        hw = state.synth.hardware
        return (float(self.pcie_gbps or hw.host_bytes_per_ns),
                float(self.host_gbps or hw.host_memory_gbps))

    def _offload_activations(self, state: WhatIfState) -> None:
        import pandas as pd
        t = state.trace
        o = t.ops
        mem = t.meta["synth"]["memory"]
        pcie = self._rates(state)[0]
        per_layer = {r["stage"]: float(r["activation_bytes_per_layer"]) for r in mem}
        stage_of_rank = _stages(t)
        lane_name = dict(zip(t.lanes["lane"].to_numpy().tolist(),
                             [str(x).split(" ")[0] for x in t.lanes["name"]], strict=True))
        comp = np.asarray([lane_name.get(int(x)) == "compute" for x in o["lane"].to_numpy()])
        sel = comp & (o["layer"].to_numpy() >= 0) & np.isin(o["phase"].to_numpy(), [0, 1])
        idx = np.flatnonzero(sel)
        if len(idx) == 0:
            raise PolicyError("cache.offload_activations: no per-layer compute ops to offload")
        f = pd.DataFrame({"op": idx, "rank": o["rank"].to_numpy()[idx],
                          "mb": o["microbatch"].to_numpy()[idx],
                          "chunk": o["chunk"].to_numpy()[idx],
                          "layer": o["layer"].to_numpy()[idx],
                          "phase": o["phase"].to_numpy()[idx],
                          "start": o["start_ns"].to_numpy()[idx], "dur": state.dur[idx]})
        g = f.sort_values("start").groupby(["rank", "mb", "chunk", "layer", "phase"])
        agg = g.agg(total=("dur", "sum"), last=("op", "last"), rank=("rank", "first"))
        tau = np.asarray([per_layer[int(s)] for s in stage_of_rank[agg["rank"].to_numpy()]]) / pcie
        extra = np.maximum(0.0, tau - agg["total"].to_numpy())
        state.dur[agg["last"].to_numpy()] += extra
        worst = max(mem, key=lambda r: r["activation_bytes"])
        state.memory_delta_bytes -= int(max(0.0, worst["activation_bytes"]
                                            - 2 * worst["activation_bytes_per_layer"]))

    def _offload_optimizer(self, state: WhatIfState) -> None:
        t = state.trace
        names = t.names()
        mem = t.meta["synth"]["memory"]
        stage_of_rank = _stages(t)
        ranks = t.ops["rank"].to_numpy()
        pcie, host = self._rates(state)
        for row in mem:
            shard = row["optimizer_bytes"] / 12.0  # fp32 master weights, m and v
            on = np.isin(ranks, np.flatnonzero(stage_of_rank == row["stage"]))
            adam = on & (names == "optimizer.adam_step")
            gone = on & np.isin(names, ["optimizer.copy_grads", "optimizer.copy_params"])
            state.dur[adam] = 4.0 * shard / pcie + 28.0 * shard / host
            state.dur[gone] = 0.0
        state.memory_delta_bytes -= int(max(r["optimizer_bytes"] for r in mem))

    def _rebuild_backward_gathers(self, state: WhatIfState) -> None:
        from retime.collectors.synth import CommModel, resolve_parallel
        from retime.collectors.synth.costs import GroupGeometry
        t = state.trace
        o = t.ops
        names = np.asarray(t.strings, dtype=object)
        nid = np.flatnonzero(names == BWD_GATHER_NAME)
        sel = np.isin(o["name_id"].to_numpy(), nid) & (o["kind"].to_numpy() == OpKind.COLLECTIVE)
        if not sel.any():
            raise PolicyError("cache: the synthesized run has no backward ZeRO-3 parameter "
                              f"all-gathers ({BWD_GATHER_NAME!r}) to cache")
        idx = np.flatnonzero(sel)
        spec = state.synth
        par = resolve_parallel(dict(spec.parallel))
        comm = CommModel(spec.hardware, par)
        geo = comm.geometry["dp"]
        k = geo.per_node
        nbytes = o["bytes"].to_numpy()[idx].astype(np.float64)
        if self.keep_params:
            new = np.zeros(len(idx))
            # the stage's unsharded parameters stay resident instead of one layer at a time
            stage_params = _stage_param_bytes(t, idx)
            state.memory_delta_bytes += int(stage_params - stage_params / (par.dp * par.cp))
        else:
            pcie = self._rates(state)[0]
            h2d = nbytes / k / pcie + spec.hardware.kernel_overhead_us * 1e3
            intra = np.asarray([comm.collective_ns(CommOp.ALL_GATHER, float(b),
                                                   GroupGeometry(k, k, 1, 1)) for b in nbytes])
            new = h2d + intra
            state.notes["host_cache_bytes"] = int(_stage_param_bytes(t, idx))
        state.dur[idx] = new
        state.notes["intra_node_ops"] = np.union1d(
            state.notes.get("intra_node_ops", np.zeros(0, np.int64)), idx)
        state.notes["removed_ops" if self.keep_params else "fcdp_ops"] = idx


def _stage_param_bytes(trace, idx: np.ndarray) -> float:
    """Gathered parameter bytes of the (largest) stage: one backward gather per layer."""
    o = trace.ops
    r = o["rank"].to_numpy()[idx]
    mb = o["microbatch"].to_numpy()[idx]
    b = o["bytes"].to_numpy()[idx].astype(np.float64)
    sel = mb == mb.min()
    per_rank = {}
    for rr, bb in zip(r[sel].tolist(), b[sel].tolist(), strict=True):
        per_rank[rr] = per_rank.get(rr, 0.0) + bb
    return max(per_rank.values()) if per_rank else 0.0


def _stages(trace) -> np.ndarray:
    """Pipeline stage of every rank of a synthesized trace (Megatron rank order)."""
    p = trace.meta["synth"]["parallel"]
    per_stage = int(p["tp"]) * int(p["cp"]) * int(p["dp"])
    return np.arange(int(trace.ops["rank"].max()) + 1) // per_stage
