"""The kernel cost model held against a measured trace (``retime cost op --trace``).

The trace's heaviest operators with recorded shapes (torch.profiler ``record_shapes=True``;
shapes read back by :func:`collectors.shapes.read_op_shapes`, FLOPs and bytes by
:func:`analysis.roofline.op_cost`) are priced by the cost layer on the trace's own GPU (a
self-check a user can read: the model against what was measured) and, optionally, on
another GPU. GEMMs by their ``m, n, k``; convolutions as implicit GEMMs; attention by
FlashAttention's rate; everything else as a streaming kernel of its bytes; with the
efficiency curves fitted on the shared traces (``FITTED_CURVES``, ``bench/kernel_loo.py``)
and one launch floor per kernel the call launched: what ``hardware.gpu`` and
``parallel.micro_batch`` charge on a measured trace. An FP32-operand GEMM / convolution is
priced in the math its kernels' names show (``tf32`` for ``*tf32f32*`` kernels) where the GPU
has TF32 units, as ``hardware.gpu`` prices it on the measured GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from retime.collectors.errors import RetimeError

from ._util import as_trace
from .roofline import costed_ops, roofline_peaks

__all__ = ["op_check"]


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
    from retime.collectors.costs.kernels import FITTED_CURVES
    from retime.collectors.costs.ops import price_op
    from retime.collectors.enums import OpKind

    t = as_trace(x)
    own = trace_gpu or roofline_peaks(t)["name"]
    g_own = gpu_spec(own)
    g_other = gpu_spec(gpu) if gpu else None
    o = t.ops
    kind = o["kind"].to_numpy()
    dev = np.isin(kind, [OpKind.KERNEL, OpKind.MEMSET, OpKind.COMPUTE])
    groups: dict[tuple, list] = {}
    from retime.collectors.costs.ops import op_class
    from retime.replay.policies.kernel_cost import _measured_math
    from retime.replay.policies.math_modes import tf32_capable
    own_tf32 = tf32_capable(g_own)
    for name, dims, types, c, d, kn in costed_ops(t, dev):
        if own_tf32 and c[2] in ("fp32", "tf32") and op_class(name) in ("gemm", "conv"):
            # FP32 operands run in the math the call's kernels show (TF32 tensor cores with
            # allow_tf32), as hardware.gpu prices the same call on the measured GPU
            c = (c[0], c[1], _measured_math(kn) or c[2])
        k = (name, str([x for x in dims if isinstance(x, list) and x]), c[2])
        e = groups.setdefault(k, [0, 0.0, dims, types, c[0], c[1], 0, kn])
        e[0] += 1
        e[1] += d
        e[6] += len(kn)
    if not groups:
        raise RetimeError("cost op --trace: no operator with recorded shapes launched GPU "
                          "work; record the run with torch.profiler's record_shapes=True")
    rows = []
    for (name, shapes, dt), (n, tot, dims, types, fl, by, nk, kn) in sorted(
            groups.items(), key=lambda kv: -kv[1][1])[:top]:
        launches = max(1, round(nk / n))
        # the first call's kernels, when it launched the typical number of them
        kn = kn if len(kn) == launches else None
        try:
            m = price_op(g_own, name, dims, types, (fl, by, dt), FITTED_CURVES, launches, kn)
            other = price_op(g_other, name, dims, types, (fl, by, dt), FITTED_CURVES,
                             launches, kn) if g_other else None
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
