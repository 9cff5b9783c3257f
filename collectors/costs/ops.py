"""Work of one operator call from its recorded shapes: FLOPs, bytes and dtype
(:func:`op_cost`), its kernel class and the cost layer's price on a GPU (:func:`price_op`).

Measured Kineto traces recorded with ``record_shapes=True`` give each operator instance's
``Input Dims`` / ``Input type`` / ``Concrete Inputs`` (read back by
:func:`collectors.shapes.read_op_shapes`). The models, per operator base name:

* GEMM: ``mm`` / ``addmm`` (A[m,k] B[k,n]: ``2mkn`` FLOPs), ``bmm`` / ``baddbmm``
  (``2bmkn``), ``linear`` (input[..., k], weight[n, k]); bytes = operands + result once;
* convolution (``convolution``, ``_convolution``, ``conv2d``, ``cudnn_convolution``,
  ``miopen_convolution``; 1-3 spatial dims): output size from stride, padding and dilation
  (``Concrete Inputs``), ``2 N K (C/g) prod(kernel) prod(out)`` FLOPs; its backward
  (``convolution_backward``) that per gradient the output mask asks for;
* attention (``scaled_dot_product_attention`` and its flash / efficient / cudnn kernels):
  ``4 B H L S D`` forward, 2.5x that backward;
* norms: 8 FLOPs per element, input and output streamed (backward: 3 tensors); a batch
  norm whose kernels reduce one channel per block (PyTorch's native ones) at least their
  latency-bound passes (:mod:`collectors.costs.norms`);
* elementwise, softmax and reductions: 1 (softmax 5) FLOP per output element, every tensor
  operand read and the result written once.

Float convolutions are priced as tf32 (PyTorch's default ``cudnn.allow_tf32 = True``);
float GEMMs stay fp32. Both :mod:`analysis.roofline` and the replay what-ifs
(:mod:`replay.policies.kernel_cost`) use these functions: one cost layer.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

__all__ = ["op_cost", "op_class", "gemm_dims", "price_op", "MODELED_OPS", "OP_CLASSES",
           "base_name", "tensors"]

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
# where each attention operator's recorded ``Concrete Inputs`` hold ``is_causal`` (PyTorch's
# schemas; the memory-efficient kernels' ``custom_mask_type``: 1 / 2 = causal from the top
# left / bottom right); read on the G1 H200 traces for the sdpa / cudnn / efficient ones
_CAUSAL_ARG = {"scaled_dot_product_attention": 5, "_scaled_dot_product_flash_attention": 4,
               "_scaled_dot_product_efficient_attention": 6,
               "_scaled_dot_product_cudnn_attention": 6, "_flash_attention_forward": 8,
               "_efficient_attention_forward": 9,
               "_scaled_dot_product_flash_attention_backward": 11,
               "_scaled_dot_product_efficient_attention_backward": 11,
               "_scaled_dot_product_cudnn_attention_backward": 14,
               "_flash_attention_backward": 11, "_efficient_attention_backward": 14}
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
            q, k = _bhsd(b, ts[0][0]), _bhsd(b, ts[1][0])
            if len(q) != 4 or len(k) != 4:
                return None
            bb, h, lq, d = q
            s = k[2]
            f = 4.0 * bb * h * lq * s * d * (2.5 if b in _ATTN_BWD else 1.0)
            f *= 0.5 if _causal(b, conc) else 1.0  # a causal mask skips half the scores
            return f, es * float(sum(_numel(x) for x, _ in ts[:3]) + _numel(q)), dt
        n = max(_numel(x) for x, _ in ts)
        if b in _NORM:
            return 8.0 * n, es * 2.0 * n, dt
        if b == "native_layer_norm_backward":
            # two kernels (PyTorch's CUDA layer norm): the input gradient reads dy and x and
            # writes dx, GammaBetaBackward reads dy and x again
            return 8.0 * n, es * 5.0 * n, dt
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


def base_name(name: str) -> str:
    """``aten::addmm`` -> ``addmm``."""
    return _base(name)


def tensors(dims, types) -> list[tuple[list, str]]:
    """The tensor operands of a call: ``(dims, type)`` for each non-empty tensor input."""
    return _tensors(dims, types)


#: kernel classes of the cost layer's what-ifs and of bench/kernel_loo.py
OP_CLASSES = ("gemm", "conv", "attention", "rest")


def _bhsd(b: str, shape: list) -> list:
    """An attention operand as (batch, heads, seq, head_dim): the sdpa-level operators take
    that layout, the raw flash / memory-efficient kernels' operators (batch, seq, heads,
    head_dim)."""
    if b.startswith(("_flash_attention", "_efficient_attention")) and len(shape) == 4:
        return [shape[0], shape[2], shape[1], shape[3]]
    return shape


def _causal(b: str, conc: list) -> bool:
    """Whether an attention call's recorded arguments say its mask is causal."""
    i = _CAUSAL_ARG.get(b)
    if i is None or i >= len(conc):
        return False
    v = str(conc[i]).strip()
    return v == "True" or (b.startswith("_efficient_attention") and v in ("1", "2"))


