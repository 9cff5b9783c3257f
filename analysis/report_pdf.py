"""The report laid out as a PDF document (:mod:`analysis.pdfdoc`).

One page size (A4 or Letter). Page 1 holds the headline, the scenario, the facts, the top
findings and a table of contents whose entries link to their pages; the sections flow from
page 2 on: paragraphs wrap, tables fill the page width and continue on the next page with
their header repeated, several tables share a page, figures are scaled to the text width
(or down to the page). Every page has a footer with the title and "page i of n"; the
viewer's bookmarks list the sections.
"""

from __future__ import annotations

from .pdfdoc import PdfDoc, fit_text, text_width
from .report_model import Fig, Report
from .tables import Table

__all__ = ["layout_pdf"]

_M_L, _M_R, _M_T, _M_B = 50.0, 50.0, 54.0, 52.0
_INK = (0.13, 0.13, 0.13)
_GREY = (0.4, 0.4, 0.4)
_BODY = 8.5
_TAB = 7.0
_ROW = 10.2


def _wrap(text: str, width: float, font: str, size: float) -> list[str]:
    out: list[str] = []
    for para in str(text).split("\n"):
        words = para.split(" ")
        line = ""
        for w in words:
            cand = f"{line} {w}" if line else w
            if text_width(cand, font, size) <= width or not line:
                line = cand
            else:
                out.append(line)
                line = w
        out.append(line)
    return [fit_text(x, width, font, size) for x in out]


_CELL_LINES = 3  # a text cell wraps to at most this many lines, the last one cut with "…"


def _cell_lines(text: str, width: float) -> list[str]:
    """A text cell wrapped to the column (a note or a scenario name is read whole, not cut
    at one line), at most :data:`_CELL_LINES` lines."""
    words = []
    for w in str(text).split(" "):  # a word wider than the column breaks where it must
        while text_width(w, "F1", _TAB) > width and len(w) > 1:
            k = max(1, len(fit_text(w, width, "F1", _TAB)) - 1)  # the prefix before "…"
            words.append(w[:k])
            w = w[k:]
        words.append(w)
    lines = _wrap(" ".join(words), width, "F1", _TAB)
    if len(lines) > _CELL_LINES:
        rest = " ".join(lines[_CELL_LINES - 1:])
        lines = lines[:_CELL_LINES - 1] + [fit_text(rest, width, "F1", _TAB)]
    return lines


