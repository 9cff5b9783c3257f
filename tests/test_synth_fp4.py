"""FP4 training in the synthesizer, `retime synth` on rack hardware, the NVLink domain key and
the host link of the caching what-ifs."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from retime.cli import run
from retime.collectors.synth import load_hardware, synthesize
from retime.collectors.synth.costs import gemm
from retime.replay import whatif
from retime.replay.policies.keys import KEYS
from retime.replay.policies.scenario import vocabulary

TINY = {"name": "tiny", "hidden": 2048, "ffn": 8192, "heads": 16, "kv_heads": 8, "layers": 6,
        "seq": 2048, "vocab": 32000, "gated_mlp": True, "dropout": False,
        "attention": "flash", "positions": "rotary"}
RUN = dict(tp=4, pp=1, dp=2, cp=2, global_batch=4, micro_batch=1, expand="unique")


def _dur(tr, name: str, layer: int) -> int:
    o = tr.ops
    nid = tr.strings.index(name)
    sel = (o["name_id"] == nid) & (o["layer"] == layer) & (o["rank"] == 0)
    return int(o.loc[sel, "dur_ns"].iloc[0])


def test_fp4_gemm_reads_block_scaled_inputs_and_pays_its_quantization():
    hw = load_hardware("gb200")
    m, n, k = 8192, 8192, 8192
    g4, g8 = gemm(hw, "fp4", m, n, k), gemm(hw, "fp8", m, n, k)
    assert g4.bytes == int(0.5625 * (m * k + k * n) + 2 * m * n)  # 4 bits + E4M3 per 16
    assert g4.flops == g8.flops and g4.dur_ns < g8.dur_ns
    bw = hw.hbm_gbps * hw.memory_efficiency
    quant_ns = (2 + 2 * 0.5625) * m * k / bw  # read 16-bit, write row + column copies
    compute_ns = g4.flops / (hw.peak_flops("fp4") * 0.8 * k / (k + 4 * 192)) * 1e9
    assert g4.dur_ns >= quant_ns + compute_ns * 0.99


def test_fp4_keeps_attention_head_and_first_last_layers_out_of_fp4():
    f4 = synthesize(TINY, "gb200", dtype="fp4", **RUN)
    f8 = synthesize(TINY, "gb200", dtype="fp8", **RUN)
    bf = synthesize(TINY, "gb200", dtype="bf16", **RUN)
    mid, last = 2, TINY["layers"] - 1
    # middle layers: FP4 linear GEMMs, faster than FP8 but for NVFP4's per-call block-scale
    # time, which on GEMMs this small makes FP4 no faster (as the published K5 sweep has it:
    # 549 FP4 vs 1022 FP8 TFLOP/s at 1024 x 2145 x 1024)
    from retime.collectors.costs.kernels import BLOCK_SCALE_US
    scale_ns = BLOCK_SCALE_US["fp4"] * 1e3
    assert _dur(f4, "mlp.fc1.fwd", mid) - scale_ns < _dur(f8, "mlp.fc1.fwd", mid)
    # first and last layer: BF16 (Megatron's --first-last-layers-bf16 default 1, 1)
    assert _dur(f4, "mlp.fc1.fwd", 0) == _dur(bf, "mlp.fc1.fwd", 0)
    assert _dur(f4, "mlp.fc1.fwd", last) == _dur(bf, "mlp.fc1.fwd", last)
    # the attention core stays BF16 in FP8 and FP4 runs alike
    assert _dur(f4, "attn.flash.fwd", mid) == _dur(f8, "attn.flash.fwd", mid)
    # (the whole step: FP4 beats FP8 only with GEMMs large enough to pay its block-scale
    # time; test_gpu_swap_what_if_keeps_the_runs_network_and_can_turn_on_fp4 checks it)
    allfp4 = synthesize(TINY, "gb200", dtype="fp4", fp4_first_high=0, fp4_last_high=0, **RUN)
    assert _dur(allfp4, "mlp.fc1.fwd", 0) == _dur(f4, "mlp.fc1.fwd", mid)
    kept8 = synthesize(TINY, "gb200", dtype="fp4", fp4_high_dtype="fp8", **RUN)
    assert _dur(kept8, "mlp.fc1.fwd", 0) == _dur(f8, "mlp.fc1.fwd", 0)


def test_fp4_memory_holds_quantized_weights_and_smaller_activations():
    m4 = synthesize(TINY, "gb200", dtype="fp4", fp4_first_high=0, fp4_last_high=0,
                    **RUN).meta["synth"]["memory"][0]
    m8 = synthesize(TINY, "gb200", dtype="fp8", **RUN).meta["synth"]["memory"][0]
    params = m8["weights_bytes"] / 2  # 16-bit weights of the rank
    assert m4["weights_bytes"] == pytest.approx(m8["weights_bytes"] + 2 * 0.5625 * params,
                                                rel=1e-6)
    assert m4["activation_bytes"] < m8["activation_bytes"]


@pytest.mark.parametrize("args,msg", [
    (["--hardware", "h100-sxm", "--tp", "2", "--dp", "4", "--dtype", "fp4"],
     "h100-sxm (NVIDIA H100 80GB HBM3) has no FP4 tensor cores"),
    (["--hardware", "mi325x", "--tp", "2", "--dp", "4", "--dtype", "fp4"], "has no FP4"),
    (["--hardware", "gb200", "--tp", "4", "--dp", "16", "--nvlink-domain", "48"],
     "nvlink_domain=48 does not divide the job's 64 GPUs"),
    (["--hardware", "b200", "--tp", "16", "--dp", "1"],
     "tp=16 is larger than the NVLink domain (8 GPUs"),
    (["--hardware", "gb200", "--tp", "8", "--dp", "4", "--nvlink-domain", "4"],
     "tp=8 is larger than the NVLink domain (4 GPUs"),
    (["--hardware", "gb200", "--tp", "2", "--dp", "4", "--dtype", "fp4", "--fp4-high-layers",
      "1"], "--fp4-high-layers '1': give FIRST,LAST"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, args, msg):
    rc = run(["synth", "--model", "gpt3-1.3b", "--pp", "1", "--global-batch", "16",
              "--micro-batch", "1", *args, "-o", str(tmp_path / "x.retime")])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "x.retime").exists()


@pytest.mark.parametrize("hw", ["gb200", "gb300", "b300", "mi325x", "mi355x"])
def test_synth_runs_on_every_new_profile(tmp_path, capsys, hw):
    dtype = "fp8" if hw == "mi325x" else "fp4"
    rc = run(["synth", "--model-file", str(_model_file(tmp_path)), "--hardware", hw,
              "--tp", "4", "--pp", "2", "--cp", "2", "--dp", "1", "--global-batch", "4",
              "--micro-batch", "1", "--dtype", dtype, "-o", str(tmp_path / "r.retime"),
              "--json"])
    assert rc == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["world_size"] == 16 and obj["parallel"]["dtype"] == dtype
    assert obj["nvlink_domain"] == (72 if hw.startswith("gb") else 8)


def _model_file(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in TINY.items()))
    return f


def test_rack_layout_subprocess_places_256_gpus_in_racks_of_64(tmp_path):
    """TP4 PP8 VP8 CP2 DP4 on 256 GB200 GPUs: TP x CP groups span two trays, in one rack."""
    p = subprocess.run(
        [sys.executable, "-m", "retime", "synth", "--model-file", str(_model_file(tmp_path)),
         "--hardware", "gb200", "--tp", "4", "--pp", "2", "--schedule", "interleaved",
         "--chunks", "3", "--cp", "2", "--dp", "16", "--global-batch", "32",
         "--micro-batch", "1", "--dtype", "fp4", "-o", str(tmp_path / "r.retime"), "--json"],
        capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    obj = json.loads(p.stdout)
    assert obj["world_size"] == 256 and obj["nvlink_domain"] == 64


def test_nvlink_domain_key_replays_a_rack_as_trays():
    assert "topology.nvlink_domain" in KEYS and "topology.nvlink_domain" in vocabulary()
    t = synthesize(TINY, "gb200", dtype="bf16", **RUN)
    rack = whatif(t, {"hardware.compute_speedup": 1.0})
    trays = whatif(t, {"topology.nvlink_domain": 4})  # CP pairs of TP4 groups on two trays
    assert trays.step_time_ns > rack.step_time_ns
    with pytest.raises(Exception, match="tp=4 is larger than the NVLink domain"):
        whatif(t, {"topology.nvlink_domain": 2})


def test_offload_prices_the_host_link():
    """Optimizer offload: NVLink-C2C to Grace (~256 GB/s) against PCIe Gen4's 25 GB/s."""
    t = synthesize(TINY, "gb200", dtype="bf16", **RUN)
    c2c = whatif(t, {"cache.offload_optimizer": True})
    pcie = whatif(t, {"cache.offload_optimizer": True, "cache.pcie_gbps": 25.0,
                      "cache.host_gbps": 100.0})
    assert c2c.step_time_ns < pcie.step_time_ns
    o = t.ops
    adam = np.flatnonzero(o["name_id"].to_numpy() == t.strings.index("optimizer.adam_step"))
    r = adam[0]
    # the CPU's Adam: 4 bytes per parameter over the link + 28 through host memory
    expect = (4 / 25 + 28 / 100) / (4 / 256 + 28 / 256)
    got = (pcie.end_ns[r] - pcie.start_ns[r]) / (c2c.end_ns[r] - c2c.start_ns[r])
    assert got == pytest.approx(expect, rel=0.01)


