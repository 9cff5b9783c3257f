"""What-ifs against real paired captures (issue 17; traces/pairs, examples/pairs made them).

Each pair is one real gloo DDP job captured twice, differing in one knob. A what-if applied to
one capture must predict the other capture's measured step, in both directions, where the
model covers the knob; and the gap classification that makes it possible is checked on its
own (the gloo completion edges, the thread hand-offs, what stays unexplained).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from retime.collectors.enums import EdgeKind, OpKind
from retime.replay import build_graph, whatif
from retime.replay.gaps import gap_shares

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ROOT / "traces" / "pairs"
sys.path.insert(0, str(ROOT / "bench"))
from pairs import load_capture, measured_step_ns  # noqa: E402

INDEX = json.loads((PAIRS / "pairs.json").read_text())
SPECS = INDEX.get("pairs", INDEX)

#: pairs whose knob the model covers on measured CPU traces, both directions within 10%
COVERED = ["mlp-bandwidth", "transformer-bandwidth", "mlp-dp", "transformer-dp",
           "mlp-batch", "transformer-batch", "mlp-checkpoint", "transformer-checkpoint",
           "mlp-host-speed", "transformer-host-speed", "mlp-ranks-per-host",
           "transformer-ranks-per-host", "mlp-bucket", "transformer-bucket",
           "mlp-bucket-400mbit", "transformer-bucket-400mbit",
           # captured after the models were written (held out from their development)
           "mlp-bandwidth-200-800", "transformer-bandwidth-200-800", "mlp-bucket-800mbit",
           "transformer-bucket-800mbit",
           *(f"{m}-{k}-800mbit" for k in ("dp", "ranks-per-host", "host-speed", "checkpoint",
                                          "batch") for m in ("mlp", "transformer")),
           # captured after the models were frozen (pairs.json after_freeze)
           "cnn-bandwidth-300-1200", "cnn-batch", "mlp-bandwidth-burst4",
           "transformer-bandwidth-2x2",
           # captured after the second freeze (5191c25; pairs.json after_freeze 2), judged
           # with the model as frozen; emb-bucket (-30.6% then) shaped the model after it was
           # seen (pairs.json shaped_after_freeze: the concurrent-transfer link fit)
           "emb-bandwidth-500-2000", "emb-bucket", "cnn-dp",
           "transformer-bandwidth-500-2000-burst2",
           # captured after the third freeze (cc60cda, FREEZE-3; pairs.json after_freeze 3),
           # scored once with the model as frozen; mlp-batch-32-16 (+17.9% then) shaped the
           # model after it was seen (pairs.json shaped_after_freeze: the host GEMMs' weight
           # copy and the batch-independent host time, replay/policies/batch_cpu.py)
           "mlp-batch-32-16", "transformer-bucket-1000mbit", "mlp-bandwidth-400-2000",
           "emb-bandwidth-300-1000-burst-half", "transformer-batch-32-16",
           # captured after the fourth freeze (c945718, FREEZE-4; pairs.json after_freeze 4),
           # scored once with the model as frozen; emb-batch-64-16 (-10.2% then, +12.0% after
           # the measured-batch fix) shaped the model after it was seen (pairs.json
           # shaped_after_freeze: the embedding reads its batch from its indices; a
           # parameter-shaped zero-fill, the table gradient's, keeps its time)
           "emb-batch-64-16", "cnn-checkpoint", "emb-host-speed-70", "cnn-batch-32-8",
           # captured after the fifth freeze (4ae6ed3, FREEZE-5; pairs.json after_freeze 5),
           # scored once with the model as frozen: 8/8 within 10%; no model change after
           "emb-batch-32-8", "transformer-batch-16-4", "emb-bucket-800mbit",
           "emb-batch-2048-512",
           # captured after the sixth freeze (c0431b6, FREEZE-6; pairs.json after_freeze 6),
           # scored once with the model as frozen: 6/8 within 10% (the two misses in KNOWN,
           # not fixed)
           "mlp-bandwidth-250-1000-burst3", "mlp-bucket-2x2", "transformer-checkpoint-1200mbit",
           "cnn-host-speed-60",
           # captured after the seventh freeze (441878b, FREEZE-7; pairs.json after_freeze
           # 7), scored once with the model as frozen: 8/8 within 10%
           "transformer-bandwidth-300-1200-burst1.5", "cnn-bandwidth-400-1600-2x2",
           "transformer-batch-8-2-600mbit", "emb-ranks-per-host-1200mbit",
           # captured after the eighth freeze (2fd8056, FREEZE-8, main 7194928's model
           # unchanged; pairs.json after_freeze 8), scored once with the model as frozen:
           # 7/8 within 10% (the miss in KNOWN, not fixed)
           "cnn-bucket-0.25-25-500mbit", "emb-bandwidth-700-1400-2x2",
           "transformer-checkpoint-2000mbit", "mlp-batch-2048-512-burst2",
           # captured after the ninth freeze (a1e66d4, FREEZE-9, the range-only link bound;
           # pairs.json after_freeze 9), scored once with the model as frozen: 7/8 within 10%
           # (the miss in KNOWN, not fixed)
           "cnn-bucket-0.125-25-900mbit", "transformer-bandwidth-600-1800",
           "emb-batch-1024-256-burst2", "mlp-checkpoint-500mbit"]


#: known misses on PLAIN traces (the kit's records stripped), each with its cause (strict:
#: the test fails when one starts passing)
_BURST = ("the link is a tc tbf token bucket: after an idle period the first burst goes at "
          "veth speed, so a faster link gains more than its rate; the one-host source trace "
          "never used the link, so the bucket cannot be inferred from it")
KNOWN: dict[tuple[str, str, str], str] = {
    ("mlp-ranks-per-host", "B", "A"): _BURST,
    ("mlp-ranks-per-host-800mbit", "B", "A"): _BURST,
    ("mlp-bandwidth-burst4", "B", "A"): (
        "+10.8% (cause not verified): the 4x token bucket (6.4 MB at 1600 Mbit/s) holds the "
        "whole 4.2 MB all-reduce; the bucket is inferred from the 400 Mbit/s trace, whose "
        "transfers show it only partly"),
    ("transformer-bandwidth-2x2", "A", "B"): (
        "-11.2%: two ranks share each host's core; at 400 Mbit/s they were staggered (ranks "
        "0 and 2 ran their forward in 26-39 ms, ranks 1 and 3 in 48-57 ms; forward plus "
        "backward compute 116-125 ms per rank and step) and at 1600 Mbit/s in lockstep (every "
        "forward 41-61 ms, ~140 ms per rank and step); the model keeps the measured "
        "durations of time-shared ops (not fixed)"),
    # batch 6 (FREEZE-6), scored once as frozen; misses are not fixed
    ("mlp-bandwidth-250-1000-burst3", "A", "B"): (
        "+26.2% (60.9 ms against 48.3): the replayed all-reduces (11.7-25.5 ms) are near the "
        "1000 Mbit/s captures' (11.5-15.4 ms) with the inferred 0.69 MB bucket (the kit's: "
        "0.75 MB); the excess is work kept from the 250 Mbit/s source: its rank 1 worked "
        "32.1, 44.4 and 51.5 ms in its three steps (the kept 1000 Mbit/s capture's ranks "
        "31-36 ms), a slow stretch hidden there by its peer's wait for the link; measured, "
        "not a gap misclassed; outside its range (51-73 ms); not fixed"),
    ("mlp-bucket-2x2", "B", "A"): (
        "+11.8%: the bucket change barely moves the step (98.4 vs 99.4 ms medians) and the "
        "kept 50 MiB capture's step (110.4 ms) is 11% above its setting's median (spread "
        "23.1% over 9 captures); 'no change' misses by +12.2%"),
    # batch 8 (FREEZE-8), scored once as frozen; the miss is not fixed
    ("cnn-bucket-0.25-25-500mbit", "A", "B"): (
        "-14.1% (47.5 ms against 55.4; 'no change' -15.3%): the 0.25 MiB source's transfers "
        "clear of compute (332 KB in 0.6-3.3 ms, 11 KB; 332 KB needs 5.6 ms at the link's "
        "measured 478 Mbit/s) each fit the link's 500 KB token bucket, so the plain trace's "
        "fit gives 0.479 GB/s (8x the link) and the merged 1.0 MB all-reduce replays in "
        "2.3-3.5 ms against 9.1-12.8 ms in the 25 MiB capture; with the calibration file "
        "(overlap probe) +7.3%; not fixed"),
    # batch 9 (FREEZE-9), scored once as frozen; the miss is not fixed
    ("cnn-bucket-0.125-25-900mbit", "A", "B"): (
        "+38.0% (67.5 ms against 48.9; 'no change' +4.8%): the 0.125 MiB source's 24 "
        "transfers (332 KB conv weights) fit as the link's aggregate, 0.054 GB/s, half the "
        "stated 900 Mbit/s, so the stated-rate bound does not engage; the merged 1.0 MB "
        "buckets replay in 18.8 ms each and every new bucket next to compute waits the "
        "assumed 12 ms of scheduler turns; with the calibration file +33.9%; not fixed"),
}


def _cases():
    for name in COVERED:
        for src, dst in (("A", "B"), ("B", "A")):
            why = KNOWN.get((name, src, dst))
            marks = [pytest.mark.xfail(reason=why, strict=True)] if why else []
            yield pytest.param(name, src, dst, marks=marks, id=f"{name}-{src}{dst}")


def _keys(spec: dict, src: str, dst: str) -> dict:
    """The pair's what-if keys plus the cluster facts a user states (pairs.json ``stated``)."""
    keys = dict(spec["whatif"][f"{src}->{dst}"])
    keys.update(spec.get("stated", {}).get(f"{src}->{dst}", {}))
    return keys


