"""Figures rendered once, as PNG, for both report formats.

:func:`render_png` draws a matplotlib Figure with the Agg canvas and encodes the pixels as a
PNG by hand (8-bit RGB, each row filtered with PNG's "Up" filter, one zlib stream). The same
zlib stream is what a PDF image with ``/Predictor 15`` expects, so the PDF writer
(:mod:`analysis.pdfdoc`) embeds it without decoding or compressing again.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure

__all__ = ["Rendered", "render_png"]


@dataclass(frozen=True)
class Rendered:
    """A figure's pixels: ``png`` (a complete file), ``idat`` (its zlib stream), size."""

    png: bytes
    idat: bytes
    width_px: int
    height_px: int


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))


def encode_png(rgb: np.ndarray, level: int = 6) -> Rendered:
    """Encode an (h, w, 3) uint8 array as PNG (rows with the "Up" filter)."""
    h, w, _ = rgb.shape
    rows = rgb.reshape(h, w * 3)
    up = rows.copy()
    up[1:] -= rows[:-1]  # uint8 arithmetic wraps modulo 256, as the filter defines
    raw = np.empty((h, w * 3 + 1), np.uint8)
    raw[:, 0] = 2  # filter type 2 (Up) on every row; the first row's "above" is zeros
    raw[:, 1:] = up
    idat = zlib.compress(raw.tobytes(), level)
    png = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + _chunk(b"IDAT", idat) + _chunk(b"IEND", b""))
    return Rendered(png=png, idat=idat, width_px=w, height_px=h)


def render_png(fig: Figure, dpi: float = 100.0) -> Rendered:
    """Draw ``fig`` at ``dpi`` and return its PNG (white background)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig.set_dpi(dpi)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    buf = np.asarray(canvas.buffer_rgba())
    rgb = np.ascontiguousarray(buf[..., :3])
    alpha = buf[..., 3]
    if (alpha != 255).any():  # composite over white
        a = alpha[..., None].astype(np.uint16)
        rgb = ((rgb.astype(np.uint16) * a + 255 * (255 - a)) // 255).astype(np.uint8)
    return encode_png(rgb)
