"""Convolution calls priced as the kernels the library runs for them.

A cuDNN / MIOpen convolution call is not one GEMM. Its forward runs the implicit GEMM
``M = N P Q, N = K, K = C R S`` (per group); its backward runs up to two of them with other
shapes: the data gradient ``M = N H W, N = C, K = K R S`` and the weight gradient
``M = K, N = C R S, K = N P Q`` (a small output and a very deep reduction: split-K); each goes
through the same tile / wave model as a library GEMM (:mod:`collectors.costs.tiles`), so a
small-batch convolution loses efficiency for the same reasons a small GEMM does (few tiles
for the SMs, the k-depth prologue). The weight-gradient kernels gather their operands
through the im2col index (cuDNN's ``wgrad_indexed`` kernels, MIOpen's ``wrw`` /
``bwd_weight``) and reduce split-K partial sums: they sustain ``Curves.wgrad_eff`` of the GEMM
model's rate (fitted, shared by every GPU: REFERENCES.md K7).

Around the GEMMs, the library converts layouts: tensor-core kernels read NHWC, and a PyTorch
model's activations are NCHW, so cuDNN (``nchwToNhwcKernel`` / ``nhwcToNchwKernel``) and MIOpen
(``batched_transpose_*``, ``transpose_NCHW2CNHW``, ``SubTensorOpWithCastTensor``) stream each
activation through HBM once more (read + write) per pass that needs it: the forward its
input and output, the data gradient the output gradient and the input gradient, the weight
gradient the input and the output gradient (REFERENCES.md K8). When the trace names the
kernels a call launched, those layout kernels are priced as memory-bound copies of these
activations (in that order; one beyond them moves a weight: a launch floor); workspace
fills, memsets and split-K reductions are launch floors. Without the names, only the GEMM
passes and one launch floor per further kernel are priced.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from ..errors import ConfigError
from .gpus import DTYPE_BYTES, GpuSpec
from .kernels import FITTED_CURVES, Curves, OpCost, conv_output, implicit_gemm, memory_bound

__all__ = ["conv2d_call", "conv_passes", "kernel_pass", "kernel_role", "pass_costs",
           "price_conv", "sum_costs", "winograd_eligible", "winograd_gemm", "math_dtype",
           "cuda_core_fp32"]

_LAYOUT = re.compile(r"nchwtonhwc|nhwctonchw|transpose|nchw2cnhw|cnhw2nchw|castTensor",
                     re.IGNORECASE)
_AUX = re.compile(r"memset|workspace|splitkreduce|reduce_?kernel|SubTensorOpWithScalar|"
                  r"fill|zero", re.IGNORECASE)


#: a weight-gradient kernel's name: cuDNN's ``wgrad`` / ``wgrad_indexed`` / ``wgrad_alg*``,
#: MIOpen's ``igemm_wrw`` and composable_kernel's ``bwd_weight``
_WGRAD = re.compile(r"wgrad|_wrw_|bwd_weight|backward_weight", re.IGNORECASE)


def kernel_pass(name: str) -> str:
    """``wgrad`` for a convolution's weight-gradient kernel (by its name), else ``other`` (the
    forward or data-gradient GEMM, or a layout / auxiliary kernel: :func:`kernel_role`)."""
    return "wgrad" if kernel_role(name) == "main" and _WGRAD.search(name) else "other"


def kernel_role(name: str) -> str:
    """``layout`` (a layout transpose or dtype cast of a tensor), ``aux`` (memset,
    workspace fill, split-K reduction) or ``main`` (the GEMM / convolution kernel)."""
    if _LAYOUT.search(name):
        return "layout"
    if _AUX.search(name):
        return "aux"
    return "main"


def _prod(v) -> int:
    return int(np.prod(v)) if len(v) else 1


def conv_passes(base: str, ts: list, flops: float, mains: int | None = None
                ) -> tuple[list, list]:
    """The implicit GEMMs of one convolution call and the activations its layout kernels
    move: ``([(pass, m, n, k, elements)], [activation elements])`` (``elements``: of the
    tensors the pass reads and writes, not the im2col-expanded operand). ``ts``: the call's tensor
    operands (``ops.tensors``), ``flops``: its recorded work (``ops.op_cost``); ``mains``:
    the GEMM kernels the call launched, where the trace names them. A backward whose input
    has at most 4 channels (an image: a network's first convolution) or that launched one
    GEMM kernel computes the weight gradient only: the input needs no gradient (the
    recorded work counts both when the trace lacks the output mask)."""
    if base == "convolution_backward":
        go, x, w = ts[0][0], ts[1][0], ts[2][0]
        kout, kc = int(w[0]), int(w[1]) * _prod(w[2:])
        rs = _prod(w[2:])
        f1 = 2.0 * int(go[0]) * kout * kc * _prod(go[2:])
        npass = max(1, min(2, round(flops / f1))) if f1 > 0 else 1
        if int(x[1]) <= 4 or mains == 1:
            npass = 1
        dy, xs = float(_prod(go)), float(_prod(x))
        passes, acts = [], []
        ws = float(_prod(w))
        if npass == 2:  # data gradient: dx = dy * w^T
            passes.append(("dgrad", f1 / (2.0 * int(x[1]) * kout * rs), int(x[1]),
                           kout * rs, dy + ws + xs))
            acts += [dy, xs]
        # one pass only: the weight gradient (a network's first convolution: its input
        # needs no gradient)
        passes.append(("wgrad", kout, kc, int(go[0]) * _prod(go[2:]), xs + dy + ws))
        acts += [xs, dy]
        return passes, acts
    x, w = ts[0][0], ts[1][0]
    kout, kc = int(w[0]), int(w[1]) * _prod(w[2:])
    m = flops / (2.0 * kout * kc) if flops > 0 else 1.0
    xs = float(_prod(x))
    return [("fprop", max(m, 1.0), kout, kc, xs + _prod(w) + m * kout)], [xs, m * kout]


def sum_costs(kind: str, g: GpuSpec, parts: list[OpCost]) -> OpCost:
    """Kernels run one after another on a stream: times and ranges add; the bound and the
    efficiency are those of the longest part."""
    t = sum(p.time_us for p in parts)
    big = max(parts, key=lambda p: p.time_us)
    lo = sum(p.range_us[0] for p in parts)
    hi = sum(p.range_us[1] for p in parts)
    fl = sum(p.flops for p in parts)
    by = sum(p.bytes for p in parts)
    n = len(parts)
    src = big.efficiency_source if n == 1 else (
        f"{n} kernels; longest: {big.kind} {big.time_us:.1f} us, {big.efficiency_source}")
    return OpCost(kind, g.name, t, (lo, hi), fl, by, fl / (t * 1e6), by / (t * 1e3),
                  big.bound, big.efficiency, src)


def math_dtype(g: GpuSpec, base: str, ts: list, dtype: str) -> str:
    """The dtype a convolution's GEMMs run in on ``g``: tensor-core convolutions need input
    channels in 16-byte vectors (multiples of 4 for tf32, 8 for 16-bit: NVIDIA's cuDNN / DL
    performance guide, REFERENCES.md K8); an image input (3 channels) in tf32 runs on the
    CUDA cores at the fp32 rate."""
    cin = int(ts[1][0][1]) if base == "convolution_backward" else int(ts[0][0][1])
    if dtype == "tf32" and (cin * 4) % 16 and "fp32" in g.hw.peak_tflops:
        return "fp32"
    return dtype


def cuda_core_fp32(g: GpuSpec, dtype: str) -> bool:
    """Whether a convolution in ``dtype`` (:func:`math_dtype`) runs on NVIDIA's CUDA cores
    (FP32 without TF32: Volta, or ``allow_tf32`` off, or the image layer): its kernels read
    the NCHW tensors themselves and cuDNN's Winograd algorithms compete (K34)."""
    return dtype == "fp32" and g.arch in _CUDA_CORE_ARCHES


def pass_costs(g: GpuSpec, base: str, ts: list, flops: float, dtype: str, eb: float,
               curves: Curves, mains: int | None = None, winograd: bool = True
               ) -> tuple[list, list]:
    """``([(pass, OpCost)], [activation elements])``: each implicit-GEMM pass of one
    convolution call priced on ``g`` (:func:`conv_passes`; ``mains``: the GEMM kernels the
    call launched, where the trace names them), and the activations its layout kernels
    move. A weight-gradient pass sustains ``curves.wgrad_eff`` of the rate the GEMM model
    gives its shape (REFERENCES.md K7, K21). On the CUDA cores (:func:`cuda_core_fp32`) a
    3 x 3, stride-1 convolution (:func:`winograd_eligible`) takes the faster of the implicit
    GEMM and Winograd F(2x2, 3x3) (:func:`winograd_gemm`, K34) per pass, as cuDNN picks the
    fastest algorithm it has, unless ``winograd`` is False (the trace recorded which CUDA-core
    kernels the library chose for this call: :func:`price_conv`)."""
    passes, acts = conv_passes(base, ts, flops, mains)
    dtype = math_dtype(g, base, ts, dtype)
    wino = winograd and cuda_core_fp32(g, dtype) and winograd_eligible(base, ts)
    out = []
    for name, m, n, k, elems in passes:
        eff = curves.conv_eff * (curves.wgrad_eff if name == "wgrad" else 1.0)
        c = implicit_gemm(g, max(m, 1.0), n, k, dtype, eb * elems, "conv", curves=curves,
                          eff=eff)
        if wino:
            wm, wn, wk = winograd_gemm(name, max(m, 1.0), n, k)
            w = implicit_gemm(g, wm, wn, wk, dtype, eb * elems, "conv", curves=curves, eff=eff)
            if w.time_us < c.time_us:
                c = dataclasses.replace(
                    w, efficiency_source="Winograd F(2x2, 3x3) (2.25x fewer multiplies, "
                    "REFERENCES.md K34): " + w.efficiency_source)
        out.append((name, c))
    return out, acts


#: NVIDIA architectures whose FP32 convolutions run on the CUDA cores, where cuDNN's
#: Winograd algorithms compete with the implicit GEMM (REFERENCES.md K34)
_CUDA_CORE_ARCHES = ("volta", "ampere", "hopper", "blackwell")


def winograd_eligible(base: str, ts: list) -> bool:
    """Whether a convolution call is one Winograd's minimal filtering F(2x2, 3x3) computes:
    a 2-D 3 x 3 filter over all input channels (one group), stride 1 (the output keeps the
    input's size: padding 1), read from its shapes."""
    if base == "convolution_backward":
        go, x, w = ts[0][0], ts[1][0], ts[2][0]
        out, inp = go, x
    else:
        x, w = ts[0][0], ts[1][0]
        out, inp = None, x
    if len(w) != 4 or list(w[2:]) != [3, 3] or len(inp) != 4 or int(w[1]) != int(inp[1]):
        return False
    return out is None or list(out[2:]) == list(inp[2:])


def winograd_gemm(name: str, m: float, n: float, k: float) -> tuple[float, float, float]:
    """The GEMM work of one implicit-GEMM pass run as Winograd F(2x2, 3x3) (Lavin & Gray
    2016, REFERENCES.md K34): each 2 x 2 output tile costs 4 x 4 = 16 products per channel
    pair instead of 36, as 16 GEMMs over the tiles (a quarter of the output pixels), of
    depth ``C`` (forward, data gradient: ``m -> 4 m``, ``k = 9 C -> C``) or over the 16
    transformed filter taps (weight gradient: ``n = 9 C -> 16 C``, ``k = pixels / 4``):
    2.25x fewer FLOPs; the transforms run on chip (the fused kernel): the bytes stay."""
    if name == "wgrad":
        return m, n * 16.0 / 9.0, max(k / 4.0, 1.0)
    return 4.0 * m, n, max(k / 9.0, 1.0)


def price_conv(g: GpuSpec, base: str, ts: list, flops: float, dtype: str, eb: float,
               curves: Curves, kernels: list[str] | None = None,
               launches: int = 1) -> OpCost:
    """One convolution call (forward or backward) on ``g``: its implicit-GEMM passes, the
    layout kernels the call launched (``kernels``: their names, from the trace) as copies of
    its activations, its other kernels as launch floors (module docstring). ``eb``: bytes
    per element of its tensors."""
    roles = None if kernels is None else [kernel_role(k) for k in kernels]
    simt = cuda_core_fp32(g, math_dtype(g, base, ts, dtype))
    # the trace names CUDA-core kernels (NCHW: no layout kernels) that are not Winograd's:
    # the library chose another algorithm for this call on the CUDA cores (the H100 VGG-13
    # image layer's ``nchwkcrs`` / ``wgrad_alg0``); keep it
    chosen = roles is not None and "main" in roles and "layout" not in roles \
        and not any("winograd" in k.lower() for k in kernels)
    priced, acts = pass_costs(g, base, ts, flops, dtype, eb, curves,
                              None if roles is None else roles.count("main"),
                              winograd=not chosen)
    if simt and roles is not None and "layout" in roles:
        # layout kernels the trace recorded for a tensor-core path: a CUDA-core kernel reads
        # the NCHW tensors themselves (the image layer above), so none run
        kernels = [k for k, r in zip(kernels, roles) if r != "layout"]
        roles = [r for r in roles if r != "layout"]
    passes = [p for p, _ in priced]
    parts = [c for _, c in priced]
    floor = g.hw.kernel_overhead_us
    if kernels is None:
        extra = max(int(launches) - len(passes), 0)
        layout = 0
    else:
        layout = roles.count("layout")
        extra = roles.count("aux") + max(roles.count("main") - len(passes), 0)
    moved = acts[:layout]
    extra += layout - len(moved)
    for a in moved:  # read + write of one activation
        parts.append(memory_bound(g, "layout", 0.0, max(2.0 * eb * a, 1.0), curves))
    if extra:
        parts.append(OpCost("launch", g.name, extra * floor,
                            (extra * floor * 0.5, extra * floor * 1.5), 0.0, 0.0, 0.0, 0.0,
                            "latency", 0.0, f"{extra} launch floor(s) {floor} us "
                            "(assumed, hardware profile)"))
    c = sum_costs("conv", g, parts)
    if not math.isfinite(c.time_us):
        return parts[0]
    roles: dict[str, float] = {}
    for p in parts:
        r = {"conv": "main", "layout": "layout"}.get(p.kind, "aux")
        roles[r] = roles.get(r, 0.0) + p.time_us
    return dataclasses.replace(c, parts=tuple(roles.items()))


#: Kineto's ``Input type`` of a tensor per dtype (what a traced call records)
_TORCH_TYPE = {"fp32": "float", "tf32": "float", "bf16": "c10::BFloat16", "fp16": "c10::Half"}


def conv2d_call(g: GpuSpec, batch: int, in_ch: int, height: int, width: int, out_ch: int,
                kernel: int = 3, stride: int = 1, padding: int | None = None,
                dtype: str = "bf16", backward: bool = False, channels_last: bool = False,
                curves: Curves = FITTED_CURVES) -> OpCost:
    """One PyTorch ``Conv2d`` call (``backward``: its ``convolution_backward``) priced as a
    replay what-if prices the same call of a trace (:func:`price_conv` with the fitted
    curves): its implicit-GEMM passes (the backward's data gradient unless the input is an
    image of at most 4 channels, and its weight gradient) and, for an NCHW model
    (``channels_last=False``), the layout kernels cuDNN / MIOpen run around them (one HBM
    read + write of each activation the pass needs, REFERENCES.md K7, K8)."""
    for k, v in dict(batch=batch, in_ch=in_ch, height=height, width=width, out_ch=out_ch,
                     kernel=kernel, stride=stride).items():
        if not (isinstance(v, int) and v > 0):
            raise ConfigError(f"conv2d: --{k.replace('_', '-')} {v!r} must be a positive "
                              "integer")
    if dtype not in _TORCH_TYPE:
        raise ConfigError(f"conv2d: --dtype {dtype!r}: a convolution runs in "
                          f"{', '.join(_TORCH_TYPE)}")
    p, q = conv_output(height, width, kernel, stride, padding)
    tt = _TORCH_TYPE[dtype]
    x, w, y = [batch, in_ch, height, width], [out_ch, in_ch, kernel, kernel], \
        [batch, out_ch, p, q]
    f1 = 2.0 * batch * out_ch * in_ch * kernel * kernel * p * q
    if backward:
        base, ts = "convolution_backward", [(y, tt), (x, tt), (w, tt)]
        flops = f1 * (1 if in_ch <= 4 else 2)
    else:
        base, ts, flops = "cudnn_convolution", [(x, tt), (w, tt)], f1
    passes, acts = conv_passes(base, ts, flops)
    # tensor-core kernels read NHWC; a tf32 call whose input channels miss the 16-byte
    # vectors runs an fp32 CUDA-core kernel on the NCHW tensors themselves (the H100 VGG-13
    # trace's first layer: ``..._nchwkcrs_nchw`` / ``wgrad_alg0_engine``, no layout kernels)
    simt = dtype == "tf32" and (in_ch * 4) % 16 != 0
    names = ["implicit_gemm"] * len(passes) + (
        [] if channels_last or simt else ["nchwToNhwcKernel"] * len(acts))
    return price_conv(g, base, ts, flops, dtype, DTYPE_BYTES[dtype], curves, names)
