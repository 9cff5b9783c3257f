"""Math mode of a GPU kernel from its name: which units and number format its math runs on.

A trace recorded without shapes still names every kernel, and the libraries that write GEMM
and convolution kernels spell the math in the name: cuBLAS ``volta_sgemm_128x64_nn`` and
``ampere_sgemm_*`` run FP32 on the CUDA cores (SIMT), ``sm80_xmma_gemm_f32f32_f32f32_f32_*_ffma``
too, CUTLASS ``cutlass_80_tensorop_s1688gemm_*`` runs FP32 operands through the TF32 tensor
cores (``s``: single-precision operands and accumulator, ``1688``: the m16n8k8 TF32 MMA), cuDNN
``sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_*`` likewise, ``volta_fp16_s884gemm_*`` /
``*_h16816*`` / ``*hmma*`` use the 16-bit tensor cores, ``*imma*`` / ``i8i8`` int8, ``e4m3`` FP8,
``dgemm`` / ``d884`` FP64. A GPU swap prices a kernel without shapes by the ratio of *its own*
math mode's peaks (FP32 SIMT against FP32 SIMT, TF32 against TF32), not the 16-bit tensor
peak (``replay/policies/math_modes.py``).

==========  ==============================================================================
mode        what (name patterns, first match wins: :data:`RULES`)
==========  ==============================================================================
``none``    kernels of a GEMM/convolution library that do no matrix math: split-K
            reductions, epilogues, workspace and offset set-up, BLAS-1/2 (dot, gemv, k=1
            outer products): memory-bound, re-timed by HBM bandwidth
``fp8``     ``e4m3``, ``e5m2``, ``fp8``, ``float8``
``int8``    ``imma``, ``i8816`` / ``i16832`` MMAs, ``i8i8``, ``int8``, Tensile ``I8``/``4xi8``
``fp64``    ``dgemm``, ``d884`` / ``dmma``, ``f64``, ``<double``, Tensile ``D``
``bf16``    ``bf16``, ``bfloat16``, Tensile ``B``, Composable Kernel ``bhalf_t`` (mangled ``t``)
``fp16``    ``fp16``, ``f16``, ``half``, ``h884`` / ``h1688`` / ``h16816``, ``hmma``, ``s884``
            (Volta's MMA is 16-bit only), Tensile ``H``, Composable Kernel ``_Float16``
``tf32``    ``tf32``, ``tfloat32``, ``xf32``, ``s1688gemm`` / ``s1688fprop|dgrad|wgrad``
            without a 16-bit type (Ampere's m16n8k8 TF32 MMA)
``fp32``    ``sgemm``, ``scudnn``, ``ffma``, ``simt``, ``fp32``, ``convolve_sgemm``,
            ``<float`` templates of cuBLAS/cuDNN SIMT kernels, Tensile ``S``
``unknown`` no rule matched (e.g. ``nvjet_*``, Triton templates, MIOpen generic names): the
            GPU swap keeps the flat rule for them and says so
==========  ==============================================================================

On AMD GPUs ``fp32`` is the profile's FP32 peak (matrix cores / packed FMA); the mode still
says "FP32 operands, no reduced-precision math". Helpers first: a split-K reduction of a TF32
GEMM says ``float`` in its template and is still not a TF32 matrix kernel.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import IntEnum
from functools import lru_cache

import numpy as np

__all__ = ["MathMode", "MODE_NAMES", "RULES", "PEAK_KEY", "math_mode", "math_modes",
           "FP32_FAMILY"]


class MathMode(IntEnum):
    """Math mode of a kernel (see the module docstring)."""

    UNKNOWN = 0
    NONE = 1
    FP32 = 2
    TF32 = 3
    FP16 = 4
    BF16 = 5
    FP8 = 6
    INT8 = 7
    FP64 = 8


#: display names, indexed by MathMode
MODE_NAMES = ("unknown", "none", "fp32", "tf32", "fp16", "bf16", "fp8", "int8", "fp64")

#: the hardware profile's ``[peak_tflops]`` key of each mode with a peak
PEAK_KEY = {MathMode.FP32: "fp32", MathMode.TF32: "tf32", MathMode.FP16: "fp16",
            MathMode.BF16: "bf16", MathMode.FP8: "fp8", MathMode.INT8: "int8",
            MathMode.FP64: "fp64"}

#: FP32 operands: the modes ``hardware.allow_tf32`` chooses between
FP32_FAMILY = (MathMode.FP32, MathMode.TF32)

_M = MathMode
_I = re.I

#: (pattern, mode) in the order they are tried; the first match wins
RULES: tuple[tuple[re.Pattern[str], MathMode], ...] = (
    # no matrix math: reductions of split-K partial sums, epilogue passes, workspace and
    # offset set-up, BLAS-1/2 kernels (memory-bound whatever their number format)
    (re.compile(r"splitK_?reduce|ReduceSplitK|reduce_wgrad|epilogue::impl|computeOffsets|"
                r"init_device_workspace|(?:^|void\s+|::)(?:gemv\w*|dot_kernel|gemmk1_kernel|"
                r"reduce_1Block_kernel)\b", _I), _M.NONE),
    # AMD Tensile (rocBLAS / hipBLASLt): Cijk_<A layout>_<B layout>_<types>_ -- the first
    # letter is the input type
    (re.compile(r"^Cijk_A[a-z]+_B[a-z]+_(?:4xi8|I8)"), _M.INT8),
    (re.compile(r"^Cijk_A[a-z]+_B[a-z]+_(?:F8|B8)"), _M.FP8),
    (re.compile(r"^Cijk_A[a-z]+_B[a-z]+_B"), _M.BF16),
    (re.compile(r"^Cijk_A[a-z]+_B[a-z]+_H"), _M.FP16),
    (re.compile(r"^Cijk_A[a-z]+_B[a-z]+_X"), _M.TF32),
    (re.compile(r"^Cijk_A[a-z]+_B[a-z]+_D"), _M.FP64),
    (re.compile(r"^Cijk_A[a-z]+_B[a-z]+_S"), _M.FP32),
    # AMD Composable Kernel (mangled): the gridwise GEMM's data-type tuple, A's type first
    # (t: ck::bhalf_t = unsigned short, DF16_: ck::half_t = _Float16, f: float)
    (re.compile(r"^_ZN\d+ck(?:_tile)?.*?(?:I|E|S\w{0,3}_)(?:Li\d+E)?t(?:t|f|DF16_){2}"), _M.BF16),
    (re.compile(r"^_ZN\d+ck(?:_tile)?.*?(?:I|E|S\w{0,3}_)(?:Li\d+E)?DF16_(?:DF16_|f){2}"), _M.FP16),
    (re.compile(r"^_ZN\d+ck(?:_tile)?.*?(?:I|E|S\w{0,3}_)(?:Li\d+E)?fff[LNS]"), _M.FP32),
    # named number formats, narrowest first: the math runs at the narrowest operand format
    (re.compile(r"e4m3|e5m2|fp8(?!KVCache)|float8|f8f6f4", _I), _M.FP8),
    (re.compile(r"imma|i8816|i16832|i8i8|s8s8|int8|_i8_", _I), _M.INT8),
    (re.compile(r"dgemm|dmma|d884|f64f64|\bdouble\b|zgemm", _I), _M.FP64),
    (re.compile(r"bf16|bfloat16", _I), _M.BF16),
    (re.compile(r"fp16|(?<![bt])f16|half|h884|h1688|h16816|hmma|s884|s16816", _I), _M.FP16),
    (re.compile(r"tf32|tfloat32|xf32|s1688(gemm|fprop|dgrad|wgrad|cudnn)", _I), _M.TF32),
    (re.compile(r"sgemm|scudnn|ffma|simt|fp32|f32f32_f32f32|\bfloat\b", _I), _M.FP32),
)


@lru_cache(maxsize=1 << 16)
def math_mode(name: str) -> MathMode:
    """The math mode of one kernel name; :attr:`MathMode.UNKNOWN` when no rule knows it."""
    for pat, mode in RULES:
        if pat.search(name):
            return mode
    return MathMode.UNKNOWN


def math_modes(names: Iterable[str]) -> np.ndarray:
    """:func:`math_mode` of each name: int8 array of :class:`MathMode` values."""
    return np.fromiter((int(math_mode(str(n))) for n in names), np.int8)
