"""Parallelism what-ifs: DP / TP / PP / CP degree, micro-batching, pipeline schedule, ZeRO
stage / FSDP and sequence parallelism.

A changed layout is re-assembled by the synthesizer's builder (:func:`collectors.synth.
build_trace`) from per-layer op templates, so the new step has the right number of
micro-batches, pipeline bubbles, collectives and memory. Today the templates come from the
synthesizer's cost model, which needs the run's model/hardware/parallel configs: a
synthesized trace (``meta["synth"]``). A measured trace raises PolicyError naming what is
missing (building templates from a measured trace's per-layer ops is not implemented yet).

The global batch is kept unless ``global_batch`` is given: changing ``dp`` changes the number
of micro-batches per pipeline (``global_batch / (micro_batch * dp)``), which must stay an
integer (PolicyError otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from collectors.errors import ConfigError, PolicyError

from .base import Policy, WhatIfState, check_choice, check_int

__all__ = ["Parallel", "SCHEDULES"]

SCHEDULES = ("gpipe", "1f1b", "interleaved", "bfs")
_ALIASES = {"breadth-first": "bfs", "breadth_first": "bfs", "looped": "bfs",
            "interleaved-1f1b": "interleaved", "pipedream-flush": "1f1b"}


@dataclass(frozen=True)
class Parallel(Policy):
    """Degrees and schedule of the re-laid-out step (``None`` = unchanged)."""

    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    schedule: str | None = None
    chunks: int | None = None
    micro_batch: int | None = None
    global_batch: int | None = None
    zero: int | None = None
    fsdp: bool | None = None
    sequence_parallel: bool | None = None
    table: ClassVar[str] = "parallel"

    def __post_init__(self) -> None:
        for f in ("dp", "tp", "pp", "cp", "chunks", "micro_batch", "global_batch"):
            check_int("parallel", f, getattr(self, f))
        if self.schedule is not None:
            object.__setattr__(self, "schedule", _ALIASES.get(self.schedule, self.schedule))
        check_choice("parallel", "schedule", self.schedule, SCHEDULES)
        check_choice("parallel", "zero", self.zero, (0, 1, 2, 3))
        for f in ("fsdp", "sequence_parallel"):
            v = getattr(self, f)
            if v is not None and not isinstance(v, bool):
                raise PolicyError(f"parallel.{f}={v!r} must be true or false")

    def configure(self, state: WhatIfState) -> None:
        kw = self.fields()
        if not kw:
            return
        if not state.is_synth:
            raise PolicyError(
                f"parallel.{', parallel.'.join(kw)}: re-laying out a measured trace needs "
                "per-layer op templates; this trace is measured and building templates "
                "from its layer/phase/microbatch attribution is not supported yet: "
                "synthesize the job (`retime synth`) and apply the scenario to that")
        if self.schedule in ("interleaved", "bfs") and self.chunks is None \
                and state.synth.parallel.get("chunks", 1) == 1:
            kw["chunks"] = 2
        if self.schedule in ("gpipe", "1f1b") and self.chunks is None:
            kw["chunks"] = 1
        if kw.get("fsdp"):
            kw["zero"] = 0 if self.zero is None else self.zero
        if self.zero is not None and self.zero != 3 and self.fsdp is None:
            kw["fsdp"] = False
        state.synth.set_parallel(**kw)
        from collectors.synth import check_config, resolve_parallel
        try:
            par = resolve_parallel(dict(state.synth.parallel))
            check_config(state.synth.model, par)
        except ConfigError as exc:
            raise PolicyError(f"parallel: {exc}") from exc

    def apply(self, state: WhatIfState) -> None:
        if self.fields():
            state.applied.append(self.describe())
