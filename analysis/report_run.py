"""The analyses of one run that a report needs, computed once (:class:`RunAnalysis`), and
what the run is, in words: its source, hardware and what-if scenario.
"""

from __future__ import annotations

import math
import os
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from retime.collectors.arrays import unique
from retime.collectors.trace import Trace

from ._util import as_trace
from .breakdown import PARTS, breakdown, summarize_breakdown
from .critical_path import critical_path
from .efficiency import efficiency, job_efficiency
from .tables import fmt_num, ranks_label
from .timeline import StepWindow, fold_ranks, typical_step

__all__ = ["RunAnalysis", "scenario_of", "source_facts", "gpu_swap", "is_replay"]

_SOURCES = {"kineto": "PyTorch profiler (Kineto) trace", "nsys": "Nsight Systems export",
            "oplevel": "op-level timeline (Megatron timers)", "synth": "modeled run (retime synth)"}


def is_replay(x: Any, t: Trace) -> bool:
    """True for a ReplayResult or a stored replayed trace."""
    return not isinstance(x, Trace) or "replay" in t.meta


class RunAnalysis:
    """One run (a Trace or a ReplayResult) and its analyses; frames are computed on first
    use and kept.

    ``step_ns`` is the job's step time: per step the slowest rank's step, averaged over
    steps (the figure of :func:`analysis.compare.metrics`). ``slow_parts`` splits it into
    the breakdown parts of those slowest ranks, so its values add up to ``step_ns``.
    """

    #: what a streamed report (:mod:`analysis.report_stream`) streamed, bounded or left out;
    #: None for a report of a trace in memory
    streamed: dict[str, Any] | None = None

    def __init__(self, x: Any, t: Trace | None = None) -> None:
        self.x = x
        self.t = t if t is not None else as_trace(x)
        self.stragglers: pd.DataFrame | None = None  # set by the stragglers section

    @cached_property
    def bd(self) -> pd.DataFrame:
        return breakdown(self.t)

    @cached_property
    def bsum(self) -> pd.DataFrame:
        return summarize_breakdown(self.bd)

    @cached_property
    def per_step(self) -> pd.Series:
        """Slowest rank's step time per step (ns)."""
        return self.bd.groupby("step")["step_ns"].max()

    @property
    def step_ns(self) -> float:
        return float(self.per_step.mean()) if len(self.per_step) else float("nan")

    @property
    def steps(self) -> int:
        return int(len(self.per_step))

    @property
    def no_markers(self) -> bool:
        """The trace marks no step: its one window is the whole trace, not a step."""
        return bool(len(self.bd)) and bool((self.bd["step"] < 0).all())

    @cached_property
    def slow_parts(self) -> pd.Series:
        """Mean over steps of the slowest rank's parts (sums to ``step_ns``)."""
        bd = self.bd
        if len(bd) == 0:
            return pd.Series({p: float("nan") for p in PARTS})
        idx = bd.groupby("step")["step_ns"].idxmax()
        return bd.loc[idx, list(PARTS)].mean()

    @cached_property
    def slowest_rank(self) -> int:
        bd = self.bd
        idx = bd.groupby("step")["step_ns"].idxmax()
        return int(bd.loc[idx, "rank"].mode().iloc[0]) if len(idx) else -1

    @cached_property
    def cp(self) -> pd.DataFrame:
        return critical_path(self.x)

    @property
    def n_ops(self) -> int:
        return int(self.t.n_ops)

    @cached_property
    def first_start_ns(self) -> int:
        """The run's first op start."""
        return int(self.t.ops["start_ns"].min()) if len(self.t.ops) else 0

    @cached_property
    def unseen(self) -> dict[str, int]:
        from .coverage import unseen_work
        return unseen_work(self.t)

    @cached_property
    def cw(self) -> pd.DataFrame:
        """Who waits for whom at collectives (:func:`analysis.report_findings.collective_waits`)."""
        from .report_findings import collective_waits
        return collective_waits(self.t)

    @cached_property
    def has_microbatches(self) -> bool:
        return bool((self.t.ops["microbatch"].to_numpy() >= 0).any())

    @cached_property
    def activity(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The rank x time heatmap of :attr:`window` (:func:`analysis.timeline.rank_activity`)."""
        from .timeline import rank_activity
        return rank_activity(self.t, self.window)

    @cached_property
    def eff(self) -> pd.DataFrame:
        return efficiency(self.t)

    @cached_property
    def je(self) -> dict[str, float]:
        return job_efficiency(self.eff)

    @cached_property
    def window(self) -> StepWindow:
        return typical_step(self.t)

    @cached_property
    def folds(self) -> pd.DataFrame:
        return fold_ranks(self.t, self.window)

    @property
    def n_ranks(self) -> int:
        return int(len(self.t.ranks))

    @cached_property
    def stands_for(self) -> dict[int, tuple[str, int]]:
        """Representative rank -> (label of the ranks it stands for, how many), for modeled
        runs that emit one rank per class of identical ranks (empty otherwise)."""
        syn = self.t.meta.get("synth") or {}
        out: dict[int, tuple[str, int]] = {}
        emitted = set(int(r) for r in self.t.ranks)
        for c in syn.get("rank_classes") or []:
            rep = int(c.get("representative", -1))
            lo, hi = (c.get("ranks") or [rep, rep])[:2]
            if rep in emitted and hi > lo and len(emitted) < int(syn.get("world_size") or 0):
                out[rep] = (f"{int(lo)}-{int(hi)}", int(hi) - int(lo) + 1)
        return out

    @cached_property
    def ks(self) -> pd.DataFrame:
        from .kernels import kernel_stats
        return kernel_stats(self.t)

    @cached_property
    def cls(self) -> pd.DataFrame:
        from .kernels import class_stats
        return class_stats(self.t)

    @cached_property
    def co(self) -> pd.DataFrame:
        from .comm import collectives
        return collectives(self.t)

    @cached_property
    def bub(self) -> pd.DataFrame:
        from .pipeline import bubbles
        return bubbles(self.t)

    @cached_property
    def stages(self) -> pd.DataFrame:
        from .pipeline import rank_stages
        return rank_stages(self.t)

    @property
    def n_stages(self) -> int:
        s = self.stages["stage"].to_numpy()
        return int(len(unique(s[s >= 0])))

    @cached_property
    def pm(self) -> pd.DataFrame:
        from .memory import peak_memory
        return peak_memory(self.t)

    @cached_property
    def mt(self) -> pd.DataFrame:
        from .memory import memory_timeline
        return memory_timeline(self.t)

    @cached_property
    def step_spread(self) -> float:
        """Relative standard deviation of the per-step times (NaN with one step)."""
        v = self.per_step.to_numpy(dtype=float)
        return float(np.std(v, ddof=1) / np.mean(v)) if len(v) > 1 and np.mean(v) > 0 else \
            float("nan")


# ------------------------------------------------------------------ what the run is
def _fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return fmt_num(v, 6)
    if isinstance(v, (list, tuple)):
        return ", ".join(_fmt_value(x) for x in v)
    return str(v)


def scenario_of(x: Any, t: Trace) -> list[tuple[str, str, str]]:
    """The what-if keys applied to ``x`` as (dotted key, value, meaning); empty for a
    measured trace or an identity replay."""
    meta = getattr(x, "meta", None) if not isinstance(x, Trace) else t.meta.get("replay")
    pols = (meta or {}).get("scenario") or []
    KEYS: dict = {}
    if pols:  # (importing the catalogue imports the replay package: 0.4 s; a run has none)
        try:
            from retime.replay.policies.keys import KEYS
        except ImportError:  # pragma: no cover - the replay package ships with analysis
            pass
    out = []
    for p in pols:
        if not isinstance(p, dict):
            continue
        table = p.get("policy", "")
        for k, v in p.items():
            if k == "policy":
                continue
            key = f"{table}.{k}"
            info = KEYS.get(key)
            if KEYS and info is None:
                continue  # what the policy derived (bucket counts, fits): not a key given
            meaning = ""
            if info is not None:
                meaning = info.help + (f" ({info.unit})" if info.unit not in ("", "name")
                                       else "")
            out.append((key, _fmt_value(v), meaning))
    if (meta or {}).get("ideal"):
        out.append(("stragglers.ideal", "true", "unexplained delays dropped"))
    return out


def _devices(t: Trace) -> list[str]:
    devs = t.meta.get("devices") or {}
    names: list[str] = []
    if isinstance(devs, dict):
        if "name" in devs or "gpu" in devs:
            names = [str(devs.get("name") or devs.get("gpu"))] * max(t.world_size, 1)
        else:
            for d in devs.values():
                if isinstance(d, dict) and d and all(isinstance(v, dict) for v in d.values()):
                    d = next(iter(d.values()))
                if isinstance(d, dict) and (d.get("name") or d.get("gpu")):
                    names.append(str(d.get("name") or d.get("gpu")))
    syn = t.meta.get("synth") or {}
    if not names and isinstance(syn.get("hardware"), dict) and syn["hardware"].get("gpu"):
        names = [str(syn["hardware"]["gpu"])] * int(syn.get("world_size") or t.world_size)
    return names


def source_facts(t: Trace, *, world_size: int | None = None) -> list[tuple[str, str]]:
    """(label, value) facts on where the run comes from and what it ran on."""
    fmt = t.meta.get("source_format") or "trace"
    src = _SOURCES.get(fmt, f"{fmt} trace")
    syn = t.meta.get("synth") or {}
    files = [os.path.basename(str(s.get("path", ""))) for s in t.meta.get("sources") or []
             if isinstance(s, dict)]
    if fmt == "synth" and syn:
        par = syn.get("parallel") or {}
        model = (syn.get("model") or {}).get("name", "a model")
        bits = [f"TP{par.get('tp', 1)} PP{par.get('pp', 1)} DP{par.get('dp', 1)}"]
        if par.get("cp", 1) > 1:
            bits.append(f"CP{par['cp']}")
        if par.get("pp", 1) > 1:
            bits.append(f"{par.get('schedule', '')} schedule, {par.get('num_microbatches', '?')}"
                        f" micro-batches")
        if par.get("recompute") not in (None, "none"):
            bits.append(f"{par['recompute']} recompute")
        src += f": {model}, " + ", ".join(bits)
    elif len(files) > 1:
        folder = os.path.basename(os.path.dirname(str(t.meta["sources"][0].get("path", ""))))
        src += f" ({len(files)} files" + (f" in {folder})" if folder else ")")
    elif files:
        src += f" ({files[0]})"
    ws = world_size or t.world_size
    names = _devices(t)
    if names:
        counts = pd.Series(names).value_counts()
        hw = ", ".join(f"{n}x {name}" for name, n in counts.items())
    else:
        hw = "not recorded in the trace"
    emitted = len(t.ranks)
    # a modeled run emits one rank per group of identical ones; a measured trace holds the
    # ranks whose files were profiled (rank 0 of 8, say): the others are not in it
    held = (f"{emitted:,} emitted; identical ranks share one timeline" if fmt == "synth" else
            f"{emitted:,} in the trace: {ranks_label(t.ranks)}")
    ranks = f"{ws:,}" + (f" ({held})" if emitted < ws else "")
    return [("Source", src), ("Hardware", hw), ("Ranks", ranks)]


def gpu_swap(scenario: list[tuple[str, str, str]], t_measured: Trace | None) -> str:
    """``"Tesla V100 -> a100-80gb"`` when the scenario swaps the GPU, else ""."""
    sc = {k: v for k, v, _ in scenario}
    if "hardware.gpu" not in sc:
        return ""
    frm = sc.get("hardware.from_gpu")
    if not frm and t_measured is not None:
        names = _devices(t_measured)
        frm = names[0] if names else "the measured GPU"
    return f"{frm or 'the measured GPU'} → {sc['hardware.gpu']} (kernels re-timed by the " \
           f"roofline ratio of the two GPUs)"


def finite(v: float) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))
