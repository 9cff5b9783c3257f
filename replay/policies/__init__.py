"""What-if policies (DESIGN.md §4): frozen dataclasses composable in a list or a scenario.

One module per family, one scenario table per policy class (``vocabulary()`` lists every
``table.field`` key):

==============  ===============  ==========================================================
table           module           what it changes
==============  ===============  ==========================================================
``hardware``    hardware         kernel-class speedups, GPU swap (roofline), slow ranks,
                / graphs         CUDA graphs (captured regions lose launch-only host work)
``network``     network          per-level bandwidth / latency, ring vs tree, cross-DC
``topology``    network          ranks per node, NICs per node
``overlap``     overlap          serial vs async, bucket size / MG-WFBP merge (measured
                / bucketing      traces: :func:`bucketing.rebucket`), C3 interference, TP
                                 slicing, FSDP prefetch depth
``parallel``    parallel         DP / TP / PP / CP degree, schedule, micro-batch, ZeRO/FSDP
``cache``       caching          FCDP host cache, keep-gathered params, recompute, optimizer
                                 offload
``stragglers``  stragglers       ideal replay, ideal durations, slow ranks; attribution
                                 (:func:`straggler_analysis`, ``retime stragglers``)
``compression`` compression      per-dimension message compression ratios, codec speed
==============  ===============  ==========================================================

:func:`replay.whatif` runs them (see :mod:`replay.policies.base` for the two phases).
"""

from .base import Policy, WhatIfState
from .caching import Cache
from .compression import Compression
from .hardware import Hardware, kernel_class
from .link_fit import calibrate
from .network import Network, Topology
from .overlap import Overlap, serialize_edges
from .parallel import Parallel
from .scenario import TABLES, Scenario, as_policies, load_scenario, parse_set, vocabulary
from .stragglers import Stragglers, ideal_durations, straggler_analysis

__all__ = [
    "Policy", "WhatIfState", "Cache", "Compression", "Hardware", "Network", "Topology", "Overlap",
    "Parallel", "Stragglers", "Scenario", "TABLES", "as_policies", "load_scenario",
    "parse_set", "vocabulary", "kernel_class", "calibrate", "serialize_edges",
    "ideal_durations", "straggler_analysis",
]
