"""The GPU cost layer: one machine description (:mod:`cluster`), the NCCL collective model
(:mod:`nccl`) and kernel cost from shapes (:mod:`kernels`). ``retime cost`` is its front door;
the synthesizer and the replay what-ifs price collectives and kernels through these functions.
"""

from .cluster import (
    Cluster,
    check_cluster_world,
    cluster_from_hardware,
    cluster_hardware,
    format_cluster,
    load_preset,
    preset_names,
    read_cluster,
    resolve_cluster,
)
from .gpus import GpuSpec, gpu_names, gpu_spec
from .nccl import (
    Algo,
    Collective,
    CollectiveCost,
    Group,
    Proto,
    bus_factor,
    collective_cost,
    fill_bytes,
    group_of,
)

__all__ = ["Cluster", "check_cluster_world", "cluster_from_hardware", "cluster_hardware", "Group",
           "format_cluster", "load_preset", "preset_names", "read_cluster",
           "resolve_cluster", "GpuSpec", "gpu_names", "gpu_spec", "Algo", "Collective",
           "CollectiveCost", "Proto", "bus_factor", "collective_cost", "fill_bytes",
           "group_of"]