def op_class(name: str) -> str:
    """``gemm`` | ``conv`` | ``attention`` | ``rest`` (memory-bound) of an operator."""
    b = _base(name)
    if b in _GEMM:
        return "gemm"
    if b in _CONV or b == "convolution_backward":
        return "conv"
    if b in _ATTN or b in _ATTN_BWD:
        return "attention"
    return "rest"


def gemm_dims(b: str, ts: list) -> tuple[int, int, int, int]:
    """(batch, m, n, k) of a GEMM call (``b``: the base name, ``ts``: :func:`tensors`)."""
    if b == "linear":
        x, w = ts[0][0], ts[1][0]
        return 1, int(np.prod(x[:-1])), int(w[0]), int(x[-1])
    if b in ("addmm", "baddbmm"):
        ts = ts[1:]
    a, c = ts[0][0], ts[1][0]
    if b in ("mm", "addmm"):
        return 1, int(a[0]), int(c[1]), int(a[1])
    return int(a[0]), int(a[1]), int(c[2]), int(a[2])


def price_op(g, name: str, dims: list, types: list, work: tuple[float, float, str],
             curves=None, launches: int = 1, kernels: list[str] | None = None):
    """The cost layer's :class:`~retime.collectors.costs.kernels.OpCost` of one operator
    call on GPU ``g`` (a :class:`GpuSpec`): GEMMs by their ``m, n, k``, convolutions as
    implicit GEMMs, attention by FlashAttention's rate, the rest as streaming kernels of
    their bytes. ``work`` is :func:`op_cost`'s ``(flops, bytes, dtype)``; ``curves`` (a
    :class:`~retime.collectors.costs.kernels.Curves`) overrides the efficiency curves'
    parameters (``bench/kernel_loo.py`` fits them). A dtype the GPU lacks falls back to
    fp32 (tf32 on Volta), bf16 to fp16 (Volta). ``launches``: the kernels the call
    launched (a measured trace tells): each one beyond the first adds the GPU's launch and
    ramp/tail floor (``kernel_overhead_us``; cuDNN/MIOpen layout transposes, split-K
    reductions, the passes of a batch norm). ``kernels``: the names of the kernels it
    launched, where known (convolutions price their layout kernels by them:
    :mod:`collectors.costs.conv`)."""
    import dataclasses

    from . import kernels as K
    from .conv import price_conv

    b = _base(name)
    if b in _CONV or b == "convolution_backward":
        flops, _nbytes, dtype = work
        ts = _tensors(dims, types)
        return price_conv(g, b, ts, flops, _gpu_dtype(g, dtype), _ES[ts[0][1]],
                          curves or K.DEFAULT_CURVES, kernels,
                          len(kernels) if kernels is not None else launches)
    c = _price(g, name, dims, types, work, curves, kernels)
    if b in _GEMM:  # Hopper TF32 with both operands MN-major: :mod:`.tf32_layout`
        from .tf32_layout import tf32_layout
        c = tf32_layout(g, _gpu_dtype(g, work[2]), kernels, c)
    c = _channel_blocks(g, b, dims, types, c, curves, kernels)
    n = len(kernels) if kernels is not None else launches
    extra = max(int(n) - 1, 0) * g.hw.kernel_overhead_us
    if extra <= 0:
        return c
    lo, hi = c.range_us
    return dataclasses.replace(c, time_us=c.time_us + extra,
                               range_us=(lo + extra * 0.5, hi + extra * 1.5))


