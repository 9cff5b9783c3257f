"""The summary table of ``bench/scale.py``: per local mode (ingest, analyze, replay, report),
wall / CPU / peak RSS at each N, the growth exponents in N, and issue 30's targets beside
them, each said met or not met.

Issue 30's done-when (at N = 128 on this 2-core machine; exponents from 8 to 128):

- ingest: at least 0.7 GB/s of JSON whole-process (wall), peak RSS at most 1.5 GB;
- analyze and report: each at most 15 s, peak RSS at most 2 GB;
- replay: at most 2x the analyze time, peak RSS at most 3 GB;
- every mode: peak memory exponent at most 0.3, time exponent at most 1.1.

Time targets are judged on wall time, as the issue states them, and also on CPU time (the
whole process tree's): on a host shared with other work the wall time measures the load
as much as the code, so a row says "met on CPU only" when only the CPU time meets it.
Exponents are least-squares slopes of log(value) on log(N) over every N of the run; the
time exponent is judged on CPU time for the same reason (the wall one is printed beside).
"""

from __future__ import annotations

import math

import numpy as np

#: (label in the bench's results, short name)
MODES = (("ingest (streamed)", "ingest"), ("analyze", "analyze"),
         ("replay (identity)", "replay"), ("report -o X.html", "report"))
TARGET_N = 128
EXP_TIME, EXP_MEM = 1.1, 0.3
INGEST_GBPS, INGEST_GB = 0.7, 1.5
TIME_S = {"analyze": 15.0, "report": 15.0}
MEM_GB = {"ingest": INGEST_GB, "analyze": 2.0, "report": 2.0, "replay": 3.0}
REPLAY_X = 2.0


def exponent(xs: list[int], ys: list[float]) -> float:
    """Least-squares slope of log(y) on log(N) (nan with fewer than two N)."""
    if len(xs) < 2:
        return math.nan
    lx, ly = np.log(np.asarray(xs, float)), np.log(np.maximum(np.asarray(ys, float), 1e-9))
    return float(np.polyfit(lx, ly, 1)[0])


def _verdict(wall_ok: bool, cpu_ok: bool) -> str:
    return "met" if wall_ok else "met on CPU only" if cpu_ok else "NOT met"


def _ok(v: float, limit: float, *, at_least: bool = False) -> bool:
    return (v >= limit) if at_least else (v <= limit)


def targets(mode: str, at: dict[str, dict], gb: float | None) -> list[str]:
    """The absolute targets of ``mode`` at N = 128 (``at``: every mode's row there; ``gb``:
    the JSON bytes of that N), each with its figure and verdict."""
    r = at[mode]
    out = []
    if mode == "ingest" and gb:
        w, c = gb / r["wall_s"], 2 * gb / r["cpu_s"]
        out.append(f">= {INGEST_GBPS} GB/s: {w:.2f} GB/s wall (CPU bound on 2 cores "
                   f"{c:.2f}) {_verdict(_ok(w, INGEST_GBPS, at_least=True), _ok(c, INGEST_GBPS, at_least=True))}")
    if mode in TIME_S:
        lim = TIME_S[mode]
        out.append(f"<= {lim:.0f} s: wall {r['wall_s']:.1f} / CPU {r['cpu_s']:.1f} s "
                   f"{_verdict(_ok(r['wall_s'], lim), _ok(r['cpu_s'], lim))}")
    if mode == "replay" and "analyze" in at:
        a = at["analyze"]
        xw, xc = r["wall_s"] / a["wall_s"], r["cpu_s"] / a["cpu_s"]
        out.append(f"<= {REPLAY_X:.0f}x analyze: wall {xw:.2f}x / CPU {xc:.2f}x "
                   f"{_verdict(_ok(xw, REPLAY_X), _ok(xc, REPLAY_X))}")
    if mode in MEM_GB:
        lim = MEM_GB[mode]
        out.append(f"<= {lim} GB: {r['rss_gb']:.2f} GB "
                   f"{'met' if _ok(r['rss_gb'], lim) else 'NOT met'}")
    return out


def summary(results: dict[str, list[tuple[int, dict]]], gb_of: dict[int, float]) -> list[str]:
    """The table's lines. ``results``: the bench's rows by label, each a list of (N, row);
    ``gb_of``: GB of JSON per N."""
    rows = {short: [(n, r) for n, r in results.get(label, []) if not r.get("error")]
            for label, short in MODES}
    ns = sorted({n for xs in rows.values() for n, _ in xs})
    if not ns:
        return []
    lines = [f"summary: per mode, wall / CPU s / peak RSS GB (whole process tree) at N = "
             f"{', '.join(map(str, ns))}; growth exponents in N (time judged on CPU, wall "
             f"beside it); issue 30's targets at N = {TARGET_N} (time: wall, and CPU)"]
    head = f"  {'mode':<8}" + "".join(f" | {'N=' + str(n):<20}" for n in ns)
    lines.append(head + f" | {'exp. time CPU (wall)':<21} | {'exp. peak RSS':<13} | targets")
    at = {m: dict(xs)[TARGET_N] for m, xs in rows.items() if TARGET_N in dict(xs)}
    for mode, xs in rows.items():
        by = dict(xs)
        cells = []
        for n in ns:
            r = by.get(n)
            cells.append(f"{r['wall_s']:.1f} / {r['cpu_s']:.1f} / {r['rss_gb']:.2f}" if r
                         else "-")
        if not xs:
            lines.append(f"  {mode:<8}" + "".join(f" | {c:<20}" for c in cells)
                         + " | (not run)")
            continue
        xn = [n for n, _ in xs]
        et = exponent(xn, [r["cpu_s"] for _, r in xs])
        ew = exponent(xn, [r["wall_s"] for _, r in xs])
        em = exponent(xn, [r["rss_gb"] for _, r in xs])
        if math.isnan(et):
            et_s, em_s = "- (one N)", "- (one N)"
        else:
            # 3 decimals: a judged value must not print as its limit (0.304 is not 0.30)
            et_s = f"{et:.3f} ({ew:.2f}) " + ("met" if et <= EXP_TIME else "NOT met")
            em_s = f"{em:.3f} " + ("met" if em <= EXP_MEM else "NOT met")
        tg = targets(mode, at, gb_of.get(TARGET_N)) if mode in at else [
            f"(N = {TARGET_N} not in this run)"]
        lines.append(f"  {mode:<8}" + "".join(f" | {c:<20}" for c in cells)
                     + f" | {et_s:<21} | {em_s:<13} | " + "; ".join(tg))
    span = f"{ns[0]} to {ns[-1]}"
    lines.append(f"  exponent targets: time <= {EXP_TIME}, peak RSS <= {EXP_MEM} (issue: from 8 "
                 f"to 128; this run: {span})")
    return lines
