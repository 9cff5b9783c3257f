"""Fused (FlashAttention-style) attention's cost: the one flash-attention model (what-ifs
price measured flash kernels with it, the synthesizer its own). Re-exported by
:mod:`.kernels`; the model is described in its module docstring and :func:`attention`."""

from __future__ import annotations

import math
import re

from ..errors import ConfigError
from .gpus import GpuSpec
from .kbase import OpCost, _eb, _finish, _positive

__all__ = ["attention", "head_dim_rates", "FLASH_BWD_RATE", "ATTN_KERNELS", "attn_kernel_family",
           "cudnn_fwd_tflops"]

_ATTN_S_HALF = 256.0  # sequence length at which attention reaches half its rate (assumed)
_ATTN_TILE = 128  # FlashAttention-2's query/key tile rows: a causal mask's diagonal tiles (assumed)
_ANCHOR_SEQ = 8192  # sequence of the published FlashAttention-2 figures (K2-K5, K41)
#: sequence of a published forward rate (``flash_fwd_tflops``): FA4's B200 grid's longest
#: (K45; assumed: the paper's maxima are at its longest sequences; 1% from 8192 to 32768)
_FWD_ANCHOR_SEQ = 32768
#: a flash-attention backward's FLOP/s over its forward's at the same shape: FlashAttention-2
#: on H100 SXM5, head dim 128, sequence 16k, 322 / 370 TFLOP/s (FA3 paper, Shah et al. 2024,
#: arXiv 2407.08608, Figs. 5-6; cuDNN 516 / 595 and FlashAttention-3 561 / 648 give the same
#: 0.87; REFERENCES.md K14). The backward's extra softmax recomputation and its dS / dQ
#: accumulation (atomics in FA2) are not GEMM work, so it runs below the forward's rate.
FLASH_BWD_RATE = 0.87

#: attention kernel families the model prices: ``flash2`` (FlashAttention-2, the published
#: rates K2-K5 / K40-K46; the default) and ``cudnn`` (cuDNN's fused flash attention on Hopper,
#: ``cudnn_generated_fort_native_sdpa_sm90_*``: what PyTorch's SDPA runs on an H100 / H200, K51)
ATTN_KERNELS = ("flash2", "cudnn")
#: cuDNN's bf16 attention forward TFLOP/s on H100 80GB SXM5 (FA3 paper, arXiv 2407.08608,
#: Fig. 5, cuDNN's bars; REFERENCES.md K50): (head dim, causal) -> at sequences _CUDNN_SEQ
#: (batch x sequence 16k, hidden 2048, causal FLOPs counted half)
_CUDNN_SEQ = (512, 1024, 2048, 4096, 8192, 16384)
_CUDNN_H100 = {(64, False): (335, 373, 395, 408, 412, 413),
               (64, True): (225, 288, 334, 363, 379, 388),
               (128, False): (497, 574, 617, 609, 600, 595),
               (128, True): (315, 410, 484, 518, 529, 539)}
_H100_MAMF16 = 792.1  # the GPU the K50 figures were measured on: H100 SXM's 16-bit MAMF (K1)
_CUDNN_KERNEL = re.compile(r"fort_native_sdpa|cudnn\w*sdpa|sdpa_sm90", re.I)


def attn_kernel_family(g: GpuSpec, kernels: list[str] | None) -> str:
    """The attention kernel family a traced call's kernel names show: ``cudnn`` for cuDNN's
    Hopper SDPA kernels on a Hopper GPU (K50's figures are Hopper's), else ``flash2``."""
    if g.arch == "hopper" and kernels and any(_CUDNN_KERNEL.search(k) for k in kernels):
        return "cudnn"
    return "flash2"


