"""Writing output files atomically: a reader (or a crash) never sees a half-written file."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_output", "read_toml"]


@contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write; on success it replaces ``path``, on
    any error it is removed and ``path`` is left as it was (missing parent folders are
    created first)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_toml(path: str | Path, what: str, hint: str = "", error: type | None = None) -> dict:
    """A TOML file's tables; an unreadable file or invalid TOML raises ``error`` (a
    RetimeError class, ConfigError by default) naming the file, ``what`` it is meant to be
    and, for invalid TOML, ``hint`` on how to fix it."""
    import tomllib

    from .errors import ConfigError

    err = error or ConfigError
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise err(f"{p}: cannot read {what} ({exc.strerror}); check the path") from exc
    except tomllib.TOMLDecodeError as exc:
        raise err(f"{p}: not valid TOML ({exc})" + (f"; {hint}" if hint else "")) from exc