@pytest.mark.parametrize("name,src,dst", list(_cases()))
def test_prediction_of_the_other_capture(name, src, dst):
    """On the plain trace (what a user's torch.profiler run holds), the step the CLI prints
    is within 10% of the other setting's measured median."""
    spec = SPECS[name]
    trace = load_capture(PAIRS / name / src, plain=True)
    pred = whatif(trace, _keys(spec, src, dst)).summary()["step_time_ns"]["per_step"]["replayed"]
    target = spec["median_ns"][dst]
    source = spec["median_ns"][src]
    err = pred / target - 1
    assert abs(err) <= 0.10, f"{name} {src}->{dst}: predicted {pred / 1e6:.1f} ms, measured " \
                             f"{target / 1e6:.1f} ms ({err:+.1%})"
    if abs(target / source - 1) > 0.10:  # a real change: better than answering "no change"
        assert abs(err) < abs(source / target - 1)


def test_gloo_waits_are_dependencies_not_constants():
    """Every gloo all-reduce feeds a SYNC edge to the op its issuing thread resumed with
    (after DDP's wait), and the gap before that op is classified as waiting: a faster link
    moves it (a constant lag would pin it: the no-change bias)."""
    t = load_capture(PAIRS / "mlp-bandwidth" / "A")
    o = t.ops
    names = np.asarray(t.strings, object)[o["name_id"].to_numpy()]
    gl = np.flatnonzero(names == "gloo:all_reduce")
    e = t.edges
    src, dst, kind = e["src"].to_numpy(), e["dst"].to_numpy(), e["kind"].to_numpy()
    lane = o["lane"].to_numpy()
    start = o["start_ns"].to_numpy()
    for g in gl.tolist():
        issue = src[(dst == g) & (kind == EdgeKind.LAUNCH)]
        done = dst[(src == g) & (kind == EdgeKind.SYNC)]
        assert len(issue) == 1 and len(done) == 1
        assert lane[done[0]] == lane[issue[0]] and start[done[0]] > start[g]
    g = build_graph(t)
    assert g.stats["wait_gaps"] >= len(gl)
    # the waits hold nearly all of the gloo time: almost nothing is left unexplained
    sh = gap_shares(g)["total"]
    assert sh["unexplained_share"] < 0.01 and g.stats["wait_gap_ns"] > 0.5 * sh["span_ns"]


