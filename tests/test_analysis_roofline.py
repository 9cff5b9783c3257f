"""analysis.roofline: FLOPs and bytes from recorded shapes against the hardware's peaks."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import KINETO, ROOT, ingest_cached
from matplotlib.figure import Figure

from retime.analysis.drilldown_plots import plot_roofline
from retime.analysis.roofline import op_cost, roofline
from retime.collectors import OpKind, RetimeError

VGG = KINETO / "h100-vgg13" / "profiler_vgg13-iter41.json.gz"


def test_op_cost_closed_forms():
    f, b, dt = op_cost("aten::mm", [[4, 8], [8, 16]], ["float", "float"])
    assert (f, b, dt) == (2 * 4 * 8 * 16, 4 * (32 + 128 + 64), "fp32")
    f, b, dt = op_cost("aten::addmm", [[16], [4, 8], [8, 16], [], []],
                       ["c10::BFloat16"] * 3 + ["Scalar"] * 2)
    assert (f, b, dt) == (2 * 4 * 8 * 16, 2 * (32 + 128 + 64 + 16), "bf16")
    f, _, _ = op_cost("aten::linear", [[2, 3, 8], [16, 8], [16]], ["float"] * 3)
    assert f == 2 * 6 * 8 * 16
    f, _, _ = op_cost("aten::bmm", [[5, 4, 8], [5, 8, 16]], ["float"] * 2)
    assert f == 2 * 5 * 4 * 8 * 16
    # 3x3 convolution, stride 2, padding 1: 8x8 -> 4x4 outputs
    conc = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    f, b, dt = op_cost("aten::convolution", [[2, 3, 8, 8], [4, 3, 3, 3], [4]] + [[]] * 6,
                       ["float"] * 3 + ["ScalarList"] * 6, conc)
    assert f == 2 * 2 * 4 * (3 * 9) * 16 and dt == "tf32"
    assert b == 4 * (2 * 3 * 64 + 4 * 27 + 2 * 4 * 16)
    # cuDNN's argument order: (input, weight, padding, stride, dilation, groups, ...)
    cud = ["", "", "[1, 1]", "[2, 2]", "[1, 1]", "1", "False", "False", "True"]
    assert op_cost("aten::cudnn_convolution", [[2, 3, 8, 8], [4, 3, 3, 3]] + [[]] * 7,
                   ["float"] * 2 + ["ScalarList"] * 7, cud)[0] == f
    # backward: input and weight gradients (mask [True, True, False]) cost one forward each
    bw = op_cost("aten::convolution_backward", [[2, 4, 4, 4], [2, 3, 8, 8], [4, 3, 3, 3]]
                 + [[]] * 8, ["float"] * 3 + ["ScalarList"] * 8,
                 ["", "", "", "[0]", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1",
                  "[True, True, False]"])
    assert bw[0] == 2 * f
    f, _, _ = op_cost("aten::_scaled_dot_product_flash_attention",
                      [[2, 4, 128, 64], [2, 4, 128, 64], [2, 4, 128, 64]], ["c10::Half"] * 3)
    assert f == 4 * 2 * 4 * 128 * 128 * 64
    f, b, _ = op_cost("aten::add_", [[10, 20], [1, 20]], ["float", "float"])
    assert (f, b) == (200, 4 * (200 + 20 + 200))
    assert op_cost("aten::embedding_bag", [[10, 4]], ["float"]) is None


def test_vgg13_forward_flops_and_the_roof():
    t = ingest_cached(VGG)
    r = roofline(t)
    assert r.attrs["peaks"]["name"] == "h100-sxm"  # from the trace's device name
    fwd = r[r["op"].isin(["aten::cudnn_convolution", "aten::addmm"])]
    # VGG-13 at 224x224: 11.31 G multiply-adds per image (torchvision), 22.6 GFLOP
    assert fwd["flops"].sum() / 512 == pytest.approx(22.62e9, rel=0.002)
    assert fwd["count"].sum() == 10 + 3  # ten convolutions and three linear layers
    # nothing beats the roof once its data cannot live in the 50 MB L2 cache
    big = r[r["bytes"] / r["count"] > 64 * 2**20]
    assert len(big) > 20 and (big["device_ns"] >= big["roof_ns"]).all()
    assert (r["gap_ns"] >= 0).all() and r["gap_ns"].is_monotonic_decreasing
    o = t.ops
    kern = o[o["kind"].isin([OpKind.KERNEL, OpKind.MEMSET])]["dur_ns"].sum()
    assert r.attrs["device_ns"] == kern
    assert 0.8 * kern < r["device_ns"].sum() <= kern
    fig = plot_roofline(r, {"name": "h100 tf32", "peak_tflops": 494.7, "hbm_tbps": 3.35})
    assert isinstance(fig, Figure)


def _renamed_gpu(meta: dict) -> dict:
    """``meta`` with its GPU renamed to one no built-in profile knows."""
    return json.loads(json.dumps(meta).replace("V100", "Z100"))


def test_unknown_gpu_needs_hardware_and_synth_uses_its_kernels():
    t = ingest_cached(KINETO / "dlrm-v100-8rank")
    assert roofline(t, top=1).attrs["peaks"]["name"] == "v100-sxm2"  # a built-in profile
    unknown = copy.copy(t)
    unknown.meta = _renamed_gpu(t.meta)
    with pytest.raises(RetimeError, match="Z100.*--hardware"):
        roofline(unknown)
    r = roofline(t, hardware="a100-80gb")
    assert r.attrs["peaks"]["name"] == "a100-80gb" and (r["device_ns"] > 0).all()
    from retime.collectors.synth import synthesize
    s = synthesize("gpt3-125m", "h100-sxm", dict(tp=1, pp=1, dp=1, global_batch=2,
                                                  micro_batch=2))
    rs = roofline(s)
    o = s.ops
    k = o[o["kind"] == OpKind.KERNEL]
    assert rs["flops"].sum() == pytest.approx(np.nansum(k["flops"]))
    qkv = rs[rs["op"] == "attn.qkv.fwd"].iloc[0]
    assert qkv["bound"] == "compute" and qkv["dtype"] == "bf16"
    # the synthesizer's roofline cost model never beats its own roof
    assert (rs["device_ns"] >= rs["roof_ns"] * (1 - 1e-9)).all()


def test_cli_roofline(tmp_path):
    t = ingest_cached(KINETO / "dlrm-v100-8rank")
    d = tmp_path / "dlrm.retime"
    t.save(d)
    (d / "meta.json").write_text(json.dumps(_renamed_gpu(json.loads(
        (d / "meta.json").read_text()))))
    cmd = [sys.executable, "-m", "retime", "analyze", str(d), "--by", "roofline", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    err = json.loads(r.stdout)
    assert r.returncode == 2 and "--hardware" in err["error"] + err.get("hint", "")
    r = subprocess.run(cmd + ["--hardware", "a100-80gb", "--top", "3"], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    js = json.loads(r.stdout)
    assert len(js["top"]) == 3 and js["peaks"]["name"] == "a100-80gb"
