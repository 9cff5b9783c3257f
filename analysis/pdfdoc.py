"""A small PDF writer for reports: text in the standard fonts, rules and boxes, PNG images,
internal links and bookmarks (PDF 1.4, ISO 32000-1 object syntax).

Why not matplotlib's ``PdfPages``: a report is a document (one page size, tables flowing
over pages, page numbers, a table of contents whose entries link to their pages,
bookmarks), and drawing text through matplotlib costs ~1 ms per table cell. Here text uses
the PDF standard fonts (Helvetica, Helvetica-Bold, Courier; nothing embedded, WinAnsi
encoding) measured with their AFM metrics (the files matplotlib ships), and figures are the
PNGs already rendered for the HTML report: their zlib stream goes into the PDF as is (PNG
row predictors, ``/Predictor 15``), so a figure is drawn once for both formats.

Coordinates are PDF points (1/72 in) from the page's top-left corner (``y`` grows
downwards); the writer flips them.
"""

from __future__ import annotations

import datetime as _dt
import os
import zlib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

__all__ = ["PdfDoc", "PAGE_SIZES", "text_width", "fit_text"]

#: paper sizes in points (width, height)
PAGE_SIZES = {"a4": (595.276, 841.89), "letter": (612.0, 792.0)}

_FONTS = {"F1": "Helvetica", "F2": "Helvetica-Bold", "F3": "Courier"}
_AFM = {"F1": "phvr8a.afm", "F2": "phvb8a.afm"}
# glyph names of the non-ASCII characters reports use (WinAnsi has them all)
_EXTRA = {"…": "ellipsis", "–": "endash", "—": "emdash", "×": "multiply", "µ": "mu",
          "·": "periodcentered", "•": "bullet", "’": "quoteright", "‘": "quoteleft",
          "“": "quotedblleft", "”": "quotedblright", "±": "plusminus", "°": "degree",
          "é": "eacute", "ü": "udieresis"}
_REPLACE = {"→": "->", "≤": "<=", "≥": ">=", "Δ": "d", "−": "-", "≈": "~"}


@cache
def _widths(font: str) -> dict[str, float]:
    """Character -> advance width (1/1000 em) of a standard font, from its AFM file."""
    if font == "F3":
        return {}
    import matplotlib

    path = Path(matplotlib.get_data_path()) / "fonts" / "afm" / _AFM[font]
    by_name: dict[str, float] = {}
    by_code: dict[int, float] = {}
    for line in path.read_text(encoding="latin-1").splitlines():
        if not line.startswith("C "):
            continue
        fields = dict(f.strip().split(" ", 1) for f in line.split(";") if f.strip())
        w = float(fields["WX"])
        by_name[fields["N"]] = w
        code = int(fields["C"])
        if code >= 0:
            by_code[code] = w
    out = {chr(c): by_code[c] for c in range(32, 127) if c in by_code}
    out["'"] = by_name.get("quotesingle", out.get("'", 278))
    out["`"] = by_name.get("grave", out.get("`", 278))
    for ch, name in _EXTRA.items():
        if name in by_name:
            out[ch] = by_name[name]
    return out


def _clean(s: str) -> str:
    for a, b in _REPLACE.items():
        if a in s:
            s = s.replace(a, b)
    return s


def text_width(s: str, font: str = "F1", size: float = 9.0) -> float:
    """Width in points of ``s`` set in ``font`` at ``size`` points."""
    s = _clean(s)
    if font == "F3":
        return 0.6 * size * len(s)
    w = _widths(font)
    return sum(w.get(ch, 556.0) for ch in s) * size / 1000.0


def fit_text(s: str, width: float, font: str = "F1", size: float = 9.0) -> str:
    """``s`` cut (with an ellipsis) to fit in ``width`` points."""
    if text_width(s, font, size) <= width:
        return s
    lo, hi = 0, len(s)
    while lo < hi:  # longest prefix that fits with the ellipsis
        mid = (lo + hi + 1) // 2
        if text_width(s[:mid] + "…", font, size) <= width:
            lo = mid
        else:
            hi = mid - 1
    return s[:lo].rstrip() + "…" if lo else ""


def _pdf_str(s: str) -> bytes:
    """A literal string in WinAnsi (cp1252); characters it lacks become '?'."""
    b = _clean(s).encode("cp1252", errors="replace")
    return b"(" + b.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)") + b")"


def _pdf_text_utf16(s: str) -> bytes:
    """A text string (outline titles, document info) as UTF-16BE with a byte-order mark."""
    return b"<FEFF" + s.encode("utf-16-be").hex().upper().encode() + b">"


def _num(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".") if v != int(v) else str(int(v))


