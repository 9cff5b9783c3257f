"""`retime ingest` with worker processes (and, in the single layout, a writer thread per
table file) writes the same store as the serial path, byte for byte: every file of the
store, meta.json included, on shared multi-rank traces in both layouts (issue 30)."""

from __future__ import annotations

from pathlib import Path

import pytest

from retime.collectors.ingest import ingest

ROOT = Path(__file__).resolve().parents[1]
KINETO = ROOT.parent / "shared" / "traces" / "kineto"


def _files(store: Path) -> dict[str, bytes]:
    return {str(f.relative_to(store)): f.read_bytes()
            for f in sorted(store.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("trace", ["dlrm-v100-8rank", "a100-ddp-nccl"])
@pytest.mark.parametrize("layout", ["single", "rank"])
def test_parallel_ingest_writes_the_serial_store(tmp_path, trace, layout):
    src = KINETO / trace
    serial, par = tmp_path / "s.retime", tmp_path / "p.retime"
    a = ingest(src, serial, layout=layout, jobs=1, progress=False)
    b = ingest(src, par, layout=layout, jobs=2, progress=False)
    assert {k: v for k, v in a.items() if k != "output"} == {
        k: v for k, v in b.items() if k != "output"}
    fa, fb = _files(serial), _files(par)
    assert sorted(fa) == sorted(fb)
    assert "meta.json" in fa and any(k.endswith(".parquet") for k in fa)
    for name in fa:
        assert fa[name] == fb[name], name


def test_single_layout_writer_threads_keep_row_group_order(tmp_path, monkeypatch):
    """The threaded write is what jobs > 1 uses in the single layout: one row group per
    rank, in rank order, in every table file (a writer thread that reordered or dropped a
    rank's row group would fail here)."""
    import pyarrow.parquet as pq

    import retime.collectors.rankwise as rw

    used = []
    real = rw._write_all

    def spy(*a, **k):
        used.append(k.get("write_threads"))
        return real(*a, **k)

    monkeypatch.setattr(rw, "_write_all", spy)
    out = tmp_path / "t.retime"
    ingest(KINETO / "dlrm-v100-8rank", out, layout="single", jobs=2, progress=False)
    assert used == [True]
    for name in ("ops", "ranges"):
        f = pq.ParquetFile(out / f"{name}.parquet")
        assert f.metadata.num_row_groups == 8
        ranks = [f.read_row_group(g, columns=["rank"]).column(0).unique().to_pylist()
                 for g in range(8)]
        assert ranks == [[r] for r in range(8)], name
