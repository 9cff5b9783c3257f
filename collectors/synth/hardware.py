"""Hardware profiles: a GPU server (compute, HBM, intra-node link) and its network.

Profiles are plain TOML files (``hardware/*.toml``) that users copy and edit; see
``hardware/a100-80gb.toml`` for every key with its unit (and ``hardware/gb200.toml`` for the
rack-scale and host-link keys). Built-in names: :func:`hardware_names`. Bandwidths are GB/s per
GPU and per direction (1 GB = 1e9 bytes); ``bus_efficiency`` turns a link's peak into the bus
bandwidth nccl-tests reports for large messages.

Topology levels: ``gpus_per_node`` GPUs share a host (a DGX node, a GB200 compute tray of 4);
``nvlink_domain`` GPUs share one NVLink fabric (equal to ``gpus_per_node`` on 8-GPU servers,
72 on a GB200/GB300 NVL72 rack whose NVSwitch trays join 18 compute trays). Collectives are
grouped by NVLink domain, never by host: a group inside one domain runs on NVLink whatever
trays it spans; only a group that crosses domains uses the NICs.

Host link (``[host_link]``): how a GPU reaches host memory, for offload and host-cache
what-ifs: PCIe (Gen5 x16: 64 GB/s per direction nominal) on x86 servers, NVLink-C2C on Grace
(GB200/GB300: 900 GB/s bidirectional, 450 per direction per GPU), with the host memory
bandwidth each GPU's share of the CPU streams at.

Collectives are priced by the cost layer's NCCL model (``collectors/costs``) on the cluster a
profile describes: the built-in profiles' ``bus_efficiency`` values are the cost layer's cited
ones; a profile (or a what-if) that states another ``bus_efficiency`` or ``latency_us`` than
its named built-in replaces the model's value. ``base_us`` and the alpha-beta terms price only
cross-datacenter groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import tomllib

from ..errors import ConfigError
from ..fsutil import read_toml

__all__ = ["LinkConfig", "HardwareConfig", "hardware_names", "load_hardware",
           "read_hardware_file", "resolve_hardware", "HOST_LINKS", "job_domain",
           "match_hardware"]

_DIR = Path(__file__).with_name("hardware")
#: host link kinds -> nominal GB/s per GPU per direction (PCIe x16 per generation; Grace's
#: NVLink-C2C: 900 GB/s bidirectional, collectors/costs/REFERENCES.md H1)
HOST_LINKS = {"pcie3": 16.0, "pcie4": 32.0, "pcie5": 64.0, "pcie6": 128.0, "c2c": 450.0}


@dataclass(frozen=True)
class LinkConfig:
    """One level of the network: bandwidth per GPU per direction and alpha-beta costs."""

    link: str
    gbps: float
    bus_efficiency: float = 0.8
    latency_us: float = 2.0  # per algorithm step
    base_us: float = 5.0  # fixed per call

    def __post_init__(self) -> None:
        if not self.gbps > 0:
            raise ConfigError(f"link {self.link!r}: gbps={self.gbps} must be > 0")
        if not 0 < self.bus_efficiency <= 1:
            raise ConfigError(f"link {self.link!r}: bus_efficiency={self.bus_efficiency} "
                              "must be in (0, 1]")

    @property
    def bus_bytes_per_ns(self) -> float:
        """Achievable bus bandwidth in bytes per ns (GB/s == bytes/ns)."""
        return self.gbps * self.bus_efficiency


@dataclass(frozen=True)
class HardwareConfig:
    """A GPU server model plus its network (see the module docstring for units)."""

    name: str
    gpu: str
    memory_gib: float
    hbm_gbps: float
    gpus_per_node: int
    peak_tflops: dict[str, float]
    gemm_max: float
    gemm_k_half: float
    memory_efficiency: float
    kernel_overhead_us: float
    framework_reserve_gib: float
    intra: LinkConfig
    inter: LinkConfig  # gbps here is per GPU: nics * nic_gbps / gpus_per_node
    nics: int
    nic_gbps: float
    cross_dc: LinkConfig | None = None
    overlap_efficiency: float = 0.5
    sm_count: int = 108
    dc_km: float = 0.0
    nodes_per_dc: int = 0
    gemm_max_fp8: float = 0.0  # 0: same fraction of peak as gemm_max
    source: str = field(default="", compare=False)
    nvlink_domain: int = 0  # GPUs in one NVLink domain; 0: gpus_per_node
    gemm_max_fp4: float = 0.0  # 0: gemm_max_fp8 (else gemm_max)
    host_link: str = "pcie4"  # "pcie3" | "pcie4" | "pcie5" | "pcie6" | "c2c"
    host_link_gbps: float = 32.0  # nominal GB/s per GPU per direction
    host_link_efficiency: float = 0.78125  # achieved share of nominal: 25 of PCIe4's 32 GB/s
    host_memory_gbps: float = 100.0  # host DRAM GB/s one GPU's share of the CPU streams at
    board_power_w: float = 0.0  # the GPU's board power limit (W); 0: not stated
    gemm_ref_power_w: float = 0.0  # board power the [efficiency] GEMM fractions hold at

    def __post_init__(self) -> None:
        if self.gpus_per_node <= 0:
            raise ConfigError(f"hardware {self.name!r}: gpus_per_node={self.gpus_per_node} "
                              "must be > 0")
        if not 0 < self.gemm_max <= 1 or not 0 < self.memory_efficiency <= 1:
            raise ConfigError(f"hardware {self.name!r}: efficiencies must be in (0, 1] "
                              f"(gemm_max={self.gemm_max}, memory={self.memory_efficiency})")
        if self.memory_gib <= 0 or self.hbm_gbps <= 0:
            raise ConfigError(f"hardware {self.name!r}: memory_gib and hbm_gbps must be > 0")
        d = self.nvlink_domain
        if d and (d < self.gpus_per_node or d % self.gpus_per_node):
            raise ConfigError(f"hardware {self.name!r}: nvlink_domain={d} must be a multiple "
                              f"of gpus_per_node={self.gpus_per_node} (a domain is whole "
                              "nodes or trays)")
        if self.board_power_w < 0 or self.gemm_ref_power_w < 0 or (
                self.gemm_ref_power_w > 0 and not self.board_power_w > 0):
            raise ConfigError(f"hardware {self.name!r}: [power] board_w={self.board_power_w} "
                              f"and gemm_fractions_at_w={self.gemm_ref_power_w} must be >= 0 "
                              "(board_w > 0 when gemm_fractions_at_w is given)")
        if not self.host_link_gbps > 0 or not 0 < self.host_link_efficiency <= 1 \
                or not self.host_memory_gbps > 0:
            raise ConfigError(f"hardware {self.name!r}: [host_link] gbps="
                              f"{self.host_link_gbps}, efficiency={self.host_link_efficiency}"
                              f" and memory_gbps={self.host_memory_gbps} must be > 0 "
                              "(efficiency at most 1)")

    @property
    def domain(self) -> int:
        """GPUs in one NVLink domain (``nvlink_domain``, else ``gpus_per_node``)."""
        return self.nvlink_domain or self.gpus_per_node

    @property
    def host_bytes_per_ns(self) -> float:
        """Achievable host<->GPU copy rate of one GPU (GB/s == bytes/ns): the host link's
        nominal rate x its efficiency, capped by the GPU's share of host memory bandwidth."""
        return min(self.host_link_gbps * self.host_link_efficiency, self.host_memory_gbps)

    @property
    def power_scale(self) -> float:
        """Sustained-GEMM headroom of this part over the one its ``[efficiency]`` GEMM
        fractions were measured on: ``board_w / gemm_fractions_at_w`` (``[power]``), 1 when
        either is not stated. Dense GEMMs run power-capped (GB200 sustains 58% of its FP8
        peak, collectors/costs/REFERENCES.md K5): the clock they hold, and so their rate,
        rises with the board's power limit; taken linear in power (the limit at a fixed
        voltage, an upper bound; REFERENCES.md H9)."""
        if self.board_power_w > 0 and self.gemm_ref_power_w > 0:
            return self.board_power_w / self.gemm_ref_power_w
        return 1.0

    def gemm_max_of(self, dtype: str) -> float:
        """Fraction of the dtype's peak that large GEMM tiles sustain (the profile's
        fraction x :attr:`power_scale`, never above the peak)."""
        if dtype == "fp4" and self.gemm_max_fp4 > 0:
            f = self.gemm_max_fp4
        elif dtype in ("fp8", "fp4") and self.gemm_max_fp8 > 0:
            f = self.gemm_max_fp8
        else:
            f = self.gemm_max
        return min(1.0, f * self.power_scale)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` (raises ConfigError when the GPU lacks it)."""
        v = self.peak_tflops.get(dtype)
        if not v:
            raise ConfigError(f"hardware {self.name!r} ({self.gpu}) has no {dtype} peak; "
                              f"available: {sorted(self.peak_tflops)}; pick another --dtype")
        return float(v) * 1e12

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ("name", "gpu", "memory_gib", "hbm_gbps",
                                           "gpus_per_node", "peak_tflops", "gemm_max",
                                           "gemm_k_half", "sm_count", "memory_efficiency", "overlap_efficiency",
                                           "kernel_overhead_us", "framework_reserve_gib",
                                           "nics", "nic_gbps", "dc_km", "nodes_per_dc",
                                           "gemm_max_fp8", "nvlink_domain", "gemm_max_fp4",
                                           "host_link", "host_link_gbps",
                                           "host_link_efficiency", "host_memory_gbps",
                                           "board_power_w", "gemm_ref_power_w")}
        for k in ("intra", "inter", "cross_dc"):
            link = getattr(self, k)
            d[k] = None if link is None else dict(link.__dict__)
        return d


def _need(t: dict[str, Any], key: str, where: str) -> Any:
    if key not in t:
        raise ConfigError(f"{where}: missing key {key!r} (see collectors/synth/hardware/"
                          "a100-80gb.toml for a complete profile)")
    return t[key]


def _parse(data: dict[str, Any], where: str) -> HardwareConfig:
    try:
        eff = data.get("efficiency", {})
        intra_t = _need(data, "intra_node", where)
        inter_t = _need(data, "inter_node", where)
        gpn = int(_need(data, "gpus_per_node", where))
        nics = int(inter_t.get("nics", gpn))
        nic_gbps = float(_need(inter_t, "nic_gbps", where + " [inter_node]"))
        intra = LinkConfig(link=str(intra_t.get("link", "intra-node")),
                           gbps=float(_need(intra_t, "gbps", where + " [intra_node]")),
                           bus_efficiency=float(intra_t.get("bus_efficiency", 0.8)),
                           latency_us=float(intra_t.get("latency_us", 1.0)),
                           base_us=float(intra_t.get("base_us", 8.0)))
        inter = LinkConfig(link=str(inter_t.get("link", "inter-node")),
                           gbps=nics * nic_gbps / gpn,
                           bus_efficiency=float(inter_t.get("bus_efficiency", 0.9)),
                           latency_us=float(inter_t.get("latency_us", 5.0)),
                           base_us=float(inter_t.get("base_us", 12.0)))
        dc_t = data.get("cross_dc", {})
        nodes_per_dc = int(dc_t.get("nodes_per_dc", 0))
        cross = None
        if dc_t:
            km = float(dc_t.get("km", 0.0))
            cross = LinkConfig(link="cross-datacenter", gbps=float(dc_t.get("gbps", 12.5)),
                               bus_efficiency=float(dc_t.get("bus_efficiency", 0.9)),
                               latency_us=inter.latency_us
                               + km * float(dc_t.get("latency_us_per_km", 5.0)),
                               base_us=inter.base_us)
        peaks = {str(k): float(v) for k, v in _need(data, "peak_tflops", where).items()}
        host_t = data.get("host_link", {})
        power_t = data.get("power", {})
        host_kind = str(host_t.get("kind", "pcie4")).lower()
        if host_kind not in HOST_LINKS:
            raise ConfigError(f"{where}: [host_link] kind={host_kind!r} is not one of "
                              f"{', '.join(HOST_LINKS)}")
        return HardwareConfig(
            name=str(data.get("name", Path(where).stem)),
            gpu=str(data.get("gpu", data.get("name", "GPU"))),
            memory_gib=float(_need(data, "memory_gib", where)),
            hbm_gbps=float(_need(data, "hbm_gbps", where)),
            gpus_per_node=gpn,
            peak_tflops=peaks,
            gemm_max=float(eff.get("gemm_max", 0.8)),
            gemm_max_fp8=float(eff.get("gemm_max_fp8", 0.0)),
            gemm_k_half=float(eff.get("gemm_k_half", 64)),
            sm_count=int(data.get("sm_count", 108)),
            memory_efficiency=float(eff.get("memory", 0.85)),
            overlap_efficiency=float(eff.get("overlap", 0.5)),
            kernel_overhead_us=float(data.get("kernel_overhead_us", 3.0)),
            framework_reserve_gib=float(data.get("framework_reserve_gib", 2.0)),
            intra=intra, inter=inter, nics=nics, nic_gbps=nic_gbps,
            cross_dc=cross, dc_km=float(dc_t.get("km", 0.0)), nodes_per_dc=nodes_per_dc,
            source=where,
            nvlink_domain=int(intra_t.get("nvlink_domain", 0)),
            gemm_max_fp4=float(eff.get("gemm_max_fp4", 0.0)),
            host_link=host_kind,
            host_link_gbps=float(host_t.get("gbps", HOST_LINKS[host_kind])),
            host_link_efficiency=float(host_t.get("efficiency", 0.78125)),
            host_memory_gbps=float(host_t.get("memory_gbps", 100.0)),
            board_power_w=float(power_t.get("board_w", 0.0)),
            gemm_ref_power_w=float(power_t.get("gemm_fractions_at_w", 0.0)),
        )
    except (TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"{where}: bad hardware profile value ({exc})") from exc


@cache
def _builtin() -> dict[str, HardwareConfig]:
    out = {}
    for f in sorted(_DIR.glob("*.toml")):
        with open(f, "rb") as fh:
            hw = _parse(tomllib.load(fh), str(f))
        out[hw.name] = hw
    return out


def hardware_names() -> list[str]:
    """Names of the built-in hardware profiles."""
    return sorted(_builtin())


def load_hardware(name: str) -> HardwareConfig:
    """A built-in profile by name, e.g. ``"a100-80gb"`` or ``"h100-sxm"``."""
    hw = _builtin().get(name.lower())
    if hw is None:
        raise ConfigError(f"unknown hardware {name!r}; built-in profiles: "
                          f"{', '.join(hardware_names())}; or copy one of "
                          "collectors/synth/hardware/*.toml and pass --hardware-file")
    return hw


def match_hardware(text: str) -> HardwareConfig | None:
    """The built-in profile whose GPU name (``gpu``, e.g. ``"NVIDIA GB200"``) appears in
    ``text`` (a trace's device names), the longest such name; None when none does."""
    t = str(text).lower()
    hits = [hw for hw in _builtin().values() if hw.gpu.lower() in t]
    return max(hits, key=lambda h: len(h.gpu)) if hits else None


def read_hardware_file(path: str | Path) -> HardwareConfig:
    """Read a hardware profile TOML (same keys as the built-in files)."""
    data = read_toml(path, "hardware file", "copy one of collectors/synth/hardware/*.toml")
    return _parse(data, str(path))


def resolve_hardware(hw: Any) -> HardwareConfig:
    """A HardwareConfig from a built-in name, a TOML path, a HardwareConfig or a cluster
    description (:class:`~retime.collectors.costs.Cluster`, mapped by
    :func:`~retime.collectors.costs.cluster.cluster_hardware`)."""
    if isinstance(hw, HardwareConfig):
        return hw
    from ..costs.cluster import Cluster, cluster_hardware  # costs imports this module
    if isinstance(hw, Cluster):
        return cluster_hardware(hw)
    s = str(hw)
    if s.endswith(".toml") or Path(s).is_file():
        return read_hardware_file(s)
    return load_hardware(s)


def job_domain(hw: HardwareConfig, world: int, stated: int = 0) -> int:
    """GPUs of a job of ``world`` GPUs that share each NVLink domain (rank ``r`` is in domain
    ``r // job_domain``).

    ``stated`` (``--nvlink-domain``, ``topology.nvlink_domain``): must be at most the
    hardware's domain and divide ``world`` (or hold all of it). Not stated: the hardware's
    domain when it divides ``world``; on a rack whose domain does not (72 GPUs of an NVL72
    rack for a 256-GPU job), the largest whole number of nodes (trays) per rack that does,
    as a scheduler places a job evenly over racks (64 of 72: four racks for 256 GPUs).
    """
    d = hw.domain
    if stated:
        if stated > d:
            raise ConfigError(f"nvlink_domain={stated} is larger than {hw.name}'s NVLink "
                              f"domain of {d} GPUs; state at most {d}")
        if world > stated and world % stated:
            raise ConfigError(f"nvlink_domain={stated} does not divide the job's {world} GPUs "
                              "(each domain must hold the same number of the job's ranks); "
                              f"choose a divisor of {world} up to {d}")
        return stated
    if world <= d or world % d == 0:
        return d
    g = hw.gpus_per_node
    for m in range(d - d % g, g - 1, -g):
        if world % m == 0:
            return m
    raise ConfigError(f"{world} GPUs cannot be spread evenly over {hw.name}'s NVLink "
                      f"domains of {d} GPUs ({g} per node); use a multiple of {g}")


def hardware_from_dict(d: dict[str, Any]) -> HardwareConfig:
    """A HardwareConfig from :meth:`HardwareConfig.to_dict` output (unknown keys ignored).
    The one reader (``replay.policies.base.hardware_from_dict`` calls it); it lives here so
    that the report's roofline reads a synthesized run's profile without importing the replay
    package (0.17-0.4 s of the report's start-up)."""
    import dataclasses

    hf = {f.name for f in dataclasses.fields(HardwareConfig)}
    lf = {f.name for f in dataclasses.fields(LinkConfig)}
    hd = {k: v for k, v in d.items() if k in hf}
    for k in ("intra", "inter", "cross_dc"):
        if isinstance(hd.get(k), dict):
            hd[k] = LinkConfig(**{a: b for a, b in hd[k].items() if a in lf})
    hd.setdefault("cross_dc", None)
    return HardwareConfig(**hd)
