"""overlap.bucket_mb on measured traces: re-bucketed gradient all-reduces against the
synthesizer's ground truth (the same job synthesized with that bucket size)."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectors.errors import PolicyError
from collectors.ingest import read
from collectors.oplevel import read_oplevel
from collectors.synth import synthesize
from collectors.trace import Trace
from replay import replay, whatif

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
KW = dict(tp=1, pp=1, dp=16, global_batch=16, micro_batch=1)


def _measured(t: Trace) -> Trace:
    """The synthesized run as if captured: no model/hardware configs, hosts of 8 GPUs."""
    meta = {k: v for k, v in t.meta.items() if k != "synth"}
    meta["source_format"] = "kineto"
    meta["hostnames"] = {str(r): f"node{r // 8}" for r in range(int(t.ops["rank"].max()) + 1)}
    return Trace(ops=t.ops, lanes=t.lanes, edges=t.edges, ranges=t.ranges, groups=t.groups,
                 memory=t.memory, strings=t.strings, meta=meta)


@pytest.fixture(scope="module")
def base():
    return _measured(synthesize("gpt3-125m", "a100-80gb", bucket_mb=40, **KW))


@pytest.mark.parametrize("mb", [10, 100, 300])
def test_rebucketing_a_measured_ddp_step_predicts_the_synthesized_truth(base, mb):
    truth = synthesize("gpt3-125m", "a100-80gb", bucket_mb=mb, **KW).meta["synth"]["step_time_ns"]
    r = whatif(base, {"overlap.bucket_mb": mb})
    assert r.step_time_ns == pytest.approx(truth, rel=0.03)
    sc = r.meta["scenario"][0]
    assert sc["buckets_before"] == 5 * 16  # 5 buckets of 40 MB on each of 16 ranks
    total_mb = r.trace.ops.loc[(r.trace.ops["rank"] == 0) & (r.trace.ops["comm_op"] == 1),
                               "bytes"].sum() / 1e6
    assert sc["buckets_after"] == 16 * -(-total_mb // mb)


def test_rebucketing_keeps_bytes_and_the_identity(base):
    same = whatif(base, {"overlap.bucket_mb": 40})
    assert same.step_time_ns == pytest.approx(replay(base).step_time_ns, rel=0.02)
    o0, o1 = base.ops, same.trace.ops
    ar = lambda o: o[(o["comm_op"] == 1) & (o["kind"] == 3)]  # noqa: E731
    assert ar(o1)["bytes"].sum() == ar(o0)["bytes"].sum()
    # every new bucket is one collective over the 16 data-parallel ranks
    assert (ar(o1).groupby("coll_id").size() == 16).all()


def test_rebucketing_refusals():
    st = read_oplevel(TRACES / "oplevel" / "megatron-ST-8rank")
    with pytest.raises(PolicyError, match="no gradient all-reduces with sizes"):
        whatif(st, {"overlap.bucket_mb": 25})
    tr = read(sorted((TRACES / "kineto" / "a100-ddp-nccl").glob("*")))
    with pytest.raises(PolicyError, match="overlap.merge needs"):
        whatif(tr, {"overlap.merge": "mgwfbp"})
    r = whatif(tr, {"overlap.bucket_mb": 5})
    assert r.meta["scenario"][0]["buckets_after"] >= 1


@pytest.mark.parametrize("mb", [0.5, 1, 25])
def test_rebucketing_a_real_nccl_trace_keeps_its_gradient_bytes(mb):
    """DLRM on 8 V100s: all-reduces interleaved with all-to-alls on the NCCL stream and
    compute streams waiting on them (no cycle may appear)."""
    tr = read(sorted((TRACES / "kineto" / "dlrm-v100-8rank").glob("*")))
    r = whatif(tr, {"overlap.bucket_mb": mb})
    ar = lambda t: t.ops[(t.ops["comm_op"] == 1) & (t.ops["kind"] == 3)  # noqa: E731
                         & (t.ops["bytes"] > 0)]
    assert ar(r.trace)["bytes"].sum() == ar(tr)["bytes"].sum()
    assert r.step_time_ns > 0.5 * replay(tr).step_time_ns
