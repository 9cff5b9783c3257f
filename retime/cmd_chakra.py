"""``retime export RUN --chakra DIR``: Chakra execution traces (collectors.chakra)."""

from __future__ import annotations

from pathlib import Path

from retime.cli import emit_json, say
from retime.collectors.errors import RetimeError


def export_chakra(trace_dir: Path, chakra: Path | None, chrome: Path | None, *, force: bool,
                  json_out: bool) -> None:
    if chakra is None or chrome is not None:
        raise RetimeError("retime export: give exactly one of --chrome OUT.json or "
                          "--chakra DIR")
    from retime.collectors.chakra import write_chakra
    from retime.collectors.trace import read_trace

    trace = read_trace(trace_dir)
    files = write_chakra(trace, chakra, overwrite=force)
    # every op is a node; the enclosing host ranges (ProfilerStep#N, record_function / NVTX
    # annotations, operators that call other operators: their leaf ops are the nodes) are
    # not: say they were left out rather than drop them silently
    n_ranges = int(len(trace.ranges))
    left = ({"enclosing_ranges": n_ranges} if n_ranges else {})
    if json_out:
        emit_json({"output": str(chakra), "files": [str(f) for f in files],
                   "ranks": len(files), "ops": int(trace.n_ops), "left_out": left})
    else:
        say(f"wrote {len(files)} Chakra ET file(s) to {chakra} (one per rank: "
            f"{files[0].name} ...): {int(trace.n_ops):,} ops as nodes" +
            (f"; left out {n_ranges:,} enclosing host ranges (ProfilerStep#, record_function "
             "or NVTX annotations, operators that call other operators: their leaf ops are "
             "the nodes; `retime export --chrome` keeps them)"
             if n_ranges else ""))
