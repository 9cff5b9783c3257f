"""Structure of synthesized traces: ranks, lanes, collectives, p2p, edges, timing, errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from retime.collectors.enums import CommOp, EdgeKind, OpKind, Phase
from retime.collectors.errors import ConfigError
from retime.collectors.synth import (
    LANES,
    ParallelConfig,
    model_names,
    read_model_file,
    synthesize,
)
from retime.collectors.trace import read_trace

SMALL = dict(hidden=1024, ffn=4096, heads=16, layers=8, seq=1024, vocab=32000,
             attention="unfused")


@pytest.fixture(scope="module")
def tr3d():
    """tp=2, pp=2, dp=2, 1F1B, 4 micro-batches per pipeline, selective + SP."""
    return synthesize(SMALL, "a100-80gb", tp=2, pp=2, dp=2, global_batch=8, micro_batch=1,
                      sequence_parallel=True, recompute="selective")


def _end(o):
    return o["start_ns"].to_numpy() + o["dur_ns"].to_numpy()


def test_ranks_lanes_and_meta(tr3d):
    o = tr3d.ops
    assert sorted(np.unique(o["rank"]).tolist()) == list(range(8))
    s = tr3d.meta["synth"]
    assert s["world_size"] == 8 == tr3d.world_size
    for k in ("step_time_ns", "tokens_per_s", "mfu", "peak_memory_bytes", "memory", "model",
              "hardware", "parallel", "op_class_ns"):
        assert k in s
    # tokens/s is exactly tokens per step over the step time
    assert s["tokens_per_s"] == pytest.approx(8 * 1024 / (s["step_time_ns"] / 1e9))
    # every rank spans the step; identical ranks (same stage) have identical timelines
    span = tr3d.step_times_ns()
    assert span["span_ns"].max() == s["step_time_ns"]
    for stage in (0, 1):
        rs = [r for r in range(8) if r // 4 == stage]
        ref = o[o["rank"] == rs[0]]["start_ns"].to_numpy()
        for r in rs[1:]:
            assert np.array_equal(o[o["rank"] == r]["start_ns"].to_numpy(), ref)
    # lanes: compute + tp + dp on all; pp send/recv on both stages
    names = set(tr3d.lanes["name"])
    assert {"compute stream", "tp stream", "dp stream", "pp_send stream",
            "pp_recv stream"} <= names


def test_collectives_share_coll_id_across_group(tr3d):
    o = tr3d.ops
    groups = {int(g): set(r) for g, r in zip(tr3d.groups["group_id"], tr3d.groups["ranks"])}
    c = o[o["kind"] == int(OpKind.COLLECTIVE)]
    assert (c["coll_id"] >= 0).all() and (c["group_id"] >= 0).all()
    for _, g in c.groupby("coll_id"):
        members = set(g["rank"].tolist())
        assert len(members) == len(g)  # one member per rank
        assert members == groups[int(g["group_id"].iloc[0])]
        assert g["group_id"].nunique() == 1 and g["bytes"].nunique() == 1
        assert g["comm_op"].nunique() == 1 and g["start_ns"].nunique() == 1
    tp = c[c["lane"] % len(LANES) == 1]
    assert (tp.groupby("coll_id").size() == 2).all()
    norm = tr3d.names()[c.index] == "optimizer.grad_norm_allreduce"
    dp = c[(c["lane"] % len(LANES) == 3).to_numpy() & ~norm]
    assert len(dp) and (dp.groupby("coll_id").size() == 2).all()
    assert set(dp["comm_op"]) == {int(CommOp.ALL_REDUCE)}
    # the optimizer's gradient-norm all-reduce: one per replica, over its 2 stages x 2
    # tensor ranks (rank = (stage * dp + d) * tp + t)
    gn = c[norm]
    assert len(gn) == 8 and gn["coll_id"].nunique() == 2
    for _, g in gn.groupby("coll_id"):
        d = {(r // 2) % 2 for r in g["rank"]}
        assert len(g) == 4 and len(d) == 1


def test_p2p_pairs_share_one_instance(tr3d):
    """A send and its receive are one two-member instance, as measured p2p pairs
    (collectors/oplevel.py): one coll_id, each member starting when its rank is ready, no
    send -> receive edge."""
    o = tr3d.ops
    p = o[o["kind"] == int(OpKind.P2P)]
    assert (p["coll_id"] >= 0).all()
    # forward activations and backward gradients: 4 micro-batches x 2 directions x 4 replicas
    assert p["coll_id"].nunique() == 4 * 2 * 4 == len(p) // 2
    assert not (tr3d.edges["kind"] == int(EdgeKind.P2P)).any()
    assert tr3d.meta["synth"]["p2p_pairs"] == "instances"
    assert tr3d.meta["collectives"]["matched"] == int(o.loc[o["coll_id"] >= 0, "coll_id"]
                                                      .nunique())
    for _, g in p.groupby("coll_id"):
        assert sorted(g["comm_op"]) == [int(CommOp.SEND), int(CommOp.RECV)]
        snd = g[g["comm_op"] == int(CommOp.SEND)].iloc[0]
        rcv = g[g["comm_op"] == int(CommOp.RECV)].iloc[0]
        assert (snd["peer"], rcv["peer"]) == (rcv["rank"], snd["rank"])
        assert snd["microbatch"] == rcv["microbatch"] and snd["phase"] == rcv["phase"]
        # forward goes one stage down the pipeline, backward one stage up
        assert rcv["stage"] - snd["stage"] == (1 if snd["phase"] == int(Phase.FWD) else -1)
    # as measured kernels: each member starts when ready, the one that waited ends with the
    # other, so after the later start every pair takes the same modeled transfer time (the
    # same activations or gradients each way)
    end = p["start_ns"] + p["dur_ns"]
    tail = end - p.groupby("coll_id")["start_ns"].transform("max")
    assert (tail.groupby([p["comm_op"], p["phase"]]).nunique() == 1).all()
    assert (p.groupby("coll_id")["start_ns"].nunique() == 2).any()  # some member waited
    # ... so the replay finds no unexplained delay on them (it did: one per pair)
    from retime.replay.graph import build_graph
    g = build_graph(tr3d)
    delay = np.zeros(len(o), np.int64)
    delay[g.perm] = g.measured_delay_layout_ns
    assert not delay[p.index.to_numpy()].any()
    # every edge is respected by the timing
    e = tr3d.edges
    end = _end(o)
    assert (o["start_ns"].to_numpy()[e["dst"].to_numpy()]
            >= end[e["src"].to_numpy()] + e["lag_ns"].to_numpy()).all()


def test_p2p_pair_costs_and_the_receiver_waits_for_the_data():
    """Two stages of 4 layers, send 700 ns, receive 50 ns once arrived: every pair's send
    ends 700 ns after the later member's start and its receive 50 ns after the send; the
    receiving stage's first forward starts when its receive ends, 750 ns after stage 0's
    forward of micro-batch 0 (4 x 1,500 ns), not earlier (a receive that only started with
    its send would let it go on before the data arrived)."""
    from retime.collectors.synth import CommModel, build_trace, load_hardware
    from retime.collectors.synth.builder import LayerTemplate, OpTemplate, StepTemplate
    layer = LayerTemplate((OpTemplate("fwd", "compute", 1500),),
                          (OpTemplate("bwd", "compute", 2500),))
    tpl = StepTemplate(layers=(layer,) * 8, optimizer_kernels=(), p2p_bytes=1 << 20)
    par = ParallelConfig(pp=2, global_batch=4)
    t = build_trace(tpl, par, CommModel(load_hardware("a100-80gb"), par), p2p_ns=700,
                    recv_ns=50)
    o = t.ops
    p = o[o["kind"] == int(OpKind.P2P)]
    assert len(p) == 2 * 2 * 4 and (p.groupby("coll_id").size() == 2).all()
    for _, g in p.groupby("coll_id"):
        snd = g[g["comm_op"] == int(CommOp.SEND)].iloc[0]
        rcv = g[g["comm_op"] == int(CommOp.RECV)].iloc[0]
        both = max(snd["start_ns"], rcv["start_ns"])
        assert snd["start_ns"] + snd["dur_ns"] - both == 700
        assert rcv["start_ns"] + rcv["dur_ns"] - (snd["start_ns"] + snd["dur_ns"]) == 50
    fwd1 = (o["rank"].to_numpy() == 1) & (np.asarray(t.names()) == "fwd")
    assert int(o["start_ns"].to_numpy()[fwd1].min()) == 4 * 1500 + 700 + 50


def test_dualpipe_p2p_falls_back_to_edges():
    """DualPipe orders its two directions' sends and receives on one FIFO lane each way;
    start-together pairs would deadlock, so each receive waits for its send (edge) and the
    meta says so (pp=8 here; pp=2 and 4 order them consistently and pair as instances)."""
    t = synthesize(SMALL, "a100-80gb", tp=1, pp=8, dp=1, global_batch=16, micro_batch=1,
                   schedule="dualpipe")
    o, e = t.ops, t.edges
    p = o[o["kind"] == int(OpKind.P2P)]
    assert t.meta["synth"]["p2p_pairs"] == "edges" and (p["coll_id"] == -1).all()
    pe = e[e["kind"] == int(EdgeKind.P2P)]
    assert 2 * len(pe) == len(p)
    src, dst = o.iloc[pe["src"].to_numpy()], o.iloc[pe["dst"].to_numpy()]
    assert (src["comm_op"].to_numpy() == int(CommOp.SEND)).all()
    assert (dst["comm_op"].to_numpy() == int(CommOp.RECV)).all()
    assert np.array_equal(src["peer"].to_numpy(), dst["rank"].to_numpy())


def test_lanes_are_fifo_without_overlap(tr3d):
    o = tr3d.ops.sort_values(["lane", "op_id"])
    same = o["lane"].to_numpy()[1:] == o["lane"].to_numpy()[:-1]
    end = _end(o)
    assert (o["start_ns"].to_numpy()[1:][same] >= end[:-1][same]).all()


def test_tags_counts_and_flops(tr3d):
    o = tr3d.ops
    r0 = o[o["rank"] == 0]
    # stage 0 holds layers 0-3; each runs one forward QKV GEMM per micro-batch
    qkv = r0[tr3d.names()[r0.index] == "attn.qkv.fwd"]
    assert sorted(qkv["layer"].unique().tolist()) == [0, 1, 2, 3]
    assert len(qkv) == 4 * 4
    assert (qkv["phase"] == int(Phase.FWD)).all()
    # QKV flops on one TP rank: 2 * tokens * h * 3h / tp
    assert qkv["flops"].iloc[0] == pytest.approx(2 * 1024 * 1024 * 3 * 1024 / 2)
    opt = r0[r0["phase"] == int(Phase.OPT)]
    on_compute = (opt["lane"] % len(LANES) == 0).to_numpy()
    # optimizer kernels on the compute stream, after one gradient-norm all-reduce
    assert list(tr3d.names()[opt.index[~on_compute]]) == ["optimizer.grad_norm_allreduce"]
    # selective recompute re-runs the attention scores once per layer and micro-batch
    rec = r0[tr3d.names()[r0.index] == "recompute.attn.scores.fwd"]
    assert len(rec) == 16 and (rec["phase"] == int(Phase.BWD)).all()


def test_save_roundtrip(tr3d, tmp_path):
    p = tr3d.save(tmp_path / "s.retime")
    back = read_trace(p)
    pd.testing.assert_frame_equal(back.ops, tr3d.ops)
    assert back.meta["synth"]["step_time_ns"] == tr3d.meta["synth"]["step_time_ns"]


@pytest.mark.parametrize("kw,expect", [
    (dict(zero=3), {"zero3.allgather_params", "zero3.reduce_scatter_grads"}),
    (dict(fsdp=True), {"zero3.allgather_params", "zero3.reduce_scatter_grads"}),
    (dict(zero=1), {"dp.reduce_scatter_grads", "dp.allgather_params"}),
    (dict(zero=2), {"dp.reduce_scatter_grads", "dp.allgather_params"}),
    (dict(cp=2, dp=1), {"cp.allgather_kv", "cp.reduce_scatter_dkv"}),
])
def test_sharding_and_context_parallel(kw, expect):
    args = dict(tp=2, pp=1, dp=2, global_batch=4, micro_batch=1)
    args.update(kw)
    tr = synthesize(SMALL, "h100-sxm", **args)
    names = set(tr.names())
    assert expect <= names
    o = tr.ops
    if "zero3.allgather_params" in expect:
        r0 = (o["rank"] == 0).to_numpy()
        # one gather per unit (8 layers, embedding, head) per micro-batch (2) in forward,
        # and again in backward
        assert ((tr.names() == "zero3.allgather_params") & r0).sum() == 10 * 2
        assert ((tr.names() == "zero3.allgather_params.bwd") & r0).sum() == 10 * 2
        mem = tr.meta["synth"]["memory"][0]
        assert mem["weights_bytes"] == mem["params"]  # 2 bytes / param sharded over dp=2
    assert tr.meta["synth"]["world_size"] == 4


def test_zero_reduces_memory():
    base = dict(tp=1, pp=1, dp=8, global_batch=8, micro_batch=1)
    mem = [synthesize(SMALL, "a100-80gb", zero=z, **base).meta["synth"]["memory"][0]
           for z in (0, 1, 2, 3)]
    assert mem[0]["optimizer_bytes"] == 8 * mem[1]["optimizer_bytes"]
    assert mem[1]["grads_bytes"] == 8 * mem[2]["grads_bytes"]
    assert mem[2]["weights_bytes"] == 8 * mem[3]["weights_bytes"]


def test_unique_expansion_matches_full():
    kw = dict(tp=2, pp=2, dp=2, global_batch=8, micro_batch=1)
    full = synthesize(SMALL, "a100-80gb", **kw)
    uniq = synthesize(SMALL, "a100-80gb", expand="unique", **kw)
    assert sorted(np.unique(uniq.ops["rank"]).tolist()) == [0, 4]
    assert uniq.meta["synth"]["step_time_ns"] == full.meta["synth"]["step_time_ns"]
    assert len(full.ops) == 4 * len(uniq.ops)
    assert uniq.meta["synth"]["rank_classes"][1] == {"stage": 1, "representative": 4,
                                                     "ranks": [4, 7]}


def test_zoo_and_model_file(tmp_path):
    names = model_names()
    for n in ("gpt3-175b", "megatron-22b", "megatron-530b", "megatron-1t", "llama2-7b",
              "llama2-70b", "llama3-8b", "llama3-405b"):
        assert n in names
    f = tmp_path / "m.toml"
    f.write_text("hidden = 512\nffn = 2048\nheads = 8\nkv_heads = 2\nlayers = 4\n"
                 "seq = 256\nvocab = 1000\n")
    m = read_model_file(f)
    assert (m.hidden, m.kv_heads, m.kv_dim) == (512, 2, 128)
    tr = synthesize(f, "a100-40gb", tp=2, pp=2, dp=1, global_batch=4, micro_batch=2)
    assert tr.meta["synth"]["model"]["name"] == "m"


def test_llama_params():
    from retime.collectors.synth import load_model
    # published sizes: 6.7B, 70.6B (Llama 2), 8.0B, 405B (Llama 3)
    for name, expect in (("llama2-7b", 6.74e9), ("llama2-70b", 68.98e9),
                         ("llama3-8b", 8.03e9), ("llama3-405b", 405.9e9)):
        assert load_model(name).params() == pytest.approx(expect, rel=0.025)


@pytest.mark.parametrize("kw,match", [
    (dict(tp=3, pp=1, dp=1, global_batch=4, micro_batch=1), r"tp=3 does not divide heads=16"),
    (dict(tp=2, pp=1, dp=2, global_batch=6, micro_batch=2, world_size=4),
     r"global_batch=6 is not divisible by micro_batch\*dp=2\*2=4"),
    (dict(tp=2, pp=2, dp=2, global_batch=8, micro_batch=1, world_size=16),
     r"dp\*tp\*pp\*cp = 2\*2\*2\*1 = 8 does not equal world_size=16"),
    (dict(tp=1, pp=9, dp=1, global_batch=9, micro_batch=1),
     r"layers=8 .* cannot fill pp\*chunks=9\*1=9"),
    (dict(tp=1, pp=1, dp=1, global_batch=1, micro_batch=1, dtype="fp8"), r"no fp8 peak"),
])
def test_bad_configs(kw, match):
    with pytest.raises(ConfigError, match=match):
        synthesize(SMALL, "a100-80gb", **kw)


def test_does_not_fit():
    with pytest.raises(ConfigError, match=r"does not fit: stage 0 needs .* GiB .* a100-40gb "
                                          r"has 40 GiB with tp=1 pp=1 dp=1"):
        synthesize("gpt3-175b", "a100-40gb", tp=1, pp=1, dp=1, global_batch=1, micro_batch=1)
    # with the check off, the trace comes back flagged
    tr = synthesize("gpt3-13b", "a100-40gb", tp=1, pp=1, dp=1, global_batch=1, micro_batch=1,
                    check_memory=False)
    assert tr.meta["synth"]["oom"] is True


def test_parallel_config_validation():
    with pytest.raises(ConfigError, match="schedule='zigzag'"):
        ParallelConfig(schedule="zigzag")
    with pytest.raises(ConfigError, match="chunks=2 needs schedule interleaved or bfs"):
        ParallelConfig(pp=2, chunks=2, global_batch=2)


def test_random_configs_are_valid_traces():
    """Seeded random mixes of every option: valid schema, edges respected by the timing,
    collective members start together and match their group's size."""
    import random
    model = dict(hidden=512, ffn=2048, heads=8, kv_heads=4, layers=8, seq=512, vocab=1000,
                 gated_mlp=True, dropout=False, tied_embeddings=False, positions="rotary",
                 norm="rmsnorm")
    rnd = random.Random(7)
    for _ in range(15):
        tp, pp, dp, cp = (rnd.choice([1, 2, 4]), rnd.choice([1, 2, 4]), rnd.choice([1, 2]),
                          rnd.choice([1, 2]))
        sched = rnd.choice(["gpipe", "1f1b", "interleaved", "bfs"])
        v = 1 if sched in ("gpipe", "1f1b") else rnd.choice([1, 2])
        fsdp = rnd.random() < 0.2
        zero = 0 if fsdp else rnd.choice([0, 1, 2, 3])
        mb = rnd.choice([1, 2])
        m = pp * rnd.choice([1, 2]) if sched == "interleaved" else rnd.choice([1, 2, 4, 8])
        tr = synthesize(dict(model, attention=rnd.choice(["flash", "unfused"])), "h100-sxm",
                        tp=tp, pp=pp, dp=dp, cp=cp, schedule=sched, chunks=v, zero=zero,
                        fsdp=fsdp, sequence_parallel=tp > 1 and rnd.random() < 0.5,
                        recompute=rnd.choice(["none", "selective", "full"]),
                        global_batch=m * mb * dp, micro_batch=mb)
        tr.validate()
        o, e = tr.ops, tr.edges
        end = _end(o)
        assert (o["start_ns"].to_numpy()[e["dst"].to_numpy()] >= end[e["src"].to_numpy()]).all()
        # collectives start together and span their group; a pipeline send/receive pair is
        # two ranks of it (each member starts when ready, as measured ones)
        p2p = o["kind"] == int(OpKind.P2P)
        assert (o[(o["coll_id"] >= 0) & ~p2p].groupby("coll_id")["start_ns"].nunique() == 1).all()
        c = o[(o["coll_id"] >= 0) & ~p2p].groupby("coll_id")
        size = {int(g): len(r) for g, r in zip(tr.groups["group_id"], tr.groups["ranks"])}
        assert np.array_equal(c.size().to_numpy(),
                              np.array([size[int(g)] for g in c["group_id"].first()]))
        assert (o[p2p].groupby("coll_id").size() == 2).all() and (o.loc[p2p, "coll_id"] >= 0).all()
        assert tr.meta["synth"]["world_size"] == tp * pp * dp * cp