def test_dp_relayout_copies_ranks_and_widens_every_all_reduce():
    from retime.replay.policies.parallel_dp import relayout_dp

    t = load_capture(PAIRS / "mlp-dp" / "A")
    new, info, tmpl = relayout_dp(t, 4, 2)
    assert new.n_ops == 2 * t.n_ops and info["to"] == {"dp": 4, "ranks_per_node": 2}
    o = new.ops
    coll = o["coll_id"].to_numpy()[o["kind"].to_numpy() == OpKind.COLLECTIVE]
    assert (np.bincount(coll) == 4).all()  # every all-reduce spans the 4 ranks
    assert np.array_equal(o["dur_ns"].to_numpy(), t.ops["dur_ns"].to_numpy()[tmpl])
    assert new.meta["hostnames"] == {"0": "node0", "1": "node0", "2": "node1", "3": "node1"}


def test_dlrm_handoffs_leave_little_unexplained():
    """The autograd threads' first ops start right after the main thread hands over: with
    the inferred hand-offs the unexplained share of the DLRM rank spans is under 10% (it
    was 69.7% when they were pinned to their measured offsets)."""
    from conftest import KINETO, ingest_cached

    t = ingest_cached(KINETO / "dlrm-v100-8rank")
    g = build_graph(t)
    assert g.stats["handoff_edges"] >= 8
    assert gap_shares(g)["total"]["unexplained_share"] < 0.10


