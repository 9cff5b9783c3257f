"""FP32 / TF32 what-if on shaped GEMMs (issue 27, pair g2-tf32): Hopper TF32 GEMMs whose
kernels say cuBLAS ``nt`` are priced at K57's 0.60 of the tile model's rate
(:mod:`collectors.costs.tf32_layout`), and GEMM kernels without a recorded shape move at the
cost-layer ratio of their shaped namesakes (:func:`kernel_cost.twin_ratios`), not at the
datasheet ratio of their math mode. The real traces: ``traces/gpu_pairs/g2/fp32big-*``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import ingest_cached

from retime.collectors.costs.gpus import gpu_spec
from retime.collectors.costs.ops import op_cost, price_op
from retime.collectors.costs.tf32_layout import NT_TF32_RATE, gemm_layout
from retime.collectors.enums import OpKind
from retime.replay import whatif
from retime.replay.policies.kernel_cost import gpu_ratio, twin_ratios

ROOT = Path(__file__).resolve().parents[1]
G2 = ROOT / "traces" / "gpu_pairs" / "g2"

NT = "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x256x32_warpgroupsize2x1x1_execute"
TN = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute"


def test_layout_read_from_kernel_names():
    assert gemm_layout([NT]) == "nt" and gemm_layout([TN]) == "tn"
    assert gemm_layout(["void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>"
                        "(cutlass_80_simt_sgemm_128x256_8x4_nt_align1::Params)"]) == "nt"
    assert gemm_layout(["ampere_sgemm_128x64_nn"]) == "nn"
    assert gemm_layout([NT, TN]) is None  # they disagree
    assert gemm_layout(["void at::native::elementwise_kernel<128, 2>(int)"]) is None
    assert gemm_layout(None) is None


def _price(gpu: str, dims: list, dtype: str, kernels: list[str]) -> float:
    types = ["float", "float"]
    w = op_cost("aten::mm", dims, types, ["", ""])
    return price_op(gpu_spec(gpu), "aten::mm", dims, types, (w[0], w[1], dtype),
                    kernels=kernels).time_us


def test_nt_tf32_gemm_on_hopper_runs_at_the_fitted_fraction():
    big = [[2048, 8192], [8192, 8192]]  # a weight gradient of the fp32big model
    nt, tn = _price("h200", big, "tf32", [NT]), _price("h200", big, "tf32", [TN])
    # the tile math is 1/0.60 as long; the launch floor (2.5 us of ~1.1 ms) does not move
    assert nt / tn == pytest.approx(1 / NT_TF32_RATE, rel=0.01)
    # FP32 on the CUDA cores and other architectures are not moved
    fp = "sm80_xmma_gemm_f32f32_f32f32_f32_nt_n_tilesize256x128x8_stage3"
    tp = fp.replace("_nt_", "_tn_")
    assert _price("h200", big, "fp32", [fp]) == pytest.approx(_price("h200", big, "fp32", [tp]))
    assert _price("a100-80gb", big, "tf32", [NT]) == pytest.approx(
        _price("a100-80gb", big, "tf32", [TN]))
    # below the tf32 roofline ridge (a 16-row GEMM: memory-bound) the transpose overlaps
    skinny = [[16, 4096], [4096, 4096]]
    assert _price("h200", skinny, "tf32", [NT]) == pytest.approx(
        _price("h200", skinny, "tf32", [TN]))


@pytest.fixture(scope="module")
def tf32_trace():
    return ingest_cached(G2 / "fp32big-tf32" / "rep1.pt.trace.json.gz")


def test_measured_nt_rate_is_what_the_model_prices(tf32_trace):
    # the fitted factor reproduces the trace it came from (in-sample): the nt TF32 GEMMs'
    # model time within 5% of measured, over all their calls
    from retime.replay.policies.kernel_cost import shaped_kernels
    sk = shaped_kernels(tf32_trace)
    g = gpu_spec("h200")
    dur = tf32_trace.ops["dur_ns"].to_numpy()
    start = np.concatenate([[0], np.cumsum(sk.launches)])
    meas = model = 0.0
    for c in range(len(sk.names)):
        if sk.names[c] != "aten::mm" or gemm_layout(sk.kernels[c]) != "nt":
            continue
        w = sk.work[c]
        model += price_op(g, sk.names[c], sk.dims[c], sk.types[c], (w[0], w[1], "tf32"),
                          kernels=sk.kernels[c]).time_us * 1e3
        meas += dur[sk.op_ids[start[c]:start[c + 1]]].sum()
    assert meas > 40e6  # 51 calls, ~53 ms
    assert model / meas == pytest.approx(1.0, abs=0.05)


def test_unshaped_gemms_move_with_their_shaped_namesakes(tf32_trace):
    t = tf32_trace
    kr = gpu_ratio(t, "h200", "h200", False)
    kind = t.ops["kind"].to_numpy()
    nid = t.ops["name_id"].to_numpy()
    names = t.strings
    gemm = np.array(["tf32f32" in str(names[i]) for i in nid]) & (kind == OpKind.KERNEL)
    cand = gemm.copy()
    cand[kr.op_ids] = False
    assert cand.sum() >= 40  # the step queued before the profiler recorded its operators
    ids, r = twin_ratios(t, kr, cand)
    assert len(ids) == cand.sum()
    # each at its namesakes' duration-weighted mean
    dur = t.ops["dur_ns"].to_numpy().astype(float)
    n0 = nid[ids[0]]
    same = nid[kr.op_ids] == n0
    want = (dur[kr.op_ids][same] * kr.ratio[same]).sum() / dur[kr.op_ids][same].sum()
    assert r[0] == pytest.approx(want)
    # TF32 -> FP32: the nt ones (0.60 of the model in TF32) slow by less than the datasheet
    # 7.38x, the others by about the ceilings' ratio
    assert r.min() < 5.5 and r.max() < 8.5
    d = whatif(t, {"hardware.gpu": "h200", "hardware.allow_tf32": False})
    got = d.dur_ns[ids] / dur[ids]
    assert np.allclose(got[dur[ids] > 1e6], r[dur[ids] > 1e6], rtol=0.01)
    lines = d.meta["whatif"]["assumed"]
    assert any("shaped namesakes' cost-layer ratio" in x for x in lines)