def test_cross_datacenter_link(tmp_path):
    from retime.collectors.synth import CommModel, read_hardware_file
    from retime.collectors.synth.hardware import _DIR
    text = (_DIR / "h100-sxm.toml").read_text()
    f = tmp_path / "two-dc.toml"
    f.write_text(text.replace("km = 0.0", "km = 1000.0").replace("nodes_per_dc = 0",
                                                                   "nodes_per_dc = 2"))
    hw = read_hardware_file(f)
    assert hw.cross_dc.latency_us == pytest.approx(hw.inter.latency_us + 1000 * 5.0)
    par = ParallelConfig(tp=8, dp=4, global_batch=4)
    one_dc = CommModel(read_hardware_file(_DIR / "h100-sxm.toml"), par)
    two_dc = CommModel(hw, par)
    assert two_dc.geometry["dp"].datacenters == 2 and one_dc.geometry["dp"].datacenters == 1
    S = 1 << 28
    # 4 nodes, 2 per datacenter: the DP ring crosses the 1000 km link
    assert two_dc.collective_ns(CommOp.ALL_REDUCE, S, "dp") > 1.5 * one_dc.collective_ns(
        CommOp.ALL_REDUCE, S, "dp")
    assert two_dc.collective_ns(CommOp.ALL_REDUCE, S, "tp") == one_dc.collective_ns(
        CommOp.ALL_REDUCE, S, "tp")


