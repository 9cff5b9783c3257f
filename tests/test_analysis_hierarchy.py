"""analysis.hierarchy: the step/phase/module/operator/kernel tree adds up exactly."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import KINETO, ROOT, SHARED, ingest_cached
from matplotlib.figure import Figure

from retime.analysis.drilldown_plots import plot_hierarchy
from retime.analysis.hierarchy import hierarchy
from retime.collectors import OpKind

DLRM = KINETO / "dlrm-v100-8rank"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _check_sums(h):
    """Every node's inclusive time is its own plus its children's; exclusives add up."""
    for col in ("device", "host"):
        incl, excl = h[f"{col}_incl_ns"].to_numpy(), h[f"{col}_excl_ns"].to_numpy()
        kids = np.zeros(len(h), np.int64)
        pos = {n: i for i, n in enumerate(h["node_id"])}
        for p, v in zip(h["parent_id"], incl, strict=True):
            if p >= 0:
                kids[pos[p]] += v
        assert np.array_equal(incl, excl + kids)
        assert excl.sum() == incl[0]
        assert (excl >= 0).all()


def test_dlrm_tree_adds_up_to_the_raw_kernel_totals():
    t = ingest_cached(DLRM)
    h = hierarchy(t)
    _check_sums(h)
    raw_dev, raw_fwd, raw_launch = 0, 0, 0
    for f in sorted(DLRM.glob("*.json.gz")):
        with gzip.open(f, "rt") as fh:
            ev = json.load(fh)["traceEvents"]
        gpu = {e["args"]["correlation"]: e for e in ev if e.get("cat") in GPU_CATS}
        raw_dev += sum(int(round(e["dur"] * 1000)) for e in gpu.values())
        fwd = [e for e in ev if e.get("name") == "## forward ##"]
        rt = [e for e in ev if e.get("cat") == "cuda_runtime"
              and e["args"].get("correlation") in gpu]
        raw_launch += len(rt)
        for r in rt:  # kernels launched inside the forward annotation of the same thread
            if any(a["tid"] == r["tid"] and a["ts"] <= r["ts"] < a["ts"] + a["dur"] for a in fwd):
                raw_fwd += int(round(gpu[r["args"]["correlation"]]["dur"] * 1000))
    root = h.iloc[0]
    assert root["device_incl_ns"] == raw_dev
    assert root["launches"] == raw_launch
    node = h[h["path"] == "step 10 / forward / ## forward ##"].iloc[0]
    assert node["device_incl_ns"] == raw_fwd
    assert node["count"] == 8  # one forward annotation per rank
    # levels: operators below annotations, kernels as leaves carrying all device time
    kern = h[h["level"] == "kernel"]
    assert kern["device_excl_ns"].sum() == raw_dev
    assert set(h["level"].astype(str)) >= {"root", "step", "phase", "annotation", "operator",
                                           "kernel"}


def test_rank_filter_and_other_formats():
    t = ingest_cached(DLRM)
    o = t.ops
    one = hierarchy(t, ranks=[3])
    _check_sums(one)
    dev = o[(o["rank"] == 3) & o["kind"].isin([OpKind.KERNEL, OpKind.MEMCPY, OpKind.MEMSET,
                                                OpKind.COLLECTIVE])]["dur_ns"].sum()
    assert one.iloc[0]["device_incl_ns"] == dev
    nsys = ingest_cached(SHARED / "nsys" / "h100-2gpu-fastvideo.sqlite")
    hn = hierarchy(nsys)
    _check_sums(hn)
    no = nsys.ops
    assert hn.iloc[0]["device_incl_ns"] == no[no["kind"].isin(
        [OpKind.KERNEL, OpKind.MEMCPY, OpKind.MEMSET, OpKind.COLLECTIVE])]["dur_ns"].sum()
    assert (hn["name"] == "aten::linear").any()  # NVTX operator ranges


def test_synthesized_run_uses_layers_and_module_names():
    from retime.collectors.synth import synthesize
    t = synthesize("gpt3-125m", "a100-80gb", dict(tp=2, pp=1, dp=1, global_batch=2,
                                                   micro_batch=1))
    h = hierarchy(t)
    _check_sums(h)
    o = t.ops
    dev = o[o["kind"].isin([OpKind.KERNEL, OpKind.COLLECTIVE, OpKind.P2P])]["dur_ns"].sum()
    assert h.iloc[0]["device_incl_ns"] == dev
    fwd_layers = h[(h["level"] == "layer") & h["path"].str.contains("/ forward /")]
    # GPT-3 125M: 12 transformer layers, and synth numbers the head as layer 12
    assert len(fwd_layers) == 13
    assert (h["path"] == "step 0 / forward / layer 12 / head").any()
    mods = set(h[h["level"] == "module"]["name"])
    assert {"attn", "mlp"} <= mods
    # one layer's attention in the forward: its kernels recounted from the ops table
    n = h[h["path"] == "step 0 / forward / layer 0 / attn"].iloc[0]
    names = t.names()
    m = (o["layer"] == 0) & (o["phase"] == 0) & np.asarray(
        [str(x).startswith("attn.") for x in names])
    assert n["device_incl_ns"] == o[m]["dur_ns"].sum()


def test_icicle_and_cli():
    t = ingest_cached(DLRM)
    fig = plot_hierarchy(hierarchy(t))
    assert isinstance(fig, Figure) and len(fig.axes[0].collections) == 1
    assert len(fig.axes[0].collections[0].get_paths()) > 20
    fig2 = plot_hierarchy(hierarchy(t), metric="host_incl_ns")
    assert isinstance(fig2, Figure)


@pytest.mark.parametrize("json_out", [True, False])
def test_cli_by_hierarchy(tmp_path, json_out):
    t = ingest_cached(DLRM)
    d = tmp_path / "dlrm.retime"
    t.save(d)
    cmd = [sys.executable, "-m", "retime", "analyze", str(d), "--by", "hierarchy"]
    r = subprocess.run(cmd + (["--json"] if json_out else []), capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    if json_out:
        js = json.loads(r.stdout)
        assert js["device_ns"] == hierarchy(t).iloc[0]["device_incl_ns"]
        assert js["hierarchy"][0]["name"] == "all"
    else:
        assert "## forward ##" in r.stdout


def test_host_nesting_kernel_matches_a_plain_stack_walk():
    """The numba stack walk of the attribution tree (analysis._kernels._host_nesting) equals
    a plain Python walk on random nested and overlapping events of several lanes."""
    import numpy as np

    from retime.analysis._kernels import _host_nesting

    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(1, 60))
        lane = np.sort(rng.integers(0, 3, n))
        s = rng.integers(0, 200, n)
        e = s + rng.integers(0, 80, n)
        ty = rng.integers(0, 3, n)
        o = np.lexsort((ty, -e, s, lane))
        lane, s, e, ty = lane[o], s[o], e[o], ty[o]
        par, dep, child = _host_nesting(lane, s, e, ty)
        stack: list[int] = []
        want_p, want_d, want_c = [-1] * n, [-1] * n, [0] * n
        for j in range(n):
            if j == 0 or lane[j] != lane[j - 1]:
                stack = []
            while stack and s[j] >= e[stack[-1]]:
                stack.pop()
            if stack:
                want_p[j] = stack[-1]
            if ty[j] == 2:
                continue
            if stack:
                want_d[j] = want_d[stack[-1]] + 1
                want_c[stack[-1]] += min(e[j], e[stack[-1]]) - s[j]
            else:
                want_d[j] = 0
            stack.append(j)
        assert par.tolist() == want_p and dep.tolist() == want_d and child.tolist() == want_c
