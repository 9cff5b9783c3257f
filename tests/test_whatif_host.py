"""hardware.host_speedup: a faster CPU shrinks host ops, the gaps between them and their
unexplained delays; GPU work is unchanged."""

from __future__ import annotations

import pytest
from conftest import ingest_cached

from retime.collectors import EdgeKind, LaneKind, OpKind, PolicyError, Trace
from retime.replay import replay, whatif


def _host_then_gpu() -> Trace:
    # CPU: op(10) gap 6 op(10) gap 4 launch(2) ; GPU: kernel(100) launched by the last call
    return Trace.build(
        ops={"rank": [0, 0, 0, 0], "lane": [0, 0, 0, 1],
             "kind": [OpKind.CPU_OP, OpKind.CPU_OP, OpKind.RUNTIME, OpKind.KERNEL],
             "name_id": [0, 0, 1, 2], "start_ns": [0, 16, 30, 32], "dur_ns": [10, 10, 2, 100]},
        lanes={"lane": [0, 1], "rank": [0, 0], "lane_kind": [LaneKind.CPU_THREAD, LaneKind.GPU_STREAM]},
        edges={"src": [0, 1, 2], "dst": [1, 2, 3],
               "kind": [EdgeKind.HOST_ORDER, EdgeKind.HOST_ORDER, EdgeKind.LAUNCH],
               "lag_ns": [6, 4, 0]},
        strings=["aten::add", "cudaLaunchKernel", "gemm"])


def test_host_speedup_scales_host_time_exactly():
    t = _host_then_gpu()
    assert replay(t).step_time_ns == 132
    w = whatif(t, {"hardware.host_speedup": 2.0})
    # host part 0..32 halves to 16, the kernel (100 ns) is unchanged
    assert w.step_time_ns == 116
    assert int(w.end_ns[3] - w.start_ns[3]) == 100
    assert whatif(t, {"hardware.host_speedup": 1.0}).step_time_ns == 132


def test_host_speedup_on_a_host_bound_real_trace():
    t = ingest_cached(ingest_cached.__globals__["KINETO"] / "dlrm-v100-8rank")
    base = replay(t).step_time_ns
    faster = whatif(t, {"hardware.host_speedup": 2.0}).step_time_ns
    slower = whatif(t, {"hardware.host_speedup": 0.5}).step_time_ns
    # DLRM is host-bound (about half the step): a 2x CPU removes a large part, never all of it
    assert 0.5 * base < faster < 0.9 * base
    assert slower > 1.5 * base


def test_host_speedup_rejects_nonsense():
    with pytest.raises(PolicyError, match="host_speedup"):
        whatif(_host_then_gpu(), {"hardware.host_speedup": 0})


def test_graph_cache_reused_and_invalidated_by_in_place_edits():
    from retime.replay.policies.base import cached_graph

    t = _host_then_gpu()
    g1 = cached_graph(t)
    assert cached_graph(t) is g1  # a sweep's what-ifs share one graph
    assert cached_graph(t, ideal=True) is not g1
    base = whatif(t, {"hardware.host_speedup": 1.0}).step_time_ns
    t.ops.loc[3, "dur_ns"] = 200  # edit the table in place: the graph must be rebuilt
    assert cached_graph(t) is not g1
    assert whatif(t, {"hardware.host_speedup": 1.0}).step_time_ns == base + 100
