"""Reports a performance engineer reads: one self-contained HTML file or a PDF document.

:func:`build_report` analyses a run once and keeps what the report says
(:class:`~analysis.report_model.Report`):

* a headline that tells the truth: for a what-if, the measured and the replayed step side
  by side with the change, the scenario's keys and values named (a GPU swap said so); for a
  comparison, the baseline and this run; the source, hardware and ranks of the trace; the
  top findings in plain words;
* sections of paragraphs, tables for people (:mod:`analysis.tables`) and figures that scale
  from 1 to 16,384 ranks (:mod:`analysis.plots_timeline`); sections that do not apply
  (no pipeline, no collectives, no memory samples, no flops) are left out.

:func:`build_sweep_report` does the same for a sweep's table (Pareto front, sensitivity).
:func:`write_html` renders with Jinja2 (autoescaping on: every name from a trace is untrusted
text) and embeds the figures as PNG, so the file needs no network; :func:`write_pdf` lays the
same content out as a document (one page size, tables flowing over pages, page numbers, a
linked table of contents). Figures are drawn once and shared by both. Tables cut to their top
rows are written whole as CSV files in ``NAME-tables/`` beside the report.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from retime.collectors.errors import RetimeError
from retime.collectors.trace import Trace

from ._util import as_trace, memo_scope
from .breakdown import PARTS
from .coverage import excludes_gpu_work, hides_gpu_work, unseen_notes
from .report_compare import (
    _METRIC_WORDS,
    build_sweep_sections,
    comparison_finding,
    section_comparison,
)
from .report_findings import cpu_only
from .report_findings import findings as run_findings
from .report_model import Fig, Report, Section, now_utc
from .report_run import RunAnalysis, gpu_swap, is_replay, scenario_of, source_facts
from .report_sections import (
    section_breakdown,
    section_comm,
    section_critical_path,
    section_efficiency,
    section_kernels,
    section_memory,
    section_pipeline,
    section_stragglers,
    section_timeline,
)
from .tables import fmt_ns, fmt_pct, plural

__all__ = ["Report", "Section", "Fig", "build_report", "assemble_report", "build_sweep_report",
           "read_sweep", "render_html", "write_html", "write_pdf", "write_report", "fmt_ns", "fmt_pct",
           "PAPERS"]

PAPERS = ("a4", "letter")
_SHORT_PART = {"compute_ns": "Compute", "overlapped_comm_ns": "Hidden comm.",
               "exposed_comm_ns": "Exposed comm.", "memcpy_ns": "Copies",
               "host_bound_ns": "Host-bound", "idle_ns": "Idle"}
TOP = 15  # rows of a long table shown in the report (the CSV beside it has them all)


def _measured_of(x: Any, t: Trace, baseline: Any | None) -> tuple[Any | None, float | None]:
    """(the measured run to compare a replay with, or None; its step time when only the
    number is known)."""
    if baseline is not None:
        return baseline, None
    if not isinstance(x, Trace):
        meta = getattr(x, "meta", {}) or {}
        resynth = (meta.get("whatif") or {}).get("resynthesized", False)
        inner = getattr(x, "trace", None)
        if isinstance(inner, Trace) and not resynth:
            return inner, None
        v = (meta.get("whatif") or {}).get("baseline_measured_step_time_ns")
        return None, float(v) if v else None
    v = ((t.meta.get("replay") or {}).get("whatif") or {}).get("baseline_measured_step_time_ns")
    return None, float(v) if v else None


def _range_of(x: Any, t: Trace) -> list[float] | None:
    """The what-if's step-time range ``[lo, hi]`` (ns per step), where the replay has one."""
    if not isinstance(x, Trace):
        from retime.replay import prediction_range
        prediction_range(x)
    w = (getattr(x, "meta", None) or {}).get("whatif") if not isinstance(x, Trace) else None
    if not isinstance(w, dict):
        w = (t.meta.get("replay") or {}).get("whatif") or {}
    r = w.get("step_range_ns")
    return [float(r[0]), float(r[1])] if isinstance(r, (list, tuple)) and len(r) == 2 else None


