"""The content of a report, independent of its format: headline, scenario, facts, findings
and sections of paragraphs, tables and figures (:class:`Report`).

Figures are matplotlib Figures until first needed, then rendered once to PNG
(:meth:`Fig.rendered`); the HTML and the PDF writers use the same pixels.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field

from matplotlib.figure import Figure

from .render import Rendered, render_png
from .tables import Table

__all__ = ["Fig", "Section", "Report", "legend_labels", "now_utc"]


def legend_labels(fig: Figure) -> list[str]:
    """Every label in the figure's legends and colour bars (what a reader can decode)."""
    out: list[str] = []
    for lg in [*fig.legends, *(ax.get_legend() for ax in fig.axes)]:
        if lg is not None:
            out += [t.get_text() for t in lg.get_texts()]
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>":
            out.append(ax.get_ylabel() or ax.get_xlabel())
    return [s for s in out if s]


@dataclass
class Fig:
    """A figure of a report: ``key`` (stable id), ``caption`` (what it shows, in words),
    ``legend`` (its legend entries, recorded before rendering)."""

    key: str
    caption: str
    figure: Figure | None
    legend: list[str] = field(default_factory=list)
    dpi: float = 100.0
    _png: Rendered | None = None

    def __post_init__(self) -> None:
        if self.figure is not None and not self.legend:
            self.legend = legend_labels(self.figure)

    def rendered(self) -> Rendered:
        """The PNG, drawn on first use (the Figure is released afterwards)."""
        if self._png is None:
            assert self.figure is not None
            self._png = render_png(self.figure, self.dpi)
            self.figure = None
        return self._png


@dataclass
class Section:
    """A report section: ``key`` is its anchor; ``blocks`` are paragraphs (str), tables and
    figures in reading order."""

    key: str
    title: str
    blocks: list[str | Table | Fig] = field(default_factory=list)

    @property
    def tables(self) -> list[Table]:
        return [b for b in self.blocks if isinstance(b, Table)]

    @property
    def figures(self) -> list[Fig]:
        return [b for b in self.blocks if isinstance(b, Fig)]


@dataclass
class Report:
    """Everything a report says.

    ``kind``: ``run`` (one trace), ``whatif`` (a replay against the measured trace),
    ``comparison`` (a run against a baseline run) or ``sweep``. ``headline`` holds up to four
    big figures as (label, value, note); ``scenario`` the what-if keys as (key, value,
    meaning); ``facts`` (label, value) pairs on the source and hardware; ``summary`` the
    key figures for ``--json``.
    """

    title: str
    kind: str
    headline: list[tuple[str, str, str]]
    facts: list[tuple[str, str]]
    findings: list[str]
    sections: list[Section]
    scenario: list[tuple[str, str, str]] = field(default_factory=list)
    summary: list[tuple[str, str]] = field(default_factory=list)
    generated: str = ""

    def tables(self) -> list[Table]:
        return [t for s in self.sections for t in s.tables]


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