def test_memory_timeline_peaks_at_in_flight_activations(tr3d):
    from retime.collectors.synth import layer_activation_bytes, resolve_model
    s = tr3d.meta["synth"]
    par = ParallelConfig(**{k: v for k, v in s["parallel"].items()
                            if k not in ("world_size", "num_microbatches")})
    m = resolve_model(SMALL)
    chunk = 4 * layer_activation_bytes(m, par)  # 4 layers per stage
    # the first stage also keeps each in-flight micro-batch's embedding output + dropout mask
    emb = 1 * 1024 * m.hidden * 3 // 2  # micro-batch 1, seq 1024, sharded over tp=2 (SP)
    mem = tr3d.memory
    assert sorted(np.unique(mem["rank"]).tolist()) == list(range(8))
    peak = mem.groupby("rank")["allocated_bytes"].max()
    for r in range(8):
        st = s["memory"][r // 4]
        per_mb = chunk + (emb if r // 4 == 0 else 0)
        # 1F1B: stage i keeps p - i = 2, 1 micro-batches alive
        assert st["in_flight_microbatches"] == 2 - r // 4
        assert st["dynamic_activation_bytes"] == st["in_flight_microbatches"] * per_mb
        # the timeline reaches exactly the modeled peak
        assert peak[r] == st["total_bytes"]
    # every micro-batch's activations are freed by the end of the step
    last = mem.sort_values("ts_ns").groupby("rank")["allocated_bytes"].last()
    assert (last == peak - np.array([s["memory"][r // 4]["dynamic_activation_bytes"]
                                     for r in range(8)])).all()


def test_replay_reproduces_synthesized_step():
    """The replay engine (its own graph builder and kernel) re-times a synthesized trace to
    exactly its own start times: the synth scheduler and the trace's edges agree."""
    from retime.replay.engine import replay
    tr = synthesize(SMALL, "a100-80gb", tp=2, pp=2, dp=2, global_batch=16, micro_batch=2,
                    schedule="interleaved", chunks=2, zero=1, sequence_parallel=True)
    res = replay(tr)
    assert np.array_equal(res.start_ns, tr.ops["start_ns"].to_numpy())
    st = res.step_times()
    assert (st["replayed_ns"] == st["measured_ns"]).all()
    assert st["replayed_ns"].max() == tr.meta["synth"]["step_time_ns"]


def test_tied_embedding_allreduce_between_first_and_last_stage():
    tr = synthesize(SMALL, "a100-80gb", tp=2, pp=4, dp=2, global_batch=8, micro_batch=1)
    o = tr.ops
    e = o[tr.names() == "pp.allreduce_embedding_grads"]
    R = 4  # dp * tp
    assert sorted(e["rank"].tolist()) == sorted(list(range(R)) + list(range(3 * R, 4 * R)))
    groups = {int(g): r for g, r, n in zip(tr.groups["group_id"], tr.groups["ranks"],
                                           tr.groups["name"]) if n.startswith("emb")}
    for _, g in e.groupby("coll_id"):
        assert len(g) == 2 and g["start_ns"].nunique() == 1
        assert sorted(g["rank"].tolist()) == sorted(groups[int(g["group_id"].iloc[0])])
    # vocabulary (32000, already a multiple of 128 * tp) x hidden / tp, 4-byte gradients
    # (a bf16 run: fp32 main gradients by Megatron-LM's rule, REFERENCES.md R51)
    assert (e["bytes"] == 32000 * 1024 // 2 * 4).all()
    # untied models have no such all-reduce
    untied = synthesize(dict(SMALL, tied_embeddings=False), "a100-80gb", tp=2, pp=4, dp=2,
                        global_batch=8, micro_batch=1)
    assert "pp.allreduce_embedding_grads" not in set(untied.names())