def build_report(x: Any, *, baseline: Any | None = None, title: str | None = None,
                 top: int = TOP) -> Report:
    """Analyse ``x`` (a Trace or ReplayResult; against ``baseline`` when given) and assemble
    the report. A ReplayResult without a baseline is compared with the trace it replayed."""
    with memo_scope():  # step windows and op masks computed once per trace
        return _build_report(x, baseline=baseline, title=title, top=top)


def _build_report(x: Any, *, baseline: Any | None, title: str | None, top: int) -> Report:
    t = as_trace(x)
    return assemble_report(RunAnalysis(x, t), baseline=baseline, title=title, top=top)


def assemble_report(run: RunAnalysis, *, baseline: Any | None = None, title: str | None = None,
                    top: int = TOP) -> Report:
    """The report of an analysed run (:class:`RunAnalysis`, or the streamed one of
    :mod:`analysis.report_stream`, whose ``t`` holds a bounded subset of the ops)."""
    x, t = run.x, run.t
    if run.n_ops == 0:
        raise RetimeError("the trace has no ops; nothing to report (check `retime info`)")
    scenario = scenario_of(x, t)
    replay = is_replay(x, t)
    base_x, base_step = _measured_of(x, t, baseline)
    # a baseline already analysed (a streamed one: analysis.report_stream) is used as is
    base = (base_x if isinstance(base_x, RunAnalysis) else
            RunAnalysis(base_x) if base_x is not None else None)
    if replay:
        kind = "whatif"
        la = "baseline" if base is not None and is_replay(base.x, base.t) else "measured"
        lb = "what-if" if scenario else "replayed"
    elif base is not None:
        kind, la, lb = "comparison", "baseline", "this run"
    else:
        kind, la, lb = "run", "", ""
    name = title or f"retime report: {t.meta.get('name') or _default_name(t)}"
    # headline
    st = run.step_ns
    headline: list[tuple[str, str, str]] = []
    no_markers = bool(len(run.bd)) and bool((run.bd["step"] < 0).all())
    steps_note = (f"mean of {run.steps} steps, slowest rank each" if run.steps > 1 else
                  f"slowest rank ({run.slowest_rank})" if run.n_ranks > 1 else "one step")
    if no_markers:  # the whole trace as one window: a "step" the trace does not mark
        steps_note += "; no step markers: the whole trace"
    if kind == "run":
        spread = run.step_spread
        headline.append(("Step time", fmt_ns(st), steps_note + (
            f"; step-to-step spread {fmt_pct(spread)}" if spread == spread else "")))
    else:
        a = base.step_ns if base is not None else base_step
        note = ("as recorded" if base is not None and la == "measured" else "baseline run"
                if base is not None else "the replay's record of the measured step (pass "
                "--baseline MEASURED.retime for the full comparison)")
        headline.append((f"{la.capitalize()} step", fmt_ns(a) if a else "n/a", note))
        rng = _range_of(x, t)
        headline.append((f"{lb.capitalize()} step", fmt_ns(st), ("; ".join(
            f"{k} = {v}" for k, v, _ in scenario) or steps_note) + (
            f"; range {fmt_ns(rng[0])} to {fmt_ns(rng[1])}" if rng else "")))
        if a:
            d = (st - a) / a
            ratio = (f"{a / st:.2f}x faster" if st < a else f"{st / a:.2f}x slower"
                     if st > a else "unchanged")
            headline.append(("Change", f"{d:+.1%}", ratio))
    je = run.je
    if je["mfu"] == je["mfu"] or je["hfu"] == je["hfu"]:
        headline.append(("MFU / HFU", f"{fmt_pct(je['mfu'])} / {fmt_pct(je['hfu'])}",
                         "model / hardware FLOPs utilization"))
    else:
        busy = float(run.bd["busy_ns"].sum() / max(run.bd["step_ns"].sum(), 1))
        if cpu_only(t):  # no GPU in the trace: its CPU ops stand for the device
            headline.append(("Busy", fmt_pct(busy), "share of the step with any op running"
                             + (", all ranks" if run.n_ranks > 1 else "")
                             + " (a CPU-only trace: no GPU)"))
        else:
            headline.append(("GPU busy", fmt_pct(busy), f"share of the "
                             f"{'trace' if no_markers else 'step'} with any GPU op "
                             "running" + (", all ranks" if run.n_ranks > 1 else "")))
    unseen = run.unseen
    hidden = hides_gpu_work(unseen)
    if kind == "run" and len(run.bd):
        parts = run.slow_parts
        top_part = max(PARTS, key=lambda q: parts[q])
        headline.append(("Largest part", _SHORT_PART[top_part],
                         f"{fmt_pct(parts[top_part] / st)} of the slowest rank's "
                         + ("trace" if no_markers else "step") + (
                             "; not a conclusion: the GPU work of graph replays is not in "
                             "the trace" if hidden and top_part in ("host_bound_ns", "idle_ns")
                             else "")))
    # what the critical path spans: a streamed report's is one rank's (attrs["scope_rank"])
    path = (f"rank {run.cp.attrs['scope_rank']}'s whole timeline"
            if "scope_rank" in run.cp.attrs else "whole trace")
    headline.extend(_unseen_headline(unseen, path))
    facts = source_facts(base.t if (base is not None and kind == "whatif") else t,
                         world_size=t.world_size)
    steps_fact = (f"{run.steps} ({run.window.why} drawn)" if run.steps > 1 else
                  "no step markers: the whole trace as one window"
                  if run.steps == 1 and run.window.step < 0 else
                  "1" if run.steps == 1 else "none marked")
    facts.append(("Steps", steps_fact))
    facts.append(("Ops", f"{run.n_ops:,}" + (f" ({base.n_ops:,} in the {la} run)"
                                            if base is not None and base.n_ops != run.n_ops
                                            else "")))
    swap = gpu_swap(scenario, base.t if base is not None else None)
    if swap:
        facts.append(("GPU swapped", swap))
    facts.append(("Critical path", f"{fmt_ns(run.cp.attrs['length_ns'])} "
                                   f"({len(run.cp):,} ops)" + (
                                       f", {run.cp.attrs['scope']}" if run.cp.attrs.get("scope")
                                       else "")))
    if run.streamed is not None:
        facts.append(("Analysis", run.streamed["fact"]))
    # sections
    secs: list[Section] = []
    if base is not None:
        secs.append(section_comparison(base, run, labels=(la, lb), top=top))
    secs.append(section_breakdown(run, top=top))
    if kind == "whatif":  # the numbers from here on are the replay's, said where they start
        secs[-1].blocks.insert(0, f"This section and the ones after it describe the {lb} run, "
                                  f"not the {la} one (the first section puts the two side by "
                                  "side).")
    secs.append(section_timeline(run))
    secs.append(section_critical_path(run, top=top))
    for sec in (section_kernels(run, top=top), section_comm(run, top=top),
                section_pipeline(run), section_memory(run, top=top),
                section_efficiency(run), section_stragglers(run, top=top)):
        if sec is not None:
            secs.append(sec)
    # drill-downs: host overhead / CUDA graphs, attribution tree, roofline (when they apply);
    # a streamed report leaves them out (they need every op at once) and says so
    if run.streamed is None:
        from .report_drilldown import drilldown_sections
        secs.extend(drilldown_sections(x))
    else:
        secs.insert(0, run.streamed["section"])
    # findings
    fnd = run_findings(run)
    strag = getattr(run, "stragglers", None)
    if strag is not None and len(strag):
        grp = strag[strag["group"] != "overall"].sort_values("cost_pct", ascending=False)
        overall = float(strag.loc[strag["group"] == "overall", "cost_pct"].iloc[0])
        if len(grp) and overall > 1.0:
            g0 = grp.iloc[0]
            fnd.append((overall / 100.0, f"Stragglers and slow ops cost {overall:.1f}% over an "
                                         f"ideal replay; the largest single contributor is "
                                         f"{g0['group'].replace('_', ' ')} {g0['key']} "
                                         f"({g0['cost_pct']:+.1f}%)."))
    if hidden:  # no host-bound or idle verdict from GPU work the trace does not show
        fnd = [(w, f) for w, f in fnd if not f.startswith(("The job is host-bound",
                                                            "Nothing runs for"))]
        fnd.append((10.0, unseen_notes(unseen, path=path)[-1]))
    ranked = [s for _, s in sorted(fnd, key=lambda z: -z[0])]
    if base is not None:
        what = ("The what-if " + ", ".join(f"{k} = {v}" for k, v, _ in scenario)
                if scenario else "The replay" if kind == "whatif" else "This run")
        if kind == "comparison":
            what = "Against the baseline, this run"
        first = comparison_finding(base, run, what)
        if kind == "comparison" and base.n_ranks != run.n_ranks:
            # as `retime compare` says it: two rank counts are rarely one job measured twice
            first = (f"{first.rstrip('.')}; note: the runs hold {base.n_ranks} and "
                     f"{run.n_ranks} ranks: check that they are the same job.")
        if kind == "comparison":
            from .compare import _shared_names
            shared = _shared_names(base.t, run.t)
            if shared < 0.5:
                first = (f"{first.rstrip('.')}; note: the runs share {100 * shared:.0f}% of "
                         "their op names (of the run with fewer): they look like different "
                         "jobs.")
        ranked = [first, *ranked]
    summary = [("Step time", fmt_ns(st)), ("MFU", fmt_pct(je["mfu"]) if je["mfu"] == je["mfu"]
                                           else "unknown (no flops in trace)"),
               ("HFU", fmt_pct(je["hfu"]) if je["hfu"] == je["hfu"] else "unknown"),
               ("Critical path", fmt_ns(run.cp.attrs["length_ns"])),
               ("Ranks / steps", f"{run.n_ranks} / {run.steps}"), ("Ops", f"{run.n_ops:,}")]
    summary.extend((label, value) for label, value, _ in _unseen_headline(unseen, path))
    if base is not None or base_step:
        a = base.step_ns if base is not None else base_step
        summary.insert(0, (f"{la.capitalize()} step time", fmt_ns(a)))
    return Report(title=name, kind=kind, headline=headline, facts=facts,
                  findings=ranked[:4 if base is not None else 3], sections=secs,
                  scenario=scenario, summary=summary, generated=now_utc())


