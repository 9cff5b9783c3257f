"""One kernel-class table (collectors/kernel_classes.py) for every view: a corpus of real
kernel names (tests/data/kernel_names.tsv: every distinct device-op name of the shared traces
plus NVIDIA, AMD and Triton names from public profiles) with their expected class;
communication kernels that are not NCCL-named are communication at ingest, in the breakdown,
in kernel stats and in the what-ifs; names no rule knows are `other` and listed by analyze."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED, ingest_cached

import retime.collectors.kineto.reader as kin
from retime.analysis import breakdown, kernel_stats
from retime.analysis.kernels import KERNEL_CLASSES, unclassified
from retime.cli import run
from retime.collectors.enums import OpKind
from retime.collectors.ingest import read
from retime.collectors.kernel_classes import (
    CLASS_NAMES,
    KernelClass,
    classify_name,
    is_comm_kernel,
    op_classes,
)
from retime.replay.policies.hardware import CLASSES, kernel_class

CORPUS = Path(__file__).parent / "data" / "kernel_names.tsv"


def _corpus() -> list[tuple[str, str, str, str]]:
    rows = []
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            cls, kind, src, name = line.split("\t")
            rows.append((cls, kind, src, name))
    return rows


ROWS = _corpus()


def test_corpus_covers_every_vendor_and_class():
    srcs = {r[2].split(":")[0] for r in ROWS}
    assert {"shared", "nvidia", "amd", "triton", "synth", "cpu"} <= srcs
    assert {r[0] for r in ROWS} == set(CLASS_NAMES)
    assert len(ROWS) > 400 and KERNEL_CLASSES == CLASS_NAMES


@pytest.mark.parametrize("cls,kind,src,name", ROWS, ids=[f"{r[2]}:{r[3][:40]}" for r in ROWS])
def test_corpus_name_has_its_class(cls, kind, src, name):
    got = op_classes(np.array([int(OpKind[kind])]), np.array([0]), [name])[0]
    assert CLASS_NAMES[got] == cls
    if kind == "KERNEL":  # a GPU kernel as recorded: communication becomes a collective
        assert classify_name(name) == KernelClass(got)
        assert is_comm_kernel(name) == (cls == "communication")


_SHARED_INPUTS = {
    "dlrm-v100-8rank": SHARED / "kineto" / "dlrm-v100-8rank",
    "a100-ddp-nccl": SHARED / "kineto" / "a100-ddp-nccl",
    "v100-ddp-sgd": SHARED / "kineto" / "v100-ddp-sgd",
    "mi300x-resnet-ddp": SHARED / "kineto" / "mi300x-resnet-ddp",
    "cpu-gloo-rank34": SHARED / "kineto" / "cpu-gloo-rank34",
    "h100-vgg13": SHARED / "kineto" / "h100-vgg13" / "profiler_vgg13-iter41.json.gz",
    "single_stream": SHARED / "kineto" / "a100-event-sync" / "single_stream.json.gz",
    "multi_stream": SHARED / "kineto" / "a100-event-sync" / "multi_stream.json.gz",
    "rank_non_gpu": SHARED / "kineto" / "edge-cases" / "rank_non_gpu.json.gz",
    "megatron-ST-8rank": SHARED / "oplevel" / "megatron-ST-8rank",
    "h100-2gpu-fastvideo": SHARED / "nsys" / "h100-2gpu-fastvideo.sqlite",
}


@pytest.mark.parametrize("name", sorted(_SHARED_INPUTS))
def test_every_shared_device_op_name_is_in_the_corpus_and_views_agree(name):
    t = ingest_cached(_SHARED_INPUTS[name])
    want = {r[3]: r[0] for r in ROWS if r[2].startswith("shared:")}
    ks = kernel_stats(t)
    got = dict(zip(ks["name"], ks["kernel_class"]))
    missing = sorted(set(got) - set(want))
    assert not missing, f"add these names of {name} to {CORPUS.name}: {missing[:5]}"
    assert {n: want[n] for n in got} == got
    # the kind the ingest gave agrees with the table: every op whose name is communication
    # is a collective or p2p op, so the breakdown counts it as communication too
    o = t.ops
    names = np.asarray(t.strings, dtype=object)
    comm_name = np.asarray([is_comm_kernel(str(s)) for s in names], bool)[o["name_id"]]
    kind = o["kind"].to_numpy()
    gpu_kernel = np.isin(kind, [int(OpKind.KERNEL), int(OpKind.COLLECTIVE), int(OpKind.P2P)])
    assert not (comm_name & (kind == int(OpKind.KERNEL))).any()
    if t.meta.get("source_format") != "oplevel":  # its timers name an op type, not a kernel
        assert comm_name[gpu_kernel & (kind != int(OpKind.KERNEL))].all()
    # the what-if classes follow the same table
    hw = np.asarray(CLASSES, dtype=object)[kernel_class(t)]
    cls = np.asarray(CLASS_NAMES, dtype=object)[op_classes(kind, o["name_id"].to_numpy(),
                                                            t.strings)]
    dev = np.isin(kind, [int(k) for k in (OpKind.KERNEL, OpKind.COMPUTE, OpKind.COLLECTIVE,
                                          OpKind.P2P, OpKind.MEMCPY, OpKind.MEMSET)])
    expect = {"GEMM": "gemm", "conv": "gemm", "attention": "attention", "memory": "memcpy",
              "communication": "comm", "other": "unclassified"}
    for c, h in zip(cls[dev], hw[dev]):
        assert h == expect.get(c, "elementwise"), (c, h)


def _kineto_doc(kernels: list[str]) -> dict:
    """A one-step Kineto trace: a launch call and its kernel per name, back to back."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
           "ts": 0.0, "dur": 100.0 * len(kernels) + 50}]
    for i, k in enumerate(kernels):
        t0 = 10.0 + 100.0 * i
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                   "tid": 1, "ts": t0, "dur": 5.0, "args": {"correlation": 100 + i}})
        ev.append({"ph": "X", "cat": "kernel", "name": k, "pid": 0, "tid": 7, "ts": t0 + 10,
                   "dur": 60.0, "args": {"correlation": 100 + i, "device": 0, "stream": 7}})
    return {"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": ev}


