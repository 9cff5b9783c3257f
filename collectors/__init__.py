"""Collectors: everything that produces a :class:`Trace` (model, store, readers, synth)."""

from .enums import CommOp, EdgeKind, LaneKind, OpKind, Phase
from .errors import (
                     ConfigError,
                     PolicyError,
                     ReplayError,
                     RetimeError,
                     TraceFormatError,
                     TraceValidationError,
)
from .trace import SCHEMA_VERSION, StringTable, Trace, read_trace

__all__ = [
    "CommOp", "EdgeKind", "LaneKind", "OpKind", "Phase",
    "ConfigError", "PolicyError", "ReplayError", "RetimeError", "TraceFormatError",
    "TraceValidationError",
    "SCHEMA_VERSION", "StringTable", "Trace", "read_trace",
]