def _unseen_headline(u: dict[str, int], path: str = "whole trace"
                     ) -> list[tuple[str, str, str]]:
    """Headline rows naming the GPU work the step figures leave out or the trace cannot
    show (:mod:`analysis.coverage`); none when there is none."""
    rows = []
    notes = unseen_notes(u, path=path)
    # a short figure (the headline's large type), the counts and reasons in its note
    if excludes_gpu_work(u):
        share = u["without_launch_ns"] / u["gpu_ns"] if u["gpu_ns"] else 0.0
        rows.append(("Excluded GPU work", fmt_pct(share) if u["without_launch_ops"] else
                     fmt_ns(u["outside_steps_ns"]),
                     ("of GPU time. " if u["without_launch_ops"] else "outside the steps. ")
                     + notes[0]))
    if hides_gpu_work(u):
        rows.append(("Unseen GPU work", f"{u['graph_launches']:,} graph launches",
                     f"{u['captured_launches']:,} launches captured into CUDA graphs; "
                     + notes[-1]))
    return rows


def _default_name(t: Trace) -> str:
    """The run's name: the folder of its trace files when there are several, else the
    file's name without its suffixes."""
    srcs = [s for s in t.meta.get("sources") or [] if isinstance(s, dict) and s.get("path")]
    if not srcs:
        return "synthesized run" if t.meta.get("source_format") == "synth" else "run"
    p = Path(str(srcs[0]["path"]))
    if len(srcs) > 1 or t.meta.get("source_format") == "oplevel":
        return p.parent.name or p.name
    return p.name.split(".")[0] or p.name


