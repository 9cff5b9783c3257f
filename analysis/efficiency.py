"""Model and hardware FLOPs utilization (MFU / HFU) where flops are known.

Definitions (Chowdhery et al., PaLM, appendix B; Korthikanti et al.): ``MFU`` counts the
flops the *model* needs for a step, ``HFU`` the flops the *hardware* executed, which are the
model's plus any work done again (activation recomputation). Both are divided by
``step time * peak``. The hardware never runs fewer flops than the model needs, so
``HFU >= MFU`` holds by construction, never by clamping:

* model flops ``M`` of a rank and step: ``meta['model_flops_per_step']`` (per rank, or one
  number for every rank) when a collector knows them; a modeled run's
  ``meta['synth']['model_flops_per_step']`` is the job's total and is shared among the ranks
  in proportion to the model work their ops carry (their non-recomputed op flops; evenly when
  the ops carry none); otherwise the executed op flops minus the recomputed ones.
* executed op flops ``E`` (sum of the ops' ``flops``) and recomputed op flops ``R`` (ops
  whose name contains ``recompute``) of the rank and step.
* hardware flops ``H = M * E / (E - R)``: the recomputed share of the executed work added to
  the model flops *in the model's own units*. An analytic model formula and a sum of op
  flops can count differently (causal attention halved or not, the padded vocabulary, small
  ops without flops), so adding raw op flops to a formula, or using the raw op sum as ``H``
  while ``M`` comes from the formula, can put HFU below MFU; scaling by the same ratio
  cannot. With no recomputation ``H == M`` and HFU == MFU.

Peak FLOP/s comes from ``meta['devices'][rank]`` (``peak_flops``, ``peak_flops_per_s`` or
``peak_tflops``; per rank and device, or one entry for all ranks) or, failing that, from the
device name (:func:`collectors.devices.device_peaks`). Unknown flops or peak give NaN, never
a guess (HFU is NaN when the ops carry no flops, even if the model flops are known).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from retime.collectors.devices import device_peaks

from ._util import _keep_step_mask, as_trace, step_windows

__all__ = ["peak_flops", "efficiency", "job_efficiency", "op_flops", "finish_efficiency"]

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
    """Per rank and step: ``step_ns``, ``flops`` (executed op flops), ``recompute_flops``,
    ``model_flops``, ``hardware_flops``, ``peak_flops``, ``hfu``, ``mfu`` (NaN where
    unknown; see the module docstring for the definitions)."""
    t = as_trace(x)
    return finish_efficiency(op_flops(t), t)


def op_flops(t) -> pd.DataFrame:
    """Per rank and step (the step windows' rows): ``step_ns``, ``flops`` (executed op
    flops, NaN when the rank's ops in the step carry none) and ``recompute_flops``. Per
    rank: a streamed report sums them a batch of ranks at a time."""
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
    df["rec"] = np.where(rec, df["flops"].to_numpy(), 0.0)
    g = df.groupby(["rank", "step"]).agg(flops=("flops", "sum"), rec=("rec", "sum"))
    idx = pd.MultiIndex.from_frame(out[["rank", "step"]])
    out["flops"] = g["flops"].reindex(idx).to_numpy()
    out["recompute_flops"] = g["rec"].reindex(idx).to_numpy()
    return out


def finish_efficiency(out: pd.DataFrame, t) -> pd.DataFrame:
    """:func:`efficiency` from the :func:`op_flops` rows of every rank; of ``t`` only its
    meta and world size are read (model flops, device peaks)."""
    out = out.copy()
    executed = out["flops"].to_numpy()
    recomputed = out["recompute_flops"].to_numpy()
    model_ops = executed - recomputed  # NaN where the rank's ops carry no flops
    mf = t.meta.get("model_flops_per_step")
    syn = t.meta.get("synth") or {}
    if isinstance(mf, (int, float)):
        model = np.full(len(out), float(mf))
    elif isinstance(mf, dict):
        model = np.array([float(mf.get(str(r), mf.get(r, np.nan))) for r in out["rank"]])
    elif isinstance(syn.get("model_flops_per_step"), (int, float)):
        model = _share_job_flops(out, model_ops, float(syn["model_flops_per_step"]),
                                 int(syn.get("world_size") or t.world_size or 1))
    else:
        model = model_ops
    with np.errstate(divide="ignore", invalid="ignore"):
        # H = M * E / (E - R): the recomputed share in the model's units (module docstring)
        ratio = np.where(model_ops > 0, executed / model_ops,
                         np.where(executed == 0, 1.0, np.nan))  # NaN: no op flops known
    out["model_flops"] = model
    out["hardware_flops"] = model * ratio
    out["peak_flops"] = [peak_flops(t, int(r)) for r in out["rank"]]
    sec = out["step_ns"].to_numpy() / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        out["hfu"] = out["hardware_flops"] / (sec * out["peak_flops"])
        out["mfu"] = out["model_flops"] / (sec * out["peak_flops"])
    return out


def _share_job_flops(out: pd.DataFrame, model_ops: np.ndarray, total: float,
                     world_size: int) -> np.ndarray:
    """A job's model flops per step shared among (rank, step) rows: in proportion to each
    rank's model work in its ops within the step, evenly (total / world size) where the
    step's ops carry no flops."""
    even = np.full(len(out), total / max(world_size, 1))
    if not np.isfinite(model_ops).any():
        return even
    w = np.nan_to_num(model_ops, nan=0.0)
    step_sum = pd.Series(w).groupby(out["step"].to_numpy()).transform("sum").to_numpy()
    # the ranks present may be a subset (representatives of identical ranks): scale to them
    ranks_present = out.groupby("step")["rank"].transform("nunique").to_numpy()
    share = total * ranks_present / max(world_size, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        prop = share * w / step_sum
    return np.where(step_sum > 0, prop, even)


def job_efficiency(x: Any | pd.DataFrame) -> dict[str, float]:
    """Job-level MFU/HFU: per step, all ranks' model (hardware) flops over (slowest rank's
    step time x the sum of the ranks' peaks), averaged over steps. NaN when flops or peaks
    are unknown. HFU >= MFU whenever both are known (module docstring)."""
    e = x if isinstance(x, pd.DataFrame) else efficiency(x)
    out = {"mfu": float("nan"), "hfu": float("nan")}
    if len(e) == 0 or not e["peak_flops"].notna().any():
        return out
    hw = e["hardware_flops"] if "hardware_flops" in e else e["flops"]
    g = e.assign(hw=hw).groupby("step").agg(
        step_ns=("step_ns", "max"), hw=("hw", "sum"), model=("model_flops", "sum"),
        peak=("peak_flops", "sum"), known=("hw", "count"), known_m=("model_flops", "count"))
    sec = g["step_ns"] / 1e9
    if (g["known"] > 0).all():
        out["hfu"] = float((g["hw"] / (sec * g["peak"])).mean())
    if (g["known_m"] > 0).all():
        out["mfu"] = float((g["model"] / (sec * g["peak"])).mean())
    return out
