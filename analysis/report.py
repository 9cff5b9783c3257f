"""Reports: one self-contained HTML file (or a PDF with the same content) per run.

:func:`build_report` computes every analysis once and keeps plain data: a summary, the top
findings in words, and sections of tables (lists of strings) and figures. :func:`write_html`
renders it with Jinja2 (autoescaping on: every name from a trace is untrusted text, so
``void cutlass::Kernel<...>`` shows literally and ``<script>`` in a kernel name is inert),
with inline CSS and figures embedded as base64 PNG, so the file needs no network.
:func:`write_pdf` writes the same summary, findings, tables and figures through
matplotlib's ``PdfPages``.
"""

from __future__ import annotations

import base64
import datetime as _dt
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from retime.collectors.errors import RetimeError

from . import plots
from ._util import as_trace
from .breakdown import PARTS, breakdown, summarize_breakdown
from .comm import collectives, comm_summary, rank_wait
from .compare import compare
from .critical_path import attribute_critical_path, critical_path
from .efficiency import efficiency, job_efficiency
from .kernels import class_stats, kernel_stats
from .memory import memory_timeline, peak_memory
from .pipeline import bubbles, stage_bubbles

__all__ = ["Report", "Section", "build_report", "render_html", "write_html", "write_pdf", "write_report",
           "fmt_ns", "fmt_pct"]

_TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
_MAX_TIMELINE_OPS = 20000
_MAX_NAME = 240  # long C++ template names are cut (with an ellipsis) in tables


def fmt_ns(ns: float) -> str:
    """Human duration: ``12.346 ms``, ``45.6 us``, ``1.234 s``."""
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "n/a"
    a = abs(ns)
    if a >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if a >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if a >= 1e3:
        return f"{ns / 1e3:.1f} us"
    return f"{ns:.0f} ns"


def fmt_pct(frac: float) -> str:
    if frac is None or (isinstance(frac, float) and math.isnan(frac)):
        return "n/a"
    return f"{100 * frac:.1f}%"


def _fmt_bytes(b: float) -> str:
    if b is None or (isinstance(b, float) and math.isnan(b)) or b < 0:
        return "n/a"
    for unit, s in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= s:
            return f"{b / s:.2f} {unit}"
    return f"{b:.0f} B"


@dataclass
class Section:
    """One report section: tables as (caption, header, rows of strings) and figures."""

    title: str
    text: str = ""
    tables: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)
    figures: list[tuple[str, Figure]] = field(default_factory=list)


@dataclass
class Report:
    title: str
    summary: list[tuple[str, str]]
    findings: list[str]
    sections: list[Section]
    generated: str = ""


def _table(df: pd.DataFrame, fmts: dict[str, Any] | None = None, limit: int = 20
           ) -> tuple[list[str], list[list[str]]]:
    fmts = fmts or {}
    df = df.head(limit)
    header = [str(c) for c in df.columns]
    rows = []
    for rec in df.itertuples(index=False):
        row = []
        for c, v in zip(df.columns, rec):
            f = fmts.get(c)
            if f is not None:
                row.append(f(v))
            elif isinstance(v, (float, np.floating)):
                row.append("n/a" if math.isnan(v) else f"{v:,.3g}")
            elif isinstance(v, (int, np.integer)):
                row.append(f"{int(v):,}")
            else:
                txt = str(v)
                row.append(txt if len(txt) <= _MAX_NAME else txt[:_MAX_NAME - 1] + "\u2026")
        rows.append(row)
    return header, rows


