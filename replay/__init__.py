"""Replay: Trace -> ReplayGraph -> numba engine -> ReplayResult (DESIGN.md §4)."""

from .engine import ContentionModel, ReplayResult, replay, simulate
from .graph import ReplayGraph, build_graph, graph_from_arrays

__all__ = [
    "ContentionModel",
    "ReplayGraph",
    "ReplayResult",
    "build_graph",
    "graph_from_arrays",
    "replay",
    "simulate",
]
