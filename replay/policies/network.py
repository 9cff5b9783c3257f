"""Network what-ifs: link bandwidth and latency per level, topology, algorithm, cross-DC.

Levels: a collective whose group stays inside one node runs on the intra-node level
(NVLink/NVSwitch), one that spans nodes on the inter-node level (InfiniBand/RoCE), one that
spans datacenters on the cross-DC level. Rank ``r`` lives on node ``r // ranks_per_node``
and node ``k`` in datacenter ``k // nodes_per_dc``.

Synthesized traces are re-synthesized with the changed links (the synthesizer's alpha-beta
model per level, nccl-tests bus-bandwidth semantics). Bandwidths are per GPU and per
direction in GB/s, as in the hardware profiles; the achieved bus bandwidth is
``gbps * bus_efficiency``.

Measured traces: collectives are re-timed by an alpha-beta model calibrated on the trace's
own collectives. For every collective instance the *last arriver's* transfer time (its whole
kernel: it waited for nobody) is fitted per level as ``t = a + S * f / B`` (``S`` bytes,
``f`` the nccl-tests bus factor of the primitive and group size: ``2(n-1)/n`` all-reduce,
``(n-1)/n`` all-gather / reduce-scatter / all-to-all, 1 otherwise; ``B`` the calibrated bus
bandwidth). A member's new transfer tail is its measured tail plus the model's change,
``a' + S f / B' + steps * d_alpha - (a + S f / B)``, so noise in the measurement is kept and
an unchanged network is the identity. ``B' = gbps * bus_efficiency`` for a level the
scenario sets, else the calibrated ``B`` of that level. Waiting for late ranks is not
re-timed here: the replay re-derives it from the new arrival times.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from retime.collectors.enums import CommOp
from retime.collectors.errors import PolicyError
from retime.collectors.trace import Trace

from .base import (
    Policy,
    WhatIfState,
    check_choice,
    check_int,
    check_positive,
    known_fields,
    ranks_per_node_of,
)
from .link_fit import (
    _LEVEL_KEY,
    DEFAULT_ALPHA_US,
    DEFAULT_BUS_EFFICIENCY,
    LEVELS,
    MAX_ALPHA_SHARE,
    TCP_GOODPUT,
    calibrate,
    collective_table,
    inferred_shaper,
    link_credits,
    shaped_link,
)

__all__ = ["Network", "Topology", "stated_cores"]

def _steps(comm_op: np.ndarray, n: np.ndarray, algorithm: str) -> np.ndarray:
    n = np.maximum(np.asarray(n, np.float64), 1.0)
    ring_ar = 2 * (n - 1)
    tree_ar = 2 * np.ceil(np.log2(np.maximum(n, 1)))
    other = n - 1
    ar = np.asarray(comm_op) == CommOp.ALL_REDUCE
    if algorithm == "tree":
        return np.where(ar, tree_ar, other)
    return np.where(ar, ring_ar, other)


@dataclass(frozen=True)
class Topology(Policy):
    """Cluster shape: ranks per node (Megatron rank order: consecutive ranks share a node)
    and NICs per node (synthesized runs: each GPU's inter-node share is
    ``nics * nic_gbps / ranks_per_node``).

    ``nvlink_domain``: the ranks that share one NVLink domain (72 on a GB200/GB300 NVL72
    rack, whose trays hold 4): collectives inside it run on NVLink whatever hosts they span,
    only those crossing domains use the network. On a synthesized run it is the job's
    placement (:func:`retime.collectors.synth.hardware.job_domain`: at most the hardware's
    domain, dividing the GPUs, at least ``tp``); on a measured trace it replaces the hosts as
    the level that decides which collectives cross the network."""

    ranks_per_node: int | None = None
    nvlink_domain: int | None = None
    nics: int | None = None
    #: CPU cores each host gives the job's ranks, as the user knows them (CPU training: ranks
    #: beyond that on one host time-share its cores). Stated for the measured job and the
    #: what-if alike; a capture's recorded CPU sets are used when it is not stated.
    cores_per_node: int | None = None
    table: ClassVar[str] = "topology"

    def __post_init__(self) -> None:
        check_int("topology", "ranks_per_node", self.ranks_per_node)
        check_int("topology", "nvlink_domain", self.nvlink_domain)
        if self.nvlink_domain and self.ranks_per_node \
                and self.nvlink_domain % self.ranks_per_node:
            raise PolicyError(f"topology.nvlink_domain={self.nvlink_domain} must be a multiple "
                              f"of topology.ranks_per_node={self.ranks_per_node} (a domain is "
                              "whole hosts or trays)")
        check_int("topology", "nics", self.nics)
        check_int("topology", "cores_per_node", self.cores_per_node)

    @classmethod
    def columns_for(cls, fields: frozenset[str]) -> tuple[str, ...] | None:
        """The node shape decides which collectives cross nodes, and the network policy it
        brings re-times them (:meth:`Network.columns_for`); ``nics`` is refused on a
        measured trace. ``cores_per_node`` states the hosts' CPU sets in the trace's meta
        (what the gloo paths read): no ops column."""
        return () if fields <= {"ranks_per_node", "nvlink_domain", "nics",
                                "cores_per_node"} else None

    @classmethod
    def synth_columns_for(cls, fields: frozenset[str]) -> tuple[str, ...] | None:
        """On a synthesized store the node shape and NICs change the run's hardware
        (re-synthesized); ``cores_per_node`` does nothing there: no ops column."""
        return () if fields <= known_fields(cls) else None

    def configure(self, state: WhatIfState) -> None:
        if self.cores_per_node is not None and not state.is_synth:
            state.trace = stated_cores(state.trace, self.cores_per_node)
        if self.nics is not None:
            if not state.is_synth:
                raise PolicyError("topology.nics: a measured trace does not say how many NICs "
                                  "its nodes had; set network.inter_node_gbps (per GPU) instead")
            hw = state.synth.hardware
            gpn = self.ranks_per_node or hw.gpus_per_node
            state.synth.set_hardware(dataclasses.replace(
                hw, nics=self.nics, inter=dataclasses.replace(
                    hw.inter, gbps=self.nics * hw.nic_gbps / gpn)))
        if self.ranks_per_node is None and self.nvlink_domain is None:
            return
        if state.is_synth:
            if self.ranks_per_node is not None:
                hw = state.synth.hardware
                # per-GPU NIC share stays the same (unless topology.nics says otherwise); the
                # stated hosts are the NVLink domain unless nvlink_domain says otherwise
                state.synth.set_hardware(dataclasses.replace(
                    hw, gpus_per_node=self.ranks_per_node, nvlink_domain=0,
                    nics=self.nics or max(1, round(hw.nics * self.ranks_per_node
                                                   / hw.gpus_per_node))))
            if self.nvlink_domain is not None:
                hw = state.synth.hardware
                if self.nvlink_domain > hw.domain:  # a what-if on a larger NVLink fabric
                    state.synth.set_hardware(dataclasses.replace(
                        hw, nvlink_domain=self.nvlink_domain))
                state.synth.set_parallel(nvlink_domain=self.nvlink_domain)
        state.notes.setdefault("measured_ranks_per_node", ranks_per_node_of(state.trace))
        state.ranks_per_node = self.nvlink_domain or self.ranks_per_node

    def apply(self, state: WhatIfState) -> None:
        state.applied.append(self.describe())


def stated_cores(trace: Trace, cores: int) -> Trace:
    """The trace with each rank's CPU set as the user stated the hosts (``cores`` per host):
    the ranks of a host, in rank order, get their shares (:func:`host_cpu.share_cores`:
    disjoint when the host has a core per rank, else round-robin) as ``meta["cpu_affinity"]``,
    what :mod:`.parallel_dp` and the CPU interference read. Unchanged when the trace records
    no host names."""
    from .host_cpu import share_cores

    hosts = trace.meta.get("hostnames") if isinstance(trace.meta, dict) else None
    if not isinstance(hosts, dict) or not hosts:
        return trace
    by_host: dict[str, list[str]] = {}
    for r in sorted(hosts, key=int):
        by_host.setdefault(hosts[r], []).append(r)
    aff = {}
    for ranks in by_host.values():
        for r, cpus in zip(ranks, share_cores(len(ranks), int(cores)), strict=True):
            aff[str(r)] = cpus
    meta = dict(trace.meta)
    meta["cpu_affinity"] = aff
    meta["cores_per_host_stated"] = int(cores)
    return dataclasses.replace(trace, meta=meta)


@dataclass(frozen=True)
class Network(Policy):
    """Link bandwidths (GB/s per GPU per direction), latencies (us per algorithm step),
    the all-reduce algorithm and cross-datacenter placement."""

    intra_node_gbps: float | None = None
    inter_node_gbps: float | None = None
    latency_us: float | None = None
    intra_latency_us: float | None = None
    algorithm: str | None = None
    bus_efficiency: float | None = None
    #: one level's achieved fraction of its nominal rate (a calibration measured on the
    #: cluster, ``retime calibrate --cluster``); wins over ``bus_efficiency`` for that level
    intra_bus_efficiency: float | None = None
    inter_bus_efficiency: float | None = None
    cross_dc_gbps: float | None = None
    cross_dc_km: float | None = None
    nodes_per_dc: int | None = None
    #: share of a measured collective's time that is fixed latency, where the trace's sizes
    #: cannot tell (one message size): 0 by default, MAX_ALPHA_SHARE at the range's bound
    alpha_share: float | None = None
    #: the nominal rates of the links the trace ran on (what the user knows of them): the
    #: fit's efficiency against them carries over to the new rates, and a CPU trace whose
    #: transfers beat their link's rate shows a token bucket (its burst is inferred)
    measured_intra_node_gbps: float | None = None
    measured_inter_node_gbps: float | None = None
    table: ClassVar[str] = "network"

    @classmethod
    def columns_for(cls, fields: frozenset[str]) -> tuple[str, ...] | None:
        """Per-level bandwidth, latency and efficiency re-price the collectives from
        :data:`replay.footprint.WHATIF_COLUMNS` alone; the other keys are not audited."""
        audited = {"intra_node_gbps", "inter_node_gbps", "latency_us", "intra_latency_us",
                   "bus_efficiency", "intra_bus_efficiency", "inter_bus_efficiency"}
        return () if fields <= audited else None

    @classmethod
    def synth_columns_for(cls, fields: frozenset[str]) -> tuple[str, ...] | None:
        """The same columns on a synthesized store (the same code reads them)."""
        return cls.columns_for(fields)

    def __post_init__(self) -> None:
        for f in ("intra_node_gbps", "inter_node_gbps", "cross_dc_gbps", "bus_efficiency",
                  "intra_bus_efficiency", "inter_bus_efficiency",
                  "measured_intra_node_gbps", "measured_inter_node_gbps"):
            check_positive("network", f, getattr(self, f))
        for f in ("latency_us", "intra_latency_us", "cross_dc_km"):
            check_positive("network", f, getattr(self, f), strict=False)
        for f in ("bus_efficiency", "intra_bus_efficiency", "inter_bus_efficiency"):
            if getattr(self, f) is not None and getattr(self, f) > 1:
                raise PolicyError(f"network.{f}={getattr(self, f)} must be in (0, 1]")
        check_choice("network", "algorithm", self.algorithm, ("ring", "tree"))
        check_int("network", "nodes_per_dc", self.nodes_per_dc)
        if self.alpha_share is not None and not 0 <= self.alpha_share <= MAX_ALPHA_SHARE:
            raise PolicyError(f"network.alpha_share={self.alpha_share} must be in "
                              f"[0, {MAX_ALPHA_SHARE}] (a collective's fixed latency share)")

    def configure(self, state: WhatIfState) -> None:
        if not state.is_synth:
            if self.measured_inter_node_gbps is not None:  # overlap.bucket_mb's bound reads it
                state.notes["stated_inter_node_gbps"] = float(self.measured_inter_node_gbps)
            if self.intra_node_gbps is not None:  # parallel.tp's TP all-reduces read it
                state.notes["intra_node_gbps"] = float(self.intra_node_gbps)
            return
        hw = state.synth.hardware
        rep = dataclasses.replace
        intra, inter, cross = hw.intra, hw.inter, hw.cross_dc
        if self.intra_node_gbps is not None:
            intra = rep(intra, gbps=float(self.intra_node_gbps))
        if self.intra_latency_us is not None:
            intra = rep(intra, latency_us=float(self.intra_latency_us))
        if self.bus_efficiency is not None:
            intra = rep(intra, bus_efficiency=float(self.bus_efficiency))
            inter = rep(inter, bus_efficiency=float(self.bus_efficiency))
        if self.intra_bus_efficiency is not None:
            intra = rep(intra, bus_efficiency=float(self.intra_bus_efficiency))
        if self.inter_bus_efficiency is not None:
            inter = rep(inter, bus_efficiency=float(self.inter_bus_efficiency))
        if self.inter_node_gbps is not None:
            inter = rep(inter, gbps=float(self.inter_node_gbps))
        if self.latency_us is not None:
            inter = rep(inter, latency_us=float(self.latency_us))
        nodes_per_dc = hw.nodes_per_dc
        km = hw.dc_km
        if self.nodes_per_dc is not None or self.cross_dc_gbps is not None \
                or self.cross_dc_km is not None:
            from retime.collectors.synth.hardware import LinkConfig
            km = float(self.cross_dc_km if self.cross_dc_km is not None else hw.dc_km)
            gbps = float(self.cross_dc_gbps if self.cross_dc_gbps is not None
                         else (cross.gbps if cross is not None else 12.5))
            cross = LinkConfig(link="cross-datacenter", gbps=gbps,
                               bus_efficiency=inter.bus_efficiency,
                               latency_us=inter.latency_us + 5.0 * km, base_us=inter.base_us)
            if self.nodes_per_dc is not None:
                nodes_per_dc = int(self.nodes_per_dc)
            if nodes_per_dc <= 0:
                raise PolicyError("network.cross_dc_gbps / cross_dc_km need "
                                  "network.nodes_per_dc (nodes per datacenter)")
        state.synth.set_hardware(rep(hw, intra=intra, inter=inter, cross_dc=cross,
                                     nodes_per_dc=nodes_per_dc, dc_km=km))

    def _level_gbps(self) -> dict[int, float | None]:
        return {0: self.intra_node_gbps, 1: self.inter_node_gbps, 2: self.cross_dc_gbps}

    def apply(self, state: WhatIfState) -> None:
        if state.is_synth and self.algorithm is None:
            state.applied.append(self.describe())
            return
        stated_only = {f.name for f in dataclasses.fields(self) if getattr(self, f.name)
                       is not None} <= {"measured_intra_node_gbps", "measured_inter_node_gbps"}
        if stated_only and "rebucket" in state.notes and "template" not in state.notes:
            # only the links' stated rates, for overlap.bucket_mb's re-bucketing: nothing
            # to re-time here
            state.applied.append(self.describe())
            return
        tab = collective_table(state.trace, state.graph, state.ranks_per_node,
                               self.nodes_per_dc)
        if len(tab["op"]) == 0:
            if state.notes.get("tp", 1) > 1 and "intra_node_gbps" in state.notes:
                # the only collectives are parallel.tp's, priced at the stated rate there
                state.applied.append(self.describe())
                return
            raise PolicyError("network policy: the trace has no collective or p2p ops to "
                              "re-time")
        if state.is_synth:  # only the algorithm: latency steps change
            alpha = {0: state.synth.hardware.intra.latency_us,
                     1: state.synth.hardware.inter.latency_us,
                     2: (state.synth.hardware.cross_dc or state.synth.hardware.inter).latency_us}
            old_steps = np.minimum(_steps(tab["comm_op"], tab["n"], "ring"),
                                   _steps(tab["comm_op"], tab["n"], "tree"))
            new_steps = _steps(tab["comm_op"], tab["n"], self.algorithm)
            a = np.asarray([alpha[int(lv)] for lv in tab["level"]]) * 1e3
            state.dur[tab["op"]] += (new_steps - old_steps) * a
            state.applied.append(self.describe())
            return
        cpu = _cpu_collectives(state.trace, tab)
        shaper = shaped_link(state.trace) if cpu else None
        old = _template_table(state, tab, self.alpha_share)
        if old is None:
            if cpu and shaper is None and self.measured_inter_node_gbps is not None:
                shaper = inferred_shaper(state.graph, tab, float(self.measured_inter_node_gbps))
                if shaper is not None:  # fitted on the trace's transfers: no prior to bound
                    state.assume(
                        f"the trace's inter-host transfers beat the stated "
                        f"{self.measured_inter_node_gbps:g} GB/s: a token bucket of "
                        f"{shaper[0] * shaper[1] / 1e6:.2f} MB ({shaper[1] / 1e6:.1f} ms of the "
                        "rate) that refills while the link idles, inferred from them; a new "
                        "rate keeps its time", bounded=True)
            cr_old = (link_credits(state.graph, tab, tab["old_level"] == 1, *shaper)
                      if shaper else np.zeros(len(tab["op"])))
            cal = calibrate(state.trace, state.graph, tab, credit=cr_old,
                            alpha_share=self.alpha_share)
            x_old, old_lv, n_old, cop_old = (tab["bytes"] * tab["factor"], tab["old_level"],
                                             tab["n"], tab["comm_op"])
        else:  # a re-laid-out measured job: the model at the template ops' measured shape
            cal, x_old, old_lv, n_old, cop_old, cr_old = old
        c_new = np.zeros(len(tab["op"]))
        if shaper:  # the link's bucket, at the new rate (its time tau kept)
            rate = float(self.inter_node_gbps) if self.inter_node_gbps is not None \
                else shaper[0]
            c_new = link_credits(state.graph, tab, tab["level"] == 1, rate, shaper[1])
            state.notes["shaped_link"] = {"measured_rate_gbps": shaper[0],
                                          "rate_gbps": rate, "burst_ms": shaper[1] / 1e6}
        state.notes["network_calibration"] = {LEVELS[k]: v for k, v in cal.items()}
        if self._nccl(state, tab, cal, cpu, old):
            return
        for k, v in cal.items():
            if v.get("why") and (self._level_gbps().get(k) is not None
                                 or k in set(np.unique(tab["level"]).tolist())):
                # bounded: the range replays the other bound (unless that is this replay)
                state.assume(
                    f"{LEVELS[k]} link fitted as {v['busbw_gbps']:.3g} GB/s of bus bandwidth "
                    f"with no latency of its own: {v['why']} (latency per step: the prior "
                    f"{DEFAULT_ALPHA_US[k]:g} us); the range spans up to "
                    f"{MAX_ALPHA_SHARE:.0%} of each collective's time as latency",
                    bounds=None if self.alpha_share is not None
                    else [{"network.alpha_share": MAX_ALPHA_SHARE}])
            if v.get("partial"):
                state.notes.setdefault("assumed", []).append(
                    f"{LEVELS[k]} bandwidth fitted on collectives with untraced members "
                    f"({v['points']}): their time may include waiting for those ranks, so "
                    f"{v['busbw_gbps']:.3g} GB/s is a lower bound; trace every rank, or set "
                    f"network.{_LEVEL_KEY[k]}")
        eff = self.bus_efficiency or (TCP_GOODPUT if cpu else DEFAULT_BUS_EFFICIENCY)
        level_eff = {0: self.intra_bus_efficiency, 1: self.inter_bus_efficiency}
        stated = {0: self.measured_intra_node_gbps, 1: self.measured_inter_node_gbps}
        new_bw = {}
        for lv, gbps in self._level_gbps().items():
            if gbps is not None and level_eff.get(lv) is not None:
                new_bw[lv] = gbps * float(level_eff[lv])
            elif gbps is not None and stated.get(lv) and lv in cal \
                    and self.bus_efficiency is None:
                # the efficiency the trace achieved on its stated link, on the new one
                e = min(1.0, cal[lv]["busbw_gbps"] / float(stated[lv]))
                new_bw[lv] = gbps * e
                # fitted against a stated rate, not a prior: counts as fitted in the range
                state.assume(
                    f"{LEVELS[lv]} link: the trace achieved {e:.0%} of its stated "
                    f"{stated[lv]:g} GB/s ({cal[lv]['busbw_gbps']:.3g} GB/s of bus bandwidth); "
                    f"the same share of {gbps:g} GB/s", bounded=True)
            elif gbps is not None:
                new_bw[lv] = gbps * eff
            elif lv in cal:
                new_bw[lv] = cal[lv]["busbw_gbps"]
        x = tab["bytes"] * tab["factor"]
        if not (x > 0).any():
            raise PolicyError("network policy: the trace's collectives carry no sizes "
                              "(ops.bytes is 0), so their transfer time cannot be re-timed by "
                              "bandwidth; re-ingest with collective sizes (NCCL kernel args) "
                              "or scale them with hardware.comm_speedup")
        new_lv = tab["level"]
        need = set(np.unique(new_lv[x > 0]).tolist()) - set(new_bw)
        if 0 in need and cpu:
            # gloo on one host: loopback TCP, bound by the host's copies (host_cpu)
            from .host_cpu import loopback_busbw
            lo = loopback_busbw(state.trace)
            if lo is not None:
                new_bw[0] = lo
                need.discard(0)
                state.notes.setdefault("assumed", []).append(
                    f"intra-node (loopback) bus bandwidth {lo:.2f} GB/s estimated from the "
                    "host's copy rate in the trace (an upper bound); set "
                    "network.intra_node_gbps if known")
                state.notes["network_calibration"]["intra"] = {
                    "alpha_ns": 0.0, "busbw_gbps": lo, "points": 0,
                    "source": "host copy rate (DDP reducer copies) / TCP passes per byte"}
        if need:
            names = ", ".join(LEVELS[k] for k in sorted(need))
            raise PolicyError(
                f"network policy: collectives now cross the {names} level but the trace has "
                f"no measured collectives there to calibrate on; set "
                + ", ".join(f"network.{_LEVEL_KEY[k]}" for k in sorted(need)))
        t_old = np.zeros(len(x))
        t_new = np.zeros(len(x))
        for i in range(len(x)):  # one entry per collective op (thousands at most)
            c_old = cal.get(int(old_lv[i]))
            if c_old is None or x[i] <= 0:
                continue
            t_old[i] = c_old["alpha_ns"] + max(x_old[i] - cr_old[i], 0.0) \
                / c_old["busbw_gbps"]
            a_new = cal.get(int(new_lv[i]), c_old)["alpha_ns"]
            t_new[i] = a_new + max(x[i] - c_new[i], 0.0) / new_bw[int(new_lv[i])]
        # latency per algorithm step
        lat = {0: self.intra_latency_us, 1: self.latency_us, 2: None}
        if self.cross_dc_km is not None:
            lat[2] = (self.latency_us if self.latency_us is not None else DEFAULT_ALPHA_US[1]) \
                + 5.0 * self.cross_dc_km
        elif self.latency_us is not None:
            lat[2] = self.latency_us
        steps_old = _steps(cop_old, n_old, "ring")
        steps_new = _steps(tab["comm_op"], tab["n"], self.algorithm or "ring")
        for i in range(len(x)):
            lv = int(new_lv[i])
            a_old = DEFAULT_ALPHA_US[int(old_lv[i])] * 1e3
            a_new = (lat[lv] if lat[lv] is not None else DEFAULT_ALPHA_US[lv]) * 1e3
            t_new[i] += steps_new[i] * a_new - steps_old[i] * a_old
        state.dur[tab["op"]] += t_new - t_old
        state.applied.append(self.describe())


    def _nccl(self, state: WhatIfState, tab, cal, cpu: bool, old) -> bool:
        """NCCL/RCCL collectives on GPU streams with a new nominal link rate: re-timed by
        the cost layer's NCCL model (:func:`.nccl_trace.network_delta`), which applies the
        efficiency (a level's stated one, ``intra_bus_efficiency`` / ``inter_bus_efficiency``,
        on the new links); the fitted and the assumed figures are printed. False where it does
        not apply (gloo, a stated bus efficiency for every level, latency keys, re-laid-out jobs, levels
        that change, a trace without device properties): the alpha-beta path runs."""
        from .nccl_trace import gpu_collectives, network_delta

        if cpu or old is not None or self.bus_efficiency is not None \
                or (self.intra_node_gbps is None and self.inter_node_gbps is None) \
                or any(v is not None for v in (self.latency_us, self.intra_latency_us,
                                                self.algorithm, self.cross_dc_gbps,
                                                self.cross_dc_km, self.nodes_per_dc)) \
                or not (tab["bytes"] > 0).any() or not gpu_collectives(state.trace, tab["op"]):
            return False
        got = network_delta(state.trace, state.graph, tab, cal, state.ranks_per_node,
                            self.intra_node_gbps, self.inter_node_gbps,
                            self.measured_intra_node_gbps, self.measured_inter_node_gbps,
                            self.intra_bus_efficiency, self.inter_bus_efficiency)
        if got is None:
            return False
        delta, info, lines = got
        for line, fitted in zip(lines, info.get("fitted_levels", []), strict=False):
            # anchored on fully traced collectives: the range's fitted share covers it;
            # the model alone (untraced members): an assumption the range cannot bound
            state.assume(line, bounded=fitted)
        state.notes["nccl_network"] = info
        state.dur[tab["op"]] += delta
        d = self.describe()
        d["model"] = "nccl"
        state.applied.append(d)
        return True


def _template_table(state: WhatIfState, tab: dict[str, np.ndarray],
                    alpha_share: float | None = None):
    """For a re-laid-out measured job (``state.notes["template"]``: the measured trace and,
    per new op, the measured op it copies): the calibration on the measured trace and, per
    row of ``tab``, its template's bus bytes, level, group size and primitive as measured."""
    tpl = state.notes.get("template")
    if tpl is None:
        return None
    orig, template_of = tpl
    from ..graph import build_graph
    from .base import trace_memo

    memo = trace_memo(orig)
    g = memo.get("graph")
    if g is None:
        g = memo["graph"] = build_graph(orig)
    otab = collective_table(orig, g)
    shaper = shaped_link(orig) if _cpu_collectives(orig, otab) else None
    ocredit = (link_credits(g, otab, otab["old_level"] == 1, *shaper) if shaper
               else np.zeros(len(otab["op"])))
    cal = calibrate(orig, g, otab, credit=ocredit, alpha_share=alpha_share)
    row = np.full(orig.n_ops, -1, np.int64)
    row[otab["op"]] = np.arange(len(otab["op"]))
    r = row[template_of[tab["op"]]]
    if (r < 0).any():  # pragma: no cover - templates of collectives are collectives
        raise PolicyError("network policy: a re-laid-out collective has no measured template")
    return (cal, (otab["bytes"] * otab["factor"])[r], otab["old_level"][r], otab["n"][r],
            otab["comm_op"][r], ocredit[r])


def _cpu_collectives(trace: Trace, tab: dict[str, np.ndarray]) -> bool:
    """Whether the trace's collectives run on host threads (gloo over TCP), not on GPUs."""
    from retime.collectors.enums import LaneKind

    if not len(tab["op"]):
        return False
    lanes = trace.lanes.set_index("lane")["lane_kind"]
    kinds = lanes.reindex(trace.ops["lane"].to_numpy()[tab["op"]]).to_numpy()
    return bool((kinds == LaneKind.CPU_THREAD).all())
