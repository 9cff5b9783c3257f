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
    if json_out:
        emit_json({"output": str(chakra), "files": [str(f) for f in files],
                   "ranks": len(files), "ops": int(trace.n_ops)})
    else:
        say(f"wrote {len(files)} Chakra ET file(s) to {chakra} (one per rank: "
            f"{files[0].name} ...)")
