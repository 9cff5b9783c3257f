"""PyTorch FSDP2's staging copies and reduce dtype in the synthesizer (``--fsdp``;
collectors/synth/fsdp.py, REFERENCES.md R22)."""

from __future__ import annotations

import numpy as np
import pytest

from retime.collectors.errors import ConfigError
from retime.collectors.synth import synthesize

KW = dict(tp=1, pp=1, dp=8, global_batch=8, micro_batch=1, expand="unique",
          check_memory=False)


def _ops(**kw):
    if kw.get("fsdp") and "fsdp_impl" not in kw:
        kw = {**kw, "fsdp_impl": "fsdp2"}
    tr = synthesize("llama3-8b", "h100-sxm", **{**KW, **kw})
    o = tr.ops
    return o, tr.names()[o.index.to_numpy()], tr.meta["synth"]


def _by_layer(o, names, name):
    sel = names == name
    return dict(zip(o["layer"].to_numpy()[sel].tolist(), o["bytes"].to_numpy()[sel].tolist()))


def test_copy_out_after_every_gather_and_copy_in_before_every_reduce_scatter():
    o, names, _ = _ops(fsdp=True)
    gathers = np.isin(names, ["zero3.allgather_params", "zero3.allgather_params.bwd"])
    outs = names == "fsdp.all_gather_copy_out"
    assert gathers.sum() == outs.sum() > 0
    lane = o["lane"].to_numpy()
    assert len(set(lane[outs].tolist())) == 1  # all on one lane: the compute lane
    assert set(lane[outs].tolist()) == set(lane[names == "attn.flash.fwd"].tolist())
    # copy-out reads the gathered buffer and writes the parameters: 2 x the gathered bytes
    ag = _by_layer(o, names, "zero3.allgather_params")
    co = {}
    for lay, b in zip(o["layer"].to_numpy()[outs], o["bytes"].to_numpy()[outs]):
        co.setdefault(int(lay), set()).add(int(b))
    for lay, b in ag.items():
        assert co[lay] == {2 * b}
    # copy-in: 16-bit gradient read (2 bytes) + fp32 reduce-scatter input written (4 bytes);
    # the reduce-scatter moves 4 bytes per parameter
    rs = _by_layer(o, names, "zero3.reduce_scatter_grads")
    ci = _by_layer(o, names, "fsdp.reduce_scatter_copy_in")
    assert rs.keys() == ci.keys() == ag.keys()
    for lay in rs:
        params = ag[lay] // 2
        assert rs[lay] == 4 * params
        assert ci[lay] == 6 * params
    # each reduce-scatter starts after its copy-in ends
    start, dur = o["start_ns"].to_numpy(), o["dur_ns"].to_numpy()
    lay_ = o["layer"].to_numpy()
    for lay in rs:
        i = np.flatnonzero((names == "fsdp.reduce_scatter_copy_in") & (lay_ == lay))[0]
        j = np.flatnonzero((names == "zero3.reduce_scatter_grads") & (lay_ == lay))[0]
        assert start[j] >= start[i] + dur[i]


