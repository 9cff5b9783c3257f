"""Known drift in real Kineto files, decoded where the meaning is clear (and counted).

ROCm/HIP runtime events write integer args as strings (``"stream": "0x0"``,
``"correlation": "22"``, ``"size": "2560"``), some exporters write ``ts``/``dur`` as strings
(``"12.5"``). Each such value is turned into the number it spells (decimal, or hexadecimal
with ``0x``) and counted per field in the rank's accounting (``coerced``); a value that
spells no number is refused, naming the event and the field.

A leaf of the reader pipeline next to :mod:`.schema` (``links`` uses it).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..errors import TraceFormatError
from .schema import INT_ARGS, Args

__all__ = ["parse_int", "coerce_args", "coerce_time", "invalid_field"]


def parse_int(v: str) -> int:
    """The integer a string spells: decimal, ``0x`` hexadecimal, or a whole float
    (``"12.0"``); ValueError otherwise."""
    s = v.strip()
    neg = s.startswith("-")
    body = s[1:] if neg else s
    if body[:2].lower() == "0x":
        x = int(body[2:], 16)
    else:
        try:
            x = int(body)
        except ValueError:
            f = float(body)
            if not f.is_integer():
                raise
            x = int(f)
    return -x if neg else x


def coerce_args(a: Args, coerced: Counter, path: Path, i: int) -> None:
    """Turn the string-typed integer fields of ``a`` into ints, in place."""
    for f, json_name in INT_ARGS.items():
        v = getattr(a, f)
        if v.__class__ is str:
            try:
                x = parse_int(v)
            except ValueError:
                raise TraceFormatError(
                    f"{path}: event {i}: field 'args.{json_name}' is invalid ({v!r} is not a "
                    "number); write it as an integer (or remove the field)") from None
            setattr(a, f, x)
            coerced[f"args.{json_name} (string)"] += 1


def coerce_time(v: str, field: str, coerced: Counter, path: Path, i: int, name) -> float:
    """A ``ts``/``dur`` written as a string, as microseconds."""
    try:
        x = float(v)
    except ValueError:
        raise TraceFormatError(
            f"{path}: event {i}: field '{field}' is invalid ({v!r} is not a number; event "
            f"'{name}'); {field} is microseconds — fix or remove the event") from None
    coerced[f"{field} (string)"] += 1
    return x


def invalid_field(path: Path, idx: int | str, fld: str, what: str) -> TraceFormatError:
    """The one-line error for an event whose field ``fld`` (``.args.stream``, ``.ts``, as in
    msgspec's path) holds a value of the wrong type (``what``)."""
    fld = fld.lstrip(".") or "?"
    if fld.startswith("args."):
        fld = "args." + INT_ARGS.get(fld[5:], fld[5:])
    hint = ("ts and dur are microseconds (numbers)" if fld in ("ts", "dur") else
            "integer args are numbers (or strings spelling one)" if fld.startswith("args.")
            else "see the Chrome trace event format")
    return TraceFormatError(f"{path}: event {idx}: field '{fld}' is invalid ({what}); {hint} — "
                            "fix or remove that event")
