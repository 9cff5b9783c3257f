"""What a PyTorch-native trainer (torchtitan) runs that Megatron-LM's fused kernels do not:
eager mode (``--eager``), op-level selective checkpointing (``--recompute op``), and the
sequence length as a command option (``--seq``); and the recipe bench's printed commands."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from retime.cli import run
from retime.collectors.enums import OpKind
from retime.collectors.synth import synthesize
from retime.collectors.synth.layers import padded_vocab
from retime.collectors.synth.memory import layer_activation_bytes
from retime.collectors.synth.models import resolve_model
from retime.collectors.synth.parallel import ParallelConfig

ROOT = Path(__file__).resolve().parent.parent
# a small Llama: gated MLP, RMSNorm, rotary embeddings, grouped-query attention
MODEL = {"name": "llama-h1024", "hidden": 1024, "ffn": 3584, "heads": 16, "kv_heads": 4,
         "layers": 4, "seq": 1024, "vocab": 32000, "gated_mlp": True, "norm": "rmsnorm",
         "positions": "rotary", "dropout": False, "tied_embeddings": False,
         "attention": "flash"}
BASE = dict(tp=1, pp=1, dp=1, global_batch=2, micro_batch=2, dtype="bf16")
T = 2 * 1024  # tokens per micro-batch


def _synth(**kw):
    return synthesize(MODEL, "h100-sxm", expand="unique", check_memory=False,
                      **{**BASE, **kw})


def _ops(tr, name):
    o = tr.ops[(tr.ops["rank"] == 0) & (tr.names() == name)]
    assert len(o), name
    return o


@pytest.mark.parametrize("name,per_elem,elems", [
    # torchtitan's eager code, kernel by kernel (collectors/synth/framework.py)
    ("attn.norm.fwd", 36, T * 1024),          # to fp32, pow, mean, mul, to bf16, x weight
    ("mlp.norm.bwd", 76, T * 1024),
    ("attn.rotary.fwd", 20, T * (1024 + 256)),  # Q and K: to fp32, complex mul, to bf16
    ("mlp.act.fwd", 10, T * 3584),            # silu, product
    ("mlp.act.bwd", 18, T * 3584),
    ("head.cross_entropy.fwd", 14, T * padded_vocab(resolve_model(MODEL), 1)),
    ("head.cross_entropy.bwd", 22, T * padded_vocab(resolve_model(MODEL), 1)),
])
def test_eager_ops_move_the_bytes_of_torchtitans_unfused_kernels(name, per_elem, elems):
    eager = _ops(_synth(eager=True), name)
    assert (eager["bytes"] == per_elem * elems).all()
    fused = _ops(_synth(), name)
    assert (eager["dur_ns"].to_numpy() > fused["dur_ns"].to_numpy()).all()


def test_compile_blocks_leaves_rotary_and_the_head_eager_and_fuses_the_rest():
    """torchtitan's per-block torch.compile (R7 commit): the complex rotary embedding (and
    its recompute under op-level checkpointing), the final norm and the loss move the eager
    bytes; the blocks' norms and SwiGLU products keep the fused bytes."""
    vocab = padded_vocab(resolve_model(MODEL), 1)
    cb, eager, fused = (_synth(recompute="op", **kw) for kw in (
        dict(compile_blocks=True), dict(eager=True), {}))
    for name in ("attn.rotary.fwd", "attn.rotary.bwd", "recompute.attn.rotary.fwd",
                 "head.norm.fwd", "head.norm.bwd", "head.cross_entropy.fwd",
                 "head.cross_entropy.bwd"):
        np.testing.assert_array_equal(_ops(cb, name)["bytes"], _ops(eager, name)["bytes"])
        assert (_ops(cb, name)["dur_ns"].to_numpy()
                > _ops(fused, name)["dur_ns"].to_numpy()).all()
    assert (_ops(cb, "attn.rotary.fwd")["bytes"] == 20 * T * (1024 + 256)).all()
    assert (_ops(cb, "recompute.attn.rotary.fwd")["bytes"] == 20 * T * 256).all()
    assert (_ops(cb, "head.cross_entropy.fwd")["bytes"] == 14 * T * vocab).all()
    for name in ("attn.norm.fwd", "mlp.norm.bwd", "mlp.act.fwd", "mlp.act.bwd",
                 "recompute.mlp.norm.fwd"):
        np.testing.assert_array_equal(_ops(cb, name)["bytes"], _ops(fused, name)["bytes"])
        np.testing.assert_array_equal(_ops(cb, name)["dur_ns"], _ops(fused, name)["dur_ns"])
    steps = [t.meta["synth"]["step_time_ns"] for t in (fused, cb, eager)]
    assert steps[0] < steps[1] < steps[2]


