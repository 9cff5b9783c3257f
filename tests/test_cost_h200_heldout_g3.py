"""Batch G3's held-out H200 kernel rows against the cost layer (issues 27, 32):
``traces/gpu_pairs/g3/micro.json`` (shapes defined before capture, captured after FREEZE-11)
priced through ``retime cost op --gpu h200`` by ``bench/h200_micro_g3.py``.

Scored once on the FREEZE-11 model (``bench/heldout/h200_micro_g3.md``). Rows within the 15%
bar pass; misses are strict xfails with the reason read from the pricing line the CLI prints
(``assumed: efficiency ...``); the model is not changed here."""

from __future__ import annotations

import pytest
from conftest import bench_module

BAR = 0.15  # per row, as K29 (tests/test_cost_kernels.py)
_ROWS: list = []


def _micro() -> dict[str, dict]:
    if not _ROWS:
        _ROWS.extend(bench_module("h200_micro_g3").score())
    return {r["row"]: r for r in _ROWS}


HOST_BOUND = ["matmul 512x512x8192 bf16"]
NOT_PRICED = ["layer_norm 16384x2048 fp32 fwd+bwd"]

_MISS = {
    "matmul 3072x3072x3072 bf16": "754.7 TFLOP/s measured (0.95 of K30's MAMF 794.5); the "
    "model 654.0: k-depth 0.94 x tiles/waves 0.90 both charge a "
    "shape cuBLAS runs near its ceiling (+15.4%)",
    "matmul 3072x3072x3072 fp32": "FP32 SIMT 3072^3: 40.1 TFLOP/s measured, the model 48.1 "
    "(0.90 tiles/waves x the derived 53.8 ceiling; -16.7%): as G1/G2's 1024^3 / 2048^3 FP32 "
    "rows, the tiles / waves factor is above what cuBLAS's SIMT kernels reach",
    "attention b8 h32 s1024 d64 bf16 fwd+bwd": "head dim 64: priced from K50's H100 bars x "
    "the MAMF ratio (374.1 TFLOP/s fwd x K14's 0.87 backward); the H200 runs it faster "
    "(+17.9%; fwd +13.3%); likely (not traced further): the d64 kernels lean on memory "
    "more and H200's HBM is 1.43x H100's, which a MAMF-ratio scaling does not carry",
    "attention b2 h32 s4096 d64 causal bf16 fwd+bwd": "head dim 64, as the b8 s1024 d64 row "
    "(+19.9%; fwd +14.0%)",
    "attention b16 h16 s256 d128 causal bf16 fwd": "seq 256: 27.0 us measured, the model "
    "20.6 (-23.5%) at K50's 237 TFLOP/s bar; likely the kernel's fixed cost (prologue, "
    "causal tiles) at this size, which the bar does not carry (not traced further)",
    "attention b16 h16 s256 d128 causal bf16 fwd+bwd": "seq 256 backward: 166.8 us measured, "
    "the model 95.5 (-42.7%): K14's 0.87 backward ratio and K52's 20.3 us of extra passes "
    "are long-sequence figures; short sequences' backward is relatively slower",
    "attention b2 h16 s1536 d128 causal bf16 fwd": "seq 1536 (not a K50 bar): the model "
    "interpolates 454.7 TFLOP/s between the 1024 and 2048 bars; measured 363 (-16.3%)",
    "attention b2 h16 s1536 d128 causal bf16 fwd+bwd": "seq 1536, as its fwd row (-22.2%)",
    "gelu 16384x8192 bf16": "measured 3.12 TB/s (read + write of 2 x 268 MB); `cost op "
    "elementwise` prices 1 FLOP per element at the 4131 GB/s streaming rate (-24.6%): "
    "GELU's erf in FP32 per element keeps it below the HBM rate, and the elementwise kind "
    "has no per-element FLOP count to say so",
}
JUDGED = sorted(set(_MISS) | {
    "matmul 4096x14336x4096 bf16", "matmul 1024x8192x28672 bf16",
    "matmul 16384x16384x2048 bf16", "matmul 128x8192x8192 bf16",
    "matmul 4096x1024x4096 fp32", "matmul 512x4096x2048 fp32",
    "attention b4 h16 s2048 d128 causal bf16 fwd", "attention b4 h16 s2048 d128 causal bf16 fwd+bwd",
    "attention b1 h16 s8192 d128 causal bf16 fwd",
    "attention b1 h16 s8192 d128 causal bf16 fwd+bwd",
    "attention b8 h32 s1024 d64 bf16 fwd", "attention b2 h32 s4096 d64 causal bf16 fwd",
    "attention b4 h16 s2048 d96 causal bf16 fwd", "attention b4 h16 s2048 d96 causal bf16 fwd+bwd",
    "attention b2 h32 kv8 s4096 d128 causal bf16 fwd",
    "attention b2 h32 kv8 s4096 d128 causal bf16 fwd+bwd",
    "attention b1 h16 s16384 d128 bf16 fwd", "attention b1 h16 s16384 d128 bf16 fwd+bwd",
    "attention b8 h16 s1024 d128 causal fp16 fwd",
    "attention b8 h16 s1024 d128 causal fp16 fwd+bwd",
    "add 8192x8192 fp32", "layer_norm 16384x2048 fp32 fwd",
    "mul_scalar_inplace 65536x4096 bf16"})


def test_g3_rows_all_reported():
    """24 micro rows, 10 of them attention (fwd and fwd+bwd) and layer_norm (fwd and
    fwd+bwd): 34 lines; one host-bound (14.5 us, the run's issue floor), one with no
    ``cost op`` kind (reported, not dropped), the other 32 judged."""
    rows = _micro()
    assert len(rows) == 34 and set(JUDGED) | set(HOST_BOUND) | set(NOT_PRICED) == set(rows)
    assert len(JUDGED) == 32
    assert sorted(r for r, v in rows.items() if v["host_bound"]) == HOST_BOUND
    assert sorted(r for r, v in rows.items() if not v["priced"]) == NOT_PRICED
    for name in JUDGED + HOST_BOUND:
        v = rows[name]
        assert v["predicted_us"] > 0 and v["range_us"][0] <= v["predicted_us"] <= v["range_us"][1]
        assert v["cmd"].startswith("retime cost op ") and v["cmd"].endswith("--gpu h200")


def test_gqa_and_fp16_rows_priced_with_their_flags():
    rows = _micro()
    assert "--kv-heads 8" in rows["attention b2 h32 kv8 s4096 d128 causal bf16 fwd"]["cmd"]
    assert "--dtype fp16" in rows["attention b8 h16 s1024 d128 causal fp16 fwd"]["cmd"]
    assert "--causal" not in rows["attention b1 h16 s16384 d128 bf16 fwd"]["cmd"]
    assert "--reads 2 --writes 1" in rows["add 8192x8192 fp32"]["cmd"]


@pytest.mark.parametrize("row", [
    pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=_MISS[r])) if r in _MISS else r
    for r in JUDGED])
def test_g3_micro_row_within_15_percent(row):
    r = _micro()[row]
    assert abs(r["error"]) < BAR, r
