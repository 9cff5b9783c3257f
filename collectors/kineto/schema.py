"""Kineto JSON schema: the decoded event structs (msgspec), the per-rank result
(:class:`RankPart`) and the category / event codes the reader stages share.

The leaf of the reader pipeline (``reader`` -> ``scan`` / ``events`` -> ``links`` -> ``deps``;
``merge``): it imports nothing else of the package.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..enums import OpKind


# ---------------------------------------------------------------- schema (msgspec)
class Args(msgspec.Struct, omit_defaults=True, gc=False):
    # integer fields also accept strings ("0x0", "2560": ROCm/HIP runtime events write
    # them so); links.coerce_args turns them into ints and counts each coercion
    correlation: int | str = -1
    external_id: int | str = msgspec.field(default=-1, name="External id")
    device: int | str | None = None
    stream: int | str | None = None
    bytes: int | float | str | None = None  # HIP traces write strings ('128')
    coll_name: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: int | str | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | str | None = msgspec.field(default=None, name="Out msg nelems")
    group_size: int | str | None = msgspec.field(default=None, name="Group size")
    pg_name: str | int | None = msgspec.field(default=None, name="Process Group Name")
    pg_ranks: str | list[int] | None = msgspec.field(default=None, name="Process Group Ranks")
    seq: int | str | None = msgspec.field(default=None, name="Seq")
    dtype: str | None = None
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    # a kernel's launch grid ([blocks, 1, 1]): an NCCL kernel runs one block per channel
    grid: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""))
    sync_kind: str | None = msgspec.field(default=None, name="cuda_sync_kind")
    wait_corr: int | str | None = msgspec.field(default=None,
                                                name="wait_on_cuda_event_record_corr_id")
    wait_stream: int | str | None = msgspec.field(default=None, name="wait_on_stream")
    mem_bytes: int | str | None = msgspec.field(default=None, name="Bytes")
    total_alloc: int | str | None = msgspec.field(default=None, name="Total Allocated")
    total_reserved: int | str | None = msgspec.field(default=None, name="Total Reserved")
    dev_id: int | str | None = msgspec.field(default=None, name="Device Id")
    dev_type: int | str | None = msgspec.field(default=None, name="Device Type")
    name: str | None = None
    labels: str | None = None
    # written by `retime export --chrome`
    rank: int | None = None
    lane: int | None = None
    kind: str | None = None
    lane_kind: str | None = None
    native_id: int | None = None
    range_depth: int | None = None  # an annotation range, not an op
    timeline: str | None = None  # "replayed": a what-if's copy of the ops
    path_op_id: int | None = None  # the critical-path track's copy of an op
    # op columns the export carries (schema_version 3); loose types: a profiler's own args
    # of these names must never fail the decode
    op_id: int | float | str | None = None
    step: int | float | str | None = None
    coll_id: int | float | str | None = None
    comm_op: int | float | str | None = None
    phase: int | float | str | None = None
    layer: int | float | str | None = None
    microbatch: int | float | str | None = None
    stage: int | float | str | None = None
    chunk: int | float | str | None = None
    group: int | float | str | None = None
    peer: int | float | str | None = None
    flops: int | float | str | None = None


#: Args fields that hold integers (a string there is coerced), with their JSON names
INT_ARGS = {"correlation": "correlation", "external_id": "External id", "device": "device",
            "stream": "stream", "in_nelems": "In msg nelems", "out_nelems": "Out msg nelems",
            "group_size": "Group size", "wait_corr": "wait_on_cuda_event_record_corr_id",
            "wait_stream": "wait_on_stream", "mem_bytes": "Bytes",
            "total_alloc": "Total Allocated", "total_reserved": "Total Reserved",
            "dev_id": "Device Id", "dev_type": "Device Type"}


class Event(msgspec.Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: str | int | float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | str | None = None  # strings ("12.5") are coerced and counted
    dur: float | str | None = None
    args: Args | None = None


class ProcessGroupInfo(msgspec.Struct, gc=False):
    pg_name: str | int | None = None
    pg_desc: str | None = None
    pg_size: int | None = None
    ranks: list[int] | None = None


class DistInfo(msgspec.Struct, gc=False):
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    pg_config: list[ProcessGroupInfo] | None = None
    nccl_version: str | None = None


class DeviceInfo(msgspec.Struct, gc=False):
    id: int | None = None
    name: str | None = None
    totalGlobalMem: int | None = None
    numSms: int | None = None
    computeMajor: int | None = None
    computeMinor: int | None = None


class TraceFile(msgspec.Struct, gc=False):
    traceEvents: list[Event] | None = None
    distributedInfo: DistInfo | None = None
    deviceProperties: list[DeviceInfo] | None = None
    baseTimeNanoseconds: int | None = None
    retimeExport: dict[str, Any] | None = None
    retimeCapture: dict[str, Any] | None = None  # written by collectors.capture (see there)
    host_name: str | None = None  # written by newer torch.profiler and by collectors.capture
    with_stack: Any = None  # torch.profiler(with_stack=True) writes 1 (Python stack tracing)
    schema: Any = None
    nodes: msgspec.Raw = msgspec.Raw(b"")


FILE_DECODER = msgspec.json.Decoder(TraceFile)
NOARGS = Args()  # shared stand-in for events without args
LIST_DECODER = msgspec.json.Decoder(list[Event])

KNOWN_PH = set("XBEiIsftMCbenONDPRpa")
DROP_PH = {"C": "counter events (ph C) are not used", "b": "async events (ph b/e/n) are not used",
            "e": "async events (ph b/e/n) are not used", "n": "async events (ph b/e/n) are not used",
            "O": "object events (ph N/O/D) are not used", "N": "object events (ph N/O/D) are not used",
            "D": "object events (ph N/O/D) are not used", "P": "sample events (ph P) are not used",
            "R": "mark events (ph R) are not used", "p": "sample events (ph P) are not used",
            "a": "async events (ph b/e/n) are not used"}
GPU_CATS = {"kernel": OpKind.KERNEL, "gpu_memcpy": OpKind.MEMCPY, "gpu_memset": OpKind.MEMSET,
             "memcpy": OpKind.MEMCPY, "memset": OpKind.MEMSET, "concurrent kernel": OpKind.KERNEL}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver", "hip_runtime"}
HOST_CATS = {"cpu_op", "operator", "python_function", "user_annotation", "cpu_instant_event"}
#: drop reasons of X-event categories the reader knows it does not use (others: "unsupported
#: category 'CAT'")
DROP_CAT = {"overhead": "CUPTI/driver overhead records (e.g. 'Command Buffer Full': a launch "
                        "waited for room in the driver's command buffer) are not used"}


def drop_cat_reason(cat: str) -> str:
    """The accounting's drop reason of an X event of category ``cat``."""
    return DROP_CAT.get(str(cat).lower(), f"unsupported category '{cat}'")


