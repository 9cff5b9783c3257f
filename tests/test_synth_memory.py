"""Model-state bytes per parameter of the synthesizer's memory model, against the closed
forms of Megatron-LM's distributed-optimizer table (synth REFERENCES.md R53)."""

from __future__ import annotations

import pytest

from retime.collectors.synth import synthesize
from retime.collectors.synth.memory import state_bytes_per_param
from retime.collectors.synth.parallel import ParallelConfig

# (run dtype, --grad-reduce-dtype, main-gradient bytes): fp16 and bf16 gradients are 16-bit,
# fp32 ones 4 bytes (auto: fp32 for bf16 runs, fp16 for fp16 runs)
SETTINGS = [("fp16", "auto", 2), ("fp16", "fp32", 4), ("bf16", "bf16", 2),
            ("bf16", "auto", 4), ("bf16", "fp32", 4), ("fp8", "auto", 4)]


@pytest.mark.parametrize("dtype,grad,gb", SETTINGS)
@pytest.mark.parametrize("d", [1, 2, 8, 64])
def test_bytes_per_param_follow_megatrons_table(dtype, grad, gb, d):
    """A rank at the optimizer step holds weights + grads + (master + moments + fp32 copy of
    16-bit grads) / d: Megatron-LM's table, 20 (fp16 grads) and 18 (fp32 grads) bytes without
    the distributed optimizer, 4 + 16/d and 6 + 12/d with it over d ranks."""
    P = ParallelConfig(dtype=dtype, grad_reduce_dtype=grad, dp=d, global_batch=d,
                       zero=1 if d > 1 else 0)
    b = state_bytes_per_param(P)
    assert b["grads"] == gb
    per_param = b["weights"] + b["grads"] + (b["optimizer"] + b["step_copy"]) / d
    expected = (4 + 16 / d) if gb == 2 else (6 + 12 / d)
    assert per_param == pytest.approx(expected, rel=1e-12)
    if d == 1:
        assert per_param == (20 if gb == 2 else 18)
    # while activations are alive (forward / backward) the copy does not exist yet
    assert b["weights"] + b["grads"] + b["optimizer"] / d == gb + 2 + 12 / d


def test_fsdp2_keeps_no_fp32_gradient_copy():
    """FSDP2's reduce-scatter output is the fp32 sharded gradient the optimizer reads: 16-bit
    unsharded gradients, no copy at the step."""
    b = state_bytes_per_param(ParallelConfig(dp=4, global_batch=4, fsdp=True, fsdp_impl="fsdp2"))
    assert (b["grads"], b["step_copy"]) == (2, 0)


@pytest.mark.parametrize("model,tp,zero,rc,copy_wins", [
    ("gpt3-125m", 1, 0, "none", False), ("gpt3-125m", 1, 0, "full", False),
    ("megatron-22b", 8, 0, "full", True), ("megatron-22b", 8, 1, "full", True)])
def test_stage_peak_counts_the_step_copy_only_past_the_activations(model, tp, zero, rc,
                                                                   copy_wins):
    """fp16 runs on 2 data-parallel ranks: the fp32 gradient copy (4 bytes per parameter of
    the optimizer shard), made at the step after the backwards freed the micro-batches'
    activations, replaces them in the peak where it is larger (full recompute; 22B at TP 8:
    2.75 G parameters per rank, 11 GB or 5.5 GB of copy); bf16 runs (fp32 buffers) have
    none."""
    kw = dict(tp=tp, pp=1, dp=2, zero=zero, global_batch=2, micro_batch=1,
              recompute=rc, check_memory=False)
    m = synthesize(model, "a100-80gb", dtype="fp16", **kw).meta["synth"]["memory"][0]
    n = m["params"]
    d = 2 if zero else 1
    assert m["step_copy_bytes"] == int(4 * n / d)
    assert m["optimizer_bytes"] == int(12 * n / d)
    act = m["activation_bytes"]  # freed by the last backward, before the step
    assert (m["step_copy_bytes"] > act) == copy_wins
    static = m["weights_bytes"] + m["grads_bytes"] + m["optimizer_bytes"] + m["buffer_bytes"]
    assert abs(m["total_bytes"] - static - max(act, m["step_copy_bytes"])) <= 4
    # the allocator timeline: the copy arrives with the rank's first optimizer op and the
    # timeline's maximum is the stage peak
    tr = synthesize(model, "a100-80gb", dtype="fp16", **kw)
    mt = tr.memory[tr.memory["rank"] == 0]
    assert mt["allocated_bytes"].max() == m["total_bytes"]
    o = tr.ops[(tr.ops["rank"] == 0) & (tr.ops["phase"] == 2)]
    fixed = act - m["dynamic_activation_bytes"]  # recompute / logits buffers, freed by then
    at = mt.loc[mt["bytes_delta"] == m["step_copy_bytes"] - fixed, "ts_ns"]
    assert len(at) == 1 and int(at.iloc[0]) == int(o["start_ns"].min())
    b = synthesize(model, "a100-80gb", dtype="bf16", **kw).meta["synth"]["memory"][0]
    assert b["step_copy_bytes"] == 0
    assert abs(b["total_bytes"] - b["weights_bytes"] - b["grads_bytes"] - b["optimizer_bytes"]
               - b["buffer_bytes"] - b["activation_bytes"]) <= 4


@pytest.mark.parametrize("d", [1, 8])
def test_bf16_moments_hold_8_optimizer_bytes_and_move_20_in_the_adam_step(d):
    """DeepSeek-V3's bf16 Adam moments (R54): fp32 master 4 + two 2-byte moments = 8 bytes
    per parameter (6 + 8/d with fp32 gradients and the distributed optimizer), and the fused
    Adam step reads param, grad, m, v and writes param, m, v: 4 + 4 + 2 + 2 + 4 + 2 + 2 = 20
    bytes per parameter of the shard instead of 28."""
    kw = dict(dp=d, global_batch=d, zero=1 if d > 1 else 0)
    b = state_bytes_per_param(ParallelConfig(moment_dtype="bf16", **kw))
    assert b["optimizer"] == 8 and b["step_copy"] == 0
    assert b["weights"] + b["grads"] + b["optimizer"] / d == 6 + 8 / d
    runs = {}
    for mdt in ("fp32", "bf16"):
        tr = synthesize("gpt3-125m", "a100-80gb", tp=1, pp=1, micro_batch=1, moment_dtype=mdt,
                        check_memory=False, **kw)
        o = tr.ops.assign(name=tr.names())
        step = o.loc[(o["rank"] == 0) & (o["name"] == "optimizer.adam_step"), "bytes"]
        runs[mdt] = (int(step.sum()), tr.meta["synth"]["memory"][0])
    n = runs["fp32"][1]["params"]
    assert runs["bf16"][1]["optimizer_bytes"] == int(8 * n / d)
    assert runs["fp32"][1]["optimizer_bytes"] == int(12 * n / d)
    assert abs(runs["bf16"][0] * 28 - runs["fp32"][0] * 20) <= 28 * 20


def test_moment_dtype_rejects_other_values():
    from retime.collectors.synth.parallel import ConfigError
    with pytest.raises(ConfigError, match="moment_dtype"):
        ParallelConfig(moment_dtype="fp8")
