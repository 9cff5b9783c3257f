"""Kernel cost from shapes (issue 27): roofline bounds, the published ceiling never exceeded,
wave quantization, published GEMM sweeps at their tolerance, bad shapes refused."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import tomllib
from conftest import bench_module

from retime.collectors.costs import kernels as K
from retime.collectors.costs.gpus import gpu_names, gpu_spec
from retime.collectors.costs.tiles import tile_utilization
from retime.collectors.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_gemm_never_exceeds_the_published_ceiling():
    rng = random.Random(7)
    for name in gpu_names():
        g = gpu_spec(name)
        for dtype in ("bf16", "fp8"):
            if dtype not in g.hw.peak_tflops:
                continue
            ceiling = g.mamf(dtype)[0]
            for _ in range(60):
                m, n, k = (rng.choice([1, 7, 64, 256, 1000, 4096, 16384, 65536])
                           for _ in range(3))
                r = K.matmul(g, m, n, k, rng.choice([1, 1, 4]), dtype)
                assert r.tflops <= ceiling * (1 + 1e-9), (name, dtype, m, n, k)
                assert r.range_us[0] < r.time_us < r.range_us[1]


def test_big_gemm_is_compute_bound_near_the_ceiling():
    g = gpu_spec("h100-sxm")
    r = K.matmul(g, 16384, 16384, 16384, dtype="bf16")
    assert r.bound == "compute"
    assert 0.95 * 792.1 < r.tflops <= 792.1
    assert r.flops == 2 * 16384**3
    assert "published" in r.efficiency_source


def test_skinny_gemm_is_memory_bound_and_closed_form():
    """A GEMV-like shape moves its weight once: time = bytes / (triad x size curve)."""
    g = gpu_spec("a100-80gb")
    m, n, k = 1, 8192, 8192
    r = K.matmul(g, m, n, k, dtype="bf16")
    nbytes = 2 * (m * k + k * n) + 2 * m * n
    bw = 1700.0  # published triad, GB/s
    t = nbytes / (bw * nbytes / (nbytes + bw * 1e3 * 0.6) * 1e3)
    assert r.bound == "memory" and r.bytes == nbytes
    assert r.time_us == pytest.approx(t, rel=1e-12)


def test_fp32_small_n_gemm_streams_its_weight_once():
    """K35: an FP32 GEMM with at most 16 rows (VGG-13's first classifier layer at batch 12:
    a 25088 x 4096 weight, 411 MB) on NVIDIA's CUDA cores is priced as cuBLAS's small-N
    kernel where that is memory-bound: the weight and activations once at the HBM triad
    (closed form), not as 64+-row output tiles of padded FLOPs. 17 rows, a 16-bit (tensor
    core) GEMM and a small call below the launch floor keep the tiled price."""
    g = gpu_spec("a100-80gb")
    m, n, k = 12, 4096, 25088
    nbytes = 4 * (m * k + k * n + m * n)
    bw, lat = 1700.0, 0.2  # published triad GB/s; FITTED_CURVES' bytes in flight (us)
    t = nbytes / (bw * nbytes / (nbytes + bw * 1e3 * lat) * 1e3)
    for mm, nn, kk in ((m, n, k), (n, m, k), (m, k, n)):  # forward, transposed, data grad
        r = K.matmul(g, mm, nn, kk, dtype="fp32", curves=K.FITTED_CURVES)
        assert r.bound == "memory" and r.bytes == nbytes
        assert r.time_us == pytest.approx(t, rel=1e-12)
        assert r.efficiency_source.startswith("small-N GEMV-based kernel (min(m, n) 12 <= 16")
        # the useful FLOPs at the FP32 ceiling take less than the stream: memory-bound
        assert r.flops / (g.mamf("fp32")[0] * 1e6) < t
    tiled = K.matmul(g, 17, n, k, dtype="fp32", curves=K.FITTED_CURVES)
    assert tiled.bound == "compute" and tiled.time_us > 4 * t
    assert "small-N" not in K.matmul(g, m, n, k, dtype="bf16").efficiency_source
    v = gpu_spec("v100-sxm2")  # a DLRM batch-16 linear: 1.1 MB, below the launch floor
    assert "small-N" not in K.matmul(v, 16, 512, 512, dtype="fp32",
                                     curves=K.FITTED_CURVES).efficiency_source


def test_tiny_kernels_are_latency_bound():
    g = gpu_spec("b200")
    r = K.streaming(g, 1000, "bf16")
    assert r.bound == "latency" and r.time_us == g.hw.kernel_overhead_us


def test_wave_quantization_costs_a_partial_wave():
    # 132 SMs, a shallow reduction (no split-K): 133 tiles of 128x128 need two waves, 132
    # need one; smaller tiles fill the waves but lose their reuse
    one = tile_utilization(132, [128 * 132], 128, 256, 192)
    two = tile_utilization(132, [128 * 133], 128, 256, 192)
    assert one == pytest.approx(1.0) and two == pytest.approx(133 / 264)
    # a deep reduction can split k over the idle SMs (stream-K), at a 10% fix-up cost
    assert tile_utilization(132, [128 * 133], 128, 4096, 192) == pytest.approx(0.9)
    g = gpu_spec("h100-sxm")
    a = K.matmul(g, 128 * 132, 256, 512, dtype="bf16")  # 264 tiles: two full waves
    b = K.matmul(g, 128 * 133, 256, 512, dtype="bf16")  # 266 tiles: a third, nearly empty
    assert a.bound == b.bound == "compute"
    assert b.time_us > 1.3 * a.time_us


def test_attention_flops_causal_gqa_and_backward():
    g = gpu_spec("h100-sxm")
    f = K.attention(g, 2, 32, 4096, 128)
    assert f.flops == 4 * 2 * 32 * 4096**2 * 128
    c = K.attention(g, 2, 32, 4096, 128, causal=True)
    assert c.flops == f.flops / 2 and c.time_us < f.time_us
    q = K.attention(g, 2, 32, 4096, 128, kv_heads=8)
    assert q.flops == f.flops and q.bytes < f.bytes
    b = K.attention(g, 2, 32, 4096, 128, backward=True)
    assert b.flops == 2.5 * f.flops and b.tflops < f.tflops
    # the published FlashAttention-2 figure is a forward + backward rate (K41: the
    # flash-attention benchmark's "fwd + bwd", batch 2, seq 8192, hidden 2048): at that
    # shape the two passes together take 3.5x the forward FLOPs at 327.9 TFLOP/s (K3)
    f8, b8 = (K.attention(g, 2, 16, 8192, 128, backward=bw) for bw in (False, True))
    assert 3.5 * f8.flops / ((f8.time_us + b8.time_us) * 1e6) == pytest.approx(327.9, rel=0.002)
    # a causal mask computes its diagonal 128-row tiles whole: 32 key tiles at 4096 waste
    # half of one per row of tiles (32 / 33 of the rate on half the FLOPs)
    assert c.tflops / f.tflops == pytest.approx(32 / 33, rel=0.002)


def test_attention_cross_lengths_and_value_width():
    """Queries over a longer key range (context parallelism's local queries) and a value
    width unlike the query/key width (latent attention): FLOPs 2 b h s_q s_k (d_qk + d_v),
    and at equal shapes the same kernel as the square call."""
    g = gpu_spec("h100-sxm")
    x = K.attention(g, 1, 16, 2048, 192, seq_k=8192, v_dim=128, causal=True)
    assert x.flops == 2 * 16 * 2048 * 8192 * (192 + 128) * 0.5
    sq = K.attention(g, 1, 16, 4096, 128, seq_k=4096, v_dim=128)
    assert sq.time_us == K.attention(g, 1, 16, 4096, 128).time_us


def test_flash_backward_runs_at_the_published_fraction_of_the_forward_rate():
    """FA3 paper Figs. 5-6 (REFERENCES K14): a flash-attention backward sustains 322 / 370
    of its forward's FLOP/s (FlashAttention-2, H100, head dim 128); the one flash model
    prices it so (measured kernels, the synthesizer and `cost op --training` alike)."""
    assert K.FLASH_BWD_RATE == pytest.approx(322 / 370, abs=0.002)
    g = gpu_spec("h100-sxm")
    f = K.attention(g, 1, 32, 8192, 128)
    b = K.attention(g, 1, 32, 8192, 128, backward=True)
    assert b.tflops / f.tflops == pytest.approx(K.FLASH_BWD_RATE, rel=1e-3)  # + launch floor


def test_conv_is_an_implicit_gemm():
    g = gpu_spec("a100-80gb")
    r = K.conv2d(g, 64, 64, 56, 56, 64, kernel=3)
    assert r.flops == 2 * (64 * 56 * 56) * 64 * (64 * 9)
    s2 = K.conv2d(g, 64, 64, 56, 56, 64, kernel=3, stride=2)
    assert s2.flops == 2 * (64 * 28 * 28) * 64 * (64 * 9)


def test_optimizer_and_embedding_bytes():
    g = gpu_spec("h200")
    adam = K.optimizer_step(g, 10**9, "adam", "bf16")
    assert adam.bytes == 10**9 * (24 + 4) and adam.bound == "memory"
    assert K.optimizer_step(g, 10**9, "sgd").bytes < adam.bytes
    e = K.embedding(g, 4096, 4096, "bf16")
    assert e.bytes == 4096 * 8192 + 4096 * 8 + 4096 * 8192


@pytest.mark.parametrize("call, words", [
    (lambda g: K.matmul(g, 0, 10, 10), "positive"),
    (lambda g: K.matmul(g, 10, 10, 10, dtype="fp7"), "--dtype"),
    (lambda g: K.attention(g, 1, 12, 128, 64, kv_heads=5), "must divide"),
    (lambda g: K.optimizer_step(g, 10, "lion"), "--optimizer"),
    (lambda g: K.conv2d(g, 1, 3, 2, 2, 8, kernel=7, padding=0), "no output"),
    (lambda g: K.matmul(gpu_spec("a100-80gb"), 64, 64, 64, dtype="fp8"), "no fp8 peak"),
])
def test_bad_shapes_are_refused(call, words):
    with pytest.raises(ConfigError, match=words):
        call(gpu_spec("h100-sxm"))


def test_published_gemm_sweeps_at_tolerance():
    """Judged rows of 2048+ in every dimension (the issue's 256+-token GEMMs at these
    sweeps' shapes) within 10% (A100 FP16, H100/H200 FP8) and 30% (GB200 FP8: the model
    underestimates Blackwell at 2048^3, -26%; larger shapes are within 8%)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import cost as bench
    finally:
        sys.path.pop(0)
    with open(ROOT / "bench" / "data" / "cost_published.toml", "rb") as fh:
        data = tomllib.load(fh)
    tol = {("K2", "fp16"): 0.10, ("K3", "fp8"): 0.10, ("K4", "fp8"): 0.10, ("K5", "fp8"): 0.30}
    checked = 0
    for s in data["gemm"]:
        rows = bench.gemm_rows(s)
        assert not any(r["above_ceiling"] for r in rows)
        t = tol.get((s["id"], s["dtype"]))
        if t is None:
            continue
        for r in rows:
            dims = [int(x) for x in r["shape"].split("x")]
            if r["role"] == "judge" and min(dims) >= 2048:
                assert abs(r["error"]) < t, (s["title"], r)
                checked += 1
    assert checked >= 16


def _bench():
    return bench_module("cost")


def test_same_shape_gemms_on_a100_and_h100():
    """K9 (judged): BF16 GEMMs of 4096+ tokens, the same shapes on A100 and H100: every op
    time within 20% on each GPU, and the A100 / H100 time ratio within 15% per shape."""
    bench = _bench()
    with open(ROOT / "bench" / "data" / "cost_published.toml", "rb") as fh:
        s = next(x for x in tomllib.load(fh)["same_shape"] if x["id"] == "K9")
    rows = bench.same_shape_rows(s)
    assert len(rows) == 2 * len(s["rows"]) == 14
    for r in rows:
        assert r["tokens"] >= 256 and r["role"] == "judge"
        assert abs(r["error"]) < 0.20, r
    # the published time is the source's flops (m n (2k - 1)) at its TFLOP/s
    first = next(r for r in rows if r["gpu"] == "a100-80gb")
    assert first["published_us"] == pytest.approx(16384 * 1280 * (2 * 8192 - 1) / 264.9e6)
    for r in bench.speedups(rows, s["gpus"]):
        assert 2.0 < r["published"] < 3.5 and abs(r["error"]) < 0.15, r


def test_no_priced_matmul_exceeds_the_published_ceiling():
    """The bench's check over its grid of shapes: for every GPU/dtype with a published
    maximum achievable matmul rate, the model's best is at or below it, and close to it
    (a big enough GEMM reaches the ceiling's neighbourhood)."""
    checks = _bench().ceiling_check([])
    got = {(c["gpu"], c["dtype"]) for c in checks}
    assert {("a100-80gb", "bf16"), ("h100-sxm", "bf16"), ("h100-sxm", "fp8"),
            ("mi300x", "bf16")} <= got
    for c in checks:
        assert not c["above"] and c["max_predicted"] <= c["ceiling"], c
        assert c["max_predicted"] > 0.95 * c["ceiling"], c


def _fa2_rate(g, s: int, d: int, causal: bool, backward: bool) -> float:
    """The model's TFLOP/s at the FA3 paper's FlashAttention-2 benchmark shape (16k tokens,
    hidden 2048)."""
    return K.attention(g, 16384 // s, 2048 // d, s, d, causal=causal, backward=backward).tflops


def test_attention_matches_published_fa2_on_h100_at_head_dim_128():
    """FA3 paper Figs. 5-6 (REFERENCES K40), FlashAttention-2 on H100 SXM5, head dim 128,
    sequence 16k: forward 370 (full) / 335 (causal), backward 322 TFLOP/s."""
    g = gpu_spec("h100-sxm")
    assert _fa2_rate(g, 16384, 128, False, False) == pytest.approx(370, rel=0.05)
    assert _fa2_rate(g, 16384, 128, False, True) == pytest.approx(322, rel=0.05)
    assert _fa2_rate(g, 16384, 128, True, False) == pytest.approx(335, rel=0.10)


def test_attention_head_dim_64_on_h100():
    """K40: FA2 at head dim 64 runs 324 / 299 TFLOP/s (full / causal, H100, 16k); with the
    exponential term (K43) the model gives 310 / 308 (368 / 365 without it: 1.14x / 1.22x)."""
    g = gpu_spec("h100-sxm")
    assert _fa2_rate(g, 16384, 64, False, False) == pytest.approx(324, rel=0.10)
    assert _fa2_rate(g, 16384, 64, True, False) == pytest.approx(299, rel=0.10)


def _k29_fp32():
    """bench/cost.py's rows of K29's FP32 cuBLAS series (CUDA cores, H100 SXM, M = N = K)."""
    bench = _bench()
    with open(ROOT / "bench" / "data" / "kernel_published.toml", "rb") as fh:
        s = next(x for x in tomllib.load(fh)["gemm"] if x["id"] == "K29" and x["dtype"] == "fp32")
    return {r["shape"]: r for r in bench.gemm_rows(s)}


@pytest.mark.parametrize("n", [4096, 8192])
def test_k29_fp32_cublas_large_squares_within_15_percent(n):
    """K29 (judged, scored once when added): FP32 SGEMM on the CUDA cores at 4096^3 (45.68
    TFLOP/s published, +13.4% when scored) and 8192^3 (50.49, +2.8%) within 15%."""
    r = _k29_fp32()[f"{n}x{n}x{n}"]
    assert r["role"] == "judge" and not r["above_ceiling"]
    assert abs(r["error"]) < 0.15, r


@pytest.mark.xfail(strict=True, reason="K29 FP32 2048^3: published 21.82 TFLOP/s, the model "
                   "51.3 (+135%): 256 tiles of 128 x 128 on 132 SMs are two nearly full "
                   "waves, which the model prices near peak; cuBLAS runs it at 48% of 4096^3's "
                   "rate")
def test_k29_fp32_cublas_2048_within_15_percent():
    r = _k29_fp32()["2048x2048x2048"]
    assert abs(r["error"]) < 0.15, r


def test_head_dim_term_closed_form():
    """Per score: forward 2 (d_qk + d_v) / R + 1 / E, backward 5 (d_qk + d_v) / R_b + 1 / E;
    R and R_b from the anchor (its own rate back, the backward at FLASH_BWD_RATE there)."""
    fa, e, da = 400.0, 3.9, 128
    f, b = K.head_dim_rates(fa, da, e, 2 * da)
    assert f == pytest.approx(fa, rel=1e-12) and b == pytest.approx(K.FLASH_BWD_RATE * fa)
    t_exp = 1 / e
    r = 4 * da / (4 * da / fa - t_exp)
    r_b = 10 * da / (2.5 * 4 * da / fa / K.FLASH_BWD_RATE - t_exp)
    f64, b64 = K.head_dim_rates(fa, da, e, 128)
    assert f64 == pytest.approx(256 / (256 / r + t_exp), rel=1e-12)
    assert b64 == pytest.approx(640 / (640 / r_b + t_exp), rel=1e-12)
    assert f64 < fa and b64 < K.FLASH_BWD_RATE * fa  # fewer FLOPs per exponential
    # MLA-like widths (192 + 128) carry more FLOPs per exponential: faster than the anchor
    assert K.head_dim_rates(fa, da, e, 320)[0] > fa
    # no exponential throughput stated: no head-dim term (the anchor's rate at every width)
    g = gpu_spec("h100-sxm")
    assert g.exp_tops == 3.9 and g.flash_attn_head_dim == 128
    assert gpu_spec("gb300").exp_tops == 0


def test_head_dim_term_matmul_rate_bounded_by_mamf():
    """K46: the flash kernel's matmul rate R never exceeds the MAMF; where the anchor needs a
    faster R (A100: K2's 179.5 at head dim 64 under 1 / E = 1 / 2.44 ps gives R = 305 >
    267.9, K1) R = MAMF and only the anchor's time not covered by the matmuls at MAMF is
    exponential: e = t_anchor - 4 d_anchor / MAMF per score (closed form, by hand)."""
    fa, e, da, mamf = 204.9, 2.44, 64, 267.9
    t_a, t_exp = 4 * da / fa, 1 / e
    assert 4 * da / (t_a - t_exp) > mamf  # unbounded R would beat the best GEMM
    exposed = t_a - 4 * da / mamf
    assert 0 < exposed < t_exp  # part of the exponential hidden under the matmuls
    f, _ = K.head_dim_rates(fa, da, e, 2 * da, mamf)
    assert f == pytest.approx(fa, rel=1e-12)  # the anchor itself is kept
    f128, _ = K.head_dim_rates(fa, da, e, 256, mamf)
    assert f128 == pytest.approx(512 / (512 / mamf + exposed), rel=1e-12)
    assert f128 < K.head_dim_rates(fa, da, e, 256)[0]  # slower than the unbounded term
    # the backward's R_b (K14's 0.87 at the anchor) stays below the MAMF: unchanged
    assert K.head_dim_rates(fa, da, e, 256, mamf)[1] == K.head_dim_rates(fa, da, e, 256)[1]
    # an anchor at or above the MAMF: nothing left for the exponential (never negative)
    assert K.head_dim_rates(300.0, da, e, 256, 250.0)[0] == pytest.approx(250.0, rel=1e-12)
    # every profile with a head-dim term: R at or below its 16-bit MAMF, the A100 at it
    for name in ("a100-80gb", "h100-sxm", "h200"):
        g = gpu_spec(name)
        a = K.attention(g, 1, 16, 1 << 20, g.flash_attn_head_dim)
        fwd = a.tflops / ((1 << 20) / ((1 << 20) + 256))
        r = 4 * g.flash_attn_head_dim / (4 * g.flash_attn_head_dim / fwd - 1 / g.exp_tops)
        assert ("MAMF" in a.efficiency_source) == (r > K._mamf16(g)), name
    assert K._mamf16(gpu_spec("a100-80gb")) == 267.9


@pytest.mark.xfail(strict=True, reason="K44 (one A100, FA2 forward, head dim 128, 1 x 4096^2, "
                   "non-causal): 184.0 TFLOP/s published, the model 218.0 (1.18x) even with "
                   "the MAMF bound (K46; 230.1 before it, 192.9 without the head-dim term)")
def test_attention_a100_head_dim_128_k44():
    g = gpu_spec("a100-80gb")
    assert K.attention(g, 1, 32, 4096, 128).tflops == pytest.approx(184.0, rel=0.10)


@pytest.mark.xfail(strict=True, reason="short non-causal sequences: FA2 on H100 at s 512 runs "
                   "282 / 309 TFLOP/s (head dim 64 / 128, K40), the model 208 / 247 (0.74x / "
                   "0.80x): the sequence curve s / (s + 256) is assumed")
def test_attention_short_sequences_on_h100():
    g = gpu_spec("h100-sxm")
    assert _fa2_rate(g, 512, 64, False, False) == pytest.approx(282, rel=0.10)
    assert _fa2_rate(g, 512, 128, False, False) == pytest.approx(309, rel=0.10)


@pytest.mark.parametrize("gpu", ["b200", "gb200", "b300", "gb300"])
def test_blackwell_attention_prices_at_the_published_cudnn_forward(gpu):
    """K45: cuDNN 9.13's B200 BF16 forward, 1613 / 1.3 TFLOP/s (FlashAttention-4's abstract),
    is the Blackwell profiles' forward rate at long sequence (the curve s / (s + 256) at the
    anchor's 32768 divided out): no longer K5's FlashAttention-2 figure (GB200, 0.34x) nor
    35% of peak (B200, 0.63x); the backward at FLASH_BWD_RATE of it; below FA4's 1613."""
    g = gpu_spec(gpu)
    assert g.flash_fwd_tflops == pytest.approx(1613 / 1.3, abs=0.05)
    s = 32768
    f = K.attention(g, 1, 16, s, 128)
    assert 4 * 16 * s * s * 128 / (f.time_us * 1e6) == pytest.approx(1240.8, rel=1e-3)
    b = K.attention(g, 1, 16, s, 128, backward=True)
    assert b.tflops / f.tflops == pytest.approx(K.FLASH_BWD_RATE, rel=1e-3)
    assert f.tflops < 1613


_MONO_DIMS = (16, 64, 256, 1024, 4096)
_MONO_GPUS = ("v100-sxm2", "a100-80gb", "h100-sxm", "mi300x", "mi250x")


def _doubling_drops(small_n: bool) -> list:
    """(gpu, dtype, shape, bigger shape, us, bigger us) where doubling one of a GEMM's m, n, k
    prices it lower, among shapes with (``small_n``) or without a SIMT small-N side."""
    import itertools
    out = []
    for name in _MONO_GPUS:
        g = gpu_spec(name)
        for dt, curves in itertools.product(("fp32", "bf16"), (K.DEFAULT_CURVES, K.FITTED_CURVES)):
            simt = K.math_path(g, dt) == "simt"
            t = {s: K.matmul(g, *s, dtype=dt, curves=curves).time_us
                 for s in itertools.product(_MONO_DIMS, repeat=3)}
            for (m, n, k), us in t.items():
                if (simt and min(m, n) <= K.SMALL_N) != small_n:
                    continue
                for b in ((2 * m, n, k), (m, 2 * n, k), (m, n, 2 * k),
                          (4 * m, n, k), (m, 4 * n, k), (m, n, 4 * k)):
                    if b in t and t[b] < us * (1 - 1e-9):
                        out.append((name, dt, (m, n, k), b, round(us, 2), round(t[b], 2)))
    return out


def test_gemm_price_never_falls_as_its_work_grows():
    """More work in any dimension never costs less, on five GPUs, FP32 and BF16, default and
    fitted curves (#27: the split-K branch's whole slices of >= 2 k_half once priced MI300X
    FP32 16x128x256 at 9.83 us, 16x256x512 at 8.98; 180 shape pairs dropped on this grid)."""
    assert _doubling_drops(small_n=False) == []


@pytest.mark.xfail(strict=True, reason=(
    "known miss: an FP32 GEMM with a side <= 16 on NVIDIA's CUDA cores is priced as cuBLAS's "
    "small-N kernel only where that kernel's roofline is memory-bound, else as a tiled GEMM "
    "(its latency is not modeled, K35): V100 default curves 16 x 64 x 4096 prices 13.11 us "
    "(tiled) but 16 x 256 x 4096 6.45 us (small-N); 48 shape pairs drop on this grid"))
def test_small_n_gemm_price_never_falls_as_its_work_grows():
    assert _doubling_drops(small_n=True) == []
