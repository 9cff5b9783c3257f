"""Model and hardware FLOPs utilization (MFU / HFU) where flops are known.

``HFU = executed flops / (step time * peak)`` with executed flops the sum of the ops'
``flops`` in the step (recomputed forward passes included: that is what the hardware ran).
``MFU`` uses the model flops of a step: ``meta['model_flops_per_step']`` (per rank, or one
number for every rank) when a collector knows them, otherwise the executed flops minus ops
marked as recomputation (name containing ``recompute``); without recomputation MFU == HFU.
Peak FLOP/s comes from ``meta['devices'][rank]`` (``peak_flops``, ``peak_flops_per_s`` or
``peak_tflops``; per rank and device, or one entry for all ranks) or, failing that, from the
device name (:func:`collectors.devices.device_peaks`). A modeled run's
``meta['synth']['model_flops_per_step']`` is the job's total and is split evenly over ranks.
Unknown flops or peak give NaN, never a guess.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from retime.collectors.devices import device_peaks

from ._util import _keep_step_mask, as_trace, step_windows

__all__ = ["peak_flops", "efficiency", "job_efficiency"]

def _device_entry(trace, rank: int) -> dict | None:
    devs = trace.meta.get("devices") or {}
    if not isinstance(devs, dict):
        return None
    if "peak_flops" in devs or "name" in devs or "gpu" in devs:
        return devs  # one description for every rank (modeled runs)
    d = devs.get(str(rank), devs.get(rank))
    if isinstance(d, dict) and d and all(isinstance(v, dict) for v in d.values()):
        d = next(iter(d.values()))  # {rank: {device: {...}}}: the rank's (first) device
    return d if isinstance(d, dict) else None


def peak_flops(trace, rank: int) -> float:
    """Peak dense FLOP/s of ``rank``'s device (NaN when unknown)."""
    d = _device_entry(trace, rank)
    if d is None:
        return float("nan")
    for k, scale in (("peak_flops", 1.0), ("peak_flops_per_s", 1.0), ("peak_tflops", 1e12)):
        v = d.get(k)
        if isinstance(v, (int, float)) and v > 0:
            return float(v) * scale
    v = device_peaks(str(d.get("name") or d.get("gpu") or "")).get("peak_flops")
    return float(v) if v else float("nan")


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
    rec_name = np.array(["recompute" in n.lower() for n in t.strings], bool)
    rec = rec_name[o["name_id"].to_numpy()[keep]] if len(rec_name) else np.zeros(0, bool)
    df["model"] = np.where(rec, 0.0, df["flops"].to_numpy())
    g = df.groupby(["rank", "step"]).agg(flops=("flops", "sum"), model=("model", "sum"))
    idx = pd.MultiIndex.from_frame(out[["rank", "step"]])
    out["flops"] = g["flops"].reindex(idx).to_numpy()
    model = g["model"].reindex(idx).to_numpy()
    mf = t.meta.get("model_flops_per_step")
    syn = t.meta.get("synth") or {}
    if mf is None and isinstance(syn.get("model_flops_per_step"), (int, float)):
        mf = float(syn["model_flops_per_step"]) / max(int(syn.get("world_size") or
                                                          t.world_size or 1), 1)
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


def job_efficiency(x: Any | pd.DataFrame) -> dict[str, float]:
    """Job-level MFU/HFU: per step, all ranks' flops over (slowest rank's step time x the sum
    of the ranks' peaks), averaged over steps. NaN when flops or peaks are unknown."""
    e = x if isinstance(x, pd.DataFrame) else efficiency(x)
    out = {"mfu": float("nan"), "hfu": float("nan")}
    if len(e) == 0 or not e["peak_flops"].notna().any():
        return out
    g = e.groupby("step").agg(step_ns=("step_ns", "max"), flops=("flops", "sum"),
                              model=("model_flops", "sum"), peak=("peak_flops", "sum"),
                              known=("flops", "count"), known_m=("model_flops", "count"))
    sec = g["step_ns"] / 1e9
    if (g["known"] > 0).all():
        out["hfu"] = float((g["flops"] / (sec * g["peak"])).mean())
    if (g["known_m"] > 0).all():
        out["mfu"] = float((g["model"] / (sec * g["peak"])).mean())
    return out