def test_gpu_swap_what_if_keeps_the_runs_network_and_can_turn_on_fp4():
    """hardware.gpu=gb200 on an H100 run changes the GPU, not the node shape (8 per NVLink
    domain); parallel.dtype=fp4 then runs FP4 layers; FP4 on the H100 is refused."""
    # GEMMs large enough for FP4 to pay off (small ones pay its per-call block-scale time),
    # and enough layers that the first and last (kept in BF16) do not dominate
    big = {**TINY, "hidden": 8192, "ffn": 28672, "heads": 64, "seq": 8192, "layers": 12}
    t = synthesize(big, "h100-sxm", dtype="fp8", **RUN)
    gb = whatif(t, {"hardware.gpu": "gb200"})
    f4 = whatif(t, {"hardware.gpu": "gb200", "parallel.dtype": "fp4"})
    assert f4.step_time_ns < gb.step_time_ns < t.meta["synth"]["step_time_ns"]
    with pytest.raises(Exception, match="has no FP4 tensor cores"):
        whatif(t, {"parallel.dtype": "fp4"})


def test_fcdp_host_cache_prices_the_host_link():
    t = synthesize(TINY, "gb200", dtype="bf16", fsdp=True, **RUN)
    c2c = whatif(t, {"cache.fcdp": True})
    pcie = whatif(t, {"cache.fcdp": True, "cache.pcie_gbps": 25.0})
    assert c2c.step_time_ns < pcie.step_time_ns
