"""Llama 3 405B's memory per GPU counted by hand (issue 29 item 4, R11 / R34 layout: TP 8,
PP 16, 8 one-layer chunks per rank, the first chunk the embedding alone, the last the output
alone, ZeRO-1 over DP 64, fp32 main gradients, micro-batch 1 of 8,192 tokens, no recompute)
against the synthesizer's memory model, term by term.

The hand count (Korthikanti et al. 2022, generalized to GQA, SwiGLU, flash attention and no
dropout; ``s`` tokens, ``h`` hidden, ``a`` heads, ``k`` the K/V width, ``f`` the MLP width,
``t`` TP): per layer and micro-batch a rank keeps

    8 s h                 two norm inputs, the QKV and FC1 inputs (2 bytes; / t with SP)
    2 s (h + 2 k) / t     Q, K, V (flash attention's inputs)
    2 s h / t             the attention output (the projection's input)
    6 s f / t             the gate and up outputs, the SwiGLU product (FC2's input)
    4 a s / t             flash attention's fp32 log-sum-exp

and Megatron-LM's interleaved schedule keeps ``2 (p - r - 1) + (v - 1) p + 1`` chunk
forwards in flight on rank ``r`` (each chunk one layer here). Model states: 2-byte weights,
4-byte (fp32) main gradients, 12 bytes of master weights and moments over the 64 DP ranks.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from retime.cli import run
from retime.collectors.synth import resolve_model, synthesize
from retime.collectors.synth.memory import layer_activation_bytes
from retime.collectors.synth.parallel import ParallelConfig

S, H, A, K, FF, T, P, V, DP = 8192, 16384, 128, 8 * 128, 53248, 8, 16, 8, 64
GIB = 2**30


def hand_layer_bytes(sp: bool) -> int:
    replicated = 8 * S * H / (T if sp else 1)
    sharded = 2 * S * (H + 2 * K) + 2 * S * H + 6 * S * FF + 4 * A * S
    return int(replicated + sharded / T)


def _run(sp: bool, zero: int = 1) -> dict:
    return synthesize("llama3-405b", "h100-sxm", tp=T, pp=P, dp=DP, zero=zero,
                      schedule="interleaved", chunks=V, p2p="async", micro_batch=1,
                      global_batch=2048, stage_layers=(0,) + (1,) * 126 + (0,),
                      grad_reduce_dtype="fp32", sequence_parallel=sp, expand="unique",
                      check_memory=False).meta["synth"]


@pytest.mark.parametrize("sp", [False, True])
def test_layer_bytes_match_the_hand_count(sp):
    mc = resolve_model("llama3-405b")
    par = ParallelConfig(tp=T, pp=P, dp=DP, zero=1, schedule="interleaved", chunks=V,
                         micro_batch=1, global_batch=2048, sequence_parallel=sp)
    assert layer_activation_bytes(mc, par, layer=5) == pytest.approx(hand_layer_bytes(sp),
                                                                     abs=1)
    # without SP the replicated 8 s h (1.07 GB) is 73% of the layer's 1.47 GB
    assert hand_layer_bytes(False) / 1e9 == pytest.approx(1.473, abs=1e-3)
    assert hand_layer_bytes(True) / 1e9 == pytest.approx(0.533, abs=1e-3)


@pytest.mark.parametrize("sp", [False, True])
def test_stage_totals_match_the_hand_count(sp):
    mem = _run(sp)["memory"]
    layer = hand_layer_bytes(sp)
    for r, m in enumerate(mem):
        # Megatron-LM's interleaved warm-up (2 (p - r - 1) + (v - 1) p) plus the steady
        # state's one more forward
        assert m["in_flight_microbatches"] == 2 * (P - r - 1) + (V - 1) * P + 1
        n = m["params"]
        assert m["weights_bytes"] == pytest.approx(2 * n, abs=2)
        assert m["grads_bytes"] == pytest.approx(4 * n, abs=2)
        assert m["optimizer_bytes"] == pytest.approx(12 * n / DP, abs=2)
        assert m["step_copy_bytes"] == 0  # fp32 main gradients: no copy at the step
    # rank 1 holds 8 one-layer chunks and no embedding / output: every chunk forward in
    # flight is one layer's activations
    m = mem[1]
    assert m["dynamic_activation_bytes"] == pytest.approx(141 * layer, rel=1e-6)
    states = 2 * m["params"] + 4 * m["params"] + 12 * m["params"] / DP
    assert m["total_bytes"] == pytest.approx(states + 141 * layer + m["buffer_bytes"],
                                             rel=1e-6)
    # 3.19 G parameters per rank: 18.4 GiB of model states, 2.5 GiB reserve + DDP bucket
    assert states / GIB == pytest.approx(18.37, abs=0.02)
    # the hand count: 214.3 GiB without SP, 90.9 GiB with it (80 GiB HBM)
    assert m["total_bytes"] / GIB == pytest.approx(214.3 if not sp else 90.9, abs=0.1)


def test_sharded_gradients_and_sp_fit():
    """R11's FSDP shards the gradients too (ZeRO-2): 4 bytes / DP per parameter instead of 4;
    with sequence parallelism rank 1 then holds 79.2 GiB, under the H100's 80."""
    m = _run(True, zero=2)["memory"][1]
    n = m["params"]
    assert m["grads_bytes"] == pytest.approx(4 * n / DP, abs=2)
    states = 2 * n + (4 + 12) * n / DP
    assert m["total_bytes"] == pytest.approx(
        states + 141 * hand_layer_bytes(True) + m["buffer_bytes"], rel=1e-6)
    assert m["total_bytes"] / GIB == pytest.approx(79.2, abs=0.1)
    assert not m["oom"]


