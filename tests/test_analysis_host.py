"""Launch latency: hand-built launches against values worked out by hand."""

from __future__ import annotations

from retime.analysis.host import launch_latency
from retime.collectors.enums import EdgeKind, LaneKind, OpKind
from retime.collectors.trace import Trace


def _trace(with_launches: bool) -> Trace:
    # a CPU thread (lane 0) launches two kernels on one stream (lane 1) of device 0:
    # launch A 0..10 -> kernel A 15..115, launch B 20..30 -> kernel B 115..165
    edges = ({"src": [0, 1], "dst": [2, 3], "kind": [int(EdgeKind.LAUNCH)] * 2,
              "lag_ns": [5, 85]} if with_launches else None)
    return Trace.build(
        ops={"rank": [0, 0, 0, 0], "lane": [0, 0, 1, 1],
             "kind": [int(OpKind.RUNTIME)] * 2 + [int(OpKind.KERNEL)] * 2,
             "name_id": [0, 0, 1, 1], "start_ns": [0, 20, 15, 115],
             "dur_ns": [10, 10, 100, 50]},
        lanes={"lane": [0, 1], "rank": [0, 0], "device": [0, 0],
               "lane_kind": [int(LaneKind.CPU_THREAD), int(LaneKind.GPU_STREAM)]},
        strings=["cudaLaunchKernel", "gemm"], edges=edges)


def test_launch_latency_and_launch_bound_by_hand():
    ll = launch_latency(_trace(True)).set_index("op_id")
    assert ll["launch_op"].tolist() == [0, 1]
    assert ll["latency_ns"].tolist() == [15, 95]  # start - launch start
    assert ll["queue_ns"].tolist() == [5, 85]  # start - launch end
    # kernel A: nothing ran before it on the device; kernel B: its launch ended (30) while
    # kernel A still ran (until 115), so the device, not the launch, held it
    assert ll["launch_bound"].tolist() == [True, False]


def test_no_launches_gives_no_rows():
    ll = launch_latency(_trace(False))
    assert len(ll) == 0
    assert "launch_bound" in ll.columns
