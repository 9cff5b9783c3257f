"""Parallelism configuration of a modeled run and the rank layout it implies.

Rank layout follows Megatron-LM's default order (tensor fastest, then context, then data,
then pipeline): ``rank = ((stage * dp + d) * cp + c) * tp + t``. Tensor-parallel groups are
therefore contiguous ranks (inside one server when ``tp <= gpus_per_node``), and pipeline
neighbours are ``tp * cp * dp`` ranks apart.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import ConfigError

__all__ = ["ParallelConfig", "SCHEDULES", "RECOMPUTE", "DTYPES", "resolve_parallel"]

SCHEDULES = ("gpipe", "1f1b", "interleaved", "bfs")
RECOMPUTE = ("none", "selective", "full")
DTYPES = ("bf16", "fp16", "fp8")


@dataclass(frozen=True)
class ParallelConfig:
    """How one training step is split over ranks.

    ``global_batch`` and ``micro_batch`` are in sequences; the number of micro-batches per
    pipeline is ``global_batch / (micro_batch * dp)``. ``chunks`` is the number of model
    chunks per pipeline rank (``v``) for the interleaved and breadth-first schedules.
    ``zero`` is the ZeRO stage (0-3); ``fsdp`` is ZeRO-3 semantics with per-layer units and
    prefetch. ``bucket_mb`` is the gradient bucket size of data-parallel reduction.
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

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "dp", "cp", "chunks", "global_batch", "micro_batch"):
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
        if self.zero not in (0, 1, 2, 3):
            raise ConfigError(f"parallel config: zero={self.zero!r} must be 0, 1, 2 or 3")
        if self.fsdp and self.zero not in (0, 3):
            raise ConfigError(f"parallel config: fsdp with zero={self.zero}: FSDP is ZeRO-3; "
                              "give either --fsdp or --zero N")
        if self.bucket_mb <= 0:
            raise ConfigError(f"parallel config: bucket_mb={self.bucket_mb} must be > 0")
        if self.schedule in ("gpipe", "1f1b") and self.chunks != 1:
            raise ConfigError(f"parallel config: chunks={self.chunks} needs schedule "
                              f"interleaved or bfs (got {self.schedule})")
        if self.sequence_parallel and self.tp == 1:
            raise ConfigError("parallel config: sequence_parallel needs tp > 1 (got tp=1)")
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
        return self.pp * self.chunks

    def rank(self, stage: int, d: int, c: int, t: int) -> int:
        return ((stage * self.dp + d) * self.cp + c) * self.tp + t

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
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