# ------------------------------------------------------------------ sweeps
def read_sweep(path: str | os.PathLike[str]) -> pd.DataFrame:
    """A sweep's table (``retime sweep`` Parquet), checked for the columns a report needs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = Path(path)
    try:
        df = pq.read_table(p).to_pandas()
    except (OSError, pa.ArrowInvalid) as exc:
        raise RetimeError(f"{p}: not a readable Parquet file ({exc}); pass a SWEEP.parquet "
                          "written by `retime sweep`") from exc
    missing = [c for c in ("scenario_id", "step_time_ns", "error") if c not in df.columns]
    if missing:
        raise RetimeError(f"{p}: not a sweep table (no column {', '.join(missing)}); pass a "
                          "SWEEP.parquet written by `retime sweep`")
    # a row's times span every profiled step of the swept trace (its replayed windows end to
    # end): shown per step, over the step count `retime sweep` keeps in the file's metadata
    steps = _sweep_steps(pq.read_schema(p).metadata)
    if steps > 1:
        for c in ("step_time_ns", "step_time_lo_ns", "step_time_hi_ns", "exposed_comm_ns"):
            if c in df.columns:
                df[c] = (df[c].astype("Float64") / steps).round().astype("Int64")
    df.attrs["steps"] = steps
    return df


def _sweep_steps(meta: dict | None) -> int:
    import json

    try:
        return max(int(json.loads((meta or {}).get(b"retime", b"{}")).get("steps", 1)), 1)
    except (ValueError, TypeError, AttributeError):
        return 1


def build_sweep_report(df: pd.DataFrame, *, title: str = "retime sweep report",
                       top: int = TOP) -> Report:
    """The report of a sweep: the fastest scenarios, sensitivity per key, the Pareto front of
    step time and memory, and the scenarios that failed."""
    secs, info = build_sweep_sections(df, top=top)
    ok = info["ok"]
    keys = info["keys"]
    headline = [("Scenarios", f"{len(df):,}", f"{info['failed']} failed, {info['oom']} out of "
                                              "memory")]
    findings = []
    if len(ok):
        best = ok.loc[ok["step_time_ns"].astype("int64").idxmin()]
        worst = ok.loc[ok["step_time_ns"].astype("int64").idxmax()]
        desc = ", ".join(f"{k} = {best[k]}" for k in keys if pd.notna(best[k])) or "baseline"
        headline.append(("Fastest step", fmt_ns(best["step_time_ns"]),
                         f"scenario {int(best['scenario_id'])}: {desc}"))
        headline.append(("Slowest step", fmt_ns(worst["step_time_ns"]),
                         f"scenario {int(worst['scenario_id'])}"))
        findings.append(f"The fastest scenario ({desc}) takes {fmt_ns(best['step_time_ns'])} per "
                        f"step, {float(worst['step_time_ns']) / float(best['step_time_ns']):.2f}x "
                        f"faster than the slowest ({fmt_ns(worst['step_time_ns'])}).")
        from .sweep_plots import sensitivity
        sens = sensitivity(ok, keys)
        if len(sens):
            s0 = sens.iloc[0]
            findings.append(f"{s0['key']} matters most: its median step time runs from "
                            f"{fmt_ns(s0['best_ns'])} ({s0['key']} = {s0['best']}) to "
                            f"{fmt_ns(s0['worst_ns'])} ({s0['worst']}), "
                            f"{fmt_pct(s0['range_frac'])} apart.")
            if len(sens) > 1:
                s1 = sens.iloc[-1]
                findings.append(f"{s1['key']} matters least ({fmt_pct(s1['range_frac'])} "
                                "between its best and worst value).")
    if info["failed"]:
        findings.append(f"{plural(info['failed'], 'scenario')} failed; see the last section.")
    n_steps = int(df.attrs.get("steps", 1))
    facts = [("Keys", ", ".join(keys) or "none"),
             *([("Steps", f"{n_steps} profiled; times are per step (each scenario's replayed "
                 "steps end to end, over their count)")] if n_steps > 1 else []),
             # in words (the Parquet's column names stay in the CSV beside the report)
             ("Metrics", ", ".join(_METRIC_WORDS[c][0] for c in ("step_time_ns", "tokens_per_s",
                                                                 "mfu", "peak_memory_bytes")
                                   if c in df and df[c].notna().any()) or "none")]
    summary = [("Scenarios", str(len(df))), ("Failed", str(info["failed"]))]
    if len(ok):
        summary.append(("Fastest step", fmt_ns(ok["step_time_ns"].min())))
    return Report(title=title, kind="sweep", headline=headline, facts=facts,
                  findings=findings[:3], sections=secs, summary=summary, generated=now_utc())


# ------------------------------------------------------------------ writing
def render_html(report: Report, *, tables_dir: str | None = None) -> str:
    """The report as one self-contained HTML string (autoescaped)."""
    from .report_html import render_html as _render
    return _render(report, tables_dir=tables_dir)


def _tables_dir(path: Path) -> Path:
    return path.with_name(path.stem + "-tables")


def _write_csvs(report: Report, path: Path) -> str | None:
    """Write the cut tables whole beside the report; returns the folder's name (or None)."""
    from retime.collectors.fsutil import atomic_output

    cut = [t for t in report.tables() if t.csv_name and t.csv_frame is not None]
    if not cut:
        return None
    d = _tables_dir(path)
    d.mkdir(parents=True, exist_ok=True)
    for tb in cut:
        f = d / f"{tb.csv_name}.csv"
        with atomic_output(f) as tmp:
            tb.csv_frame.to_csv(tmp, index=False)
    return d.name


