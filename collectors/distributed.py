"""Multi-rank ingest on a Dask cluster: one task per rank file.

Two entry points:

``ingest_distributed(paths, scheduler, output)`` (what ``retime ingest --scheduler`` runs)
    writes a rank-partitioned store (:mod:`collectors.store`) without gathering the trace,
    by the stages of :mod:`collectors.rankwise` run on the Dask workers:

    1. each worker parses its file (:func:`collectors.kineto.parse_kineto_file`), spools
       the ``RankPart`` into the store's temporary directory and keeps nothing in memory;
       only a *skeleton* comes back here: the part's collective and p2p ops (the ones
       cross-rank matching needs), its lanes, names and metadata;
    2. this process merges the skeletons with :func:`collectors.kineto.merge.merge_parts`
       (process groups, collective matching, string table, lanes, meta exactly as a local
       ingest computes them: they depend on those ops only) and derives each rank's plan:
       global op and lane offsets, name-id map, the ``coll_id``/``group_id`` of its
       collective ops;
    3. each worker reads a spooled part back and writes its ranks' ``ops``/``edges``/
       ``ranges``/``memory`` files into the store's temporary directory; this process
       writes the small tables and ``meta.json`` and renames the directory into place once
       every rank is written (an error or Ctrl-C leaves no store behind). The workers then
       hand the memory their tasks freed back to the system (:func:`release_memory`).

    While its tasks run, a worker's heap works as a plain process's does
    (:func:`_batch_heap`): dask.distributed starts workers with ``MALLOC_TRIM_THRESHOLD_``
    set, which also turns glibc's dynamic mmap threshold off, so every array above 128 KiB
    was mapped and faulted in afresh and unmapped again, for about 1.5x the CPU of a local
    ingest (bench/scale.py). :func:`release_memory` puts the worker's settings back.

    A worker holds one part at a time, whatever the number of ranks.
    ``read_trace`` of the result equals the Trace a local ingest gives.

``read_distributed(paths, scheduler)``
    parses on the workers and merges the full parts here into one in-memory Trace.

The workers open and write files by the paths given here, made absolute: on a
multi-machine cluster the traces and the output must sit on a filesystem every worker
mounts at the same path. Only Kineto inputs (one file per rank) are parsed remotely; nsys
exports and op-level folders are read locally (``retime ingest`` without ``--scheduler``).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

from .errors import TraceFormatError
from .ingest import detect_format, expand_inputs
from .kineto import kineto_files, merge_parts, parse_kineto_file
from .progress import progress_bar
from .rankwise import SPOOL, parse_and_spool, plans, spooled_writes, write_spooled
from .store import commit_store, new_store_dir
from .trace import (
    SCHEMA_VERSION,
    Trace,
    groups_table,
    strings_table,
    write_meta,
    write_parquet,
)

__all__ = ["read_distributed", "ingest_distributed", "release_memory"]


def _kineto_inputs(paths: Any, format: str) -> tuple[list[str], dict[str, str]]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    ps = expand_inputs(list(paths))
    if format not in ("auto", "kineto"):
        raise TraceFormatError(f"--scheduler parses Kineto traces only, not {format!r}; "
                               "ingest other formats without --scheduler")
    if format == "auto":
        found = {detect_format(p) for p in ps} - {"execution_trace"}
        if found - {"kineto"}:
            raise TraceFormatError(
                f"--scheduler parses Kineto traces (one file per rank) only; these inputs are "
                f"{sorted(found)}: ingest them without --scheduler")
    # absolute (workers may run elsewhere) but not resolved: the accounting names the files
    # as given, as a local ingest does (a symlinked folder stays as named)
    files, skipped = kineto_files([Path(os.path.abspath(p)) for p in ps])
    return [str(f) for f in files], skipped


@contextmanager
def _client(scheduler: Any) -> Iterator[Any]:
    try:
        from distributed import Client
    except ImportError as exc:  # pragma: no cover - the [dask] extra
        raise TraceFormatError("ingest on a Dask cluster needs dask.distributed: "
                               "pip install 'retime[dask]'") from exc
    own = not isinstance(scheduler, Client)
    try:
        client = Client(scheduler, set_as_default=False) if own else scheduler
    except OSError as exc:
        raise TraceFormatError(f"cannot reach the Dask scheduler {scheduler!r} ({exc}); start "
                               "one with `dask scheduler` or check the address") from exc
    try:
        yield client
    finally:
        if own:
            client.close()


def _gather(client: Any, futs: list[Any], what: str, progress: bool | None) -> list[Any]:
    """Results of ``futs`` in order, with a progress bar; worker read errors get the
    shared-filesystem hint; unfinished futures are cancelled on any exit."""
    from distributed import as_completed

    index = {f.key: i for i, f in enumerate(futs)}
    out: list[Any] = [None] * len(futs)
    try:
        with progress_bar(len(futs), what, progress) as bar:
            for f in as_completed(futs, loop=client.loop):
                try:
                    out[index[f.key]] = f.result()
                except TraceFormatError as exc:
                    if "cannot read" in str(exc):
                        raise TraceFormatError(
                            f"{exc} (on a Dask worker: the workers open the files by this "
                            "path; put the traces on a filesystem every worker mounts at the "
                            "same path)") from exc
                    raise
                except RuntimeError as exc:  # the scheduler could not unpickle the tasks
                    if "deserializ" not in str(exc):
                        raise
                    raise TraceFormatError(
                        f"the Dask scheduler cannot load retime's tasks ({what}): it or its "
                        "workers import another retime (or none); start them in the "
                        "environment of this client, with this retime importable") from exc
                bar.advance()
    finally:
        client.cancel([f for f in futs if not f.done()])
    return out


def _parse_task(name: str) -> Any:
    """On a worker: :func:`parse_kineto_file` with the heap of a batch job."""
    _batch_heap()
    return parse_kineto_file(name)


def _parse_spool_task(name: str, spool: str) -> Any:
    """On a worker: stage 1 (:func:`parse_and_spool`) with the heap of a batch job."""
    _batch_heap()
    return parse_and_spool(name, spool)


def _write_task(spool: str, jobs: list, root: str) -> Any:
    """On a worker: stage 3 (:func:`write_spooled`) with the heap of a batch job."""
    _batch_heap()
    return write_spooled(spool, jobs, root)


def _parse(client: Any, names: list[str]) -> list[Any]:
    return client.map(_parse_task, names, pure=False,
                      key=[f"retime-parse-{i}-{os.getpid()}-{id(names)}"
                           for i in range(len(names))])


def read_distributed(paths: list[str | os.PathLike[str]] | str | os.PathLike[str],
                     scheduler: Any, *, format: str = "auto",
                     progress: bool | None = None) -> Trace:
    """Parse rank files on a Dask cluster and merge them here into one Trace.

    Parameters
    ----------
    paths : Kineto file(s) and/or folder(s) of them (one file per rank)
    scheduler : a Dask scheduler address (``"tcp://host:8786"``) or a ``distributed.Client``
    format : ``"auto"`` or ``"kineto"`` (other formats are not parsed remotely)
    progress : progress bar on stderr (default: when stderr is a terminal)

    Raises
    ------
    TraceFormatError
        Bad inputs (as a local ingest would), a format other than Kineto, or a file a
        worker cannot read (with the shared-filesystem hint).
    """
    names, skipped = _kineto_inputs(paths, format)
    with _client(scheduler) as client:
        parts = _gather(client, _parse(client, names), "parsing traces on the cluster",
                        progress)
        release_memory(client)
    return merge_parts(parts, skipped)


# ---------------------------------------------------------------- partitioned ingest
def ingest_distributed(paths: list[str | os.PathLike[str]] | str | os.PathLike[str],
                       scheduler: Any, output: str | os.PathLike[str], *,
                       format: str = "auto", progress: bool | None = None) -> dict[str, Any]:
    """Parse rank files on a Dask cluster; each worker writes its ranks' partitions of a
    rank-partitioned store at ``output`` (see the module docstring).

    Parameters
    ----------
    paths : Kineto file(s) and/or folder(s) of them (one file per rank)
    scheduler : a Dask scheduler address (``"tcp://host:8786"``) or a ``distributed.Client``
    output : the ``NAME.retime`` directory (replaced if it exists); it must be on a
        filesystem the workers see at the same path
    format : ``"auto"`` or ``"kineto"``
    progress : progress bars on stderr (default: when stderr is a terminal)

    Returns
    -------
    dict with ``meta`` (as :func:`read_trace` returns it), ``ranks``, ``world_size``,
    ``ops``, ``edges``, ``ranges`` (row counts) and ``output``.
    """
    names, skipped = _kineto_inputs(paths, format)
    output = Path(output).resolve()
    tmp = new_store_dir(output)
    try:
        (tmp / SPOOL).mkdir()
        spools = [str(tmp / SPOOL / f"part-{i}.pkl") for i in range(len(names))]
        with _client(scheduler) as client:
            # the workers keep no part in memory between the stages: each spools its parts
            # into the store's temporary directory (which they must see anyway)
            futs = client.map(_parse_spool_task, names, spools, pure=False,
                              key=[f"retime-parse-{i}-{os.getpid()}-{id(names)}"
                                   for i in range(len(names))])
            res = _gather(client, futs, "parsing traces on the cluster", progress)
            skels = [r[0] for r in res]
            skel = merge_parts([s[0] for s in skels], skipped)
            pl = plans(skel, skels)
            args, ranks_of = spooled_writes(pl, spools, str(tmp))
            futs = [client.submit(_write_task, *a, pure=False) for a in args]
            rows = _gather(client, futs, "writing ranks on the cluster", progress)
            del futs, res
            release_memory(client)
        shutil.rmtree(tmp / SPOOL)
        partitions: dict[str, dict[str, int]] = {}
        for ranks, rws in zip(ranks_of, rows, strict=True):
            for r, rw in zip(ranks, rws, strict=True):
                for name, nrow in rw.items():
                    if nrow:
                        partitions.setdefault(name, {})[str(r)] = int(nrow)
        write_parquet(pa.Table.from_pandas(skel.lanes, preserve_index=False),
                      tmp / "lanes.parquet")
        write_parquet(groups_table(skel.groups), tmp / "groups.parquet")
        write_parquet(strings_table(skel.strings), tmp / "strings.parquet")
        meta = {**skel.meta, "schema_version": SCHEMA_VERSION, "layout": "rank",
                "partitions": partitions}
        write_meta(tmp, meta)
        commit_store(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    tot = {name: sum(partitions.get(name, {}).values()) for name in ("ops", "edges", "ranges")}
    out_meta = {k: v for k, v in meta.items() if k not in ("layout", "partitions")}
    return {"meta": out_meta, "ranks": [int(r) for r in skel.ranks],
            "world_size": skel.world_size, **tot, "output": str(output)}


# glibc's mallopt parameters (malloc.h) and the values a batch job runs with: glibc's own
# ceiling for its dynamic mmap threshold, and twice that for trimming (as glibc pairs them)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_BATCH_MMAP, _BATCH_TRIM = 32 << 20, 64 << 20
_GLIBC_DEFAULT = 128 << 10  # both thresholds' static defaults
_heap_lock = threading.Lock()
_heap_tuned = False


def _libc() -> Any:
    """The C library (ctypes), or None where it cannot be loaded."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _batch_heap() -> bool:
    """On a worker started with ``MALLOC_TRIM_THRESHOLD_`` (dask.distributed's nanny sets
    it): raise the mmap and trim thresholds for the job, as glibc's dynamic thresholds would
    have, so that each rank's arrays reuse freed heap instead of new mappings.
    :func:`_trim_heap` restores the settings. True where they were changed (once)."""
    global _heap_tuned
    if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        return False  # glibc's dynamic thresholds are on: nothing to undo
    with _heap_lock:
        if _heap_tuned:
            return False
        mallopt = getattr(_libc(), "mallopt", None)
        if mallopt is None:
            return False
        mallopt(_M_MMAP_THRESHOLD, _BATCH_MMAP)
        mallopt(_M_TRIM_THRESHOLD, _BATCH_TRIM)
        _heap_tuned = True
        return True


def _env_bytes(name: str) -> int:
    try:
        return int(os.environ.get(name, _GLIBC_DEFAULT))
    except ValueError:
        return _GLIBC_DEFAULT


def _trim_heap() -> int:
    """On a worker: put back the heap settings :func:`_batch_heap` changed, collect garbage
    and hand the freed heap back to the system (glibc keeps freed memory for reuse: a
    worker's RSS would stay at its peak after the job). Returns the worker's RSS in bytes
    afterwards (0 where it cannot tell)."""
    import gc

    global _heap_tuned
    gc.collect()
    libc = _libc()
    with _heap_lock:
        if _heap_tuned and getattr(libc, "mallopt", None) is not None:
            libc.mallopt(_M_MMAP_THRESHOLD, _env_bytes("MALLOC_MMAP_THRESHOLD_"))
            libc.mallopt(_M_TRIM_THRESHOLD, _env_bytes("MALLOC_TRIM_THRESHOLD_"))
        _heap_tuned = False
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is not None:
        trim(0)
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def release_memory(client: Any) -> dict[str, int]:
    """Ask every worker to return the memory its finished tasks freed (see
    :func:`_trim_heap`); worker address -> RSS bytes afterwards."""
    return client.run(_trim_heap)
