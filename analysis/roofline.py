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

import re
from typing import Any

import numpy as np
import pandas as pd

from retime.collectors.enums import OpKind
from retime.collectors.errors import RetimeError

from ._util import as_trace, step_windows

__all__ = ["roofline", "roofline_peaks", "op_cost", "MODELED_OPS"]

_ES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "half": 2, "bfloat16": 2,
       "int": 4, "long int": 8, "long": 8, "bool": 1, "unsigned char": 1, "signed char": 1,
       "short int": 2, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1}
_DT = {"float": "fp32", "double": "fp64", "c10::Half": "fp16", "half": "fp16",
       "c10::BFloat16": "bf16", "bfloat16": "bf16", "c10::Float8_e4m3fn": "fp8",
       "c10::Float8_e5m2": "fp8"}
_GEMM = {"mm", "addmm", "bmm", "baddbmm", "linear"}
_CONV = {"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution",
         "miopen_convolution", "mkldnn_convolution"}
_ATTN = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
         "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
         "_flash_attention_forward", "_efficient_attention_forward"}
_ATTN_BWD = {"_scaled_dot_product_flash_attention_backward",
             "_scaled_dot_product_efficient_attention_backward",
             "_scaled_dot_product_cudnn_attention_backward", "_flash_attention_backward",
             "_efficient_attention_backward"}
_NORM = {"native_layer_norm", "native_batch_norm", "layer_norm", "batch_norm",
         "_batch_norm_impl_index", "native_group_norm", "rms_norm", "_fused_rms_norm"}
_NORM_BWD = {"native_layer_norm_backward", "native_batch_norm_backward",
             "native_group_norm_backward", "_fused_rms_norm_backward"}
_ELEM = set("""add add_ sub sub_ mul mul_ div div_ relu relu_ clamp_min clamp_min_ clamp clamp_
threshold_backward sigmoid sigmoid_ sigmoid_backward tanh tanh_ tanh_backward gelu
gelu_backward silu silu_ silu_backward neg exp exp_ sqrt sqrt_ rsqrt pow addcmul_ addcdiv_
copy_ fill_ zero_ where native_dropout native_dropout_backward lerp_ maximum minimum abs
hardtanh hardtanh_ leaky_relu leaky_relu_ masked_fill_ erf""".split())
_SOFTMAX = {"_softmax", "softmax", "_log_softmax", "log_softmax", "_softmax_backward_data",
            "_log_softmax_backward_data"}
_REDUCE = {"sum", "mean", "amax", "max", "norm", "var_mean", "std"}
#: operator base names (after ``aten::``) with a FLOP / byte model
MODELED_OPS = frozenset(_GEMM | _CONV | {"convolution_backward"} | _ATTN | _ATTN_BWD | _NORM
                        | _NORM_BWD | _ELEM | _SOFTMAX | _REDUCE)


def _base(name: str) -> str:
    return name.rsplit("::", 1)[-1]


def _numel(d) -> int:
    return int(np.prod(d)) if isinstance(d, list) and d else (1 if d == [] else 0)


def _tensors(dims, types) -> list[tuple[list, str]]:
    out = []
    for i, d in enumerate(dims):
        t = types[i] if i < len(types) else ""
        if isinstance(d, list) and d and t in _ES:
            out.append((d, t))
    return out


def _ints(s: Any) -> list[int] | None:
    if isinstance(s, list):
        return [int(x) for x in s]
    if not isinstance(s, str) or not s.strip():
        return None
    try:
        v = [int(x) for x in re.findall(r"-?\d+", s)]
    except ValueError:
        return None
    return v or None


def op_cost(name: str, dims: list, types: list, concrete: list | None = None
            ) -> tuple[float, float, str] | None:
    """``(flops, bytes, dtype)`` of one operator call from its recorded shapes (module
    docstring), or None when the operator has no model or its shapes do not fit it."""
    b = _base(name)
    ts = _tensors(dims, types)
    if not ts:
        return None
    t0 = ts[0][1]
    es, dt = _ES[t0], _DT.get(t0, "fp32")
    if dt == "fp32" and (b in _CONV or b == "convolution_backward"):
        dt = "tf32"  # PyTorch lets cuDNN use TF32 for float convolutions by default
    conc = list(concrete or [])
    try:
        if b in _GEMM:
            return _gemm(b, ts, es, dt)
        if b in _CONV:
            return _conv(b, dims, ts, conc, es, dt)
        if b == "convolution_backward":
            return _conv_bwd(dims, ts, conc, es, dt)
        if b in _ATTN or b in _ATTN_BWD:
            q, k = ts[0][0], ts[1][0]
            if len(q) != 4 or len(k) != 4:
                return None
            bb, h, lq, d = q
            s = k[2]
            f = 4.0 * bb * h * lq * s * d * (2.5 if b in _ATTN_BWD else 1.0)
            return f, es * float(sum(_numel(x) for x, _ in ts[:3]) + _numel(q)), dt
        n = max(_numel(x) for x, _ in ts)
        if b in _NORM:
            return 8.0 * n, es * 2.0 * n, dt
        if b in _NORM_BWD:
            return 8.0 * n, es * 3.0 * n, dt
        if b in _SOFTMAX:
            return 5.0 * n, es * 2.0 * n, dt
        if b in _REDUCE:
            return float(_numel(ts[0][0])), es * float(_numel(ts[0][0])), dt
        if b in _ELEM:
            if b in ("fill_", "zero_"):
                return 0.0, es * float(_numel(ts[0][0])), dt
            read = sum(_numel(x) * _ES[t] for x, t in ts)
            return float(n), float(read + n * es), dt
    except (ValueError, IndexError, TypeError):
        return None
    return None