def _findings(bsum: pd.DataFrame, step_ns: float, ks: pd.DataFrame, cls: pd.DataFrame,
              rw: pd.DataFrame, ncoll: int, cp: pd.DataFrame, cp_by_kind: pd.DataFrame,
              steps: int) -> list[tuple[float, str]]:
    """Candidate findings as (weight = fraction of the step it concerns, sentence)."""
    out: list[tuple[float, str]] = []
    if len(bsum):
        mean = bsum[[*PARTS, "step_ns"]].mean()
        st = float(mean["step_ns"]) or 1.0
        label = {"compute_ns": "Compute (with no communication running)",
                 "overlapped_comm_ns": "Communication overlapped with compute",
                 "exposed_comm_ns": "Exposed communication (nothing hides it)",
                 "memcpy_ns": "Memory copies alone on the device",
                 "host_bound_ns": "Host-bound time (device idle while the CPU works)",
                 "idle_ns": "Idle time (nothing runs on the rank)"}
        top = max(PARTS, key=lambda p: mean[p])
        out.append((float(mean[top]) / st + 1.0,
                    f"{label[top]} dominates: {fmt_pct(mean[top] / st)} of the mean per-rank "
                    f"step ({fmt_ns(mean[top])} of {fmt_ns(st)})."))
        for p in ("exposed_comm_ns", "host_bound_ns", "idle_ns", "memcpy_ns"):
            if p != top and mean[p] / st > 0.05:
                extra = ""
                if p == "exposed_comm_ns":
                    tot = mean["exposed_comm_ns"] + mean["overlapped_comm_ns"]
                    extra = (f"; only {fmt_pct(mean['overlapped_comm_ns'] / tot)} of the "
                             f"{fmt_ns(tot)} of communication is overlapped") if tot else ""
                out.append((float(mean[p]) / st,
                            f"{label[p]} costs {fmt_ns(mean[p])} per step "
                            f"({fmt_pct(mean[p] / st)}){extra}."))
        if len(bsum) > 1:
            hi, lo = bsum["step_ns"].max(), bsum["step_ns"].min()
            if hi > 0 and (hi - lo) / hi > 0.03:
                r = int(bsum.loc[bsum["step_ns"].idxmax(), "rank"])
                out.append(((hi - lo) / hi,
                            f"Ranks are imbalanced: rank {r} is slowest at {fmt_ns(hi)} per "
                            f"step, {fmt_pct((hi - lo) / hi)} above the fastest ({fmt_ns(lo)})."))
    if len(ks):
        k = ks.iloc[0]
        gem = cls.set_index("kernel_class")["share"]
        out.append((float(k["share"]) * 0.5,
                    f"The top kernel \u201c{str(k['name'])[:120]}\u201d ({k['kernel_class']}) "
                    f"takes {fmt_pct(k['share'])} of device time ({int(k['count']):,} calls, "
                    f"mean {fmt_ns(k['mean_ns'])}); by class, GEMM is {fmt_pct(gem.get('GEMM', 0))}"
                    f", communication {fmt_pct(gem.get('communication', 0))}, elementwise "
                    f"{fmt_pct(gem.get('elementwise', 0))}."))
    if len(rw) and rw["wait_ns"].sum() > 0 and step_ns:
        per_step = rw["wait_ns"].sum() / max(steps, 1) / max(len(rw), 1)
        r = rw.sort_values("last_arrivals", ascending=False).iloc[0]
        out.append((per_step / step_ns,
                    f"Ranks wait {fmt_ns(per_step)} per step on average in collectives for late "
                    f"arrivals; rank {int(r['rank'])} arrives last in {int(r['last_arrivals'])} "
                    f"of {ncoll} collective instances."))
    if len(cp_by_kind) and cp.attrs.get("length_ns"):
        parts = ", ".join(f"{row.kind} {fmt_pct(row.share)}" for row in cp_by_kind.head(3).itertuples())
        out.append((0.3, f"The critical path through the whole trace ({steps} step(s), span "
                         f"{fmt_ns(cp.attrs['span_ns'])}) is {fmt_ns(cp.attrs['length_ns'])} "
                         f"long ({len(cp):,} ops): {parts}."))
    return out


def _timeline_window(t, cp: pd.DataFrame) -> tuple[int, int]:
    o = t.ops
    s = o["start_ns"].to_numpy()
    e = s + o["dur_ns"].to_numpy()
    lo, hi = int(s.min()), int(e.max())
    if len(o) > _MAX_TIMELINE_OPS:
        # centre a window on the critical path's last part, shrunk until few ops remain
        end = int(cp["start_ns"].iloc[-1] + cp["dur_ns"].iloc[-1]) if len(cp) else hi
        srt = np.sort(s)
        width = hi - lo
        while width > 1000:
            a = end - width
            cnt = np.searchsorted(srt, end) - np.searchsorted(srt, a)
            if cnt <= _MAX_TIMELINE_OPS:
                break
            width //= 2
        lo, hi = max(lo, end - width), end
    return lo, hi


