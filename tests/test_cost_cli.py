"""`retime cost` (issue 32): cluster / collective / op output, --json field names, --plot,
bad input (one line, exit 2, nothing written; JSON with --json), one real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from retime.cli import run
from retime.collectors.costs import collective_cost, load_preset, read_cluster

ROOT = Path(__file__).resolve().parents[1]


def _one_json(out: str) -> dict:
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out
    return json.loads(lines[0])


def test_cluster_writes_an_editable_file_and_refuses_to_overwrite(tmp_path, capsys):
    assert run(["cost", "cluster", "--preset", "dgx-h100", "--nodes", "4"]) == 0
    text = capsys.readouterr().out
    assert "nodes = 4" in text and 'gpu = "h100-sxm"' in text and "nic_gbit = 400.0" in text
    f = tmp_path / "ours.toml"
    assert run(["cost", "cluster", "--preset", "dgx-h100", "--nodes", "4", "-o", str(f)]) == 0
    assert read_cluster(f) == load_preset("dgx-h100").with_overrides(nodes=4)
    capsys.readouterr()
    before = f.read_text()
    assert run(["cost", "cluster", "--preset", "dgx-a100", "-o", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--force" in err and f.read_text() == before
    assert run(["cost", "cluster", "--preset", "dgx-a100", "-o", str(f), "--force"]) == 0
    assert read_cluster(f).gpu == "a100-80gb"
    # an edited file comes back through --cluster, flags override single fields
    f.write_text(f.read_text().replace("nodes = 1", "nodes = 2"))
    capsys.readouterr()
    assert run(["cost", "cluster", "--cluster", str(f), "--nic-gbit", "100", "--json"]) == 0
    d = _one_json(capsys.readouterr().out)
    assert d["cluster"]["nodes"] == 2 and d["cluster"]["network"]["nic_gbit"] == 100.0
    assert d["world_size"] == 16


def test_collective_table_json_and_library_agree(capsys):
    argv = ["cost", "collective", "all_reduce", "--preset", "dgx-h100", "--nodes", "2",
            "--sizes", "1M:1G:4"]
    assert run(argv + ["--json"]) == 0
    d = _one_json(capsys.readouterr().out)
    assert [r["bytes"] for r in d["rows"]] == [2**20 * 4**i for i in range(6)]
    for r in d["rows"]:
        assert set(r) >= {"bytes", "time_us", "algbw_gbps", "busbw_gbps", "algorithm",
                          "protocol", "range_us"}
        lo, hi = r["range_us"]
        assert lo < r["time_us"] < hi
        ref = collective_cost(load_preset("dgx-h100").with_overrides(nodes=2), "all_reduce",
                              r["bytes"])
        assert r["time_us"] == pytest.approx(ref.time_us, abs=1e-3)  # one formula
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / r["time_us"] / 1e3, rel=1e-3)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * 15 / 16, rel=1e-3)
    assert d["ranks"] == 16 and any("infiniband" in a for a in d["assumed"])
    assert run(argv) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("# retime cost collective all_reduce")
    assert sum(1 for ln in lines if ln.strip() and ln.strip()[0].isdigit()) == 6
    assert sum(1 for ln in lines if ln.startswith("assumed: ")) >= 4


def test_forcing_algo_and_proto(capsys):
    assert run(["cost", "collective", "all_reduce", "--preset", "dgx-h100", "--algo", "ring",
                "--proto", "LL128", "--sizes", "64M", "--json"]) == 0
    r = _one_json(capsys.readouterr().out)["rows"][0]
    assert (r["algorithm"], r["protocol"]) == ("ring", "LL128")


def test_plot_png_and_html(tmp_path, capsys):
    png = tmp_path / "ar.png"
    assert run(["cost", "collective", "all_gather", "--preset", "dgx-a100", "--sizes",
                "1M:1G", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert capsys.readouterr().out.rstrip().endswith(f"wrote {png}")
    html = tmp_path / "ar.html"
    assert run(["cost", "collective", "alltoall", "--preset", "dgx-a100", "--nodes", "2",
                "--plot", str(html), "--json"]) == 0
    assert _one_json(capsys.readouterr().out)["plot"] == str(html)
    assert "<svg" in html.read_text()


@pytest.mark.parametrize("argv, words", [
    (["cost", "collective", "all_reduce", "--preset", "dgx-x"], "unknown cluster preset"),
    (["cost", "collective", "all_reduce", "--gpu", "v100"], "unknown GPU"),
    (["cost", "collective", "all_reduce", "--sizes", "1M:lots"], "cannot read"),
    (["cost", "collective", "all_reduce", "--sizes", "1G:1M"], "FROM <= TO"),
    (["cost", "collective", "all_reduce", "--gpus-per-node", "16"], "only 8 GPUs per node"),
    (["cost", "collective", "all_reduce", "--preset", "dgx-a100", "--nvls"], "NVLS"),
    (["cost", "collective", "all_reduce", "--preset", "dgx-a100", "--algo", "nvls"], "NVLS"),
    (["cost", "collective", "all_reduce", "--gpus-per-node", "1"], "at least 2 ranks"),
    (["cost", "collective", "allgatherv"], "unknown collective"),
    (["cost", "op", "matmul", "--m", "128", "--n", "128"], "missing --k"),
    (["cost", "op", "matmul", "--m", "8", "--n", "8", "--k", "8", "--gpu", "a100-80gb",
      "--dtype", "fp8"], "no fp8 peak"),
])
def test_bad_input_is_one_line_exit_2_and_json(argv, words, tmp_path, capsys):
    plot = tmp_path / "never.png"
    extra = ["--plot", str(plot)] if argv[1] == "collective" else []
    assert run(argv + extra) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and len(cap.err.strip().splitlines()) == 1 and words in cap.err
    assert run(argv + extra + ["--json"]) == 2
    e = _one_json(capsys.readouterr().out)
    assert e["exit_code"] == 2 and words in e["error"] + e["hint"]
    assert not plot.exists()


def test_op_matmul_json_fields(capsys):
    assert run(["cost", "op", "matmul", "--m", "8192", "--n", "8192", "--k", "8192",
                "--gpu", "h100-sxm", "--dtype", "bf16", "--json"]) == 0
    d = _one_json(capsys.readouterr().out)
    assert set(d) >= {"time_us", "range_us", "tflops", "bound", "flops", "bytes", "gbps",
                      "efficiency", "efficiency_source"}
    assert d["bound"] == "compute" and d["tflops"] <= 792.1
    assert d["range_us"][0] < d["time_us"] < d["range_us"][1]
    assert run(["cost", "op", "attention", "--batch", "1", "--heads", "32", "--kv-heads", "8",
                "--seq", "4096", "--head-dim", "128", "--causal", "--backward"]) == 0
    out = capsys.readouterr().out
    assert "attention on h100-sxm" in out and "assumed: efficiency" in out
    assert run(["cost", "op", "optimizer", "--params", "1000000000", "--preset", "dgx-a100",
                "--json"]) == 0
    d = _one_json(capsys.readouterr().out)
    assert d["gpu"] == "a100-80gb" and d["bound"] == "memory"


def test_help_explains_units():
    p = subprocess.run([sys.executable, "-m", "retime", "cost", "collective", "--help"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0
    for words in ("Gbit/s per direction", "GB/s per GPU per direction", "powers of 1024",
                  "NCCL_ALGO", "NCCL_PROTO", ".png or .html"):
        assert words in " ".join(p.stdout.split()), words


def test_real_subprocess_json_and_error(tmp_path):
    p = subprocess.run([sys.executable, "-m", "retime", "cost", "collective", "all_gather",
                        "--preset", "dgx-a100", "--sizes", "1G", "--json"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    row = json.loads(p.stdout)["rows"][0]
    assert row["algorithm"] == "ring" and 180 < row["busbw_gbps"] < 234
    out = tmp_path / "c.toml"
    q = subprocess.run([sys.executable, "-m", "retime", "cost", "cluster", "--preset",
                        "dgx-a100", "--nodes", "0", "-o", str(out)],
                       capture_output=True, text=True, cwd=ROOT)
    assert q.returncode == 2 and q.stdout == "" and not out.exists()
    assert len(q.stderr.strip().splitlines()) == 1


def test_op_trace_self_check(tmp_path, capsys):
    """`retime cost op --trace`: the heaviest shaped operators of a real H100 trace, the
    model on the trace's own GPU (read from its devices) and on an A100."""
    kineto = ROOT.parent / "shared" / "traces" / "kineto" / "h100-vgg13"
    store = tmp_path / "vgg.retime"
    assert run(["ingest", str(kineto), "-o", str(store)]) == 0
    capsys.readouterr()
    assert run(["cost", "op", "--trace", str(store), "--gpu", "a100-80gb", "--top", "5",
                "--json"]) == 0
    d = _one_json(capsys.readouterr().out)
    assert d["trace_gpu"] == "h100-sxm" and d["gpu"] == "a100-80gb"
    assert 1 <= len(d["ops"]) <= 5
    for r in d["ops"]:
        assert r["measured_us"] > 0 and r["model_us"] > 0
        assert r["error"] == pytest.approx(r["model_us"] / r["measured_us"] - 1)
        assert r["range_lo_us"] < r["model_us"] < r["range_hi_us"]
        if r["bound"] == "compute":  # an A100 is slower than an H100 at the same shape
            assert r["other_us"] > r["model_us"]
    tot = [r["measured_us"] * r["count"] for r in d["ops"]]
    assert tot == sorted(tot, reverse=True)  # heaviest groups first, by measured time
    assert run(["cost", "op", "matmul", "--trace", str(store)]) == 2
    assert "not both" in capsys.readouterr().err


def test_cli_choices_equal_the_cost_layers_names():
    """The CLI keeps light copies of the cost layer's enums; they must not drift."""
    from retime import cmd_cost
    from retime.collectors.costs import nccl

    for cli, lib in ((cmd_cost.CollectiveName, nccl.Collective), (cmd_cost.ProtoName, nccl.Proto)):
        assert [m.value for m in cli] == [m.value for m in lib]
    # --algo forces what NCCL_ALGO can: every algorithm but the grouped point-to-point one
    assert [m.value for m in cmd_cost.AlgoName] == [m.value for m in nccl.Algo
                                                    if m is not nccl.Algo.p2p]
