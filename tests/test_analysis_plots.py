"""Plots take analysis frames and draw exactly what the frames say (no pyplot state)."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.figure import Figure
from test_analysis_stats import four_rank_allreduce, one_rank, two_stage_pipeline

from retime.analysis import (
    PARTS,
    breakdown,
    collectives,
    compare,
    critical_path,
    memory_timeline,
    peak_memory,
    stage_bubbles,
    summarize_breakdown,
)
from retime.analysis import plots as P


def test_breakdown_bars_stack_the_parts():
    s = summarize_breakdown(breakdown(one_rank()))
    fig = P.plot_breakdown(s)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    heights = [p.get_height() for p in ax.patches]
    assert len(heights) == len(PARTS) * len(s)
    assert sum(heights) == pytest.approx(s["step_ns"].sum() / 1e6)
    assert heights[0] == pytest.approx(s["compute_ns"].iloc[0] / 1e6)
    # the legend names only the parts some rank has: with no communication (one GPU) it
    # lists no communication entry, and the bars still stack to the step
    quiet = s.assign(overlapped_comm_ns=0, exposed_comm_ns=0)
    ax = P.plot_breakdown(quiet).axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    present = [p for p in PARTS if quiet[p].sum() > 0]
    assert len(legend) == len(present) < len(PARTS)
    assert legend and not any("communication" in t for t in legend)
    assert len(ax.patches) == len(PARTS) * len(s)


def test_timeline_draws_every_op_and_outlines_the_critical_path():
    t = one_rank()
    cp = critical_path(t)
    fig = P.plot_timeline(t.ops, t.lanes, critical_op_ids=cp["op_id"].to_numpy())
    cols = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    assert len(cols) == 2
    assert len(cols[0].get_paths()) == t.n_ops
    assert len(cols[1].get_paths()) == len(cp)
    # a window keeps only the ops it overlaps
    fig = P.plot_timeline(t.ops, t.lanes, window_ns=(100, 130))
    boxes = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)][0]
    assert len(boxes.get_paths()) == 2  # launch 100..110 and kernel 120..200


def test_collective_scatter_and_stage_and_memory_plots():
    co = collectives(four_rank_allreduce())
    fig = P.plot_collectives(co)
    pts = [c for c in fig.axes[0].collections if isinstance(c, PathCollection)]
    assert sum(len(c.get_offsets()) for c in pts) == 1
    assert np.asarray(pts[0].get_offsets())[0][1] == pytest.approx(co["busbw_gbps"].iloc[0])
    sb = stage_bubbles(two_stage_pipeline())
    fig = P.plot_bubbles(sb)
    measured = [p.get_height() for p in fig.axes[0].patches][: len(sb)]
    assert measured == pytest.approx(list(sb["bubble_frac"] * 100))
    fig = P.plot_memory(memory_timeline(one_rank()), peak_memory(one_rank()))
    assert "no memory samples" in fig.axes[0].texts[0].get_text()


def test_compare_bars():
    a, b = one_rank(), one_rank()
    b.ops["dur_ns"] = b.ops["dur_ns"] * 2
    cmp = compare(a, b)
    fig = P.plot_compare(cmp, metrics=["step_ns", "compute_ns"])
    h = [p.get_height() for p in fig.axes[0].patches]
    c = cmp.set_index("metric")
    assert h == pytest.approx([c.loc["step_ns", "baseline"] / 1e6,
                               c.loc["compute_ns", "baseline"] / 1e6,
                               c.loc["step_ns", "candidate"] / 1e6,
                               c.loc["compute_ns", "candidate"] / 1e6])


def test_memory_per_stage_of_a_modeled_run():
    import retime.collectors.synth as synth
    t = synth.synthesize("gpt3-1.3b", "a100-80gb", tp=1, pp=2, dp=1, global_batch=4,
                         micro_batch=1)
    pm = peak_memory(t)
    assert sorted(set(pm["stage"])) == [0, 1]
    tl = memory_timeline(t)
    fig = P.plot_memory(tl.iloc[:0], pm)  # peaks only: one bar per stage
    h = [p.get_height() for p in fig.axes[0].patches]
    per_stage = pm.groupby("stage")["peak_allocated_bytes"].max()
    assert h == pytest.approx(list(per_stage / 2**30))
    if len(tl):  # a timeline: one step line per rank
        fig = P.plot_memory(tl, pm)
        assert len(fig.axes[0].lines) == tl["rank"].nunique()


def test_roofline_labels_never_squeeze_the_axes():
    """Five operators losing time at one spot near the roof's right end (a modeled run's
    GEMMs): one short label ("+N more"), drawn to the left of the spot, and the axes keep
    their width (a long label in the layout once squeezed them into a narrow strip)."""
    import io

    import pandas as pd

    from retime.analysis.drilldown_plots import plot_roofline

    n = 6
    ops = pd.DataFrame({"op": [f"mlp.fc{i}.bwd_wgrad_long_name" for i in range(n)],
                        "flops": [1e12] * n, "bytes": [2e9] * n, "intensity": [500.0] * n,
                        "achieved_tflops": [600.0 + i for i in range(n)],
                        "device_ns": [1e8 + i for i in range(n)],
                        "gap_ns": [5e7 - i for i in range(n)]})
    fig = plot_roofline(ops, {"peak_tflops": 989.0, "hbm_tbps": 3.35, "name": "h100"})
    fig.savefig(io.BytesIO(), format="png")  # runs the layout
    ax = fig.axes[0]
    labels = list(ax.texts)
    assert len(labels) == 1 and labels[0].get_text().endswith("+3 more")
    assert labels[0].get_ha() == "right"
    assert ax.get_position().width > 0.5


def test_launch_latency_legend_leaves_out_an_empty_group():
    """A trace whose GPU never waited for a launch (a CUDA-graph replay): the legend says
    "queued (N)" and no "launch-bound (0)"; µs, not "us", on the axis."""
    import pandas as pd

    from retime.analysis.drilldown_plots import plot_launch_latency

    lat = pd.DataFrame({"latency_ns": np.linspace(2e3, 90e3, 50),
                        "launch_bound": np.zeros(50, bool)})
    ax = plot_launch_latency(lat).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["queued (50)"]
    assert "(µs, log scale)" in ax.get_xlabel()
    lat["launch_bound"] = np.arange(50) < 5
    ax = plot_launch_latency(lat).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["launch-bound (5)",
                                                                   "queued (45)"]


def test_launch_latency_minor_tick_labels_do_not_crowd():
    """Latencies within a decade (0.3 to 3 ms): minor ticks are labelled at 2, 3 and 5 of a
    decade only, so no "0.9" runs into the "1" beside it."""
    import io

    import pandas as pd

    from retime.analysis.drilldown_plots import plot_launch_latency

    lat = pd.DataFrame({"latency_ns": np.linspace(0.33e6, 3.2e6, 80),
                        "launch_bound": np.arange(80) < 20})
    fig = plot_launch_latency(lat)
    fig.savefig(io.BytesIO(), format="png")
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    minor = {t.get_text() for t in ax.xaxis.get_minorticklabels()
             if lo <= t.get_position()[0] <= hi and t.get_text()}
    assert minor and minor <= {"0.2", "0.3", "0.5", "2", "3", "5"}, minor
    assert "0.9" not in minor and "0.4" not in minor


def test_rank_deltas_legend_names_only_the_directions_shown():
    """Every rank faster (a what-if that helps all): the legend says "faster" only."""
    import pandas as pd

    fig = P.plot_rank_deltas(pd.DataFrame({"rank": [0, 1, 2], "delta_ns": [-5e6, -4e6, -1e6]}))
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["faster"]
    fig = P.plot_rank_deltas(pd.DataFrame({"rank": [0, 1], "delta_ns": [2e6, -1e6]}))
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["slower", "faster"]


def test_step_timeline_leaves_out_a_row_with_nothing_in_the_window():
    """A CUDA-graph step: the host's graph launch ran before the step window (negative
    times), so the CPU row would be empty; it is left out, and so is its legend entry."""
    import pandas as pd

    from retime.analysis.plots_timeline import plot_step_timeline

    seg = pd.DataFrame({"row_group": [0, 0, 0], "activity": [0, 1, 1],
                        "kind": ["host", "compute", "compute"],
                        "start_ns": [-900_000, 0, 500_000], "end_ns": [-40_000, 400_000, 1_600_000],
                        "critical": [False, True, False]})
    ax = plot_step_timeline(seg, ["rank 0"], span_ns=1_676_000).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0 · GPU"]
    legend = ax.figure.legends[0] if ax.figure.legends else ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert "GPU compute" in labels and not any("host" in t for t in labels)


def test_waterfall_labels_share_their_decimals():
    """Step 66.24 -> 68.06 ms (a CUDA-graph capture against eager): the labels read "+2.57",
    "-0.03", "-0.72" and "0" beside "66.24" (once "+2.57", "-0.0332", "+0"), and the legend
    names no "part grew" when nothing grew."""
    import pandas as pd

    steps = pd.DataFrame({"part": ["compute", "comm.", "copies", "host-bound"],
                          "delta_ns": [2.571e6, 0.0, -0.0332e6, -0.7234e6],
                          "color": ["", "", "", ""]})
    steps.attrs.update(baseline_ns=66.24e6, candidate_ns=66.24e6 + steps["delta_ns"].sum())
    fig = P.plot_waterfall(steps)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["+2.57", "0", "-0.03", "-0.72", "66.24", "68.05"], texts
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "part grew" in legend and "part shrank" in legend
    shrink = steps.assign(delta_ns=[-1e6, 0.0, -2e6, 0.0])
    shrink.attrs.update(baseline_ns=66.24e6, candidate_ns=63.24e6)
    legend = [t.get_text() for t in P.plot_waterfall(shrink).legends[0].get_texts()]
    assert legend == ["baseline step", "part shrank", "this run step"]