class _Layout:
    def __init__(self, doc: PdfDoc, title: str) -> None:
        self.doc = doc
        self.title = title
        self.width = doc.width - _M_L - _M_R
        self.bottom = doc.height - _M_B
        self.page = doc.new_page()
        self.y = _M_T

    def new_page(self) -> None:
        self.page = self.doc.new_page()
        self.y = _M_T

    def need(self, h: float) -> None:
        if self.y + h > self.bottom and self.y > _M_T + 1:
            self.new_page()

    def text_block(self, text: str, *, size: float = _BODY, font: str = "F1",
                   color=_INK, indent: float = 0.0, gap: float = 4.0, lead: float = 1.32
                   ) -> None:
        lines = _wrap(text, self.width - indent, font, size)
        for ln in lines:
            self.need(size * lead)
            self.y += size * lead
            self.doc.text(self.page, _M_L + indent, self.y - size * 0.28, ln, font=font,
                          size=size, color=color)
        self.y += gap

    def heading(self, text: str, size: float, *, keep: float = 80.0, rule: bool = False) -> None:
        self.need(size * 1.6 + keep)
        self.y += size * 1.5
        self.doc.text(self.page, _M_L, self.y - size * 0.3, text, font="F2", size=size)
        if rule:
            self.doc.line(self.page, _M_L, self.y + 3, _M_L + self.width, self.y + 3,
                          color=(0.75, 0.75, 0.75), width=0.6)
            self.y += 4
        self.y += 4

    # ------------------------------------------------------------------ tables
    def table(self, t: Table, tables_dir: str | None) -> None:
        self.heading(t.caption, 9.0, keep=_ROW * (min(len(t.rows), 3) + 2))
        n = len(t.header)
        if n == 0:
            return
        pad = 3.0
        nat = []
        for j in range(n):
            w = max([text_width(t.header[j], "F2", _TAB)] +
                    [text_width(r[j], "F1", _TAB) for r in t.rows]) + 2 * pad
            nat.append(w)
        widths = list(nat)
        total = sum(widths)
        if total > self.width:
            # headers may wrap to two lines: a column needs only its longest header word
            for j in range(n):
                longest_word = max((text_width(w, "F2", _TAB) for w in t.header[j].split()),
                                   default=0) + 2 * pad
                cells = max([text_width(r[j], "F1", _TAB) for r in t.rows] or [0]) + 2 * pad
                widths[j] = max(cells, longest_word)
            total = sum(widths)
        if total > self.width:  # shrink text columns, widest first
            text_cols = [j for j in range(n) if not t.numeric[j]] or list(range(n))
            excess = total - self.width
            room = sum(max(widths[j] - 45, 0) for j in text_cols)
            for j in text_cols:
                give = max(widths[j] - 45, 0)
                widths[j] -= excess * give / room if room else 0
        elif n > 1:  # spread spare width a little (tables read better not cramped)
            spare = min(self.width - total, 12.0 * n)
            widths = [w + spare / n for w in widths]
        head_lines = [_wrap(h, widths[j] - 2 * pad, "F2", _TAB) for j, h in enumerate(t.header)]
        head_h = _ROW * max(len(h) for h in head_lines) + 2

        def draw_header() -> None:
            self.doc.rect(self.page, _M_L, self.y, sum(widths), head_h, fill=(0.925, 0.935,
                                                                              0.955))
            x = _M_L
            for j in range(n):
                for k, ln in enumerate(head_lines[j]):
                    yy = self.y + _ROW * (k + 1) - 2.6
                    if t.numeric[j]:
                        self.doc.text(self.page, x + widths[j] - pad, yy, ln, font="F2",
                                      size=_TAB, align="right")
                    else:
                        self.doc.text(self.page, x + pad, yy, ln, font="F2", size=_TAB)
                x += widths[j]
            self.y += head_h

        self.need(head_h + _ROW)
        draw_header()
        for i, r in enumerate(t.rows):
            cells = [[fit_text(r[j], widths[j] - 2 * pad, "F1", _TAB)] if t.numeric[j] else
                     _cell_lines(r[j], widths[j] - 2 * pad) for j in range(n)]
            row_h = _ROW * max(len(c) for c in cells)
            if self.y + row_h > self.bottom:
                self.new_page()
                draw_header()
            if i % 2 == 1:
                self.doc.rect(self.page, _M_L, self.y, sum(widths), row_h,
                              fill=(0.972, 0.976, 0.984))
            x = _M_L
            for j in range(n):
                for k, cell in enumerate(cells[j]):
                    yy = self.y + _ROW * (k + 1) - 2.8
                    if t.numeric[j]:
                        self.doc.text(self.page, x + widths[j] - pad, yy, cell, size=_TAB,
                                      align="right")
                    else:
                        self.doc.text(self.page, x + pad, yy, cell, size=_TAB)
                x += widths[j]
            self.y += row_h
        self.doc.line(self.page, _M_L, self.y, _M_L + sum(widths), self.y,
                      color=(0.7, 0.7, 0.7), width=0.5)
        self.y += 3
        note = t.note
        if "{csv}" in note:
            path = f"{tables_dir}/{t.csv_name}.csv" if tables_dir and t.csv_name else ""
            note = note.replace("{csv}", path) if path else note.split("; all of them in")[0] + "."
        if note:
            self.text_block(note, size=7.0, color=_GREY, gap=2)
        self.y += 6

    # ------------------------------------------------------------------ figures
    def text_height(self, text: str, size: float = _BODY, gap: float = 4.0) -> float:
        return len(_wrap(text, self.width, "F1", size)) * size * 1.32 + gap

    def figure_size(self, f: Fig) -> tuple[float, float, list[str]]:
        """(width, height, caption lines) of a figure at the text width, fitting a page."""
        r = f.rendered()
        w_pt = r.width_px * 72.0 / f.dpi
        h_pt = r.height_px * 72.0 / f.dpi
        scale = min(self.width / w_pt, 1.0)
        w, h = w_pt * scale, h_pt * scale
        cap = _wrap(f.caption, self.width, "F1", 7.5)
        full = self.bottom - _M_T - len(cap) * 10 - 6
        if h > full:
            w, h = w * full / h, full
        return w, h, cap

    def figure(self, f: Fig) -> None:
        r = f.rendered()
        w, h, cap = self.figure_size(f)
        self.need(h + len(cap) * 10 + 6)
        self.doc.image(self.page, id(r), r.idat, r.width_px, r.height_px, _M_L, self.y, w, h)
        self.y += h + 2
        self.text_block(f.caption, size=7.5, color=_GREY, gap=8)


