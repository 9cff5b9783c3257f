"""Report sections of the drill-down analyses (analysis/report_drilldown.py)."""

from __future__ import annotations

import json

from conftest import KINETO, ingest_cached

from retime.analysis import breakdown
from retime.analysis.report_drilldown import cuda_graph_whatif, drilldown_sections
from retime.collectors.trace import Trace


def test_cuda_graph_whatif_table_on_dlrm():
    t = ingest_cached(KINETO / "dlrm-v100-8rank")
    df = cuda_graph_whatif(t)
    assert df["scenario"].tolist() == ["measured", "cuda_graphs=forward_backward",
                                       "cuda_graphs=step"]
    assert df.loc[0, "host_bound_ns"] == breakdown(t)["host_bound_ns"].sum()
    fb, st = df.loc[1, "host_bound_removed_frac"], df.loc[2, "host_bound_removed_frac"]
    assert 0.3 < fb < st < 0.9  # capturing the whole step removes most, never all


def test_sections_are_left_out_where_an_analysis_cannot_run():
    t = ingest_cached(KINETO / "dlrm-v100-8rank")
    # a GPU without a built-in profile (the V100 renamed): no peaks for the roofline, so
    # that section is left out, not drawn empty
    unknown = Trace(**{**t.__dict__, "meta": json.loads(json.dumps(t.meta).replace(
        "V100", "Z100"))})
    dl = drilldown_sections(unknown)
    assert [s.title for s in dl] == ["Host overhead and CUDA graphs", "Attribution tree"]
    assert len(dl[0].tables) == 3 and len(dl[0].figures) == 1
    assert "Roofline per operator" in [s.title for s in drilldown_sections(t)]  # v100-sxm2
    vgg = drilldown_sections(ingest_cached(KINETO / "h100-vgg13" /
                                           "profiler_vgg13-iter41.json.gz"))
    roof = next(s for s in vgg if s.title == "Roofline per operator")
    assert "h100-sxm" in roof.blocks[0] and len(roof.tables) == 1 and len(roof.figures) == 1
    gloo = drilldown_sections(ingest_cached(KINETO / "cpu-gloo-rank34"))
    assert "Host overhead and CUDA graphs" not in [s.title for s in gloo]  # no launches


def test_attribution_tree_leaves_structural_counts_blank():
    """Step and phase nodes group instances but are none themselves: their Count cell is
    blank, not "0" (which read as "nothing ran" beside 52 ms of device time); the root and
    merged instances keep their numbers."""
    t = ingest_cached(KINETO / "dlrm-v100-8rank")
    tree = next(s for s in drilldown_sections(t) if s.title == "Attribution tree")
    tab = tree.tables[0]
    col = tab.header.index("Count")
    level = tab.header.index("Level")
    by_level = {}
    for r in tab.rows:
        by_level.setdefault(r[level], set()).add(r[col])
    assert by_level["root"] == {"1"}
    assert by_level["step"] == {""} and by_level["phase"] == {""}
    assert "0" not in {r[col] for r in tab.rows}
    assert all(c and c != "0" for c in by_level["annotation"])


def test_roofline_table_has_no_blank_shapes_column_on_a_modeled_run():
    """A synthesized run's kernels carry no recorded shapes: the roofline table leaves the
    Shapes column out instead of showing it empty; a measured trace keeps it."""
    import retime.collectors.synth as synth

    t = synth.synthesize("gpt3-1.3b", "a100-80gb", tp=1, pp=1, dp=1, global_batch=1,
                         micro_batch=1)
    roof = next(s for s in drilldown_sections(t) if s.key == "roofline")
    assert roof.tables[0].header[:2] == ["Operator", "Type"]
    dl = drilldown_sections(ingest_cached(KINETO / "dlrm-v100-8rank"))
    assert "Shapes" in next(s for s in dl if s.key == "roofline").tables[0].header


def test_icicle_labels_are_readable_and_never_overlap():
    """The icicle's node names: 7.5 pt (6 pt was too small to read on the page), a cut name
    ends in "…", and no two names on one row run into each other."""
    from retime.analysis.drilldown_plots import plot_hierarchy
    from retime.analysis.hierarchy import hierarchy

    fig = plot_hierarchy(hierarchy(ingest_cached(KINETO / "dlrm-v100-8rank")))
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    r = fig.canvas.get_renderer()
    texts = fig.axes[0].texts
    assert len(texts) >= 8 and all(t.get_fontsize() >= 7 for t in texts)
    assert any(t.get_text().endswith("…") for t in texts)
    rows: dict[float, list] = {}
    for t in texts:
        rows.setdefault(round(t.get_position()[1], 3), []).append(t.get_window_extent(r))
    for boxes in rows.values():
        boxes.sort(key=lambda b: b.x0)
        assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:]))
