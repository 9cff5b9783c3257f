"""Parallelism configuration of a modeled run and the rank layout it implies.

Rank layout follows Megatron-LM's default order (tensor fastest, then context, then data,
then pipeline): ``rank = ((stage * dp + d) * cp + c) * tp + t``. Tensor-parallel groups are
therefore contiguous ranks (inside one server when ``tp <= gpus_per_node``), and pipeline
neighbours are ``tp * cp * dp`` ranks apart. Expert parallelism is carved out of data
parallelism (Megatron-Core): an expert-parallel group is ``ep`` consecutive data-parallel
ranks (same stage, context and tensor index; ``tp * cp`` ranks apart), and the ranks that
hold the same experts (``d % ep`` equal) form the expert-data-parallel group that reduces
the experts' gradients (``dp / ep * cp`` ranks).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import ConfigError

__all__ = ["ParallelConfig", "SCHEDULES", "RECOMPUTE", "DTYPES", "P2P", "STAGE_POLICIES",
           "resolve_parallel", "FP4_HIGH", "GRAD_REDUCE"]

SCHEDULES = ("gpipe", "1f1b", "interleaved", "bfs", "zb-h1", "dualpipe")
P2P = ("sync", "async", "serial")
#: ZeRO-1/2 gradient reduction: Megatron-LM reduce-scatter, DeepSpeed per-owner reduce
ZERO_REDUCE = ("reduce_scatter", "reduce")
STAGE_POLICIES = ("even", "time", "memory")
RECOMPUTE = ("none", "selective", "full", "op")
DTYPES = ("bf16", "fp16", "fp8", "fp4")
#: dtype of the data-parallel gradient reduction and main-gradient buffer (``grad_reduce_dtype``)
GRAD_REDUCE = ("auto", "fp32", "bf16", "fp16")
#: dtypes the linear layers FP4 runs keep out of FP4 (``fp4_high_dtype``)
FP4_HIGH = ("bf16", "fp8")


@dataclass(frozen=True)
class ParallelConfig:
    """How one training step is split over ranks.

    ``global_batch`` and ``micro_batch`` are in sequences; the number of micro-batches per
    pipeline is ``global_batch / (micro_batch * dp)``. ``chunks`` is the number of model
    chunks per pipeline rank (``v``) for the interleaved and breadth-first schedules.
    ``zero`` is the ZeRO stage (0-3); ``fsdp`` is ZeRO-3 semantics with per-layer units and
    prefetch. ``bucket_mb`` is the gradient bucket size of data-parallel reduction.

    Mixture of experts: ``ep`` expert-parallel ranks (dividing ``dp``) share a layer's
    routed experts; ``moe_imbalance`` is the most loaded expert's tokens over the mean (the
    rank holding it sets the pace of every all-to-all and expert GEMM); ``capacity_factor``
    > 0 caps every expert at ``capacity_factor`` times the mean load and pads to it (GShard /
    Switch semantics: tokens above it are dropped, every buffer has the capacity's size), 0
    is dropless.

    ``p2p``: ``"sync"`` is Megatron-LM's default pipeline communication: one batched, blocking
    send/receive call between items (the compute stream waits for it, and a transfer starts
    only when both peers have reached their call); in the interleaved schedule's steady state
    a forward's output leaves only after the following backward. ``"async"`` overlaps sends
    and receives with compute (Megatron-Core's ``overlap_p2p_comm``). ``"serial"`` is
    DeepSpeed's pipeline engine (1F1B only): the same blocking calls, but the send and the
    receive between two items are two blocking calls, one after the other (a forward step
    receives its activation, then sends the previous backward's gradient; a backward step
    sends the previous forward's activation, then receives its gradient), so a stage pays
    both transfers where Megatron's batched call pays the longer (REFERENCES.md R38). Breadth-first,
    zero-bubble and DualPipe schedules always overlap (blocking calls would deadlock the
    first, the others are built around overlapped transfers). Source of the default:
    Megatron-Core ``ModelParallelConfig`` (``overlap_p2p_comm = False``, ``batch_p2p_comm =
    True``; collectors/synth/REFERENCES.md R2, with what else moves a layout ranking). ``stage_layers``: ``()`` or ``"even"`` split the layers
    evenly, a tuple gives the layers of each virtual stage (pipeline ranks, or ``pp * chunks``
    model chunks in chain order), ``"time"`` / ``"memory"`` let :func:`synthesize` choose
    (balanced time; smallest largest-stage memory within ``stage_slack`` of the fastest
    split's step time).

    ``nvlink_domain``: the job's GPUs per NVLink domain (0: the hardware's domain, or on a
    rack whose domain does not divide the job the largest whole number of trays per rack that
    does; :func:`~retime.collectors.synth.hardware.job_domain`). Stated, it must divide the
    job's GPUs and be at most the hardware's domain.

    FP4 (``dtype = "fp4"``, NVFP4 / MXFP4 GEMMs): the attention core (scores, softmax,
    context) and the output head stay in BF16, and the linear layers of the first
    ``fp4_first_high`` and last ``fp4_last_high`` transformer layers run in ``fp4_high_dtype``
    (Megatron-LM's ``--first-last-layers-bf16`` keeps 1 and 1 by default); every other linear
    GEMM (forward, data and weight gradient) runs at the FP4 peak and pays the quantization of
    its inputs (block-scaled copies, priced by bytes).

    ``grad_overlap``: ``False`` is Megatron-LM's default (``overlap_grad_reduce`` off): the
    data-parallel gradient reduction (ZeRO-0/1/2) starts after the stage's last backward,
    bucket after bucket. ``True`` reduces each bucket as soon as its gradients are complete
    in the last micro-batch's backward (PyTorch DDP, Megatron-Core's overlapped reduction;
    what ``overlap.bucket_mb`` / ``overlap.merge`` tune). ZeRO-3 / FSDP reduce-scatters
    always follow each layer's backward. Source of the default: Megatron-Core
    ``DistributedDataParallelConfig.overlap_grad_reduce = False`` (REFERENCES.md R2).
    ZeRO-2 reduces in every micro-batch's backward (it keeps only its gradient shard; R46),
    after each backward (the next item waits) or, with ``True``, as buckets complete.

    ``grad_accum_fusion``: ``True`` is Megatron-LM's default (``--no-gradient-accumulation-fusion``
    turns it off): each weight-gradient GEMM accumulates into the fp32 main gradient itself,
    so accumulating micro-batches costs nothing extra. ``False`` is what a framework that
    leaves accumulation to autograd does (DeepSpeed's engine, as in Megatron-DeepSpeed; plain
    PyTorch): from the second micro-batch on, every parameter's new 16-bit gradient is added
    into ``param.grad`` by a separate kernel that reads both and writes one (6 bytes per
    parameter per micro-batch, streamed through HBM). Megatron-LM's own unfused path (a hook
    adding the 16-bit gradient into the fp32 ``main_grad``: 10 bytes) is not this flag.
    Source: REFERENCES.md R2, R5.

    ``tp_async_allreduce``: ``True`` is Megatron-LM's default since late 2021
    (``--no-async-tensor-model-parallel-allreduce`` turns it off): the backward's TP
    all-reduce of a column-parallel linear's input gradient is issued asynchronously beside
    the weight-gradient GEMM. ``False`` is the earlier code (``copy_to_tensor_model_parallel_
    region`` then ``F.linear``, as in the Megatron-LM of Narayanan et al. SC21 and its
    Megatron-DeepSpeed fork): the reduction runs in autograd after the linear's whole
    backward, alone. Source: REFERENCES.md R20, R60.

    ``offload_layers``: activation offload (Megatron-Core's ``cpu_offloading_num_layers``,
    Transformer Engine's CPU offload): the first ``offload_layers`` transformer layers copy
    the activations they keep for the backward to host memory over the hardware's host link
    (``[host_link]``: PCIe or NVLink-C2C) while the next layer's forward runs, and read them
    back while the following layer's backward runs (:mod:`collectors.synth.offload`); GPU
    memory keeps two layers' worth of staging buffers instead. Default 0 (Megatron-Core's).
    Modeled with ``pp = 1`` only.

    ``launch_blocking_us``: ``0`` is CUDA's default, kernels queued ahead of the GPU. ``> 0``
    models ``CUDA_LAUNCH_BLOCKING=1`` (BigScience ran BLOOM with it against hangs on Jean
    Zay, REFERENCES.md R3): every launch returns only when its kernel or collective has
    finished, so the host's time to issue the next op (Python, dispatcher, launch) sits
    between every two ops on the GPU; this many microseconds per modeled op. A collective
    issued beside a GEMM (the TP reduction of the backward beside the weight gradient, the
    ``tp_comm_overlap`` pieces) then runs alone before it; the context-, expert- and
    data-parallel streams are not serialized.

    ``zero_reduce``: how ZeRO-1/2 reduce the gradients after the last backward.
    ``"reduce_scatter"`` (Megatron-LM's distributed optimizer): one reduce-scatter per
    ``bucket_mb`` bucket, then one parameter all-gather after the step. ``"reduce"``
    (DeepSpeed's ZeRO stage 1/2 optimizer, ``reduce_scatter: true``, its default): the
    gradients are cut into buckets of ``reduce_bucket_size`` = 5e8 elements and each bucket
    is reduced by one ``dist.reduce`` per data-parallel rank owning part of it (each rank owns
    ``1/dp`` of the flat gradient buffer), so a rank sends every gradient byte once (a ring
    reduce) instead of ``(dp - 1) / dp`` of them; the updated 16-bit parameters are then
    all-gathered in shards of ``allgather_bucket_size`` = 5e8 elements
    (``stage_1_and_2.py: average_tensor``, ``step``; REFERENCES.md R30).

    ``eager``: ``False`` prices norms, rotary embeddings, activation products and the loss as
    fused kernels (Megatron-LM's Transformer Engine / Apex kernels, or ``torch.compile``);
    ``True`` as PyTorch eager mode runs torchtitan's model code (one kernel per elementwise
    op, fp32 norms and loss; :mod:`.framework`). ``compile_blocks``: ``torch.compile`` as
    torchtitan applied it at its December 2024 benchmarks (each transformer block compiled
    on its own): Inductor generates no code for the complex-number rotary embedding (eager
    kernels) and the final norm and the fp32 loss run uncompiled (:mod:`.framework`); the
    rest is priced fused. ``recompute = "op"`` is torchtitan's
    op-level selective checkpointing (every second matmul and the non-matmul ops rerun in
    the backward; :mod:`.framework`), ``"selective"`` Megatron-LM's (the attention core).
    ``tp_comm_overlap``: ``False`` is Megatron-LM's default (``--tp-comm-overlap`` off): with
    sequence parallelism the forward's all-gathers and reduce-scatters wait for / hold up
    their GEMMs; ``True`` overlaps them piece by piece (torchtitan's AsyncTP, Transformer
    Engine's userbuffers; :mod:`.framework`). Needs ``sequence_parallel``.
    ``fp8_scaling`` (FP8 runs): ``"fused"`` is Transformer Engine's (Megatron-LM's default):
    a linear layer's activation input is cast in one pass; ``"tensorwise"`` is torchao's
    dynamic tensorwise Float8 (torchtitan): each GEMM casts both operands from 16 bits with
    an amax pass and a cast pass, and the layer keeps its 16-bit input for the backward
    (:data:`~retime.collectors.costs.kernels.FP8_SCALINGS`; the experts' grouped GEMMs keep
    the fused price: torchao's Float8 swaps ``nn.Linear`` modules).
    ``cp_attention`` (``cp > 1``): ``"fused"`` prices one flash kernel per layer over the
    whole key range (a lower bound for Megatron-LM's Transformer Engine ring attention);
    ``"torch"`` PyTorch's ring attention as torchtitan runs it, step by step with fp32
    eager merges (:mod:`.ring`).

    ``fsdp_impl`` (``fsdp``): ``"megatron"`` (default) gathers into and reduces from the
    parameters' and gradients' own buffers (Megatron-Core's FSDP), gradients in
    ``grad_reduce_dtype``; ``"fsdp2"`` is
    PyTorch FSDP2 as torchtitan runs it: the all-gather copy-out and reduce-scatter copy-in
    run on the compute stream, gradients are reduce-scattered (and, under a pipeline,
    accumulated) in ``fsdp_reduce_dtype``, ``"fp32"`` by default (torchtitan's
    ``mixed_precision_reduce = "float32"``; :mod:`.fsdp`).

    ``grad_reduce_dtype``: the dtype of the main-gradient buffer and of every data-parallel
    gradient reduction (all-reduce, ZeRO reduce-scatter or reduce, the tied embedding's
    all-reduce) other than FSDP2's (``fsdp_reduce_dtype``). ``"auto"`` is Megatron-LM's rule:
    ``--bf16`` (which FP8 and FP4 runs also set) accumulates and all-reduces gradients in
    fp32 unless ``--grad-reduce-in-bf16``; ``--fp16`` keeps them in fp16 unless
    ``--accumulate-allreduce-grads-in-fp32`` (REFERENCES.md R51). An fp32 buffer costs 4 bytes
    per parameter of memory and doubles the reduction's bytes; the optimizer then reads it
    as its fp32 gradient without a copy.

    ``moment_dtype``: the dtype of Adam's two moments, ``"fp32"`` (Megatron-LM's default) or
    ``"bf16"`` (DeepSeek-V3's, report §3.3.3; Megatron-LM's ``--use-precision-aware-optimizer
    --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``): 4 + 2 x 2 instead of 4 + 2 x 4 optimizer
    bytes per parameter (fp32 master weights kept), and 8 fewer bytes per parameter read and
    written by the Adam step (REFERENCES.md R54).

    ``odc``: on ZeRO-3 / FSDP runs, parameter gathers and gradient reductions are on-demand
    point-to-point transfers (Wan et al. 2026) with one synchronization per step instead of
    one per layer. ``seq_imbalance`` is the most loaded data-parallel rank's work over the
    mean, per micro-batch (varying sequence lengths): per-layer collectives make every rank
    wait for it in every micro-batch; with one synchronization per step only the leftover
    of a minibatch-level balance remains (``(m + r - 1) / m``).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    zero: int = 0
    fsdp: bool = False
    schedule: str = "1f1b"
    chunks: int = 1
    global_batch: int = 1
    micro_batch: int = 1
    recompute: str = "none"
    dtype: str = "bf16"
    bucket_mb: float = 40.0
    ep: int = 1
    moe_imbalance: float = 1.0
    capacity_factor: float = 0.0
    p2p: str = "sync"
    stage_layers: tuple[int, ...] | str = ()
    stage_slack: float = 0.05
    odc: bool = False
    seq_imbalance: float = 1.0
    grad_overlap: bool = False
    grad_accum_fusion: bool = True
    tp_async_allreduce: bool = True
    launch_blocking_us: float = 0.0
    zero_reduce: str = "reduce_scatter"
    eager: bool = False
    compile_blocks: bool = False
    tp_comm_overlap: bool = False
    nvlink_domain: int = 0
    fp4_first_high: int = 1
    fp4_last_high: int = 1
    fp4_high_dtype: str = "bf16"
    offload_layers: int = 0
    fp8_scaling: str = "fused"
    cp_attention: str = "fused"
    fsdp_impl: str = "megatron"
    fsdp_reduce_dtype: str = "fp32"
    grad_reduce_dtype: str = "auto"
    moment_dtype: str = "fp32"

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "dp", "cp", "chunks", "global_batch", "micro_batch", "ep"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"parallel config: {f}={v!r} must be an integer >= 1")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"parallel config: schedule={self.schedule!r}; use one of "
                              f"{', '.join(SCHEDULES)}")
        if self.recompute not in RECOMPUTE:
            raise ConfigError(f"parallel config: recompute={self.recompute!r}; use one of "
                              f"{', '.join(RECOMPUTE)}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"parallel config: dtype={self.dtype!r}; use one of "
                              f"{', '.join(DTYPES)}")
        for f in ("nvlink_domain", "fp4_first_high", "fp4_last_high", "offload_layers"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"parallel config: {f}={v!r} must be an integer >= 0")
        if self.fp4_high_dtype not in FP4_HIGH:
            raise ConfigError(f"parallel config: fp4_high_dtype={self.fp4_high_dtype!r}; use "
                              f"one of {', '.join(FP4_HIGH)}")
        if self.zero not in (0, 1, 2, 3):
            raise ConfigError(f"parallel config: zero={self.zero!r} must be 0, 1, 2 or 3")
        if self.fsdp and self.zero not in (0, 3):
            raise ConfigError(f"parallel config: fsdp with zero={self.zero}: FSDP is ZeRO-3; "
                              "give either --fsdp or --zero N")
        if self.bucket_mb <= 0:
            raise ConfigError(f"parallel config: bucket_mb={self.bucket_mb} must be > 0")
        if self.schedule in ("gpipe", "1f1b", "zb-h1", "dualpipe") and self.chunks != 1:
            raise ConfigError(f"parallel config: chunks={self.chunks} needs schedule "
                              f"interleaved or bfs (got {self.schedule})")
        if self.dp % self.ep:
            raise ConfigError(f"parallel config: ep={self.ep} must divide dp={self.dp} "
                              "(expert parallelism is carved out of data parallelism)")
        for f in ("moe_imbalance", "seq_imbalance"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 1.0:
                raise ConfigError(f"parallel config: {f}={v!r} must be a number >= 1 (the "
                                  "most loaded one's work over the mean)")
        cf = self.capacity_factor
        if isinstance(cf, bool) or not isinstance(cf, (int, float)) or cf < 0 or 0 < cf < 1:
            raise ConfigError(f"parallel config: capacity_factor={cf!r} must be 0 (dropless) "
                              "or >= 1")
        if self.p2p not in P2P:
            raise ConfigError(f"parallel config: p2p={self.p2p!r}; use one of {', '.join(P2P)}")
        if self.p2p == "serial" and self.schedule != "1f1b":
            raise ConfigError(f"parallel config: p2p='serial' is DeepSpeed's pipeline engine, "
                              f"whose only schedule is 1F1B; schedule={self.schedule!r}: use "
                              "--schedule 1f1b or --p2p sync")
        lb = self.launch_blocking_us
        if isinstance(lb, bool) or not isinstance(lb, (int, float)) or not 0 <= lb < 1e4:
            raise ConfigError(f"parallel config: launch_blocking_us={lb!r} must be a number of "
                              "microseconds >= 0 (0: asynchronous launches)")
        if not 0 <= self.stage_slack < 10:
            raise ConfigError(f"parallel config: stage_slack={self.stage_slack!r} must be a "
                              "fraction >= 0 (0.05 = within 5% of the fastest split)")
        sl = self.stage_layers
        if isinstance(sl, list):
            object.__setattr__(self, "stage_layers", tuple(sl))
            sl = self.stage_layers
        if isinstance(sl, str):
            if sl not in STAGE_POLICIES:
                raise ConfigError(f"parallel config: stage_layers={sl!r}; give layers per stage "
                                  f"(e.g. [10, 12, 12, 10]) or one of {', '.join(STAGE_POLICIES)}")
        elif not isinstance(sl, tuple) or not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in sl):
            raise ConfigError(f"parallel config: stage_layers={sl!r} must be a list of layer "
                              "counts >= 0, one per pipeline stage (or per model chunk)")
        for f in ("odc", "grad_overlap", "grad_accum_fusion", "sequence_parallel", "fsdp",
                  "eager", "compile_blocks", "tp_comm_overlap", "tp_async_allreduce"):
            if not isinstance(getattr(self, f), bool):
                raise ConfigError(f"parallel config: {f}={getattr(self, f)!r} must be true or "
                                  "false")
        if self.odc and self.zero_stage != 3:
            raise ConfigError("parallel config: odc (on-demand point-to-point parameter and "
                              f"gradient transfers) needs ZeRO-3 / FSDP (got zero={self.zero}); "
                              "add --fsdp or --zero 3")
        if self.zero_reduce not in ZERO_REDUCE:
            raise ConfigError(f"parallel config: zero_reduce={self.zero_reduce!r}; use "
                              "reduce_scatter (Megatron-LM) or reduce (DeepSpeed ZeRO-1/2)")
        if self.zero_reduce == "reduce" and self.zero_stage not in (1, 2):
            raise ConfigError(f"parallel config: zero_reduce=reduce is DeepSpeed's ZeRO-1/2 "
                              f"gradient reduction (got zero={self.zero}"
                              f"{', fsdp' if self.fsdp else ''}); add --zero 1 or --zero 2")
        if self.fp8_scaling not in ("fused", "tensorwise"):
            raise ConfigError(f"parallel config: fp8_scaling={self.fp8_scaling!r}; use fused "
                              "(Transformer Engine) or tensorwise (torchao Float8)")
        if self.fsdp_impl not in ("megatron", "fsdp2"):
            raise ConfigError(f"parallel config: fsdp_impl={self.fsdp_impl!r}; use megatron "
                              "(Megatron-Core's FSDP buffers) or fsdp2 (PyTorch FSDP2, "
                              "torchtitan)")
        if self.fsdp_impl == "fsdp2" and not self.fsdp:
            raise ConfigError("parallel config: fsdp_impl='fsdp2' needs fsdp (add --fsdp)")
        if self.fsdp_reduce_dtype not in ("fp32", "bf16"):
            raise ConfigError(f"parallel config: fsdp_reduce_dtype={self.fsdp_reduce_dtype!r}; "
                              "use fp32 (torchtitan's mixed_precision_reduce default) or bf16")
        if self.grad_reduce_dtype not in GRAD_REDUCE:
            raise ConfigError(f"parallel config: grad_reduce_dtype={self.grad_reduce_dtype!r}; "
                              f"use one of {', '.join(GRAD_REDUCE)} (auto: fp32 unless "
                              "dtype is fp16, Megatron-LM's rule)")
        if self.moment_dtype not in ("fp32", "bf16"):
            raise ConfigError(f"parallel config: moment_dtype={self.moment_dtype!r}; use fp32 "
                              "(Adam's default) or bf16 (DeepSeek-V3's optimizer states)")
        if self.cp_attention not in ("fused", "torch"):
            raise ConfigError(f"parallel config: cp_attention={self.cp_attention!r}; use fused "
                              "(one flash kernel per layer) or torch (PyTorch's ring "
                              "attention, torchtitan)")
        if self.fp8_scaling != "fused" and self.dtype != "fp8":
            raise ConfigError(f"parallel config: fp8_scaling={self.fp8_scaling!r} with "
                              f"dtype={self.dtype!r}: it is an FP8 recipe; add --dtype fp8 "
                              "or drop --fp8-scaling")
        if self.eager and self.compile_blocks:
            raise ConfigError("parallel config: eager and compile_blocks both set; eager is "
                              "torchtitan without torch.compile, compile_blocks with it: "
                              "give one of them")
        if self.tp_comm_overlap and not self.sequence_parallel:
            raise ConfigError("parallel config: tp_comm_overlap overlaps the all-gathers and "
                              "reduce-scatters of sequence parallelism; add "
                              "--sequence-parallel (and tp > 1)")
        if self.sequence_parallel and self.tp == 1:
            raise ConfigError("parallel config: sequence_parallel needs tp > 1 (got tp=1)")
        if self.offload_layers and self.pp > 1:
            raise ConfigError(f"parallel config: offload_layers={self.offload_layers} with "
                              f"pp={self.pp}: activation offload is modeled without pipeline "
                              "parallelism only; use pp=1 or offload_layers=0")
        per_replica = self.micro_batch * self.dp
        if self.global_batch % per_replica:
            raise ConfigError(
                f"parallel config: global_batch={self.global_batch} is not divisible by "
                f"micro_batch*dp={self.micro_batch}*{self.dp}={per_replica}; choose a global "
                f"batch that is a multiple of {per_replica}")
        m = self.global_batch // per_replica
        if self.schedule == "interleaved" and self.pp > 1 and m % self.pp:
            raise ConfigError(
                f"parallel config: interleaved schedule needs the number of micro-batches "
                f"(global_batch/(micro_batch*dp) = {m}) to be a multiple of pp={self.pp}")
        if self.schedule == "dualpipe" and (self.pp % 2 or m % 2 or m < 2 * self.pp):
            raise ConfigError(
                f"parallel config: dualpipe needs an even pp (got {self.pp}) and an even number "
                f"of micro-batches >= 2*pp (global_batch/(micro_batch*dp) = {m})")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def num_microbatches(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def zero_stage(self) -> int:
        """Effective ZeRO stage (FSDP counts as 3)."""
        return 3 if self.fsdp else self.zero

    @property
    def virtual_stages(self) -> int:
        """Model chunks of one pipeline chain (``pp * chunks``)."""
        return self.pp * self.chunks

    @property
    def grad_bytes(self) -> int:
        """Bytes per element of the main gradients and their data-parallel reduction
        (``grad_reduce_dtype``; ``auto``: 2 for fp16 runs, else 4)."""
        g = self.grad_reduce_dtype
        if g == "auto":
            return 2 if self.dtype == "fp16" else 4
        return 4 if g == "fp32" else 2

    @property
    def edp(self) -> int:
        """Expert-data-parallel size: ranks holding the same experts (``dp / ep * cp``)."""
        return self.dp // self.ep * self.cp

    def linear_dtype(self, layer: int, layers: int) -> str:
        """The dtype of transformer layer ``layer``'s linear GEMMs (of ``layers``): FP4 runs
        keep the first ``fp4_first_high`` and last ``fp4_last_high`` in ``fp4_high_dtype``."""
        if self.dtype != "fp4":
            return self.dtype
        if layer < self.fp4_first_high or layer >= layers - self.fp4_last_high:
            return self.fp4_high_dtype
        return "fp4"

    def rank(self, stage: int, d: int, c: int, t: int) -> int:
        return ((stage * self.dp + d) * self.cp + c) * self.tp + t

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if isinstance(d["stage_layers"], tuple):
            d["stage_layers"] = list(d["stage_layers"])
        d["world_size"] = self.world_size
        d["num_microbatches"] = self.num_microbatches
        return d


def resolve_parallel(parallel: ParallelConfig | dict[str, Any] | None, **kw: Any) -> ParallelConfig:
    """A ParallelConfig from a config, a dict of its fields, or keyword arguments."""
    if isinstance(parallel, ParallelConfig):
        if kw:
            d = asdict(parallel)
            d.update(kw)
            return ParallelConfig(**d)
        return parallel
    d = dict(parallel or {})
    d.update(kw)
    unknown = sorted(set(d) - set(ParallelConfig.__dataclass_fields__))
    if unknown:
        raise ConfigError(f"parallel config: unknown key(s) {unknown}; allowed: "
                          f"{sorted(ParallelConfig.__dataclass_fields__)}")
    return ParallelConfig(**d)
