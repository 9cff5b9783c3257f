"""NCCL/RCCL collectives of a measured GPU trace priced by the cost layer's NCCL model.

What-ifs that change a measured collective's size (``overlap.bucket_mb``) or its link's rate
(``network.*_gbps``) on a GPU trace price it with :func:`collectors.costs.nccl.collective_cost`
(algorithm, protocol, channels, ranks per node, nodes; latency and bandwidth per link level)
on the cluster the trace ran on, as far as the trace tells it:

* the GPU from the trace's device properties (its name), its platform's intra-node fabric
  and nominal rate from the name's form factor (SXM / OAM: NVLink or xGMI; PCIe) --
  ``assumed``, unless ``network.measured_intra_node_gbps`` states it;
* ranks per node from the trace's host names (else every rank on one node);
* the algorithm and protocol from the NCCL kernel names (``..._RING_LL_...``): where every
  measured all-reduce ran the same one and NCCL's tuner would not have picked it at the
  largest measured size, the job forced it (``NCCL_ALGO`` / ``NCCL_PROTO``) and new sizes
  keep it; otherwise the tuner's choice.

Anchoring (the identifiability rules of :mod:`.link_fit`): where every member of a collective
is traced, its last arriver's kernel time is transfer, and ``kappa`` = median(measured /
model) over them is *fitted* and scales the model. Where members are untraced, a traced
member's time includes waiting for them and cannot be split: the model prices the transfer
(``kappa = 1``, the model's own range) and the rest is kept as waiting for the untraced
peers, never as transfer time; an ``assumed:`` line says so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from retime.collectors.costs.cluster import GENERATIONS, Cluster
from retime.collectors.costs.gpus import GpuSpec, gpu_spec
from retime.collectors.costs.nccl import collective_cost
from retime.collectors.enums import CommOp, LaneKind
from retime.collectors.errors import ConfigError, PolicyError
from retime.collectors.trace import Trace

__all__ = ["TraceCluster", "trace_cluster", "NcclPricer", "kernel_choice", "gpu_collectives",
           "measured_channels", "channels_text"]

#: CommOp -> the nccl-tests collective the model prices (sizes as in link_fit: the
#: all-reduce buffer, the full gathered buffer, each rank's alltoall send buffer)
_COLL = {CommOp.ALL_REDUCE: "all_reduce", CommOp.REDUCE: "all_reduce",
         CommOp.ALL_GATHER: "all_gather", CommOp.GATHER: "all_gather",
         CommOp.REDUCE_SCATTER: "reduce_scatter", CommOp.SCATTER: "reduce_scatter",
         CommOp.ALL_TO_ALL: "alltoall", CommOp.BROADCAST: "broadcast",
         CommOp.SEND: "sendrecv", CommOp.RECV: "sendrecv", CommOp.SEND_RECV: "sendrecv"}

#: GPU name pattern -> (profile, intra fabric, generation, nominal GB/s, platform)
_PLATFORMS = [
    (r"A100.*PCIE", ("a100-80gb", "pcie", "pcie4", 32.0, "A100 PCIe: PCIe 4.0 x16")),
    (r"A100.*40GB", ("a100-40gb", "nvswitch", "nvlink3", 300.0, "HGX A100: NVLink3")),
    (r"A100|PG509", ("a100-80gb", "nvswitch", "nvlink3", 300.0, "HGX A100: NVLink3")),
    (r"H100.*PCIE", ("h100-pcie", "pcie", "pcie5", 64.0, "H100 PCIe: PCIe 5.0 x16")),
    (r"H100|H800", ("h100-sxm", "nvswitch", "nvlink4", 450.0, "HGX H100: NVLink4")),
    (r"H200", ("h200", "nvswitch", "nvlink4", 450.0, "HGX H200: NVLink4")),
    (r"GB300", ("gb300", "nvswitch", "nvlink5", 900.0, "GB300: NVLink5")),
    (r"B300", ("b300", "nvswitch", "nvlink5", 900.0, "HGX B300: NVLink5")),
    (r"GB200", ("gb200", "nvswitch", "nvlink5", 900.0, "GB200: NVLink5")),
    (r"B200", ("b200", "nvswitch", "nvlink5", 900.0, "HGX B200: NVLink5")),
    (r"MI355X", ("mi355x", "xgmi", "xgmi4", 537.6, "MI355X platform: xGMI mesh")),
    (r"MI325X", ("mi325x", "xgmi", "xgmi3", 448.0, "MI325X platform: xGMI mesh")),
    (r"MI300X", ("mi300x", "xgmi", "xgmi3", 448.0, "MI300X platform: xGMI mesh")),
    (r"V100.*PCIE", ("v100", "pcie", "pcie4", 16.0, "V100 PCIe: PCIe 3.0 x16")),
    (r"V100", ("v100", "nvswitch", "nvlink2", 150.0, "DGX-1/HGX-1 V100: 6 NVLink2 x 25 GB/s")),
]


@dataclass(frozen=True)
class TraceCluster(Cluster):
    """A :class:`Cluster` whose GPU may have no built-in profile (a V100 trace): the NCCL
    model needs only its architecture and SM count, carried here."""

    gpu_override: GpuSpec | None = field(default=None, compare=False)

    @property
    def spec(self) -> GpuSpec:
        return self.gpu_override if self.gpu_override is not None else gpu_spec(self.gpu)


def _device_names(trace: Trace) -> list[str]:
    devs = trace.meta.get("devices") if isinstance(trace.meta, dict) else None
    out = []
    for per_rank in (devs or {}).values():
        if isinstance(per_rank, dict):
            out += [str(d.get("name", "")) for d in per_rank.values() if isinstance(d, dict)]
    return [n for n in out if n]


def _volta_spec(sms: int) -> GpuSpec:
    import dataclasses
    base = gpu_spec("a100-80gb")  # only the architecture and SM count matter to the model
    return GpuSpec(hw=dataclasses.replace(base.hw, name="v100", sm_count=int(sms)),
                   arch="volta")


def trace_cluster(trace: Trace, ranks_per_node: int, world: int,
                  measured_intra_gbps: float | None = None) -> tuple[TraceCluster, dict]:
    """The cluster the trace ran on (see the module docstring) and where each figure came
    from. Raises PolicyError when the trace names no GPU the model knows."""
    names = _device_names(trace)
    if not names:
        raise PolicyError("the trace records no GPU device properties (meta['devices']): the "
                          "NCCL model cannot tell which GPU and fabric the collectives ran on")
    name = names[0]
    up = name.upper().replace("-", " ")
    pick = next((v for pat, v in _PLATFORMS if re.search(pat, up)), None)
    if pick is None:
        raise PolicyError(f"GPU {name!r}: no NCCL platform known for it (known: V100, A100, "
                          "H100, H200, B200, B300, GB200, GB300, MI300X, MI325X, MI355X)")
    profile, fabric, gen, gbps, platform = pick
    sms = next((int(d.get("sms", 0)) for r in (trace.meta.get("devices") or {}).values()
                if isinstance(r, dict) for d in r.values()
                if isinstance(d, dict) and d.get("sms")), 0)
    override = _volta_spec(sms or 80) if profile == "v100" else None
    rpn = max(1, min(int(ranks_per_node), int(world)))
    nodes = max(1, math.ceil(int(world) / rpn))
    nominal = float(measured_intra_gbps) if measured_intra_gbps else gbps
    c = TraceCluster(name="trace", gpu=profile if override is None else "a100-80gb",
                     gpus_per_node=rpn, nodes=nodes, intra_fabric=fabric,
                     intra_generation=gen, intra_gbps=nominal, nvlink_domain=rpn, nvls=False,
                     net_fabric="infiniband", nics_per_node=rpn, nic_gbit=200.0, sharp=False,
                     source="trace", gpu_override=override)
    src = {"gpu": name, "platform": platform, "fabric": f"{fabric}/{gen}",
           "nominal_intra_gbps": nominal,
           "nominal_source": "stated (network.measured_intra_node_gbps)"
           if measured_intra_gbps else f"assumed from the GPU name ({platform}, "
           f"{GENERATIONS[gen][1]:g} GB/s per GPU per direction)",
           "sms": int(c.spec.sm_count), "ranks_per_node": rpn, "nodes": nodes}
    return c, src


_KNAME = re.compile(r"_(RING|TREE|NVLSTREE|NVLS|COLLNET\w*?)_(LL128|LL|SIMPLE)(?:_|\(|$)")


def kernel_choice(names: np.ndarray) -> tuple[str, str] | None:
    """(algorithm, protocol) when every all-reduce kernel name states the same one."""
    got = set()
    for n in names:
        m = _KNAME.search(str(n).upper())
        if m is None:
            return None
        got.add((m.group(1).lower(), {"LL": "LL", "LL128": "LL128",
                                      "SIMPLE": "Simple"}[m.group(2)]))
    return next(iter(got)) if len(got) == 1 else None


def gpu_collectives(trace: Trace, ops: np.ndarray) -> bool:
    """Whether ``ops`` (collective op ids) run on GPU streams (NCCL/RCCL, not gloo)."""
    if not len(ops):
        return False
    lanes = trace.lanes.set_index("lane")["lane_kind"]
    kinds = lanes.reindex(trace.ops["lane"].to_numpy()[ops]).to_numpy()
    return bool((kinds == LaneKind.GPU_STREAM).all())


@dataclass
class NcclPricer:
    """Prices collectives on one cluster with an optional forced algorithm/protocol; caches
    by (collective, size, ranks). ``bound``: ``"low"``/``"high"`` prices at the ends of the
    model's range. ``channels``: the trace's measured channel count (:func:`measured_channels`),
    which replaces the model's table where present."""

    cluster: Cluster
    forced: tuple[str, str] | None = None
    bound: str | None = None
    channels: int | None = None
    _memo: dict = field(default_factory=dict)

    def cost(self, comm_op: int, nbytes: float, n: int):
        coll = _COLL.get(CommOp(int(comm_op)))
        if coll is None or nbytes < 1 or n < 2:
            return None
        key = (coll, int(nbytes), int(n), self.forced, self.bound, self.channels)
        hit = self._memo.get(key)
        if hit is None:
            algo = proto = None
            if self.forced and coll in ("all_reduce", "all_gather", "reduce_scatter",
                                        "broadcast"):
                algo, proto = self.forced
            try:
                hit = collective_cost(self.cluster, coll, int(nbytes), ranks=int(n),
                                      algo=algo, proto=proto, channels=self.channels)
            except ConfigError:
                hit = collective_cost(self.cluster, coll, int(nbytes), ranks=int(n),
                                      channels=self.channels)
            self._memo[key] = hit
        return hit

    def time_ns(self, comm_op: int, nbytes: float, n: int) -> float:
        c = self.cost(comm_op, nbytes, n)
        if c is None:
            return 0.0
        t = c.time_us if self.bound is None else c.range_us[0 if self.bound == "low" else 1]
        return float(t) * 1e3

    def times_ns(self, comm_op: np.ndarray, nbytes: np.ndarray, n: np.ndarray) -> np.ndarray:
        return np.asarray([self.time_ns(c, b, k) for c, b, k in
                           zip(np.asarray(comm_op).tolist(), np.asarray(nbytes).tolist(),
                               np.asarray(n).tolist(), strict=True)], np.float64)