def test_bf16_reduce_halves_the_reduce_scatter_and_shrinks_the_copy_in():
    o, names, s32 = _ops(fsdp=True)
    o16, names16, s16 = _ops(fsdp=True, fsdp_reduce_dtype="bf16")
    ag = _by_layer(o16, names16, "zero3.allgather_params")
    rs32 = _by_layer(o, names, "zero3.reduce_scatter_grads")
    rs16 = _by_layer(o16, names16, "zero3.reduce_scatter_grads")
    ci16 = _by_layer(o16, names16, "fsdp.reduce_scatter_copy_in")
    for lay in rs16:
        assert 2 * rs16[lay] == rs32[lay]
        assert ci16[lay] == 4 * (ag[lay] // 2)
    assert s16["step_time_ns"] <= s32["step_time_ns"]


def test_copies_cost_compute_time_and_odc_has_none():
    o, names, s = _ops(fsdp=True)
    comp = names == "fsdp.all_gather_copy_out"
    assert (o["dur_ns"].to_numpy()[comp] > 0).all()
    od, names_odc, _ = _ops(fsdp=True, odc=True)
    assert not any(n.startswith("fsdp.") for n in names_odc)
    # ZeRO-3 without --fsdp (DeepSpeed / Megatron) has no FSDP2 staging copies either
    oz, names_z, _ = _ops(zero=3)
    assert not any(n.startswith("fsdp.") for n in names_z)
    rz = _by_layer(oz, names_z, "zero3.reduce_scatter_grads")
    ag = _by_layer(oz, names_z, "zero3.allgather_params")
    # bf16 run: Megatron-LM reduces fp32 main gradients (REFERENCES.md R51), twice the
    # 16-bit gather; with --grad-reduce-dtype bf16 the same bytes as the gather
    assert all(rz[k] == 2 * ag[k] for k in rz)
    oz16, names_z16, _ = _ops(zero=3, grad_reduce_dtype="bf16")
    rz16 = _by_layer(oz16, names_z16, "zero3.reduce_scatter_grads")
    assert rz16.keys() == rz.keys() and all(rz16[k] == ag[k] for k in rz16)


def test_default_fsdp_is_megatron_without_staging_copies():
    """Plain --fsdp (Megatron-Core's FSDP): no copies; the reduce-scatter in the main
    gradients' dtype (bf16 run: fp32 by Megatron-LM's rule, R51; 16 bits as stated)."""
    o, names, s = _ops(fsdp=True, fsdp_impl="megatron", grad_reduce_dtype="bf16")
    assert not any(n.startswith("fsdp.") for n in names)
    rs = _by_layer(o, names, "zero3.reduce_scatter_grads")
    ag = _by_layer(o, names, "zero3.allgather_params")
    assert rs and all(rs[k] == ag[k] for k in rs)
    o2, _, s2 = _ops(fsdp=True)
    assert s2["step_time_ns"] > s["step_time_ns"]  # FSDP2's copies and fp32 reduce cost
    with pytest.raises(ConfigError, match="needs fsdp"):
        synthesize("llama3-8b", "h100-sxm", fsdp_impl="fsdp2", **KW)


def test_bad_reduce_dtype_is_refused():
    with pytest.raises(ConfigError, match="fsdp_reduce_dtype='fp16'"):
        synthesize("llama3-8b", "h100-sxm", fsdp=True, fsdp_reduce_dtype="fp16",
                   **{k: v for k, v in KW.items()})


def test_p4de_profile_is_the_a100_profile_with_400_gbps_efa():
    """bench/data/aws-p4de.toml (REFERENCES R23): only the network differs from a100-80gb,
    4 x 100 Gb/s per 8 GPUs, so an FSDP step that crosses nodes is slower on it."""
    from pathlib import Path

    from retime.collectors.synth import load_hardware, read_hardware_file
    p4 = read_hardware_file(Path(__file__).resolve().parent.parent / "bench/data/aws-p4de.toml")
    a = load_hardware("a100-80gb")
    assert p4.peak_tflops == a.peak_tflops and p4.hbm_gbps == a.hbm_gbps
    assert p4.memory_gib == a.memory_gib and p4.gpus_per_node == a.gpus_per_node
    kw = dict(tp=1, pp=1, dp=16, fsdp=True, global_batch=16, micro_batch=1, expand="unique",
              check_memory=False)
    t_dgx = synthesize("llama2-13b", a, **kw).meta["synth"]["step_time_ns"]
    t_p4 = synthesize("llama2-13b", p4, **kw).meta["synth"]["step_time_ns"]
    assert t_p4 > t_dgx


def test_pipelined_fsdp2_accumulates_in_the_reduce_dtype():
    """Under a pipeline FSDP2 reduces once, after the last backward; every backward adds its
    16-bit gradients into an unsharded accumulator of the reduce dtype (fp32: 2 + 4 read, 4
    written per parameter), which the memory model holds: 2 more bytes per parameter than a
    16-bit accumulator."""
    kw = dict(tp=1, pp=2, dp=2, fsdp=True, global_batch=8, micro_batch=1)
    o, names, s32 = _ops(**kw)
    o16, names16, s16 = _ops(fsdp_reduce_dtype="bf16", **kw)
    rank0 = o["rank"].to_numpy() == o["rank"].min()
    acc = (names == "fsdp.accumulate_grads") & rank0
    m = 8 // (1 * 2)  # micro-batches per pipeline
    layers0 = set(o["layer"].to_numpy()[rank0 & (names == "attn.flash.bwd")].tolist())
    assert acc.sum() == m * (len(layers0) + 1)  # each layer and the embedding, each backward
    ag = _by_layer(o, names, "zero3.allgather_params")  # once per step under a pipeline
    accb = _by_layer(o, names, "fsdp.accumulate_grads")
    acc16 = _by_layer(o16, names16, "fsdp.accumulate_grads")
    for lay in layers0:
        params = ag[lay] // 2
        assert accb[lay] == 10 * params and acc16[lay] == 6 * params
    assert (names[rank0] == "zero3.reduce_scatter_grads").sum() == len(layers0) + 1
    # memory: the fp32 accumulator holds 2 more bytes per parameter of the stage
    d = s32["peak_memory_bytes"] - s16["peak_memory_bytes"]
    gsel = names == "zero3.allgather_params"
    ranks = o["rank"].to_numpy()
    stage_params = [int(o["bytes"].to_numpy()[gsel & (ranks == r)].sum()) // 2
                    for r in np.unique(ranks)]
    assert d in [2 * p for p in stage_params]  # the peak stage's parameters, 2 bytes each
    # no accumulator without a pipeline: each backward reduce-scatters
    o1, names1, _ = _ops(fsdp=True)
    assert not (names1 == "fsdp.accumulate_grads").any()


@pytest.mark.parametrize("impl", ["fsdp2", "megatron"])
def test_optimizer_waits_for_the_last_reduce_scatter(impl):
    """The optimizer step reads the reduced gradients: its first kernel starts no earlier
    than the end of the last FSDP reduce-scatter (it used to start beside the embedding's,
    reading gradients not yet reduced), and the step ends with the optimizer."""
    o, names, s = _ops(fsdp=True, fsdp_impl=impl, global_batch=16)
    end = (o["start_ns"] + o["dur_ns"]).to_numpy()
    rs = names == "zero3.reduce_scatter_grads"
    opt = np.char.startswith(names.astype(str), "optimizer.")
    assert rs.sum() > 0 and opt.sum() > 0
    assert o["start_ns"].to_numpy()[opt].min() >= end[rs].max()
    assert end[opt].max() == end.max()