def test_partial_traces_are_refused_for_dp():
    from conftest import KINETO, ingest_cached

    from retime.collectors.errors import PolicyError

    t = ingest_cached(KINETO / "cpu-gloo-rank34")
    with pytest.raises(PolicyError, match="every rank of the job traced"):
        whatif(t, {"parallel.dp": 4})
    # gloo buckets of 1 of 300 ranks: the all-reduces' times hold waiting for the untraced
    # ranks (it used to be priced as link time: +200% for any bucket size)
    for mb in (1, 100):
        with pytest.raises(PolicyError, match="1 of the 300 ranks"):
            whatif(t, {"overlap.bucket_mb": mb})


def test_one_host_loopback_is_estimated_from_the_hosts_copies():
    """Two hosts -> one host (topology.ranks_per_node=2) on a gloo trace: no collective of
    the trace ran on loopback, so its rate comes from the host's copy rate (the DDP
    reducer's copies, exact bytes) over the TCP passes per byte. It is an upper bound of the
    loopback rate the one-host capture measured, within the factor the README states, and
    the replay says what it assumed."""
    from retime.replay.graph import build_graph as bg
    from retime.replay.policies.host_cpu import host_copy_rate, loopback_busbw
    from retime.replay.policies.link_fit import calibrate, collective_table

    for name in ("mlp-ranks-per-host", "transformer-ranks-per-host"):
        a = load_capture(PAIRS / name / "A")
        b = load_capture(PAIRS / name / "B")
        est = loopback_busbw(a)
        gb = bg(b)
        measured = calibrate(b, gb, collective_table(b, gb))[0]["busbw_gbps"]
        assert measured <= est <= 5 * measured, (name, est, measured)
        assert 5 < host_copy_rate(a) < 100  # GB/s of hot-cache copies of one core
        res = whatif(a, {"topology.ranks_per_node": 2})
        w = res.meta["whatif"]
        assert w["network_calibration"]["intra"]["busbw_gbps"] == pytest.approx(est)
        assert any("loopback" in x and "network.intra_node_gbps" in x for x in w["assumed"])
    # a plain trace holds the sizes itself (the reducer's recorded shapes): the same estimate
    plain = load_capture(PAIRS / "mlp-ranks-per-host" / "A", plain=True)
    assert "ddp_param_bytes" not in plain.meta
    assert loopback_busbw(plain) == pytest.approx(
        loopback_busbw(load_capture(PAIRS / "mlp-ranks-per-host" / "A")))
    # without the sizes (no shapes recorded, none stated) the copy rate is unknown: refused,
    # naming the key
    bare = load_capture(PAIRS / "mlp-ranks-per-host" / "A", plain=True)
    bare.meta["sources"] = []
    with pytest.raises(Exception, match="network.intra_node_gbps"):
        whatif(bare, {"topology.ranks_per_node": 2})


