"""Rank-wise ingest (collectors/rankwise.py, what `retime ingest` runs on Kineto files): the
store it writes rank by rank reads back into the Trace of the whole-trace merge, in both
layouts and with worker processes; every event is accounted for; a failure leaves nothing
behind."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest
from test_store_layout import assert_same_trace

from retime.collectors.errors import RetimeError, TraceFormatError
from retime.collectors.ingest import ingest, read
from retime.collectors.store import store_layout
from retime.collectors.trace import STAT_COLUMNS, read_trace

ROOT = Path(__file__).resolve().parents[1]
KINETO = ROOT.parent / "shared" / "traces" / "kineto"
DLRM = KINETO / "dlrm-v100-8rank"
A100 = KINETO / "a100-ddp-nccl"


@pytest.fixture(scope="module")
def dlrm():
    return read(DLRM)


@pytest.mark.parametrize("layout,jobs", [("single", 1), ("rank", 1), ("rank", 2),
                                         ("single", 2)])
def test_rankwise_store_equals_the_merged_trace(dlrm, tmp_path, layout, jobs):
    out = tmp_path / "r.retime"
    res = ingest(DLRM, out, layout=layout, jobs=jobs, progress=False)
    assert store_layout(out) == layout
    t = read_trace(out)
    assert_same_trace(t, dlrm)
    assert res["ops"] == dlrm.n_ops and res["edges"] == len(dlrm.edges)
    assert res["ranges"] == len(dlrm.ranges) and res["ranks"] == list(range(8))
    assert res["meta"] == dlrm.meta and res["world_size"] == dlrm.world_size
    # the spool of parsed parts is gone, and nothing but the store is left beside it
    assert not (out / ".spool").exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["r.retime"]
    # the in-memory path writes the same store
    mem = ingest(DLRM, tmp_path / "m.retime", layout=layout, in_memory=True, progress=False)
    assert {k: v for k, v in mem.items() if k != "output"} == {
        k: v for k, v in res.items() if k != "output"}
    if layout == "single":  # one row group per rank
        import pyarrow.parquet as pq
        assert pq.ParquetFile(out / "ops.parquet").metadata.num_row_groups == 8


def test_every_event_accounted_for(tmp_path):
    """Per input file: events read == kept + dropped == the raw count (plain json)."""
    files = sorted(A100.glob("*.json.gz"))
    res = ingest(files, tmp_path / "a.retime", progress=False)
    acc = res["meta"]["accounting"]
    assert sorted(acc) == sorted(str(f) for f in files)
    for f in files:
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            doc = json.load(fh)
        n = len(doc["traceEvents"])
        a = acc[str(f)]
        assert a["events_read"] == n
        assert sum(a["kept"].values()) + sum(a["dropped"].values()) == n
    assert_same_trace(read_trace(tmp_path / "a.retime"), read(files))


def test_a_file_with_several_ranks(dlrm, tmp_path):
    """A `retime export --chrome` file holds every rank: its sub-parts are written rank by
    rank as well, equal to reading it whole."""
    from retime.collectors.chrome import write_chrome

    f = tmp_path / "all.json.gz"
    write_chrome(dlrm, f, flows=True)
    whole = read(f)
    for layout in ("single", "rank"):
        out = tmp_path / f"x-{layout}.retime"
        ingest(f, out, layout=layout, progress=False)
        assert_same_trace(read_trace(out), whole)


@pytest.mark.parametrize("jobs", [1, 2])
def test_failures_leave_nothing(tmp_path, jobs):
    files = sorted(os.listdir(DLRM))
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(DLRM / files[0], bad / "rank-0.json.gz")
    (bad / "rank-1.json").write_text('{"traceEvents": [')
    with pytest.raises(TraceFormatError):
        ingest(bad, tmp_path / "bad.retime", jobs=jobs, progress=False)
    # two files of one rank: refused when the skeletons are merged, before any rank is written
    dup = tmp_path / "dup"
    dup.mkdir()
    shutil.copy(DLRM / files[0], dup / "a.json.gz")
    shutil.copy(DLRM / files[0], dup / "b.json.gz")
    with pytest.raises(TraceFormatError, match="appears in two files"):
        ingest(dup, tmp_path / "dup.retime", layout="rank", jobs=jobs, progress=False)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["bad", "dup"]


def test_ingest_gives_the_collector_back(tmp_path):
    """ingest_kineto freezes the collector while it runs, and unfreezes it after (a library
    caller's process collects as before), on success and on failure alike."""
    import gc

    assert gc.get_freeze_count() == 0
    ingest(DLRM, tmp_path / "g.retime", layout="rank", jobs=2, progress=False)
    assert gc.get_freeze_count() == 0 and gc.isenabled()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rank-1.json").write_text('{"traceEvents": [')
    with pytest.raises(TraceFormatError):
        ingest(bad, tmp_path / "b.retime", progress=False)
    assert gc.get_freeze_count() == 0


def _die_with_sigbus(path, spool, **kw):
    """A worker that faults as one reading a mapped file truncated under it would."""
    import faulthandler
    import signal

    faulthandler.disable()  # pytest's would print the worker's stack
    os.kill(os.getpid(), signal.SIGBUS)


def test_a_dead_worker_is_one_clear_error(tmp_path, monkeypatch):
    """Workers map plain files: one killed (SIGBUS from a file truncated meanwhile, or the
    OOM killer) is reported in one line and leaves nothing behind."""
    import retime.collectors.rankwise as rw

    monkeypatch.setattr(rw, "parse_and_spool", _die_with_sigbus)
    with pytest.raises(RetimeError, match="ingest worker process died") as exc:
        ingest(DLRM, tmp_path / "d.retime", layout="rank", jobs=2, progress=False)
    assert "\n" not in str(exc.value)
    assert list(tmp_path.iterdir()) == []


def test_dask_workers_spool_and_release(dlrm, tmp_path):
    """On Dask the workers spool their parts (nothing kept between the stages), the store
    equals the local one, no spool is left, and the workers hand freed memory back."""
    distributed = pytest.importorskip("distributed")
    from retime.collectors.distributed import ingest_distributed, release_memory

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as lc, \
            distributed.Client(lc, set_as_default=False) as client:
        out = tmp_path / "d.retime"
        res = ingest_distributed(DLRM, client, out, progress=False)
        assert_same_trace(read_trace(out), dlrm)
        assert res["ops"] == dlrm.n_ops and not (out / ".spool").exists()
        # no task result stays on the workers after the job
        assert not any(client.run(lambda dask_worker: len(dask_worker.data)).values())

        def tuned():
            import os

            import retime.collectors.distributed as d
            return bool(os.environ.get("MALLOC_TRIM_THRESHOLD_")), d._heap_tuned

        # the nanny's MALLOC_TRIM_THRESHOLD_ is overridden while ingest tasks run (a worker
        # that ran none keeps its settings) and put back by release_memory, which the ingest
        # calls at its end
        assert all(env and not t for env, t in client.run(tuned).values())
        from retime.collectors.distributed import _parse_task

        one = sorted(DLRM.glob("*.json*"))[0]
        assert client.submit(_parse_task, str(one), pure=False).result().rank >= 0
        assert sum(t for _, t in client.run(tuned).values()) == 1
        rss = release_memory(client)
        assert len(rss) == 2 and all(v > 0 for v in rss.values())
        assert not any(t for _, t in client.run(tuned).values())
    assert sorted(x.name for x in tmp_path.iterdir()) == ["d.retime"]


@pytest.mark.parametrize("layout", ["single", "rank"])
def test_store_files_use_the_store_encoding(tmp_path, layout):
    """Every Parquet file the ingest writes follows parquet_options(): LZ4, no dictionary
    pages, 64-bit integer columns delta-encoded and the narrower ones plain, statistics for
    the filtered columns only (a writer that bypassed it would differ here)."""
    import pyarrow.parquet as pq

    out = tmp_path / "e.retime"
    ingest(DLRM, out, layout=layout, jobs=2, progress=False)
    files = sorted(out.rglob("*.parquet"))
    assert len(files) >= 6
    n_wide = n_narrow = 0
    for f in files:
        md = pq.ParquetFile(f).metadata
        schema = pq.read_schema(f)
        for g in range(md.num_row_groups):
            for c in range(md.num_columns):
                col = md.row_group(g).column(c)
                assert col.compression in ("LZ4", "LZ4_RAW"), (f, col.path_in_schema)
                assert col.is_stats_set == (col.path_in_schema in STAT_COLUMNS), (
                    f, col.path_in_schema)
                assert not {"PLAIN_DICTIONARY", "RLE_DICTIONARY"} & set(col.encodings), (
                    f, col.path_in_schema, col.encodings)
                name = col.path_in_schema
                if name in schema.names and int_bits(schema.field(name).type):
                    delta = "DELTA_BINARY_PACKED" in col.encodings
                    assert delta == (int_bits(schema.field(name).type) == 64), (
                        f, name, col.encodings)
                    n_wide += delta
                    n_narrow += not delta
    assert n_wide and n_narrow  # both kinds of integer column were seen


def int_bits(t) -> int:
    """Bit width of an integer Arrow type (0 for any other type)."""
    import pyarrow as pa

    return t.bit_width if pa.types.is_integer(t) else 0


def test_warm_scanner_loads_the_kernels_before_workers_fork(tmp_path, monkeypatch):
    """warm_scanner() parses its tiny document with the scanner (every kernel the scanner
    runs gets a loaded signature), leaves no file behind, and does nothing when the files
    will not be read with the scanner."""
    from retime.collectors import _kernels
    from retime.collectors.kineto import _scan_cold, _scan_kernels, reader

    f = next(DLRM.glob("*.json*"))
    monkeypatch.setattr(reader, "STREAMING", False)
    assert reader.warm_scanner(f, tmp_path) is False
    monkeypatch.setattr(reader, "STREAMING", True)
    assert reader.warm_scanner(f, tmp_path) is True
    assert list(tmp_path.iterdir()) == []
    for disp in (_scan_kernels._scan_events, _scan_cold._find_array, _kernels._nest):
        assert disp.signatures, disp
    # the tiny document is a valid trace the scanner reads exactly (not the general path)
    from retime.collectors.kineto.scan import parse_fast

    doc = tmp_path / "w.json"
    doc.write_bytes(reader._WARM_DOC)
    part = parse_fast(doc)
    # ops: the launch and its kernel; the two nested cpu_ops contain it, so they are ranges
    assert part is not None and len(part.ops["start_ns"]) == 2
    assert len(part.ranges["start_ns"]) == 2 and len(part.edges["src"]) >= 1


def test_default_jobs_is_the_usable_cores():
    from retime.collectors.rankwise import default_jobs

    assert default_jobs() == len(os.sched_getaffinity(0))
