"""PDF report tables: a text cell wraps in its column instead of being cut at one line."""

from __future__ import annotations

import re
import zlib

from retime.analysis.pdfdoc import text_width
from retime.analysis.report_model import Report, Section
from retime.analysis.report_pdf import _TAB, _cell_lines, layout_pdf
from retime.analysis.tables import Table

NOTE = ("hardware.cuda_graphs: the trace already runs CUDA graphs: all 3 of its launch calls "
        "are graph launches (cudaGraphLaunch), running 3,495 GPU ops; no per-kernel launch "
        "work is left to capture")


def test_cell_lines_wrap_keep_every_word_and_fit():
    lines = _cell_lines(NOTE, 150.0)
    assert 1 < len(lines) <= 3
    assert all(text_width(ln, "F1", _TAB) <= 150.0 for ln in lines)
    # three lines of 150 pt hold the first part; the cut is marked, never silent
    assert " ".join(lines).replace("…", "") in NOTE or lines[-1].endswith("…")
    # a word with no space (a scenario name) breaks inside the column, it is not cut
    name = "cuda_graphs=forward_backward"
    lines = _cell_lines(name, 50.0)
    assert len(lines) > 1 and "".join(lines) == name
    assert all(text_width(ln, "F1", _TAB) <= 50.0 for ln in lines)
    assert _cell_lines("measured", 50.0) == ["measured"]


def _page_text(pdf: bytes) -> str:
    out = []
    for m in re.finditer(rb"stream\r?\n(.*?)\r?\nendstream", pdf, re.S):
        try:
            out.append(zlib.decompress(m.group(1)).decode("latin-1"))
        except zlib.error:
            pass
    return "".join(out)


def test_pdf_table_note_is_read_whole():
    """The CUDA-graph what-if's note on a trace that runs graphs: once cut at
    "...all 3 of its launch calls are gr…", now on three lines in the PDF."""
    t = Table(caption="CUDA-graph what-if", header=["Scenario", "Step time (ms)", "Note"],
              rows=[["measured", "204.2", ""],
                    ["cuda_graphs=forward_backward", "n/a", NOTE]],
              numeric=[False, True, False])
    rep = Report(title="t", kind="run", headline=[], facts=[], findings=[],
                 sections=[Section("host", "Host overhead", [t])])
    text = _page_text(layout_pdf(rep))
    assert "left to capture" in text and "gr…" not in text
    # the scenario name: whole, on two lines of its column, never cut with "…"
    cells = re.findall(r"\(([^()]*)\) Tj", text)
    i = next(k for k, c in enumerate(cells) if c.startswith("cuda_graphs="))
    assert "…" not in cells[i] and "cuda_graphs=forward_backward".startswith(cells[i])
    assert "cuda_graphs=forward_backward" in cells[i] + cells[i + 1]
