"""Collectors: everything that produces a :class:`Trace` (model, store, readers, synth).
"""

from __future__ import annotations

import importlib

from .enums import CommOp, EdgeKind, LaneKind, OpKind, Phase
from .errors import (
                     ConfigError,
                     PolicyError,
                     ReplayError,
                     RetimeError,
                     TraceFormatError,
                     TraceValidationError,
)

__all__ = [
    "CommOp", "EdgeKind", "LaneKind", "OpKind", "Phase",
    "ConfigError", "PolicyError", "ReplayError", "RetimeError", "TraceFormatError",
    "TraceValidationError",
    "SCHEMA_VERSION", "StringTable", "Trace", "read_trace",
]

# Public names are imported on first use (PEP 562), so importing the package is cheap
# (`retime --help` must not load pandas or numba).
_LAZY = {
    "SCHEMA_VERSION": ".trace",
    "StringTable": ".trace",
    "Trace": ".trace",
    "read_trace": ".trace",
}


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(mod, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
