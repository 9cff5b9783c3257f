"""Synthesizer: TP communication overlapped with GEMMs (``tp_comm_overlap``, Megatron-LM's
``--tp-comm-overlap``) and activation offload to host memory (``offload_layers``)."""

from __future__ import annotations

import numpy as np
import pytest

from retime.cli import run
from retime.collectors.enums import OpKind, Phase
from retime.collectors.errors import ConfigError
from retime.collectors.synth import load_hardware, resolve_model, resolve_parallel, synthesize
from retime.collectors.synth.memory import layer_activation_bytes
from retime.replay import replay

_TP = dict(tp=4, pp=1, dp=1, sequence_parallel=True, global_batch=2, micro_batch=1,
           dtype="fp8")


def _ops(t, rank=0, mb=0):
    o = t.ops.assign(name=t.names())
    return o[(o["rank"] == rank) & (o["microbatch"] == mb)]


@pytest.fixture(scope="module")
def tp_pair():
    return (synthesize("llama3-8b", "h100-sxm", **_TP),
            synthesize("llama3-8b", "h100-sxm", tp_comm_overlap=True, **_TP))


def test_tp_overlap_runs_each_gather_beside_its_gemm(tp_pair):
    plain, ov = tp_pair
    f = load_hardware("h100-sxm").overlap_efficiency
    a, b = _ops(plain), _ops(ov)
    fwd = int(Phase.FWD)
    for gemm in ("attn.qkv.fwd", "mlp.fc1.fwd"):
        g0 = a[(a["name"] == gemm) & (a["layer"] == 3)].iloc[0]
        g1 = b[(b["name"] == gemm) & (b["layer"] == 3)].iloc[0]
        # the gather that fed it, in the plain run: the tp op just before it on the layer
        ag0 = a[(a["name"] == "tp.allgather") & (a["layer"] == 3) & (a["phase"] == fwd)
                & (a["start_ns"] < g0["start_ns"])].iloc[-1]
        ag1 = b[(b["name"] == "tp.allgather") & (b["layer"] == 3) & (b["phase"] == fwd)
                & (b["start_ns"] <= g1["start_ns"])].iloc[-1]
        assert ag1["start_ns"] == g1["start_ns"]  # side by side, same inputs
        assert g0["start_ns"] >= ag0["start_ns"] + ag0["dur_ns"]  # plain: after the gather
        # the exchange less its first piece (1/tp) beside the GEMM, the longer of the two
        # stretched by (1 - f) of the shorter (C3's rule); the piece stays exposed
        piece = int(ag0["dur_ns"]) // _TP["tp"]
        short, long_ = sorted((int(ag0["dur_ns"]) - piece, int(g0["dur_ns"])))
        assert max(int(ag1["dur_ns"]) - piece, int(g1["dur_ns"])) == pytest.approx(
            long_ + (1 - f) * short, abs=1)
    # the work is the same; the step is shorter; the trace replays to its own step time
    fl = lambda t: float(np.nansum(t.ops["flops"]))  # noqa: E731
    assert fl(ov) == pytest.approx(fl(plain))
    assert ov.meta["synth"]["step_time_ns"] < plain.meta["synth"]["step_time_ns"]
    assert replay(ov).step_time_ns == pytest.approx(ov.meta["synth"]["step_time_ns"], rel=1e-6)


def test_tp_overlap_needs_sequence_parallel(capsys, tmp_path):
    with pytest.raises(ConfigError, match="--sequence-parallel"):
        resolve_parallel(None, tp=2, tp_comm_overlap=True)
    rc = run(["synth", "--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", "2",
              "--pp", "1", "--dp", "1", "--global-batch", "2", "--micro-batch", "1",
              "--tp-comm-overlap", "-o", str(tmp_path / "x.retime")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--sequence-parallel" in err[0]


_OFF = dict(tp=1, pp=1, dp=1, global_batch=1, micro_batch=1, dtype="bf16", check_memory=False)


@pytest.mark.parametrize("hw", ["h100-sxm", "gb200"])
def test_offload_frees_activations_and_exposes_the_copy_beyond_compute(hw):
    n = 4
    plain = synthesize("llama3-8b", hw, **_OFF)
    off = synthesize("llama3-8b", hw, offload_layers=n, **_OFF)
    h = load_hardware(hw)
    m = resolve_model("llama3-8b")
    p = resolve_parallel(None, offload_layers=n,
                         **{k: v for k, v in _OFF.items() if k != "check_memory"})
    per_layer = layer_activation_bytes(m, p, layer=0)
    # memory: n layers' activations leave the GPU, two staging buffers stay
    mp, mo = (t.meta["synth"]["peak_memory_bytes"] for t in (plain, off))
    assert mp - mo == pytest.approx((n - 2) * per_layer, rel=1e-6)
    # time: each offloaded layer waits for what its copy takes beyond the layer's compute
    a, b = _ops(plain), _ops(off)
    rate = h.host_bytes_per_ns
    copy = per_layer / rate
    for lay in range(n):
        for phase, name in ((Phase.FWD, "offload.d2h.wait"), (Phase.BWD, "offload.h2d.wait")):
            comp = a[(a["layer"] == lay) & (a["phase"] == int(phase)) & (a["lane"] == 0)
                     & (a["kind"] == int(OpKind.KERNEL))]["dur_ns"].sum()
            want = max(0, round(copy) - int(comp))
            got = b[(b["layer"] == lay) & (b["name"] == name)]
            assert int(got["dur_ns"].sum()) == pytest.approx(want, abs=1), (lay, phase)
            if want:
                assert (got["kind"] == int(OpKind.MEMCPY)).all()
                assert int(got["bytes"].iloc[0]) == per_layer
    assert not (b["name"].str.startswith("offload.") & (b["layer"] >= n)).any()
    assert off.meta["synth"]["step_time_ns"] >= plain.meta["synth"]["step_time_ns"]


def test_offload_is_slower_over_pcie_than_over_c2c():
    """The same job priced on GB200's host link (NVLink-C2C, 256 GB/s per GPU through
    Grace's memory) and on the same profile with PCIe Gen5 (64 GB/s x 0.8): only the host
    link differs, so the offload's extra time grows as the link slows."""
    import dataclasses
    gb = load_hardware("gb200")
    pcie = dataclasses.replace(gb, host_link="pcie5", host_link_gbps=64.0,
                               host_link_efficiency=0.8)
    extra = []
    for h in (gb, pcie):
        base = synthesize("llama3-8b", h, **_OFF).meta["synth"]["step_time_ns"]
        extra.append(synthesize("llama3-8b", h, offload_layers=8, **_OFF)
                     .meta["synth"]["step_time_ns"] - base)
    assert 0 <= extra[0] < extra[1]


def test_offload_bad_input_exits_2(capsys, tmp_path):
    for pp, layers, msg in (("1", "32", "fewer than the model's 32 layers"),
                            ("2", "2", "pp=1")):
        rc = run(["synth", "--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", "1",
                  "--pp", pp, "--dp", "1", "--global-batch", "2", "--micro-batch", "1",
                  "--offload-layers", layers, "-o", str(tmp_path / "x.retime")])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and msg in err[0], err