def cudnn_fwd_tflops(g: GpuSpec, head_dim: float, seq_k: int, causal: bool) -> float:
    """cuDNN's Hopper forward TFLOP/s at this head dim (mean of the query/key and value
    widths) and key sequence: K50's H100 bars, interpolated in log2(sequence) between 512 and
    16k (flat beyond 16k; below 512 the 512 bar x the sequence curve ``s / (s + 256)``
    relative to 512, assumed) and linearly in head dim between 64 and 128 (clamped outside:
    no bar read for other head dims), x the GPU's 16-bit MAMF over H100 SXM's (same GH100
    tensor cores: H200 1.003)."""
    def at_dim(d: int) -> float:
        ys = _CUDNN_H100[(d, bool(causal))]
        if seq_k <= _CUDNN_SEQ[0]:
            c = (seq_k / (seq_k + _ATTN_S_HALF)) / (512 / (512 + _ATTN_S_HALF))
            return ys[0] * c
        if seq_k >= _CUDNN_SEQ[-1]:
            return ys[-1]
        x = math.log2(seq_k)
        for i in range(len(_CUDNN_SEQ) - 1):
            x0, x1 = math.log2(_CUDNN_SEQ[i]), math.log2(_CUDNN_SEQ[i + 1])
            if x <= x1:
                return ys[i] + (ys[i + 1] - ys[i]) * (x - x0) / (x1 - x0)
        return ys[-1]  # pragma: no cover

    d = min(max(head_dim, 64.0), 128.0)
    w = (d - 64.0) / 64.0
    r = at_dim(64) * (1 - w) + at_dim(128) * w
    return r * _mamf16(g) / _H100_MAMF16


def _fb_per_fwd() -> float:
    """A flash kernel's forward + backward FLOP/s over its forward's: 3.5x the forward FLOPs
    over the forward's time plus the backward's (2.5x the FLOPs at ``FLASH_BWD_RATE``)."""
    return 3.5 / (1.0 + 2.5 / FLASH_BWD_RATE)


def head_dim_rates(fwd_anchor: float, anchor_dim: int, exp_tops: float,
                   dims: float, mamf: float = math.inf) -> tuple[float, float]:
    """(forward, backward) TFLOP/s of a flash kernel whose query/key and value widths sum to
    ``dims``, from the forward rate ``fwd_anchor`` published at head dim ``anchor_dim``
    (query = key = value width) on a GPU computing ``exp_tops`` tera-exponentials per second.

    A score costs ``2 (d_qk + d_v)`` tensor-core FLOPs forward and one exponential on the
    special-function units, serial with them in FlashAttention-2 (FA3 paper, arXiv
    2407.08608, section 3: H100 SXM5 989 TFLOP/s of matmul, 3.9 T exponentials/s;
    REFERENCES.md K43): ``t = 2 (d_qk + d_v) / R + 1 / E``; the anchor fixes ``R``. The
    backward computes 2.5x the forward's FLOPs per score and recomputes the exponential
    once: ``t_b = 5 (d_qk + d_v) / R_b + 1 / E``, ``R_b`` set so the backward runs at
    :data:`FLASH_BWD_RATE` of the forward at the anchor (K14, measured at head dim 128).

    Bound (K46): ``R`` and ``R_b`` never exceed ``mamf``, the GPU's 16-bit maximum
    achievable matmul rate (K1: no matmul beats it, the two inside a flash kernel
    included). Where the anchor would need a faster ``R``, the exponentials cannot all be
    serial (they overlap the tensor-core work, as FA3's interleaved matmul and softmax
    do): ``R = mamf`` and the exposed exponential time per score is only the anchor's time
    not covered by the matmuls at ``mamf``, ``t_anchor - 4 d_anchor / mamf`` (at most
    ``1 / E``, never negative); the overlap fraction ``1 - exposed E`` is derived from the
    anchor, not fitted. A100 (K2 anchor at head dim 64): ``R`` 305 -> 267.9, 28% of
    the exponential hidden."""
    t_exp = 1.0 / exp_tops  # ps per score (FLOPs / TFLOP/s = ps)
    fa = 4.0 * anchor_dim
    t_fa = fa / fwd_anchor
    t_ba = 2.5 * t_fa / FLASH_BWD_RATE
    if t_fa <= t_exp or t_ba <= t_exp:
        raise ConfigError(f"[published] exp_tops={exp_tops}: its exponentials alone take longer "
                          f"than the published flash rate's score time; check the profile")
    r_f, e_f = _bounded(fa, t_fa, t_exp, mamf)
    r_b, e_b = _bounded(2.5 * fa, t_ba, t_exp, mamf)
    f = 2.0 * dims
    return f / (f / r_f + e_f), 2.5 * f / (2.5 * f / r_b + e_b)


def _bounded(flops: float, t: float, t_exp: float, mamf: float) -> tuple[float, float]:
    """(matmul TFLOP/s, exposed exponential ps per score) of a score of ``flops`` tensor
    FLOPs taking ``t`` ps with an exponential of ``t_exp`` ps: all of the exponential
    serial unless that needs a matmul rate above ``mamf`` (K46); then the matmuls at
    ``mamf`` and only the rest of ``t`` exposed (never negative)."""
    r = flops / (t - t_exp)
    if r <= mamf:
        return r, t_exp
    return mamf, max(0.0, t - flops / mamf)