def measured_channels(trace: Trace) -> int | None:
    """The channel count NCCL ran with, as the trace measured it: the median over devices of
    the NCCL kernels' median launch grid (``meta["devices"][rank][device]["nccl_blocks"]``;
    NCCL launches one CTA per channel, REFERENCES.md C13). None when the trace has no grid."""
    blocks = [int(d["nccl_blocks"]) for r in (trace.meta.get("devices") or {}).values()
              if isinstance(r, dict) for d in r.values()
              if isinstance(d, dict) and d.get("nccl_blocks")]
    return int(round(float(np.median(blocks)))) if blocks else None


def channels_text(measured: int | None, used: int) -> str:
    """How the channel count a priced collective used was known."""
    if measured:
        return (f"{used} channels (measured: the trace's NCCL kernels' median launch grid, "
                "in place of the model's table)")
    return f"{used} channels (the NCCL model's table: assumed; the trace records no kernel grid)"


def forced_choice(trace: Trace, ar_ops: np.ndarray, pricer: NcclPricer, n: int,
                  sizes: np.ndarray) -> tuple[tuple[str, str] | None, str]:
    """The all-reduce algorithm/protocol new sizes are priced with, and why."""
    names = trace.names()[ar_ops] if len(ar_ops) else np.zeros(0, object)
    kc = kernel_choice(names)
    if kc is None:
        return None, "NCCL's tuner choice per size (the kernel names do not say which ran)"
    big = float(np.max(sizes)) if len(sizes) else 0.0
    tuned = pricer.cost(CommOp.ALL_REDUCE, big, n) if big >= 1 else None
    if tuned is not None and (tuned.algorithm, tuned.protocol) != kc:
        return kc, (f"{kc[0]}/{kc[1]} at every size, as the trace's kernels ran (the tuner "
                    f"would pick {tuned.algorithm}/{tuned.protocol} at "
                    f"{big / 1e6:.3g} MB: the job forced it, e.g. NCCL_PROTO)")
    return None, f"NCCL's tuner choice per size ({kc[0]}/{kc[1]} at the measured sizes)"


