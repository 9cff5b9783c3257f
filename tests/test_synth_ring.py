"""PyTorch's ring attention (``--cp-attention torch``, collectors/synth/ring.py): cp flash
calls per layer on half blocks plus fp32 eager merges, against closed-form byte counts."""

from __future__ import annotations

import pytest

from retime.cli import run
from retime.collectors.costs.kernels import memory_bound
from retime.collectors.errors import ConfigError
from retime.collectors.synth import synthesize
from retime.collectors.synth.costs import _spec
from retime.collectors.synth.hardware import load_hardware
from retime.collectors.synth.parallel import ParallelConfig
from retime.collectors.synth.ring import ring_merge_bytes

# a small Llama with grouped-query attention: 16 heads of 64, 4 K/V heads
MODEL = {"name": "llama-h1024", "hidden": 1024, "ffn": 3584, "heads": 16, "kv_heads": 4,
         "layers": 2, "seq": 1024, "vocab": 32000, "gated_mlp": True, "norm": "rmsnorm",
         "positions": "rotary", "dropout": False, "tied_embeddings": False,
         "attention": "flash"}
BASE = dict(tp=1, pp=1, dp=1, cp=2, global_batch=2, micro_batch=2, dtype="bf16")


def _synth(**kw):
    return synthesize(MODEL, "h100-sxm", expand="unique", check_memory=False,
                      **{**BASE, **kw})


def _op(tr, name):
    o = tr.ops[(tr.ops["rank"] == 0) & (tr.names() == name)]
    assert len(o), name
    return o


def test_merge_bytes_closed_form():
    """cp 4, rank 3: forward 6 + 3 x 38 + 6 bytes per output element, 3 x 52 per row,
    3 x 4 per K/V element; backward (4 + 4 x 10 + 6) per query element and
    (4 + 10 + 8 + 3 x 21 + 3 x 4 + 6) per K/V element."""
    assert ring_merge_bytes(4, 1000, 10, 500, 800, backward=False) == \
        1000 * 126 + 10 * 156 + 500 * 12
    assert ring_merge_bytes(4, 1000, 10, 500, 800, backward=True) == 800 * 50 + 500 * 103


def test_torch_ring_prices_merges_and_step_kernels():
    """cp 2, local sequence 512, micro-batch 2: the merge ops move the closed-form bytes
    at the cost layer's HBM price; the step kernels do the fused kernel's FLOPs; the step
    is slower; the default prices no ring ops."""
    fused, ring = _synth(), _synth(cp_attention="torch")
    out = 2 * 16 * 512 * 64  # local output elements (= query elements: head dims equal)
    # K and V expanded to the 16 query heads (torchtitan's repeat_kv), not the 4 K/V heads
    rows, kv = 2 * 16 * 512, 2 * 16 * 512 * 128
    fwd = _op(ring, "attn.ring_merge.fwd")
    bwd = _op(ring, "attn.ring_merge.bwd")
    assert (fwd["bytes"] == out * 50 + rows * 52 + kv * 4).all()
    assert (bwd["bytes"] == out * 30 + kv * 53).all()
    hw = load_hardware("h100-sxm")
    want = memory_bound(_spec(hw), "streaming", 0.0, float(out * 50 + rows * 52 + kv * 4))
    assert fwd["dur_ns"].iloc[0] == int(round(want.time_us * 1e3))
    for d in ("fwd", "bwd"):
        steps = _op(ring, f"attn.flash.{d}")["flops"].iloc[0] + \
            _op(ring, f"attn.flash_ring_steps.{d}")["flops"].iloc[0]
        assert steps == pytest.approx(_op(fused, f"attn.flash.{d}")["flops"].iloc[0])
    assert not (fused.names() == "attn.ring_merge.fwd").any()
    assert ring.meta["synth"]["step_time_ns"] > fused.meta["synth"]["step_time_ns"]


def test_cp1_is_unchanged_by_the_option():
    a = _synth(cp=1)
    b = _synth(cp=1, cp_attention="torch")
    assert a.meta["synth"]["step_time_ns"] == b.meta["synth"]["step_time_ns"]


def test_bad_cp_attention():
    with pytest.raises(ConfigError, match="cp_attention='ring'"):
        ParallelConfig(cp_attention="ring")


def test_cli_option(tmp_path, capsys):
    args = ["synth", "--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", "1", "--pp",
            "1", "--dp", "1", "--cp", "2", "--global-batch", "1", "--micro-batch", "1",
            "--json"]
    assert run([*args, "-o", str(tmp_path / "a.retime")]) == 0
    a = capsys.readouterr().out
    assert run([*args, "--cp-attention", "torch", "-o", str(tmp_path / "b.retime")]) == 0
    b = capsys.readouterr().out
    import json
    assert json.loads(b)["step_time_ns"] > json.loads(a)["step_time_ns"]


def test_backward_rotates_fp32_dkv_every_step():
    """cp 4: the backward's dK/dV accumulators (fp32, expanded to the 16 query heads) go to
    the next rank after every step: three transfers beside the later steps' kernels, the
    last one after them, exposed; each priced as the cost layer's point-to-point transfer.
    The K/V all-gathers move the expanded 16-bit K and V of the whole sequence; the default
    (fused) keeps one 16-bit reduce-scatter of the unexpanded dK/dV."""
    from retime.collectors.synth.costs import CommModel
    ring = _synth(cp=4, dp=1, global_batch=2, micro_batch=2, cp_attention="torch")
    one = 4 * 2 * 16 * 256 * 128  # fp32, micro-batch 2, 16 heads, local 256 tokens, K+V
    hid, last = _op(ring, "cp.rotate_dkv"), _op(ring, "cp.rotate_dkv.last")
    assert (hid["bytes"] == 3 * one).all() and (last["bytes"] == one).all()
    comm = CommModel(load_hardware("h100-sxm"), ParallelConfig(
        tp=1, pp=1, dp=1, cp=4, global_batch=2, micro_batch=2))
    assert last["dur_ns"].iloc[0] == comm.p2p_ns(one, "cp")
    assert hid["dur_ns"].iloc[0] == 3 * comm.p2p_ns(one, "cp")
    gathers = _op(ring, "cp.allgather_kv")
    assert (gathers["bytes"] == 2 * 2 * 1024 * 16 * 128).all()
    fused = _synth(cp=4, dp=1, global_batch=2, micro_batch=2)
    assert (_op(fused, "cp.reduce_scatter_dkv")["bytes"] == 2 * 2 * 2 * 1024 * 4 * 64).all()
    assert not (fused.names() == "cp.rotate_dkv").any()
    # the exposed transfer starts once the last step's kernel and the others are done
    r0 = ring.ops[ring.ops["rank"] == 0]
    names = ring.names()[ring.ops["rank"] == 0]
    steps_end = (r0["start_ns"] + r0["dur_ns"])[names == "attn.flash_ring_steps.bwd"]
    assert (last["start_ns"].to_numpy() >= steps_end.to_numpy()).all()
