"""A calibration measured on a described cluster (``retime calibrate --cluster FILE``), and
how it refines that cluster (``retime replay/sweep/cost collective --cluster F
--calibration C``).

``retime calibrate --cluster F`` checks the run fits the cluster before measuring
(:func:`check_calibrate_cluster`) and records in the calibration file which cluster it
measured and the figures its all-reduce size sweep gives (:func:`cluster_record`): the
level (intra-node when every rank is on one host, inter-node otherwise), an alpha-beta fit
(:func:`link_fit.fit_alpha_beta`: latency and bus bandwidth) and the efficiency against the
cluster's nominal rate for that level (:func:`nominal_gbps`).

Given back with the same cluster, a calibration's measured efficiency replaces the model's
assumed one for the level it measured (:func:`refine`); a calibration of another cluster is
refused (:func:`check_same_cluster`). Only an NCCL calibration refines: gloo measures the
host's TCP path (loopback on one host), not the cluster's GPU links, so its figures are
recorded and printed but the model's efficiency is kept.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from retime.collectors.errors import ConfigError

from .link_fit import fit_alpha_beta

__all__ = ["LEVEL_NAMES", "check_calibrate_cluster", "sweep_fit", "nominal_gbps",
           "cluster_record", "check_same_cluster", "Refinement", "refine", "refine_keys"]

LEVEL_NAMES = {0: "intra-node", 1: "inter-node"}
#: the what-if key that carries a measured efficiency, per level
_EFF_KEY = {0: "network.intra_bus_efficiency", 1: "network.inter_bus_efficiency"}
_GBPS_KEY = {0: "network.intra_node_gbps", 1: "network.inter_node_gbps"}


def check_calibrate_cluster(cluster, *, local_ranks: int, world: int, backend: str,
                            cuda_devices: int) -> None:
    """Refuse (ConfigError, one line) a calibration run that does not fit ``cluster``:
    more ranks on this host than it has GPUs per node, more ranks or hosts than it has GPUs
    or nodes, or NCCL on a machine with fewer CUDA devices than local ranks."""
    where = cluster.source or f"cluster {cluster.name!r}"
    if local_ranks > cluster.gpus_per_node:
        raise ConfigError(f"--cluster {where}: {local_ranks} ranks on this host but the "
                          f"cluster has {cluster.gpus_per_node} GPUs per node; use "
                          f"--nproc {cluster.gpus_per_node} or fewer")
    if world > cluster.world_size:
        raise ConfigError(f"--cluster {where}: {world} ranks but the cluster has "
                          f"{cluster.world_size} GPUs ({cluster.nodes} node(s) x "
                          f"{cluster.gpus_per_node}); raise nodes in the file or start fewer")
    hosts = -(-world // max(local_ranks, 1))
    if hosts > cluster.nodes:
        raise ConfigError(f"--cluster {where}: {hosts} hosts of {local_ranks} rank(s) but the "
                          f"cluster has {cluster.nodes} node(s); raise nodes in the file")
    if backend == "nccl" and cuda_devices < local_ranks:
        raise ConfigError(f"--backend nccl: this host has {cuda_devices} CUDA GPU(s) for "
                          f"{local_ranks} local ranks, but {where} describes "
                          f"{cluster.gpus_per_node} x {cluster.gpu} per node; run it on a "
                          "node of the cluster, or use --backend gloo (host TCP, recorded "
                          "as such)")


def _sig(x: float, digits: int = 5) -> float:
    """``x`` to ``digits`` significant figures (a gloo efficiency is ~1e-3, NVLink's ~0.8)."""
    return float(f"{x:.{digits}g}")


def _points(cal: dict) -> tuple[np.ndarray, np.ndarray]:
    """Bus bytes and time (ns: per size, the median over repetitions of the slowest rank)
    of the calibration's all-reduce sweep."""
    world = int(cal["world_size"])
    f = 2.0 * (world - 1) / world
    rows = cal["collectives"]["all_reduce"]
    xs = np.asarray([r["bytes"] * f for r in rows], np.float64)
    ys = np.asarray([np.median(np.max(np.asarray(r["ns_by_rank"], np.float64), axis=0))
                     for r in rows])
    return xs, ys


def sweep_fit(cal: dict) -> dict[str, Any]:
    """The alpha-beta fit of a calibration's all-reduce sweep: ``level`` (0 intra-node, 1
    inter-node), ``alpha_us`` (per all-reduce), ``busbw_gbps``, ``identifiable`` (and
    ``why`` when not), ``points``."""
    xs, ys = _points(cal)
    fit = fit_alpha_beta(xs, ys)
    level = 0 if int(cal.get("ranks_per_host", 0)) >= int(cal["world_size"]) else 1
    out = {"level": LEVEL_NAMES[level], "alpha_us": _sig(fit["alpha_ns"] / 1e3),
           "busbw_gbps": _sig(fit["busbw_gbps"]), "identifiable": fit["identifiable"],
           "points": len(xs)}
    if fit.get("why"):
        out["why"] = fit["why"]
    return out


def nominal_gbps(cluster, level: int, ranks_per_host: int) -> float:
    """The nominal rate (GB/s, per direction) a ring all-reduce of the level runs at on the
    cluster, the figure the efficiency is taken against (as the cost layer's NCCL model
    applies its efficiencies): intra-node, the GPU's intra-node rate; inter-node, the NICs
    of one host's ranks (``ranks_per_host x nics_per_node / gpus_per_node``, at least one)
    at ``nic_gbit / 8``."""
    if level == 0:
        return float(cluster.intra_gbps)
    nics = max(1.0, ranks_per_host * cluster.nics_per_node / cluster.gpus_per_node)
    return float(min(nics, max(cluster.nics_per_node, 1)) * cluster.nic_gbps)


def _model_eff(cluster, level: int):
    from retime.collectors.costs.nccl import efficiencies

    ip, npar = efficiencies(dataclasses.replace(cluster, intra_eff=None, net_eff=None))
    return ip if level == 0 else npar


def cluster_record(cluster, cal: dict, device: str | None = None) -> dict[str, Any]:
    """What ``retime calibrate --cluster`` writes under ``cluster`` in the calibration file:
    the cluster (name, source, GPU, shape), the level measured, what was measured (backend
    and device), the sweep's fit, the nominal rate and the efficiency against it, and
    whether that efficiency can refine the cluster (``refines``, ``why`` when not)."""
    fit = sweep_fit(cal)
    level = 0 if fit["level"] == "intra-node" else 1
    nom = nominal_gbps(cluster, level, int(cal["ranks_per_host"]))
    link = (f"{cluster.intra_fabric}/{cluster.intra_generation}" if level == 0 else
            f"{cluster.net_fabric} {cluster.nic_gbit:g} Gb/s NIC(s)")
    backend = cal["backend"]
    rec: dict[str, Any] = {
        "name": cluster.name, "source": cluster.source, "gpu": cluster.gpu,
        "gpus_per_node": cluster.gpus_per_node, "nodes": cluster.nodes,
        "level": fit["level"], "link": link, "nominal_gbps": round(nom, 4),
        "fit": fit, "efficiency": _sig(fit["busbw_gbps"] / nom) if nom > 0 else None,
        "model_efficiency": _model_eff(cluster, level).value}
    if backend == "nccl":
        rec["measured"] = (f"nccl all_reduce on {cal['world_size']} GPU rank(s)"
                           + (f" ({device})" if device else "") + f", {fit['level']}: "
                           f"the cluster's {link}")
        rec["refines"] = True
    else:
        path = "loopback TCP on one host" if level == 0 else "TCP between the hosts"
        rec["measured"] = (f"gloo all_reduce on {cal['world_size']} CPU rank(s) over {path}: "
                           f"not the cluster's {cluster.gpu} {link}")
        rec["refines"] = False
        rec["why"] = (f"gloo measured the host's {path}, not the cluster's {link}; "
                      "calibrate with --backend nccl on the cluster's GPUs to refine it")
    return rec


def check_same_cluster(cluster, cal: dict) -> None:
    """Refuse (ConfigError) a calibration measured on another cluster than ``cluster``."""
    rec = cal.get("cluster")
    if not isinstance(rec, dict):
        return
    path = cal.get("path", "the calibration file")
    where = cluster.source or f"cluster {cluster.name!r}"
    if rec.get("name") != cluster.name:
        raise ConfigError(f"--calibration {path} was measured on cluster {rec.get('name')!r} "
                          f"({rec.get('source')}), not on --cluster {where} "
                          f"({cluster.name!r}); pass the cluster it measured, or calibrate "
                          f"this one with `retime calibrate --cluster {where}`")
    if rec.get("gpu") != cluster.gpu or rec.get("gpus_per_node") != cluster.gpus_per_node:
        raise ConfigError(f"--calibration {path} was measured on cluster {cluster.name!r} with "
                          f"{rec.get('gpus_per_node')} x {rec.get('gpu')} per node, but "
                          f"--cluster {where} has {cluster.gpus_per_node} x {cluster.gpu}; "
                          "recalibrate on the cluster as the file describes it")


@dataclass(frozen=True)
class Refinement:
    """A calibration applied to a cluster: the refined cluster (its stated efficiency for
    the measured level), the what-if keys that carry it, and the lines to print."""

    cluster: Any
    keys: dict[str, float]
    lines: tuple[str, ...]
    level: str | None


def refine(cluster, cal: dict | None) -> Refinement:
    """``cluster`` refined by the calibration ``cal`` (checked with
    :func:`check_same_cluster` first): an NCCL calibration's measured efficiency replaces
    the model's for the level it measured (``intra_eff`` / ``net_eff``; the what-if key
    ``network.intra_bus_efficiency`` / ``inter_bus_efficiency``). Lines start with
    ``measured:`` (what now comes from the calibration) or ``assumed:`` (what stays the
    model's, and why). Without a calibration: the cluster unchanged, no lines."""
    if cal is None:
        return Refinement(cluster, {}, (), None)
    check_same_cluster(cluster, cal)
    path = cal.get("path", "the calibration file")
    rec = cal.get("cluster")
    if not isinstance(rec, dict):
        return Refinement(cluster, {}, (
            f"assumed: link efficiencies are the model's: {path} records no cluster "
            "(measured without --cluster); recalibrate with `retime calibrate --cluster "
            f"{cluster.source or 'FILE'}` to refine them",), None)
    level = 0 if rec["level"] == "intra-node" else 1
    name = LEVEL_NAMES[level]
    model = _model_eff(cluster, level)
    eff = rec.get("efficiency")
    lines = []
    keys: dict[str, float] = {}
    fit = rec["fit"]
    said = (f"{fit['busbw_gbps']:.4g} GB/s bus bandwidth and {fit['alpha_us']:.3g} us latency "
            f"over {fit['points']} sizes")
    if not rec.get("refines"):
        lines.append(f"assumed: {name} efficiency {model.value:g} ({model.source}: "
                     f"{model.ref}), the model's: {path} {rec.get('why', 'does not refine')}"
                     f" (it measured {said})")
    elif eff is None or not 0 < eff <= 1:
        where = cluster.source or f"cluster {cluster.name!r}"
        raise ConfigError(f"--calibration {path}: the {name} link measured {eff} of its nominal "
                          f"{rec.get('nominal_gbps')} GB/s ({said}); an efficiency above 1 "
                          f"means {where} understates the link: fix its rate")
    else:
        field = "intra_eff" if level == 0 else "net_eff"
        cluster = dataclasses.replace(cluster, **{field: float(eff)})
        keys[_EFF_KEY[level]] = float(eff)
        lines.append(f"measured: {name} efficiency {eff:.3g} of the nominal "
                     f"{rec['nominal_gbps']:g} GB/s ({said}, {path}), instead of the "
                     f"model's assumed {model.value:g} ({model.ref})")
    other = 1 - level
    if cluster.nodes > 1 or other == 0:
        m = _model_eff(cluster, other)
        lines.append(f"assumed: {LEVEL_NAMES[other]} efficiency {m.value:g} ({m.source}: "
                     f"{m.ref}): {path} measured only the {name} level")
    return Refinement(cluster, keys, tuple(lines), name)


def refine_keys(ref: Refinement, cluster_keys: dict[str, Any],
                user_keys: set[str]) -> tuple[dict[str, float], list[str]]:
    """The refinement's what-if keys that apply next to a cluster's keys: only for a level
    whose rate the cluster sets, and not where the user set the same key or
    ``network.bus_efficiency`` (their value wins). Returns the keys and extra lines."""
    out, lines = {}, []
    for k, v in ref.keys.items():
        level = 0 if k == _EFF_KEY[0] else 1
        if _GBPS_KEY[level] not in cluster_keys:
            continue
        if k in user_keys or "network.bus_efficiency" in user_keys:
            lines.append(f"assumed: {k.split('.', 1)[1]} from your --scenario / --set, not "
                         f"the calibration's measured {v:.3g}")
            if k not in user_keys:  # network.bus_efficiency given: it sets every level
                continue
        out[k] = v  # the user's layer wins for the same key (listed as overridden)
    return out, lines
