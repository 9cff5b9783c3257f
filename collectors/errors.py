"""The one exception tree of retime.

Every error a user can cause derives from :class:`RetimeError`. Messages carry the bad
value, where it was (file, event index, rank) and how to fix it. The CLI turns a
``RetimeError`` into one line on stderr and exit code 2, in one place (``retime.cli``).
"""

from __future__ import annotations

__all__ = [
    "RetimeError",
    "TraceFormatError",
    "TraceValidationError",
    "ReplayError",
    "PolicyError",
    "ConfigError",
]


class RetimeError(Exception):
    """Base class for errors caused by user input (bad files, bad options)."""


class TraceFormatError(RetimeError):
    """An input file cannot be read as the format it claims to be."""


class TraceValidationError(RetimeError):
    """A Trace's tables violate the schema (wrong columns, dtypes or references)."""


class ReplayError(RetimeError):
    """A trace cannot be replayed (dependency cycle, dangling edge, ...)."""


class PolicyError(RetimeError):
    """A what-if policy or scenario is invalid or cannot apply to this trace."""


class ConfigError(RetimeError):
    """An impossible model / hardware / parallelism configuration."""