def test_shaped_link_calibrates_to_the_links_own_measured_rate():
    """The kit's links are tbf-shaped (rate R, bucket B = 8 ms of R): an all-reduce after a
    compute phase sends its first B bytes on saved tokens. Fitted on the bytes the link
    actually paced, the 2-rank all-reduces of every 2-host capture give the TCP rate the kit
    measured on the link by itself (pairs.json achieved_mbit: one socket, 64 MB) within 6% (that
    probe itself moved 7% between sessions: 1423-1530 Mbit/s at 1600);
    fitted on all bytes (no bucket) they claim a link up to 1.6x faster than it is."""
    from retime.replay.policies.link_fit import (
        calibrate,
        collective_table,
        link_credits,
        shaped_link,
    )

    checked = 0
    for name in ("mlp-bandwidth", "transformer-bandwidth", "mlp-dp", "transformer-dp",
                 "mlp-ranks-per-host", "transformer-ranks-per-host"):
        spec = SPECS[name]
        for side in ("A", "B"):
            t = load_capture(PAIRS / name / side)
            if int(t.meta["job"]["world_size"]) != 2 or int(t.meta["job"]["nhosts"]) != 2:
                continue  # one host, or a 4-rank ring whose ranks share a host's link
            rate, tau = shaped_link(t)
            assert tau == pytest.approx(8e6)  # 2 ticks at 250 Hz, whatever the rate
            g = build_graph(t)
            tab = collective_table(t, g)
            on = tab["old_level"] == 1
            cr = link_credits(g, tab, on, rate, tau)
            assert on.all() and (cr <= rate * tau * 1448 / 1514 + 1).all()
            assert (cr <= tab["bytes"] * tab["factor"]).all() and (cr > 0).all()
            link_gbps = spec["achieved_mbit"][side] / 8000  # TCP payload, GB/s
            got = calibrate(t, g, tab, credit=cr)[1]["busbw_gbps"]
            raw = calibrate(t, g, tab)[1]["busbw_gbps"]
            assert got == pytest.approx(link_gbps, rel=0.06), (name, side, got, link_gbps)
            assert raw > got
            checked += 1
    assert checked == 8


def test_a_plain_ingest_of_a_kit_capture_knows_its_link():
    """`retime ingest` / retime.load of a kit capture (no bench helper): the link record the
    capture wrote into every rank's file reaches the network model, so the 4x faster link
    is predicted as well as bench/pairs.py predicts it."""
    import retime

    spec = SPECS["mlp-bandwidth"]
    t = retime.load(str(PAIRS / "mlp-bandwidth" / "A"))
    assert "job" not in t.meta and t.meta["capture"]
    keys = dict(spec["whatif"]["A->B"])
    pred = measured_step_ns(whatif(t, keys).to_trace())
    assert pred == pytest.approx(spec["median_ns"]["B"], rel=0.05)
    w = whatif(t, keys).meta["whatif"]["shaped_link"]
    assert w["burst_ms"] == pytest.approx(8.0) and w["rate_gbps"] == pytest.approx(0.2)


