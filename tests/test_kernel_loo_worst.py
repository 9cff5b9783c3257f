"""bench/kernel_loo.py --worst: the call shapes of largest median |error|, with the model's
price and the median measured time (errors derived here from the cost layer's own price)."""

from __future__ import annotations

import pytest
from conftest import bench_module

from retime.collectors.costs.gpus import gpu_spec
from retime.collectors.costs.kernels import FITTED_CURVES
from retime.collectors.costs.ops import op_cost, price_op


def test_worst_ranks_call_shapes_by_median_error():
    loo = bench_module("kernel_loo")
    g = gpu_spec("h100-sxm")
    calls = []
    for m, scale in ((512, 2.0), (1024, 1.1), (2048, 0.8)):
        dims, types = [[m, 1024], [1024, 1024]], ["float", "float"]
        w = op_cost("aten::mm", dims, types)
        p = price_op(g, "aten::mm", dims, types, w, FITTED_CURVES, kernels=["sgemm"]).time_us
        # three instances: the median measured time is p * scale, no interference
        meas = [p * scale * f for f in (0.9, 1.0, 1.1)]
        calls.append(("gemm", "aten::mm", dims, types, w, ("sgemm",), meas, [0.0] * 3,
                      [0.0] * 3))
    rows = loo.worst("h100-sxm", calls, FITTED_CURVES, "gemm", 2)
    assert [r["dims"][0][0] for r in rows] == [512, 2048]  # |-50%| then |+25%|
    assert rows[0]["error"] == pytest.approx(1 / 2.0 - 1)
    assert rows[1]["error"] == pytest.approx(1 / 0.8 - 1)
    assert rows[0]["calls"] == 3 and rows[0]["model_us"] * 2 == pytest.approx(
        rows[0]["measured_us"])
    assert loo.worst("h100-sxm", calls, FITTED_CURVES, "conv", 2) == []
    assert loo.main(["--worst", "-1"]) == 2
