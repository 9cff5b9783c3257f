"""retime: trace-driven profiler and replay analyzer for distributed GPU training.

Notebook facade (each function is a thin shim over the subpackages; imports are lazy so
``import retime`` stays light)::

    import retime
    t = retime.load("../shared/traces/kineto/dlrm-v100-8rank")   # or a NAME.retime store
    r = retime.whatif(t)                                            # identity replay
    r2 = retime.whatif(t, {"hardware.compute_speedup": 2})          # a what-if
    retime.report(r2, "reports/dlrm.html", baseline=t)

Subpackages: :mod:`retime.collectors` (everything that produces a Trace),
:mod:`retime.replay` (the engine and what-if policies), :mod:`retime.analysis` (tables,
plots, reports). In a source checkout they are the folders ``collectors/``, ``replay/`` and
``analysis/`` beside ``retime/``; an installed wheel holds them inside ``retime/``.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["load", "whatif", "report", "synth", "sample_trace_path", "__version__"]
__version__ = "0.1.0"

# A checkout (or an editable install) keeps the subpackages beside this folder; searching the
# checkout's root for submodules makes `retime.collectors` resolve there, so a checkout on
# sys.path (PYTHONPATH, a git worktree, `python -m retime` from the root) works without the
# installer's mapping. A wheel has them inside this folder and never takes this branch.
_here = os.path.dirname(os.path.abspath(__file__))
_root = os.path.dirname(_here)
if not os.path.isdir(os.path.join(_here, "collectors")) and os.path.isfile(
        os.path.join(_root, "collectors", "__init__.py")):
    __path__.append(_root)  # noqa: F821 - the package's own __path__
del _here, _root


def load(paths: Any, *, format: str = "auto", jobs: int = 1):
    """Load a stored ``NAME.retime`` directory, or ingest trace files / folders."""
    from pathlib import Path

    from retime.collectors import read_trace
    from retime.collectors.ingest import read

    if isinstance(paths, (str, os.PathLike)) and Path(paths).is_dir() and (Path(paths) / "meta.json").is_file():
        return read_trace(paths)
    return read(paths, format=format, jobs=jobs)


def whatif(trace: Any, scenario: Any = None, *, ideal: bool = False, **kw: Any):
    """Replay ``trace`` (identity when ``scenario`` is None) and return a ReplayResult.

    ``scenario`` is a dict of dotted keys (``{"network.inter_node_gbps": 25}``), a list of
    policies, or a path to a TOML scenario file (``retime keys`` lists every key).
    """
    if scenario is None:
        from retime.replay import replay as _replay
        return _replay(trace, ideal=ideal, **kw)
    from retime.replay import whatif as _whatif
    return _whatif(trace, scenario, ideal=ideal, **kw)


def report(x: Any, path: str | os.PathLike[str], *, baseline: Any = None, title: str | None = None):
    """Write an HTML or PDF report (by suffix) of a Trace or ReplayResult."""
    from retime.analysis import write_report
    return write_report(x, path, baseline=baseline, title=title)


def synth(**kw: Any):
    """Synthesize a modeled training run (see ``retime.collectors.synth.synthesize``)."""
    from retime.collectors.synth import synthesize
    return synthesize(**kw)


def sample_trace_path():
    """The bundled 8-rank DLRM sample (real V100 Kineto traces) that ``retime demo`` reads."""
    from importlib.resources import files
    return files("retime.traces") / "dlrm-v100-8rank"