FILE_RANK = [re.compile(p) for p in (r"rank[-_]?(\d+)", r"worker[-_]?(\d+)", r"_r(\d+)[._]",
                                      r"(?:^|[^\d])(\d+)\.(?:pt\.)?trace\.json")]


# ---------------------------------------------------------------- per-rank result
@dataclass
class RankPart:
    """One rank's parsed columns with local ids (lanes, names, ops are file-local)."""

    path: str
    rank: int
    rank_source: str
    world_size: int | None
    backend: str | None
    pg_config: list[dict]
    devices: dict[int, dict]
    strings: list[str]
    lanes: list[tuple[int, int, int, int, str]]  # (lane_kind, device, native_id, pid, name)
    ops: dict[str, np.ndarray]
    edges: dict[str, np.ndarray]
    ranges: dict[str, np.ndarray]
    memory: dict[str, np.ndarray]
    comm: dict[str, Any]  # per collective op: local op index, group name, seq, ...
    accounting: dict[str, Any]
    window_ns: tuple[int, int] | None = None
    hostname: str | None = None
    capture: dict[str, Any] | None = None  # the file's ``retimeCapture`` block
    export_rank_parts: list[RankPart] = field(default_factory=list)
    #: an exported file's ``retimeExport`` block (groups, edges by op_id, collectives), on
    #: the head part that holds its ``export_rank_parts``
    export_block: dict[str, Any] | None = None


# host event codes
H_RUNTIME, H_CPU, H_ANNOT, H_GLOO = 0, 1, 2, 3
# category codes of X events (GPU codes equal their OpKind)
C_KERNEL, C_MEMCPY, C_MEMSET = int(OpKind.KERNEL), int(OpKind.MEMCPY), int(OpKind.MEMSET)
C_RUNTIME, C_CPU, C_ANNOT, C_TRACE, C_OTHER = 10, 11, 12, 20, 30
CAT_CODE = {**{c: int(k) for c, k in GPU_CATS.items()},
             **{c: C_RUNTIME for c in RUNTIME_CATS},
             **{c: C_CPU for c in HOST_CATS if c != "user_annotation"},
             "user_annotation": C_ANNOT, "trace": C_TRACE}


#: rank source of a rank read from a bare number before ``.trace.json`` (the last FILE_RANK
#: pattern): it tells the files of one ingest apart, but a lone file's number is as often a
#: repetition, iteration or timestamp (``rep1.pt.trace.json``), so a lone file keeps rank 0
BARE_NUMBER_SOURCE = "file name (bare number)"


def rank_from_name(path: Path) -> int | None:
    return rank_and_source_from_name(path)[0]


def rank_and_source_from_name(path: Path) -> tuple[int | None, str]:
    """The rank a file's name tells, and how: "file name" (rank-N, worker-N, _rN) or
    :data:`BARE_NUMBER_SOURCE` (only a number before ``.trace.json``)."""
    for i, pat in enumerate(FILE_RANK):
        m = pat.search(path.name)
        if m:
            return int(m.group(1)), ("file name" if i < len(FILE_RANK) - 1
                                     else BARE_NUMBER_SOURCE)
    return None, ""


def as_str(x: Any) -> str:
    return x if isinstance(x, str) else ("" if x is None else str(x))