_MIXED = [
    "void c10d::symmetric_memory::multimem_all_reduce_kernel<c10::BFloat16, 16, 4>"
    "(c10::BFloat16*, unsigned long, unsigned long, unsigned int**, unsigned long, "
    "unsigned long)",
    "void deep_ep::internode::combine<true, 8, 4, 16, 6, 1024, 64, 8>(int4*, float*)",
    "dpsk::ep::internode::dispatch",
    "void ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_"
    "execute_segment_k_off_kernel__5x_cublas",
    "void cudnn::ops::nchwToNhwcKernel<__half, __half, float, false, true, "
    "(cudnnKernelDataType_t)0>(cudnn::ops::nchw2nhwc_params_t<float>, __half const*, __half*)",
    "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 128, true, 1, true>()",
    "my_custom_fused_kernel_v2",
]


@pytest.mark.parametrize("streaming", [True, False])
def test_communication_kernels_are_communication_in_every_view(tmp_path, monkeypatch,
                                                               streaming):
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(_kineto_doc(_MIXED)))
    monkeypatch.setattr(kin, "STREAMING", streaming)
    t = read([f])
    o = t.ops
    names = t.names()
    gpu = np.isin(names, _MIXED)
    kinds = dict(zip(names[gpu], o["kind"].to_numpy()[gpu]))
    assert [kinds[k] for k in _MIXED[:4]] == [int(OpKind.COLLECTIVE)] * 4
    assert [kinds[k] for k in _MIXED[4:]] == [int(OpKind.KERNEL)] * 4
    ks = kernel_stats(t).set_index("name")["kernel_class"]
    assert [ks[k] for k in _MIXED] == ["communication"] * 4 + ["GEMM", "layout", "norm",
                                                                "other"]
    # the breakdown: 4 x 60 us of communication, nothing overlaps it
    bd = breakdown(t).iloc[0]
    assert bd["exposed_comm_ns"] == 4 * 60_000 and bd["overlapped_comm_ns"] == 0
    assert bd["compute_ns"] == 4 * 60_000
    hw = np.asarray(CLASSES, dtype=object)[kernel_class(t)]
    assert list(hw[[int(np.flatnonzero(names == k)[0]) for k in _MIXED]]) == \
        ["comm"] * 4 + ["gemm", "elementwise", "elementwise", "unclassified"]
    assert unclassified(t)["name"].tolist() == ["my_custom_fused_kernel_v2"]


def test_analyze_lists_the_unclassified_kernels(tmp_path, capsys):
    t = ingest_cached(SHARED / "kineto" / "a100-event-sync" / "single_stream.json.gz")
    src = t.save(tmp_path / "s.retime")
    assert run(["analyze", str(src), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in out["unclassified"]] == [
        "at::cuda::(anonymous namespace)::spin_kernel(long)"]
    spin = out["unclassified"][0]
    o = t.ops
    sel = t.names() == spin["name"]
    assert spin["count"] == int(sel.sum()) and spin["total_ns"] == int(o["dur_ns"][sel].sum())
    assert run(["analyze", str(src)]) == 0
    assert "unclassified kernels" in capsys.readouterr().out


def test_a_store_ingested_before_the_table_knew_a_name_still_agrees(tmp_path):
    """A trace whose NVLS / DeepEP kernels were stored as plain kernels (an older ingest):
    the breakdown counts them as communication, as kernel stats do."""
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(_kineto_doc(_MIXED)))
    t = read([f])
    o = t.ops.copy()
    o.loc[o["kind"] == int(OpKind.COLLECTIVE), "kind"] = int(OpKind.KERNEL)
    old = type(t)(ops=o, lanes=t.lanes, edges=t.edges, ranges=t.ranges, groups=t.groups,
                  memory=t.memory, strings=t.strings, meta=t.meta)
    a, b = breakdown(t).iloc[0], breakdown(old).iloc[0]
    for part in ("compute_ns", "exposed_comm_ns", "overlapped_comm_ns", "idle_ns"):
        assert a[part] == b[part]
    ks = kernel_stats(old).set_index("name")["kernel_class"]
    assert [ks[k] for k in _MIXED[:4]] == ["communication"] * 4
