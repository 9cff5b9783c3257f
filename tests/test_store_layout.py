"""The rank-partitioned store (collectors/store.py): a partitioned store of a real trace reads
back into the same Trace as the single-file one (and as the trace saved), version-1 stores
still read, saves stay atomic, and `retime ingest --scheduler` has real Dask workers write
their own ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from retime.collectors.errors import TraceFormatError
from retime.collectors.ingest import read
from retime.collectors.store import (
    part_file,
    rank_rows,
    scan_ops,
    scan_table,
    store_layout,
    store_ranks,
    write_store_by_rank,
)
from retime.collectors.trace import SCHEMA_VERSION, read_trace

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
DLRM = TRACES / "kineto" / "dlrm-v100-8rank"
TABLES = ("ops", "lanes", "edges", "ranges", "groups", "memory")


def assert_same_trace(a, b):
    for name in TABLES:
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), obj=name)
    assert a.strings == b.strings
    assert a.meta == b.meta


@pytest.fixture(scope="module")
def dlrm():
    return read(DLRM)


@pytest.fixture(scope="module")
def dlrm_stores(dlrm, tmp_path_factory):
    d = tmp_path_factory.mktemp("layout")
    return dlrm.save(d / "single.retime"), dlrm.save(d / "rank.retime", layout="rank")


def test_partitioned_store_reads_back_the_same_trace(dlrm, dlrm_stores):
    single, part = dlrm_stores
    assert store_layout(single) == "single" and store_layout(part) == "rank"
    assert not (part / "ops.parquet").exists()
    ts, tp = read_trace(single), read_trace(part)
    assert_same_trace(tp, ts)
    assert_same_trace(tp, dlrm)  # the saved trace itself, meta included
    assert tp.meta["schema_version"] == SCHEMA_VERSION == 2
    assert "layout" not in tp.meta and "partitions" not in tp.meta
    # one file per rank and table, row counts as derived from the trace
    meta = json.loads((part / "meta.json").read_text())
    by_rank = dlrm.ops.groupby("rank").size()
    assert meta["partitions"]["ops"] == {str(r): int(n) for r, n in by_rank.items()}
    src_rank = dlrm.ops["rank"].to_numpy()[dlrm.edges["src"].to_numpy()]
    assert sum(meta["partitions"]["edges"].values()) == len(dlrm.edges)
    assert meta["partitions"]["edges"]["3"] == int((src_rank == 3).sum())
    f = part_file(part, "ops", 5)
    assert f == part / "ops" / "rank=5" / "part-0.parquet" and f.is_file()
    assert set(pd.read_parquet(f)["rank"]) == {5}
    assert rank_rows(part) == rank_rows(single) == {int(r): int(n) for r, n in by_rank.items()}
    assert store_ranks(part).tolist() == store_ranks(single).tolist() == list(range(8))
    # column subsets as in a single-file store
    cols = ["op_id", "rank", "lane", "kind", "name_id", "start_ns", "dur_ns"]
    a, b = read_trace(part, columns=cols).ops, read_trace(single, columns=cols).ops
    pd.testing.assert_frame_equal(a[cols], b[cols])
    assert (a["bytes"] == 0).all() and (b["bytes"] == 0).all()  # not read: defaults


def test_scans_of_a_partitioned_store(dlrm, dlrm_stores):
    single, part = dlrm_stores
    for ranks in ([2], [1, 2, 3], [0, 6], None):
        a = scan_ops(part, ranks=ranks, columns=["op_id", "rank", "kind", "dur_ns"])
        b = scan_ops(single, ranks=ranks, columns=["op_id", "rank", "kind", "dur_ns"])
        pd.testing.assert_frame_equal(a, b)
    comm = scan_ops(part, kinds=[3, 4], columns=["op_id", "kind"])
    ref = dlrm.ops[dlrm.ops["kind"].isin([3, 4])]
    assert comm["op_id"].tolist() == ref["op_id"].tolist() and len(comm) > 0
    pd.testing.assert_frame_equal(scan_table(part, "ranges", ranks=[4]),
                                  scan_table(single, "ranges", ranks=[4]))
    e = scan_table(part, "edges", ranks=[7])
    src_rank = dlrm.ops["rank"].to_numpy()[e["src"].to_numpy()]
    assert len(e) > 0 and (src_rank == 7).all()
    assert len(scan_ops(part, ranks=[99])) == 0  # no such rank: empty, typed
    assert scan_ops(part, ranks=[99])["dur_ns"].dtype == np.int64


def test_unsorted_tables_keep_their_order(tmp_path):
    """A synthesized trace's ops and edges are not rank-ordered (ranks interleave in op id
    order, edges cross ranks): the partitioned store restores both orders."""
    from retime.collectors.synth import synthesize

    t = synthesize("gpt3-1.3b", "a100-80gb", tp=2, pp=2, dp=1, global_batch=4,
                   micro_batch=1, expand="all", check_memory=False)
    r = t.ops["rank"].to_numpy()
    es = r[t.edges["src"].to_numpy()]
    assert (np.diff(r) < 0).any() and (np.diff(es) < 0).any()  # really unsorted
    assert (es != r[t.edges["dst"].to_numpy()]).any()  # cross-rank edges
    p = t.save(tmp_path / "s.retime", layout="rank")
    assert_same_trace(read_trace(p), read_trace(t.save(tmp_path / "one.retime")))
    assert "_row" not in scan_table(p, "edges").columns


def test_version_1_stores_still_read(dlrm, dlrm_stores, tmp_path):
    old = tmp_path / "v1.retime"
    shutil.copytree(dlrm_stores[0], old)
    meta = json.loads((old / "meta.json").read_text())
    meta["schema_version"] = 1
    del meta["layout"]  # what a version-1 store holds
    (old / "meta.json").write_text(json.dumps(meta))
    assert store_layout(old) == "single"
    assert_same_trace(read_trace(old), dlrm)
    assert rank_rows(old)[3] == int((dlrm.ops["rank"] == 3).sum())


def test_incomplete_or_bad_partitioned_store_is_refused(dlrm_stores, tmp_path):
    part = tmp_path / "p.retime"
    shutil.copytree(dlrm_stores[1], part)
    part_file(part, "ops", 6).unlink()
    with pytest.raises(TraceFormatError, match=r"missing ops/rank=6/part-0.parquet \(rank 6\)"):
        read_trace(part)
    with pytest.raises(TraceFormatError, match="incomplete"):
        scan_ops(part, ranks=[6])
    meta = json.loads((part / "meta.json").read_text())
    del meta["partitions"]
    (part / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(TraceFormatError, match="lacks 'partitions'"):
        read_trace(part)
    with pytest.raises(TraceFormatError, match="layout 'rows' is not known"):
        read_trace(dlrm_stores[0]).save(tmp_path / "x.retime", layout="rows")


def test_partitioned_save_is_atomic(dlrm, tmp_path, monkeypatch):
    """A save that fails half-way (here: the disk fills up at the 5th rank file) leaves
    neither a store nor a temporary directory; the old store stays."""
    import retime.collectors.store as store

    p = dlrm.save(tmp_path / "a.retime", layout="rank")
    real = store.write_parquet
    calls = []

    def failing(tbl, f):
        calls.append(f)
        if len(calls) == 5:
            raise OSError(28, "No space left on device")
        real(tbl, f)

    monkeypatch.setattr(store, "write_parquet", failing)
    with pytest.raises(OSError, match="No space"):
        dlrm.save(p, layout="rank")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.retime"]
    assert_same_trace(read_trace(p), dlrm)


def test_write_store_by_rank(dlrm, tmp_path):
    """Rank by rank (memory: one rank) gives the store Trace.save(layout='rank') gives."""
    def ranks():
        e_rank = dlrm.ops["rank"].to_numpy()[dlrm.edges["src"].to_numpy()]
        for r in range(8):
            yield r, {"ops": dlrm.ops[dlrm.ops["rank"] == r],
                      "edges": dlrm.edges[e_rank == r],
                      "ranges": dlrm.ranges[dlrm.ranges["rank"] == r],
                      "memory": dlrm.memory[dlrm.memory["rank"] == r]}

    meta = {k: v for k, v in dlrm.meta.items() if k != "schema_version"}
    p = write_store_by_rank(tmp_path / "w.retime", ranks(), lanes=dlrm.lanes,
                            groups=dlrm.groups, strings=dlrm.strings, meta=meta)
    assert_same_trace(read_trace(p), dlrm)


# -- Dask: the workers write their own ranks ----------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as lc, \
            distributed.Client(lc, set_as_default=False) as client:
        yield lc, client


def test_ingest_on_dask_writes_a_partitioned_store_equal_to_local_ingest(
        cluster, dlrm, tmp_path):
    from retime.collectors.distributed import ingest_distributed

    lc, client = cluster
    out = tmp_path / "d.retime"
    res = ingest_distributed(DLRM, client, out, progress=False)
    assert store_layout(out) == "rank"
    assert_same_trace(read_trace(out), dlrm)
    assert res["ops"] == dlrm.n_ops and res["edges"] == len(dlrm.edges)
    assert res["ranges"] == len(dlrm.ranges) and res["ranks"] == list(range(8))
    assert res["meta"] == dlrm.meta
    # the workers wrote the rank files (their pids differ from ours)
    pids = set(client.run(os.getpid).values())
    assert os.getpid() not in pids and len(pids) == 2
    # a file no worker can read: the ingest fails, no store and no temp dir are left
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(DLRM / sorted(os.listdir(DLRM))[0], bad / "rank-0.json")
    (bad / "rank-1.json").write_text('{"traceEvents": [')
    with pytest.raises(TraceFormatError):
        ingest_distributed(bad, client, tmp_path / "bad.retime", progress=False)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["bad", "d.retime"]


def test_cli_ingest_scheduler_subprocess(cluster, dlrm, tmp_path):
    lc, _ = cluster
    out = tmp_path / "cli.retime"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "retime", "ingest", str(DLRM), "-o", str(out),
                           "--scheduler", lc.scheduler_address, "--json"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads(proc.stdout)
    assert s["layout"] == "rank" and s["ops"] == dlrm.n_ops and s["edges"] == len(dlrm.edges)
    assert s["collectives"]["matched"] == dlrm.meta["collectives"]["matched"]
    assert_same_trace(read_trace(out), dlrm)


def test_cli_ingest_layout_locally(dlrm, tmp_path, capsys):
    from retime.cli import run

    out = tmp_path / "l.retime"
    assert run(["ingest", str(DLRM), "-o", str(out), "--layout", "rank", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["layout"] == "rank" and s["ops"] == dlrm.n_ops
    assert store_layout(out) == "rank"
    assert_same_trace(read_trace(out), dlrm)


def test_info_of_a_partitioned_store_is_streamed_and_equal(dlrm_stores, capsys):
    """`retime info` of a rank-partitioned store (summarized from metadata and scans)
    prints the same JSON as of the single-file store."""
    from retime.cli import run

    out = []
    for p in dlrm_stores:
        assert run(["info", str(p), "--json"]) == 0
        out.append(json.loads(capsys.readouterr().out))
    assert out[0] == out[1]
    assert out[1]["ops"] == sum(out[1]["ops_by_kind"].values()) and len(out[1]["span_ns"]) == 8
