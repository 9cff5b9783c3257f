"""What-if policies (DESIGN.md §4): frozen dataclasses composable in a list or a scenario."""

from .base import Policy, WhatIfState
from .caching import Cache
from .hardware import Hardware, kernel_class
from .network import Network, Topology, calibrate
from .overlap import Overlap, serialize_edges
from .parallel import Parallel
from .scenario import TABLES, Scenario, as_policies, load_scenario, parse_set, vocabulary
from .stragglers import Stragglers, ideal_durations, straggler_analysis

__all__ = [
    "Policy", "WhatIfState", "Cache", "Hardware", "Network", "Topology", "Overlap",
    "Parallel", "Stragglers", "Scenario", "TABLES", "as_policies", "load_scenario",
    "parse_set", "vocabulary", "kernel_class", "calibrate", "serialize_edges",
    "ideal_durations", "straggler_analysis",
]
