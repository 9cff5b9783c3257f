"""The cluster description: one machine description for the cost layer.

A cluster is a GPU profile (``collectors/synth/hardware/*.toml``: peaks, HBM, architecture)
plus the topology around it: GPUs per node, the intra-node fabric (NVSwitch / PCIe / xGMI,
its generation and nominal GB/s per GPU per direction, the NVLink domain size, NVLink SHARP),
the network (fabric kind, NICs per node, nominal Gbit/s per NIC, SHARP in the switches) and
the node count. Rates are the nominal figures a user knows; the models apply efficiencies.

Built-in presets live in ``collectors/costs/clusters/*.toml``; a user writes one out with
``retime cost cluster --preset NAME``, edits it and passes ``--cluster FILE``. Flags override
single fields (:meth:`Cluster.with_overrides`), validated as a whole afterwards.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import tomllib

from ..errors import ConfigError
from ..fsutil import read_toml
from ..synth.hardware import HardwareConfig
from .gpus import GpuSpec, gpu_spec, spec_of

__all__ = ["Cluster", "preset_names", "load_preset", "read_cluster", "resolve_cluster",
           "format_cluster", "cluster_hardware", "check_cluster_world", "cluster_from_hardware",
           "INTRA_FABRICS", "NET_FABRICS", "GENERATIONS"]

_DIR = Path(__file__).with_name("clusters")

INTRA_FABRICS = ("nvswitch", "pcie", "xgmi")
NET_FABRICS = ("infiniband", "roce", "efa", "slingshot")
#: link generation -> (fabric it belongs to, nominal GB/s per GPU per direction)
GENERATIONS = {
    "nvlink2": ("nvswitch", 150.0),
    "nvlink3": ("nvswitch", 300.0), "nvlink4": ("nvswitch", 450.0),
    "nvlink5": ("nvswitch", 900.0), "pcie4": ("pcie", 32.0), "pcie5": ("pcie", 64.0),
    "xgmi3": ("xgmi", 448.0), "xgmi4": ("xgmi", 537.6),
}
#: the intra-node generation a GPU architecture ships with, per fabric (for --intra)
_DEFAULT_GEN = {
    ("nvswitch", "ampere"): "nvlink3", ("nvswitch", "hopper"): "nvlink4",
    ("nvswitch", "blackwell"): "nvlink5", ("nvswitch", "volta"): "nvlink3",
    ("pcie", "volta"): "pcie4", ("pcie", "ampere"): "pcie4", ("pcie", "hopper"): "pcie5",
    ("pcie", "blackwell"): "pcie5", ("pcie", "cdna3"): "pcie5", ("xgmi", "cdna3"): "xgmi3",
    ("pcie", "cdna4"): "pcie5", ("xgmi", "cdna4"): "xgmi4",
}


@dataclass(frozen=True)
class Cluster:
    """A described cluster (see the module docstring; units in the field names)."""

    name: str
    gpu: str
    gpus_per_node: int
    nodes: int
    intra_fabric: str
    intra_generation: str
    intra_gbps: float
    nvlink_domain: int
    nvls: bool
    net_fabric: str
    nics_per_node: int
    nic_gbit: float
    sharp: bool
    #: stated efficiencies / per-hop latencies replacing the model's (a calibration, a
    #: what-if, a hardware profile that says otherwise); None = the model's cited values
    intra_eff: float | None = None
    net_eff: float | None = None
    intra_hop_us: float | None = None
    net_hop_us: float | None = None
    source: str = dataclasses.field(default="", compare=False)
    #: GPU facts when the GPU is not a named profile (a cluster made from a HardwareConfig)
    gpu_facts: GpuSpec | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        where = f"cluster {self.name!r}" + (f" ({self.source})" if self.source else "")
        if self.gpus_per_node < 1 or self.nodes < 1:
            raise ConfigError(f"{where}: gpus_per_node={self.gpus_per_node} and "
                              f"nodes={self.nodes} must be >= 1")
        if self.intra_fabric not in INTRA_FABRICS:
            raise ConfigError(f"{where}: intra-node fabric {self.intra_fabric!r} is not one of "
                              f"{', '.join(INTRA_FABRICS)}")
        gen = GENERATIONS.get(self.intra_generation)
        if gen is None:
            raise ConfigError(f"{where}: intra-node generation {self.intra_generation!r} is "
                              f"not one of {', '.join(GENERATIONS)}")
        if gen[0] != self.intra_fabric:
            raise ConfigError(f"{where}: generation {self.intra_generation!r} is a {gen[0]} "
                              f"link, not {self.intra_fabric}; fix [intra_node] generation")
        if not self.intra_gbps > 0:
            raise ConfigError(f"{where}: intra-node gbps={self.intra_gbps} must be > 0")
        if self.net_fabric not in NET_FABRICS:
            raise ConfigError(f"{where}: network fabric {self.net_fabric!r} is not one of "
                              f"{', '.join(NET_FABRICS)}")
        if self.nics_per_node < 0 or (self.nodes > 1 and self.nics_per_node == 0):
            raise ConfigError(f"{where}: nics_per_node={self.nics_per_node}; a cluster of "
                              f"{self.nodes} nodes needs at least one NIC per node")
        if not self.nic_gbit > 0:
            raise ConfigError(f"{where}: nic_gbit={self.nic_gbit} must be > 0")
        if self.nvlink_domain < self.gpus_per_node or self.nvlink_domain % self.gpus_per_node:
            raise ConfigError(f"{where}: nvlink_domain={self.nvlink_domain} must be a multiple "
                              f"of gpus_per_node={self.gpus_per_node} (the GPUs one intra-node "
                              "fabric reaches without the network)")
        if self.world_size > self.nvlink_domain and self.world_size % self.nvlink_domain:
            raise ConfigError(f"{where}: nvlink_domain={self.nvlink_domain} does not divide "
                              f"the cluster's {self.world_size} GPUs ({self.nodes} nodes x "
                              f"{self.gpus_per_node}); every domain must be whole: choose "
                              "nodes so the GPUs are a multiple of the domain, or state the "
                              "GPUs the job uses per rack (e.g. --nvlink-domain 64 for 16 of "
                              "an NVL72 rack's 18 trays)")
        if self.intra_fabric != "nvswitch" and self.nvlink_domain != self.gpus_per_node:
            raise ConfigError(f"{where}: nvlink_domain={self.nvlink_domain} spans nodes, which "
                              f"only an NVSwitch fabric does ({self.intra_fabric} here); set it "
                              f"to gpus_per_node={self.gpus_per_node}")
        spec = self.spec
        nvidia = not spec.arch.startswith("cdna")
        if self.intra_fabric in ("nvswitch",) and not nvidia:
            raise ConfigError(f"{where}: {self.gpu} ({spec.arch}) has no NVLink; use "
                              "--intra xgmi or pcie")
        if self.intra_fabric == "xgmi" and nvidia:
            raise ConfigError(f"{where}: xGMI is AMD's fabric and {self.gpu} is an NVIDIA GPU; "
                              "use --intra nvswitch or pcie")
        if self.nvls and not (self.intra_fabric == "nvswitch" and spec.nvls_capable
                              and self.intra_generation in ("nvlink4", "nvlink5")):
            raise ConfigError(f"{where}: NVLS (NVLink SHARP) needs Hopper-or-newer GPUs on a "
                              f"third-generation NVSwitch or newer; {self.gpu} ({spec.arch}) on "
                              f"{self.intra_fabric}/{self.intra_generation} has none; set "
                              "nvls = false")
        for f in ("intra_eff", "net_eff"):
            v = getattr(self, f)
            if v is not None and not 0 < v <= 1:
                raise ConfigError(f"{where}: {f.replace('_', ' ')}iciency={v} must be in (0, 1]")
        for f in ("intra_hop_us", "net_hop_us"):
            v = getattr(self, f)
            if v is not None and v < 0:
                raise ConfigError(f"{where}: {f}={v} must be >= 0")
        if self.sharp and self.net_fabric != "infiniband":
            raise ConfigError(f"{where}: SHARP in-network reduction runs on InfiniBand "
                              f"switches, not {self.net_fabric}; set sharp = false")

    @property
    def spec(self) -> GpuSpec:
        return self.gpu_facts if self.gpu_facts is not None else gpu_spec(self.gpu)

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def nic_gbps(self) -> float:
        """Nominal GB/s per NIC per direction (1 GB = 1e9 bytes)."""
        return self.nic_gbit / 8.0

    def with_overrides(self, **kw: Any) -> Cluster:
        """A copy with the given fields replaced (``None`` values ignored) and validated.
        ``intra_fabric`` alone picks that fabric's generation and rate for this GPU."""
        kw = {k: v for k, v in kw.items() if v is not None}
        unknown = set(kw) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown cluster field(s): {', '.join(sorted(unknown))}")
        if "gpus_per_node" in kw and kw["gpus_per_node"] > self.gpus_per_node \
                and self.source.startswith("preset:"):
            raise ConfigError(f"--gpus-per-node {kw['gpus_per_node']}: preset {self.name} has "
                              f"only {self.gpus_per_node} GPUs per node; use fewer, or describe "
                              "another machine with --cluster FILE")
        gpu = kw.get("gpu", self.gpu)
        fabric = kw.get("intra_fabric", self.intra_fabric)
        if "gpu" in kw and "intra_fabric" not in kw:
            gpu_spec(gpu)  # unknown GPU: a clear error first
        if ("intra_fabric" in kw or "gpu" in kw) and "intra_generation" not in kw:
            arch = gpu_spec(gpu).arch
            gen = _DEFAULT_GEN.get((fabric, arch))
            if gen is None:
                raise ConfigError(f"--intra {fabric}: no {fabric} fabric for {gpu} ({arch}); "
                                  f"choose one of {', '.join(f for f, a in _DEFAULT_GEN if a == arch)}")
            if gen != self.intra_generation or fabric != self.intra_fabric:
                kw["intra_generation"] = gen
                kw.setdefault("intra_gbps", GENERATIONS[gen][1])
        if kw.get("intra_fabric", self.intra_fabric) != "nvswitch":
            kw.setdefault("nvls", False)
        elif "gpu" in kw and not gpu_spec(gpu).nvls_capable:
            kw.setdefault("nvls", False)
        gpn = kw.get("gpus_per_node", self.gpus_per_node)
        if fabric != "nvswitch" or self.nvlink_domain == self.gpus_per_node:
            kw.setdefault("nvlink_domain", gpn)
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "gpu": self.gpu, "gpus_per_node": self.gpus_per_node,
                "nodes": self.nodes,
                "intra_node": {"fabric": self.intra_fabric, "generation": self.intra_generation,
                               "gbps": self.intra_gbps, "nvlink_domain": self.nvlink_domain,
                               "nvls": self.nvls},
                "network": {"fabric": self.net_fabric, "nics_per_node": self.nics_per_node,
                            "nic_gbit": self.nic_gbit, "sharp": self.sharp}}