def test_bucket_pairs_use_the_probe():
    """The bucket pairs were captured with the overlap probe, and re-bucketing reads it: the
    compute side slowed by the CPU the transfers take (well under the symmetric model's
    ~1), a 1 MiB transfer next to compute several times its time alone (the scheduler's
    hand-offs under SCHED_RR), new buckets on both gloo worker threads of a rank."""
    from retime.replay.policies.host_cpu import overlap_probe

    t = load_capture(PAIRS / "transformer-bucket" / "B")
    p = overlap_probe(t)
    assert p is not None and p.sizes == (2**20, 4 * 2**20)
    assert 0.05 < p.compute_slowdown < 0.5
    assert p.under_ns(2**20) > 3 * p.alone_ns(2**20)
    r = whatif(t, {"overlap.bucket_mb": 1.048576})
    (ov,) = [d for d in r.meta["scenario"] if d.get("policy") == "overlap"]
    assert ov["contention"] == "the capture's overlap probe" and ov["comm_slowdown"] > 1
    assert abs(1 - ov["interference_used"] - p.compute_slowdown) < 1e-9
    o = r.trace.ops
    new = o[(o["kind"].to_numpy() == OpKind.COLLECTIVE) & (o["bytes"].to_numpy() > 0)]
    assert new.groupby("rank")["lane"].nunique().min() == 2
    assert r.meta["contention"]["share_links"] and r.meta["contention"]["comm_slowdown"] > 1


def test_turn_delay_is_the_ring_hand_offs_times_a_scheduler_turn():
    """Closed form: a ring all-reduce of n ranks has 2 (n - 1) steps of 2 hand-offs each,
    one scheduler turn (3 ms) per hand-off; the range halves and doubles the hand-offs."""
    from retime.replay.policies.cpu_overlap import SCHED_SLICE_NS, turn_delay_ns

    assert SCHED_SLICE_NS == 3_000_000
    assert turn_delay_ns(2) == 4 * 3e6
    assert (turn_delay_ns(2, "low"), turn_delay_ns(2, "high")) == (2 * 3e6, 8 * 3e6)
    assert turn_delay_ns(4) == 12 * 3e6


def test_one_bucket_plain_trace_waits_scheduler_turns():
    """A plain one-bucket trace has no transfer under compute to fit the comm side on: the
    re-bucketed transfers each wait the ring's hand-offs (turn_delay_ns) next to compute,
    capped, on both gloo worker threads the trace shows, sharing the link; the assumption is
    printed and the range replays its bounds."""
    from retime.replay import prediction_range

    t = load_capture(PAIRS / "mlp-bucket-800mbit" / "B", plain=True)
    r = whatif(t, {"overlap.bucket_mb": 1.048576})
    (ov,) = [d for d in r.meta["scenario"] if d.get("policy") == "overlap"]
    assert ov["contention"] == "scheduler turns per hand-off (assumed)"
    assert ov["turn_delay_ms"] == 12.0 and r.meta["contention"]["share_links"]
    assert r.meta["contention"]["comm_slowdown"] > 0
    o = r.trace.ops
    new = o[(o["kind"].to_numpy() == OpKind.COLLECTIVE) & (o["bytes"].to_numpy() > 0)]
    assert new.groupby("rank")["lane"].nunique().min() == 2
    assert any("scheduler turn" in a for a in r.meta["whatif"]["assumed"])
    prediction_range(r)
    lo, hi = r.meta["whatif"]["step_range_ns"]
    pred = r.summary()["step_time_ns"]["per_step"]["replayed"]
    assert lo < pred < hi
    # the measured target (1 MiB buckets) is within the bar and inside the range
    target = SPECS["mlp-bucket-800mbit"]["median_ns"]["A"]
    assert abs(pred / target - 1) <= 0.10 and lo <= target <= hi


