"""CLI manners (issue 19): outputs are never overwritten without --force, filesystem errors
are one-line user errors, --json errors are JSON, help shows brackets, `retime keys`, and a
built wheel installs the one top-level name `retime` with its data files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from retime.cli import run

ROOT = Path(__file__).resolve().parents[1]
DLRM = ROOT.parent / "shared" / "traces" / "kineto" / "dlrm-v100-8rank"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    out = tmp_path_factory.mktemp("manners") / "dlrm.retime"
    assert run(["ingest", str(DLRM), "-o", str(out)]) == 0
    return out


def _snapshot(d: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(d.rglob("*")) if p.is_file()}


def _one_json(out: str) -> dict:
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out
    return json.loads(lines[0])


def test_ingest_refuses_an_existing_store_unless_forced(store, capsys):
    before = _snapshot(store)
    assert run(["ingest", str(DLRM), "-o", str(store)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "already exists" in err and "--force" in err
    assert _snapshot(store) == before  # untouched
    assert run(["ingest", str(DLRM), "-o", str(store), "--json"]) == 2
    e = _one_json(capsys.readouterr().out)
    assert e["exit_code"] == 2 and "already exists" in e["error"] and "--force" in e["hint"]
    assert run(["ingest", str(DLRM), "-o", str(store), "--force", "--json"]) == 0
    assert _one_json(capsys.readouterr().out)["ops"] > 0


def test_a_users_own_folder_is_never_replaced(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert run(["ingest", str(DLRM), "-o", str(mine), "--force"]) == 2
    assert "not a retime store" in capsys.readouterr().err
    assert (mine / "notes.txt").read_text() == "keep me" and len(list(mine.iterdir())) == 1


def test_report_to_an_impossible_path_is_one_line_exit_2(store, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for as_json in (False, True):
        argv = ["report", str(store), "-o", str(blocker / "sub" / "r.html")]
        assert run(argv + (["--json"] if as_json else [])) == 2
        cap = capsys.readouterr()
        assert len(cap.err.strip().splitlines()) == 1 and "Traceback" not in cap.err
        assert "is not a folder" in cap.err
        if as_json:
            assert "is not a folder" in _one_json(cap.out)["error"]
        else:
            assert cap.out == ""
    assert not (blocker.parent / "sub").exists()


def test_report_and_export_refuse_existing_files(store, tmp_path, capsys):
    html = tmp_path / "r.html"
    html.write_text("mine")
    assert run(["report", str(store), "-o", str(html)]) == 2
    assert html.read_text() == "mine" and "--force" in capsys.readouterr().err
    chrome = tmp_path / "t.json"
    chrome.write_text("mine")
    assert run(["export", str(store), "--chrome", str(chrome)]) == 2
    assert chrome.read_text() == "mine"
    assert run(["export", str(store), "--chrome", str(chrome), "--force"]) == 0
    assert json.loads(chrome.read_text())["traceEvents"]


@pytest.mark.parametrize("argv", [
    ["info", "/nonexistent/x.retime"],
    ["replay", "/nonexistent/x.retime"],
    ["synth", "-o", "x.retime"],
    ["keys", "nosuchtable"],
    ["ingest", "/nonexistent/traces", "-o", "x.retime"],
    ["analyze", "/nonexistent/x.retime"],
])
def test_json_errors_are_one_json_object(argv, capsys):
    assert run([*argv, "--json"]) == 2
    e = _one_json(capsys.readouterr().out)
    assert set(e) == {"error", "hint", "exit_code"} and e["exit_code"] == 2 and e["error"]


def test_synth_names_every_missing_option_at_once(tmp_path, capsys):
    assert run(["synth", "-o", str(tmp_path / "s.retime"), "--pp", "2", "--fsdp", "--zero",
                "1"]) == 2
    err = capsys.readouterr().err
    for needle in ("--tp", "--dp", "--global-batch", "--micro-batch", "--model",
                   "--hardware", "FSDP is ZeRO-3"):
        assert needle in err
    assert "--pp," not in err and len(err.strip().splitlines()) == 1


def test_help_shows_brackets_literally_and_no_args_is_help(capsys):
    assert run(["sweep", "--help"]) == 0
    out = capsys.readouterr().out
    assert "[grid]" in out and "[[scenario]]" in out
    assert run(["replay", "--help"]) == 0
    assert "[table]" in capsys.readouterr().out
    assert run([]) == 0
    assert "Commands:" in capsys.readouterr().out


def test_keys_lists_exactly_the_scenario_vocabulary(capsys):
    from retime.replay.policies.scenario import vocabulary

    assert run(["keys", "--json"]) == 0
    rows = _one_json(capsys.readouterr().out)["keys"]
    assert [r["key"] for r in rows] == vocabulary()  # same keys, same order
    for r in rows:
        assert all(r[f].strip() for f in ("unit", "values", "default", "supports", "help",
                                          "needs")), r
    assert run(["keys", "network"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("[network]") and "inter_node_gbps" in out and "GB/s" in out
    # what each key needs on a measured trace, and from where (the trace, you, a calibration)
    needs = {r["key"]: r["needs"] for r in rows}
    assert needs["network.inter_node_gbps"].startswith("you: the new link's nominal rate")
    assert "calibration:" in needs["overlap.bucket_mb"] and "trace:" in needs["overlap.bucket_mb"]
    assert "Needs: you: the new link's nominal rate" in out
    assert "parallel.dp" not in out


def test_demo_refuses_a_folder_it_did_not_write(tmp_path, capsys):
    (tmp_path / "thesis.tex").write_text("x")
    assert run(["demo", "-o", str(tmp_path)]) == 2
    assert "was not written by `retime demo`" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["thesis.tex"]


def test_wheel_installs_one_top_level_name_with_its_data(tmp_path):
    # build from a copy: an in-tree build leaves build/ and egg-info in the checkout
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "build", "*.egg-info", "__pycache__", "*.retime", "retime-demo", "reports",
        "bench", "tests", "examples", ".venv"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
                        "--no-build-isolation", "-q", "-w", str(tmp_path)],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = tmp_path.glob("retime-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"retime"}
    need = ["retime/collectors/kineto/reader.py", "retime/replay/_fluid.py",
            "retime/analysis/templates/report.html.j2",
            "retime/collectors/synth/hardware/a100-80gb.toml",
            "retime/collectors/synth/models/gpt3.toml", "retime/traces/README.md"]
    for n in need:
        assert n in names, n
    sample = [n for n in names if n.startswith("retime/traces/dlrm-v100-8rank/")]
    assert len(sample) == len(list((ROOT / "traces" / "dlrm-v100-8rank").glob("*.json.gz")))


def test_help_imports_no_heavy_library():
    """`retime --help` (and every command's registration) stays light: no pandas, numpy,
    pyarrow or numba until a command runs (start-up budget, bench/startup.py)."""
    code = ("import sys, retime.cli; "
            "print(sorted(m for m in ('pandas', 'numpy', 'pyarrow', 'numba', 'matplotlib') "
            "if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_cli_skips_numbas_blas_probe_only():
    """The console script answers numba's BLAS probe (scipy.linalg, ~0.2 s of CPU on first
    kernel load) with "not available" (retime's kernels use no BLAS); every other import of
    scipy, the user's own included, still works in that process."""
    code = (
        "import sys, importlib.util\n"
        "from retime.cli import _NoBlasForNumba\n"
        "sys.meta_path.insert(0, _NoBlasForNumba())\n"
        "import numba.np.arraymath as am\n"
        "print('blas', am._HAVE_BLAS, 'scipy.linalg' in sys.modules)\n"
        "if importlib.util.find_spec('scipy') is not None:\n"
        "    import scipy.linalg\n"
        "    print('user import ok', scipy.linalg.__name__)\n"
        "else:\n"
        "    print('user import ok (no scipy)')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "blas False False" and lines[1].startswith("user import ok")


def test_report_html_then_pdf_share_their_tables_folder(store, tmp_path, capsys):
    """Issue 30: `report -o X.html` then `report -o X.pdf` of the same run refused the second
    (both write X-tables/). The folder is the report's, in either form; another run's report
    of the same name still needs --force."""
    html, pdf = tmp_path / "X.html", tmp_path / "X.pdf"
    assert run(["report", str(store), "-o", str(html)]) == 0
    tables = tmp_path / "X-tables"
    csvs = sorted(p.name for p in tables.glob("*.csv"))
    assert csvs
    assert run(["report", str(store), "-o", str(pdf)]) == 0
    assert sorted(p.name for p in tables.glob("*.csv")) == csvs
    capsys.readouterr()
    other = tmp_path / "other.retime"
    shutil.copytree(store, other)
    assert run(["report", str(other), "-o", str(tmp_path / "X.htm")]) == 2
    assert "the tables of another report" in capsys.readouterr().err
    assert run(["report", str(other), "-o", str(tmp_path / "X.htm"), "--force"]) == 0