def build_report(x: Any, *, baseline: Any | None = None, title: str | None = None) -> Report:
    """Run every analysis on ``x`` (and ``baseline``) and assemble the report content."""
    t = as_trace(x)
    if len(t.ops) == 0:
        raise RetimeError("the trace has no ops; nothing to report (check `retime info`)")
    # a ReplayResult is converted once; only the critical path needs its crit_pred
    bd = breakdown(t)
    bsum = summarize_breakdown(bd)
    per_step = bd.groupby("step")["step_ns"].max()
    step_ns = float(per_step.mean())
    ks = kernel_stats(t, top=15)
    cls = class_stats(t)
    co = collectives(t)
    cs = comm_summary(co)
    rw = rank_wait(t)
    cp = critical_path(x)
    cp_kind = attribute_critical_path(cp, by="kind")
    cp_rank = attribute_critical_path(cp, by="rank")
    eff = efficiency(t)
    bub = bubbles(t)
    sb = stage_bubbles(bub)
    mt = memory_timeline(t)
    pm = peak_memory(t)
    je = job_efficiency(eff)
    mfu, hfu = je["mfu"], je["hfu"]
    mean_parts = bd[list(PARTS)].mean() if len(bd) else pd.Series(dtype=float)
    dominant = max(PARTS, key=lambda p: mean_parts[p]) if len(bd) else "n/a"
    fnd = _findings(bsum, step_ns, ks, cls, rw, len(co), cp, cp_kind, len(per_step))
    findings = [s for _, s in sorted(fnd, key=lambda z: -z[0])[:3]]
    src = t.meta.get("source_format") or "trace"
    summary = [
        ("Step time", fmt_ns(step_ns)),
        ("MFU", fmt_pct(mfu) if not math.isnan(mfu) else "unknown (no flops in trace)"),
        ("HFU", fmt_pct(hfu) if not math.isnan(hfu) else "unknown"),
        ("Dominant part", f"{dominant.replace('_ns', '').replace('_', ' ')} "
                          f"({fmt_pct(mean_parts[dominant] / bd['step_ns'].mean())})"
         if len(bd) else "n/a"),
        ("GPU busy", fmt_pct(bd["busy_ns"].sum() / max(bd["step_ns"].sum(), 1))),
        ("Ranks / steps", f"{bd['rank'].nunique()} / {len(per_step)}"),
        ("Critical path", fmt_ns(cp.attrs["length_ns"])),
        ("Ops", f"{len(t.ops):,} ({src})"),
    ]
    pct = {p.replace("_ns", "_frac"): fmt_pct for p in PARTS}
    nsf = {c: fmt_ns for c in ["step_ns", *PARTS, "busy_ns", "total_ns", "mean_ns", "min_ns",
                               "max_ns", "time_ns", "transfer_ns", "wait_ns", "skew_ns",
                               "mean_skew_ns", "max_skew_ns", "bubble_ns", "dur_ns",
                               "mean_dur_ns", "compute_ns", "wait_ns"]}
    fm = {**nsf, **pct, "share": fmt_pct, "cum_share": fmt_pct, "gpu_busy_frac": fmt_pct,
          "bubble_frac": fmt_pct, "ideal_bubble_frac": fmt_pct, "mfu": fmt_pct, "hfu": fmt_pct,
          "bytes": _fmt_bytes, "total_bytes": _fmt_bytes, "peak_allocated_bytes": _fmt_bytes,
          "peak_reserved_bytes": _fmt_bytes}
    secs: list[Section] = []
    s1 = Section("Step time breakdown", "Parts are disjoint interval unions; per rank they add "
                 "up to the step time exactly (mean over steps).")
    cols = ["rank", "steps", "step_ns", *PARTS, "gpu_busy_frac"]
    s1.tables.append(("Mean per-rank step breakdown", *_table(bsum[cols], fm, limit=64)))
    s1.figures.append(("Per-rank stacked breakdown", plots.plot_breakdown(bsum)))
    secs.append(s1)
    s2 = Section("Kernels", "Top device ops by total time; classes from kind and name.")
    s2.tables.append(("Top kernels", *_table(ks, fm, limit=15)))
    s2.tables.append(("Kernel classes", *_table(cls, fm)))
    s2.figures.append(("Device time by kernel class", plots.plot_kernel_classes(cls)))
    secs.append(s2)
    s3 = Section("Critical path", f"Source: {cp.attrs['source']}; length "
                 f"{fmt_ns(cp.attrs['length_ns'])} vs span {fmt_ns(cp.attrs['span_ns'])}. "
                 "WAIT rows are time between ops on the path, by the dependency waited on: "
                 "HOST_ORDER is host time between traced leaf ops (framework/Python overhead "
                 "or untraced waits), LAUNCH/SYNC are launch and synchronization delays, GAP "
                 "is idle time in a replay.")
    s3.tables.append(("Critical path by kind", *_table(cp_kind, fm)))
    s3.tables.append(("Critical path by rank", *_table(cp_rank, fm)))
    top_cp = cp.sort_values("dur_ns", ascending=False)[["op_id", "rank", "kind", "name",
                                                        "dur_ns", "wait_ns"]]
    s3.tables.append(("Longest ops on the critical path", *_table(top_cp, fm, limit=10)))
    lo, hi = _timeline_window(t, cp)
    s3.figures.append(("Timeline with the critical path outlined",
                       plots.plot_timeline(t.ops, t.lanes, window_ns=(lo, hi),
                                           critical_op_ids=cp["op_id"].to_numpy())))
    secs.append(s3)
    s4 = Section("Communication", "algbw = bytes / transfer time of the last arriver; busbw "
                 "per nccl-tests. Skew = arrival spread, wait = time members waited.")
    s4.tables.append(("Per process group and primitive", *_table(cs, fm)))
    if len(co):
        worst = co.sort_values("wait_ns", ascending=False)
        s4.tables.append(("Collectives with the most waiting", *_table(
            worst[["coll_id", "comm_op", "n_ranks", "bytes", "skew_ns", "wait_ns",
                   "transfer_ns", "busbw_gbps", "last_rank"]], fm, limit=10)))
    if len(rw):
        s4.tables.append(("Waiting per rank", *_table(rw, fm)))
    s4.figures.append(("Collective size vs bus bandwidth", plots.plot_collectives(co)))
    secs.append(s4)
    s5 = Section("Pipeline, memory and efficiency")
    s5.tables.append(("Bubble per stage", *_table(sb, fm)))
    if len(pm):
        s5.tables.append(("Peak memory per rank", *_table(pm, fm)))
    eff_r = eff.groupby("rank")[["step_ns", "hfu", "mfu"]].mean().reset_index()
    s5.tables.append(("Utilization per rank", *_table(eff_r, fm, limit=64)))
    s5.figures.append(("Bubble per stage", plots.plot_bubbles(sb)))
    s5.figures.append(("Memory", plots.plot_memory(mt, pm)))
    secs.append(s5)
    strag = _stragglers_or_none(x, t)
    if strag is not None and len(strag):
        s7 = Section("Stragglers (what-if)", "Each step replayed at ideal op durations, then "
                     "with one group at a time back at its measured durations; cost = how much "
                     "slower than ideal that group alone makes the step.")
        s7.tables.append(("Slowdown by stage, DP rank and op type",
                          *_table(strag, {"cost_pct": lambda v: f"{v:+.1f}%"}, limit=40)))
        secs.append(s7)
        grp = strag[strag["group"] != "overall"].sort_values("cost_pct", ascending=False)
        overall = float(strag.loc[strag["group"] == "overall", "cost_pct"].iloc[0])
        if len(grp) and overall > 1.0:
            g0 = grp.iloc[0]
            fnd.append((overall / 100.0,
                        f"Stragglers and slow ops cost {overall:.1f}% over an ideal replay; "
                        f"the largest single contributor is {g0['group']} {g0['key']} "
                        f"({g0['cost_pct']:+.1f}%)."))
            findings = [s for _, s in sorted(fnd, key=lambda z: -z[0])[:3]]
    if baseline is not None:
        cmp = compare(baseline, x)
        s6 = Section("Comparison with the baseline", "delta = this run - baseline.")
        s6.tables.append(("Metrics", *_table(cmp, {"delta_pct": lambda v: "n/a" if math.isnan(v)
                                                   else f"{v:+.1f}%"}, limit=64)))
        s6.figures.append(("Baseline vs this run", plots.plot_compare(cmp)))
        secs.append(s6)
        d = cmp.set_index("metric")
        if "step_ns" in d.index and not math.isnan(d.loc["step_ns", "delta_pct"]):
            findings = findings[:2] + [
                f"Against the baseline the step time changes by "
                f"{d.loc['step_ns', 'delta_pct']:+.1f}% ({fmt_ns(d.loc['step_ns', 'baseline'])}"
                f" -> {fmt_ns(d.loc['step_ns', 'candidate'])})."]
    name = title or str(t.meta.get("name") or (t.meta.get("sources") or [{}])[0].get("path", "run"))
    return Report(title=title or f"retime report: {name}", summary=summary, findings=findings,
                  sections=secs,
                  generated=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))


