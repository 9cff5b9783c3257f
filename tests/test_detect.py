"""Format detection by content: nsys SQLite, op-level folders, and clear errors otherwise."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from retime.cli import run
from retime.collectors.errors import TraceFormatError
from retime.collectors.ingest import detect_format, read

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
NSYS = TRACES / "nsys" / "h100-2gpu-fastvideo.sqlite"
OPLEVEL = TRACES / "oplevel" / "megatron-ST-8rank"


def test_known_formats():
    assert detect_format(NSYS) == "nsys"
    assert detect_format(OPLEVEL) == "oplevel"
    assert detect_format(OPLEVEL / "trace-ST.parquet") == "oplevel"


def test_content_not_extension(tmp_path):
    p = tmp_path / "profile.bin"
    shutil.copy(NSYS, p)
    assert detect_format(p) == "nsys"
    t = read(p, progress=False)
    assert t.meta["source_format"] == "nsys" and list(t.ranks) == [0, 1]
    # a folder of nsys exports is nsys too
    d = tmp_path / "nodes"
    d.mkdir()
    shutil.copy(NSYS, d / "node0.sqlite")
    assert detect_format(d) == "nsys"
    assert read(d, progress=False).n_ops == t.n_ops


def test_oplevel_folder_with_meta(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    shutil.copy(OPLEVEL / "trace-ST.parquet", d / "trace-ST.parquet")
    shutil.copy(OPLEVEL / "meta-ST.yaml", d / "meta-ST.yaml")
    assert detect_format(d) == "oplevel"
    t = read(d)
    assert t.meta["source_format"] == "oplevel" and t.world_size == 8


def test_sqlite_that_is_not_nsys(tmp_path):
    p = tmp_path / "other.sqlite"
    with sqlite3.connect(p) as con:
        con.execute("create table users (id integer)")
    with pytest.raises(TraceFormatError) as ei:
        detect_format(p)
    msg = str(ei.value)
    assert "not an Nsight Systems export" in msg
    assert "StringIds" in msg and "CUPTI_ACTIVITY_KIND_KERNEL" in msg
    assert "nsys export --type sqlite" in msg


def test_nsys_export_without_kernels(tmp_path):
    p = tmp_path / "nocuda.sqlite"
    shutil.copy(NSYS, p)
    with sqlite3.connect(p) as con:
        con.execute("drop table CUPTI_ACTIVITY_KIND_KERNEL")
    with pytest.raises(TraceFormatError) as ei:
        detect_format(p)
    msg = str(ei.value)
    assert "without GPU activity" in msg and "CUPTI_ACTIVITY_KIND_KERNEL" in msg
    assert "StringIds" not in msg.split("missing table(s)")[1].split(";")[0]
    assert "nsys export --type sqlite" in msg


def test_unknown_bytes(tmp_path):
    p = tmp_path / "noise.dat"
    p.write_bytes(b"\x00\x01garbage" * 10)
    with pytest.raises(TraceFormatError, match="not a known trace format"):
        detect_format(p)


def test_cli_reports_missing_tables_in_one_line(tmp_path, capsys):
    p = tmp_path / "other.sqlite"
    with sqlite3.connect(p) as con:
        con.execute("create table t (x)")
    rc = run(["ingest", str(p), "-o", str(tmp_path / "o.retime")])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and "CUPTI_ACTIVITY_KIND_KERNEL" in err
    assert not (tmp_path / "o.retime").exists()
    r = subprocess.run([sys.executable, "-m", "retime", "ingest", str(p), "-o",
                        str(tmp_path / "o.retime")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "nsys export --type sqlite" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_retime_store_is_not_reingested(tmp_path):
    out = tmp_path / "st.retime"
    read(OPLEVEL).save(out)
    with pytest.raises(TraceFormatError, match="already a retime trace"):
        detect_format(out)


def test_a_rank_partitioned_store_is_not_reingested(tmp_path):
    out = tmp_path / "st.retime"
    read(OPLEVEL).save(out, layout="rank")
    assert (out / "ops").is_dir() and not (out / "ops.parquet").exists()
    with pytest.raises(TraceFormatError, match="already a retime trace"):
        detect_format(out)
