"""Multi-rank ingest on a Dask cluster: one task per rank file, merged here.

``read_distributed(paths, scheduler)`` expands the inputs like ``retime ingest`` does, parses
each Kineto file on a Dask worker (:func:`collectors.kineto.parse_kineto_file`; a
``RankPart`` of numpy arrays comes back, far smaller than the JSON), and merges the parts in
this process with :func:`collectors.kineto_merge.merge_parts` (global ids, process groups,
cross-rank collective matching need every rank at once). The result is the same Trace a
local ``read(paths)`` gives.

The workers open the files by the paths given here, made absolute: on a multi-machine
cluster the traces must sit on a filesystem every worker mounts at the same path.
Only Kineto inputs (one file per rank) are parsed remotely; nsys exports and op-level
folders are read locally (``retime ingest`` without ``--scheduler``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .errors import TraceFormatError
from .ingest import detect_format, expand_inputs
from .kineto import kineto_files, parse_kineto_file
from .kineto_merge import merge_parts
from .progress import progress_bar
from .trace import Trace

__all__ = ["read_distributed"]


def read_distributed(paths: list[str | os.PathLike[str]] | str | os.PathLike[str],
                     scheduler: Any, *, format: str = "auto",
                     progress: bool | None = None) -> Trace:
    """Parse rank files on a Dask cluster and merge them into one Trace.

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
    files, skipped = kineto_files([Path(p).resolve() for p in ps])
    try:
        from distributed import Client, as_completed
    except ImportError as exc:  # pragma: no cover - the [dask] extra
        raise TraceFormatError("ingest on a Dask cluster needs dask.distributed: "
                               "pip install 'retime[dask]'") from exc
    own = not isinstance(scheduler, Client)
    try:
        client = Client(scheduler, set_as_default=False) if own else scheduler
    except OSError as exc:
        raise TraceFormatError(f"cannot reach the Dask scheduler {scheduler!r} ({exc}); start "
                               "one with `dask scheduler` or check the address") from exc
    names = [str(f) for f in files]
    futs = client.map(parse_kineto_file, names, pure=False,
                      key=[f"retime-parse-{i}-{os.getpid()}" for i in range(len(names))])
    index = {f.key: i for i, f in enumerate(futs)}
    parts: list[Any] = [None] * len(futs)
    try:
        with progress_bar(len(futs), "parsing traces on the cluster", progress) as bar:
            for f in as_completed(futs, loop=client.loop):
                i = index[f.key]
                try:
                    parts[i] = f.result()
                except TraceFormatError as exc:
                    if "cannot read" in str(exc):
                        raise TraceFormatError(
                            f"{exc} (on a Dask worker: the workers open the files by this "
                            "path; put the traces on a filesystem every worker mounts at the "
                            "same path)") from exc
                    raise
                bar.advance()
    finally:
        client.cancel([f for f in futs if not f.done()])
        if own:
            client.close()
    return merge_parts(parts, skipped)
