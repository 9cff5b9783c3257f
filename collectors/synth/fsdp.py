"""PyTorch FSDP2's own kernels around its collectives (``--fsdp --fsdp-impl fsdp2``, as
torchtitan runs it; the default ``megatron`` implementation gathers into and reduces from the
parameters' own buffers in 16 bits, as the synthesizer priced every ``--fsdp`` run before).

FSDP2 (``torch.distributed.fsdp.fully_shard``) does not gather into, nor reduce from, the
parameters and gradients themselves: each collective has a staging buffer, and copies
between the two run on the compute stream (collectors/synth/REFERENCES.md R22):

- **all-gather copy-out.** ``FSDPParamGroup.wait_for_unshard`` runs
  ``foreach_all_gather_copy_out`` on the current (compute) stream before the module's
  forward, and again before its backward when the forward resharded: the gathered buffer is
  read and the unsharded parameters written (``split_with_sizes_copy``), 2 + 2 bytes per
  parameter in 16-bit ``param_dtype``.
- **reduce-scatter copy-in.** ``foreach_reduce`` copies the unsharded gradients into the
  reduce-scatter input in ``reduce_dtype`` (``foreach_reduce_scatter_copy_in``) on the
  compute stream (2025 code) or on the reduce-scatter stream with the compute stream
  waiting for it before the gradients are freed (2024 code): 2 bytes read and 4 written per
  parameter with an fp32 ``reduce_dtype``.
- **fp32 reduce-scatter.** torchtitan's ``--training.mixed_precision_reduce`` defaults to
  ``float32`` (its only choice in 2024; ``MixedPrecisionPolicy(param_dtype=bfloat16,
  reduce_dtype=float32)``, R22): the reduce-scatter moves 4 bytes per parameter.
- **gradient accumulation under a pipeline.** With PyTorch's pipelining a stage's backwards
  but the last do not reduce (R13); ``FSDPParam.to_accumulated_grad_if_needed`` /
  ``accumulate_unsharded_grad_if_needed`` (run in the post-backward hook, on the compute
  stream) keep the unsharded gradients in ``reduce_dtype``: each backward's 16-bit gradient
  is added into an fp32 accumulator (2 + 4 read, 4 written per parameter; the first one is
  a 2 + 4 cast, priced as an add), which the memory model holds at 4 bytes per parameter.
  With a 16-bit ``reduce_dtype`` autograd adds into ``.grad`` (2 + 2 read, 2 written).

The post-reduce division and cast run on the sharded output (``1 / dp`` of the bytes) and
are left out, as is the copy-in of the single reduce-scatter a pipelined stage issues after
its last backward (once per step). ODC runs (point-to-point fetches) have none of these
buffers.
"""

from __future__ import annotations

from .builder import OpTemplate
from .costs import streaming

__all__ = ["REDUCE_DTYPES", "fsdp2", "reduce_bytes_per_param", "copy_out", "copy_in",
           "accumulate", "accumulator_bytes_per_param"]

#: ``ParallelConfig.fsdp_reduce_dtype`` -> bytes per element of the reduce-scatter
REDUCE_DTYPES = {"fp32": 4, "bf16": 2}


def fsdp2(parallel) -> bool:
    """Whether a run is PyTorch FSDP2 with its staging copies (``--fsdp --fsdp-impl fsdp2``,
    not ODC)."""
    return bool(parallel.fsdp) and parallel.fsdp_impl == "fsdp2" and not parallel.odc


def reduce_bytes_per_param(parallel, tpl) -> int:
    """Bytes per parameter of a data-parallel gradient reduction: FSDP2's ``reduce_dtype``,
    else the main gradients' (``ParallelConfig.grad_bytes``: Megatron-LM's fp32 for bf16 /
    FP8 / FP4 runs, 16 bits for fp16 ones, or as ``grad_reduce_dtype`` states)."""
    if fsdp2(parallel):
        return REDUCE_DTYPES[parallel.fsdp_reduce_dtype]
    return int(parallel.grad_bytes)


def copy_out(hw, tpl, params: int) -> OpTemplate:
    """FSDP2's all-gather copy-out of ``params`` parameters on the compute lane."""
    nbytes = 2 * params * int(tpl.param_bytes_per_param)
    c = streaming(hw, nbytes)
    return OpTemplate("fsdp.all_gather_copy_out", "compute", c.dur_ns, bytes=c.bytes,
                      flops=0.0, deps=())


def copy_in(hw, tpl, parallel, params: int) -> OpTemplate:
    """FSDP2's reduce-scatter copy-in of ``params`` gradients on the compute lane."""
    nbytes = params * (int(tpl.grad_bytes_per_param) + reduce_bytes_per_param(parallel, tpl))
    c = streaming(hw, nbytes)
    return OpTemplate("fsdp.reduce_scatter_copy_in", "compute", c.dur_ns, bytes=c.bytes,
                      flops=0.0, deps=())


def accumulator_bytes_per_param(parallel) -> int:
    """Bytes per parameter of FSDP2's unsharded gradient accumulator under a pipeline."""
    return REDUCE_DTYPES[parallel.fsdp_reduce_dtype]


def accumulate(hw, tpl, parallel, params: int) -> OpTemplate:
    """FSDP2's addition of one backward's gradients into the unsharded accumulator (under a
    pipeline), on the compute lane: the 16-bit gradient and the accumulator read, the
    accumulator written."""
    acc = accumulator_bytes_per_param(parallel)
    nbytes = params * (int(tpl.grad_bytes_per_param) + 2 * acc)
    c = streaming(hw, nbytes)
    return OpTemplate("fsdp.accumulate_grads", "compute", c.dur_ns, bytes=c.bytes,
                      flops=float(params), deps=())