def _mamf16(g: GpuSpec) -> float:
    """The 16-bit matmul ceiling the published flash rates (16-bit) are bounded by (K46)."""
    return g.mamf("bf16" if g.hw.peak_tflops.get("bf16") else "fp16")[0]


def attention(g: GpuSpec, batch: int, heads: int, seq: int, head_dim: int,
              kv_heads: int | None = None, causal: bool = False, backward: bool = False,
              dtype: str = "bf16", seq_k: int | None = None,
              v_dim: int | None = None, kernel: str = "flash2") -> OpCost:
    """Fused (FlashAttention-style) attention: ``seq`` queries over ``seq_k`` keys (default
    ``seq``), query/key width ``head_dim`` and value width ``v_dim`` (default ``head_dim``);
    GQA when ``kv_heads < heads`` (fewer K/V bytes, same FLOPs). The one flash-attention
    model: what-ifs price measured flash kernels with it and the synthesizer its own.

    Rate: the GPU's published FlashAttention-2 figure (K2-K5) is a forward + backward rate
    at sequence 8192 (the flash-attention repository's benchmark, K41), converted to the
    forward's rate with the backward at :data:`FLASH_BWD_RATE` (K14) and the sequence
    curve at 8192; x the sequence curve at ``seq_k`` (s_half 256, assumed); a causal mask
    computes its diagonal tiles whole: of ``n = seq_k / 128`` key tiles per query row of
    tiles it wastes half of one, efficiency ``n / (n + 1)`` (FlashAttention-2's 128-row
    tiles, assumed); the backward at :data:`FLASH_BWD_RATE` of the forward's rate.

    ``kernel="cudnn"`` (Hopper only): cuDNN's fused attention, the forward at its published
    H100 rate for this head dim, sequence and mask (:func:`cudnn_fwd_tflops`, K50; the
    bars hold the sequence curve and the causal tiles), the backward at
    :data:`FLASH_BWD_RATE` of it (K14: cuDNN 516 / 595) plus its two streaming passes
    (K52): ``dot(dO, O)`` per row (read O and dO, write an fp32 row statistic) and the fp32
    dQ accumulator's conversion (read 4 bytes, write ``dtype``), at the HBM rate."""
    kvh = heads if kv_heads is None else kv_heads
    sk = seq if seq_k is None else seq_k
    vd = head_dim if v_dim is None else v_dim
    _positive(batch=batch, heads=heads, seq=seq, head_dim=head_dim, kv_heads=kvh,
              seq_k=sk, v_dim=vd)
    if heads % kvh:
        raise ConfigError(f"--kv-heads {kvh}: must divide --heads {heads}")
    eb = _eb(dtype)
    flops = 2.0 * batch * heads * seq * sk * (head_dim + vd) * (0.5 if causal else 1.0)
    q_o = batch * seq * heads * (head_dim + vd) * eb
    k_v = batch * sk * kvh * (head_dim + vd) * eb
    nbytes = q_o + k_v  # read q, k, v; write o (+ small softmax statistics)
    if backward:
        flops *= 2.5
        nbytes = 2 * nbytes + q_o + k_v  # read q,k,v,o,do; write dq,dk,dv
    hd_src = ""
    if kernel not in ATTN_KERNELS:
        raise ConfigError(f"attention kernel {kernel!r}: choose one of {', '.join(ATTN_KERNELS)}")
    if kernel == "cudnn":
        return _cudnn(g, batch, heads, seq, sk, head_dim, vd, causal, backward, dtype, flops,
                      nbytes)
    if g.flash_attn_tflops > 0 or g.flash_fwd_tflops > 0:
        if g.flash_fwd_tflops > 0:
            fwd = g.flash_fwd_tflops / (_FWD_ANCHOR_SEQ / (_FWD_ANCHOR_SEQ + _ATTN_S_HALF))
            src0 = (f"fwd {fwd:.1f} from the published forward {g.flash_fwd_tflops:.1f} "
                    "(Blackwell: cuDNN, K45)")
        else:
            fwd = g.flash_attn_tflops / _fb_per_fwd() / (
                _ANCHOR_SEQ / (_ANCHOR_SEQ + _ATTN_S_HALF))
            src0 = (f"fwd {fwd:.1f} from the published fwd+bwd {g.flash_attn_tflops:.1f}, "
                    "K2-K5, K41")
        pas = "bwd" if backward else "fwd"
        if g.exp_tops > 0 and g.flash_attn_head_dim > 0:
            fwd_d, bwd_d = head_dim_rates(fwd, g.flash_attn_head_dim, g.exp_tops,
                                          head_dim + vd, _mamf16(g))
            rate = bwd_d if backward else fwd_d
            t_a = 4.0 * g.flash_attn_head_dim / fwd * (2.5 / FLASH_BWD_RATE if backward else 1)
            r_m, e_x = _bounded(4.0 * g.flash_attn_head_dim * (2.5 if backward else 1.0), t_a,
                                1.0 / g.exp_tops, _mamf16(g))
            cap = (f"; R capped at the 16-bit MAMF {r_m:.1f}, {e_x * g.exp_tops:.0%} of 1 / E "
                   "exposed, K46" if e_x < 1.0 / g.exp_tops else "")
            hd_src = (f" -> {pas} {rate:.1f} at head dims {head_dim}+{vd} (per score "
                      f"2(d_qk + d_v) / R + 1 / E, E {g.exp_tops:g} T exp/s, anchor head dim "
                      f"{g.flash_attn_head_dim}; K43{cap})")
        else:
            rate = fwd * (FLASH_BWD_RATE if backward else 1.0)
    else:
        fwd, src0 = g.peak_tflops(dtype) * 0.35, "assumed 35% of peak"
        rate = fwd * (FLASH_BWD_RATE if backward else 1.0)
    curve = sk / (sk + _ATTN_S_HALF)
    n = sk / _ATTN_TILE
    mask = n / (n + 1.0) if causal else 1.0
    rate = rate * curve * mask
    rate = min(rate, g.mamf(dtype)[0])
    kern = "flash attention" if g.flash_fwd_tflops > 0 else "FlashAttention-2"
    src = (f"{kern} {src0}{hd_src} x sequence curve {curve:.2f} (s_half 256, "
           f"assumed){f' x causal tiles {mask:.3f} (128-row tiles, assumed)' if causal else ''}"
           f"{f' x backward {FLASH_BWD_RATE} (published, K14)' if backward and not hd_src else ''}")
    rel = math.hypot(0.05 if g.flash_attn_tflops or g.flash_fwd_tflops else 0.25, 0.15)
    return _finish("attention", g, flops, nbytes, flops / (rate * 1e6), src,
                   rate / g.peak_tflops(dtype), rel)