def test_one_bucket_trace_recovers_ddp_ready_order():
    """Post-norm transformer layers: norm1's gradients are ready after the FFN's, not in
    reverse registration order. From the one-bucket capture's copy times the 1 MiB buckets
    come out as DDP's own (the small-bucket capture's first two: 1052676 and ~1.05 MB with
    linear1's weight), not the registration order's 1054724."""
    from retime.replay.policies.bucketing_cpu import rebucket_cpu

    real = load_capture(PAIRS / "transformer-bucket" / "A").ops
    real = real[(real["kind"] == OpKind.COLLECTIVE) & (real["bytes"] > 0) & (real["rank"] == 0)]
    real = real[real["step"] == real["step"].min()].sort_values("start_ns")["bytes"].tolist()
    # the plain trace's own reducer shapes give the ready order; without them (a trace
    # recorded without shapes; sizes stated in registration order) the copy times do
    plain = load_capture(PAIRS / "transformer-bucket" / "B", plain=True)
    kit = load_capture(PAIRS / "transformer-bucket" / "B")
    kit.meta["sources"] = []
    for t, source in ((plain, "the trace's reducer shapes (ready order)"),
                      (kit, "exact sizes (reverse registration order, reordered locally by "
                            "copy time)")):
        nt, ids, _m, info, _cpu = rebucket_cpu(t, 1.048576, None, 1)
        assert info["param_sizes"] == source
        new = nt.ops.iloc[ids]
        first = new[(new["rank"] == 0) & (new["step"] == new["step"].min())]["bytes"].tolist()
        assert first[0] == real[0] == 1052676
        assert abs(first[1] - real[1]) <= 4096
    # the MLP's order is reverse registration order: kept
    mlp = load_capture(PAIRS / "mlp-bucket" / "B")
    mlp.meta["sources"] = []
    _t, _i, _m, info, _c = rebucket_cpu(mlp, 1.048576, None, 1)
    assert info["param_sizes"] == "exact sizes (reverse registration order)"


def test_collectives_are_not_hand_off_targets():
    """A collective starts when it is issued and its peers start, never because another
    thread of its rank went idle: no hand-off is inferred into one. Re-bucketed buckets on a
    rank's two gloo threads, one ready just after the other, were chained that way (the
    second waited for the first's end). Ops (ms): lane 1 idle until a bucket at 10.2; lane 2
    ran a bucket ending at 10.0 and went idle; a host op on lane 3 resumes 0.2 ms after
    lane 2's last op: that one is still a hand-off."""
    from retime.replay.gaps import with_handoff_edges

    ms = 1_000_000
    rank = np.zeros(5, np.int64)
    lane = np.array([1, 2, 1, 3, 3])
    start = np.array([0, 9, 10.2, 0, 10.2]) * ms
    end = np.array([1, 10, 10.2, 1, 11]) * ms
    prev = np.array([-1, -1, 0, -1, 3])
    coll = np.array([True, True, True, False, False])
    z = np.zeros(0, np.int64)
    args = (rank, lane, start.astype(np.int64), end.astype(np.int64), np.zeros(5, bool), prev,
            z, z, np.zeros(0, np.int8), z)
    src, dst, *_ = with_handoff_edges(*args, {})
    assert {(1, 2), (1, 4)} <= set(zip(src.tolist(), dst.tolist(), strict=True))
    src, dst, *_ = with_handoff_edges(*args, {}, not_dst=coll)
    assert list(zip(src.tolist(), dst.tolist(), strict=True)) == [(1, 4)]