def _gemm(b, ts, es, dt):
    if b == "linear":
        x, w = ts[0][0], ts[1][0]
        m, k, n = _numel(x[:-1]), x[-1], w[0]
        extra = _numel(ts[2][0]) if len(ts) > 2 else 0
        return 2.0 * m * k * n, es * float(m * k + k * n + m * n + extra), dt
    if b in ("addmm", "baddbmm"):
        inp, ts = ts[0], ts[1:]
    else:
        inp = None
    a, c = ts[0][0], ts[1][0]
    if b in ("mm", "addmm"):
        m, k = a
        n = c[1]
        bt = 1
    else:
        bt, m, k = a
        n = c[2]
    extra = _numel(inp[0]) if inp is not None else 0
    return 2.0 * bt * m * k * n, es * float(bt * (m * k + k * n + m * n) + extra), dt


def _out_size(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _conv_params(b, conc, nsp):
    """(stride, padding, dilation, groups) of a convolution call from Concrete Inputs."""
    one = [1] * nsp
    if b in ("cudnn_convolution",):  # (input, weight, padding, stride, dilation, groups, ..)
        p, s, d, g = (_ints(conc[i]) if i < len(conc) else None for i in (2, 3, 4, 5))
    elif b in ("miopen_convolution",):  # (input, weight, bias, padding, stride, dilation, g)
        p, s, d, g = (_ints(conc[i]) if i < len(conc) else None for i in (3, 4, 5, 6))
    else:  # convolution / _convolution / convNd: (input, weight, bias, stride, padding, ...)
        s, p, d = (_ints(conc[i]) if i < len(conc) else None for i in (3, 4, 5))
        gi = 6 if b.startswith("conv") and b[-2:] in ("1d", "2d", "3d") else 8
        g = _ints(conc[gi]) if gi < len(conc) else None

    def full(v, default):
        if v is None:
            return default
        return v * nsp if len(v) == 1 else v
    return full(s, one), full(p, [0] * nsp), full(d, one), (g[0] if g else 1)


def _conv(b, dims, ts, conc, es, dt):
    x, w = ts[0][0], ts[1][0]
    nsp = len(x) - 2
    if nsp < 1 or len(w) != len(x):
        return None
    s, p, d, g = _conv_params(b, conc, nsp)
    out = [_out_size(x[2 + i], w[2 + i], s[i], p[i], d[i]) for i in range(nsp)]
    if min(out) <= 0:
        return None
    n, k = x[0], w[0]
    kc = w[1] * int(np.prod(w[2:]))  # (C / g) * prod(kernel)
    f = 2.0 * n * k * kc * int(np.prod(out))
    return f, es * float(_numel(x) + _numel(w) + n * k * int(np.prod(out))), dt


def _conv_bwd(dims, ts, conc, es, dt):
    go, x, w = ts[0][0], ts[1][0], ts[2][0]
    mask = _ints(conc[10]) if len(conc) > 10 else None
    mask = mask if mask and len(mask) == 3 else [1, 1, 0]
    f1 = 2.0 * go[0] * go[1] * w[1] * int(np.prod(w[2:])) * int(np.prod(go[2:]))
    f = f1 * (int(bool(mask[0])) + int(bool(mask[1])))
    by = _numel(go) + _numel(x) + _numel(w) + (_numel(x) if mask[0] else 0) \
        + (_numel(w) if mask[1] else 0)
    return f, es * float(by), dt


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
            from retime.replay.policies.base import hardware_from_dict
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
    bytes, dtype), device_ns)`` for those that launched some (``dev``: the device-op mask)."""
    from retime.collectors.shapes import read_op_shapes
    sh = read_op_shapes(t, lambda n: _base(n) in MODELED_OPS)
    o = t.ops
    key = pd.Series(np.flatnonzero(dev), index=pd.MultiIndex.from_arrays(
        [o["rank"].to_numpy()[dev], o["correlation"].to_numpy()[dev]]))
    key = key[~key.index.duplicated()]
    dur = o["dur_ns"].to_numpy()
    for rank, name, dims, types, conc, corr in sh.itertuples(index=False):
        c = op_cost(name, dims, types, conc)
        if c is None:
            continue
        idx = key.reindex(pd.MultiIndex.from_arrays([[rank] * len(corr), corr])).dropna()
        d = float(dur[idx.to_numpy(np.int64)].sum()) if len(idx) else 0.0
        if d > 0:
            yield name, dims, types, c, d


def _measured_rows(t, gpu: np.ndarray) -> pd.DataFrame:
    rows = []
    for name, dims, _types, c, d in costed_ops(t, gpu):
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
