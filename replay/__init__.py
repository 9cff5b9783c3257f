"""Replay: Trace -> ReplayGraph -> numba engine -> ReplayResult (DESIGN.md §4)."""

from .engine import ContentionModel, ReplayResult, replay, simulate
from .graph import build_graph, graph_from_arrays
from .graph_data import ReplayGraph
from .policies.scenario import Scenario, load_scenario, parse_set
from .whatif import prediction_range, whatif
from .window import windowed_replay

__all__ = [
    "ContentionModel",
    "ReplayGraph",
    "ReplayResult",
    "Scenario",
    "build_graph",
    "graph_from_arrays",
    "load_scenario",
    "parse_set",
    "replay",
    "simulate",
    "whatif",
    "prediction_range",
    "windowed_replay",
]
