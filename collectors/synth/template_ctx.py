"""Shapes and op constructors shared by the synthesizer's layer templates.

:class:`_Ctx` holds one rank's shapes (tokens, hidden size, TP / SP / CP degrees) and prices
GEMMs, streaming kernels and TP / CP collectives for the template functions of
:mod:`.layers`, :mod:`.attention`, :mod:`.moe`, :mod:`.ring` and :mod:`.framework`;
:func:`_k` wraps a kernel cost as a compute op, :func:`_norm` prices a norm and
:func:`_overlap` a communication kernel running beside a compute kernel.
"""

from __future__ import annotations

from dataclasses import replace

from ..enums import CommOp, OpKind
from .builder import OpTemplate
from .costs import CommModel, KernelCost, gemm, streaming
from .hardware import HardwareConfig
from .models import ModelConfig
from .parallel import ParallelConfig
from .schedule import SPLIT_BACKWARD

_K = int(OpKind.KERNEL)
_C = int(OpKind.COLLECTIVE)
_S = int(OpKind.SYNC)  # zero-length join of the compute stream with a comm stream


def _k(name: str, cost: KernelCost, deps: tuple[int, ...] = (-1,)) -> OpTemplate:
    return OpTemplate(name, "compute", cost.dur_ns, kind=_K, flops=cost.flops,
                      bytes=cost.bytes, deps=deps)


class _Ctx:
    """Shapes and cost helpers shared by the template functions."""

    def __init__(self, model: ModelConfig, hw: HardwareConfig, par: ParallelConfig,
                 comm: CommModel) -> None:
        self.m, self.hw, self.par, self.comm = model, hw, par, comm
        self.dtype = par.dtype
        self.t = par.tp
        self.sp = par.sequence_parallel
        self.b = par.micro_batch
        self.s = model.seq // par.cp  # local sequence length
        self.S = model.seq  # keys a local query attends to (full sequence)
        self.T = self.b * self.s  # tokens per rank per micro-batch
        self.Tn = self.T // self.t if self.sp else self.T  # tokens of norms / dropouts
        self.h = model.hidden
        self.act = 2  # activation element bytes (bf16/fp16)
        self.adtype = "bf16" if par.dtype in ("fp8", "fp4") else par.dtype  # attention core
        self.split = par.schedule in SPLIT_BACKWARD
        # CUDA_LAUNCH_BLOCKING=1: a launch returns when its kernel or collective has
        # finished, so a collective issued "asynchronously" beside a GEMM still runs alone
        self.serial = par.launch_blocking_us > 0
        # the backward's TP reduction after the weight gradient, not beside it (R60)
        self.serial_tp = self.serial or not par.tp_async_allreduce
        self.w: list[OpTemplate] = []  # weight-gradient ops of the layer being built (split)

    def g(self, m: int, n: int, k: int, batch: int = 1) -> KernelCost:
        """A linear layer's GEMM (FP8 when the run is FP8, cast as its recipe scales)."""
        return gemm(self.hw, self.dtype, m, n, k, batch, self.par.fp8_scaling)

    def ga(self, m: int, n: int, k: int, batch: int = 1) -> KernelCost:
        """An attention-core GEMM (BF16 in FP8 runs)."""
        return gemm(self.hw, self.adtype, m, n, k, batch)

    def wgrad(self, ops: list[OpTemplate], *wops: OpTemplate) -> None:
        """Weight-gradient ops: inline (``ops``) or, with a split backward, to ``self.w``."""
        (self.w if self.split else ops).extend(wops)

    def st(self, nbytes: float, flops: float = 0.0) -> KernelCost:
        return streaming(self.hw, nbytes, flops)

    def tp_coll(self, name: str, op: CommOp, nbytes: int, deps=(-1,)) -> OpTemplate:
        return OpTemplate(name, "tp", self.comm.collective_ns(op, nbytes, "tp"), kind=_C,
                          bytes=int(nbytes), comm_op=int(op), deps=deps)

    def cp_coll(self, name: str, op: CommOp, nbytes: int, deps=(-1,)) -> OpTemplate:
        return OpTemplate(name, "cp", self.comm.collective_ns(op, nbytes, "cp"), kind=_C,
                          bytes=int(nbytes), comm_op=int(op), deps=deps)


def _norm(x: _Ctx, name: str, bwd: bool = False) -> OpTemplate:
    n = x.Tn * x.h
    return _k(name, x.st((3 if bwd else 2) * x.act * n + (4 * n if bwd else 0), 8.0 * n))


def _overlap(x: _Ctx, comm: OpTemplate, comp: OpTemplate,
             serial: bool | None = None) -> tuple[OpTemplate, OpTemplate]:
    """A communication kernel running beside a compute kernel: both slow down because they
    share SMs and HBM. With ``f`` the fraction of the ideal overlap achieved (C3, Agrawal et
    al. 2024), the pair takes ``max + (1 - f) * min`` instead of ``max``; the longer op is
    stretched by ``(1 - f) * min``. Under synchronous launches (``x.serial``) the compute
    op waits for the collective instead: the pair takes ``a + b`` (``serial``: the same for
    one pair, e.g. the backward's TP reduction without the asynchronous all-reduce)."""
    if x.serial if serial is None else serial:
        return comm, replace(comp, deps=(-1,))
    f = x.hw.overlap_efficiency
    a, b = comm.dur_ns, comp.dur_ns
    if a <= b:
        return comm, OpTemplate(**{**comp.__dict__, "dur_ns": int(b + (1 - f) * a)})
    return OpTemplate(**{**comm.__dict__, "dur_ns": int(a + (1 - f) * b)}), comp