def _parse(data: dict[str, Any], where: str) -> Cluster:
    try:
        intra = data.get("intra_node", {})
        net = data.get("network", {})
        for key in ("gpu", "gpus_per_node"):
            if key not in data:
                raise ConfigError(f"{where}: missing key {key!r} (write a complete file with "
                                  "`retime cost cluster --preset dgx-h100`)")
        for t, key in (("intra_node", "fabric"), ("intra_node", "gbps"),
                       ("network", "nic_gbit")):
            if key not in data.get(t, {}):
                raise ConfigError(f"{where}: missing [{t}] {key}")
        gpn = int(data["gpus_per_node"])
        fabric = str(intra["fabric"]).lower()
        gen = str(intra.get("generation", "")).lower()
        if not gen:
            gen = _DEFAULT_GEN.get((fabric, gpu_spec(str(data["gpu"])).arch), "")
        return Cluster(
            name=str(data.get("name", Path(where).stem)), gpu=str(data["gpu"]),
            gpus_per_node=gpn, nodes=int(data.get("nodes", 1)),
            intra_fabric=fabric, intra_generation=gen, intra_gbps=float(intra["gbps"]),
            nvlink_domain=int(intra.get("nvlink_domain", gpn)),
            nvls=bool(intra.get("nvls", False)),
            intra_eff=_opt(intra, "efficiency"), net_eff=_opt(net, "efficiency"),
            intra_hop_us=_opt(intra, "hop_latency_us"), net_hop_us=_opt(net, "hop_latency_us"),
            net_fabric=str(net.get("fabric", "infiniband")).lower(),
            nics_per_node=int(net.get("nics_per_node", gpn)),
            nic_gbit=float(net["nic_gbit"]), sharp=bool(net.get("sharp", False)),
            source=where)
    except (TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"{where}: bad cluster value ({exc})") from exc


