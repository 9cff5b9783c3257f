"""The per-rank parts of :func:`analysis.stream.store_analysis` on a Dask cluster.

``retime analyze STORE --scheduler tcp://host:8786`` (or ``store_analysis(path,
scheduler=...)``) sends one task per rank of a rank-partitioned store
(:func:`rank_tasks`): the worker reads that rank's ops and ranges from the store (by the
path given here, made absolute: every worker must mount the store at the same path), runs
:func:`analysis.stream.batch_partials` on it and returns the small per-rank frames (step
windows, breakdown rows, a per-name kernel partial, empty steps, unseen work). It keeps
nothing: a worker holds one rank's ops at a time whatever the number of ranks, and the
workers hand the memory their tasks freed back to the system when the job ends
(:func:`collectors.distributed.release_memory`). The cross-rank parts (collective
statistics, rank wait) read the communication ops only, here, as the local streamed
analysis does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from retime.collectors.errors import RetimeError
from retime.collectors.store import rank_rows, scan_table, store_layout

__all__ = ["rank_tasks", "dask_partials"]


def rank_tasks(path: str | os.PathLike[str]) -> list[np.ndarray]:
    """The work units of a Dask analysis: one array per rank with ops (one rank's parts
    each, so that no worker ever holds more than one rank's ops)."""
    return [np.array([r], np.int64) for r in sorted(rank_rows(path))]


def _rank_partials(path: str, ranks: np.ndarray, by: str,
                   later: pd.Series) -> tuple[Any, ...]:
    """On a worker: :func:`analysis.stream.batch_partials` of ``ranks`` read from the store."""
    from retime.collectors.distributed import _batch_heap

    from .stream import PARTIAL_COLS, _Small, batch_partials

    _batch_heap()  # a plain process's heap while the job runs (as ingest --scheduler)
    p = Path(path)
    small = _Small(p)
    t = small.trace(scan_table(p, "ops", ranks=ranks, columns=PARTIAL_COLS),
                    scan_table(p, "ranges", ranks=ranks))
    return batch_partials(t, by, later)


def dask_partials(path: str | os.PathLike[str], scheduler: Any, *, by: str,
                  later: pd.Series) -> list[tuple[Any, ...]]:
    """:func:`_rank_partials` of every rank of the store at ``path``, one Dask task per rank
    (:func:`rank_tasks`), in rank order; the workers' freed memory is released afterwards."""
    from retime.collectors.distributed import _client, _gather, release_memory

    p = Path(path).resolve()
    if store_layout(p) != "rank":
        raise RetimeError(f"analyze --scheduler {p}: the store is single-file; the Dask "
                          "workers read one rank at a time from a rank-partitioned store: "
                          "ingest with --layout rank (the default with --scheduler)")
    tasks = rank_tasks(p)
    with _client(scheduler) as client:
        try:
            later_f = client.scatter(later, broadcast=True)
            futs = client.map(_rank_partials, [str(p)] * len(tasks), tasks,
                              [by] * len(tasks), [later_f] * len(tasks), pure=False)
            out = _gather(client, futs, "analyze (Dask)", None)
        finally:
            release_memory(client)
    return out
