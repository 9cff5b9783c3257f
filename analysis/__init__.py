"""Analysis: breakdowns, kernel stats, critical path, communication, pipeline, memory,
efficiency, comparisons, plots and reports (DESIGN.md §5).

Every analysis function takes a Trace or a ReplayResult (see :func:`as_trace`) and returns a
DataFrame; plot functions (``analysis.plots``) take those frames and return a Figure.
"""

from ._util import as_trace
from .breakdown import PARTS, breakdown, summarize_breakdown
from .comm import busbw_factor, collectives, comm_summary, rank_wait
from .compare import compare, metrics, verdict
from .critical_path import attribute_critical_path, critical_path, dependency_arcs
from .efficiency import efficiency, job_efficiency, peak_flops
from .hierarchy import hierarchy
from .host import host_ops, host_overhead, launch_latency
from .kernels import KERNEL_CLASSES, class_stats, classify_names, kernel_classes, kernel_stats
from .memory import memory_timeline, peak_memory
from .pipeline import bubbles, rank_stages, stage_bubbles
from .roofline import roofline, roofline_peaks
from .stragglers import stragglers

# The report's names load on first use (PEP 562): :mod:`.report` imports matplotlib and the
# figures (2.6 of the 4.7 s that ``import retime.analysis`` took on the shared host), which
# ``analyze`` and ``replay`` never draw.
_REPORT_NAMES = ("build_report", "build_sweep_report", "read_sweep", "render_html",
                 "write_html", "write_pdf", "write_report")


def __getattr__(name: str):
    if name in _REPORT_NAMES:
        from . import report
        return getattr(report, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "as_trace",
    "PARTS", "breakdown", "summarize_breakdown",
    "KERNEL_CLASSES", "class_stats", "classify_names", "kernel_classes", "kernel_stats",
    "attribute_critical_path", "critical_path", "dependency_arcs",
    "busbw_factor", "collectives", "comm_summary", "rank_wait",
    "bubbles", "rank_stages", "stage_bubbles",
    "memory_timeline", "peak_memory",
    "efficiency", "job_efficiency", "peak_flops",
    "compare", "metrics", "verdict",
    "stragglers",
    "host_overhead", "host_ops", "launch_latency", "hierarchy", "roofline", "roofline_peaks",
    "build_report", "build_sweep_report", "read_sweep", "render_html", "write_html", "write_pdf",
    "write_report",
]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_REPORT_NAMES))