@dataclass
class _Image:
    width_px: int
    height_px: int
    idat: bytes  # zlib stream of PNG-filtered RGB rows


@dataclass
class _Page:
    ops: list[bytes] = field(default_factory=list)
    images: set[int] = field(default_factory=set)
    links: list[tuple[float, float, float, float, int, float]] = field(default_factory=list)


class PdfDoc:
    """Pages of text, boxes and images; :meth:`save` writes the file.

    Parameters
    ----------
    paper : ``"a4"`` or ``"letter"``
    title : the document title (document info and the viewer's window title)
    """

    def __init__(self, paper: str = "a4", title: str = "") -> None:
        if paper not in PAGE_SIZES:
            from retime.collectors.errors import RetimeError
            raise RetimeError(f"paper={paper!r}: choose one of {', '.join(PAGE_SIZES)}")
        self.width, self.height = PAGE_SIZES[paper]
        self.title = title
        self.pages: list[_Page] = []
        self._images: list[_Image] = []
        self._image_ids: dict[int, int] = {}
        self.outline: list[tuple[str, int, float]] = []  # (title, page index, y from top)

    # ---------------------------------------------------------------- building
    def new_page(self) -> int:
        self.pages.append(_Page())
        return len(self.pages) - 1

    def _op(self, page: int, op: str | bytes) -> None:
        self.pages[page].ops.append(op.encode("latin-1") if isinstance(op, str) else op)

    def text(self, page: int, x: float, y: float, s: str, *, font: str = "F1",
             size: float = 9.0, color: tuple[float, float, float] = (0.13, 0.13, 0.13),
             align: str = "left") -> None:
        """Text with its baseline at ``y`` (from the top); ``align`` left/right/center
        about ``x``."""
        if not s:
            return
        if align != "left":
            w = text_width(s, font, size)
            x = x - w if align == "right" else x - w / 2
        r, g, b = color
        self._op(page, f"BT {_num(r)} {_num(g)} {_num(b)} rg /{font} {_num(size)} Tf "
                       f"{_num(x)} {_num(self.height - y)} Td ".encode() + _pdf_str(s) + b" Tj ET")

    def rect(self, page: int, x: float, y: float, w: float, h: float, *,
             fill: tuple[float, float, float] | None = None,
             stroke: tuple[float, float, float] | None = None, line_width: float = 0.5) -> None:
        """A box with its top-left corner at (x, y)."""
        ops = []
        if fill is not None:
            ops.append(f"{_num(fill[0])} {_num(fill[1])} {_num(fill[2])} rg")
        if stroke is not None:
            ops.append(f"{_num(stroke[0])} {_num(stroke[1])} {_num(stroke[2])} RG "
                       f"{_num(line_width)} w")
        paint = "B" if fill is not None and stroke is not None else ("f" if fill is not None
                                                                     else "S")
        ops.append(f"{_num(x)} {_num(self.height - y - h)} {_num(w)} {_num(h)} re {paint}")
        self._op(page, "q " + " ".join(ops) + " Q")

    def line(self, page: int, x0: float, y0: float, x1: float, y1: float, *,
             color: tuple[float, float, float] = (0.6, 0.6, 0.6), width: float = 0.5) -> None:
        self._op(page, f"q {_num(color[0])} {_num(color[1])} {_num(color[2])} RG "
                       f"{_num(width)} w {_num(x0)} {_num(self.height - y0)} m "
                       f"{_num(x1)} {_num(self.height - y1)} l S Q")

    def image(self, page: int, key: int, idat: bytes, width_px: int, height_px: int,
              x: float, y: float, w: float, h: float) -> None:
        """Draw a PNG image (its zlib IDAT stream of 8-bit RGB rows) in the box at (x, y);
        ``key`` identifies the image so that a figure used twice is stored once."""
        idx = self._image_ids.get(key)
        if idx is None:
            idx = len(self._images)
            self._images.append(_Image(width_px, height_px, idat))
            self._image_ids[key] = idx
        self.pages[page].images.add(idx)
        self._op(page, f"q {_num(w)} 0 0 {_num(h)} {_num(x)} {_num(self.height - y - h)} cm "
                       f"/Im{idx} Do Q")

    def link(self, page: int, x: float, y: float, w: float, h: float, target_page: int,
             target_y: float = 0.0) -> None:
        """A clickable box that jumps to ``target_page`` at ``target_y`` (from the top)."""
        self.pages[page].links.append((x, y, w, h, target_page, target_y))

    def bookmark(self, title: str, page: int, y: float) -> None:
        """An entry of the viewer's outline (bookmarks) pointing at ``page``."""
        self.outline.append((title, page, y))

    # ---------------------------------------------------------------- writing
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the document (objects, cross-reference table, trailer)."""
        Path(path).write_bytes(self.to_bytes())

    def to_bytes(self) -> bytes:
        objs: list[bytes] = []  # object i+1

        def add(body: bytes) -> int:
            objs.append(body)
            return len(objs)

        def reserve() -> int:
            objs.append(b"")
            return len(objs)

        catalog = reserve()
        pages_id = reserve()
        font_ids = {k: add(f"<< /Type /Font /Subtype /Type1 /BaseFont /{v} /Encoding "
                           f"/WinAnsiEncoding >>".encode()) for k, v in _FONTS.items()}
        img_ids = []
        for im in self._images:
            head = (f"<< /Type /XObject /Subtype /Image /Width {im.width_px} /Height "
                    f"{im.height_px} /ColorSpace /DeviceRGB /BitsPerComponent 8 /Filter "
                    f"/FlateDecode /DecodeParms << /Predictor 15 /Colors 3 /BitsPerComponent 8 "
                    f"/Columns {im.width_px} >> /Length {len(im.idat)} >>").encode()
            img_ids.append(add(head + b"\nstream\n" + im.idat + b"\nendstream"))
        page_ids = [reserve() for _ in self.pages]
        fonts = " ".join(f"/{k} {v} 0 R" for k, v in font_ids.items())
        for pi, pg in enumerate(self.pages):
            content = zlib.compress(b"\n".join(pg.ops), 6)
            cid = add(f"<< /Length {len(content)} /Filter /FlateDecode >>".encode()
                      + b"\nstream\n" + content + b"\nendstream")
            annots = []
            for x, y, w, h, tp, ty in pg.links:
                if not 0 <= tp < len(self.pages):
                    continue
                rect = (f"{_num(x)} {_num(self.height - y - h)} {_num(x + w)} "
                        f"{_num(self.height - y)}")
                annots.append(add(f"<< /Type /Annot /Subtype /Link /Rect [{rect}] /Border [0 0 0]"
                                  f" /Dest [{page_ids[tp]} 0 R /XYZ 0 "
                                  f"{_num(self.height - ty)} 0] >>".encode()))
            xo = " ".join(f"/Im{i} {img_ids[i]} 0 R" for i in sorted(pg.images))
            res = f"<< /Font << {fonts} >>" + (f" /XObject << {xo} >>" if xo else "") + " >>"
            an = f" /Annots [{' '.join(f'{a} 0 R' for a in annots)}]" if annots else ""
            objs[page_ids[pi] - 1] = (
                f"<< /Type /Page /Parent {pages_id} 0 R /MediaBox [0 0 {_num(self.width)} "
                f"{_num(self.height)}] /Resources {res} /Contents {cid} 0 R{an} >>").encode()
        kids = " ".join(f"{p} 0 R" for p in page_ids)
        objs[pages_id - 1] = f"<< /Type /Pages /Kids [{kids}] /Count {len(page_ids)} >>".encode()
        outline_ref = ""
        if self.outline:
            root = reserve()
            items = [reserve() for _ in self.outline]
            for i, (title, pg, y) in enumerate(self.outline):
                links = f"/Parent {root} 0 R"
                if i:
                    links += f" /Prev {items[i - 1]} 0 R"
                if i + 1 < len(items):
                    links += f" /Next {items[i + 1]} 0 R"
                objs[items[i] - 1] = (b"<< /Title " + _pdf_text_utf16(title) + (
                    f" {links} /Dest [{page_ids[pg]} 0 R /XYZ 0 {_num(self.height - y)} 0] >>"
                ).encode())
            objs[root - 1] = (f"<< /Type /Outlines /First {items[0]} 0 R /Last {items[-1]} 0 R "
                              f"/Count {len(items)} >>").encode()
            outline_ref = f" /Outlines {root} 0 R /PageMode /UseOutlines"
        objs[catalog - 1] = f"<< /Type /Catalog /Pages {pages_id} 0 R{outline_ref} >>".encode()
        now = _dt.datetime.now(_dt.timezone.utc).strftime("D:%Y%m%d%H%M%SZ")
        info = add(b"<< /Title " + _pdf_text_utf16(self.title) + b" /Producer (retime) "
                   b"/CreationDate (" + now.encode() + b") >>")
        out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
        offsets = []
        for i, body in enumerate(objs, 1):
            offsets.append(len(out))
            out += f"{i} 0 obj\n".encode() + body + b"\nendobj\n"
        xref = len(out)
        out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode()
        out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
        out += (f"trailer\n<< /Size {len(objs) + 1} /Root {catalog} 0 R /Info {info} 0 R >>\n"
                f"startxref\n{xref}\n%%EOF\n").encode()
        return bytes(out)