_MAX_STRAGGLER_OPS = 200_000  # the attribution replays the trace once per group


def _stragglers_or_none(x: Any, t) -> pd.DataFrame | None:
    """The what-if straggler table of a measured trace, or None when it does not apply
    (a replay, no replay package, a trace the analysis rejects, or a very large trace)."""
    from retime.collectors.trace import Trace

    if not isinstance(x, Trace) or t.n_ops > _MAX_STRAGGLER_OPS:
        return None
    try:
        from .stragglers import stragglers
        return stragglers(t)
    except (ImportError, RetimeError):
        return None


def _png_b64(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def render_html(report: Report) -> str:
    """The report as one self-contained HTML string (autoescaped)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(_TEMPLATE_DIR)),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    tpl = env.get_template("report.html.j2")
    sections = [{"title": s.title, "text": s.text,
                 "tables": [{"caption": c, "header": h, "rows": r} for c, h, r in s.tables],
                 "figures": [{"caption": c, "png_b64": _png_b64(f)} for c, f in s.figures]}
                for s in report.sections]
    return tpl.render(title=report.title, summary=report.summary, findings=report.findings,
                      sections=sections, generated=report.generated)


def write_html(report: Report, path: str | os.PathLike[str]) -> Path:
    from retime.collectors.fsutil import atomic_output

    p = Path(path)
    html = render_html(report)
    with atomic_output(p) as tmp:
        tmp.write_text(html, encoding="utf-8")
    return p


def _text_page(title: str, lines: list[str]) -> Figure:
    import textwrap

    fig = Figure(figsize=(8.27, 11.69))
    fig.text(0.07, 0.95, title, fontsize=15, weight="bold", va="top")
    y = 0.9
    for ln in lines:
        for w in (textwrap.wrap(ln, 95) or [""]):
            fig.text(0.07, y, w, fontsize=9, va="top", family="DejaVu Sans")
            y -= 0.018
            if y < 0.05:
                return fig
    return fig


def _table_page(section: str, caption: str, header: list[str], rows: list[list[str]]) -> Figure:
    fig = Figure(figsize=(11.69, 8.27))
    fig.text(0.04, 0.95, f"{section}: {caption}", fontsize=12, weight="bold", va="top")
    ax = fig.add_axes((0.03, 0.05, 0.94, 0.85))
    ax.set_axis_off()
    if not rows:
        ax.text(0.0, 0.9, "(no rows)", fontsize=9)
        return fig
    cells = [[c[:60] for c in r] for r in rows[:30]]
    labels = [h[:20] for h in header]
    # widths from character counts: measuring rendered text (auto_set_column_width) is slow
    chars = np.array([max([len(labels[j])] + [len(r[j]) for r in cells]) for j in
                      range(len(labels))], float)
    widths = np.maximum(chars, 4) / max(np.maximum(chars, 4).sum(), 1.0)
    tb = ax.table(cellText=cells, colLabels=labels, colWidths=list(widths), loc="upper left",
                  cellLoc="left")
    tb.auto_set_font_size(False)
    tb.set_fontsize(6.5)
    return fig


def write_pdf(report: Report, path: str | os.PathLike[str]) -> Path:
    """The report as a PDF: summary + findings page, then each section's tables and figures."""
    from matplotlib.backends.backend_pdf import PdfPages
    from retime.collectors.fsutil import atomic_output

    p = Path(path)
    lines = [f"{k}: {v}" for k, v in report.summary] + ["", "Top findings:"]
    lines += [f"{i + 1}. {f}" for i, f in enumerate(report.findings)]
    lines += ["", f"Generated {report.generated} by retime."]
    with atomic_output(p) as tmp, PdfPages(tmp) as pdf:
        pdf.savefig(_text_page(report.title, lines))
        for s in report.sections:
            for cap, h, r in s.tables:
                pdf.savefig(_table_page(s.title, cap, h, r))
            for cap, f in s.figures:
                f.suptitle(f"{s.title}: {cap}", fontsize=9)
                pdf.savefig(f)
    return p


def write_report(x: Any, path: str | os.PathLike[str], *, baseline: Any | None = None,
                 title: str | None = None) -> Path:
    """Build and write the report of ``x``; the format follows the suffix (.html or .pdf)."""
    p = Path(path)
    suf = p.suffix.lower()
    if suf not in (".html", ".htm", ".pdf"):
        raise RetimeError(f"{p}: report must end in .html or .pdf (got {suf or 'no suffix'!r})")
    rep = build_report(x, baseline=baseline, title=title)
    return write_pdf(rep, p) if suf == ".pdf" else write_html(rep, p)
