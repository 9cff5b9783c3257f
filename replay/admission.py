"""Refuse, before a store is loaded, the what-ifs that the policies would refuse after it.

``retime replay`` checks its keys' values before reading the trace; some refusals depend on
what the trace holds, and those used to come after the whole store was loaded (22 s and
4 GB for 128 ranks, issue 30). :func:`refuse_early` decides them from the store's
``meta.json`` and, where needed, one narrow scan (the ``bytes`` column of the
communication ops, a batch of ranks at a time), raising the policy's own message:

* ``parallel`` keys only the synthesizer models (``parallel.ep``, ``parallel.dtype``,
  zero-bubble and DualPipe schedules, ...) on a measured trace (``meta`` has no ``synth``
  description): :class:`replay.policies.parallel.Parallel` refuses them when configured;
* ``network.*`` / ``topology.*`` keys on a measured trace whose collective and p2p ops
  carry no sizes (or which has none): :class:`replay.policies.network.Network` refuses to
  re-time transfers by bandwidth. Checked only when every other key of the scenario is a
  ``hardware`` one, since re-laid-out, re-bucketed or compressed collectives get sizes of
  their own.

A scenario the checks pass is not promised to succeed; the policies still decide. Only the
user's own keys are checked (``--cluster`` keys are chosen against the loaded trace).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from retime.collectors.enums import OpKind
from retime.collectors.errors import PolicyError
from retime.collectors.store import rank_batches, scan_table
from retime.collectors.trace import read_meta

__all__ = ["refuse_early", "comm_sizes"]

#: tables whose policies never give a measured trace's collectives sizes
_SIZE_NEUTRAL = {"network", "topology", "hardware"}


def _is_synth(meta: dict[str, Any]) -> bool:
    syn = meta.get("synth")
    return isinstance(syn, dict) and all(k in syn for k in ("model", "hardware", "parallel"))


def comm_sizes(path: str | os.PathLike[str]) -> tuple[int, int]:
    """(collective and p2p ops, those with ``bytes > 0``) of a store, read a batch of ranks
    at a time from the ``kind`` and ``bytes`` columns only."""
    p = Path(path)
    n = sized = 0
    kinds = [int(OpKind.COLLECTIVE), int(OpKind.P2P)]
    for b in rank_batches(p, batch_rows=1 << 23):
        x = scan_table(p, "ops", ranks=b, columns=["bytes"], kinds=kinds)["bytes"].to_numpy()
        n += len(x)
        sized += int(np.count_nonzero(x > 0))
    return n, sized


def refuse_early(path: str | os.PathLike[str], scenario: Any) -> None:
    """Raise the :class:`PolicyError` a what-if of ``scenario`` (a Scenario, a dict of
    dotted keys or a list of policies) on the store ``path`` is certain to raise, before
    the store is loaded; return quietly otherwise."""
    from .policies.scenario import as_policies

    pols = as_policies(scenario)
    if not pols:
        return
    meta = read_meta(Path(path))
    if _is_synth(meta):
        return
    tables = {p.table for p in pols}
    for p in pols:
        if p.table == "parallel":
            p.refuse_on_measured()
    if tables & {"network", "topology"} and tables <= _SIZE_NEUTRAL:
        n, sized = comm_sizes(path)
        if n == 0:
            raise PolicyError("network policy: the trace has no collective or p2p ops to "
                              "re-time")
        if sized == 0:
            raise PolicyError("network policy: the trace's collectives carry no sizes "
                              "(ops.bytes is 0), so their transfer time cannot be re-timed by "
                              "bandwidth; re-ingest with collective sizes (NCCL kernel args) "
                              "or scale them with hardware.comm_speedup")
