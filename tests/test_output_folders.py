"""Every command that writes a file or store creates the missing parent folders of its output
path (README, Commands), and still refuses a parent that is a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib

from retime.cli import run

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT.parent / "shared" / "traces" / "kineto" / "a100-event-sync" / "single_stream.json.gz"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    out = tmp_path_factory.mktemp("folders") / "one.retime"
    assert run(["ingest", str(SMALL), "-o", str(out)]) == 0
    return out


def test_every_writer_creates_missing_parent_folders(store, tmp_path, capsys):
    d = tmp_path / "a" / "b"
    cases = [
        (["ingest", str(SMALL), "-o", str(d / "i" / "x.retime")], d / "i" / "x.retime" / "meta.json"),
        (["replay", str(store), "-o", str(d / "r" / "x.retime")], d / "r" / "x.retime" / "meta.json"),
        (["export", str(store), "--chrome", str(d / "c" / "x.json")], d / "c" / "x.json"),
        (["report", str(store), "-o", str(d / "h" / "x.html")], d / "h" / "x.html"),
        (["cost", "cluster", "--preset", "dgx-h100", "-o", str(d / "t" / "c.toml")],
         d / "t" / "c.toml"),
        (["cost", "collective", "all_reduce", "--preset", "dgx-h100", "--sizes", "1M:4M",
          "--plot", str(d / "p" / "x.png")], d / "p" / "x.png"),
    ]
    for argv, made in cases:
        assert run(argv) == 0, argv
        assert made.is_file(), argv
    assert json.loads((d / "c" / "x.json").read_text())["traceEvents"]
    assert tomllib.loads((d / "t" / "c.toml").read_text())
    assert (d / "p" / "x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # no temporary sibling is left behind
    assert not [p for p in d.rglob(".*tmp")]


def test_a_parent_that_is_a_file_is_refused(tmp_path, capsys):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    for argv in (["cost", "cluster", "--preset", "dgx-h100", "-o", str(blocker / "c.toml")],
                 ["cost", "collective", "all_reduce", "--preset", "dgx-h100",
                  "--plot", str(blocker / "x.png")]):
        assert run(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is not a folder" in err[0], err
    assert blocker.read_text() == "x"