def _opt(t: dict[str, Any], key: str) -> float | None:
    return None if t.get(key) is None else float(t[key])


@cache
def _presets() -> dict[str, Cluster]:
    out = {}
    for f in sorted(_DIR.glob("*.toml")):
        with open(f, "rb") as fh:
            c = _parse(tomllib.load(fh), "preset:" + f.stem)
        out[c.name] = c
    return out


def preset_names() -> list[str]:
    """Names of the built-in cluster presets."""
    return sorted(_presets())


def load_preset(name: str) -> Cluster:
    """A built-in preset (``dgx-a100``, ``dgx-h100``, ``hgx-h200``, ``dgx-b200``,
    ``dgx-b300``, ``gb200-nvl72``, ``gb200-nvl36``, ``gb300-nvl72``, ``mi300x-8x``,
    ``mi325x-8x``, ``mi355x-8x``, ``pcie-4gpu``, ``pcie-8gpu``)."""
    c = _presets().get(name.lower())
    if c is None:
        raise ConfigError(f"unknown cluster preset {name!r}; presets: "
                          f"{', '.join(preset_names())}")
    return c


def read_cluster(path: str | Path) -> Cluster:
    """Read a cluster TOML (as written by ``retime cost cluster``)."""
    data = read_toml(path, "cluster file", "fix the file or write a fresh one with "
                     "`retime cost cluster --preset NAME`")
    return _parse(data, str(path))


