"""Issue #28, communication labels: a table of every communication kernel name with the
primitive its name gives, and the primitive and bytes taken from the launching CPU op
(Kineto) or the enclosing NVTX range (nsys) where the kernel name lacks them; DeepEP's
local layout kernel is not communication."""

from __future__ import annotations

import importlib.util
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, SHARED, ingest_cached

from retime.analysis import kernel_stats
from retime.collectors.collectives import comm_op_from_name
from retime.collectors.enums import CommOp, OpKind
from retime.collectors.ingest import read
from retime.collectors.kernel_classes import is_comm_kernel

TABLE = Path(__file__).parent / "data" / "comm_kernel_ops.tsv"
CORPUS = Path(__file__).parent / "data" / "kernel_names.tsv"
REGRESS = ROOT / "traces" / "regress"
_spec = importlib.util.spec_from_file_location("regress_build", REGRESS / "build.py")
B = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(B)


def _rows(path: Path, n: int) -> list[list[str]]:
    return [ln.split("\t") for ln in path.read_text(encoding="utf-8").splitlines()
            if ln and not ln.startswith("#") and len(ln.split("\t")) == n]


TABLE_ROWS = _rows(TABLE, 3)


@pytest.mark.parametrize("prim,src,name", TABLE_ROWS, ids=[f"{r[1]}:{r[2][:40]}" for r in TABLE_ROWS])
def test_communication_name_gives_its_primitive(prim, src, name):
    assert comm_op_from_name(name).name == prim
    if prim == "NONE":  # a local kernel of a communication library
        assert not is_comm_kernel(name)


def test_table_covers_every_communication_name_of_the_corpus():
    corpus = {r[3] for r in _rows(CORPUS, 4) if r[0] == "communication"}
    assert corpus <= {r[2] for r in TABLE_ROWS}


def test_multimem_all_reduce_takes_its_size_from_the_cpu_op():
    """B200 symmetric-memory all-reduce: the kernel (in an anonymous namespace, so its name
    used to parse as nothing: UNKNOWN, 0 bytes) is launched by symm_mem::multimem_all_reduce_,
    whose Input Dims and type give the size: 4096 x 7168 bf16."""
    t = read([REGRESS / "b200-multimem"])
    o = t.ops
    k = o[o["name_id"].map(lambda i: "multimem_all_reduce_kernel" in t.strings[i])]
    assert len(k) == len(B.MM_CALLS_MS)
    assert (k["kind"] == int(OpKind.COLLECTIVE)).all()
    assert (k["comm_op"] == int(CommOp.ALL_REDUCE)).all()
    assert (k["bytes"] == int(np.prod(B.MM_DIMS)) * 2).all()


def test_deepep_layout_kernel_is_local_and_notify_kernels_are_labelled():
    """DeepSeek train.json: get_dispatch_layout (token counting on one GPU) was counted as
    communication, cached_notify was UNKNOWN."""
    t = read([REGRESS / "deepep-kernels"])
    o = t.ops
    names = np.asarray(t.strings, dtype=object)[o["name_id"].to_numpy()]
    for name, prim in B.DEEPEP:
        (row,) = np.flatnonzero(names == name)
        if prim is None:
            assert o["kind"].iloc[row] == int(OpKind.KERNEL)
            assert o["comm_op"].iloc[row] == int(CommOp.NONE)
        else:
            assert o["kind"].iloc[row] == int(OpKind.COLLECTIVE)
            assert CommOp(int(o["comm_op"].iloc[row])).name == prim
    ks = kernel_stats(t).set_index("name")
    assert ks.loc["dpsk::ep::cuda::get_dispatch_layout", "kernel_class"] == "reduction"


