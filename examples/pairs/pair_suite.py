"""The paired-capture suite's definitions: each pair's model, knob, settings and what-if keys.

``BASE`` holds the job every pair of a model family starts from, ``PAIRS`` the pairs (name ->
(model, :class:`Pair`)) in capture order, ``FROZEN`` / ``LATER`` the batches captured after
each model freeze, and :func:`stated` the cluster facts a user states for each direction.
Read by ``capture.py`` (which runs the captures); importing it runs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the jobs every pair starts from (per model); a pair changes one knob of it.
#: rate_mbit: inter-host link (tbf, per direction); speed_pct: the hosts' CPU speed;
#: bucket_cap_mb: DDP's bucket_cap_mb (MiB); batch: per rank
BASE = {
    "mlp": {"model": "mlp", "hidden": 512, "layers": 4, "batch": 512, "bucket_cap_mb": 25.0,
            "threads": 1, "checkpoint": False, "nhosts": 2, "nproc_per_host": 1,
            "rate_mbit": 1600.0, "speed_pct": 100.0},
    "transformer": {"model": "transformer", "d_model": 256, "seq": 64, "layers": 4, "batch": 4,
                    "bucket_cap_mb": 25.0, "threads": 1, "checkpoint": False, "nhosts": 2,
                    "nproc_per_host": 1, "rate_mbit": 1600.0, "speed_pct": 100.0},
    # the model family of the pairs captured after the models were frozen
    "cnn": {"model": "cnn", "channels": 96, "image": 16, "layers": 4, "batch": 16,
            "bucket_cap_mb": 25.0, "threads": 1, "checkpoint": False, "nhosts": 2,
            "nproc_per_host": 1, "rate_mbit": 1600.0, "speed_pct": 100.0},
    # the model family of the second batch captured after a freeze (FROZEN_2): an
    # embedding-heavy recommender (DLRM-like; dense table gradients, 10.0 MB in all)
    "emb": {"model": "emb", "tables": 8, "rows": 4000, "dim": 64, "bag": 8, "dense": 16,
            "batch": 512, "bucket_cap_mb": 25.0, "threads": 1, "checkpoint": False,
            "nhosts": 2, "nproc_per_host": 1, "rate_mbit": 1600.0, "speed_pct": 100.0},
}
MIB_MB = 2**20 / 1e6  # DDP's bucket_cap_mb counts MiB; overlap.bucket_mb counts 10^6 bytes


def _gbps(mbit: float) -> float:
    """GB/s per direction of a link of ``mbit`` Mbit/s (what network.*_gbps count)."""
    return mbit / 8 / 1000


@dataclass(frozen=True)
class Pair:
    """One knob: setting A and B (overrides of the model's BASE) and the what-if keys."""

    knob: str
    a: dict
    b: dict
    a_to_b: dict
    b_to_a: dict


def _rate_pair(knob: str, lo: float, hi: float, same: dict | None = None,
               ranks_per_node: int = 1) -> Pair:
    """A pair whose settings differ in the link's rate (Mbit/s); ``same``: the other knobs
    both settings change from the base alike."""
    same = dict(same or {})
    return Pair(knob, {**same, "rate_mbit": lo}, {**same, "rate_mbit": hi},
                {"network.inter_node_gbps": _gbps(hi), "topology.ranks_per_node": ranks_per_node},
                {"network.inter_node_gbps": _gbps(lo), "topology.ranks_per_node": ranks_per_node})


def _bucket_pair(knob: str, same: dict | None = None) -> Pair:
    """A pair whose settings differ in DDP's bucket_cap_mb, 1 vs 50 MiB (the key counts 10^6
    bytes); ``same``: the other knobs both settings change from the base alike."""
    same = dict(same or {})
    return Pair(knob, {**same, "bucket_cap_mb": 1.0}, {**same, "bucket_cap_mb": 50.0},
                {"overlap.bucket_mb": round(50 * MIB_MB, 6)},
                {"overlap.bucket_mb": round(1 * MIB_MB, 6)})


def _pairs() -> dict[str, tuple[str, Pair]]:
    lo, hi = 400.0, 1600.0
    batch = {"mlp": (512, 1024), "transformer": (4, 8)}
    spec = {
        "bandwidth": lambda m: _rate_pair(
            "inter-host bandwidth (tbf rate of both veth ends, per direction)", lo, hi),
        "bucket": lambda m: _bucket_pair(
            "DDP bucket_cap_mb (MiB; the key counts 10^6 bytes)"),
        "bucket-400mbit": lambda m: _bucket_pair(
            "DDP bucket_cap_mb (MiB; the key counts 10^6 bytes) on the 400 Mbit/s link", {"rate_mbit": lo}),
        # captured after the models were written (held out from their development): other
        # link rates, and bucket size on a third rate
        "bandwidth-200-800": lambda m: _rate_pair(
            "inter-host bandwidth at other rates (200 vs 800 Mbit/s per direction)", 200.0, 800.0),
        "bucket-800mbit": lambda m: _bucket_pair(
            "DDP bucket_cap_mb (MiB; the key counts 10^6 bytes) on an 800 Mbit/s link", {"rate_mbit": 800.0}),
        "dp": lambda m: Pair(
            "data-parallel ranks: 2 hosts x 1 rank vs 2 hosts x 2 ranks (a host's ranks share "
            "its core; per-rank batch fixed)",
            {"nproc_per_host": 1}, {"nproc_per_host": 2},
            {"parallel.dp": 4, "topology.ranks_per_node": 2},
            {"parallel.dp": 2, "topology.ranks_per_node": 1}),
        "ranks-per-host": lambda m: Pair(
            "ranks per host: 2 ranks on 2 hosts (1 core each, shaped veth) vs 2 ranks on 1 "
            "host (both cores, one rank per core, loopback)",
            {"nhosts": 2, "nproc_per_host": 1}, {"nhosts": 1, "nproc_per_host": 2},
            {"topology.ranks_per_node": 2},
            {"topology.ranks_per_node": 1, "network.inter_node_gbps": _gbps(BASE[m]["rate_mbit"])}),
        "host-speed": lambda m: Pair(
            "host CPU speed: real-time runtime 9.5 ms vs 4.75 ms per 10 ms on every host",
            {"speed_pct": 100.0}, {"speed_pct": 50.0},
            {"hardware.host_speedup": 0.5}, {"hardware.host_speedup": 2.0}),
        "checkpoint": lambda m: Pair(
            "activation checkpointing per block (torch.utils.checkpoint, use_reentrant=False)",
            {"checkpoint": False}, {"checkpoint": True},
            {"cache.recompute": "full"}, {"cache.recompute": "none"}),
        "batch": lambda m: Pair(
            "per-rank batch size",
            {"batch": batch[m][0]}, {"batch": batch[m][1]},
            {"parallel.micro_batch": batch[m][1]}, {"parallel.micro_batch": batch[m][0]}),
    }
    # held out as well: the layout, CPU and memory knobs on an 800 Mbit/s link
    for knob in ("dp", "ranks-per-host", "host-speed", "checkpoint", "batch"):
        spec[f"{knob}-800mbit"] = _on_link(spec[knob], 800.0)
    out = {}
    for knob in spec:
        for m in ("mlp", "transformer"):
            out[f"{m}-{knob}"] = (m, spec[knob](m))
    # captured after the models were frozen (FROZEN): another model family, another link
    # shaping (a 4x larger token bucket), another rate pair, 2 ranks per host on 2 hosts
    out["cnn-bandwidth-300-1200"] = ("cnn", _rate_pair(
        "inter-host bandwidth, 300 vs 1200 Mbit/s per direction (conv net)", 300.0, 1200.0))
    out["cnn-batch"] = ("cnn", Pair(
        "per-rank batch size (conv net)", {"batch": 16}, {"batch": 32},
        {"parallel.micro_batch": 32}, {"parallel.micro_batch": 16}))
    out["mlp-bandwidth-burst4"] = ("mlp", _rate_pair(
        "inter-host bandwidth, 400 vs 1600 Mbit/s, on a link whose token bucket is 4x the "
        "kit's (burst_x 4)", lo, hi, {"burst_x": 4.0}))
    out["transformer-bandwidth-2x2"] = ("transformer", _rate_pair(
        "inter-host bandwidth, 400 vs 1600 Mbit/s, 2 hosts x 2 ranks (a host's ranks share "
        "its core)", lo, hi, {"nproc_per_host": 2}, ranks_per_node=2))
    # the second batch, captured after the second freeze (FROZEN_2): each differs from every
    # pair before it -- a new model family (an embedding-bag recommender) on a new rate pair
    # (500 vs 2000 Mbit/s) and on the DDP bucket knob, the dp knob (2 hosts x 2 ranks) on the
    # conv net, and another link shaping (a 2x token bucket at 500 vs 2000 Mbit/s)
    out["emb-bandwidth-500-2000"] = ("emb", _rate_pair(
        "inter-host bandwidth, 500 vs 2000 Mbit/s per direction (embedding-bag recommender)",
        500.0, 2000.0))
    out["emb-bucket"] = ("emb", _bucket_pair(
        "DDP bucket_cap_mb (MiB; the key counts 10^6 bytes) (embedding-bag recommender)"))
    dp = spec["dp"]("cnn")
    out["cnn-dp"] = ("cnn", Pair(f"{dp.knob} (conv net)", dp.a, dp.b, dp.a_to_b, dp.b_to_a))
    out["transformer-bandwidth-500-2000-burst2"] = ("transformer", _rate_pair(
        "inter-host bandwidth, 500 vs 2000 Mbit/s, on a link whose token bucket is 2x the "
        "kit's (burst_x 2)", 500.0, 2000.0, {"burst_x": 2.0}))
    # the third batch, captured after the third freeze (FROZEN_3): kinds the suite has little
    # of -- a per-rank batch change at small batches (32 vs 16; a held-out user capture
    # missed by 20% on such a change), the transformer's DDP bucket at a rate not used
    # before (1000 Mbit/s), a faster network on a new rate pair (400 vs 2000 Mbit/s; a
    # held-out MLP capture missed by 65%), and another tbf burst rule (half the kit's: one
    # timer tick of the rate) with another profiler schedule (wait 2, warmup 2, active 5)
    out["mlp-batch-32-16"] = ("mlp", Pair(
        "per-rank batch size at small batches, 32 vs 16", {"batch": 32}, {"batch": 16},
        {"parallel.micro_batch": 16}, {"parallel.micro_batch": 32}))
    out["transformer-bucket-1000mbit"] = ("transformer", _bucket_pair(
        "DDP bucket_cap_mb (MiB; the key counts 10^6 bytes) on a 1000 Mbit/s link", {"rate_mbit": 1000.0}))
    out["mlp-bandwidth-400-2000"] = ("mlp", _rate_pair(
        "inter-host bandwidth, 400 vs 2000 Mbit/s per direction", 400.0, 2000.0))
    out["emb-bandwidth-300-1000-burst-half"] = ("emb", _rate_pair(
        "inter-host bandwidth, 300 vs 1000 Mbit/s, on a link whose token bucket is half the "
        "kit's (burst_x 0.5: one timer tick of the rate), profiler schedule wait 2 warmup 2 "
        "active 5 (embedding-bag recommender)", 300.0, 1000.0,
        {"burst_x": 0.5, "wait": 2, "warmup": 2, "active": 5}))
    # a fifth, defined after the first four were captured (before its own capture, with no
    # prediction run): mlp-batch-32-16's step did not move (22.9 vs 22.8 ms, all-reduce
    # bound), so it cannot test a batch change; the transformer at the same batches can
    out["transformer-batch-32-16"] = ("transformer", Pair(
        "per-rank batch size at larger batches, 32 vs 16 (transformer)", {"batch": 32},
        {"batch": 16}, {"parallel.micro_batch": 16}, {"parallel.micro_batch": 32}))
    # the fourth batch, captured after the fourth freeze (FROZEN_4): a per-rank batch change
    # on a model no batch pair used (the recommender: embedding bags, dense table gradients)
    # by a factor of 4 at small batches; activation checkpointing on the conv net (only the
    # MLP and the transformer had it); a host speed not used before (70%) on the recommender
    out["emb-batch-64-16"] = ("emb", Pair(
        "per-rank batch size 64 vs 16 (embedding-bag recommender)", {"batch": 64},
        {"batch": 16}, {"parallel.micro_batch": 16}, {"parallel.micro_batch": 64}))
    out["cnn-checkpoint"] = ("cnn", Pair(
        "activation checkpointing per block (torch.utils.checkpoint, use_reentrant=False; "
        "conv net)", {"checkpoint": False}, {"checkpoint": True},
        {"cache.recompute": "full"}, {"cache.recompute": "none"}))
    out["emb-host-speed-70"] = ("emb", Pair(
        "host CPU speed: real-time runtime 9.5 ms vs 6.65 ms per 10 ms on every host "
        "(embedding-bag recommender)", {"speed_pct": 100.0}, {"speed_pct": 70.0},
        {"hardware.host_speedup": 0.7}, {"hardware.host_speedup": round(1 / 0.7, 6)}))
    # a fourth, defined after emb-batch-64-16 was captured (before its own capture, with no
    # prediction run): the recommender's step barely moved (64.2 vs 61.9 ms, all-reduce
    # bound), so it judges a batch change little; the conv net at batch 32 vs 8 (a factor of
    # 4, a batch no pair used) moves its step
    out["cnn-batch-32-8"] = ("cnn", Pair(
        "per-rank batch size 32 vs 8 (conv net)", {"batch": 32}, {"batch": 8},
        {"parallel.micro_batch": 8}, {"parallel.micro_batch": 32}))
    # the fifth batch, captured after the fifth freeze (FROZEN_5, 4ae6ed3): per-rank batch
    # changes on model/batch combos no pair used -- the recommender at small batches (32 vs
    # 8; emb-batch-64-16 shaped the zero-fill rule, this judges it) and the transformer by a
    # factor of 4 (16 vs 4) -- and the recommender's DDP bucket on an 800 Mbit/s link (the
    # kit's overlap probe gives the calibration file; emb-bucket ran at 1600)
    out["emb-batch-32-8"] = ("emb", Pair(
        "per-rank batch size 32 vs 8 (embedding-bag recommender)", {"batch": 32},
        {"batch": 8}, {"parallel.micro_batch": 8}, {"parallel.micro_batch": 32}))
    out["transformer-batch-16-4"] = ("transformer", Pair(
        "per-rank batch size 16 vs 4 (transformer)", {"batch": 16}, {"batch": 4},
        {"parallel.micro_batch": 4}, {"parallel.micro_batch": 16}))
    out["emb-bucket-800mbit"] = ("emb", _bucket_pair(
        "DDP bucket_cap_mb (MiB; the key counts 10^6 bytes) on an 800 Mbit/s link "
        "(embedding-bag recommender)", {"rate_mbit": 800.0}))
    # a fourth, defined after emb-batch-32-8 and transformer-batch-16-4 were captured (before
    # its own capture, with no prediction run): the recommender's step did not move at 32 vs
    # 8 (59.6 vs 60.0 ms, its 10 MB all-reduce bounds it), so it judges a batch change
    # little; at 2048 vs 512 (its base batch) its compute can move the step
    out["emb-batch-2048-512"] = ("emb", Pair(
        "per-rank batch size 2048 vs 512 (embedding-bag recommender)", {"batch": 2048},
        {"batch": 512}, {"parallel.micro_batch": 512}, {"parallel.micro_batch": 2048}))
    # the sixth batch, captured after the sixth freeze (FROZEN_6): a rate pair not used
    # before (250 vs 1000 Mbit/s) on a token bucket no pair had (3x the kit's rule: 750 KB /
    # 3 MB, so at 1000 Mbit/s most but not all of the MLP's 4.2 MB all-reduce rides on
    # tokens); the DDP bucket with 2 ranks on each of 2 hosts (every bucket pair ran 1 rank
    # per host); checkpointing on the transformer at a rate no checkpoint pair used (1200
    # Mbit/s); a host speed not used before (60%) on the conv net (no host-speed pair had it)
    out["mlp-bandwidth-250-1000-burst3"] = ("mlp", _rate_pair(
        "inter-host bandwidth, 250 vs 1000 Mbit/s, on a link whose token bucket is 3x the "
        "kit's (burst_x 3)", 250.0, 1000.0, {"burst_x": 3.0}))
    out["mlp-bucket-2x2"] = ("mlp", _bucket_pair(
        "DDP bucket_cap_mb (MiB; the key counts 10^6 bytes), 2 hosts x 2 ranks (a host's "
        "ranks share its core)", {"nproc_per_host": 2}))
    out["transformer-checkpoint-1200mbit"] = ("transformer", _on_link(
        spec["checkpoint"], 1200.0)("transformer"))
    out["cnn-host-speed-60"] = ("cnn", Pair(
        "host CPU speed: real-time runtime 9.5 ms vs 5.7 ms per 10 ms on every host (conv net)",
        {"speed_pct": 100.0}, {"speed_pct": 60.0},
        {"hardware.host_speedup": 0.6}, {"hardware.host_speedup": round(1 / 0.6, 6)}))
    # the seventh batch, captured after the seventh freeze (FROZEN_7): the transformer on a
    # rate pair it never ran (300 vs 1200 Mbit/s) with a token bucket no pair had (1.5x the
    # kit's rule); the conv net with 2 ranks on each of 2 hosts under a rate change (only
    # the transformer had a rate change at 2x2); the transformer's batch (8 vs 2, a batch
    # no pair used) on a 600 Mbit/s link (a rate no pair used); ranks per host on the
    # recommender (only the MLP and the transformer had it) on a 1200 Mbit/s link
    out["transformer-bandwidth-300-1200-burst1.5"] = ("transformer", _rate_pair(
        "inter-host bandwidth, 300 vs 1200 Mbit/s, on a link whose token bucket is 1.5x the "
        "kit's (burst_x 1.5)", 300.0, 1200.0, {"burst_x": 1.5}))
    out["cnn-bandwidth-400-1600-2x2"] = ("cnn", _rate_pair(
        "inter-host bandwidth, 400 vs 1600 Mbit/s, 2 hosts x 2 ranks (a host's ranks share "
        "its core; conv net)", lo, hi, {"nproc_per_host": 2}, ranks_per_node=2))
    out["transformer-batch-8-2-600mbit"] = ("transformer", Pair(
        "per-rank batch size 8 vs 2 on a 600 Mbit/s link (transformer)",
        {"batch": 8, "rate_mbit": 600.0}, {"batch": 2, "rate_mbit": 600.0},
        {"parallel.micro_batch": 2}, {"parallel.micro_batch": 8}))
    rph = _on_link(spec["ranks-per-host"], 1200.0)("emb")
    out["emb-ranks-per-host-1200mbit"] = ("emb", Pair(
        f"{rph.knob} (embedding-bag recommender)", rph.a, rph.b, rph.a_to_b, rph.b_to_a))
    # the eighth batch, captured after the eighth freeze (FROZEN_8): the conv net's DDP
    # bucket (no bucket pair on it; its 1.0 MB of gradients fit one 1 MiB bucket, so 0.25 vs
    # 25 MiB, a bucket no pair used) on a 500 Mbit/s link (no bucket pair at that rate); the
    # recommender at a rate pair no pair used (700 vs 1400 Mbit/s) with 2 ranks on each of 2
    # hosts (it never ran 2x2); checkpointing on the transformer at 2000 Mbit/s (no
    # checkpoint pair at that rate); the MLP's per-rank batch 2048 vs 512 (a batch no MLP pair
    # used; mlp-batch-32-16's step did not move, all-reduce bound, so small batches judge a
    # batch change little) on a token bucket no batch pair had (burst_x 2 at 1600 Mbit/s)
    out["cnn-bucket-0.25-25-500mbit"] = ("cnn", Pair(
        "DDP bucket_cap_mb 0.25 vs 25 MiB (the key counts 10^6 bytes) on a 500 Mbit/s link "
        "(conv net)", {"bucket_cap_mb": 0.25, "rate_mbit": 500.0},
        {"bucket_cap_mb": 25.0, "rate_mbit": 500.0},
        {"overlap.bucket_mb": round(25 * MIB_MB, 6)},
        {"overlap.bucket_mb": round(0.25 * MIB_MB, 6)}))
    out["emb-bandwidth-700-1400-2x2"] = ("emb", _rate_pair(
        "inter-host bandwidth, 700 vs 1400 Mbit/s, 2 hosts x 2 ranks (a host's ranks share "
        "its core; embedding-bag recommender)", 700.0, 1400.0, {"nproc_per_host": 2},
        ranks_per_node=2))
    out["transformer-checkpoint-2000mbit"] = ("transformer", _on_link(
        spec["checkpoint"], 2000.0)("transformer"))
    out["mlp-batch-2048-512-burst2"] = ("mlp", Pair(
        "per-rank batch size 2048 vs 512 on a link whose token bucket is 2x the kit's "
        "(burst_x 2, 1600 Mbit/s)", {"batch": 2048, "burst_x": 2.0},
        {"batch": 512, "burst_x": 2.0},
        {"parallel.micro_batch": 512}, {"parallel.micro_batch": 2048}))
    # the ninth batch, captured after the ninth freeze (FROZEN_9, the range-only link bound):
    # the conv net's DDP bucket at 0.125 vs 25 MiB (a bucket no pair used; its 332 KB conv
    # weights each ride the link's 900 KB token bucket, so the small-bucket trace's fit
    # beats the link, as batch 8's miss) on a 900 Mbit/s link (a rate no pair used); the
    # transformer on a rate pair no pair used (600 vs 1800 Mbit/s); the recommender's batch
    # 1024 vs 256 (a batch no pair used) on a 2x token bucket (no emb batch pair had one);
    # checkpointing on the MLP at 500 Mbit/s (no checkpoint pair at that rate)
    out["cnn-bucket-0.125-25-900mbit"] = ("cnn", Pair(
        "DDP bucket_cap_mb 0.125 vs 25 MiB (the key counts 10^6 bytes) on a 900 Mbit/s link "
        "(conv net)", {"bucket_cap_mb": 0.125, "rate_mbit": 900.0},
        {"bucket_cap_mb": 25.0, "rate_mbit": 900.0},
        {"overlap.bucket_mb": round(25 * MIB_MB, 6)},
        {"overlap.bucket_mb": round(0.125 * MIB_MB, 6)}))
    out["transformer-bandwidth-600-1800"] = ("transformer", _rate_pair(
        "inter-host bandwidth, 600 vs 1800 Mbit/s per direction (transformer)", 600.0, 1800.0))
    out["emb-batch-1024-256-burst2"] = ("emb", Pair(
        "per-rank batch size 1024 vs 256 on a link whose token bucket is 2x the kit's "
        "(burst_x 2, 1600 Mbit/s; embedding-bag recommender)", {"batch": 1024, "burst_x": 2.0},
        {"batch": 256, "burst_x": 2.0},
        {"parallel.micro_batch": 256}, {"parallel.micro_batch": 1024}))
    out["mlp-checkpoint-500mbit"] = ("mlp", _on_link(spec["checkpoint"], 500.0)("mlp"))
    # the tenth batch, captured after the tenth freeze (FROZEN_10, session 10; defined before
    # the freeze and before any capture): small DDP buckets on a rate and a model no bucket
    # pair had (the conv net at 0.5 vs 25 MiB on 1200 Mbit/s, whose 1.2 MB token bucket holds
    # each small bucket; the MLP at 0.5 vs 25 MiB on 600 Mbit/s, whose 600 KB token bucket
    # holds half of each 1 MiB weight gradient), a host speed no pair used (40%) on the
    # transformer, the recommender on a rate pair it never ran (200 vs 800 Mbit/s), and a
    # per-rank batch change with 2 ranks on each of 2 hosts (no batch pair ran 2x2)
    out["cnn-bucket-0.5-25-1200mbit"] = ("cnn", Pair(
        "DDP bucket_cap_mb 0.5 vs 25 MiB (the key counts 10^6 bytes) on a 1200 Mbit/s link "
        "(conv net)", {"bucket_cap_mb": 0.5, "rate_mbit": 1200.0},
        {"bucket_cap_mb": 25.0, "rate_mbit": 1200.0},
        {"overlap.bucket_mb": round(25 * MIB_MB, 6)},
        {"overlap.bucket_mb": round(0.5 * MIB_MB, 6)}))
    out["mlp-bucket-0.5-25-600mbit"] = ("mlp", Pair(
        "DDP bucket_cap_mb 0.5 vs 25 MiB (the key counts 10^6 bytes) on a 600 Mbit/s link",
        {"bucket_cap_mb": 0.5, "rate_mbit": 600.0}, {"bucket_cap_mb": 25.0, "rate_mbit": 600.0},
        {"overlap.bucket_mb": round(25 * MIB_MB, 6)},
        {"overlap.bucket_mb": round(0.5 * MIB_MB, 6)}))
    out["transformer-host-speed-40"] = ("transformer", Pair(
        "host CPU speed: real-time runtime 9.5 ms vs 3.8 ms per 10 ms on every host "
        "(transformer)", {"speed_pct": 100.0}, {"speed_pct": 40.0},
        {"hardware.host_speedup": 0.4}, {"hardware.host_speedup": 2.5}))
    out["emb-bandwidth-200-800"] = ("emb", _rate_pair(
        "inter-host bandwidth, 200 vs 800 Mbit/s per direction (embedding-bag recommender)",
        200.0, 800.0))
    out["cnn-batch-64-16-2x2"] = ("cnn", Pair(
        "per-rank batch size 64 vs 16, 2 hosts x 2 ranks (a host's ranks share its core; "
        "conv net)", {"batch": 64, "nproc_per_host": 2}, {"batch": 16, "nproc_per_host": 2},
        {"parallel.micro_batch": 16}, {"parallel.micro_batch": 64}))
    return out


#: the pairs captured after the models were frozen (judged apart, pairs.json after_freeze)
FROZEN = ("cnn-bandwidth-300-1200", "cnn-batch", "mlp-bandwidth-burst4",
          "transformer-bandwidth-2x2")
#: the second batch, captured after the second freeze (pairs.json after_freeze: 2)
FROZEN_2 = ("emb-bandwidth-500-2000", "emb-bucket", "cnn-dp",
            "transformer-bandwidth-500-2000-burst2")
#: the third batch, captured after the third freeze (pairs.json after_freeze: 3)
FROZEN_3 = ("mlp-batch-32-16", "transformer-bucket-1000mbit", "mlp-bandwidth-400-2000",
            "emb-bandwidth-300-1000-burst-half", "transformer-batch-32-16")
#: the fourth batch, captured after the fourth freeze (pairs.json after_freeze: 4)
FROZEN_4 = ("emb-batch-64-16", "cnn-checkpoint", "emb-host-speed-70", "cnn-batch-32-8")
#: the fifth batch, captured after the fifth freeze (pairs.json after_freeze: 5)
FROZEN_5 = ("emb-batch-32-8", "transformer-batch-16-4", "emb-bucket-800mbit",
            "emb-batch-2048-512")
#: the sixth batch, captured after the sixth freeze (pairs.json after_freeze: 6)
FROZEN_6 = ("mlp-bandwidth-250-1000-burst3", "mlp-bucket-2x2", "transformer-checkpoint-1200mbit",
            "cnn-host-speed-60")
#: the seventh batch, captured after the seventh freeze (pairs.json after_freeze: 7)
FROZEN_7 = ("transformer-bandwidth-300-1200-burst1.5", "cnn-bandwidth-400-1600-2x2",
            "transformer-batch-8-2-600mbit", "emb-ranks-per-host-1200mbit")
#: the eighth batch, captured after the eighth freeze (pairs.json after_freeze: 8)
FROZEN_8 = ("cnn-bucket-0.25-25-500mbit", "emb-bandwidth-700-1400-2x2",
            "transformer-checkpoint-2000mbit", "mlp-batch-2048-512-burst2")
#: the ninth batch, captured after the ninth freeze (pairs.json after_freeze: 9)
FROZEN_9 = ("cnn-bucket-0.125-25-900mbit", "transformer-bandwidth-600-1800",
            "emb-batch-1024-256-burst2", "mlp-checkpoint-500mbit")
#: the tenth batch, captured after the tenth freeze (pairs.json after_freeze: 10)
FROZEN_10 = ("cnn-bucket-0.5-25-1200mbit", "mlp-bucket-0.5-25-600mbit",
             "transformer-host-speed-40", "emb-bandwidth-200-800", "cnn-batch-64-16-2x2")
#: the batches judged after a freeze with its commit (after_freeze 2, 3, ...)
LATER = (FROZEN_2, FROZEN_3, FROZEN_4, FROZEN_5, FROZEN_6, FROZEN_7, FROZEN_8, FROZEN_9,
         FROZEN_10)


def stated(pair: Pair, a: dict, b: dict) -> dict[str, dict]:
    """Cluster facts a user states for each direction (pairs.json ``stated``), never read from
    a trace: for a pair on the link's rate, the nominal rate of the link the source trace ran
    on (``network.measured_inter_node_gbps``; also for a DDP bucket pair across hosts); where a setting runs 2 ranks on each of 2
    hosts, the one core each host gives the job (``topology.cores_per_node``)."""
    out: dict[str, dict] = {"A->B": {}, "B->A": {}}
    for d, src in (("A->B", a), ("B->A", b)):
        if any(s["nhosts"] > 1 and s["nproc_per_host"] > 1 for s in (a, b)):
            out[d]["topology.cores_per_node"] = 1
        if a["rate_mbit"] != b["rate_mbit"] or (
                "overlap.bucket_mb" in pair.a_to_b and src["nhosts"] > 1):
            # a rate pair, or a re-bucketing whose new buckets may outgrow every transfer
            # the trace's link fit saw (link_fit.bound_by_stated_rate)
            out[d]["network.measured_inter_node_gbps"] = _gbps(src["rate_mbit"])
    return {d: v for d, v in out.items() if v}


def _on_link(make, rate_mbit: float):
    """A pair maker whose settings both run on a ``rate_mbit`` link (the keys that name the
    link's rate follow it)."""
    def made(m: str) -> Pair:
        p = make(m)
        fix = lambda keys: {k: (_gbps(rate_mbit) if k == "network.inter_node_gbps" else v)  # noqa: E731
                            for k, v in keys.items()}
        return Pair(f"{p.knob} on an {rate_mbit:g} Mbit/s link",
                    {**p.a, "rate_mbit": rate_mbit}, {**p.b, "rate_mbit": rate_mbit},
                    fix(p.a_to_b), fix(p.b_to_a))
    return made


PAIRS = _pairs()
