"""Integer enums for the kinds stored in Trace tables (kernels never see strings)."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["OpKind", "CommOp", "EdgeKind", "LaneKind", "Phase"]


class OpKind(IntEnum):
    """What a row of ``ops`` is."""

    KERNEL = 0  # GPU compute kernel
    MEMCPY = 1  # GPU memcpy (any direction)
    MEMSET = 2  # GPU memset
    COLLECTIVE = 3  # collective communication kernel / op (NCCL, RCCL, gloo, modeled)
    P2P = 4  # point-to-point send or recv
    CPU_OP = 5  # host-side operator (aten op, python function, gloo op on CPU)
    RUNTIME = 6  # CUDA/HIP runtime or driver call
    COMPUTE = 7  # op-level compute op (forward/backward/optimizer of a timeline)
    SYNC = 8  # GPU-side synchronization marker (event sync / stream wait on a stream)


class CommOp(IntEnum):
    """Communication primitive of a collective or p2p op (``NONE`` for others)."""

    NONE = 0
    ALL_REDUCE = 1
    ALL_GATHER = 2
    REDUCE_SCATTER = 3
    ALL_TO_ALL = 4
    BROADCAST = 5
    REDUCE = 6
    SEND = 7
    RECV = 8
    SEND_RECV = 9
    BARRIER = 10
    GATHER = 11
    SCATTER = 12
    UNKNOWN = 13


class EdgeKind(IntEnum):
    """Why ``dst`` cannot start before ``src`` ends (+ ``lag_ns``)."""

    LAUNCH = 0  # runtime launch call -> the GPU op it launched
    SYNC = 1  # event record / stream or device synchronize
    DATA = 2  # data dependency (op-level timelines, modeled runs)
    COLLECTIVE = 3  # cross-rank collective membership (optional; coll_id is primary)
    P2P = 4  # send -> matching recv
    HOST_ORDER = 5  # consecutive ops on one CPU thread, lag = measured gap


class LaneKind(IntEnum):
    """What executes the ops of a lane (one FIFO queue)."""

    CPU_THREAD = 0
    GPU_STREAM = 1
    OP_STREAM = 2  # op-level timeline stream (compute or comm of one rank)


class Phase(IntEnum):
    """Training phase of an op (``UNKNOWN`` = -1 when not attributable)."""

    UNKNOWN = -1
    FWD = 0
    BWD = 1
    OPT = 2
    OTHER = 3
