"""The kernel cost model held against a measured trace (``retime cost op --trace``).

The trace's heaviest operators with recorded shapes (torch.profiler ``record_shapes=True``;
shapes read back by :func:`collectors.shapes.read_op_shapes`, FLOPs and bytes by
:func:`analysis.roofline.op_cost`) are priced by the cost layer on the trace's own GPU (a
self-check a user can read: the model against what was measured) and, optionally, on
another GPU. GEMMs by their ``m, n, k``; convolutions as implicit GEMMs; attention by
FlashAttention's rate; everything else as a streaming kernel of its bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from retime.collectors.errors import RetimeError

from ._util import as_trace
from .roofline import (
    _ATTN,
    _ATTN_BWD,
    _CONV,
    _GEMM,
    _base,
    _tensors,
    costed_ops,
    roofline_peaks,
)

__all__ = ["op_check"]


def _gemm_dims(b: str, ts: list) -> tuple[int, int, int, int] | None:
    """(batch, m, n, k) of a GEMM call."""
    if b == "linear":
        x, w = ts[0][0], ts[1][0]
        return 1, int(np.prod(x[:-1])), int(w[0]), int(x[-1])
    if b in ("addmm", "baddbmm"):
        ts = ts[1:]
    a, c = ts[0][0], ts[1][0]
    if b in ("mm", "addmm"):
        return 1, int(a[0]), int(c[1]), int(a[1])
    return int(a[0]), int(a[1]), int(c[2]), int(a[2])


def _price(g, name: str, dims: list, types: list, flops: float, nbytes: float, dtype: str):
    from retime.collectors.costs import kernels as K

    b = _base(name)
    ts = _tensors(dims, types)
    if dtype not in g.hw.peak_tflops and dtype not in ("fp16", "bf16"):
        dtype = "fp32" if "fp32" in g.hw.peak_tflops else "bf16"
    if b in _GEMM:
        bt, m, n, k = _gemm_dims(b, ts)
        return K.matmul(g, m, n, k, bt, dtype)
    if b in _CONV or b == "convolution_backward":
        w = ts[1][0] if b in _CONV else ts[2][0]
        kc = int(w[1]) * int(np.prod(w[2:]))
        m = flops / (2.0 * int(w[0]) * kc)
        return K.implicit_gemm(g, max(m, 1.0), int(w[0]), kc, dtype, nbytes, "conv")
    if b in _ATTN or b in _ATTN_BWD:
        q, kk = ts[0][0], ts[1][0]
        return K.attention(g, int(q[0]), int(q[1]), int(q[2]), int(q[3]),
                           kv_heads=int(kk[1]) if int(q[1]) % int(kk[1]) == 0 else None,
                           backward=b in _ATTN_BWD, dtype=dtype)
    return K.memory_bound(g, b, flops, nbytes)


def op_check(x: Any, *, gpu: str | None = None, top: int = 10,
             trace_gpu: str | None = None) -> pd.DataFrame:
    """The ``top`` operators by measured device time (grouped by name, shapes and dtype)
    with the model's time per call on the trace's own GPU and, with ``gpu``, on that one.

    Returns a DataFrame with ``op``, ``shapes``, ``dtype``, ``count``, ``measured_us``
    (mean device time per call), ``model_us``, ``error`` (model / measured - 1),
    ``range_lo_us``, ``range_hi_us``, ``bound``, and with ``gpu`` ``other_us`` and
    ``speedup`` (measured / other). ``attrs``: ``trace_gpu``, ``gpu``, ``median_abs_error``.
    """
    from retime.collectors.costs.gpus import gpu_spec
    from retime.collectors.enums import OpKind

    t = as_trace(x)
    own = trace_gpu or roofline_peaks(t)["name"]
    g_own = gpu_spec(own)
    g_other = gpu_spec(gpu) if gpu else None
    o = t.ops
    kind = o["kind"].to_numpy()
    dev = np.isin(kind, [OpKind.KERNEL, OpKind.MEMSET, OpKind.COMPUTE])
    groups: dict[tuple, list] = {}
    for name, dims, types, c, d in costed_ops(t, dev):
        k = (name, str([x for x in dims if isinstance(x, list) and x]), c[2])
        e = groups.setdefault(k, [0, 0.0, dims, types, c[0], c[1]])
        e[0] += 1
        e[1] += d
    if not groups:
        raise RetimeError("cost op --trace: no operator with recorded shapes launched GPU "
                          "work; record the run with torch.profiler's record_shapes=True")
    rows = []
    for (name, shapes, dt), (n, tot, dims, types, fl, by) in sorted(
            groups.items(), key=lambda kv: -kv[1][1])[:top]:
        try:
            m = _price(g_own, name, dims, types, fl, by, dt)
            other = _price(g_other, name, dims, types, fl, by, dt) if g_other else None
        except (RetimeError, ValueError, IndexError, ZeroDivisionError):
            continue
        meas = tot / n / 1e3
        r = {"op": name, "shapes": shapes, "dtype": dt, "count": n, "measured_us": meas,
             "model_us": m.time_us, "error": m.time_us / meas - 1,
             "range_lo_us": m.range_us[0], "range_hi_us": m.range_us[1], "bound": m.bound}
        if other is not None:
            r["other_us"] = other.time_us
            r["speedup"] = meas / other.time_us
        rows.append(r)
    df = pd.DataFrame(rows)
    df.attrs.update(trace_gpu=own, gpu=gpu,
                    median_abs_error=float(np.median(np.abs(df["error"]))) if len(df) else
                    float("nan"))
    return df
