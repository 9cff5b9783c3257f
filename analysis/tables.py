"""Tables for people: headers in words with units, sensible rounding, long tables cut to the
top N with a count of the rest, kernel names shortened with the full name kept.

A :class:`Table` holds formatted cells (strings) plus, per cell, an optional full text (the
HTML report shows it on hover) and, when rows were cut, the whole frame to be written as a
CSV beside the report (:attr:`Table.csv_name`). :func:`people_table` builds one from a
DataFrame and a list of :class:`Column` specs. Times are shown in one unit per column,
chosen from the values shown (ns, µs, ms or s, named in the header).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["Column", "Table", "people_table", "short_name", "fmt_ns", "fmt_pct", "fmt_bytes",
           "fmt_count", "fmt_num", "time_unit", "ranks_label"]

_UNITS = (("s", 1e9), ("ms", 1e6), ("µs", 1e3), ("ns", 1.0))


def _nan(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, (float, np.floating)) and math.isnan(v))


def fmt_num(v: float, sig: int = 4) -> str:
    """``v`` with about ``sig`` significant digits and thousands separators
    (``19.88``, ``0.512``, ``1,235``)."""
    if _nan(v):
        return "n/a"
    v = float(v)
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 10 ** (sig - 1) or v.is_integer():
        return f"{v:,.0f}"
    digits = max(sig - 1 - int(math.floor(math.log10(a))), 0)
    txt = f"{v:,.{min(digits, 6)}f}"
    return txt.rstrip("0").rstrip(".") if "." in txt else txt


def time_unit(values_ns: Any) -> tuple[str, float]:
    """(unit name, ns per unit) that shows ``values_ns`` best: the largest unit in which the
    median of the non-zero magnitudes is at least 1, one larger when the largest value
    would need four digits or more before the point."""
    a = np.abs(np.asarray(values_ns, dtype=float))
    a = a[np.isfinite(a) & (a > 0)]
    if len(a) == 0:
        return "ms", 1e6
    med = float(np.median(a))
    for i, (name, scale) in enumerate(_UNITS):
        if med >= scale:
            # the largest value should not need more than 3 digits before the point
            if i > 0 and a.max() >= 1e3 * scale:
                return _UNITS[i - 1]
            return name, scale
    return "ns", 1.0


def fmt_ns(ns: Any) -> str:
    """A duration with its unit: ``12.35 ms``, ``45.6 µs``, ``1.234 s``, ``n/a``."""
    if _nan(ns):
        return "n/a"
    name, scale = time_unit([ns]) if ns else ("ns", 1.0)
    return f"{fmt_num(float(ns) / scale)} {name}"


def fmt_pct(frac: Any, digits: int = 1) -> str:
    """A fraction as a percentage (``0.1234`` -> ``12.3%``)."""
    if _nan(frac):
        return "n/a"
    return f"{100 * float(frac):.{digits}f}%"


def fmt_bytes(b: Any) -> str:
    """Bytes in binary units (``1.50 GiB``); ``n/a`` when unknown (NaN or negative)."""
    if _nan(b) or float(b) < 0:
        return "n/a"
    b = float(b)
    for unit, s in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= s:
            return f"{b / s:.2f} {unit}"
    return f"{b:.0f} B"


def fmt_count(n: Any) -> str:
    return "n/a" if _nan(n) else f"{int(n):,}"


def plural(n: int, word: str) -> str:
    """``1 step``, ``3 steps``, ``1,024 groups`` (a word whose plural adds an s)."""
    return f"{int(n):,} {word}" + ("" if int(n) == 1 else "s")


def ranks_label(ranks: Any, limit: int = 6) -> str:
    """Ranks as compact ranges: ``0-7, 16-23``; long lists end with the count."""
    r = sorted({int(x) for x in ranks})
    if not r:
        return "none"
    runs: list[tuple[int, int]] = []
    lo = hi = r[0]
    for x in r[1:]:
        if x == hi + 1:
            hi = x
        else:
            runs.append((lo, hi))
            lo = hi = x
    runs.append((lo, hi))
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs]
    if len(parts) > limit:
        return ", ".join(parts[:limit]) + f", … ({len(r)} ranks)"
    return ", ".join(parts)


# ------------------------------------------------------------------ kernel names
_ANON = re.compile(r"\(anonymous namespace\)::")
_NS = re.compile(r"\b[A-Za-z_]\w*::(?!\s)")
_VOID = re.compile(r"^\s*(void|__global__ void)\s+")
_LAMBDA = re.compile(r"(::)?\{lambda\([^{}]*?\)#\d+\}")
_OPERATOR = re.compile(r"(::)?operator\(\)\(\)( const)?")
_PARAMS = re.compile(r"\((?:[^()]*)\)")


def _cut_params(s: str) -> str:
    """Drop a C++ parameter list: everything from the first '(' outside template brackets."""
    depth = 0
    for i, ch in enumerate(s):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif ch == "(" and depth == 0 and i > 0:
            return s[:i].rstrip()
    return s


def _fold_templates(s: str, keep_depth: int) -> str:
    """Replace template arguments nested deeper than ``keep_depth`` with ``…``."""
    out = []
    depth = 0
    for ch in s:
        if ch == "<":
            depth += 1
            if depth <= keep_depth + 1:
                out.append(ch)
            if depth == keep_depth + 1:
                out.append("…")
        elif ch == ">":
            if depth <= keep_depth + 1:
                out.append(ch)
            depth = max(depth - 1, 0)
        elif depth <= keep_depth:
            out.append(ch)
    return "".join(out)


def short_name(name: str, limit: int = 64) -> str:
    """A kernel or op name a person can read. Names that fit in ``limit`` characters are
    returned as they are; longer ones lose ``void``, the parameter list, lambdas and their
    ``operator()`` chains (``sqrt_kernel_cuda(...)::{lambda()#2}::...`` reads
    ``sqrt_kernel_cuda``) and namespaces, then template arguments are folded (``<…>``) from
    the inside out, and what is still too long is cut with an ellipsis."""
    s = " ".join(str(name).split())
    if len(s) <= limit:
        return s
    s = _VOID.sub("", _ANON.sub("", s))
    s = _cut_params(s)
    s = _OPERATOR.sub("", _LAMBDA.sub("", s))
    prev = None
    while prev != s:  # parameter lists of functions named inside template arguments
        prev, s = s, _PARAMS.sub("", s)
    s = _NS.sub("", s)
    s = re.sub(r"\s*>", ">", s).replace("< ", "<")
    for depth in (2, 1):
        if len(s) <= limit:
            break
        s = _fold_templates(s, depth)
    return s if len(s) <= limit else s[:limit - 1].rstrip(", ") + "…"


# ------------------------------------------------------------------ tables
@dataclass(frozen=True)
class Column:
    """One table column: ``key`` in the frame, ``header`` in words; ``kind`` picks the
    formatting: ``time`` (ns values; unit chosen per column and added to the header),
    ``dtime`` (a signed change of time), ``pct`` (fractions), ``bytes``, ``count``, ``num``,
    ``gbps``, ``name`` (shortened, full
    text on hover), ``text``, or a callable value -> str."""

    key: str
    header: str
    kind: str | Callable[[Any], str] = "num"


@dataclass
class Table:
    """A formatted table. ``titles[i][j]`` is the full text of cell (i, j) or None;
    ``numeric[j]`` right-aligns column j; ``note`` says what was left out and where the
    whole table is (``{csv}`` is replaced by the CSV's path when the report is written)."""

    caption: str
    header: list[str]
    rows: list[list[str]]
    titles: list[list[str | None]] = field(default_factory=list)
    numeric: list[bool] = field(default_factory=list)
    note: str = ""
    csv_name: str | None = None
    csv_frame: pd.DataFrame | None = None
    total_rows: int = 0


def _fmt_col(kind: Any, values: pd.Series, unit: tuple[str, float] | None = None
             ) -> tuple[list[str], str, list[str | None] | None]:
    """(cells, header suffix, hover titles) of one column (``unit``: for time columns, the
    unit to use instead of the column's own)."""
    vals = values.tolist()
    if callable(kind):
        return [kind(v) for v in vals], "", None
    if kind in ("time", "dtime"):
        arr = values.to_numpy(dtype=float, na_value=np.nan)
        unit, scale = unit or time_unit(arr)
        cells = _fixed(arr / scale)
        if kind == "dtime":  # a change: signed
            cells = [("+" + c if v > 0 else c) for c, v in zip(cells, arr)]
        return cells, f" ({unit})", None
    if kind == "pct":
        return [fmt_pct(v) for v in vals], "", None
    if kind == "bytes":
        return [fmt_bytes(v) for v in vals], "", None
    if kind == "count":
        return [fmt_count(v) for v in vals], "", None
    if kind == "gbps":
        return [("n/a" if _nan(v) else fmt_num(float(v), 3)) for v in vals], " (GB/s)", None
    if kind == "name":
        full = [str(v) for v in vals]
        short = [short_name(v) for v in full]
        return short, "", [f if f != s else None for f, s in zip(full, short)]
    if kind == "text":
        return [str(v) for v in vals], "", None
    return [fmt_num(v) if not isinstance(v, str) else v for v in vals], "", None


def _fixed(v: np.ndarray) -> list[str]:
    """Numbers of one column with the same decimals (from the largest: 4 significant
    digits for it, at most 3 decimals), thousands separated."""
    fin = np.abs(v[np.isfinite(v)])
    top = float(fin.max()) if len(fin) else 0.0
    if 0 < top < 0.01:  # a column of tiny values: significant digits per cell
        return ["n/a" if not np.isfinite(x) else fmt_num(x, 3) for x in v]
    dec = 0 if top >= 1000 else 1 if top >= 100 else 2 if top >= 10 else 3
    return ["n/a" if not np.isfinite(x) else "0" if x == 0 else f"{x:,.{dec}f}" for x in v]


def people_table(df: pd.DataFrame, columns: list[Column], *, caption: str, top: int | None = None,
                 what: str = "rows", csv_name: str | None = None, csv_frame: pd.DataFrame | None
                 = None, same_unit: bool = False, cut_word: str = "Top") -> Table:
    """Format ``df`` (already in display order) for people.

    Parameters
    ----------
    columns : which columns, with headers in words and their formatting
    top : keep the first ``top`` rows; the note counts the rest (``what`` names them)
    cut_word : the note's first word, ``Top`` for a ranking, ``First`` for rows in their
        natural order (steps by number)
    csv_name : file name (no suffix) of the whole table, written beside the report when
        rows were cut; ``csv_frame`` is what goes there (default ``df``)
    same_unit : every time column in one unit (parts of one whole read best that way)
    """
    n = len(df)
    shown = df.head(top) if top is not None else df
    header: list[str] = []
    cols: list[list[str]] = []
    titles: list[list[str | None] | None] = []
    numeric: list[bool] = []
    unit = None
    if same_unit and len(shown):
        tcols = [shown[c.key].to_numpy(dtype=float, na_value=np.nan) for c in columns
                 if c.kind in ("time", "dtime")]
        unit = time_unit([np.nanmax(np.abs(np.concatenate(tcols)))]) if tcols else None
    for c in columns:
        cells, suffix, hov = (_fmt_col(c.kind, shown[c.key], unit) if len(shown)
                              else ([], "", None))
        if c.kind in ("time", "dtime") and not len(shown):
            suffix = " (ms)"
        header.append(c.header + suffix)
        cols.append(cells)
        titles.append(hov)
        numeric.append(c.kind not in ("name", "text"))
    rows = [list(r) for r in zip(*cols)] if cols and len(shown) else []
    tt = [[(t[i] if t is not None else None) for t in titles] for i in range(len(rows))]
    cut = top is not None and n > top
    note = ""
    if cut:
        note = f"{cut_word} {top} of {n:,} {what}"
        if csv_name:
            note += "; all of them in {csv}"
        note += "."
    return Table(caption=caption, header=header, rows=rows, titles=tt, numeric=numeric,
                 note=note, csv_name=csv_name if cut else None,
                 csv_frame=(csv_frame if csv_frame is not None else df) if cut else None,
                 total_rows=n)
