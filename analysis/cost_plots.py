"""Plots of the cost layer's predictions (``retime cost collective --plot``): functions that
take frames and return matplotlib Figures (Agg), as in :mod:`plots`."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

__all__ = ["plot_busbw", "figure_to_html"]


def _size_label(b: float) -> str:
    for unit, f in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if b >= f:
            return f"{b / f:g}{unit}"
    return f"{b:g}"


def plot_busbw(rows: pd.DataFrame, *, title: str = "Predicted bus bandwidth",
               published: pd.DataFrame | None = None) -> Figure:
    """Bus bandwidth against message size (log x axis) with the prediction's range as a
    band. ``rows``: ``bytes``, ``busbw_gbps``, ``busbw_lo``, ``busbw_hi`` and ``algorithm``
    / ``protocol``; ``published`` (optional): ``bytes``, ``busbw_gbps`` points to overlay."""
    fig = Figure(figsize=(7.5, 4.2), dpi=110)
    ax = fig.add_subplot()
    x = rows["bytes"].to_numpy(float)
    ax.fill_between(x, rows["busbw_lo"], rows["busbw_hi"], color="tab:blue", alpha=0.18,
                    linewidth=0, label="range")
    ax.plot(x, rows["busbw_gbps"], "o-", color="tab:blue", ms=3.5, lw=1.5, label="predicted")
    if published is not None and len(published):
        ax.plot(published["bytes"], published["busbw_gbps"], "s", color="tab:red", ms=4,
                label="published")
    # annotate where the chosen algorithm / protocol changes
    choice = (rows["algorithm"] + "/" + rows["protocol"]).tolist()
    for i, c in enumerate(choice):
        if i == 0 or c != choice[i - 1]:
            # in the right half the label ends at its point, so it never crosses the frame
            right = i >= len(choice) / 2
            ax.annotate(c, (x[i], rows["busbw_gbps"].iloc[i]), textcoords="offset points",
                        xytext=(-2 if right else 2, 8), ha="right" if right else "left",
                        fontsize=7, color="0.25")
    ax.set_xscale("log", base=2)
    ticks = [v for v in x if v > 0]
    step = max(1, len(ticks) // 8)
    ax.set_xticks(ticks[::step])
    ax.set_xticklabels([_size_label(v) for v in ticks[::step]])
    ax.set_xlabel("message size (bytes, nccl-tests convention)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_ylim(bottom=0)
    ax.grid(True, which="major", alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def figure_to_html(fig: Figure, title: str) -> str:
    """A standalone HTML page holding the figure as inline SVG."""
    import html
    import io

    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title></head><body>{svg}</body></html>\n")
