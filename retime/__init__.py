"""retime: trace-driven profiler and replay analyzer for distributed GPU training.

Notebook facade (each function is a thin shim over the packages; imports are lazy so
``import retime`` stays light)::

    import retime
    t = retime.load("../shared/traces/kineto/dlrm-v100-8rank")   # or a NAME.retime store
    r = retime.replay(t)                                            # identity replay
    r2 = retime.replay(t, {"hardware.compute_speedup": 2})          # a what-if
    retime.report(r2, "reports/dlrm.html", baseline=t)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["load", "replay", "report", "synth", "__version__"]
__version__ = "0.1.0"


def load(paths: Any, *, format: str = "auto", jobs: int = 1):
    """Load a stored ``NAME.retime`` directory, or ingest trace files / folders."""
    from collectors import read_trace
    from collectors.ingest import read

    if isinstance(paths, (str, os.PathLike)) and Path(paths).is_dir() and (Path(paths) / "meta.json").is_file():
        return read_trace(paths)
    return read(paths, format=format, jobs=jobs)


def replay(trace: Any, scenario: Any = None, *, ideal: bool = False, **kw: Any):
    """Replay ``trace`` (identity when ``scenario`` is None) and return a ReplayResult.

    ``scenario`` is a dict of dotted keys (``{"network.inter_node_gbps": 25}``), a list of
    policies, or a path to a TOML scenario file.
    """
    if scenario is None:
        from replay import replay as _replay
        return _replay(trace, ideal=ideal, **kw)
    from replay import whatif
    return whatif(trace, scenario, ideal=ideal, **kw)


def report(x: Any, path: str | os.PathLike[str], *, baseline: Any = None, title: str | None = None) -> Path:
    """Write an HTML or PDF report (by suffix) of a Trace or ReplayResult."""
    from analysis import write_report
    return write_report(x, path, baseline=baseline, title=title)


def synth(**kw: Any):
    """Synthesize a modeled training run (see ``collectors.synth.synthesize``)."""
    from collectors.synth import synthesize
    return synthesize(**kw)