def _cudnn(g: GpuSpec, batch: int, heads: int, seq: int, sk: int, head_dim: int, vd: int,
           causal: bool, backward: bool, dtype: str, flops: float, nbytes: float) -> OpCost:
    """:func:`attention` for ``kernel="cudnn"`` (K50-K52)."""
    if g.arch != "hopper":
        raise ConfigError(f"attention kernel 'cudnn': its published rates (K50) are Hopper's; "
                          f"{g.name} is {g.arch}: use the default kernel")
    fwd = cudnn_fwd_tflops(g, (head_dim + vd) / 2.0, sk, causal)
    rate = min(fwd * (FLASH_BWD_RATE if backward else 1.0), g.mamf(dtype)[0])
    t = flops / (rate * 1e6)
    src = (f"cuDNN Hopper fused attention: fwd {fwd:.1f} TFLOP/s (published H100 bars at head "
           f"dim {(head_dim + vd) / 2:g}, seq {sk}, {'causal' if causal else 'full'}, K50; x "
           f"16-bit MAMF / H100's)")
    if backward:
        eb = _eb(dtype)
        rows = batch * heads * seq
        extra = rows * vd * eb * 2 + rows * 4 + rows * head_dim * (4 + eb)
        t_x = extra / (g.hbm_gbps()[0] * 1e3)
        t += t_x
        nbytes += extra
        src += (f" x backward {FLASH_BWD_RATE} (K14) + dot(dO, O) and dQ-conversion passes "
                f"{t_x:.1f} us at the HBM rate (K52)")
    rel = math.hypot(0.05, 0.10)
    return _finish("attention", g, flops, nbytes, t, src, flops / t / 1e6 / g.peak_tflops(dtype),
                   rel)