def resolve_cluster(preset: str | None = None, path: str | Path | None = None,
                    default: str = "dgx-h100") -> Cluster:
    """The base cluster of a command: ``--cluster FILE``, else ``--preset``, else ``default``."""
    if path is not None and preset is not None:
        raise ConfigError("--cluster and --preset both given; pass one (flags then override "
                          "single fields)")
    if path is not None:
        return read_cluster(path)
    return load_preset(preset or default)


def cluster_hardware(c: Cluster) -> HardwareConfig:
    """The synthesizer's hardware profile of a cluster: the one mapping from a cluster
    description to what ``retime synth`` and the replay what-ifs price with.

    * compute, HBM, efficiencies, link latencies and bus efficiencies: the GPU profile
      ``c.gpu`` (``collectors/synth/hardware/*.toml``), unchanged;
    * ``gpus_per_node``: the GPUs one intra-node fabric reaches, ``nvlink_domain`` (equal to
      ``gpus_per_node`` except on a rack-scale NVLink domain such as GB200 NVL72, where the
      72 GPUs of 18 trays share NVLink: a collective inside the domain never touches a NIC);
    * intra-node GB/s per GPU per direction: ``intra_gbps``;
    * inter-node GB/s per GPU per direction: ``nics_per_node * nic_gbit / 8 / gpus_per_node``
      (each GPU's share of its node's NICs), with ``nics`` the NICs of one domain and
      ``nic_gbps = nic_gbit / 8``. A cluster without NICs (one node) keeps the profile's
      network, which nothing inside the node uses;
    * a stated efficiency or per-hop latency (the file's ``efficiency`` /
      ``hop_latency_us``, or a calibration's measured efficiency,
      :func:`retime.replay.policies.cluster_cal.refine`) becomes the link's
      ``bus_efficiency`` / ``latency_us``, which :func:`cluster_from_hardware` reads back as
      stated: the synthesizer prices with what the cluster states, as ``retime cost`` does.
    """
    base = c.spec.hw
    dom = c.nvlink_domain
    intra = dataclasses.replace(base.intra, gbps=float(c.intra_gbps),
                                link=f"{c.intra_generation} / {c.intra_fabric}",
                                **_stated(c.intra_eff, c.intra_hop_us))
    kw: dict[str, Any] = {"gpus_per_node": dom, "intra": intra, "nvlink_domain": dom}
    if c.nics_per_node > 0:
        kw["inter"] = dataclasses.replace(
            base.inter, gbps=c.nics_per_node * c.nic_gbps / c.gpus_per_node,
            link=f"{c.net_fabric} {c.nics_per_node} x {c.nic_gbit:g} Gb/s per node",
            **_stated(c.net_eff, c.net_hop_us))
        kw["nics"] = c.nics_per_node * (dom // c.gpus_per_node)
        kw["nic_gbps"] = c.nic_gbps
    else:
        kw["nics"] = max(1, round(base.nics * dom / base.gpus_per_node))
    return dataclasses.replace(base, source=c.source or f"cluster:{c.name}", **kw)


def _stated(eff: float | None, hop_us: float | None) -> dict[str, float]:
    """A link's fields a cluster states (None: the GPU profile's, the cited values)."""
    out = {} if eff is None else {"bus_efficiency": float(eff)}
    if hop_us is not None:
        out["latency_us"] = float(hop_us)
    return out


def check_cluster_world(c: Cluster, world: int, layout: str) -> None:
    """Raise ConfigError unless the cluster has exactly ``world`` GPUs (``layout`` names
    where ``world`` came from, e.g. ``"tp*pp*dp*cp = 2*2*4*1"``)."""
    if c.world_size == world:
        return
    where = c.source or f"cluster {c.name!r}"
    fix = (f"set nodes = {world // c.gpus_per_node} in the file" if world % c.gpus_per_node == 0
           else f"use a layout whose GPUs are a multiple of gpus_per_node={c.gpus_per_node}")
    raise ConfigError(f"{where}: {c.nodes} node(s) x {c.gpus_per_node} GPUs per node = "
                      f"{c.world_size} GPUs, but {layout} = {world}; {fix}")


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return repr(v)


def format_cluster(c: Cluster) -> str:
    """The cluster as a documented TOML file a user can edit and pass back with --cluster."""
    s = c.spec
    lines = [
        "# retime cluster description (retime cost cluster; README: \"Describing a cluster\").",
        "# Rates are nominal (datasheet) per GPU or per NIC and per direction; retime's cost",
        "# models apply the efficiencies. Pass it back with --cluster FILE; flags override fields.",
        f"name = {_fmt(c.name)}",
        f"gpu = {_fmt(c.gpu)}                    # GPU profile ({s.hw.gpu}, {s.arch}): "
        "collectors/synth/hardware/*.toml",
        f"gpus_per_node = {c.gpus_per_node}",
        f"nodes = {c.nodes}",
        "",
        "[intra_node]",
        f"fabric = {_fmt(c.intra_fabric)}             # {' | '.join(INTRA_FABRICS)}",
        f"generation = {_fmt(c.intra_generation)}          # {' | '.join(GENERATIONS)}",
        f"gbps = {c.intra_gbps!r}                   # GB/s per GPU per direction (nominal)",
        f"nvlink_domain = {c.nvlink_domain}               # GPUs one intra-node fabric reaches "
        "(72 on a GB200 NVL72 rack)",
        f"nvls = {_fmt(c.nvls)}                   # NVLink SHARP: NVSwitch3+ with Hopper or newer",
        *([f"efficiency = {c.intra_eff!r}          # stated; replaces the model's"]
          if c.intra_eff is not None else []),
        *([f"hop_latency_us = {c.intra_hop_us!r}     # stated; replaces NCCL's per-hop table"]
          if c.intra_hop_us is not None else []),
        "",
        "[network]",
        f"fabric = {_fmt(c.net_fabric)}           # {' | '.join(NET_FABRICS)}",
        f"nics_per_node = {c.nics_per_node}",
        f"nic_gbit = {c.nic_gbit!r}              # Gbit/s per NIC per direction (line rate)",
        f"sharp = {_fmt(c.sharp)}                  # SHARP in-network reduction (CollNet), "
        "InfiniBand only",
        *([f"efficiency = {c.net_eff!r}          # stated; replaces the model's"]
          if c.net_eff is not None else []),
        *([f"hop_latency_us = {c.net_hop_us!r}     # stated; replaces NCCL's per-hop table"]
          if c.net_hop_us is not None else []),
    ]
    return "\n".join(lines) + "\n"


def cluster_from_hardware(hw, nodes: int = 1) -> Cluster:
    """The cluster a synthesizer hardware profile describes (one machine description: the
    profile's nominal intra-node rate, NICs and NIC rate; fabric kinds read from its link
    names), so the synthesizer prices collectives with the same model as ``retime cost``."""
    spec = spec_of(hw)
    name = hw.intra.link.lower()
    fabric = "pcie" if "pcie" in name else "xgmi" if ("infinity" in name or "xgmi" in name) \
        else "nvswitch"
    gen = _DEFAULT_GEN.get((fabric, spec.arch))
    if gen is None:  # e.g. an AMD GPU described with an NVLink-like link name
        fabric = "xgmi" if spec.arch == "cdna3" else "nvswitch"
        gen = _DEFAULT_GEN[(fabric, spec.arch if (fabric, spec.arch) in _DEFAULT_GEN
                            else "hopper")]
    net = "roce" if "roce" in hw.inter.link.lower() else "infiniband"
    from .nccl_params import LINK_EFF, NET_EFF

    nics = max(1, int(hw.nics))
    ref = _reference_profile(hw)
    # a profile's bus efficiency that differs from the cost layer's cited value for that
    # link (a user's file, a what-if's network.bus_efficiency) is a statement: it wins;
    # per-step latencies are statements when they differ from the named profile's
    intra_eff = hw.intra.bus_efficiency \
        if abs(hw.intra.bus_efficiency - LINK_EFF[gen].value) > 1e-9 else None
    net_eff = hw.inter.bus_efficiency \
        if abs(hw.inter.bus_efficiency - NET_EFF[net].value) > 1e-9 else None
    intra_hop = hw.intra.latency_us \
        if ref is None or hw.intra.latency_us != ref.intra.latency_us else None
    net_hop = hw.inter.latency_us \
        if ref is None or hw.inter.latency_us != ref.inter.latency_us else None
    return Cluster(name=f"hardware:{hw.name}", gpu=hw.name, gpus_per_node=hw.gpus_per_node,
                   nodes=max(1, nodes), intra_fabric=fabric, intra_generation=gen,
                   intra_gbps=float(hw.intra.gbps), nvlink_domain=hw.domain,
                   nvls=fabric == "nvswitch" and spec.nvls_capable
                   and gen in ("nvlink4", "nvlink5"),
                   net_fabric=net, nics_per_node=nics,
                   # the per-GPU network rate (what network.inter_node_gbps sets) over the NICs
                   nic_gbit=float(hw.inter.gbps) * hw.gpus_per_node / nics * 8.0, sharp=False,
                   intra_eff=intra_eff, net_eff=net_eff, intra_hop_us=intra_hop,
                   net_hop_us=net_hop, source=f"hardware:{hw.source or hw.name}",
                   gpu_facts=spec)


def _reference_profile(hw):
    """The profile ``hw`` was made from (built-in name, else its file), or None."""
    from ..synth.hardware import hardware_names, load_hardware, read_hardware_file

    try:
        if hw.name in hardware_names():
            return load_hardware(hw.name)
        if hw.source and Path(hw.source).is_file():
            return read_hardware_file(hw.source)
    except ConfigError:
        return None
    return None