def _cover(lay: _Layout, report: Report) -> None:
    d = lay.doc
    lay.y += 6
    for ln in _wrap(report.title, lay.width, "F2", 17):
        lay.y += 21
        d.text(lay.page, _M_L, lay.y, ln, font="F2", size=17)
    lay.y += 4
    lay.text_block(f"Generated {report.generated} by retime.", size=7.5, color=_GREY, gap=8)
    # headline figures in a row of boxes
    n = max(len(report.headline), 1)
    gap = 8.0
    bw = (lay.width - gap * (n - 1)) / n
    notes = [_wrap(note, bw - 12, "F1", 7) for _, _, note in report.headline]
    bh = 44 + 9 * max((len(x) for x in notes), default=0)
    for i, (label, value, _) in enumerate(report.headline):
        x = _M_L + i * (bw + gap)
        d.rect(lay.page, x, lay.y, bw, bh, fill=(0.955, 0.965, 0.98), stroke=(0.84, 0.86, 0.9))
        d.text(lay.page, x + 6, lay.y + 12, fit_text(label.upper(), bw - 12, "F1", 7), size=7,
               color=_GREY)
        # the value at 15 pt, smaller (down to 10 pt) before it would be cut
        vs = max(10.0, min(15.0, 15.0 * (bw - 12) / max(text_width(value, "F2", 15), 1e-9)))
        d.text(lay.page, x + 6, lay.y + 31, fit_text(value, bw - 12, "F2", vs), font="F2",
               size=vs)
        for k, ln in enumerate(notes[i]):
            d.text(lay.page, x + 6, lay.y + 43 + 9 * k, ln, size=7, color=_GREY)
    lay.y += bh + 10
    if report.scenario:
        lay.table(Table(caption="What-if scenario", header=["Key", "Value", "What it changes"],
                        rows=[[k, v, m] for k, v, m in report.scenario],
                        titles=[], numeric=[False, False, False]), None)
    kw = max((text_width(k, "F2", _BODY) for k, _ in report.facts), default=40) + 10
    for k, v in report.facts:
        lines = _wrap(v, lay.width - kw, "F1", _BODY)
        lay.need(len(lines) * 11.5)
        d.text(lay.page, _M_L, lay.y + 9, k, font="F2", size=_BODY)
        for j, ln in enumerate(lines):
            d.text(lay.page, _M_L + kw, lay.y + 9 + 11.5 * j, ln, size=_BODY)
        lay.y += 11.5 * len(lines) + 1.5
    lay.heading("Top findings", 11, keep=30)
    for i, f in enumerate(report.findings, 1):
        lay.text_block(f"{i}.", size=_BODY, gap=-_BODY * 1.32)
        lay.text_block(f, size=_BODY, indent=14, gap=3)


def layout_pdf(report: Report, *, paper: str = "a4", tables_dir: str | None = None) -> bytes:
    """The report as PDF bytes (``paper``: ``a4`` or ``letter``)."""
    doc = PdfDoc(paper, report.title)
    lay = _Layout(doc, report.title)
    _cover(lay, report)
    doc.bookmark("Summary", 0, _M_T)
    # the contents: one line per section, page numbers filled in after the layout
    lay.heading("Contents", 11, keep=14 * len(report.sections))
    toc_y = []
    for _ in report.sections:
        lay.need(13)
        lay.y += 13
        toc_y.append((lay.page, lay.y))
    starts = []
    for i, s in enumerate(report.sections):
        if i == 0:
            lay.new_page()
        # a heading stays with what follows it: the first paragraphs and the first figure
        # or the start of the first table
        keep = 0.0
        for b in s.blocks:
            if isinstance(b, str):
                keep += lay.text_height(b)
                continue
            keep += lay.figure_size(b)[1] + 20 if isinstance(b, Fig) else 60
            break
        lay.heading(s.title, 13, keep=min(keep, lay.bottom - _M_T - 40), rule=True)
        starts.append((lay.page, lay.y - 30))
        doc.bookmark(s.title, lay.page, max(lay.y - 30, 0))
        for j, b in enumerate(s.blocks):
            if isinstance(b, str):
                nxt = s.blocks[j + 1] if j + 1 < len(s.blocks) else None
                if isinstance(nxt, Fig):  # a paragraph stays with the figure it introduces
                    lay.need(lay.text_height(b) + lay.figure_size(nxt)[1] + 20)
                lay.text_block(b)
            elif isinstance(b, Table):
                lay.table(b, tables_dir)
            else:
                lay.figure(b)
        lay.y += 6
    for i, (s, (pg, y)) in enumerate(zip(report.sections, toc_y)):
        target, ty = starts[i]
        label = f"{i + 1}.  {s.title}"
        num = str(target + 1)
        doc.text(pg, _M_L + 4, y - 2, label, size=9.5)
        dots_x0 = _M_L + 8 + text_width(label, "F1", 9.5)
        dots_x1 = _M_L + lay.width - text_width(num, "F1", 9.5) - 6
        if dots_x1 > dots_x0:
            n_dots = int((dots_x1 - dots_x0) / text_width(". ", "F1", 9.5))
            doc.text(pg, dots_x0, y - 2, ". " * n_dots, size=9.5, color=(0.6, 0.6, 0.6))
        doc.text(pg, _M_L + lay.width, y - 2, num, size=9.5, align="right")
        doc.link(pg, _M_L, y - 12, lay.width, 13, target, ty)
    total = len(doc.pages)
    for pi in range(total):
        y = doc.height - _M_B + 26
        doc.line(pi, _M_L, y - 10, _M_L + lay.width, y - 10, color=(0.8, 0.8, 0.8), width=0.4)
        doc.text(pi, _M_L, y, fit_text(report.title, lay.width * 0.7, "F1", 7.5), size=7.5,
                 color=_GREY)
        doc.text(pi, _M_L + lay.width, y, f"page {pi + 1} of {total}", size=7.5, color=_GREY,
                 align="right")
    return doc.to_bytes()
