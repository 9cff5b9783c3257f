"""Roofline per operator: FLOPs and bytes from recorded shapes against the GPU's peaks.

Measured Kineto traces recorded with ``record_shapes=True``: each operator instance below
(its ``Input Dims`` / ``Input type`` / ``Concrete Inputs``, read back from the trace's
source files by :func:`collectors.shapes.read_op_shapes`) owns the GPU ops launched inside
it, and its work follows from its shapes:

* GEMM: ``mm`` / ``addmm`` (A[m,k] B[k,n]: ``2mkn`` FLOPs), ``bmm`` / ``baddbmm``
  (``2bmkn``), ``linear`` (input[..., k], weight[n, k]); bytes = operands + result once;
* convolution (``convolution``, ``_convolution``, ``conv2d``, ``cudnn_convolution``,
  ``miopen_convolution``; 1-3 spatial dims): output size from stride, padding and dilation
  (``Concrete Inputs``), ``2 N K (C/g) prod(kernel) prod(out)`` FLOPs; its backward
  (``convolution_backward``) that per gradient the output mask asks for;
* attention (``scaled_dot_product_attention`` and its flash / efficient / cudnn kernels):
  ``4 B H L S D`` forward, 2.5x that backward;
* norms (``native_layer_norm``, ``native_batch_norm``, ``layer_norm``, ``batch_norm`` and
  their backward): 8 FLOPs per element, input and output streamed (backward: 3 tensors);
* elementwise (``add``, ``mul``, ``relu``, ``gelu``, ``copy_``, ``fill_``, ...), softmax and
  reductions: 1 (softmax 5) FLOP per output element, every tensor operand read and the
  result written once.

Device time is that of the kernels (and memsets) an operator launched; copies are left
out (a host<->device copy runs at the link's speed, not HBM's). Synthesized runs carry FLOPs and bytes per kernel (``ops.flops``, ``ops.bytes``); their rows
are the kernel names.

Peaks come from a hardware profile (``hardware``: a name such as ``"h100-sxm"``, or a
``HardwareConfig``; default: the synthesized run's, or the built-in profile whose GPU the
trace's ``meta["devices"]`` names) for the operator's dtype (Half -> fp16, BFloat16 ->
bf16, float -> fp32, except float convolutions -> tf32: PyTorch's default
``torch.backends.cudnn.allow_tf32 = True``, while float GEMMs stay fp32 by default; a
profile without a tf32 peak uses fp32). Per row: ``intensity`` = FLOP / byte,
``achieved_tflops``, ``achieved_gbps``, ``roof_ns`` = ``max(F / peak, B / hbm)`` (the
fastest the roofline allows), ``gap_ns`` = device time - ``roof_ns`` (what the op loses to
the roof, the most a faster kernel could win), ``bound`` (``compute`` / ``memory``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from retime.collectors.costs.ops import MODELED_OPS, op_cost, shaped_calls
from retime.collectors.enums import OpKind
from retime.collectors.errors import RetimeError

from ._util import as_trace, step_windows

__all__ = ["roofline", "roofline_peaks", "op_cost", "MODELED_OPS"]

# ---------------------------------------------------------------------------- peaks
def roofline_peaks(x: Any, hardware: Any = None) -> dict[str, Any]:
    """Peak FLOP/s per dtype and HBM bandwidth to compare against: ``name``,
    ``peak_tflops`` (dict dtype -> TFLOP/s), ``hbm_tbps``, ``source``."""
    t = as_trace(x)
    from retime.collectors.synth import hardware_names, load_hardware
    hw, src = None, ""
    if hardware is not None:
        hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
        src = "given"
    else:
        syn = t.meta.get("synth") if isinstance(t.meta, dict) else None
        if isinstance(syn, dict) and isinstance(syn.get("hardware"), dict):
            from retime.collectors.synth.hardware import hardware_from_dict
            hw, src = hardware_from_dict(syn["hardware"]), "synthesized run"
        else:
            text = str(t.meta.get("devices", "")).lower()
            for n in hardware_names():
                h = load_hardware(n)
                if h.gpu.lower() in text:
                    hw, src = h, f"trace devices ({h.gpu})"
                    break
    if hw is None:
        dev = t.meta.get("devices")
        raise RetimeError(f"roofline: the trace's GPU ({_device_name(dev)}) is not a built-in "
                          "hardware profile, so its peaks are unknown; pass --hardware NAME "
                          "(a100-40gb, a100-80gb, h100-sxm, h200, b200, mi300x) or a "
                          "profile file")
    return {"name": hw.name, "gpu": hw.gpu, "peak_tflops": dict(hw.peak_tflops),
            "hbm_tbps": float(hw.hbm_gbps) / 1e3, "source": src}


def _device_name(dev: Any) -> str:
    if isinstance(dev, dict):
        for v in dev.values():
            if isinstance(v, dict):
                for w in v.values():
                    if isinstance(w, dict) and w.get("name"):
                        return str(w["name"])
    return "not recorded"


# ---------------------------------------------------------------------------- roofline
def roofline(x: Any, *, hardware: Any = None, top: int | None = None) -> pd.DataFrame:
    """Operators (grouped by name, dtype and shapes) against the roofline, most time above
    the roof first.

    Returns
    -------
    DataFrame with ``op``, ``shapes``, ``dtype``, ``count``, ``device_ns``, ``flops``,
    ``bytes``, ``intensity``, ``achieved_tflops``, ``achieved_gbps``, ``peak_tflops``,
    ``roof_ns``, ``gap_ns``, ``efficiency`` (roof_ns / device_ns), ``bound`` and
    ``step_share`` (gap over the summed step time of all ranks). ``attrs["peaks"]`` holds
    :func:`roofline_peaks`; ``attrs["unmodeled_device_ns"]`` the device time of GPU ops no
    modeled operator owns.
    """
    t = as_trace(x)
    peaks = roofline_peaks(t, hardware)
    o = t.ops
    kind = o["kind"].to_numpy()
    # copies are left out: host<->device ones run at the link's speed, not HBM's
    gpu = np.isin(kind, [OpKind.KERNEL, OpKind.MEMSET, OpKind.COMPUTE])
    is_synth = isinstance(t.meta.get("synth"), dict)
    if is_synth:
        df = _synth_rows(t, gpu)
    else:
        df = _measured_rows(t, gpu)
    w = step_windows(t)
    total_step = float((w["end_ns"] - w["start_ns"]).sum()) or float("nan")
    pk = peaks["peak_tflops"]
    bw = peaks["hbm_tbps"] * 1e3  # bytes per ns
    fall = {"tf32": "fp32", "fp64": "fp32"}
    peak = np.asarray([float(pk.get(d) or pk.get(fall.get(d, "fp32")) or max(pk.values()))
                       for d in df["dtype"]], float)
    df["peak_tflops"] = peak
    f, b, dn = (df[c].to_numpy(float) for c in ("flops", "bytes", "device_ns"))
    with np.errstate(divide="ignore", invalid="ignore"):
        roof = np.maximum(f / (peak * 1e3), b / bw)  # TFLOP/s * 1e3 = FLOP/ns
        df["intensity"] = np.where(b > 0, f / b, np.nan)
        df["achieved_tflops"] = np.where(dn > 0, f / dn / 1e3, np.nan)
        df["achieved_gbps"] = np.where(dn > 0, b / dn, np.nan)
        df["roof_ns"] = roof
        df["gap_ns"] = np.maximum(dn - roof, 0.0)
        df["efficiency"] = np.where(dn > 0, roof / dn, np.nan)
    ridge = peak * 1e3 / bw
    df["bound"] = np.where(df["intensity"].to_numpy(float) >= ridge, "compute", "memory")
    df["step_share"] = df["gap_ns"] / total_step
    df = df.sort_values(["gap_ns", "device_ns"], ascending=False, kind="stable")
    df = df.reset_index(drop=True)
    if top is not None:
        df = df.head(top)
    dev_total = float(o["dur_ns"].to_numpy()[gpu].sum())
    df.attrs["peaks"] = peaks
    df.attrs["unmodeled_device_ns"] = dev_total - float(df["device_ns"].sum()) if top is None \
        else None
    df.attrs["device_ns"] = dev_total
    return df


_COLS = ["op", "shapes", "dtype", "count", "device_ns", "flops", "bytes"]


def costed_ops(t, dev: np.ndarray):
    """The trace's operators with recorded shapes and a FLOP model (``op_cost``), each with
    the measured time of the device ops it launched: yields ``(name, dims, types, (flops,
    bytes, dtype), device_ns, launched)`` for those that launched some (``dev``: the
    device-op mask; ``launched``: the names of the kernels it launched)."""
    dur = t.ops["dur_ns"].to_numpy()
    names = t.names()
    for _rank, name, dims, types, _conc, c, ids in shaped_calls(t, dev):
        d = float(dur[ids].sum())
        if d > 0:
            yield name, dims, types, c, d, [str(n) for n in names[ids]]


def _measured_rows(t, gpu: np.ndarray) -> pd.DataFrame:
    rows = []
    for name, dims, _types, c, d, _n in costed_ops(t, gpu):
        shapes = str([x for x in dims if isinstance(x, list) and x])
        rows.append((name, shapes, c[2], 1, d, c[0], c[1]))
    if not rows:
        raise RetimeError("roofline: no operator with recorded shapes and a FLOP model "
                          "launched GPU work; record the run with torch.profiler's "
                          "record_shapes=True")
    df = pd.DataFrame(rows, columns=_COLS)
    g = df.groupby(["op", "shapes", "dtype"], sort=False)
    out = g.agg(count=("count", "sum"), device_ns=("device_ns", "sum"), flops=("flops", "sum"),
                bytes=("bytes", "sum")).reset_index()
    return out[_COLS]


def _synth_rows(t, gpu: np.ndarray) -> pd.DataFrame:
    o = t.ops
    dt = str(t.meta["synth"].get("parallel", {}).get("dtype", "bf16"))
    fl = o["flops"].to_numpy()
    sel = gpu & np.isfinite(fl)
    df = pd.DataFrame({"op": t.names()[sel], "device_ns": o["dur_ns"].to_numpy()[sel],
                       "flops": fl[sel], "bytes": o["bytes"].to_numpy()[sel].astype(float)})
    g = df.groupby("op", sort=False)
    out = g.agg(count=("device_ns", "size"), device_ns=("device_ns", "sum"),
                flops=("flops", "sum"), bytes=("bytes", "sum")).reset_index()
    out["shapes"] = ""
    out["dtype"] = dt
    return out[_COLS]