def test_nsys_sendrecv_under_an_all_to_all_range_is_an_all_to_all():
    """h100-2gpu-fastvideo: NCCL runs c10d::alltoall_base_ (> nccl:all_to_all) as
    ncclDevKernel_SendRecv; those kernels were labelled SEND_RECV. Recounted from the
    SQLite export itself: kernels whose launch call lies inside an NVTX range named
    nccl:all_to_all on its thread."""
    path = SHARED / "nsys" / "h100-2gpu-fastvideo.sqlite"
    con = sqlite3.connect(path)
    q = ("select k.start from CUPTI_ACTIVITY_KIND_KERNEL k "
         "join StringIds n on n.id = k.demangledName "
         "join CUPTI_ACTIVITY_KIND_RUNTIME r on r.correlationId = k.correlationId "
         "and r.globalTid / 16777216 = k.globalPid / 16777216 "
         "where n.value like 'ncclDevKernel_SendRecv%' and exists (select 1 from NVTX_EVENTS e "
         "left join StringIds s on s.id = e.textId where e.globalTid = r.globalTid "
         "and e.start <= r.start and r.start < e.end "
         "and coalesce(e.text, s.value) like 'nccl:all_to_all%')")
    a2a_starts = sorted(x[0] for x in con.execute(q))
    n_all = con.execute("select count(*) from CUPTI_ACTIVITY_KIND_KERNEL k join StringIds n "
                        "on n.id = k.demangledName where n.value like "
                        "'ncclDevKernel_SendRecv%'").fetchone()[0]
    # the rest have no launch call in the export (queued before the capture began); per
    # process and stream, every SendRecv whose launch is there ran under nccl:all_to_all, so
    # they take that label from their peers
    q_orphan = ("select k.globalPid, k.streamId from CUPTI_ACTIVITY_KIND_KERNEL k "
                "join StringIds n on n.id = k.demangledName "
                "where n.value like 'ncclDevKernel_SendRecv%' and not exists (select 1 from "
                "CUPTI_ACTIVITY_KIND_RUNTIME r where r.correlationId = k.correlationId "
                "and r.globalTid / 16777216 = k.globalPid / 16777216)")
    orphans = con.execute(q_orphan).fetchall()
    launched = con.execute(
        "select k.globalPid, k.streamId, count(*) from CUPTI_ACTIVITY_KIND_KERNEL k "
        "join StringIds n on n.id = k.demangledName join CUPTI_ACTIVITY_KIND_RUNTIME r "
        "on r.correlationId = k.correlationId and r.globalTid / 16777216 = k.globalPid / "
        "16777216 where n.value like 'ncclDevKernel_SendRecv%' group by 1, 2").fetchall()
    con.close()
    assert len(a2a_starts) == 64 and len(orphans) == 2 and n_all == 66
    # every launched SendRecv of each orphan's (process, stream) is one of the all-to-alls
    assert sum(c for _, _, c in launched) == len(a2a_starts)
    assert {(p, st) for p, st in orphans} <= {(p, st) for p, st, _ in launched}
    t = ingest_cached(path)
    o = t.ops
    comm = o[o["kind"].isin([int(OpKind.COLLECTIVE), int(OpKind.P2P)])]
    a2a = comm[comm["comm_op"] == int(CommOp.ALL_TO_ALL)]
    assert len(a2a) == len(a2a_starts) + len(orphans) == n_all
    assert t.meta["collectives"]["primitive_from_nvtx"] == len(a2a_starts)
    assert t.meta["collectives"]["primitive_from_peers"] == len(orphans)
    # the orphans are the first SendRecv of each rank, paired as instance 0 of the all-to-alls
    first = a2a.sort_values("start_ns").groupby("rank").head(1)
    assert first["coll_id"].nunique() == 1 and len(first) == 2


def test_nsys_orphan_kernel_keeps_its_label_when_peers_disagree():
    """primitives_from_peers: a kernel without its launch call takes its (rank, stream, name)
    peers' primitive only when they all got the same one from their ranges."""
    from retime.collectors.nsys_comm import primitives_from_peers
    sr, a2a, ar = int(CommOp.SEND_RECV), int(CommOp.ALL_TO_ALL), int(CommOp.ALL_REDUCE)
    before = np.array([sr, sr, sr, sr, sr, sr], np.int8)
    after = np.array([sr, a2a, a2a, sr, a2a, ar], np.int8)  # 0 and 3 had no launch call
    no_launch = np.array([1, 0, 0, 1, 0, 0], bool)
    rank = np.array([0, 0, 0, 1, 1, 1])
    out, n = primitives_from_peers(after, before, np.ones(6, bool), no_launch, rank,
                                   np.zeros(6, np.int64), np.zeros(6, np.int64))
    assert n == 1 and out.tolist() == [a2a, a2a, a2a, sr, a2a, ar]