def test_compile_blocks_and_eager_exclude_each_other():
    from retime.collectors.errors import ConfigError
    with pytest.raises(ConfigError, match="eager and compile_blocks"):
        ParallelConfig(eager=True, compile_blocks=True)


def test_eager_leaves_matmuls_attention_and_communication_alone():
    a, b = _synth(), _synth(eager=True)
    na, nb = a.names(), b.names()
    assert list(na) == list(nb)  # the same ops, in the same order
    same = np.array([n.endswith((".fwd", ".bwd_dgrad", ".bwd_wgrad")) and any(
        k in n for k in ("qkv", "proj", "fc1", "fc2", "logits", "flash")) for n in na])
    assert same.sum() > 20
    np.testing.assert_array_equal(a.ops["dur_ns"].to_numpy()[same],
                                  b.ops["dur_ns"].to_numpy()[same])
    assert b.meta["synth"]["step_time_ns"] > a.meta["synth"]["step_time_ns"]


def test_op_recompute_reruns_every_second_matmul_and_the_non_matmul_ops():
    """torchtitan's Llama layer runs wq, wk, wv, wo, w1, w3, w2: the 2nd, 4th and 6th are
    recomputed (K: [T, kv] x [kv, h], wo: h x h, w3: ffn x h), with both norms, K's rotary
    embedding and the SwiGLU product; FLOPs 2 T h (kv + h + ffn) per layer and
    micro-batch."""
    tr = _synth(recompute="op")
    o = tr.ops[tr.ops["rank"] == 0]
    names = tr.names()[o.index]
    rec = sorted({n for n in names if n.startswith("recompute.")})
    assert rec == sorted(["recompute.attn.norm.fwd", "recompute.attn.k.fwd",
                          "recompute.attn.rotary.fwd", "recompute.attn.proj.fwd",
                          "recompute.mlp.norm.fwd", "recompute.mlp.fc1_up.fwd",
                          "recompute.mlp.act.fwd"])
    per_layer = 2.0 * T * 1024 * (256 + 1024 + 3584)
    mm = o[np.isin(names, ["recompute.attn.k.fwd", "recompute.attn.proj.fwd",
                           "recompute.mlp.fc1_up.fwd"])]
    assert mm["flops"].sum() == pytest.approx(4 * per_layer)
    assert (o[names == "recompute.attn.norm.fwd"]["phase"] == 1).all()  # in the backward
    # between Megatron's selective (nothing to redo with flash attention) and full
    steps = [_synth(recompute=r).meta["synth"]["step_time_ns"]
             for r in ("selective", "op", "full")]
    assert steps[0] < steps[1] < steps[2]


def test_op_recompute_keeps_fewer_activations():
    """Not kept with op-level checkpointing: the two norm outputs (2 x 2 B per token and
    hidden unit), K (2 B x kv width), the w3 output and the SwiGLU product (2 x 2 B x
    ffn)."""
    m = resolve_model(MODEL)
    s, b, h, f, kv = 1024, 2, 1024, 3584, 256
    sel = layer_activation_bytes(m, ParallelConfig(**BASE, recompute="selective"))
    op = layer_activation_bytes(m, ParallelConfig(**BASE, recompute="op"))
    assert sel - op == s * b * (4 * h + 2 * kv + 4 * f)


