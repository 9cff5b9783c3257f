"""Sweeps: many what-if scenarios on one trace -> one tidy DataFrame (DESIGN.md §4, §6).

Grid files
----------
A grid file is TOML. ``[grid]`` maps scenario keys (dotted ``policy.field`` names, written
quoted, ``"network.inter_node_gbps" = [12.5, 25]``, or as nested tables,
``[grid.network] inter_node_gbps = [12.5, 25]``) to lists of values; the cartesian product
is swept, the first key varying slowest. A scalar stands for a one-value list. ``[[scenario]]``
entries add scenarios one by one (key/value tables, same spellings). Both may be present:
the grid's scenarios come first, then the listed ones. A scenario's ``name`` (optional)
becomes a column and is not passed to the replay.

Rows
----
One row per scenario, in scenario order: ``scenario_id`` (0-based position), one column per
key (null where a listed scenario lacks it), then the metrics of :func:`scenario_metrics` and
``error`` (null when the scenario ran; ``"ExceptionType: message"`` otherwise, with null
metrics). A failing scenario never stops the sweep.

Execution
---------
``sweep(trace, scenarios, workers=1)`` runs in this process; ``workers=N > 1`` on N local
worker processes (forked from a clean forkserver, see :func:`_mp_context`); ``scheduler="tcp://host:8786"``
(or a ``distributed.Client``) on a Dask cluster. The trace is shipped to each worker once:
as the pool initializer's argument, or with ``Client.scatter(broadcast=True)``; a task only
carries its scenario. Local workers each take whole groups of scenarios that share a
re-synthesized run (same network / layout settings), so each setting is re-synthesized by one
worker; an idle worker steals the back half of the longest queue. A local worker that dies
(OOM killer, segfault) is replaced and the scenarios it was running are retried once more,
one at a time; a scenario in flight during two deaths gets an error row. Dask reschedules the tasks of a lost worker itself. A script that sweeps on
local workers needs the usual ``if __name__ == "__main__":`` guard of multiprocessing. Ctrl-C (KeyboardInterrupt)
cancels what is left and raises :class:`SweepInterrupted`, whose ``frame`` holds the rows
finished so far.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import pickle
import signal
import tempfile
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import tomllib

from retime.collectors.errors import PolicyError
from retime.collectors.progress import progress_bar
from retime.collectors.trace import Trace, read_trace

from .engine import ReplayResult
from .sweep_metrics import DTYPES as _DTYPES
from .sweep_metrics import METRICS, scenario_metrics

__all__ = ["METRICS", "SweepInterrupted", "default_workers", "grid_scenarios", "read_grid",
           "scenario_metrics", "sweep"]

ScenarioFn = Callable[[Trace, dict[str, Any]], ReplayResult]


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`sweep`; ``frame`` holds the rows finished before it."""

    def __init__(self, frame: pd.DataFrame, total: int) -> None:
        super().__init__(f"sweep interrupted after {len(frame)} of {total} scenarios")
        self.frame = frame
        self.total = total


