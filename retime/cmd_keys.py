"""CLI: ``retime keys [TABLE]``: every what-if key with its unit, values, default and the
traces that support it."""

from __future__ import annotations

from typing import Annotated

import typer

from retime.cli import app, emit_json, say


@app.command("keys")
def keys_cmd(
    table: Annotated[str | None, typer.Argument(
        help="Only this table: topology, parallel, cache, hardware, network, overlap, "
             "stragglers.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """List the what-if keys that `retime replay --set KEY=VALUE`, scenario files and sweep
    grids accept: unit, allowed values, default, and which traces support each (kinds:
    synth = `retime synth` runs; kineto / nsys = measured kernel-level traces; oplevel =
    measured Megatron-timer traces), and which facts each needs on a measured trace and where
    each comes from (the trace, what you state with other keys, or a calibration file from
    `retime calibrate`). Elsewhere a key is refused with the reason."""
    from retime.collectors.errors import PolicyError
    from retime.replay.policies.keys import KEYS, key_rows

    tables = sorted({k.split(".")[0] for k in KEYS})
    if table is not None and table not in tables:
        raise PolicyError(f"keys {table!r}: unknown table; choose one of {', '.join(tables)}")
    rows = key_rows(None if table is None else table + ".")
    if json_out:
        emit_json({"keys": rows})
        return
    current = None
    for r in rows:
        t = r["key"].split(".")[0]
        if t != current:
            say(f"[{t}]")
            current = t
        say(f"  {r['key']}  ({r['unit']}; {r['values']}; default {r['default']})")
        say(f"      {r['help']}. Supports: {r['supports']}.")
        say(f"      Needs: {r['needs']}.")