def anchor(meas_ns: np.ndarray, model_ns: np.ndarray, last: np.ndarray,
           partial: np.ndarray) -> dict[str, Any]:
    """``kappa`` (measured / model transfer) from fully traced last arrivers, else 1."""
    ok = last & ~partial & (model_ns > 0) & (meas_ns > 0)
    if ok.sum() >= 1:
        k = float(np.median(meas_ns[ok] / model_ns[ok]))
        return {"kappa": k, "source": "fitted", "points": int(ok.sum())}
    return {"kappa": 1.0, "source": "model", "points": 0}


def peer_text(n_partial: int, meas_ns: np.ndarray, model_ns: np.ndarray) -> str:
    return (f"{n_partial} measured collective(s) have untraced members: their time (median "
            f"{np.median(meas_ns) / 1e3:.0f} us) includes waiting for those ranks and cannot be "
            f"split, so the NCCL model prices the transfer (median {np.median(model_ns) / 1e3:.0f} "
            "us at the measured sizes) and the rest is kept as waiting for the untraced ranks; "
            "trace every rank to fit the transfer")


def network_delta(trace: Trace, graph, tab: dict, cal: dict, ranks_per_node: int | None,
                  new_intra: float | None, new_inter: float | None,
                  meas_intra: float | None, meas_inter: float | None,
                  new_intra_eff: float | None = None, new_inter_eff: float | None = None
                  ) -> tuple[np.ndarray, dict, list[str]] | None:
    """Per row of ``tab``: the change of its transfer time (ns) when the links' nominal
    rates become ``new_intra`` / ``new_inter`` GB/s (None: unchanged), priced by the NCCL
    model on the trace's cluster at its nominal rates (``meas_*`` stated, else assumed from
    the GPU name; the new links at ``new_*_eff`` of their nominal rate where stated, e.g. by
    a calibration measured on the cluster) and scaled by ``kappa`` (fitted on fully traced last arrivers, else 1).
    Also the figures to print and the ``assumed:`` lines. None for a trace the model cannot
    place (no device properties) or collectives that change level."""
    import dataclasses

    from .base import by_op, ranks_per_node_of

    if (tab["level"] != tab["old_level"]).any():
        return None
    world = int(max(np.max(tab["n"]), trace.meta.get("world_size") or 0, 2))
    try:
        old_c, src = trace_cluster(trace, ranks_per_node_of(trace, ranks_per_node), world,
                                   meas_intra)
    except PolicyError:
        return None
    if meas_inter:
        old_c = dataclasses.replace(old_c, nic_gbit=float(meas_inter) * 8.0 * old_c.gpus_per_node
                                    / max(old_c.nics_per_node, 1))
    new_c = dataclasses.replace(
        old_c, intra_gbps=float(new_intra) if new_intra else old_c.intra_gbps,
        nic_gbit=(float(new_inter) * 8.0 * old_c.gpus_per_node / max(old_c.nics_per_node, 1))
        if new_inter else old_c.nic_gbit,
        intra_eff=float(new_intra_eff) if new_intra_eff else old_c.intra_eff,
        net_eff=float(new_inter_eff) if new_inter_eff else old_c.net_eff)
    ar = tab["comm_op"] == CommOp.ALL_REDUCE
    chan = measured_channels(trace)
    po = NcclPricer(old_c, channels=chan)
    forced, why = forced_choice(trace, tab["op"][ar], po, int(np.median(tab["n"][ar])) if ar.any()
                                else 2, tab["bytes"][ar])
    po.forced = forced
    pn = NcclPricer(new_c, forced=forced, channels=chan)
    sized = tab["bytes"] > 0
    m_old = np.where(sized, po.times_ns(tab["comm_op"], tab["bytes"], tab["n"]), 0.0)
    m_new = np.where(sized, pn.times_ns(tab["comm_op"], tab["bytes"], tab["n"]), 0.0)
    meas = by_op(graph, "dur_ns")[tab["op"]].astype(np.float64)
    info: dict[str, Any] = {"cluster": src, "choice": why, "levels": {}}
    lines = []
    delta = np.zeros(len(tab["op"]))
    for lv in np.unique(tab["old_level"][sized]).tolist():
        rows = sized & (tab["old_level"] == lv)
        fam = np.asarray([_COLL.get(CommOp(int(c)), "") for c in tab["comm_op"]])
        kap = {}
        for f in np.unique(fam[rows]).tolist():  # one anchor per collective kind
            fr = rows & (fam == f)
            kap[f] = anchor(meas[fr], m_old[fr], tab["last"][fr], tab["partial"][fr])
            delta[fr] = kap[f]["kappa"] * (m_new[fr] - m_old[fr])
        name = "intra-node" if lv == 0 else "inter-node"
        pick = rows & ar if (rows & ar).any() else rows  # the largest all-reduce: bandwidth
        pick = pick & tab["last"] if (pick & tab["last"]).any() else pick
        k = int(np.flatnonzero(pick)[np.argmax(tab["bytes"][pick])])
        a = kap[fam[k]]
        c_old = po.cost(tab["comm_op"][k], tab["bytes"][k], int(tab["n"][k]))
        c_new = pn.cost(tab["comm_op"][k], tab["bytes"][k], int(tab["n"][k]))
        nom_old = old_c.intra_gbps if lv == 0 else old_c.nic_gbps * old_c.nics_per_node \
            / old_c.gpus_per_node
        nom_new = new_c.intra_gbps if lv == 0 else new_c.nic_gbps * new_c.nics_per_node \
            / new_c.gpus_per_node
        fit = cal.get(lv, {})
        lvl = {"fitted_busbw_gbps": fit.get("busbw_gbps"), "fitted_alpha_ns": fit.get("alpha_ns"),
               "fitted_points": fit.get("points"), "fitted_lower_bound": bool(fit.get("partial")),
               "nominal_gbps": nom_old, "nominal_source": src["nominal_source"] if lv == 0
               else ("stated" if meas_inter else "assumed: one 200 Gb/s NIC per GPU"),
               "assumed_gbps": nom_new, "model_busbw_gbps": c_old.busbw_gbps,
               "model_busbw_new_gbps": c_new.busbw_gbps, "at_bytes": int(tab["bytes"][k]),
               "algorithm": c_old.algorithm, "protocol": c_old.protocol,
               "channels": c_old.channels,
               "channels_source": "measured" if chan else "assumed",
               "kappa": a["kappa"], "kappa_source": a["source"],
               "kappa_by_collective": {f: round(v["kappa"], 4) for f, v in kap.items()}}
        info["levels"][name] = lvl
        info.setdefault("fitted_levels", []).append(a["source"] == "fitted")
        fb = fit.get("busbw_gbps")
        bus = tab["bytes"][k] * tab["factor"][k] / max(meas[k], 1.0)  # bytes/ns = GB/s
        lvl["measured_busbw_gbps"] = float(bus)
        lines.append(
            f"{name} link: measured {bus:.3g} GB/s of bus bandwidth at "
            f"{tab['bytes'][k] / 1e6:.3g} MB ({fam[k]}, "
            + ("a lower bound: untraced members" if tab["partial"][k] else "last arriver")
            + f"; alpha-beta fit over {fit.get('points', 0)} collective(s): "
            f"{fb:.3g} GB/s{', latency ' + format(fit['alpha_ns'] / 1e3, '.3g') + ' us' if fit.get('alpha_ns') else ', no latency separated'}); "
            f"{nom_old:g} GB/s nominal ({lvl['nominal_source']}) -> "
            f"{nom_new:g} GB/s: the NCCL model ({c_old.algorithm}/{c_old.protocol}, "
            f"{channels_text(chan, c_old.channels)}) gives {c_old.busbw_gbps:.3g} -> {c_new.busbw_gbps:.3g} "
            f"GB/s of bus bandwidth at {tab['bytes'][k] / 1e6:.3g} MB ({fam[k]}); the change "
            f"is scaled by {a['kappa']:.2f} ("
            + (f"measured / modeled on {a['points']} fully traced last arrivers: fitted)"
               if a["source"] == "fitted" else "the model alone: no fully traced collective)")
            if fb else f"{name} link: no sized collectives fitted")
    return delta, info, lines
