"""``retime analyze RUN --by hierarchy | roofline``: the attribution tree
(analysis.hierarchy) and the roofline per operator (analysis.roofline)."""

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


def analyze_roofline(trace_dir: Path, *, top: int, hardware: str | None,
                     json_out: bool) -> None:
    """The ``top`` operator groups losing the most device time to the roofline."""
    import math

    from retime.analysis.roofline import roofline
    from retime.collectors.synth.hardware import load_hardware, read_hardware_file
    from retime.collectors.trace import read_trace

    hw = None
    if hardware is not None:  # a profile name or a profile file
        hw = read_hardware_file(hardware) if hardware.endswith(".toml") else \
            load_hardware(hardware)
    r = roofline(read_trace(trace_dir), hardware=hw)
    pk = r.attrs["peaks"]
    head = r.head(top)
    if json_out:
        cols = ["op", "shapes", "dtype", "count", "device_ns", "flops", "bytes", "intensity",
                "achieved_tflops", "achieved_gbps", "peak_tflops", "roof_ns", "gap_ns",
                "efficiency", "bound", "step_share"]
        recs = [{k: (None if isinstance(v, float) and math.isnan(v) else v)
                 for k, v in rec.items()} for rec in head[cols].to_dict("records")]
        emit_json({"peaks": pk, "operators": len(r), "device_ns": r.attrs["device_ns"],
                   "modeled_device_ns": float(r["device_ns"].sum()), "top": recs})
        return
    say(f"{trace_dir}: {len(r)} operator groups, peaks of {pk['name']} ({pk['source']}); "
        f"{r['device_ns'].sum() / 1e6:.3f} of {r.attrs['device_ns'] / 1e6:.3f} ms device time "
        "modeled; most time above the roof first:")
    for x in head.itertuples(index=False):
        say(f"  {x.gap_ns / 1e6:9.3f} ms above roof  {100 * x.efficiency:5.1f}% of roof  "
            f"{x.achieved_tflops:8.2f} TFLOP/s {x.achieved_gbps:8.1f} GB/s  {x.bound:7s} "
            f"{x.op} {x.shapes[:60]}")
