"""GEMM and convolution kernels without shapes in a GPU swap, priced by their math mode.

A kernel's name tells what its math runs on (:mod:`collectors.kernel_math`): ``volta_sgemm_*``
on the CUDA cores in FP32, ``cutlass_80_tensorop_s1688gemm_*`` on the TF32 tensor cores,
``*_s884gemm_fp16_*`` on the 16-bit ones. ``hardware.gpu`` re-times a GEMM/convolution kernel
that no operator with recorded shapes owns by the ratio of the datasheet peaks of *its own*
math mode on the two GPUs (FP32 SIMT against FP32 SIMT, TF32 against TF32; peaks:
``collectors/costs/REFERENCES.md`` K10), not by the 16-bit tensor peak, which is 8x the FP32
SIMT peak on a V100 and 15x on an H100. Kernels of a GEMM library that do no matrix math
(split-K reductions, epilogues, gemv: mode ``none``) move with HBM bandwidth like every
streaming kernel; kernels whose mode the name does not tell keep the flat rule.

FP32 operands on the target GPU: which math they run on is PyTorch's choice, set by
``torch.backends.cuda.matmul.allow_tf32`` (GEMMs; off by default since PyTorch 1.12) and
``torch.backends.cudnn.allow_tf32`` (convolutions; on by default), both meaningful on NVIDIA
GPUs with TF32 tensor cores (Ampere and newer). ``hardware.allow_tf32`` states it for both:

* given (true / false): every FP32-operand GEMM/convolution kernel runs in TF32 / FP32 SIMT
  on the target (a target without TF32 units runs FP32 whatever the key says);
* not given: a kernel the trace shows in TF32 stays TF32 and one it shows in FP32 on a GPU
  that had TF32 units stays FP32 (the trace shows the setting); where the measured GPU had no
  TF32 units (Volta, AMD) PyTorch's defaults decide (GEMMs FP32, convolutions TF32), an
  ``assumed:`` line says so and the range replays the what-if with the key true and false.
  Targets without TF32 tensor cores that PyTorch uses (Volta; AMD, whose ``xf32`` PyTorch's
  switches do not reach: assumed) run FP32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from retime.collectors.errors import ConfigError
from retime.collectors.kernel_math import (
    FP32_FAMILY,
    MODE_NAMES,
    PEAK_KEY,
    MathMode,
    math_modes,
)
from retime.collectors.trace import Trace

from .base import trace_memo

__all__ = ["ModeRatio", "mode_ratios", "target_mode", "tf32_capable", "PYTORCH_TF32_DEFAULT"]

#: PyTorch's defaults (>= 1.12): (GEMMs, convolutions) may use TF32
PYTORCH_TF32_DEFAULT = (False, True)

_NV_TF32_ARCHES = ("ampere", "hopper", "blackwell")


@dataclass(frozen=True)
class ModeRatio:
    """Duration multipliers of the kernels priced by their math mode (``op_ids`` /
    ``ratio``) and what was done: ``info`` holds ``rows`` (per source -> target mode: kernels,
    GPU ns, ratio), ``defaulted`` (the kinds -- ``gemm`` / ``conv`` -- whose target mode
    PyTorch's defaults decided), ``unpriced_ns`` (kernels of an unknown mode or without a
    peak) and ``notes``."""

    op_ids: np.ndarray
    ratio: np.ndarray
    info: dict


def tf32_capable(spec) -> bool:
    """Whether a GPU (a :class:`~retime.collectors.costs.gpus.GpuSpec`) runs TF32 on tensor
    cores that PyTorch's ``allow_tf32`` switches use: NVIDIA Ampere or newer with a TF32
    peak."""
    return spec.arch in _NV_TF32_ARCHES and bool(spec.hw.peak_tflops.get("tf32"))


def target_mode(src: MathMode, is_conv: bool, old, new, allow_tf32: bool | None
                ) -> tuple[MathMode, str]:
    """(math mode on GPU ``new`` of a kernel that ran in ``src`` on GPU ``old``, how that was
    decided: ``measured`` | ``stated`` | ``default`` | ``no tf32`` | ``as fp16`` |
    ``as bf16``); ``old`` / ``new`` are GpuSpecs."""
    if src in FP32_FAMILY:
        if not tf32_capable(new):
            return MathMode.FP32, ("measured" if src == MathMode.FP32 else "no tf32")
        if allow_tf32 is not None:
            return (MathMode.TF32 if allow_tf32 else MathMode.FP32), "stated"
        if tf32_capable(old):  # the trace shows the setting
            return src, "measured"
        on = PYTORCH_TF32_DEFAULT[1] if is_conv else PYTORCH_TF32_DEFAULT[0]
        return (MathMode.TF32 if on else MathMode.FP32), "default"
    if src == MathMode.FP8 and not new.hw.peak_tflops.get("fp8"):
        return MathMode.BF16, "as bf16"
    if src == MathMode.BF16 and not new.hw.peak_tflops.get("bf16"):
        return MathMode.FP16, "as fp16"
    return src, "measured"


def _peak(spec, mode: MathMode) -> float | None:
    key = PEAK_KEY.get(mode)
    if key is None:
        return None
    try:
        return spec.peak_tflops(key)
    except ConfigError:
        return None


def _modes_of(trace: Trace, idx: np.ndarray) -> np.ndarray:
    """:class:`MathMode` (int8) of the ops ``idx``, from their names (only the names those
    ops use are classified; memoized per trace and name)."""
    memo = trace_memo(trace).setdefault("math_mode_of_name", {})
    nid = trace.ops["name_id"].to_numpy()[idx]
    u, inv = np.unique(nid, return_inverse=True)
    todo = [i for i in u.tolist() if i not in memo]
    if todo:
        for i, m in zip(todo, math_modes(trace.strings[i] for i in todo).tolist()):
            memo[i] = m
    return np.asarray([memo[i] for i in u.tolist()], np.int8)[inv.reshape(-1)] if len(u) \
        else np.zeros(0, np.int8)


def mode_ratios(trace: Trace, cand: np.ndarray, is_conv: np.ndarray, old_name: str,
                new_name: str, allow_tf32: bool | None, hbm_ratio: float) -> ModeRatio:
    """Duration multipliers for the ops in ``cand`` (a boolean mask in op-id order: GEMM /
    convolution kernels the caller prices by name; ``is_conv`` marks convolutions) moving
    from GPU ``old_name`` to ``new_name`` (profile names, or the same one for a math change
    alone): the ratio of their math modes' peaks, ``hbm_ratio`` for mode ``none``; unknown
    modes and modes without a peak on either GPU are left out (the caller's flat rule)."""
    from retime.collectors.costs.gpus import gpu_spec
    old, new = gpu_spec(old_name), gpu_spec(new_name)
    dur = trace.ops["dur_ns"].to_numpy()
    ids_out, r_out, rows, notes = [], [], [], []
    defaulted: set[str] = set()
    unpriced = 0.0
    idx = np.flatnonzero(cand)
    modes = _modes_of(trace, idx)
    for m in np.unique(modes).tolist():
        src = MathMode(m)
        sel = idx[modes == m]
        if src == MathMode.UNKNOWN:
            unpriced += float(dur[sel].sum())
            continue
        if src == MathMode.NONE:
            ids_out.append(sel)
            r_out.append(np.full(len(sel), hbm_ratio))
            rows.append(("none", "none", len(sel), float(dur[sel].sum()), hbm_ratio, "HBM"))
            continue
        for conv in (False, True):
            part = sel[is_conv[sel] == conv]
            if not len(part):
                continue
            tgt, how = target_mode(src, conv, old, new, allow_tf32)
            p_old, p_new = _peak(old, src), _peak(new, tgt)
            if not p_old or not p_new:
                unpriced += float(dur[part].sum())
                gpu = old.name if not p_old else new.name
                notes.append(f"{len(part)} {MODE_NAMES[src]} kernel(s): {gpu} has no "
                             f"{PEAK_KEY[tgt if p_old else src]} peak in its profile; flat rule")
                continue
            if how == "default":
                defaulted.add("conv" if conv else "gemm")
            ids_out.append(part)
            r_out.append(np.full(len(part), p_old / p_new))
            rows.append((MODE_NAMES[src], MODE_NAMES[tgt], len(part), float(dur[part].sum()),
                         p_old / p_new, f"{p_old:g} -> {p_new:g} TFLOP/s",
                         "conv" if conv else "gemm", how))
    ids = np.concatenate(ids_out) if ids_out else np.zeros(0, np.int64)
    ratio = np.concatenate(r_out) if r_out else np.zeros(0)
    return ModeRatio(ids.astype(np.int64), ratio, {
        "rows": rows, "defaulted": sorted(defaulted), "unpriced_ns": unpriced, "notes": notes,
        "old": old.name, "new": new.name, "old_tf32": tf32_capable(old),
        "new_tf32": tf32_capable(new), "new_arch": new.arch})


def describe(mr: ModeRatio, gpu_ns: float, what: str) -> list[str]:
    """``assumed:`` lines of a :class:`ModeRatio` (``gpu_ns``: the trace's GPU time, the
    shares' denominator)."""
    i = mr.info
    if not i["rows"] and not i["unpriced_ns"]:
        return []
    tot = max(gpu_ns, 1.0)
    parts = []
    agg: dict[tuple, list] = {}
    for row in i["rows"]:
        key = (row[0], row[1], row[5])
        a = agg.setdefault(key, [0, 0.0, row[4]])
        a[0] += row[2]
        a[1] += row[3]
    for (src, tgt, peaks), (n, ns, r) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        name = src if src == tgt else f"{src} -> {tgt}"
        parts.append(f"{name} {ns / tot:.1%} of GPU time ({n} kernels) x{r:.2f} ({peaks})")
    if i["unpriced_ns"]:
        parts.append(f"mode not told by the name or without a peak {i['unpriced_ns'] / tot:.1%} "
                     "(flat rule)")
    lines = [f"{what} {i['old']} -> {i['new']}: GEMM/convolution kernels without a recorded "
             "shape priced by the ratio of their math mode's datasheet peaks (mode from the "
             "kernel name; none = split-K reductions, epilogues, gemv: HBM): "
             + "; ".join(parts)]
    lines += [f"{what}: {n}" for n in i["notes"]]
    return lines


def describe_tf32(allow_tf32: bool | None, info: dict, what: str) -> tuple[str | None, list]:
    """The ``assumed:`` line about FP32 operands on the target and the range's variants
    (``hardware.allow_tf32`` true / false where PyTorch's defaults decided)."""
    new, old = info["new"], info["old"]
    fam = [r for r in info["rows"] if r[0] in ("fp32", "tf32")]
    if not fam:
        return None, []
    if not info["new_tf32"]:
        return (f"{what}: FP32 GEMMs/convolutions run FP32 on {new} (no TF32 units that "
                "PyTorch's allow_tf32 switches use)"), []
    if allow_tf32 is not None:
        on = "TF32 tensor cores" if allow_tf32 else "FP32 (CUDA cores)"
        return (f"{what}: hardware.allow_tf32 = {str(allow_tf32).lower()}: FP32 GEMMs and "
                f"convolutions run on {on} on {new}"), []
    if not info["defaulted"]:
        if info["new_tf32"] and info["old_tf32"]:
            return (f"{what}: FP32 GEMMs/convolutions keep the math the {old} trace shows "
                    "(TF32 where its kernels ran TF32, FP32 where they ran on the CUDA cores; "
                    "hardware.allow_tf32 changes it)"), []
        return None, []
    variants = []
    if "gemm" in info["defaulted"]:
        variants.append({"hardware.allow_tf32": True})
    if "conv" in info["defaulted"]:
        variants.append({"hardware.allow_tf32": False})
    return (f"{what}: hardware.allow_tf32 not given: PyTorch's defaults (since 1.12: "
            "torch.backends.cuda.matmul.allow_tf32 = False, torch.backends.cudnn.allow_tf32 = "
            f"True) decide how FP32 GEMMs ({'FP32' if not PYTORCH_TF32_DEFAULT[0] else 'TF32'}"
            f") and convolutions ({'TF32' if PYTORCH_TF32_DEFAULT[1] else 'FP32'}) run on "
            f"{new} (the {old} trace cannot show the setting: no TF32 units); the range "
            "replays the other setting"), variants
