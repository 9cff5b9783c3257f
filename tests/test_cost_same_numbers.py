"""One cost layer, the same numbers everywhere (issue 32 item 4): what `retime cost collective`
prints for a collective is exactly what a replay what-if and the synthesizer charge for it
(same function, same inputs), and a trace's measured NCCL channel count is what the replay
prices with (issue 27: the kernels' launch grid, one CTA per channel)."""

from __future__ import annotations

import json

import pytest
from conftest import KINETO, ingest_cached

from retime.cli import run
from retime.collectors.costs import kernels as K
from retime.collectors.costs import nccl_params as P
from retime.collectors.costs.gpus import gpu_spec
from retime.collectors.costs.ops import op_cost, price_op
from retime.collectors.enums import CommOp
from retime.collectors.synth.costs import CommModel
from retime.collectors.synth.hardware import load_hardware
from retime.collectors.synth.parallel import resolve_parallel
from retime.replay import whatif
from retime.replay.policies.kernel_cost import KERNEL_CURVES
from retime.replay.policies.nccl_trace import measured_channels


def _cli_row(capsys, argv: list[str]) -> dict:
    assert run(["cost", "collective", *argv, "--json"]) == 0
    out = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    rows = json.loads(out[-1])["rows"]
    assert len(rows) == 1
    return rows[0]


@pytest.fixture(scope="module")
def a100():
    return ingest_cached(KINETO / "a100-ddp-nccl")


def test_replay_prices_buckets_with_the_measured_channels_and_the_cli_agrees(a100, capsys):
    chan = measured_channels(a100)
    assert chan == 8  # the NCCL kernels' median grid (tests/test_whatif_nccl.py counts it)
    r = whatif(a100, {"overlap.bucket_mb": 1})
    sc = r.meta["scenario"][0]
    assert (sc["channels"], sc["channels_source"]) == (8, "measured")
    assert any("8 channels (measured" in a for a in r.meta["whatif"]["assumed"])
    p = sc["priced"]
    row = _cli_row(capsys, ["all_reduce", "--preset", "dgx-a100", "--gpus-per-node", "2",
                            "--sizes", str(p["bytes"]), "--algo", p["algorithm"],
                            "--proto", p["protocol"], "--channels", "8"])
    assert (row["algorithm"], row["protocol"], row["channels"]) == ("ring", "LL", 8)
    assert row["time_us"] == pytest.approx(p["time_us"], abs=1e-3)  # the CLI rounds to 1 ns


def test_measured_channels_change_what_depends_on_them():
    from retime.collectors.costs import collective_cost, load_preset

    h100 = load_preset("dgx-h100")
    # LL128's per-channel ceiling (36.7 GB/s on Hopper) binds with 4 channels, not with 24
    few = collective_cost(h100, "all_reduce", 2**30, algo="ring", proto="LL128", channels=4)
    table = collective_cost(h100, "all_reduce", 2**30, algo="ring", proto="LL128")
    assert table.channels == P.CHANNELS[("nvswitch", "hopper")].value == 24 and few.channels == 4
    assert few.busbw_gbps < 4 * 36.7 < table.busbw_gbps
    assert any("measured" in s for s in few.sources)
    # NVLS: fewer channels, less data in flight, a shorter pipeline fill
    nv4 = collective_cost(h100, "all_reduce", 2**30, channels=4)
    assert nv4.algorithm == "nvls" and nv4.channels == 4
    assert nv4.time_us < collective_cost(h100, "all_reduce", 2**30).time_us


@pytest.mark.parametrize("group, argv", [
    ("tp", ["--preset", "dgx-h100"]),  # 8 GPUs of one node: NVLS
    # DP across 4 nodes, one rank per node: its NIC share (one NIC per GPU)
    ("dp", ["--preset", "dgx-h100", "--gpus-per-node", "1", "--nodes", "4",
            "--nics-per-node", "1"]),
])
def test_synth_charges_what_the_cli_prints(group, argv, capsys):
    hw = load_hardware("h100-sxm")
    par = resolve_parallel(None, tp=8, pp=1, dp=4, global_batch=32, micro_batch=1)
    comm = CommModel(hw, par)
    for nbytes in (2**20, 2**27):
        ns = comm.collective_ns(CommOp.ALL_REDUCE, nbytes, group)
        row = _cli_row(capsys, ["all_reduce", *argv, "--sizes", str(nbytes)])
        assert ns == round(row["time_us"] * 1e3)


def test_cost_op_matmul_is_what_the_replay_charges(capsys):
    m, n, k = 4096, 4096, 4096
    assert run(["cost", "op", "matmul", "--m", str(m), "--n", str(n), "--k", str(k),
                "--gpu", "h100-sxm", "--dtype", "bf16", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    g = gpu_spec("h100-sxm")
    dims, types = [[m, k], [k, n]], ["c10::BFloat16", "c10::BFloat16"]
    replayed = price_op(g, "aten::mm", dims, types, op_cost("aten::mm", dims, types),
                        curves=KERNEL_CURVES)
    # the CLI's JSON keeps 3 decimals (ns): equal to that precision
    assert cli["time_us"] == pytest.approx(K.matmul(g, m, n, k, 1, "bf16").time_us, abs=5e-4)
    assert cli["time_us"] == pytest.approx(replayed.time_us, abs=5e-4)


@pytest.mark.parametrize("hw, dtype", [("h100-sxm", "fp8"), ("gb200", "fp8"),
                                       ("gb200", "fp4"), ("gb300", "fp4"),
                                       ("h100-sxm", "bf16")])
def test_synth_gemms_and_flash_attention_are_what_cost_op_training_prints(hw, dtype, capsys):
    """The synthesizer's linear-layer GEMMs (FP8 / FP4 with their block scales and input
    quantization) and its flash-attention kernels are the cost layer's: `retime cost op
    matmul|attention --training` prints exactly their durations (to the CLI's 1 ns)."""
    from retime.collectors.synth import synthesize

    t = synthesize("llama3-8b", hw, tp=1, pp=1, dp=1, global_batch=1, micro_batch=1,
                   dtype=dtype, check_memory=False, fp4_first_high=0, fp4_last_high=0)
    ops = t.ops.assign(name=t.names())
    ops = ops[(ops["rank"] == 0) & (ops["layer"] == 5)]

    def dur(name: str) -> float:
        return float(ops[ops["name"] == name]["dur_ns"].iloc[0]) / 1e3

    def cli(argv: list[str]) -> float:
        assert run(["cost", "op", *argv, "--gpu", hw, "--training", "--json"]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["time_us"]

    # llama3-8b: hidden 4096, 32 heads of 128, 8 KV heads, sequence 8192
    qkv = cli(["matmul", "--m", "8192", "--n", str(32 * 128 + 2 * 8 * 128), "--k", "4096",
               "--dtype", dtype])
    assert dur("attn.qkv.fwd") == pytest.approx(qkv, abs=1.5e-3)
    for name, bwd in (("attn.flash.fwd", []), ("attn.flash.bwd", ["--backward"])):
        fa = cli(["attention", "--batch", "1", "--heads", "32", "--seq", "8192",
                  "--head-dim", "128", "--causal", "--dtype", "bf16", *bwd])
        assert dur(name) == pytest.approx(fa, abs=1.5e-3), name
    if dtype in ("fp8", "fp4"):
        plain = K.matmul(gpu_spec(hw), 8192, 6144, 4096, 1, dtype,
                         ceiling=gpu_spec(hw).training_ceiling(dtype))
        assert qkv > plain.time_us  # the input's quantization is on top of the GEMM