def test_rebucketed_transfer_is_not_faster_than_the_link_ran():
    """emb-bucket A: six DDP buckets (83 KB to 2 MB) ran two at a time on gloo's two worker
    threads. One 10.0 MB bucket in their place moves its bytes no faster than the link's
    aggregate over the time it was busy with the old ones (per rank and step, from the
    time both members of a bucket had joined to its end; undone for the compute slowdown
    the model assumes, at most ``1 + i``), and it lasts as long as the one-bucket
    setting's measured all-reduces (44.5-47.6 ms; at the second freeze the model replayed
    it in 21.5 ms, 3.7 Gbit/s on a 1600 Mbit/s link)."""
    import pandas as pd

    from retime.collectors.intervals import interval_union
    from retime.replay.policies.bucketing_cpu import rebucket_cpu

    src = load_capture(PAIRS / "emb-bucket" / "A", plain=True)
    _t, _ids, model_ns, info, _cpu = rebucket_cpu(src, 52.4288, None)
    o = src.ops
    m = ((o["kind"] == OpKind.COLLECTIVE) & (o["bytes"] > 0)).to_numpy()
    start = o["start_ns"].to_numpy()[m]
    end = start + o["dur_ns"].to_numpy()[m]
    joined = pd.Series(start).groupby(o["coll_id"].to_numpy()[m]).transform("max").to_numpy()
    nbytes = o["bytes"].to_numpy()[m].astype(np.float64)
    rank, step = o["rank"].to_numpy()[m], o["step"].to_numpy()[m]
    agg = 0.0  # bytes per ns, 2 ranks: bus bytes = bytes
    for r, s in set(zip(rank.tolist(), step.tolist())):
        q = (rank == r) & (step == s)
        lo, hi = interval_union(joined[q], end[q])
        agg = max(agg, nbytes[q].sum() / float((hi - lo).sum()))
    new_bytes = 9_983_236.0
    assert len(model_ns) == 6 and info["busbw_gbps"] <= agg * (1 + info["interference"])
    assert (new_bytes / (model_ns - info["alpha_ns"]) <= agg * (1 + info["interference"])).all()
    dst = load_capture(PAIRS / "emb-bucket" / "B", plain=True).ops
    d = dst.loc[(dst["kind"] == OpKind.COLLECTIVE) & (dst["bytes"] > 0), "dur_ns"]
    assert (d.min() <= model_ns).all() and (model_ns <= d.max()).all()


def test_probe_alone_time_is_floored_by_the_links_own_rate():
    """Closed form: with a calibration file a new bucket's alone time is the longer of the
    probe's line ``a + b S`` and the trace's own link ``alpha + S f / B``."""
    from retime.replay.policies.gloo_fit import _probe_alone_ns
    from retime.replay.policies.host_cpu import OverlapProbe

    p = OverlapProbe(compute_slowdown=0.2, under=(20e6, 2.0), alone=(-3e6, 4.0),
                     sizes=(2**20, 2**22))
    s = np.asarray([2.0**20, 2.0**22, 1e7])
    got = _probe_alone_ns(p, s, 1.0, (2e5, 5.0))  # 5 ns per bus byte: 200 MB/s
    assert got == pytest.approx(np.maximum(-3e6 + 4.0 * s, 2e5 + 5.0 * s), rel=1e-12)
    assert got[2] == pytest.approx(2e5 + 5e7)  # 10 MB: the link, not the probe's 37 ms
    assert _probe_alone_ns(p, s, 1.0, None) == pytest.approx(-3e6 + 4.0 * s)


def test_calibrated_one_bucket_lasts_as_the_measured_one_bucket_all_reduces():
    """emb-bucket A with its setting's calibration file (the kit's overlap probe: 1 MiB in
    1.1-2.1 ms and 4 MiB in 14.9-16.7 ms alone, after an idle link, so through a 1.6 MB
    token bucket): the one 10.0 MB bucket lasts as long as the one-bucket captures'
    measured all-reduces (44.5-47.6 ms), as on the plain trace. The probe's line through
    its two sizes put it at ~37 ms (the calibrated prediction was -13.9% then)."""
    from retime.replay.policies.bucketing_cpu import rebucket_cpu

    src = load_capture(PAIRS / "emb-bucket" / "A", plain=True, calibrated=True)
    assert src.meta.get("calibration")  # the file is attached: the probe is read
    _t, _ids, model_ns, info, _cpu = rebucket_cpu(src, 52.4288, None)
    assert info["contention"] == "the capture's overlap probe" and len(model_ns) == 6
    dst = load_capture(PAIRS / "emb-bucket" / "B", plain=True).ops
    d = dst.loc[(dst["kind"] == OpKind.COLLECTIVE) & (dst["bytes"] > 0), "dur_ns"]
    assert (d.min() <= model_ns).all() and (model_ns <= d.max()).all()
