"""Model and hardware FLOPs utilization (MFU / HFU) where flops are known.

``HFU = executed flops / (step time * peak)`` with executed flops the sum of the ops'
``flops`` in the step (recomputed forward passes included: that is what the hardware ran).
``MFU`` uses the model flops of a step: ``meta['model_flops_per_step']`` (per rank, or one
number for every rank) when a collector knows them, otherwise the executed flops minus ops
marked as recomputation (name containing ``recompute``); without recomputation MFU == HFU.
Peak FLOP/s comes from ``meta['devices'][rank]`` (``peak_flops``, ``peak_flops_per_s`` or
``peak_tflops``) or, failing that, from the device name with the dense fp16/bf16 tensor peak
of well-known GPUs below. Unknown flops or peak give NaN, never a guess.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from ._util import _keep_step_mask, as_trace, step_windows

__all__ = ["PEAK_FLOPS", "peak_flops", "efficiency"]

#: dense fp16/bf16 tensor-core peak FLOP/s by device-name pattern (vendor datasheets)
PEAK_FLOPS: dict[str, float] = {
    r"B200": 2.25e15,
    r"H200": 989e12,
    r"H100": 989e12,
    r"MI300X": 1307e12,
    r"A100": 312e12,
    r"V100": 125e12,
    r"A10G?\b": 125e12,
    r"L4\b": 121e12,
    r"T4\b": 65e12,
}


def peak_flops(trace, rank: int) -> float:
    """Peak dense FLOP/s of ``rank``'s device (NaN when unknown)."""
    devs = trace.meta.get("devices") or {}
    d = devs.get(str(rank), devs.get(rank)) if isinstance(devs, dict) else None
    if d is None and isinstance(devs, list) and rank < len(devs):
        d = devs[rank]
    if isinstance(d, dict):
        for k, scale in (("peak_flops", 1.0), ("peak_flops_per_s", 1.0), ("peak_tflops", 1e12)):
            v = d.get(k)
            if isinstance(v, (int, float)) and v > 0:
                return float(v) * scale
        name = str(d.get("name", ""))
        for pat, v in PEAK_FLOPS.items():
            if re.search(pat, name, re.I):
                return v
    return float("nan")


def efficiency(x: Any) -> pd.DataFrame:
    """Per rank and step: ``step_ns``, ``flops`` (executed), ``model_flops``,
    ``peak_flops``, ``hfu``, ``mfu`` (NaN where unknown)."""
    t = as_trace(x)
    o = t.ops
    w = step_windows(t)
    out = w[["rank", "step"]].copy()
    out["step_ns"] = (w["end_ns"] - w["start_ns"]).to_numpy()
    fl = o["flops"].to_numpy()
    known = ~np.isnan(fl)
    keep = _keep_step_mask(o["rank"].to_numpy(), o["step"].to_numpy()) & known
    df = pd.DataFrame({"rank": o["rank"].to_numpy()[keep], "step": o["step"].to_numpy()[keep],
                       "flops": fl[keep]})
    names = t.names()[keep] if keep.any() else np.zeros(0, object)
    rec = np.array(["recompute" in str(n).lower() for n in names], bool)
    df["model"] = np.where(rec, 0.0, df["flops"].to_numpy())
    g = df.groupby(["rank", "step"]).agg(flops=("flops", "sum"), model=("model", "sum"))
    idx = pd.MultiIndex.from_frame(out[["rank", "step"]])
    out["flops"] = g["flops"].reindex(idx).to_numpy()
    model = g["model"].reindex(idx).to_numpy()
    mf = t.meta.get("model_flops_per_step")
    if isinstance(mf, (int, float)):
        model = np.full(len(out), float(mf))
    elif isinstance(mf, dict):
        model = np.array([float(mf.get(str(r), mf.get(r, np.nan))) for r in out["rank"]])
    out["model_flops"] = model
    out["peak_flops"] = [peak_flops(t, int(r)) for r in out["rank"]]
    sec = out["step_ns"].to_numpy() / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        out["hfu"] = out["flops"] / (sec * out["peak_flops"])
        out["mfu"] = out["model_flops"] / (sec * out["peak_flops"])
    return out
