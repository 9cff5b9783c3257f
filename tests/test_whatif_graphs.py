"""hardware.cuda_graphs: captured regions lose their launch-only host work; analysis.host."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from conftest import KINETO, SHARED, ingest_cached

from retime.analysis import breakdown
from retime.analysis.host import host_ops, host_overhead, launch_latency
from retime.collectors import EdgeKind, LaneKind, OpKind, PolicyError, Trace
from retime.replay import replay, whatif

DLRM = KINETO / "dlrm-v100-8rank"
VGG = KINETO / "h100-vgg13" / "profiler_vgg13-iter41.json.gz"

H, K = LaneKind.CPU_THREAD, LaneKind.GPU_STREAM


def _tiny(sync: bool = False, compute: bool = False) -> Trace:
    """CPU: view(10) gap 6 launch(2) gap 4 [sync(30) gap 2 | add(20) gap 2] launch(2);
    GPU: kernel A (100, starts 2 ns after its launch) and kernel B (50, queued behind A)."""
    names = ["aten::view", "cudaLaunchKernel", "gemm", "cudaStreamSynchronize", "aten::add"]
    kinds = [OpKind.CPU_OP, OpKind.RUNTIME, OpKind.KERNEL]
    lanes_ = [0, 0, 1]
    nid = [0, 1, 2]
    start = [0, 16, 20]
    dur = [10, 2, 100]
    edges = [(0, 1, EdgeKind.HOST_ORDER, 6), (1, 2, EdgeKind.LAUNCH, 0)]
    t = 22
    if sync or compute:
        kinds.append(OpKind.RUNTIME if sync else OpKind.CPU_OP)
        lanes_.append(0)
        nid.append(3 if sync else 4)
        start.append(t)
        d = 98 if sync else 20  # a sync waits for A to end (at 120)
        dur.append(d)
        edges.append((1, 3, EdgeKind.HOST_ORDER, 4))
        if sync:
            edges.append((2, 4, EdgeKind.SYNC, 0))
        t += d + 2
        prev = 3
    else:
        prev = 1
    kinds += [OpKind.RUNTIME, OpKind.KERNEL]
    lanes_ += [0, 1]
    nid += [1, 2]
    li = len(start)
    start += [t, max(t + 2, 120)]
    dur += [2, 50]
    edges += [(prev, li, EdgeKind.HOST_ORDER, t - (start[prev] + dur[prev])),
              (li, li + 1, EdgeKind.LAUNCH, 0)]
    if sync:  # the sync edge points at the op after the blocking call
        edges = [e if e[:2] != (2, 4) else (2, li, EdgeKind.SYNC, 0) for e in edges]
    n = len(start)
    return Trace.build(
        ops={"rank": [0] * n, "lane": lanes_, "kind": kinds, "name_id": nid,
             "start_ns": start, "dur_ns": dur, "step": [0] * n, "phase": [0] * n},
        lanes={"lane": [0, 1], "rank": [0, 0], "lane_kind": [H, K]},
        edges={"src": [e[0] for e in edges], "dst": [e[1] for e in edges],
               "kind": [e[2] for e in edges], "lag_ns": [e[3] for e in edges]},
        strings=names)


def _graphs(t, mode="step", launch_ns=5, node_ns=1, **kw):
    return whatif(t, {"hardware.cuda_graphs": mode, "hardware.graph_launch_us": launch_ns / 1e3,
                      "hardware.graph_node_us": node_ns / 1e3, **kw})


def test_closed_form_one_graph():
    t = _tiny()
    assert replay(t).step_time_ns == 170
    w = _graphs(t)
    # the view becomes the 5 ns graph launch, the rest of the host work and its gaps vanish;
    # A waits min(2, 1) ns after it, B runs right behind A
    assert int(w.start_ns[2]) == 6 and int(w.end_ns[2]) == 106
    assert int(w.start_ns[4]) == 106
    assert w.step_time_ns == 156
    eff = w.meta["scenario"][0]["cuda_graphs_effect"]
    assert eff["graphs"] == 1 and eff["captured_launches"] == 2
    assert eff["host_ops_removed_ns"] == 10 + 2 + 2 and eff["host_gaps_removed_ns"] == 6 + 4


def test_sync_splits_the_graph_and_keeps_its_wait():
    t = _tiny(sync=True)
    base = replay(t)
    assert base.step_time_ns == int(base.end_ns[-1] - base.start_ns[0])
    w = _graphs(t)
    eff = w.meta["scenario"][0]["cuda_graphs_effect"]
    assert eff["graphs"] == 2 and eff["sync_breaks"] == 1
    # the sync still ends when A ends (6 + 100); the second graph launches after it
    assert int(w.end_ns[3]) == 106
    assert int(w.start_ns[4]) >= 106 and int(w.end_ns[4]) == int(w.start_ns[4]) + 5


def test_host_compute_keeps_its_time():
    t = _tiny(compute=True)
    w = _graphs(t)
    assert int(w.end_ns[3] - w.start_ns[3]) == 20  # aten::add on the CPU cannot be captured
    eff = w.meta["scenario"][0]["cuda_graphs_effect"]
    assert eff["host_compute_ops_kept"] == 1


def test_refusals_name_what_is_missing():
    bare = _tiny()
    runtime_only = Trace.build(ops=bare.ops[bare.ops["kind"] != OpKind.CPU_OP].assign(
        op_id=np.arange(4)).reset_index(drop=True), lanes=bare.lanes, strings=bare.strings,
        edges={"src": [0, 2, 0], "dst": [1, 3, 2], "kind": [EdgeKind.LAUNCH] * 2
               + [EdgeKind.HOST_ORDER], "lag_ns": [0, 0, 4]})
    with pytest.raises(PolicyError, match="only runtime calls"):
        _graphs(runtime_only)
    gloo = ingest_cached(KINETO / "cpu-gloo-rank34")
    with pytest.raises(PolicyError, match="no runtime launch calls"):
        whatif(gloo, {"hardware.cuda_graphs": "step"})
    nsys = ingest_cached(SHARED / "nsys" / "h100-2gpu-fastvideo.sqlite")
    with pytest.raises(PolicyError, match="forward/backward phases"):
        whatif(nsys, {"hardware.cuda_graphs": "forward_backward"})
    # nsys with NVTX operator ranges and no step marks: the whole trace is one region,
    # cut at its 33 cudaStreamSynchronize calls; every launch is captured
    w = whatif(nsys, {"hardware.cuda_graphs": "step"})
    eff = w.meta["scenario"][0]["cuda_graphs_effect"]
    assert eff["regions"] == "the whole trace (no step marks)"
    assert eff["captured_launches"] == eff["launches"] == len(launch_latency(nsys))
    assert eff["sync_breaks"] == int((nsys.names() == "cudaStreamSynchronize").sum())
    assert w.step_time_ns < replay(nsys).step_time_ns
    with pytest.raises(PolicyError, match="choose"):
        whatif(bare, {"hardware.cuda_graphs": "always"})
    with pytest.raises(PolicyError, match="need"):
        whatif(bare, {"hardware.graph_launch_us": 3})


def test_thread_links_keep_the_measured_replay():
    """The hand-off / join edges alone (nothing re-timed) reproduce every measured time."""
    import dataclasses

    from retime.replay.engine import simulate
    from retime.replay.graph import build_graph
    from retime.replay.policies.graphs import _thread_links, capture_plan
    t = ingest_cached(DLRM)
    g = build_graph(t)
    plan = capture_plan(t, "step")
    o = t.ops
    s = o["start_ns"].to_numpy()
    e = s + o["dur_ns"].to_numpy()
    dst_pos = np.repeat(np.arange(g.n_ops), np.diff(g.pred_ptr))
    pl = g.pred_lag_ns.copy()
    src, dst, lag, _ = _thread_links(t, g, plan, s, e, pl, g.perm[dst_pos],
                                     g.perm[g.pred_src])
    assert len(src) >= 8  # at least the backward hand-off on every rank
    delay = g.delay_ns.copy()
    delay[g.pos[dst]] = 0
    lag_meas = s[dst] - e[src]  # measured gaps: the edges hold the measured starts
    g2 = dataclasses.replace(g, pred_lag_ns=pl, delay_ns=delay).with_edges(src, dst, lag_meas)
    r = simulate(g2)
    assert np.array_equal(r.start_ns, s) and np.array_equal(r.end_ns, e)
    assert (lag <= lag_meas).all()


def test_dlrm_host_bound_time_goes_and_gpu_bound_vgg_barely_moves():
    t = ingest_cached(DLRM)
    base = replay(t).step_time_ns
    hb0 = int(breakdown(t)["host_bound_ns"].sum())
    fb = whatif(t, {"hardware.cuda_graphs": "forward_backward"})
    st = whatif(t, {"hardware.cuda_graphs": "step"})
    hb_fb = int(breakdown(fb)["host_bound_ns"].sum())
    hb_st = int(breakdown(st)["host_bound_ns"].sum())
    # capturing the whole step removes a superset of what forward+backward removes
    assert st.step_time_ns <= fb.step_time_ns < base
    assert hb_st < hb_fb < hb0
    # most of the host-bound time goes with the step captured; syncs, the batch copy and
    # CPU math stay (not all of it)
    assert 0.2 * hb0 < hb_st < 0.4 * hb0
    # a lower bound from physics: an infinitely fast host with every gap gone
    inf_host = whatif(t, {"hardware.host_speedup": 1e9}).step_time_ns
    assert st.step_time_ns >= inf_host
    # and every launch in the step windows outside the batch copy is captured
    eff = st.meta["scenario"][0]["cuda_graphs_effect"]
    lat = launch_latency(t)
    assert eff["launches"] == len(lat)
    assert eff["captured_launches"] == eff["captured_gpu_ops"] <= len(lat)
    assert (base - st.step_time_ns) / base > 0.3
    vgg = ingest_cached(VGG)
    vb = replay(vgg).step_time_ns
    # GPU-bound: queued kernels never waited for their launches; all a graph can take is
    # the time the device waited for the host (the breakdown's host-bound part) and the
    # stream gaps above the node cost
    from retime.replay.graph import build_graph
    g = build_graph(vgg)
    kd = g.measured_delay_ns[launch_latency(vgg)["op_id"].to_numpy()]
    bound = int(breakdown(vgg)["host_bound_ns"].sum()) + int(np.maximum(kd - 1000, 0).sum())
    for mode in ("step", "forward_backward"):
        v = whatif(vgg, {"hardware.cuda_graphs": mode}).step_time_ns
        assert 0 <= vb - v <= bound
        assert (vb - v) / vb < 0.015


def test_synthesized_run_saves_the_kernel_overhead():
    from retime.collectors.synth import synthesize
    t = synthesize("gpt3-125m", "a100-80gb", dict(tp=1, pp=1, dp=2, global_batch=8,
                                                   micro_batch=4))
    base = replay(t).step_time_ns
    w = whatif(t, {"hardware.cuda_graphs": "step", "hardware.graph_node_us": 1.0})
    eff = w.meta["scenario"][0]["cuda_graphs_effect"]
    assert eff["saved_per_kernel_ns"] == 2000.0  # a100 kernel_overhead_us 3 -> 1 us per node
    n_fb = whatif(t, {"hardware.cuda_graphs": "forward_backward"}).meta["scenario"][0][
        "cuda_graphs_effect"]["captured_kernels"]
    assert n_fb < eff["captured_kernels"]
    # one rank's kernels run back to back on its compute stream: the step shrinks by at
    # most the saved overhead of one rank's captured kernels, and by something
    per_rank = eff["captured_kernels"] / 2
    assert 0 < base - w.step_time_ns <= per_rank * 2000.0
    same = whatif(t, {"hardware.cuda_graphs": "step", "hardware.graph_node_us": 3.0})
    assert same.step_time_ns == base


def test_sweep_over_graph_modes():
    from retime.replay.sweep import grid_scenarios, sweep
    t = _tiny()
    df = sweep(t, grid_scenarios({"grid": {"hardware.cuda_graphs": [False, "step"],
                                           "hardware.graph_launch_us": [0.005, 0.05]}}),
               workers=1)
    assert df["error"].isna().all()
    off = df[df["hardware.cuda_graphs"] == "False"]["step_time_ns"]
    assert (off == 170).all()
    on = df[df["hardware.cuda_graphs"] == "step"].sort_values("hardware.graph_launch_us")
    # default node cost (1 us) exceeds A's measured 2 ns launch gap: A keeps it (157 = 156 + 1)
    assert on["step_time_ns"].tolist() == [157, 157 + 45]


# ---------------------------------------------------------------------------- analysis.host
def _raw(path):
    with gzip.open(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


def test_host_overhead_recounts_the_raw_dlrm_trace():
    t = ingest_cached(DLRM)
    h = host_overhead(t)
    assert len(h) == 8
    f = sorted(DLRM.glob("worker0_*.json.gz"))[0]
    ev = _raw(f)
    step = next(e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#"))
    gpu_corr = {e["args"]["correlation"] for e in ev
                if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}
    rt = [e for e in ev if e.get("cat") == "cuda_runtime"
          and e["args"].get("correlation") in gpu_corr]
    r0 = h[h["rank"] == 0].iloc[0]
    assert r0["launches"] == len(rt)
    assert r0["launch_call_ns"] == sum(int(e["dur"] * 1000) for e in rt)
    assert all(step["ts"] <= e["ts"] < step["ts"] + step["dur"] for e in rt)
    # launch-to-start latency recount: median over the rank's launched GPU ops
    st = {e["args"]["correlation"]: e["ts"] for e in ev
          if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}
    lat = sorted((st[e["args"]["correlation"]] - e["ts"]) * 1000 for e in rt)
    assert r0["latency_p50_ns"] == pytest.approx(np.median(lat))
    # DLRM waits on its host; VGG13 on the H100 keeps a queue (launches far ahead)
    assert (h["launch_bound_frac"] > 0.6).all()
    assert (h["host_bound_frac"] > 0.3).all()
    v = host_overhead(ingest_cached(VGG)).iloc[0]
    assert v["launch_bound_frac"] < 0.01 and v["latency_p50_ns"] > 1e6


def test_host_ops_are_outermost_operators():
    t = ingest_cached(DLRM)
    ho = host_ops(t, top=5)
    assert ho["total_ns"].is_monotonic_decreasing
    # recount of the costliest one on rank 0: outermost cpu_op events of that name
    name = ho.iloc[0]["name"]
    ev = [e for e in _raw(sorted(DLRM.glob("worker0_*.json.gz"))[0]) if e.get("cat") == "cpu_op"]
    mine = [e for e in ev if e["name"] == name]
    outer = [e for e in mine if not any(
        o is not e and o["tid"] == e["tid"] and "::" in o["name"]
        and not o["name"].startswith("autograd::engine") and o["ts"] <= e["ts"]
        and e["ts"] + e["dur"] <= o["ts"] + o["dur"] for o in ev)]
    assert ho.iloc[0]["count"] == 8 * len(outer)
