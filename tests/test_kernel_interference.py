"""The interference a measured kernel carried beside NCCL kernels, as the replay's contention
path charges it (``measured_interference_ns``, issue 27): the part bench/kernel_loo.py adds to
a kernel's price to predict its measured time."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import KINETO, ingest_cached

from retime.collectors.costs.interference import interference
from retime.collectors.enums import OpKind
from retime.replay.policies.base import cached_graph
from retime.replay.policies.interference_gpu import (
    measured_interference_ns,
    measured_sm_share,
)


@pytest.fixture(scope="module")
def mi300x():
    return ingest_cached(KINETO / "mi300x-resnet-ddp")


def _overlap_ns(t) -> np.ndarray:
    """Per op, its measured overlap with the collectives of its rank (pure numpy, per op)."""
    o = t.ops
    kind = o["kind"].to_numpy()
    s = o["start_ns"].to_numpy()
    e = s + o["dur_ns"].to_numpy()
    rank = o["rank"].to_numpy()
    out = np.zeros(len(s))
    for r in np.unique(rank):
        comm = np.flatnonzero((kind == OpKind.COLLECTIVE) & (rank == r))
        for i in np.flatnonzero((kind == OpKind.KERNEL) & (rank == r)):
            out[i] = np.clip(np.minimum(e[comm], e[i]) - np.maximum(s[comm], s[i]), 0,
                             None).sum()
    return out


def test_interference_is_charged_on_the_overlap_with_collectives_only(mi300x):
    cut = measured_interference_ns(mi300x)
    kind = mi300x.ops["kind"].to_numpy()
    dur = mi300x.ops["dur_ns"].to_numpy()
    ov = _overlap_ns(mi300x)
    p0, active, _why, _bw = measured_sm_share(mi300x, cached_graph(mi300x), None)
    # the trace's RCCL kernels hold 28 of the MI300X's 304 CUs (their launch grid)
    assert p0 == pytest.approx(28 / 304)
    s0 = interference(p0, active=active).slowdown
    k = kind == OpKind.KERNEL
    assert (cut >= 0).all() and (cut[k] <= dur[k] + 1e-6).all()
    # a kernel that never ran beside a collective carried none; one that did, s / (1 + s) of
    # that overlap: the compute-bound kernels' C3 figure s0 for most (the trace's shaped
    # calls are convolutions and GEMMs), less for memory-bound ones (they lose little of the
    # SM part), never more than half of it (a slowdown of at most 1)
    assert (cut[k & (ov == 0)] == 0).all()
    hit = k & (ov > 0)
    assert hit.sum() > 100 and (cut[hit] > 0).mean() > 0.9
    r = cut[hit] / ov[hit]
    assert np.median(r) == pytest.approx(s0 / (1 + s0), rel=0.05)
    assert r.max() <= 0.5


def test_no_collectives_no_interference():
    vgg = ingest_cached(KINETO / "h100-vgg13")
    assert not measured_interference_ns(vgg).any()