def write_html(report: Report, path: str | os.PathLike[str]) -> Path:
    """Write the HTML report (and the CSVs of cut tables beside it)."""
    from retime.collectors.fsutil import atomic_output

    p = Path(path)
    d = _write_csvs(report, p)
    html = render_html(report, tables_dir=d)
    with atomic_output(p) as tmp:
        tmp.write_text(html, encoding="utf-8")
    return p


def write_pdf(report: Report, path: str | os.PathLike[str], *, paper: str = "a4") -> Path:
    """Write the PDF report (A4 or Letter) and the CSVs of cut tables beside it."""
    from retime.collectors.fsutil import atomic_output

    from .report_pdf import layout_pdf

    if paper not in PAPERS:
        raise RetimeError(f"paper={paper!r}: choose a4 or letter")
    p = Path(path)
    d = _write_csvs(report, p)
    data = layout_pdf(report, paper=paper, tables_dir=d)
    with atomic_output(p) as tmp:
        tmp.write_bytes(data)
    return p


def write_report(x: Any, path: str | os.PathLike[str], *, baseline: Any | None = None,
                 title: str | None = None, paper: str = "a4") -> Path:
    """Build and write the report of ``x``; the format follows the suffix (.html or .pdf).
    ``x`` may also be a sweep's DataFrame."""
    p = Path(path)
    suf = p.suffix.lower()
    if suf not in (".html", ".htm", ".pdf"):
        raise RetimeError(f"{p}: report must end in .html or .pdf (got {suf or 'no suffix'!r})")
    if isinstance(x, pd.DataFrame):
        rep = build_sweep_report(x, title=title or "retime sweep report")
    else:
        rep = build_report(x, baseline=baseline, title=title)
    return write_pdf(rep, p, paper=paper) if suf == ".pdf" else write_html(rep, p)

