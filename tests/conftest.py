"""Shared fixtures: paths of the real traces in ../shared/traces and cached ingests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
KINETO = SHARED / "kineto"

#: every shared trace as one ingest input each (name -> path)
SHARED_CASES = {
    "dlrm-v100-8rank": KINETO / "dlrm-v100-8rank",
    "a100-ddp-nccl": KINETO / "a100-ddp-nccl",
    "v100-ddp-sgd": KINETO / "v100-ddp-sgd",
    "mi300x-resnet-ddp": KINETO / "mi300x-resnet-ddp",
    "cpu-gloo-rank34": KINETO / "cpu-gloo-rank34",
    "h100-vgg13": KINETO / "h100-vgg13" / "profiler_vgg13-iter41.json.gz",
    "event-sync-multi": KINETO / "a100-event-sync" / "multi_stream.json.gz",
    "event-sync-single": KINETO / "a100-event-sync" / "single_stream.json.gz",
    "edge-rank-non-gpu": KINETO / "edge-cases" / "rank_non_gpu.json.gz",
    "edge-rank-not-found": KINETO / "edge-cases" / "rank_not_found.json.gz",
    "edge-dist-info": KINETO / "edge-cases" / "distributed_info_not_found.json.gz",
    "megatron-oplevel": SHARED / "oplevel" / "megatron-ST-8rank",
    "nsys-h100-2gpu": SHARED / "nsys" / "h100-2gpu-fastvideo.sqlite",
}

def bench_module(name: str):
    """A ``bench/`` script imported as a module (its functions and data, not its main)."""
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


# Silence progress bars in tests (they go to stderr and would clutter captured output).
os.environ.setdefault("RETIME_PROGRESS", "0")


def kineto_trace_files() -> list[Path]:
    """Every Kineto profiler file under ../shared/traces/kineto (ET files excluded)."""
    out = []
    for f in sorted(KINETO.rglob("*.json.gz")):
        if "-et" in f.parent.name or ".et." in f.name:
            continue
        out.append(f)
    return out


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"real traces not found at {SHARED}; the tests need ../shared/traces")
    return SHARED


_CACHE: dict = {}


def ingest_cached(path: Path):
    """Ingest once per session (ingest itself is tested separately)."""
    from retime.collectors.ingest import read

    key = str(path)
    if key not in _CACHE:
        _CACHE[key] = read([path])
    return _CACHE[key]


@pytest.fixture(scope="session")
def dlrm_trace(shared_traces):
    return ingest_cached(shared_traces / "kineto" / "dlrm-v100-8rank")