def _channel_blocks(g, b: str, dims, types, c, curves, kernels):
    """``c`` (a batch norm's streaming price) or, when its kernels reduce one channel per
    block (:mod:`collectors.costs.norms`) and that is slower, those passes plus one launch
    floor."""
    import dataclasses

    from . import kernels as K
    from .norms import channel_pass_us, channel_passes

    if b not in ("native_batch_norm", "native_batch_norm_backward") or not kernels:
        return c
    p = channel_passes(kernels)
    ts = _tensors(dims, types)
    if not p or not ts or len(ts[0][0]) < 3:
        return c
    x = ts[0][0]
    lat = (curves or K.DEFAULT_CURVES).mem_latency_us
    t = p * channel_pass_us(g, int(x[0]), int(x[1]), int(np.prod(x[2:])), lat) \
        + g.hw.kernel_overhead_us
    if t <= c.time_us:
        return c
    f = t / c.time_us
    return dataclasses.replace(
        c, time_us=t, range_us=(c.range_us[0] * f, c.range_us[1] * f),
        tflops=c.tflops / f, gbps=c.gbps / f, bound="latency",
        efficiency=c.efficiency / f,
        efficiency_source=f"{p} channel-per-block pass(es) (one block of "
        f"{'256' if str(g.arch).startswith('cdna') else '512'} threads per channel, "
        f"PyTorch Normalization.cuh, K22) at {lat:g} us per step (memory latency: the "
        "streaming size curve's)")


def _gpu_dtype(g, dtype: str) -> str:
    """A dtype the GPU lacks falls back to fp32 (tf32 on Volta), bf16 to fp16."""
    if dtype not in g.hw.peak_tflops and dtype not in ("fp16", "bf16"):
        return "fp32" if "fp32" in g.hw.peak_tflops else "bf16"
    return dtype


def _price(g, name, dims, types, work, curves, kernels=None):
    from . import kernels as K

    curves = curves or K.DEFAULT_CURVES
    flops, nbytes, dtype = work
    b = _base(name)
    ts = _tensors(dims, types)
    dtype = _gpu_dtype(g, dtype)
    if b in _GEMM:
        bt, m, n, k = gemm_dims(b, ts)
        return K.matmul(g, m, n, k, bt, dtype, curves=curves)
    if b in _ATTN or b in _ATTN_BWD:
        q, kk = _bhsd(b, ts[0][0]), _bhsd(b, ts[1][0])
        # op_cost halved the FLOPs of a call whose recorded is_causal was True
        full = 4.0 * q[0] * q[1] * q[2] * kk[2] * q[3] * (2.5 if b in _ATTN_BWD else 1.0)
        return K.attention(g, int(q[0]), int(q[1]), int(q[2]), int(q[3]),
                           kv_heads=int(kk[1]) if int(q[1]) % int(kk[1]) == 0 else None,
                           causal=flops < 0.75 * full, backward=b in _ATTN_BWD, dtype=dtype,
                           kernel=K.attn_kernel_family(g, kernels))
    return K.memory_bound(g, b, flops, max(nbytes, 1.0), curves=curves)


def shaped_calls(trace, dev: np.ndarray):
    """Operator calls of a measured trace with recorded shapes and a work model, each with
    the device ops it launched: yields ``(rank, name, dims, types, concrete, work, op_ids)``
    (``concrete``: the call's ``Concrete Inputs``) where
    ``work`` is :func:`op_cost`'s ``(flops, bytes, dtype)`` and ``op_ids`` the ids of the ops
    in ``dev`` (a boolean mask over ``trace.ops``) it launched (those found by
    ``(rank, correlation)``). Raises TraceFormatError when the trace's Kineto sources are
    missing (:func:`collectors.shapes.read_op_shapes`)."""
    import pandas as pd

    from ..shapes import read_op_shapes
    sh = read_op_shapes(trace, lambda n: _base(n) in MODELED_OPS)
    o = trace.ops
    key = pd.Series(np.flatnonzero(dev), index=pd.MultiIndex.from_arrays(
        [o["rank"].to_numpy()[dev], o["correlation"].to_numpy()[dev]]))
    key = key[~key.index.duplicated()]
    for rank, name, dims, types, conc, corr in sh.itertuples(index=False):
        c = op_cost(name, dims, types, conc)
        if c is None:
            continue
        idx = key.reindex(pd.MultiIndex.from_arrays([[rank] * len(corr), corr])).dropna()
        if len(idx):
            yield int(rank), name, dims, types, conc, c, idx.to_numpy(np.int64)
