"""Scenarios: a list of policies written as TOML tables or dotted ``--set key=value`` pairs.

A scenario file has one table per policy family (DESIGN.md §4)::

    [network]
    inter_node_gbps = 25
    [overlap]
    mode = "serial"

``--set network.inter_node_gbps=25`` is the same; values are parsed as TOML values
(``true``, ``1.5``, ``"1f1b"``, ``[3, 5]``), and a bare word is a string. Keys are
``table.field`` with the tables and fields of :data:`TABLES` (``retime replay --help`` and
:func:`vocabulary` list them). An unknown table or field, or an impossible value, raises
PolicyError naming it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomllib

from retime.collectors.errors import PolicyError
from retime.collectors.fsutil import read_toml

from .base import Policy
from .caching import Cache
from .compression import Compression
from .hardware import Hardware
from .network import Network, Topology
from .overlap import Overlap
from .parallel import Parallel
from .stragglers import Stragglers

if TYPE_CHECKING:
    from retime.collectors.costs import Cluster
    from retime.collectors.trace import Trace

__all__ = ["Scenario", "load_scenario", "parse_set", "TABLES", "vocabulary", "as_policies",
           "scenario_from_cli", "ClusterKeys", "cluster_keys", "CLUSTER_KEYS"]

#: scenario table -> policy class, in the order policies configure a what-if
TABLES: dict[str, type[Policy]] = {
    "topology": Topology, "parallel": Parallel, "cache": Cache, "hardware": Hardware,
    "network": Network, "overlap": Overlap, "stragglers": Stragglers,
    "compression": Compression}


def vocabulary() -> list[str]:
    """Every dotted key a scenario accepts."""
    return [f"{t}.{f.name}" for t, cls in TABLES.items() for f in dataclasses.fields(cls)]


def _parse_value(text: str) -> Any:
    s = text.strip()
    try:
        return tomllib.loads(f"v = {s}")["v"]
    except tomllib.TOMLDecodeError:
        return s


def parse_set(items: list[str] | tuple[str, ...] | None) -> dict[str, Any]:
    """``["network.inter_node_gbps=25", ...]`` -> ``{"network.inter_node_gbps": 25.0, ...}``."""
    out: dict[str, Any] = {}
    for it in items or []:
        if "=" not in it:
            raise PolicyError(f"--set {it!r}: expected key=value, e.g. "
                              "network.inter_node_gbps=25")
        k, v = it.split("=", 1)
        k = k.strip()
        if "." not in k:
            raise PolicyError(f"--set {it!r}: the key must be table.field (e.g. "
                              f"overlap.mode); tables: {', '.join(TABLES)}")
        out[k] = _parse_value(v)
    return out


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and (prefix == "" and k in TABLES):
            out.update(_flatten(v, key + "."))
        elif isinstance(v, dict) and prefix == "":
            raise PolicyError(f"scenario: unknown table [{k}]; tables: {', '.join(TABLES)}")
        else:
            out[key] = v
    return out


def _coerce(cls: type[Policy], name: str, v: Any) -> Any:
    """Ints given for float fields are fine; lists become tuples."""
    ftype = {f.name: f.type for f in dataclasses.fields(cls)}[name]
    if isinstance(v, list):
        return tuple(v)
    if isinstance(v, int) and not isinstance(v, bool) and "float" in str(ftype) \
            and "int" not in str(ftype):
        return float(v)
    return v


@dataclass(frozen=True)
class Scenario:
    """An ordered tuple of policies (what ``retime replay --scenario`` applies)."""

    policies: tuple[Policy, ...] = ()
    name: str = ""

    @classmethod
    def from_dict(cls, d: dict[str, Any], name: str = "") -> Scenario:
        """From dotted keys (``{"network.inter_node_gbps": 25}``) and/or nested tables."""
        if not isinstance(d, dict):
            raise PolicyError(f"scenario must be a mapping of table.field -> value, got "
                              f"{type(d).__name__}")
        flat = _flatten(d)
        by_table: dict[str, dict[str, Any]] = {}
        for key, v in flat.items():
            table, _, fld = key.partition(".")
            if table not in TABLES:
                raise PolicyError(f"scenario key {key!r}: unknown table {table!r}; tables: "
                                  f"{', '.join(TABLES)}")
            cls_ = TABLES[table]
            names = [f.name for f in dataclasses.fields(cls_)]
            if fld not in names:
                raise PolicyError(f"scenario key {key!r}: unknown field {fld!r} of [{table}]; "
                                  f"fields: {', '.join(names)}")
            by_table.setdefault(table, {})[fld] = _coerce(cls_, fld, v)
        pols = []
        for table, cls_ in TABLES.items():
            if table in by_table:
                try:
                    pols.append(cls_(**by_table[table]))
                except TypeError as exc:  # pragma: no cover - names are checked above
                    raise PolicyError(f"[{table}]: {exc}") from exc
        return cls(tuple(pols), name)

    def to_dict(self) -> dict[str, Any]:
        """Dotted keys of every set field."""
        out: dict[str, Any] = {}
        for p in self.policies:
            for k, v in p.fields().items():
                out[f"{p.table}.{k}"] = v
        return out

    def describe(self) -> list[dict[str, Any]]:
        return [p.describe() for p in self.policies]


def load_scenario(path: str | Path, overrides: list[str] | dict[str, Any] | None = None, *,
                  base: dict[str, Any] | None = None) -> Scenario:
    """Read a TOML scenario file (and apply ``--set`` style overrides on top). ``base``:
    dotted keys under the file's (a cluster's keys: the file and the overrides win)."""
    p = Path(path)
    data = read_toml(p, "scenario file", "write one [table] per policy, e.g. [network] "
                     "inter_node_gbps = 25", error=PolicyError)
    try:
        flat = dict(base or {})
        flat.update(_flatten(data))
    except PolicyError as exc:
        raise PolicyError(f"{p}: {exc}") from exc
    if overrides:
        flat.update(parse_set(overrides) if isinstance(overrides, (list, tuple)) else overrides)
    try:
        return Scenario.from_dict(flat, name=p.stem)
    except PolicyError as exc:
        raise PolicyError(f"{p}: {exc}") from exc


def as_policies(spec: Any) -> list[Policy]:
    """Normalize what :func:`replay.whatif` accepts into a list of policies."""
    if spec is None:
        return []
    if isinstance(spec, Scenario):
        return list(spec.policies)
    if isinstance(spec, Policy):
        return [spec]
    if isinstance(spec, dict):
        return list(Scenario.from_dict(spec).policies)
    if isinstance(spec, (str, Path)):
        return list(load_scenario(spec).policies)
    if isinstance(spec, (list, tuple)):
        out: list[Policy] = []
        for s in spec:
            out.extend(as_policies(s))
        return out
    raise PolicyError(f"cannot use {type(spec).__name__} as what-if policies; pass a "
                      "Scenario, a policy, a list of policies, a dict of table.field keys or "
                      "a TOML path")


def scenario_from_cli(path: str | Path | None, sets: list[str] | None,
                      base: dict[str, Any] | None = None) -> Scenario:
    """The scenario of ``retime replay [--cluster F] --scenario FILE --set k=v ...``: the
    cluster's keys (``base``, :func:`cluster_keys`), then the file's, then the ``--set``
    ones; a later layer wins for the same key."""
    if path is not None:
        return load_scenario(path, list(sets or []), base=base)
    flat = dict(base or {})
    flat.update(parse_set(sets))
    return Scenario.from_dict(flat)


#: the what-if keys a cluster description sets (``replay`` / ``sweep --cluster``)
CLUSTER_KEYS = ("hardware.gpu", "topology.ranks_per_node", "network.intra_node_gbps",
                "network.inter_node_gbps")


@dataclass(frozen=True)
class ClusterKeys:
    """A cluster as what-if keys: ``keys`` (dotted key -> value) and the keys of
    :data:`CLUSTER_KEYS` it leaves out on this trace, with why (``left_out``)."""

    name: str
    source: str
    keys: dict[str, Any]
    left_out: dict[str, str]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "file": self.source, "keys": dict(self.keys),
                "left_out": dict(self.left_out)}


def cluster_keys(cluster: Cluster, trace: Trace) -> ClusterKeys:
    """The what-if keys that put ``trace``'s run on ``cluster`` (``--cluster FILE``).

    The numbers come from the one mapping of a cluster to a hardware profile,
    :func:`retime.collectors.costs.cluster_hardware`, so ``replay --cluster`` prices what
    ``synth --cluster`` does:

    * ``hardware.gpu``: the cluster's GPU profile (a synthesized run is re-synthesized on
      it; a measured trace's kernels are re-timed by the roofline ratio, which needs the
      trace's GPU: ``hardware.from_gpu`` where the trace does not name a known one);
    * ``topology.ranks_per_node``: the GPUs of one NVLink domain (GPUs per node, or 72 on a
      GB200 NVL72 rack): which collectives stay on the intra-node fabric;
    * ``network.intra_node_gbps``: the intra-node rate; ``network.inter_node_gbps``: each
      GPU's share of its node's NICs (nics_per_node x nic_gbit / 8 / gpus_per_node), left
      out for a cluster without NICs.

    On a measured trace whose collectives carry no sizes (or that has none) the link keys
    cannot re-time anything: they are left out, with the reason in ``left_out``. A trace
    with more ranks than the cluster has GPUs raises PolicyError.
    """
    from retime.collectors.costs import cluster_hardware
    from retime.collectors.enums import OpKind

    where = cluster.source or f"cluster {cluster.name!r}"
    ranks = int(trace.world_size)
    if ranks > cluster.world_size:
        raise PolicyError(f"--cluster {where}: the run has {ranks} ranks but the cluster only "
                          f"{cluster.world_size} GPUs ({cluster.nodes} node(s) x "
                          f"{cluster.gpus_per_node}); raise nodes in the file")
    hw = cluster_hardware(cluster)
    keys: dict[str, Any] = {"hardware.gpu": cluster.gpu,
                            "topology.ranks_per_node": int(hw.gpus_per_node),
                            "network.intra_node_gbps": float(hw.intra.gbps)}
    left: dict[str, str] = {}
    if cluster.nics_per_node:
        keys["network.inter_node_gbps"] = float(hw.inter.gbps)
    else:
        left["network.inter_node_gbps"] = "the cluster has no NICs (nics_per_node = 0)"
    syn = trace.meta.get("synth") if isinstance(trace.meta, dict) else None
    if not syn:
        o = trace.ops
        kind = o["kind"].to_numpy()
        comm = (kind == OpKind.COLLECTIVE) | (kind == OpKind.P2P)
        if not (o["bytes"].to_numpy()[comm] > 0).any():
            why = ("the trace's collectives carry no sizes, so its communication keeps its "
                   "measured time" if comm.any() else "the trace has no communication")
            for k in ("topology.ranks_per_node", "network.intra_node_gbps",
                      "network.inter_node_gbps"):
                if keys.pop(k, None) is not None:
                    left[k] = why
    return ClusterKeys(cluster.name, cluster.source, keys, left)