def test_cli_eager_op_and_seq(tmp_path, capsys):
    out = tmp_path / "r.retime"
    args = ["synth", "--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", "1", "--pp",
            "1", "--dp", "2", "--fsdp", "--global-batch", "2", "--micro-batch", "1",
            "--seq", "2048", "--recompute", "op", "--eager", "-o", str(out), "--json"]
    assert run(args) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["parallel"]["eager"] is True and s["parallel"]["recompute"] == "op"
    assert s["tokens_per_s"] * s["step_time_ns"] / 1e9 == pytest.approx(2 * 2048, rel=1e-6)
    bad = args[:-3] + ["--cp", "3", "-o", str(tmp_path / "b.retime")]
    assert run(bad) == 2
    assert "cp=3 does not divide seq=2048" in capsys.readouterr().err


def _bench():
    spec = importlib.util.spec_from_file_location("synth_recipes",
                                                  ROOT / "bench" / "synth_recipes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("rid", ["TT-T1 FSDP", "TT-T1 +Float8"])
def test_recipe_bench_prints_the_command_it_predicts(rid, tmp_path, capsys, monkeypatch):
    """The command a bench row prints gives the step time the bench reports."""
    bench = _bench()
    row = next(r for r in bench.ROWS if r[0] == rid)
    opts = row[7]
    cmd = bench.command(opts).split()
    assert cmd[:2] == ["retime", "synth"]
    cmd = cmd[1:-3] + ["-o", str(tmp_path / "r.retime"), "--json"]
    monkeypatch.chdir(ROOT)  # the hardware file's path is relative to the repository
    assert run(cmd) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["step_time_ns"] == bench.predict(opts)["step_time_ns"]
    assert "--fsdp" in cmd and "op" in cmd
    assert ("--eager" in cmd) == (rid == "TT-T1 FSDP")
    assert ("tensorwise" in cmd) == (rid == "TT-T1 +Float8")
    assert ("--compile-blocks" in cmd) == (rid == "TT-T1 +Float8")


def _template(**kw):
    from retime.collectors.synth import CommModel, load_hardware, model_template
    from retime.collectors.synth.parallel import resolve_parallel
    hw = load_hardware("h100-sxm")
    par = resolve_parallel(None, **{**BASE, "tp": 2, "sequence_parallel": True, **kw})
    return model_template(resolve_model(MODEL), hw, par, CommModel(hw, par)), hw


def test_tp_comm_overlap_runs_each_gather_beside_its_gemm():
    """Sequence parallelism, TP 2: the all-gather before QKV / FC1 and the reduce-scatter
    after the projection / FC2 run beside their GEMMs; the pair costs the longer op plus
    (1 - overlap) of the shorter's hidden part, and one piece (1/tp) of the collective stays
    exposed (collectors/synth/framework.py)."""
    plain, hw = _template()
    over, _ = _template(tp_comm_overlap=True)
    f = hw.overlap_efficiency
    p, o = plain.layers[0].fwd, over.layers[0].fwd
    pn, on = [x.name for x in p], [x.name for x in o]
    assert pn.count("tp.allgather") == on.count("tp.allgather") == 2
    assert on.count("tp.wait") == 4 and pn.count("tp.wait") == 0
    for gather, gemm in (("tp.allgather", "attn.qkv.fwd"), ("tp.allgather", "mlp.fc1.fwd")):
        k = on.index(gemm)
        assert on[k - 1] == gather and on[k + 1] == "tp.wait"
        assert o[k].deps == (-2,) and o[k + 1].deps == (-1, -2)
        c = next(x for i, x in enumerate(p) if x.name == gather and pn[i + 1] == gemm)
        g = p[pn.index(gemm)]
        exposed = c.dur_ns // 2
        hidden = c.dur_ns - exposed
        if hidden <= g.dur_ns:  # the longer op is stretched by (1 - f) of the shorter
            assert o[k].dur_ns == int(g.dur_ns + (1 - f) * hidden)
            assert o[k - 1].dur_ns == c.dur_ns
        else:
            assert o[k].dur_ns == g.dur_ns
            assert o[k - 1].dur_ns == int(hidden + (1 - f) * g.dur_ns) + exposed
    k = on.index("mlp.fc2.fwd")
    assert on[k + 1] == "tp.reduce_scatter" and o[k + 1].deps == (-2,)


def test_tp_comm_overlap_is_faster_and_keeps_the_trace_consistent():
    kw = dict(BASE, tp=2, sequence_parallel=True, global_batch=4, micro_batch=1)
    a = synthesize(MODEL, "h100-sxm", expand="all", **kw)
    b = synthesize(MODEL, "h100-sxm", expand="all", tp_comm_overlap=True, **kw)
    b.validate()
    o, e = b.ops, b.edges
    end = (o["start_ns"] + o["dur_ns"]).to_numpy()
    assert (o["start_ns"].to_numpy()[e["dst"].to_numpy()] >= end[e["src"].to_numpy()]).all()
    assert b.meta["synth"]["step_time_ns"] < a.meta["synth"]["step_time_ns"]
    r0 = o[o["rank"] == 0]
    names = b.names()[r0.index]
    gather = r0[names == "tp.allgather"]["start_ns"].to_numpy()
    qkv = r0[names == "attn.qkv.fwd"]["start_ns"].to_numpy()
    assert np.isin(qkv, gather).all()  # each QKV GEMM starts with its gather


def test_tp_comm_overlap_needs_sequence_parallelism(tmp_path, capsys):
    with pytest.raises(Exception, match="tp_comm_overlap overlaps the all-gathers"):
        _synth(tp=2, tp_comm_overlap=True)
    args = ["synth", "--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", "2", "--pp",
            "1", "--dp", "1", "--global-batch", "1", "--micro-batch", "1",
            "--tp-comm-overlap", "-o", str(tmp_path / "r.retime")]
    assert run(args) == 2
    assert "--sequence-parallel" in capsys.readouterr().err


@pytest.mark.parametrize("kw", [
    dict(cp=2, recompute="op", schedule="1f1b", pp=2),
    dict(recompute="full", schedule="zb-h1", pp=2, eager=True),
    dict(recompute="selective", schedule="interleaved", pp=2, chunks=2, fsdp=True),
    dict(recompute="full", schedule="interleaved", pp=2, chunks=2, fsdp=True, dp=2,
         global_batch=8),
    dict(schedule="dualpipe", pp=2, fsdp=True, dp=2, global_batch=8),
])
def test_new_options_together_give_a_consistent_trace(kw):
    """Every edge of the trace runs forward in time and every collective's members start
    together, with the three options on across CP, split backwards and interleaving."""
    args = dict(BASE, tp=2, dp=1, sequence_parallel=True, tp_comm_overlap=True,
                global_batch=4, micro_batch=1)
    args.update(kw)
    tr = synthesize({**MODEL, "layers": 8}, "h100-sxm", expand="all", check_memory=False,
                    **args)
    tr.validate()
    o, e = tr.ops, tr.edges
    end = (o["start_ns"] + o["dur_ns"]).to_numpy()
    assert (o["start_ns"].to_numpy()[e["dst"].to_numpy()] >= end[e["src"].to_numpy()]).all()
    # pipeline send/receive pairs start each when ready, as measured ones
    c = o[(o["coll_id"] >= 0) & (o["kind"] != int(OpKind.P2P))].groupby("coll_id")
    assert (c["start_ns"].nunique() == 1).all()


def test_tensorwise_fp8_casts_both_operands_with_an_amax_pass():
    """torchao's tensorwise Float8 (``--fp8-scaling tensorwise``): every GEMM casts both of
    its operands from 16 bits, an amax pass (2 bytes read per element) and a cast pass (2
    read, 1 written): 5 x (m k + k n) bytes, against the fused recipe's 3 x m k; the cost
    op prints what the synthesizer charges."""
    from retime.collectors.costs import kernels as K
    from retime.collectors.costs.gpus import gpu_spec
    from retime.collectors.synth.costs import gemm
    from retime.collectors.synth.hardware import load_hardware
    g = gpu_spec("h100-sxm")
    m, n, k = 8192, 4096, 14336
    ceil = g.training_ceiling("fp8")
    fused = K.matmul(g, m, n, k, dtype="fp8", ceiling=ceil, quantize=True)
    tw = K.matmul(g, m, n, k, dtype="fp8", ceiling=ceil, quantize=True, scaling="tensorwise")
    q = {r: us for r, us in fused.parts}["quantize"]
    qt = {r: us for r, us in tw.parts}["quantize"]
    assert qt / q == pytest.approx(5 * (m * k + k * n) / (3 * m * k), rel=1e-9)
    assert tw.time_us - qt == pytest.approx(fused.time_us - q, rel=1e-9)  # same GEMM
    hw = load_hardware("h100-sxm")
    assert gemm(hw, "fp8", m, n, k, scaling="tensorwise").dur_ns == round(tw.time_us * 1e3)
    with pytest.raises(Exception, match="FP8 recipe"):
        K.matmul(g, m, n, k, dtype="bf16", quantize=True, scaling="tensorwise")


def test_tensorwise_fp8_in_synth_is_slower_and_keeps_16_bit_inputs(tmp_path, capsys):
    fused = _synth(dtype="fp8").meta["synth"]
    tw = _synth(dtype="fp8", fp8_scaling="tensorwise").meta["synth"]
    assert tw["step_time_ns"] > fused["step_time_ns"]
    assert tw["peak_memory_bytes"] > fused["peak_memory_bytes"]  # 16-bit saved inputs
    with pytest.raises(Exception, match="it is an FP8 recipe"):
        _synth(fp8_scaling="tensorwise")
    args = ["synth", "--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", "1", "--pp",
            "1", "--dp", "1", "--global-batch", "1", "--micro-batch", "1",
            "--fp8-scaling", "tensorwise", "-o", str(tmp_path / "r.retime")]
    assert run(args) == 2
    err = capsys.readouterr().err
    assert "--dtype fp8" in err and len(err.strip().splitlines()) == 1


def test_recipe_bench_parts_split_the_step():
    """``--parts`` counts exactly the flash-attention kernels as attention: on Table 1's
    eager FSDP row (op-level checkpointing saves the attention output, so nothing is
    recomputed) that is 32 layers of one causal forward and one backward kernel as the
    cost layer prices them, and the four compute parts plus idle make the step."""
    from retime.collectors.costs.kernels import attention
    from retime.collectors.synth.costs import _spec
    bench = _bench()
    opts = next(r for r in bench.ROWS if r[0] == "TT-T1 FSDP")[7]
    tr = bench.run(opts)
    p = bench.parts(tr)
    hw = bench.read_hardware_file(ROOT / opts["hardware_file"])
    one = sum(attention(_spec(hw), 2, 32, 8192, 128, kv_heads=8, causal=True,
                        backward=bwd).time_us for bwd in (False, True))
    assert p["attention"] == pytest.approx(32 * one / 1e3, rel=1e-3)
    assert p["attention"] + p["gemm"] + p["other"] + p["idle"] == pytest.approx(p["step"])
    assert 0 < p["idle"] < 0.01 * p["step"]  # one node: FSDP's traffic hides but the first gather
    assert p["comm"] > 0
