"""PyTorch profiler (Kineto) JSON reader: one Trace for one or many rank files.

Reading is two-stage: :func:`parse_kineto_file` turns one file into a :class:`RankPart`
(columns of one rank, local ids; runs in worker processes with ``jobs > 1``), then
:func:`merge_parts` assigns global lane / op / string ids, matches collectives across
ranks and writes the accounting. The modules form one pipeline, each importing only those
after it: ``reader`` -> ``scan`` (streaming numba scanner) or ``events`` (msgspec) ->
``links`` (events -> columns and dependency edges, with ``deps`` and ``export``) ->
``schema``; ``merge`` -> ``schema``.


How events are used (every event is counted in ``meta["accounting"][file]``):

``X`` kernel / gpu_memcpy / gpu_memset      -> ops on GPU_STREAM lanes (NCCL/RCCL kernels
                                               become COLLECTIVE ops)
``X`` cuda_runtime / cuda_driver            -> RUNTIME ops on CPU_THREAD lanes
``X`` cpu_op / python_function / operator   -> leaf events become CPU_OP ops; events that
                                               enclose others on their thread become ranges
``X`` user_annotation / gpu_user_annotation -> ranges (``gloo:*`` on gloo threads -> COLLECTIVE ops)
``X`` cuda_sync                             -> SYNC edges (Stream Wait Event / Event Sync / Context Sync)
``X`` Trace                                 -> profiler window marker
``s``/``f``/``t`` flows (ac2g, fwdbwd)      -> flows (launches are linked by correlation id)
``i``/``I`` ``[memory]``                    -> memory table; other instants -> markers
``M``                                       -> lane/process names
``B``/``E``                                 -> paired into ranges
``C``, ``b``/``e``/``n``, ``O``/``N``/``D``, ``P``, ``R`` -> dropped, counted per phase
anything else                               -> error (unknown ``ph``)

Timestamps: ``ts``/``dur`` are microseconds (fractional ns). Files with
``baseTimeNanoseconds`` hold ``ts`` relative to it; absolute time = base + ts*1000.
"""

from .events import kineto_files
from .merge import merge_parts
from .reader import parse_kineto_file, read_kineto
from .schema import RankPart

__all__ = ["read_kineto", "parse_kineto_file", "RankPart", "kineto_files", "merge_parts"]
