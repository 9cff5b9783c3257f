"""Held-out H200 measurements against the cost layer (issues 27, 32; REFERENCES.md K47):
retime's own microbenchmarks (``traces/gpu_pairs/g{1,2}/micro.json``, ``bench/h200_micro.py``)
through ``retime cost op --gpu h200``, and the G1 training traces' operator calls priced as
``retime cost op --trace`` prices them (``bench/h200_kernels.py``).

Scored once before any change (``bench/heldout/h200_micro.md``, ``h200_kernels.md``). Two
changes followed, chosen after seeing these rows (so the rows are in-sample since): the h200
profile's 16-bit matmul ceiling is K30's published MAMF (794.5 TFLOP/s, "same" as H100 SXM)
instead of the assumed peak x 0.72 = 712.4 (the held-out 8192^3 row ran at 776.5), its tf32
one K20's GH100 cuBLAS tf32 / fp16 ratio of it; and ``cost op --trace`` prices an FP32-operand
GEMM in the math its kernels show (``sm90_xmma_gemm_f32f32_tf32f32``: TF32), as
``hardware.gpu`` does. Rows within the bar pass; misses are strict xfails with the reason."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from conftest import bench_module

from retime.collectors.costs import kernels as K
from retime.collectors.costs.gpus import gpu_spec

ROOT = Path(__file__).resolve().parents[1]
G1 = ROOT / "traces" / "gpu_pairs" / "g1"
BAR = 0.15  # per row, as K29 (tests/test_cost_kernels.py)
REST_BAR = 0.25  # memory-bound classes, median over groups (bench/kernel_loo.py's target)

_ROWS: list = []


def _micro() -> dict[str, dict]:
    if not _ROWS:
        _ROWS.extend(bench_module("h200_micro").score())
    return {r["row"]: r for r in _ROWS}


HOST_BOUND = ["matmul 256x256x256 bf16", "matmul 1024x1024x1024 bf16",
              "matmul 2048x2048x2048 bf16", "matmul 64x4096x4096 bf16",
              "matmul 256x256x256 fp32"]

_MISS = {
    "matmul 1024x1024x1024 fp32": "FP32 SIMT 1024^3: 31.4 TFLOP/s measured (0.64 of the "
    "4096^3 row's rate), the model 43.5 (-26.5%; -18.5% with the assumed 48.2 ceiling "
    "before): its tiles / waves factor 0.86 is above what cuBLAS reaches on this shape",
    "matmul 2048x2048x2048 fp32": "FP32 SIMT 2048^3: 42.2 TFLOP/s measured, the model 51.5 "
    "(-16.9%; -7.4% before K30's ceiling raised the derived fp32 ceiling 48.2 -> 53.8): "
    "as K29's H100 2048^3 row, two nearly full waves (0.97) priced near the ceiling",
    "matmul 64x4096x4096 fp32": "FP32 SIMT, 64 rows: 35.4 TFLOP/s measured, the model 29.8 "
    "(+19.7%; +33.0% before): its tiles / waves factor 0.58 is below what cuBLAS reaches",
}
JUDGED = [
    "matmul 4096x4096x4096 bf16", "matmul 8192x8192x8192 bf16", "matmul 8192x1024x4096 bf16",
    "matmul 16384x4096x1024 bf16", "matmul 2048x8192x1024 bf16", "matmul 8192x32768x1024 bf16",
    "matmul 1024x1024x1024 fp32", "matmul 2048x2048x2048 fp32", "matmul 4096x4096x4096 fp32",
    "matmul 8192x1024x4096 fp32", "matmul 16384x4096x1024 fp32", "matmul 2048x8192x1024 fp32",
    "matmul 64x4096x4096 fp32",
    "attention b8 h16 s1024 d64 causal fwd", "attention b8 h16 s1024 d64 causal fwd+bwd",
    "attention b2 h16 s4096 d128 causal fwd", "attention b2 h16 s4096 d128 causal fwd+bwd",
    "attention b16 h32 s512 d128 causal fwd", "attention b16 h32 s512 d128 causal fwd+bwd",
    "copy 2 GiB r+w bf16",
]


def test_micro_rows_two_reps_and_the_host_bound_ones():
    """22 micro rows (+ 3 fwd+bwd) in both reps; the rows measured within 1.5x of the run's
    fastest row are the Python issue time of the timed loop (29-38 us whatever their FLOPs),
    printed, not judged."""
    rows = _micro()
    assert len(rows) == 25 and set(JUDGED) | set(HOST_BOUND) == set(rows)
    assert sorted(r for r, v in rows.items() if v["host_bound"]) == sorted(HOST_BOUND)
    for v in rows.values():
        assert len(v["measured_us"]) == 2 and all(x > 0 for x in v["measured_us"])
        assert v["predicted_us"] > 0 and v["range_us"][0] <= v["predicted_us"] <= v["range_us"][1]


@pytest.mark.parametrize("row", [
    pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=_MISS[r])) if r in _MISS else r
    for r in JUDGED])
def test_micro_row_within_15_percent(row):
    r = _micro()[row]
    assert abs(r["error"]) < BAR, r


def test_h200_16bit_ceiling_is_k30_and_training_ceiling_unchanged():
    g = gpu_spec("h200")
    assert g.mamf("bf16") == (794.5, "published") and g.mamf("fp16")[0] == 794.5
    assert g.mamf("tf32")[0] == pytest.approx(794.5 * 412.04 / 749.89, abs=0.1)
    # the synthesizer's training rate stays the profile's gemm_max (below the MAMF)
    assert g.training_ceiling("bf16") == (pytest.approx(989.4 * 0.72), "fitted")


_TRACES: dict = {}


def _groups(config: str) -> list[dict]:
    if config not in _TRACES:
        from retime.analysis.cost_check import op_check
        from retime.collectors.ingest import read
        df = op_check(read([G1 / config / "rep1.pt.trace.json.gz"]), top=10**6)
        assert df.attrs["trace_gpu"] == "h200"
        op_class = bench_module("h200_kernels").op_class
        _TRACES[config] = [dict(r, cls=op_class(r["op"])) for r in df.to_dict("records")]
    return _TRACES[config]


def _median(config: str, classes: tuple[str, ...]) -> float:
    return statistics.median(abs(r["error"]) for r in _groups(config) if r["cls"] in classes)


@pytest.mark.parametrize("config", ["gpt-b8", "fp32-notf32"])
def test_trace_gemms_within_15_percent(config):
    """G1's GEMM calls on h200, median |error| over operator groups (held-out first score:
    gpt-b8 bf16 ~21% slow with the assumed 712.4 ceiling)."""
    assert _median(config, ("gemm",)) < BAR


def test_tf32_run_gemms_priced_in_the_math_their_kernels_show():
    """fp32-tf32 (allow_tf32): every FP32 GEMM call ran sm90_xmma_gemm_*tf32f32* kernels and
    is priced as tf32 (first score: as FP32 SIMT, +600..+830%); fp32-notf32's stay fp32."""
    tf = [r for r in _groups("fp32-tf32") if r["cls"] == "gemm"]
    no = [r for r in _groups("fp32-notf32") if r["cls"] == "gemm"]
    assert tf and no
    assert {r["dtype"] for r in tf} == {"tf32"} and {r["dtype"] for r in no} == {"fp32"}
    assert max(abs(r["error"]) for r in tf) < 0.6


