"""The ops columns ``retime replay`` reads, and the rest of them for ``-o`` (issue 30).

A replay reads only the ops columns it needs (:mod:`replay.footprint`):

* an identity replay (no scenario, ``--set`` or ``--cluster``; ``--calibration`` alone
  changes nothing an identity replay reads), :data:`~replay.footprint.IDENTITY_COLUMNS`;
* a what-if, the columns its keys declare (:meth:`replay.policies.base.Policy.columns_for`,
  :func:`~replay.footprint.key_columns`). ``--cluster`` sets ``hardware.gpu`` (or
  ``hardware.from_gpu``), ``topology.ranks_per_node`` and the network's rates, and a
  calibration the network's efficiencies: their columns are added before the trace is
  read, since the cluster's values are chosen against the loaded trace.

``-o`` writes the replayed trace with every column. The replay itself still reads only
its columns; the others are read from the store afterwards and added to the written
trace (:func:`complete_ops`), when the replayed ops are the loaded ones. A what-if that
re-laid out the ops (re-bucketed all-reduces, a new data-parallel width, recompute) built
its new rows from the columns read, so for ``-o`` it is replayed again from a full read.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from retime.collectors.errors import TraceFormatError
from retime.collectors.trace import OPS_SCHEMA, Trace, read_meta

from .footprint import IDENTITY_COLUMNS, key_columns

__all__ = ["replay_columns", "read_ops_columns", "complete_ops", "CLUSTER_COLUMN_KEYS",
           "CALIBRATION_COLUMN_KEYS"]

#: the keys ``--cluster`` may set (:data:`replay.policies.scenario.CLUSTER_KEYS`, and
#: ``hardware.from_gpu`` where the trace does not name its GPU)
CLUSTER_COLUMN_KEYS = ("hardware.gpu", "hardware.from_gpu", "topology.ranks_per_node",
                       "network.intra_node_gbps", "network.inter_node_gbps")
#: the keys a calibration refines a cluster with (:func:`replay.policies.cluster_cal.refine`)
CALIBRATION_COLUMN_KEYS = ("network.intra_bus_efficiency", "network.inter_bus_efficiency")


def _is_synth(meta: dict) -> bool:
    syn = meta.get("synth")
    return isinstance(syn, dict) and all(k in syn for k in ("model", "hardware", "parallel"))


def replay_columns(path: str | os.PathLike[str], keys: Iterable[str], *, cluster: bool = False,
                   calibration: bool = False) -> tuple[str, ...] | None:
    """The ops columns a replay of the store ``path`` reads, in schema order; ``None``:
    every column.

    ``keys``: the dotted keys of the scenario and ``--set``; ``cluster``: ``--cluster`` is
    given (its keys are added), ``calibration``: ``--calibration`` is given (with a
    cluster, its efficiency keys are added). No keys and no cluster: an identity replay.
    """
    k = set(keys)
    if not k and not cluster:
        return IDENTITY_COLUMNS
    if cluster:
        k |= set(CLUSTER_COLUMN_KEYS)
        if calibration:
            k |= set(CALIBRATION_COLUMN_KEYS)
    return key_columns(k, synth=_is_synth(read_meta(Path(path))))


def read_ops_columns(path: str | os.PathLike[str], columns: list[str]) -> pd.DataFrame:
    """The ``columns`` of the store's ``ops`` table alone, in the rows' order of
    :func:`~retime.collectors.trace.read_trace` (op id), in the schema's dtypes."""
    from retime.collectors.store import read_partitioned

    p = Path(path)
    meta = read_meta(p)
    if meta.get("layout", "single") == "rank":
        df = read_partitioned(p, "ops", meta.get("partitions"), columns)
    else:
        f = p / "ops.parquet"
        try:
            df = pq.read_table(f, columns=columns).to_pandas()
        except (OSError, pa.ArrowException) as exc:
            raise TraceFormatError(f"{f}: unreadable Parquet ({exc}); re-ingest the trace") \
                from exc
    return pd.DataFrame({c: np.ascontiguousarray(df[c].to_numpy(), OPS_SCHEMA[c][0])
                         for c in columns}, copy=False)


def complete_ops(path: str | os.PathLike[str], out: Trace, replayed_ops: pd.DataFrame,
                 loaded_ops: pd.DataFrame) -> Trace | None:
    """``out`` (a replay's :meth:`~replay.engine.ReplayResult.to_trace`) with the ops
    columns a projected read left out, read from the store ``path``; ``out`` itself when it
    has them all; ``None`` when they are missing and the replayed ops (``replayed_ops``, the
    result's trace's) are not the loaded ones (``loaded_ops``): a policy re-laid them out
    from the columns read, and only a full read can write that trace."""
    missing = [c for c in OPS_SCHEMA if c not in out.ops.columns]
    if not missing:
        return out
    if replayed_ops is not loaded_ops or len(out.ops) != len(loaded_ops):
        return None
    extra = read_ops_columns(path, missing)
    ops = out.ops
    for c in missing:
        ops[c] = extra[c].to_numpy()
    del extra
    return dataclasses.replace(out, ops=ops[list(OPS_SCHEMA)])
