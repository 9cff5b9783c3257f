"""HTML rendering of a :class:`~analysis.report_model.Report` (Jinja2, autoescaped).

Every name from a trace is untrusted text: autoescaping shows ``<script>`` in a kernel name
literally, and the page's Content-Security-Policy forbids scripts and remote resources on
top. Figures are inline base64 PNGs (rendered once, shared with the PDF), styles inline:
the file opens anywhere with no network.
"""

from __future__ import annotations

import base64
from pathlib import Path

from .report_model import Fig, Report
from .tables import Table

__all__ = ["render_html"]

_TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"


def _table_ctx(t: Table, tables_dir: str | None) -> dict:
    classes = []
    for j, num in enumerate(t.numeric):
        has_title = any(r[j] for r in t.titles) if t.titles else False
        classes.append("num" if num else ("name" if has_title else "text"))
    pre, href, post = t.note, "", ""
    if "{csv}" in t.note:
        pre, _, post = t.note.partition("{csv}")
        href = f"{tables_dir}/{t.csv_name}.csv" if tables_dir and t.csv_name else ""
        if not href:  # not written beside the report (e.g. rendered to a string)
            pre = pre.removesuffix("; all of them in ")
    return {"type": "table", "caption": t.caption, "header": t.header, "rows": t.rows,
            "titles": t.titles or [[None] * len(t.header) for _ in t.rows],
            "numeric": t.numeric, "classes": classes, "note_pre": pre, "href": href,
            "note_post": post}


def _fig_ctx(f: Fig) -> dict:
    r = f.rendered()
    return {"type": "figure", "key": f.key, "caption": f.caption, "legend": f.legend,
            "width": r.width_px, "height": r.height_px,
            "png_b64": base64.b64encode(r.png).decode("ascii")}


def render_html(report: Report, *, tables_dir: str | None = None) -> str:
    """The report as one self-contained HTML string. ``tables_dir`` is the folder (relative
    to the report) holding the CSVs of cut tables."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(_TEMPLATE_DIR)),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    tpl = env.get_template("report.html.j2")
    sections = []
    for s in report.sections:
        blocks = []
        for b in s.blocks:
            if isinstance(b, str):
                blocks.append({"type": "p", "text": b})
            elif isinstance(b, Table):
                blocks.append(_table_ctx(b, tables_dir))
            else:
                blocks.append(_fig_ctx(b))
        sections.append({"key": s.key, "title": s.title, "blocks": blocks})
    return tpl.render(title=report.title, kind=report.kind, headline=report.headline,
                      scenario=report.scenario, facts=report.facts, findings=report.findings,
                      sections=sections, generated=report.generated)