def test_tf32_trace_gemms_within_15_percent():
    """fp32-tf32's GEMM groups: median 16.7% -> 9.6% once Hopper TF32 ``nt`` GEMMs (weight
    gradients) are priced at K57's 0.60 of the tile model (fitted on G2's fp32big-tf32, not on
    this trace; ``collectors/costs/tf32_layout.py``)."""
    assert _median("fp32-tf32", ("gemm",)) < BAR


def test_trace_attention_within_15_percent():
    """gpt-b8's cuDNN SDPA calls priced as the kernel family their names show (K50-K52; in
    sample: chosen after K47's rows were seen): forward +10.3%, backward +6.5% (at
    FlashAttention-2's rate +39.2% / +9.4%)."""
    assert _median("gpt-b8", ("attention",)) < BAR


def test_attention_calls_read_is_causal_and_the_raw_kernels_layout():
    """A recorded call's is_causal (its Concrete Inputs, as torch 2.11 writes them on the G1
    traces) halves its FLOPs and prices the causal mask; the raw memory-efficient / flash
    operators take (batch, seq, heads, head_dim)."""
    from retime.collectors.costs.ops import op_cost, price_op
    g = gpu_spec("h200")
    q = [8, 16, 1024, 64]
    dims, types = [q, q, q, []], ["c10::BFloat16"] * 3 + [""]
    full = op_cost("aten::_scaled_dot_product_cudnn_attention", dims, types,
                   ["", "", "", "", "True", "0.", "False", "False", ""])
    causal = op_cost("aten::_scaled_dot_product_cudnn_attention", dims, types,
                     ["", "", "", "", "True", "0.", "True", "False", ""])
    assert full[0] == 4.0 * 8 * 16 * 1024 * 1024 * 64 and causal[0] == full[0] / 2
    p = price_op(g, "aten::_scaled_dot_product_cudnn_attention", dims, types, causal)
    assert p.time_us == pytest.approx(
        K.attention(g, 8, 16, 1024, 64, causal=True).time_us)
    bwd = ["", "", "", "", "", "", "", "", "", "", "", "1024", "1024", "0.", "True", ""]
    b = op_cost("aten::_scaled_dot_product_cudnn_attention_backward", [q] * 5, types * 2, bwd)
    assert b[0] == 2.5 * full[0] / 2
    raw = [4, 512, 16, 64]  # fp32-notf32's _efficient_attention_forward: custom_mask_type 1
    conc = ["", "", "", "", "", "", "", "", "0.", "1", "True", "", "", ""]
    e = op_cost("aten::_efficient_attention_forward", [raw] * 3, ["float"] * 3, conc)
    assert e[0] == 4.0 * 4 * 16 * 512 * 512 * 64 / 2


def test_layer_norm_backward_reads_its_inputs_twice():
    """PyTorch's CUDA layer norm backward runs two kernels (the G1 traces show the input
    gradient's and GammaBetaBackwardCUDAKernelTemplate): dy and x read by each, dx written:
    5 tensors of traffic (was 3; gpt-b8's 117.7 us calls then priced 51.2 us)."""
    from retime.collectors.costs.ops import op_cost
    x = [8, 1024, 2048]
    c = op_cost("aten::native_layer_norm_backward", [x, x, [8, 1024, 1], [8, 1024, 1], [2048],
                                                     [2048], []], ["float"] * 6 + [""])
    assert c[1] == 4 * 5 * 8 * 1024 * 2048


@pytest.mark.xfail(strict=True, reason="memory-bound classes run slower than the 4150 GB/s "
                   "triad the model gives them (gpt-b8: elementwise 38%, norm 42% (53% before "
                   "the layer norm backward's second read), reductions 46%, softmax / loss 44% median, the model fast), while a 1 GiB copy reaches "
                   "4.17 TB/s: PyTorch's elementwise / reduction kernels at these sizes do not "
                   "stream at the copy's rate (not modelled; no source read for their rate)")
def test_trace_memory_bound_classes_within_25_percent():
    assert _median("gpt-b8", ("elementwise", "norm", "reduction", "softmax/loss",
                              "copy/fill")) < REST_BAR
