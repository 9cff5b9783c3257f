"""The catalogue of what-if keys: unit, values, default and the traces that support each.

``retime keys`` prints it; :func:`retime.replay.policies.scenario.vocabulary` is the list
of keys the scenario parser accepts, and a test keeps the two equal (a new policy field
without an entry here fails it). "Supports" names the trace kinds where the key works and
what those traces must hold; elsewhere the key is refused with a message naming what is
missing. Kinds: ``synth`` (``retime synth`` runs, re-synthesized), ``kineto`` / ``nsys``
(measured kernel-level traces, re-timed), ``oplevel`` (measured Megatron-timer traces,
re-laid out from per-stage templates).

The module is plain data (no numpy, no policies imported), so ``retime keys`` starts fast.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KeyInfo", "KEYS", "key_rows"]


@dataclass(frozen=True)
class KeyInfo:
    """One what-if key as ``retime keys`` shows it."""

    unit: str       # unit or type of the value
    values: str     # allowed values
    default: str    # what happens when the key is not given
    supports: str   # trace kinds (and what they must hold)
    help: str       # one line: what the key changes


#: On a measured trace, the facts a key's what-if needs and where each comes from: the
#: trace itself, what you state (other keys), or a calibration file (--calibration). Keys
#: not listed work from the trace alone, or re-synthesize a `retime synth` run (whose
#: description holds every fact).
NEEDS: dict[str, str] = {
    "topology.ranks_per_node": "trace: host names (which ranks share a host); you: the "
    "new ranks per host, and network.intra/inter_node_gbps for a level the trace never used",
    "topology.nvlink_domain": "you: the ranks of one NVLink domain (a trace's host names "
    "say which ranks share a tray, not a rack)",
    "topology.cores_per_node": "you: the cores each host gives the job (a plain trace does "
    "not record CPU sets)",
    "parallel.dp": "trace: every rank, sized all-reduces, host names; you: "
    "topology.ranks_per_node of the new job, on CPU jobs topology.cores_per_node",
    "parallel.micro_batch": "trace: forward/backward phases and the measured batch (the "
    "forward's recorded input shapes); on GPU traces the kernels' recorded shapes (priced "
    "by the cost layer at the new batch; kernels without shapes scale linearly, printed)",
    "cache.recompute": "trace: per-layer module ranges (with_stack) or checkpoint frames",
    "hardware.host_speedup": "trace: host ops and the gaps between them (nothing else)",
    "hardware.gpu": "trace: the kernels' recorded shapes (record_shapes: each kernel priced "
    "by the cost layer on both GPUs) else kernel names (GEMM/conv: the ratio of their math "
    "mode's peaks, FP32 SIMT / TF32 / 16-bit ...; other classes: flat ratio of peaks or HBM, "
    "printed); the GPU profiles (datasheet peaks, published ceilings)",
    "hardware.allow_tf32": "trace: the kernels' names (their math mode: FP32 SIMT or TF32 "
    "as measured); you: the setting on the target, where the trace's GPU had no TF32 units "
    "(else PyTorch's defaults, the range spans both)",
    "network.inter_node_gbps": "you: the new link's nominal rate; trace: sized collectives "
    "(the fitted bandwidth, printed); calibration: the latency where the trace has one "
    "message size",
    "network.intra_node_gbps": "you: the new rate; trace: sized intra-host collectives, else "
    "the host's copy rate from the DDP reducer's recorded shapes (gloo, an upper bound)",
    "network.measured_inter_node_gbps": "you: the nominal rate of the link the trace ran "
    "on; trace: its sized inter-host collectives",
    "network.measured_intra_node_gbps": "you: the nominal intra-node rate the trace ran on; "
    "trace: its sized intra-host collectives",
    "network.alpha_share": "nothing: the range's bound when the trace cannot tell latency "
    "from bandwidth",
    "overlap.bucket_mb": "trace: the DDP reducer's per-parameter calls with their recorded "
    "shapes (sizes and ready order), sized all-reduces; calibration: how a transfer shares "
    "the CPU with compute (gloo; else estimated, the range spans its bounds)",
    "overlap.interference": "you: the fraction of ideal overlap (else the trace's estimate "
    "or the calibration's probe)",
    "overlap.probe_bound": "calibration: the overlap probe's repetitions",
    "overlap.link_bound": "you: the nominal rate of the link the trace ran on "
    "(network.measured_inter_node_gbps)",
    "overlap.sm_share": "trace: NCCL/RCCL kernels on GPU streams overlapping compute "
    "kernels, the GPU's name and SM count (the measured share: the NCCL kernels' launch "
    "grid, else the NCCL model's channels, assumed); published: C3's overlap fractions "
    "(collectors/costs/REFERENCES.md C12)",
    "overlap.peer_wait": "trace: the measured buckets' times beyond the modeled transfer "
    "(partially traced collectives)",
    "overlap.cost_bound": "nothing: the range's bounds of the NCCL model and the "
    "interference model",
}


_ALL = "all traces"
_NET = ("synth; kineto/nsys with sized collectives (calibrated alpha-beta model per level); "
        "not oplevel")
_LAYOUT_M = "synth; oplevel (per-stage templates)"
_SYNTH = "synth only"

KEYS: dict[str, KeyInfo] = {
    # topology
    "topology.ranks_per_node": KeyInfo(
        "ranks", "integer >= 1", "ranks sharing a host name in the trace, else the hardware "
        "profile's GPUs per node", "synth; kineto/nsys with sized collectives (crossing levels "
        "need a calibrated or given inter_node_gbps)", "GPUs per node: which collectives "
        "cross the inter-node network"),
    "topology.nvlink_domain": KeyInfo(
        "ranks", "integer >= 1 (synth: at most the hardware's domain, dividing the GPUs, "
        ">= parallel.tp)", "the hardware profile's NVLink domain (72 on gb200 / gb300, where "
        "it does not divide the job the largest whole number of trays per rack that does), "
        "else GPUs per node", "synth; kineto/nsys with sized collectives (as "
        "topology.ranks_per_node)", "ranks sharing one NVLink domain: collectives inside it "
        "run on NVLink whatever trays they span, only those crossing domains use the network"),
    "topology.nics": KeyInfo("NICs", "integer >= 1", "hardware profile", _SYNTH,
                             "network interfaces per node (inter-node bandwidth per GPU)"),
    "topology.cores_per_node": KeyInfo(
        "cores", "integer >= 1", "the CPU sets a retime capture recorded, else one core per "
        "rank (no sharing; printed as assumed)", "kineto CPU (gloo) traces with host names",
        "CPU cores each host gives the job, before and after (what you know of your hosts: "
        "ranks beyond that on one host time-share its cores)"),
    # parallel
    "parallel.dp": KeyInfo("ranks", "integer >= 1", "unchanged", _LAYOUT_M + "; kineto/nsys "
                           "pure data-parallel traces with every rank traced",
                           "data-parallel degree (fixed per-rank batch)"),
    "parallel.tp": KeyInfo("ranks", "integer >= 1 (<= 8 on a measured trace)", "unchanged",
                           _SYNTH + "; kineto with recorded shapes: consecutive linear layers "
                           "split as column/row pairs, attention blocks by heads, TP "
                           "all-reduces by the NCCL model (CPU runs: gloo from --calibration)",
                           "tensor-parallel degree"),
    "parallel.pp": KeyInfo("stages", "integer >= 1", "unchanged", _LAYOUT_M,
                           "pipeline-parallel degree"),
    "parallel.cp": KeyInfo("ranks", "integer >= 1", "unchanged", _SYNTH,
                           "context-parallel degree"),
    "parallel.schedule": KeyInfo("name", "gpipe | 1f1b | interleaved | bfs | zb-h1 | dualpipe",
                                 "unchanged", "synth; oplevel (gpipe, 1f1b, interleaved, bfs)",
                                 "pipeline schedule"),
    "parallel.chunks": KeyInfo("chunks", "integer >= 1 (> 1 needs interleaved or bfs)",
                               "unchanged", _LAYOUT_M, "model chunks per pipeline rank"),
    "parallel.micro_batch": KeyInfo("sequences", "integer >= 1", "unchanged",
                                    "synth; kineto traces with forward/backward phases and the "
                                    "measured batch (capture metadata or recorded shapes)",
                                    "sequences per micro-batch (per-rank batch); GPU traces: "
                                    "kernels re-priced at the new shapes, host work kept"),
    "parallel.global_batch": KeyInfo("sequences", "integer >= 1", "unchanged", _LAYOUT_M,
                                     "sequences per optimizer step"),
    "parallel.zero": KeyInfo("stage", "0 | 1 | 2 | 3", "unchanged", _LAYOUT_M,
                             "ZeRO stage (optimizer / gradient / parameter sharding)"),
    "parallel.fsdp": KeyInfo("flag", "true | false", "unchanged", _SYNTH,
                             "FSDP (ZeRO-3 with per-layer units)"),
    "parallel.sequence_parallel": KeyInfo("flag", "true | false", "unchanged", _SYNTH,
                                          "Megatron sequence parallelism"),
    "parallel.microbatches": KeyInfo("micro-batches", "integer >= 1", "unchanged", _LAYOUT_M,
                                     "micro-batches per pipeline (sets global_batch)"),
    "parallel.durations": KeyInfo("name", "stage | ideal", "stage", "oplevel only",
                                  "template durations: per-stage medians or the ideal ones"),
    "parallel.ep": KeyInfo("ranks", "integer >= 1 dividing dp and the model's experts",
                           "unchanged", _SYNTH + " (mixture-of-experts models)",
                           "expert-parallel degree (dispatch / combine all-to-alls)"),
    "parallel.moe_imbalance": KeyInfo("ratio", "number >= 1", "unchanged (1.0: balanced)",
                                      _SYNTH + " (mixture-of-experts models)",
                                      "most loaded expert's tokens over the mean"),
    "parallel.capacity_factor": KeyInfo("ratio", "0 (dropless) or number >= 1", "unchanged",
                                        _SYNTH + " (mixture-of-experts models)",
                                        "expert capacity over the mean load (pad and drop)"),
    "parallel.p2p": KeyInfo("name", "sync | async", "unchanged (sync: Megatron's blocking "
                            "send/receive)", _SYNTH, "pipeline transfers blocking or overlapped"),
    "parallel.stage_layers": KeyInfo("layers", "list of layers per stage | even | time | "
                                     "memory", "unchanged", _SYNTH,
                                     "uneven pipeline stages (or the time / memory split)"),
    "parallel.stage_slack": KeyInfo("fraction", "number >= 0", "unchanged (0.05)", _SYNTH,
                                    "step-time slack of stage_layers = memory"),
    "parallel.odc": KeyInfo("flag", "true | false (needs ZeRO-3 / FSDP)", "unchanged",
                            _SYNTH, "on-demand point-to-point ZeRO-3 transfers, one sync "
                            "per step"),
    "parallel.seq_imbalance": KeyInfo("ratio", "number >= 1", "unchanged (1.0: balanced)",
                                      _SYNTH, "most loaded data-parallel rank's work over the "
                                      "mean, per micro-batch"),
    "parallel.dtype": KeyInfo("name", "bf16 | fp16 | fp8 | fp4 (fp8 / fp4 need an FP8 / FP4 "
                              "peak; fp4 keeps attention, the head and the first / last layer "
                              "in BF16)",
                              "unchanged", _SYNTH, "compute dtype of the GEMMs"),
    "parallel.grad_overlap": KeyInfo("flag", "true | false", "unchanged (false: after the "
                                     "last backward, as Megatron-LM)", _SYNTH,
                                     "data-parallel gradient reduction during the backward"),
    "parallel.tp_comm_overlap": KeyInfo("flag", "true | false (needs sequence parallelism)",
                                   "unchanged (false, as Megatron-LM)", _SYNTH,
                                   "TP all-gathers / reduce-scatters beside their GEMMs "
                                   "(--tp-comm-overlap)"),
    "parallel.offload_layers": KeyInfo("layers", "integer >= 0, fewer than the model's layers "
                                       "(pp 1 only)", "unchanged (0)", _SYNTH,
                                       "activations of the first N layers offloaded to host "
                                       "memory over the host link"),
    # cache
    "cache.fcdp": KeyInfo("flag", "true | false", "false", "synth with ZeRO-3/FSDP and dp > 1; "
                          "measured traces with ZeRO-3/FSDP gathers in forward and backward",
                          "cache gathered parameters in host memory (FCDP)"),
    "cache.keep_params": KeyInfo("flag", "true | false", "false", "as cache.fcdp",
                                 "keep gathered parameters in GPU memory"),
    "cache.recompute": KeyInfo("mode", "none | selective | full", "unchanged",
                               "synth; oplevel (full); kineto traces with module ranges "
                               "(full) or torch.utils.checkpoint frames (none), recorded "
                               "with Python stacks",
                               "activation recomputation"),
    "cache.offload_optimizer": KeyInfo("flag", "true | false", "false",
                                       "synth; kineto DDP traces with sized gradient "
                                       "all-reduces and an Optimizer.step range",
                                       "optimizer state and step on the host (ZeRO-Offload)"),
    "cache.offload_activations": KeyInfo("flag", "true | false", "false",
                                         "synth; kineto traces with GPU [memory] events and "
                                         "forward/backward phases",
                                         "activations offloaded to host memory"),
    "cache.pcie_gbps": KeyInfo("GB/s", "> 0", "the hardware profile's host link x its "
                               "efficiency, capped by its host memory share (gb200: NVLink-C2C "
                               "~256; PCIe Gen4 profiles, and measured traces whose GPU no profile names: 25)",
                               "with cache.offload_* or cache.fcdp",
                               "host<->GPU bandwidth (PCIe or NVLink-C2C) for offload and the "
                               "FCDP host cache"),
    "cache.host_gbps": KeyInfo("GB/s", "> 0", "hardware profile's host memory share "
                               "(measured traces: 100)",
                               "with cache.offload_optimizer",
                               "host memory bandwidth of the offloaded optimizer step"),
    # hardware
    "hardware.compute_speedup": KeyInfo("factor", "> 0 (2 = twice as fast)", "1", _ALL,
                                        "every compute kernel class"),
    "hardware.gemm_speedup": KeyInfo("factor", "> 0", "1", _ALL, "GEMM / conv kernels"),
    "hardware.attention_speedup": KeyInfo("factor", "> 0", "1", _ALL, "attention kernels"),
    "hardware.elementwise_speedup": KeyInfo("factor", "> 0", "1", _ALL,
                                            "memory-bound (elementwise, norm, reduce) kernels"),
    "hardware.memcpy_speedup": KeyInfo("factor", "> 0", "1", _ALL, "memcpy / memset"),
    "hardware.comm_speedup": KeyInfo("factor", "> 0", "1", _ALL,
                                     "communication transfer time"),
    "hardware.gpu": KeyInfo("profile", "v100-sxm2 | a100-40gb | a100-80gb | h100-sxm | "
                            "h100-pcie | h200 | b200 | b300 | gb200 | gb300 | mi250x | mi300x "
                            "| mi325x | mi355x", "unchanged",
                            "synth; measured GPU traces whose GPU is a known profile (or "
                            "with hardware.from_gpu); not CPU-only traces",
                            "swap the GPU: measured x model(new)/model(old) per kernel with "
                            "recorded shapes, else the flat roofline ratio per class; host "
                            "time unchanged"),
    "hardware.from_gpu": KeyInfo("profile", "as hardware.gpu", "from the trace's devices",
                                 "with hardware.gpu", "the measured GPU, when the trace does "
                                 "not name a known one"),
    "hardware.kernel_pricing": KeyInfo(
        "name", "shapes | flat", "shapes", "kineto GPU traces (with hardware.gpu or "
        "parallel.micro_batch); kineto CPU traces with parallel.micro_batch",
        "how measured kernels are re-timed: from their recorded shapes through the cost "
        "layer, or by the flat rule (class ratio of peaks; linear in the batch), the other end "
        "of the range; on a CPU trace's batch change, whether a host GEMM keeps its weight "
        "copy (shapes) or scales whole (flat)"),
    "hardware.allow_tf32": KeyInfo(
        "bool", "true | false", "PyTorch's defaults (>= 1.12: GEMMs FP32, convolutions TF32) "
        "where the trace cannot show the setting (its GPU has no TF32 units), else the math "
        "its kernels show; the range replays the other setting",
        "kineto/nsys GPU traces with hardware.gpu (the trace's own GPU: the math alone)",
        "whether FP32 GEMMs and convolutions run on TF32 tensor cores on the target GPU "
        "(torch.backends.cuda.matmul.allow_tf32 / torch.backends.cudnn.allow_tf32; NVIDIA "
        "Ampere and newer)"),
    "hardware.slow_ranks": KeyInfo("ranks", "list of rank numbers in the trace", "none",
                                   _ALL, "ranks whose compute and memcpy are slowed"),
    "hardware.rank_slowdown": KeyInfo("factor", "> 0 (1.5 = 50% slower)", "none",
                                      "with hardware.slow_ranks", "their slowdown"),
    "hardware.host_speedup": KeyInfo("factor", "> 0", "1", _ALL,
                                     "host (CPU) work, its gaps and unexplained delays"),
    "hardware.cuda_graphs": KeyInfo(
        "mode", "step | forward_backward | false", "false (eager launches as measured)",
        "synth; kineto/nsys with launch calls correlated to GPU ops and operator events or "
        "ranges on the launching threads (forward_backward: forward/backward phases)",
        "capture regions as CUDA graphs: launches and launch-only host work become one "
        "graph launch"),
    "hardware.graph_launch_us": KeyInfo("us", ">= 0", "10", "with hardware.cuda_graphs",
                                        "host cost of one graph launch (cudaGraphLaunch + "
                                        "the framework's replay call)"),
    "hardware.graph_node_us": KeyInfo("us", ">= 0", "1", "with hardware.cuda_graphs",
                                      "GPU front-end cost per kernel of a replayed graph"),
    # network
    "network.intra_node_gbps": KeyInfo("GB/s per GPU per direction", "> 0", "calibrated / "
                                       "hardware profile", _NET, "intra-node bandwidth"),
    "network.inter_node_gbps": KeyInfo("GB/s per GPU per direction", "> 0", "calibrated / "
                                       "hardware profile", _NET, "inter-node bandwidth"),
    "network.latency_us": KeyInfo("us per algorithm step", ">= 0", "calibrated / hardware "
                                  "profile", _NET, "inter-node latency"),
    "network.intra_latency_us": KeyInfo("us per algorithm step", ">= 0", "calibrated / "
                                        "hardware profile", _NET, "intra-node latency"),
    "network.algorithm": KeyInfo("name", "ring | tree", "ring", _NET,
                                 "all-reduce algorithm"),
    "network.bus_efficiency": KeyInfo("fraction", "(0, 1]", "hardware profile", _NET,
                                      "achieved fraction of link bandwidth"),
    "network.intra_bus_efficiency": KeyInfo(
        "fraction", "(0, 1]", "network.bus_efficiency", _NET, "achieved fraction of the "
        "intra-node link's nominal rate (set from a calibration measured on the cluster)"),
    "network.inter_bus_efficiency": KeyInfo(
        "fraction", "(0, 1]", "network.bus_efficiency", _NET, "achieved fraction of the "
        "inter-node link's nominal rate (set from a calibration measured on the cluster)"),
    "network.cross_dc_gbps": KeyInfo("GB/s per GPU per direction", "> 0", "12.5", _NET,
                                     "bandwidth between datacenters (with nodes_per_dc)"),
    "network.cross_dc_km": KeyInfo("km", ">= 0", "hardware profile", _NET,
                                   "distance between datacenters (5 us per km)"),
    "network.nodes_per_dc": KeyInfo("nodes", "integer >= 1", "all nodes in one datacenter",
                                    _NET, "nodes per datacenter"),
    "network.alpha_share": KeyInfo(
        "fraction", "0 .. 0.25", "0: where the trace's collectives have one size, all their "
        "time is bandwidth", "kineto/nsys with sized collectives",
        "share of a measured collective's time taken as fixed latency when the trace cannot "
        "tell (the range's other bound)"),
    "network.measured_intra_node_gbps": KeyInfo(
        "GB/s", "number > 0", "unknown: new rates get the transport's default efficiency",
        _NET, "nominal intra-node rate of the cluster the trace ran on (per GPU and direction): "
        "the efficiency the trace achieved on it carries over to intra_node_gbps"),
    "network.measured_inter_node_gbps": KeyInfo(
        "GB/s", "number > 0", "unknown: new rates get the transport's default efficiency",
        _NET, "nominal inter-node rate of the link the trace ran on (per GPU and direction): "
        "its achieved efficiency carries over to inter_node_gbps; on CPU traces transfers "
        "faster than it reveal a token bucket"),
    # overlap
    "overlap.mode": KeyInfo("name", "serial | async", "unchanged", _ALL,
                            "communication serialized after compute, or overlapped"),
    "overlap.bucket_mb": KeyInfo("MB", "> 0", "unchanged", "synth; kineto/nsys with sized "
                                 "gradient all-reduces", "DDP gradient bucket size"),
    "overlap.merge": KeyInfo("name", "wfbp | single | mgwfbp", "unchanged", _SYNTH,
                             "gradient merge rule"),
    "overlap.interference": KeyInfo("fraction", "[0, 1]", "1 (no interference)", _ALL,
                                    "fraction of ideal compute/communication overlap "
                                    "achieved (C3); runs the contention path"),
    "overlap.share_links": KeyInfo("flag", "true | false", "false", _ALL,
                                   "concurrent transfers share links (max-min fair)"),
    "overlap.tp_slices": KeyInfo("slices", "integer >= 1", "1", "synth with tp > 1",
                                 "tensor-parallel communication overlapped in slices"),
    "overlap.prefetch": KeyInfo("layers", "integer >= 0", "1",
                                "synth with ZeRO-3/FSDP", "FSDP parameter prefetch depth"),
    "overlap.probe_bound": KeyInfo(
        "name", "low | high", "the median of the calibration's repetitions",
        "kineto gloo traces with a calibration (--calibration) or a kit capture's probe",
        "use the fastest (low) or slowest (high) repetitions of the overlap probe: the "
        "prediction range's bounds"),
    "overlap.sm_share": KeyInfo(
        "fraction of the GPU's SMs", "[0, 1] (0 = collectives on DMA engines)",
        "the trace's own (NCCL's channels / SMs): no change",
        "synth; kineto/nsys with NCCL/RCCL kernels on GPU streams (not gloo)",
        "SMs NCCL kernels hold: overlapped compute and communication slow each other by "
        "i = 0.28 + 0.51 * share / 0.2 (C3, a GEMM's); a kernel with recorded shapes by "
        "its arithmetic intensity against the ridge point (memory-bound: NCCL's HBM "
        "traffic, less of the SM part); runs the contention path"),
    "overlap.cost_bound": KeyInfo(
        "name", "low | high", "the model's central figure",
        "kineto/nsys with NCCL/RCCL collectives (with overlap.bucket_mb or sm_share)",
        "price NCCL collectives and their interference at the low / high end of the cost "
        "model's range: the prediction range's bounds"),
    "overlap.peer_wait": KeyInfo(
        "name", "lag | bytes", "the smaller per bucket of lag (the untraced ranks lag as "
        "at the measured buckets) and bytes (the measured wait per step spread by bytes)",
        "kineto/nsys NCCL traces with untraced ranks (with overlap.bucket_mb)",
        "how the wait for untraced ranks carries to new buckets; each alone is a bound of "
        "the range"),
    "overlap.link_bound": KeyInfo(
        "name", "stated", "the trace's link fit, extrapolated",
        "kineto gloo traces with network.measured_inter_node_gbps stated",
        "new buckets' bytes beyond the largest transfer the link fit saw move at the stated "
        "link rate: the prediction range's upper bound"),
    # stragglers
    "stragglers.ideal": KeyInfo("flag", "true | false", "false", _ALL,
                                "drop unexplained delays"),
    "stragglers.ideal_durations": KeyInfo("flag", "true | false", "false", _ALL,
                                          "every op at its ideal duration"),
    "stragglers.slow_ranks": KeyInfo("ranks", "list of rank numbers in the trace", "none",
                                     _ALL, "ranks to slow down"),
    "stragglers.slowdown": KeyInfo("factor", "> 0", "none", "with stragglers.slow_ranks",
                                   "their slowdown"),
    # compression
    "compression.dp": KeyInfo("ratio", ">= 1 (4 = a quarter of the bytes)", "1",
                              "synth (dp / emb groups); kineto/nsys with sized all-reduce / "
                              "reduce-scatter / all-gather collectives", "compress data-"
                              "parallel (gradient / parameter) collectives"),
    "compression.tp": KeyInfo("ratio", ">= 1", "1", "synth with tp > 1; measured traces "
                              "whose process group names say tp / tensor",
                              "compress tensor-parallel collectives"),
    "compression.pp": KeyInfo("ratio", ">= 1", "1", "synth with pp > 1; measured traces with "
                              "sized send / recv (or groups named pp / pipe)",
                              "compress pipeline send / receive"),
    "compression.codec_gbps": KeyInfo("GB/s per GPU", "> 0", "none (an ideal codec)",
                                      "with compression.dp / tp / pp",
                                      "codec throughput: compressor and decompressor run on "
                                      "the compute stream around each compressed message"),
}


def key_rows(prefix: str | None = None) -> list[dict[str, str]]:
    """The catalogue as rows (``retime keys --json``), optionally only one table."""
    return [{"key": k, "unit": v.unit, "values": v.values, "default": v.default,
             "supports": v.supports, "help": v.help,
             "needs": NEEDS.get(k, "trace: what 'supports' names; a synthesized run's own "
                                   "description")}
            for k, v in KEYS.items() if prefix is None or k.startswith(prefix)]
