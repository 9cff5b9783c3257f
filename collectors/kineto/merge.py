"""Kineto: merge per-rank parts into one Trace (global ids, groups, collective matching)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..collectives import match_collectives
from ..devices import device_peaks
from ..enums import OpKind
from ..errors import TraceFormatError
from ..trace import StringTable, Trace
from .schema import BARE_NUMBER_SOURCE, RankPart

__all__ = ["merge_parts"]


def capture_meta(parts) -> dict[str, Any]:
    """What :mod:`collectors.capture` recorded per rank (``retimeCapture`` blocks), for the
    what-ifs: ``cpu_affinity`` (rank -> the CPUs it could run on: ranks of a host whose sets
    overlap share those cores) and ``ddp_param_bytes`` (gradient bytes per parameter, when
    the capture was given them), plus the blocks themselves under ``capture``."""
    out: dict[str, Any] = {}
    blocks = {str(p.rank): p.capture for p in parts if isinstance(p.capture, dict)}
    if not blocks:
        return out
    out["capture"] = blocks
    aff = {r: [int(c) for c in b["cpu_affinity"]] for r, b in blocks.items()
           if isinstance(b.get("cpu_affinity"), list)}
    if aff:
        out["cpu_affinity"] = aff
    for b in blocks.values():
        for src in (b, b.get("job"), b.get("metadata")):
            if isinstance(src, dict) and isinstance(src.get("ddp_param_bytes"), list):
                out["ddp_param_bytes"] = [int(x) for x in src["ddp_param_bytes"]]
                return out
    return out


def merge_parts(parts: list[RankPart], skipped: dict[str, str] | None = None) -> Trace:
    """Merge rank parts (one per file, or several from an exported file) into a Trace."""
    flat: list[RankPart] = []
    for p in parts:
        flat.extend(p.export_rank_parts or [p])
    block = next((p.export_block for p in parts if p.export_block is not None
                  and "edges" in p.export_block), None)
    if block is not None and len(parts) > 1:
        raise TraceFormatError(
            f"{', '.join(p.path for p in parts)}: a `retime export --chrome` file holds a whole "
            "run and its op ids: ingest it alone, not with other trace files")
    if len(flat) == 1 and flat[0].rank_source == BARE_NUMBER_SOURCE:
        # a lone file named e.g. rep1.pt.trace.json is one rank, not rank 1 of a world of 2
        p = flat[0]
        p.rank_source = (f"default (single file; the number {p.rank} in its name is not read "
                         "as a rank)")
        p.rank = 0
        p.accounting.update(rank=0, rank_source=p.rank_source)
    seen: dict[int, str] = {}
    for p in flat:
        if p.rank in seen:
            raise TraceFormatError(
                f"rank {p.rank} appears in two files: {seen[p.rank]} and {p.path} "
                f"(rank taken from {p.rank_source}); ingest one run at a time, or rename the files "
                "so each holds its rank (e.g. rank-3.json)")
        seen[p.rank] = p.path
    # files that record different world sizes are two jobs, not the ranks of one
    ws = [(p.world_size, p.path) for p in flat if p.world_size]
    if ws and any(w != ws[0][0] for w, _ in ws):
        other = next((w, f) for w, f in ws if w != ws[0][0])
        raise TraceFormatError(
            f"{ws[0][1]} (world size {ws[0][0]}) and {other[1]} (world size {other[0]}) record "
            "different world sizes in distributedInfo: they are ranks of two jobs; ingest one "
            "run at a time")
    flat.sort(key=lambda p: p.rank)

    strings = StringTable()
    cols: dict[str, list[np.ndarray]] = {}
    lanes: dict[str, list] = {"lane": [], "rank": [], "device": [], "lane_kind": [],
                              "native_id": [], "name": []}
    edges: dict[str, list[np.ndarray]] = {"src": [], "dst": [], "kind": [], "lag_ns": []}
    ranges: dict[str, list[np.ndarray]] = {k: [] for k in
                                           ("rank", "lane", "name_id", "start_ns", "end_ns", "depth")}
    memory: dict[str, list[np.ndarray]] = {k: [] for k in ("rank", "device", "ts_ns", "bytes_delta",
                                                           "allocated_bytes", "reserved_bytes")}
    # per part, its collective/p2p ops as arrays (rank, global op, group name, size, seq) and
    # each group name's first (name, recorded ranks, size), in order of appearance
    comm_parts: list[tuple[np.ndarray, np.ndarray, list, np.ndarray, np.ndarray]] = []
    first_of_group: dict[str, tuple[Any, int]] = {}
    lane_off = 0
    op_off = 0
    world = 0
    pg_cfg: dict[str, dict] = {}
    devices: dict[str, Any] = {}
    backend = None
    for p in flat:
        gmap = np.fromiter((strings.intern(s) for s in p.strings), np.int32, len(p.strings))
        nops = len(p.ops["start_ns"])
        for k, v in p.ops.items():
            if k == "lane":
                v = v + lane_off
            elif k == "name_id":
                v = gmap[v] if len(v) else v
            cols.setdefault(k, []).append(v)
        cols.setdefault("rank", []).append(np.full(nops, p.rank, np.int32))
        for j, (lk, dev, nid, _pid, nm) in enumerate(p.lanes):
            lanes["lane"].append(lane_off + j)
            lanes["rank"].append(p.rank)
            lanes["device"].append(dev)
            lanes["lane_kind"].append(lk)
            lanes["native_id"].append(nid)
            lanes["name"].append(nm)
        for k in edges:
            v = p.edges[k]
            edges[k].append(v + op_off if k in ("src", "dst") else v)
        nr = len(p.ranges["start_ns"])
        ranges["rank"].append(np.full(nr, p.rank, np.int32))
        ranges["lane"].append(p.ranges["lane"] + lane_off)
        ranges["name_id"].append(gmap[p.ranges["name_id"]] if nr else p.ranges["name_id"])
        for k in ("start_ns", "end_ns", "depth"):
            ranges[k].append(p.ranges[k])
        nm_ = len(p.memory["ts_ns"])
        memory["rank"].append(np.full(nm_, p.rank, np.int32))
        for k in ("device", "ts_ns", "bytes_delta", "allocated_bytes", "reserved_bytes"):
            memory[k].append(p.memory[k])
        c = p.comm
        k = len(c["op"])
        if k:
            grp = list(c["group"])
            comm_parts.append((np.full(k, p.rank, np.int64),
                               np.asarray(c["op"], np.int64) + op_off, grp,
                               np.asarray(c["group_size"], np.int64),
                               np.asarray(c["seq"], np.int64)))
            for g in dict.fromkeys(grp):
                if g not in first_of_group:
                    j = grp.index(g)
                    first_of_group[g] = (c["pg_ranks"][j], int(c["group_size"][j]))
        world = max(world, p.world_size or 0, p.rank + 1)
        backend = backend or p.backend
        for pg in p.pg_config:
            pg_cfg.setdefault(pg["name"], pg)
        for dev_id, d in p.devices.items():
            devices.setdefault(str(p.rank), {})[str(dev_id)] = {**d, **device_peaks(d.get("name"))}
        lane_off += len(p.lanes)
        op_off += nops

    ops = {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()}
    n = op_off
    present = sorted(seen)
    if block is not None:  # a retime export: its own groups, collective ids and edges
        from .export import restore_block
        groups, stats, more_edges = restore_block(ops, block, n)
        for k in edges:
            edges[k].append(more_edges[k])
        for k, v in (block.get("memory") or {}).items():
            if k in memory:
                memory[k].append(np.asarray(v, np.int32 if k == "rank" else np.int64))
        return _build(parts, flat, ops, lanes, strings, edges, ranges, memory, groups, stats,
                      world, backend, devices, skipped)
    # ---------------- groups
    names: list[str] = []
    gid_of: dict[str, int] = {}
    g_ranks: list[list[int]] = []
    if "0" not in pg_cfg:
        pg_cfg["0"] = {"name": "0", "desc": "default_pg", "size": world,
                       "ranks": list(range(world))}
    for nm, pg in pg_cfg.items():
        gid_of[nm] = len(names)
        names.append(nm if not pg.get("desc") else f"{nm}:{pg['desc']}")
        g_ranks.append(list(pg.get("ranks") or range(pg.get("size") or world)))
    for g, (pr, gs) in first_of_group.items():
        if g not in gid_of:
            gid_of[g] = len(names)
            names.append(g)
            g_ranks.append(list(pr) if pr else list(range(gs if gs > 0 else world)))
    # ---------------- collectives
    coll_id = np.full(n, -1, np.int64)
    group_id = np.full(n, -1, np.int32)
    stats = {"matched": 0, "unmatched": 0, "unmatched_reasons": {}}
    if comm_parts:
        r = np.concatenate([x[0] for x in comm_parts])
        o = np.concatenate([x[1] for x in comm_parts])
        g = np.concatenate([np.fromiter(map(gid_of.__getitem__, x[2]), np.int64, len(x[2]))
                            for x in comm_parts])
        g_len = np.array([len(x) for x in g_ranks], np.int64)
        gs = np.concatenate([x[3] for x in comm_parts])
        gs = np.where(gs > 0, gs, g_len[g])
        sq = np.concatenate([x[4] for x in comm_parts])
        group_id[o] = g
        is_coll = ops["kind"][o] == OpKind.COLLECTIVE
        present_by_group = {gi: set(rk) & set(present) for gi, rk in enumerate(g_ranks)}
        cid, stats = match_collectives(r[is_coll], g[is_coll], gs[is_coll],
                                       ops["comm_op"][o][is_coll], ops["bytes"][o][is_coll],
                                       sq[is_coll], ops["start_ns"][o][is_coll], present_by_group,
                                       end=(ops["start_ns"] + ops["dur_ns"])[o][is_coll])
        coll_id[o[is_coll]] = cid
        n_p2p = int((~is_coll).sum())
        if n_p2p:
            stats["unmatched_reasons"]["p2p ops without a recorded peer (not paired)"] = n_p2p
            stats["p2p_unpaired_ops"] = n_p2p
    ops["coll_id"] = coll_id
    ops["group_id"] = group_id
    groups = {"group_id": np.arange(len(names)), "name": names, "ranks": g_ranks}
    return _build(parts, flat, ops, lanes, strings, edges, ranges, memory, groups, stats,
                  world, backend, devices, skipped)


def _build(parts, flat, ops, lanes, strings, edges, ranges, memory, groups, stats, world,
           backend, devices, skipped) -> Trace:
    """The merged Trace and its meta."""
    acc: dict[str, Any] = {}
    for p in parts:
        acc[p.path] = p.accounting
    meta = {
        "source_format": "kineto",
        "sources": [{"path": p.path, "format": "kineto", "rank": p.rank,
                     "rank_source": p.rank_source} for p in flat],
        "world_size": int(world),
        "backend": backend,
        "devices": devices,
        "clock_offsets_ns": {str(p.rank): 0 for p in flat},
        "clock_note": "timestamps as recorded (absolute ns); no cross-rank offset applied",
        "accounting": acc,
        "collectives": stats,
        "windows_ns": {str(p.rank): list(p.window_ns) for p in flat if p.window_ns},
        "skipped_files": dict(skipped or {}),
    }
    block = next((p.export_block for p in parts if p.export_block is not None
                  and "edges" in p.export_block), None)
    if block is not None:  # the exported run's own description (format, layout, job, ...)
        src = dict(block.get("meta") or {})
        meta["exported_from"] = {"source_format": src.get("source_format"),
                                 "via": "retime export --chrome"}
        meta.update(src)
    hosts = {str(p.rank): p.hostname for p in flat if p.hostname}
    if hosts:
        meta["hostnames"] = hosts  # ranks sharing a host are one node (topology policies)
    meta.update(capture_meta(flat))
    cat = lambda d: {k: np.concatenate(v) if v else np.zeros(0) for k, v in d.items()}  # noqa: E731
    return Trace.build(ops=ops, lanes=lanes, strings=strings, edges=cat(edges),
                       ranges=cat(ranges), memory=cat(memory), groups=groups, meta=meta)