# ---------------------------------------------------------------------------- grid files
def read_grid(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a grid TOML file into a list of scenarios (flat ``{dotted key: value}`` dicts)."""
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PolicyError(f"{p}: cannot read grid file ({exc.strerror}); check the path") from exc
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{p}: invalid TOML ({exc}); fix the grid file") from exc
    return grid_scenarios(doc, where=str(p))


def grid_scenarios(doc: Mapping[str, Any], *, where: str = "grid") -> list[dict[str, Any]]:
    """Expand a parsed grid document (``[grid]`` and/or ``[[scenario]]``) into scenarios."""
    unknown = sorted(set(doc) - {"grid", "scenario"})
    if unknown:
        raise PolicyError(f"{where}: unknown table(s) {unknown}; a grid file holds [grid] "
                          "(keys -> lists of values) and/or [[scenario]] entries")
    out: list[dict[str, Any]] = []
    grid = doc.get("grid")
    if grid is not None:
        if not isinstance(grid, Mapping):
            raise PolicyError(f"{where}: 'grid' must be a table of key = [values]")
        flat = _flatten(grid, where=f"{where} [grid]")
        axes = []
        for k, v in flat.items():
            vals = list(v) if isinstance(v, list) else [v]
            if not vals:
                raise PolicyError(f"{where} [grid]: {k!r} has an empty list of values; give "
                                  "at least one value or remove the key")
            axes.append(vals)
        keys = list(flat)
        out.extend(dict(zip(keys, combo, strict=True)) for combo in itertools.product(*axes))
    entries = doc.get("scenario", [])
    if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
        raise PolicyError(f"{where}: 'scenario' must be an array of tables ([[scenario]])")
    for i, e in enumerate(entries):
        flat = _flatten(e, where=f"{where} [[scenario]] #{i}")
        for k, v in flat.items():
            if isinstance(v, list):
                raise PolicyError(f"{where} [[scenario]] #{i}: {k!r} = {v!r} is a list; a "
                                  "listed scenario takes one value per key (use [grid] to sweep)")
        out.append(flat)
    if not out:
        raise PolicyError(f"{where}: no scenarios; add a [grid] table or [[scenario]] entries")
    return out


def _flatten(tbl: Mapping[str, Any], *, where: str, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in tbl.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            flat.update(_flatten(v, where=where, prefix=f"{key}."))
            continue
        if key != "name" and ("." not in key or "" in key.split(".")):
            raise PolicyError(f"{where}: key {key!r} is not a dotted policy.field name "
                              "(e.g. \"network.inter_node_gbps\"); see DESIGN.md §4")
        if key in flat:
            raise PolicyError(f"{where}: key {key!r} given twice")
        flat[key] = v
    return flat


# ---------------------------------------------------------------------------- evaluation
def _default_run(trace: Trace, scenario: dict[str, Any]) -> ReplayResult:
    from . import whatif  # the what-if policies (replay/policies); resolved on the worker

    return whatif(trace, scenario)


def _without_range(trace: Trace, scenario: dict[str, Any]) -> ReplayResult:
    """The default what-if, its rows without a range (``sweep(..., ranges=False)``)."""
    return _default_run(trace, scenario)


def _evaluate(trace: Trace, run: ScenarioFn | None, i: int,
              scenario: Mapping[str, Any]) -> dict[str, Any]:
    sc = {k: v for k, v in scenario.items() if k != "name"}
    try:
        if run is None or run is _without_range:
            from .policies.base import fingerprint_scope

            # the default what-if never edits a trace in place: fingerprint each trace once
            # per sweep, not once per scenario (a pass over every op's columns)
            with fingerprint_scope(_FP_MEMO):
                res = _default_run(trace, sc)
                row = scenario_metrics(res)
                if run is None:
                    row.update(_range_columns(res, row["step_time_ns"]))
        else:
            res = run(trace, sc)
            row = scenario_metrics(res)
        row["error"] = None
    except Exception as exc:  # a failed scenario is a row, not a lost sweep
        row = dict.fromkeys(METRICS)
        row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    row["scenario_id"] = i
    return row


def _range_columns(res: ReplayResult, step_ns) -> dict[str, Any]:
    """The row's ``step_time_lo_ns`` / ``step_time_hi_ns``: the what-if's range
    (:func:`replay.prediction_range`, per step of the slowest rank) scaled to the row's
    ``step_time_ns`` (the whole replayed window): ``step_time_ns * bound / predicted step``."""
    from .whatif import prediction_range

    rng = prediction_range(res)
    pred = (res.meta.get("whatif") or {}).get("range", {}).get("predicted_step_ns")
    if not rng or step_ns is None or not pred:
        return {}
    return {"step_time_lo_ns": int(round(step_ns * rng[0] / pred)),
            "step_time_hi_ns": int(round(step_ns * rng[1] / pred))}


_WORKER: dict[str, Any] = {}
#: trace fingerprints of this process's sweep (emptied when a sweep or a worker starts)
_FP_MEMO: dict[int, Any] = {}


def _init_worker(payload: str, run: ScenarioFn | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _keep_freed_memory()
    _FP_MEMO.clear()
    _WORKER["trace"] = pickle.loads(Path(payload).read_bytes())
    _WORKER["run"] = run


def _write_payload(tr: Trace) -> str:
    """The pickled trace in a private temporary file (in RAM under /dev/shm where it fits),
    its path for the workers to read. Passed as the pool's initializer argument instead,
    the bytes went through the forkserver's pipe: ~1 s per worker for a 10^6-op trace
    (130 MB), one worker after the other, while the parent waited."""
    data = pickle.dumps(tr, protocol=pickle.HIGHEST_PROTOCOL)
    dirs = [d for d in ("/dev/shm",) if os.access(d, os.W_OK)] + [tempfile.gettempdir()]
    for k, d in enumerate(dirs):
        fd, path = tempfile.mkstemp(prefix="retime-sweep-", suffix=".pkl", dir=d)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return path
        except OSError:  # /dev/shm too small (64 MB in a default container): the next
            Path(path).unlink(missing_ok=True)
            if k == len(dirs) - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _keep_freed_memory() -> None:
    """In a worker process: let glibc keep freed memory mapped for reuse (no mmap per large
    array, no trimming). A what-if allocates and frees tens of per-op arrays of the same
    sizes, and fresh pages cost a page fault each; the worker's footprint stays its peak."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass


def _run_in_worker(i: int, scenario: dict[str, Any]) -> dict[str, Any]:
    key = _resynth_key(scenario)
    if _WORKER.get("group", key) != key:  # a new group: the last one's runs are done with
        from .policies.base import drop_run_caches

        drop_run_caches(keep=_WORKER["trace"])
    _WORKER["group"] = key
    return _evaluate(_WORKER["trace"], _WORKER["run"], i, scenario)


def _run_on_dask(trace: Trace, run: ScenarioFn | None, i: int,
                 scenario: dict[str, Any]) -> dict[str, Any]:
    if not _WORKER.get("dask_malloc"):  # once per worker process (as the local pool does):
        # a Dask nanny starts its workers with MALLOC_TRIM_THRESHOLD_=65536, so every freed
        # per-op array went back to the OS and the next scenario page-faulted it in again
        _keep_freed_memory()
        _WORKER["dask_malloc"] = True
    return _evaluate(trace, run, i, scenario)


def _release_dask_worker() -> int:
    """On a Dask worker, once a sweep ends: forget its runs and cached graphs (a graph
    holds its trace, so the shipped trace would outlive the sweep), put the heap settings
    :func:`_keep_freed_memory` changed back to the nanny's and hand the freed memory back to
    the system. Returns the worker's RSS in bytes afterwards (0 where it cannot tell)."""
    from retime.collectors.distributed import _env_bytes, _trim_heap

    from .policies.base import drop_run_caches

    drop_run_caches()
    if _WORKER.pop("dask_malloc", False):
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6")
            libc.mallopt(-3, _env_bytes("MALLOC_MMAP_THRESHOLD_"))  # M_MMAP_THRESHOLD
            libc.mallopt(-1, _env_bytes("MALLOC_TRIM_THRESHOLD_"))  # M_TRIM_THRESHOLD
        except (OSError, AttributeError):  # pragma: no cover - not glibc
            pass
    return _trim_heap()


def default_workers() -> int:
    """Cores this process may use (the CLI's default ``--workers``)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # pragma: no cover - not Linux
        return max(os.cpu_count() or 1, 1)


def sweep(trace: Trace | str | os.PathLike[str], scenarios: Iterable[Mapping[str, Any]], *,
          run: ScenarioFn | None = None, workers: int | None = None,
          scheduler: Any = None, progress: bool | None = None,
          ranges: bool = True) -> pd.DataFrame:
    """Replay every scenario on ``trace``; return one row per scenario (see module doc).

    Parameters
    ----------
    trace : Trace or path of a ``NAME.retime`` directory
    scenarios : iterable of ``{dotted key: value}`` dicts (e.g. from :func:`read_grid`)
    run : callable ``(trace, scenario) -> ReplayResult``, optional
        What one scenario means; default :func:`replay.whatif`. Must be picklable (a
        module-level function) for workers.
    workers : int, optional
        Local processes; 1 runs in this process; default :func:`default_workers`.
        Ignored when ``scheduler`` is given.
    scheduler : str or distributed.Client, optional
        A Dask scheduler address (``"tcp://host:8786"``) or a connected client.
    progress : bool, optional
        Progress bar on stderr (default: when stderr is a terminal).
    ranges : bool
        With the default ``run``: each row's ``step_time_lo_ns`` / ``step_time_hi_ns``, the
        what-if's range (:func:`replay.prediction_range`; it replays the what-if again at
        the bounds of what the trace could not measure). False leaves them empty.

    Raises
    ------
    SweepInterrupted
        On Ctrl-C, with the finished rows in ``.frame``.
    """
    tr = read_trace(trace) if isinstance(trace, (str, os.PathLike)) else trace
    if run is None and not ranges:
        run = _without_range
    scs = [dict(s) for s in scenarios]
    if not scs:
        raise PolicyError("sweep: no scenarios given; pass at least one {key: value} dict")
    rows: dict[int, dict[str, Any]] = {}
    _FP_MEMO.clear()  # the caller may have edited the trace in place since the last sweep
    try:
        with progress_bar(len(scs), "sweep", progress) as bar:
            if scheduler is not None:
                _sweep_dask(tr, scs, run, scheduler, rows, bar)
            else:
                n = min(default_workers() if workers is None else int(workers), len(scs))
                if n < 1:
                    raise PolicyError(f"sweep: workers={workers} must be >= 1")
                if n == 1:
                    for i in _work_order(scs):
                        rows[i] = _evaluate(tr, run, i, scs[i])
                        bar.advance()
                else:
                    _sweep_local(tr, scs, run, n, rows, bar)
    except KeyboardInterrupt as exc:
        raise SweepInterrupted(_frame(scs, rows), len(scs)) from exc
    return _frame(scs, rows)


def _sweep_local(tr: Trace, scs: list[dict], run: ScenarioFn | None, n: int,
                 rows: dict[int, dict], bar) -> None:
    """Run the scenarios on ``n`` worker processes, each with its own queue of whole
    re-synthesizing groups (:func:`_work_order`), so that a worker re-synthesizes a network /
    layout setting once and the other workers never do; an idle worker steals the back half
    of the longest queue. Two scenarios are in flight per worker (no idle gap between them).
    A worker that dies is replaced; the scenarios it was running are retried one at a time,
    and one that was running during two deaths gets an error row."""
    ctx = _mp_context()
    payload = _write_payload(tr)
    queues = _split_groups(scs, n)
    pools: list[ProcessPoolExecutor | None] = [None] * n
    inflight: dict[Any, tuple[int, int]] = {}  # future -> (worker, scenario)
    busy = [0] * n
    alone = [False] * n  # the worker runs a scenario that was running when a worker died
    deaths: dict[int, int] = {}
    try:
        while True:
            for w in range(n):
                _feed(w, queues, pools, inflight, busy, alone, deaths, scs, ctx, payload, run)
            if not inflight:
                return
            done, _ = wait(inflight, return_when=FIRST_COMPLETED)
            for f in done:
                if f not in inflight:  # already handled with its dead worker's other tasks
                    continue
                w, i = inflight.pop(f)
                busy[w] -= 1
                alone[w] = False
                try:
                    rows[i] = f.result()
                except BrokenProcessPool:
                    _worker_died(w, i, queues, pools, inflight, busy, deaths, rows, bar)
                    continue
                bar.advance()
    finally:
        for p in pools:  # (a dead worker's pool was shut down already)
            if p is not None:
                p.shutdown(wait=True, cancel_futures=True)
        Path(payload).unlink(missing_ok=True)


def _feed(w, queues, pools, inflight, busy, alone, deaths, scs, ctx, payload, run) -> None:
    """Keep worker ``w`` supplied: two scenarios in flight, or one retried suspect alone."""
    while busy[w] < 2 and not alone[w]:
        if not queues[w]:
            _steal(w, queues)
            if not queues[w]:
                return
        i = queues[w][0]
        suspect = deaths.get(i, 0) > 0
        if suspect and busy[w]:
            return  # a suspect runs alone: a second death then names it
        queues[w].popleft()
        if pools[w] is None:
            pools[w] = ProcessPoolExecutor(1, mp_context=ctx, initializer=_init_worker,
                                           initargs=(payload, run))
        inflight[pools[w].submit(_run_in_worker, i, scs[i])] = (w, i)
        busy[w] += 1
        alone[w] = suspect


def _steal(w: int, queues: list) -> None:
    """Move the back half (at least one) of the longest other queue to worker ``w``."""
    v = max(range(len(queues)), key=lambda k: len(queues[k]))
    k = (len(queues[v]) + 1) // 2
    if v == w or k == 0:
        return
    taken = [queues[v].pop() for _ in range(k)]
    queues[w].extend(reversed(taken))


def _worker_died(w, i, queues, pools, inflight, busy, deaths, rows, bar) -> None:
    """Worker ``w``'s process died while running ``i`` (and maybe another): retry them
    (alone, at the front of its queue) on a fresh process, or give an error row to one that
    was running during its second death."""
    suspects = [i]
    for f, (ww, j) in list(inflight.items()):
        if ww == w:  # its other task dies with it
            del inflight[f]
            busy[w] -= 1
            suspects.append(j)
    if pools[w] is not None:
        pools[w].shutdown(wait=False, cancel_futures=True)
        pools[w] = None
    retry = []
    for j in sorted(suspects):
        deaths[j] = deaths.get(j, 0) + 1
        if deaths[j] >= 2:
            rows[j] = {**dict.fromkeys(METRICS), "scenario_id": j,
                       "error": "WorkerDied: the worker process died twice while running "
                                "this scenario (killed, out of memory or crashed)"}
            bar.advance()
        else:
            retry.append(j)
    queues[w].extendleft(reversed(retry))


def _split_groups(scs: list[dict], n: int) -> list[deque]:
    """The work order (:func:`_work_order`) cut into its re-synthesizing groups, dealt to
    ``n`` queues whole (each group to the queue with the fewest scenarios so far)."""
    queues: list[deque] = [deque() for _ in range(n)]
    for _, grp in itertools.groupby(_work_order(scs), key=lambda i: _resynth_key(scs[i])):
        w = min(range(n), key=lambda k: len(queues[k]))
        queues[w].extend(grp)
    return queues


#: tables whose keys re-synthesize a synthesized run (what-ifs of one setting share it)
_RESYNTH_TABLES = ("parallel", "network", "topology", "cache")


def _resynth_key(sc: Mapping[str, Any]) -> str:
    return repr(sorted((k, repr(v)) for k, v in sc.items()
                       if str(k).split(".")[0] in _RESYNTH_TABLES))


def _work_order(scs: list[dict]) -> list[int]:
    """Scenario indices grouped by their re-synthesizing settings (stable otherwise), so a
    worker re-synthesizes each network / layout once and reuses it for the scenarios that
    differ only in cheaper keys (see SynthSpec.synthesize). Rows keep the input order."""
    return sorted(range(len(scs)), key=lambda i: _resynth_key(scs[i]))


def _mp_context():
    """Workers are forked from a clean single-threaded forkserver that has imported retime
    once (no fork-with-threads hazards, no per-worker import cost); spawn where there is no
    forkserver (Windows, macOS default)."""
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["retime.replay._forkserver_preload"])
        return ctx
    return mp.get_context("spawn")  # pragma: no cover - platforms without forkserver


def _sweep_dask(tr: Trace, scs: list[dict], run: ScenarioFn | None, scheduler: Any,
                rows: dict[int, dict], bar) -> None:
    try:
        from distributed import Client, as_completed
    except ImportError as exc:  # pragma: no cover - the [dask] extra
        raise PolicyError("sweep on a Dask cluster needs dask.distributed: "
                          "pip install 'retime[dask]'") from exc
    own = not isinstance(scheduler, Client)
    try:
        client = Client(scheduler, set_as_default=False) if own else scheduler
    except OSError as exc:
        raise PolicyError(f"cannot reach the Dask scheduler {scheduler!r} ({exc}); start one "
                          "with `dask scheduler` or check the address") from exc
    futs: dict[Any, int] = {}
    tfut = None
    try:
        [tfut] = client.scatter([tr], broadcast=True, hash=False)  # the trace, once per worker
        tag = uuid.uuid4().hex[:8]
        n = len(scs)
        order = _work_order(scs)
        fl = client.map(_run_on_dask, [tfut] * n, [run] * n, order, [scs[i] for i in order],
                        pure=False, key=[f"retime-sweep-{tag}-{i}" for i in order])
        futs.update(zip(fl, order, strict=True))  # one submission
        # results come back in batches (one round trip per batch, not per scenario)
        for f, res in as_completed(list(futs), loop=client.loop, with_results=True,
                                   raise_errors=False):
            i = futs.pop(f)
            if f.status != "finished":  # KilledWorker after repeated deaths, ...
                # an error comes as (type, exception, traceback), a cancellation (its
                # trace lost with every worker that held it) as the exception
                exc = res[1] if isinstance(res, tuple) else res
                res = {**dict.fromkeys(METRICS), "scenario_id": i,
                       "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
            rows[i] = res
            bar.advance()
    finally:
        if futs:
            client.cancel(list(futs))
        if tfut is not None:
            tfut.release()  # the workers' copies of the trace go with the last reference
        try:  # nor do their runs, graphs and freed heap stay behind
            client.run(_release_dask_worker)
        except Exception:  # noqa: BLE001 - a lost worker has nothing left to release
            pass
        if own:
            client.close()


def _frame(scs: list[dict], rows: Mapping[int, dict]) -> pd.DataFrame:
    ids = sorted(rows)
    keys: list[str] = []
    for sc in scs:
        keys.extend(k for k in sc if k not in keys)
    data: dict[str, Any] = {"scenario_id": np.asarray(ids, np.int64)}
    for k in keys:
        col = pd.Series([scs[i].get(k) for i in ids], dtype=object)
        data[k] = _key_column(col)
    for m in METRICS:
        data[m] = pd.array([rows[i][m] for i in ids], dtype=_DTYPES[m])
    data["error"] = pd.array([rows[i]["error"] for i in ids], dtype="string")
    return pd.DataFrame(data)


def _key_column(col: pd.Series) -> pd.Series:
    """Key values as one Parquet-friendly dtype: numbers, bools or strings (mixed -> str)."""
    vals = [v for v in col if v is not None]
    if not vals:
        return col.astype("float64")
    if all(isinstance(v, bool) for v in vals):
        return col.astype("boolean")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
        return col.astype("Int64")
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        return col.astype("float64")
    return pd.Series([None if v is None else str(v) for v in col], dtype="string")
