"""`retime synth` command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from retime.cli import run
from retime.collectors.trace import read_trace

BASE = ["--tp", "2", "--pp", "2", "--dp", "2", "--global-batch", "8", "--micro-batch", "1"]


def _model_file(tmp_path):
    f = tmp_path / "tiny.toml"
    f.write_text("hidden = 1024\nffn = 4096\nheads = 16\nlayers = 8\nseq = 1024\n"
                 "vocab = 32000\n")
    return f


def test_json_and_output(tmp_path, capsys):
    out = tmp_path / "run.retime"
    rc = run(["synth", "--model-file", str(_model_file(tmp_path)), "--hardware", "h100-sxm",
              *BASE, "--schedule", "interleaved", "--chunks", "2", "--recompute", "selective",
              "--sequence-parallel", "--zero", "1", "-o", str(out), "--json"])
    assert rc == 0
    cap = capsys.readouterr()
    obj = json.loads(cap.out)
    for k in ("step_time_ns", "tokens_per_s", "mfu", "peak_memory_bytes", "world_size"):
        assert k in obj
    assert obj["world_size"] == 8
    assert obj["parallel"]["schedule"] == "interleaved" and obj["parallel"]["chunks"] == 2
    tr = read_trace(out)
    assert tr.meta["synth"]["step_time_ns"] == obj["step_time_ns"]
    assert obj["peak_memory_bytes"] == max(r["total_bytes"] for r in tr.meta["synth"]["memory"])
    assert sorted(set(tr.ops["chunk"].tolist()) - {-1}) == [0, 1]


@pytest.mark.parametrize("args,msg", [
    (["--model", "megatron-22b", "--hardware", "a100-80gb", "--tp", "5", "--pp", "1", "--dp",
      "1", "--global-batch", "4", "--micro-batch", "4"], "tp=5 does not divide heads=64"),
    (["--model", "nope", "--hardware", "a100-80gb", *BASE], "unknown model 'nope'"),
    (["--model", "megatron-22b", "--hardware", "tpu", *BASE], "unknown hardware 'tpu'"),
    (["--model", "gpt3-1.3b", "--hardware", "a100-80gb", "--tp", "2", "--pp", "1", "--dp", "2",
      "--global-batch", "6", "--micro-batch", "2"], "global_batch=6 is not divisible"),
    (["--model", "gpt3-175b", "--hardware", "a100-40gb", "--tp", "1", "--pp", "1", "--dp",
      "1", "--global-batch", "1", "--micro-batch", "1", "--check-memory"], "does not fit"),
    (["--model", "gpt3-1.3b", "--hardware", "a100-80gb", *BASE, "--zero", "2", "--fsdp"],
     "FSDP is ZeRO-3"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, args, msg):
    rc = run(["synth", *args, "-o", str(tmp_path / "x.retime")])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err and "Traceback" not in err


def test_hardware_file_subprocess(tmp_path, capsys):
    from retime.collectors.synth.hardware import _DIR
    hw = tmp_path / "slow-net.toml"
    text = (_DIR / "a100-80gb.toml").read_text().replace('name = "a100-80gb"',
                                                          'name = "slow-net"')
    hw.write_text(text.replace("nic_gbps = 25.0", "nic_gbps = 2.5"))
    common = ["synth", "--model", "gpt3-1.3b", "--tp", "8", "--pp", "1", "--dp", "2",
              "--global-batch", "4", "--micro-batch", "2", "--json"]
    assert run([*common, "--hardware", "a100-80gb", "-o", str(tmp_path / "base.retime")]) == 0
    base = json.loads(capsys.readouterr().out)
    p = subprocess.run([sys.executable, "-m", "retime", *common, "--hardware-file", str(hw),
                        "-o", str(tmp_path / "slow.retime")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    slow = json.loads(p.stdout)
    # the data-parallel all-reduce crosses nodes: a 10x slower NIC makes the step slower
    assert slow["step_time_ns"] > base["step_time_ns"]
    assert slow["hardware"] == "slow-net" and slow["world_size"] == 16


def test_grad_reduce_dtype_prices_the_data_parallel_reduction(tmp_path, capsys):
    """--grad-reduce-dtype (REFERENCES.md R51): a bf16 run reduces fp32 main gradients by
    Megatron-LM's rule (auto), twice the bytes of --grad-reduce-dtype bf16 per bucket, and
    holds 2 more bytes per local parameter; an fp16 run reduces its 16-bit gradients; a bad
    value is one line, exit 2."""
    def synth(*extra):
        out = tmp_path / f"g{len(list(tmp_path.iterdir()))}.retime"
        assert run(["synth", "--model", "gpt3-125m", "--hardware", "a100-80gb", "--tp", "1",
                    "--pp", "1", "--dp", "4", "--global-batch", "4", "--micro-batch", "1",
                    *extra, "-o", str(out), "--json"]) == 0
        obj = json.loads(capsys.readouterr().out)
        tr = read_trace(out)
        sel = tr.names()[tr.ops.index.to_numpy()] == "dp.allreduce_grads"
        obj["memory"] = tr.meta["synth"]["memory"]
        return obj, int(tr.ops["bytes"].to_numpy()[sel & (tr.ops["rank"] == 0).to_numpy()].sum())
    auto, b_auto = synth()
    half, b_half = synth("--grad-reduce-dtype", "bf16")
    fp16, b_fp16 = synth("--dtype", "fp16")
    params = auto["memory"][0]["params"]
    assert b_auto == 2 * b_half and b_half == b_fp16 >= 2 * params
    assert auto["memory"][0]["grads_bytes"] - half["memory"][0]["grads_bytes"] == 2 * params
    assert auto["step_time_ns"] > half["step_time_ns"]
    rc = run(["synth", "--model", "gpt3-125m", "--hardware", "a100-80gb", *BASE,
              "--grad-reduce-dtype", "fp8", "-o", str(tmp_path / "x.retime")])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "--grad-reduce-dtype" in err and "\n" not in err and "Traceback" not in err


def test_moment_dtype_flag_shrinks_the_optimizer_states(tmp_path, capsys):
    """``--moment-dtype bf16`` (DeepSeek-V3's Adam moments, synth R54): 8 optimizer bytes
    per parameter instead of 12; any other value is one line, exit 2."""
    mem = {}
    for mdt in ("fp32", "bf16"):
        out = tmp_path / f"{mdt}.retime"
        assert run(["synth", "--model", "gpt3-125m", "--hardware", "a100-80gb", "--tp", "1",
                    "--pp", "1", "--dp", "1", "--global-batch", "1", "--micro-batch", "1",
                    "--moment-dtype", mdt, "-o", str(out), "--json"]) == 0
        capsys.readouterr()
        mem[mdt] = read_trace(out).meta["synth"]["memory"][0]
    n = mem["fp32"]["params"]
    assert (mem["fp32"]["optimizer_bytes"], mem["bf16"]["optimizer_bytes"]) == (12 * n, 8 * n)
    assert mem["fp32"]["total_bytes"] - mem["bf16"]["total_bytes"] == 4 * n
    rc = run(["synth", "--model", "gpt3-125m", "--hardware", "a100-80gb", *BASE,
              "--moment-dtype", "fp8", "-o", str(tmp_path / "x.retime")])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "--moment-dtype" in err and "\n" not in err and "Traceback" not in err
