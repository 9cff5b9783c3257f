"""``retime analyze RUN --by hierarchy``: the attribution tree (analysis.hierarchy)."""

from __future__ import annotations

from pathlib import Path

from retime.cli import emit_json, say


def analyze_hierarchy(trace_dir: Path, *, top: int, json_out: bool) -> None:
    """Print the tree (nodes with at least 1% of device or host time, ``top`` children per
    node, depth <= 6) or, with ``--json``, every node."""
    from retime.analysis.hierarchy import hierarchy
    from retime.collectors.trace import read_trace

    h = hierarchy(read_trace(trace_dir))
    root = h.iloc[0]
    if json_out:
        cols = ["node_id", "parent_id", "depth", "level", "name", "count", "device_incl_ns",
                "device_excl_ns", "host_incl_ns", "host_excl_ns", "launches", "launch_ns"]
        emit_json({"nodes": len(h), "device_ns": int(root["device_incl_ns"]),
                   "host_ns": int(root["host_incl_ns"]),
                   "hierarchy": [{k: (str(v) if k == "level" else v) for k, v in r.items()}
                                 for r in h[cols].to_dict("records")]})
        return
    dev, host = max(int(root["device_incl_ns"]), 1), max(int(root["host_incl_ns"]), 1)
    say(f"{trace_dir}: {len(h)} nodes; device {dev / 1e6:.3f} ms, host {host / 1e6:.3f} ms "
        "(all ranks); columns: device incl / host incl / launches")
    shown: dict[int, int] = {}
    for r in h.itertuples(index=False):
        if r.depth > 6 or (r.device_incl_ns < 0.01 * dev and r.host_incl_ns < 0.01 * host):
            continue
        n = shown.get(r.parent_id, 0)
        if n >= top:
            continue
        shown[r.parent_id] = n + 1
        say(f"{r.device_incl_ns / 1e6:10.3f} ms {r.host_incl_ns / 1e6:10.3f} ms "
            f"{r.launches:7d}  {'  ' * r.depth}{str(r.name)[:90]} [{r.level}]")