@pytest.mark.parametrize("pp", [1, 2])
def test_zero2_reduces_every_micro_batch(pp):
    """ZeRO-2 holds only a shard of the gradients (memory: grads / DP), so each of the
    ``m`` micro-batches' backwards reduces its gradients (DeepSpeed's
    ``partition_gradients``, synth REFERENCES R46); ZeRO-1 accumulates the whole buffer and
    reduces once. Not overlapped (the default), the reductions delay the next items."""
    m = 4
    kw = dict(tp=1, pp=pp, dp=2, global_batch=2 * m, micro_batch=1, check_memory=False)
    out = {}
    for z in (1, 2):
        tr = synthesize("gpt3-125m", "a100-80gb", zero=z, **kw)
        f = tr.ops_frame()
        red = f["name"].astype(str).str.startswith("dp.reduce") & (f["rank"] == 0)
        s = tr.meta["synth"]
        out[z] = (int(red.sum()), s["step_time_ns"], s["memory"][0]["grads_bytes"])
    assert out[2][0] == m * out[1][0]
    assert out[2][1] > out[1][1]
    assert out[2][2] == pytest.approx(out[1][2] / 2, abs=2)


def test_recipe_row_command_fits_and_matches(tmp_path, capsys):
    """The Llama 3 405B 16K-GPU row of bench/synth_recipes.py: its printed command states
    ZeRO-2 and the overlapped reduction (not SP: R11 does not state it), and gives the
    bench's step time; without SP the activations do not fit 80 GiB, which the row shows."""
    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("synth_recipes",
                                                  root / "bench" / "synth_recipes.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    opts = next(r for r in bench.ROWS if r[0] == "Llama3-405B 16K GPUs")[7]
    cmd = bench.command(opts).split()[1:-3] + ["-o", str(tmp_path / "r.retime"), "--json"]
    for flag in ("--zero", "--grad-overlap"):
        assert flag in cmd
    assert "--sequence-parallel" not in cmd
    assert run(cmd) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["step_time_ns"] == bench.predict(opts)["step_time_ns"]
    assert s["oom"] and s["peak_memory_bytes"] / GIB == pytest.approx(184.4, abs=0.2)
