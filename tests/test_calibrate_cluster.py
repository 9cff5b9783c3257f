"""`retime calibrate --cluster F` and a calibration that refines its cluster (issue 32, item 1):
the run is checked against the cluster before measuring, the file records the cluster, the
level, the sweep's alpha-beta fit and the efficiency against the level's nominal rate; given
back with the same cluster (`replay`, `sweep`, `cost collective`), an NCCL calibration's
efficiency replaces the model's for that level, `--set` still wins, another cluster's
calibration is one line and exit 2."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from retime.cli import run
from retime.collectors.calibrate import FORMAT, read_calibration
from retime.collectors.costs import load_preset, read_cluster
from retime.collectors.errors import ConfigError, TraceFormatError
from retime.replay.policies.cluster_cal import (
    check_calibrate_cluster,
    cluster_record,
    nominal_gbps,
    refine,
)
from retime.replay.policies.link_fit import fit_alpha_beta

ROOT = Path(__file__).resolve().parents[1]
HAS_TORCH = importlib.util.find_spec("torch") is not None
LAYOUT = ["--tp", "2", "--pp", "2", "--dp", "2", "--global-batch", "16", "--micro-batch", "1"]


def _one_json(out: str) -> dict:
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out
    return json.loads(lines[0])


def _json_run(argv: list[str], capsys) -> dict:
    capsys.readouterr()
    assert run([*argv, "--json"]) == 0
    return _one_json(capsys.readouterr().out)


def _fails(argv: list[str], capsys, *msgs: str) -> None:
    capsys.readouterr()
    assert run(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for m in msgs:
        assert m in err, err


def _sweep_cal(backend: str, world: int, per_host: int, alpha_ns: float, busbw: float,
               sizes=tuple(2**k for k in range(20, 28))) -> dict:
    """A calibration as `retime calibrate` writes it, its times on the line
    ``alpha + bus bytes / busbw`` (the slowest rank sets each time)."""
    f = 2.0 * (world - 1) / world
    rows = []
    for s in sizes:
        t = alpha_ns + s * f / busbw
        rows.append({"bytes": s, "ns_by_rank": [[t, t - 50, t]] + [[t - 100] * 3] *
                     (world - 1)})
    return {"format": FORMAT, "backend": backend, "world_size": world,
            "hosts": [f"h{r // per_host}" for r in range(world)], "ranks_per_host": per_host,
            "collectives": {"all_reduce": rows}}


def _write(path: Path, cal: dict) -> Path:
    path.write_text(json.dumps(cal))
    return path


def test_fit_recovers_the_line_and_says_when_sizes_cannot_tell():
    xs = np.asarray([1e6, 4e6, 16e6, 64e6])
    fit = fit_alpha_beta(xs, 20_000.0 + xs / 360.0)
    assert fit["identifiable"] and fit["why"] is None
    assert fit["alpha_ns"] == pytest.approx(20_000.0, rel=1e-6)
    assert fit["busbw_gbps"] == pytest.approx(360.0, rel=1e-9)
    one = fit_alpha_beta(xs[:2], 20_000.0 + xs[:2] / 360.0)  # two sizes: not identifiable
    assert not one["identifiable"] and "fewer than 3 sizes" in one["why"]
    assert one["alpha_ns"] == 0.0 and one["busbw_gbps"] == pytest.approx(4e6 / (20_000 + 4e6 / 360))
    neg = fit_alpha_beta(xs, np.asarray([4e5, 3e5, 2e5, 1e5]))  # falling: not physical
    assert not neg["identifiable"] and "not physical" in neg["why"]


def test_record_names_the_cluster_level_fit_and_efficiency():
    h100 = load_preset("dgx-h100")
    # 8 GPUs on one host: intra-node, 360 of NVLink4's nominal 450 GB/s
    rec = cluster_record(h100, _sweep_cal("nccl", 8, 8, 20_000.0, 360.0), "NVIDIA H100")
    assert (rec["name"], rec["gpu"], rec["gpus_per_node"], rec["nodes"], rec["level"]) == \
        ("dgx-h100", "h100-sxm", 8, 1, "intra-node")
    assert rec["fit"]["alpha_us"] == pytest.approx(20.0, abs=1e-3)
    assert rec["fit"]["busbw_gbps"] == pytest.approx(360.0, rel=1e-4)
    assert rec["nominal_gbps"] == 450.0 and rec["efficiency"] == pytest.approx(0.8, abs=1e-4)
    assert rec["refines"] and "NVIDIA H100" in rec["measured"]
    assert rec["model_efficiency"] == 0.82  # LINK_EFF["nvlink4"]
    # one rank on each of 2 hosts: inter-node, against one 400 Gbit/s NIC = 50 GB/s
    two = h100.with_overrides(nodes=2)
    rec = cluster_record(two, _sweep_cal("nccl", 2, 1, 10_000.0, 45.0))
    assert rec["level"] == "inter-node" and rec["nominal_gbps"] == 50.0
    assert rec["efficiency"] == pytest.approx(0.9, abs=1e-4)
    # 8 ranks per host use the host's 8 NICs; a 1-NIC box's NIC is shared
    assert nominal_gbps(two, 1, 8) == 400.0
    assert nominal_gbps(load_preset("pcie-4gpu").with_overrides(nodes=2), 1, 4) == 25.0
    # gloo on a GPU cluster: recorded as host TCP, never refines
    rec = cluster_record(h100, _sweep_cal("gloo", 2, 2, 1e5, 0.5))
    assert not rec["refines"] and "loopback TCP" in rec["measured"] and "gloo" in rec["why"]


def test_a_run_that_does_not_fit_the_cluster_is_refused_before_measuring():
    pc = load_preset("pcie-4gpu")
    with pytest.raises(ConfigError, match="5 ranks on this host but the cluster has 4 GPUs"):
        check_calibrate_cluster(pc, local_ranks=5, world=5, backend="gloo", cuda_devices=0)
    with pytest.raises(ConfigError, match="8 ranks but the cluster has 4 GPUs"):
        check_calibrate_cluster(pc, local_ranks=4, world=8, backend="gloo", cuda_devices=0)
    with pytest.raises(ConfigError, match="2 hosts of 1 rank"):
        check_calibrate_cluster(pc, local_ranks=1, world=2, backend="gloo", cuda_devices=0)
    with pytest.raises(ConfigError, match="0 CUDA GPU.*--backend gloo"):
        check_calibrate_cluster(pc, local_ranks=2, world=2, backend="nccl", cuda_devices=0)
    check_calibrate_cluster(pc, local_ranks=4, world=4, backend="nccl", cuda_devices=4)
    check_calibrate_cluster(pc, local_ranks=2, world=2, backend="gloo", cuda_devices=0)


def test_refine_replaces_the_measured_levels_efficiency_only(tmp_path):
    h100 = load_preset("dgx-h100").with_overrides(nodes=2)
    cal = _sweep_cal("nccl", 8, 8, 20_000.0, 369.0)
    cal["cluster"] = cluster_record(h100, cal)
    r = refine(h100, read_calibration(_write(tmp_path / "c.json", cal)))
    assert r.cluster.intra_eff == pytest.approx(0.82, abs=1e-4) and r.cluster.net_eff is None
    assert r.keys == {"network.intra_bus_efficiency": pytest.approx(0.82, abs=1e-4)}
    assert r.lines[0].startswith("measured: intra-node efficiency 0.82")
    assert r.lines[1].startswith("assumed: inter-node efficiency 0.97")  # NET_EFF infiniband
    # measured across 2 hosts (1 rank each): the NIC's efficiency, NVLink keeps the model's
    inter = _sweep_cal("nccl", 2, 1, 10_000.0, 45.0)
    inter["cluster"] = cluster_record(h100, inter)
    r = refine(h100, read_calibration(_write(tmp_path / "i.json", inter)))
    assert r.cluster.net_eff == pytest.approx(0.9, abs=1e-4) and r.cluster.intra_eff is None
    assert list(r.keys) == ["network.inter_bus_efficiency"]
    assert r.lines[0].startswith("measured: inter-node efficiency 0.9 of the nominal 50 GB/s")
    assert r.lines[1].startswith("assumed: intra-node efficiency 0.82")
    # without a calibration: nothing changes
    assert refine(h100, None).cluster is h100
    # another cluster's calibration: refused, naming both
    other = load_preset("hgx-h200")
    with pytest.raises(ConfigError, match="measured on cluster 'dgx-h100'.*'hgx-h200'"):
        refine(other, read_calibration(tmp_path / "c.json"))
    # a malformed record is a format error
    bad = dict(cal, cluster={"name": "x", "level": "sideways"})
    with pytest.raises(TraceFormatError, match="calibration 'cluster'"):
        read_calibration(_write(tmp_path / "bad.json", bad))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("calcl")
    model = d / "tiny.toml"
    model.write_text("hidden = 1024\nffn = 4096\nheads = 16\nlayers = 8\nseq = 1024\n"
                     "vocab = 32000\n")
    h100 = d / "h100.toml"
    assert run(["cost", "cluster", "--preset", "dgx-h100", "-o", str(h100)]) == 0
    other = d / "ours.toml"
    other.write_text(h100.read_text().replace('name = "dgx-h100"', 'name = "ours"'))
    trace = d / "h100.retime"
    assert run(["synth", "--model-file", str(model), "--hardware", "h100-sxm", *LAYOUT,
                "-o", str(trace)]) == 0
    cal = _sweep_cal("nccl", 8, 8, 20_000.0, 360.0)  # 0.8 of 450, the model assumes 0.82
    cal["cluster"] = cluster_record(read_cluster(h100), cal)
    gloo = _sweep_cal("gloo", 2, 2, 1e5, 0.5)
    gloo["cluster"] = cluster_record(read_cluster(h100), gloo)
    return {"dir": d, "model": model, "h100": h100, "other": other, "trace": trace,
            "cal": _write(d / "nccl.json", cal), "gloo": _write(d / "gloo.json", gloo)}


def test_replay_uses_the_measured_efficiency_and_set_still_wins(files, capsys):
    r, cl = str(files["trace"]), str(files["h100"])
    plain = _json_run(["replay", r, "--cluster", cl], capsys)
    cal = _json_run(["replay", r, "--cluster", cl, "--calibration", str(files["cal"])], capsys)
    by_key = _json_run(["replay", r, "--cluster", cl, "--set",
                        "network.intra_bus_efficiency=0.8"], capsys)
    # the calibration's efficiency is exactly the key's; a lower one is a slower step
    assert cal["step_time_ns"]["replayed"] == by_key["step_time_ns"]["replayed"] > \
        plain["step_time_ns"]["replayed"]
    assert cal["cluster"]["keys"]["network.intra_bus_efficiency"] == pytest.approx(0.8, 1e-4)
    assert cal["cluster"]["calibration"]["level"] == "intra-node"
    assert cal["cluster"]["calibration"]["lines"][0].startswith("measured: intra-node")
    # --set wins for the same key: the model's 0.82 back, as without a calibration
    won = _json_run(["replay", r, "--cluster", cl, "--calibration", str(files["cal"]),
                     "--set", "network.intra_bus_efficiency=0.82"], capsys)
    ref = _json_run(["replay", r, "--cluster", cl, "--set",
                     "network.intra_bus_efficiency=0.82"], capsys)
    assert won["step_time_ns"]["replayed"] == ref["step_time_ns"]["replayed"]
    assert won["cluster"]["overridden"] == ["network.intra_bus_efficiency"]
    assert any("from your --scenario / --set" in x
               for x in won["cluster"]["calibration"]["lines"])
    # so does network.bus_efficiency, which sets every level
    be = _json_run(["replay", r, "--cluster", cl, "--calibration", str(files["cal"]),
                    "--set", "network.bus_efficiency=0.5"], capsys)
    ref = _json_run(["replay", r, "--cluster", cl, "--set", "network.bus_efficiency=0.5"],
                    capsys)
    assert be["step_time_ns"]["replayed"] == ref["step_time_ns"]["replayed"]
    assert "network.intra_bus_efficiency" not in be["cluster"]["keys"]
    # a gloo calibration refines nothing, and says so
    gl = _json_run(["replay", r, "--cluster", cl, "--calibration", str(files["gloo"])], capsys)
    assert gl["step_time_ns"]["replayed"] == plain["step_time_ns"]["replayed"]
    assert gl["cluster"]["calibration"]["lines"][0].startswith("assumed: intra-node "
                                                               "efficiency 0.82")
    # human text: the measured: line
    capsys.readouterr()
    assert run(["replay", r, "--cluster", cl, "--calibration", str(files["cal"])]) == 0
    got = capsys.readouterr()
    assert "  measured: intra-node efficiency 0.8 of the nominal 450 GB/s" in got.out + got.err
    # another cluster's calibration: one line, exit 2
    _fails(["replay", r, "--cluster", str(files["other"]), "--calibration", str(files["cal"])],
           capsys, "measured on cluster 'dgx-h100'", "not on --cluster")


def test_sweep_rows_carry_the_measured_efficiency(files, capsys):
    d = files["dir"]
    grid = d / "grid.toml"
    grid.write_text('[grid]\n"overlap.mode" = ["serial"]\n')
    out = d / "s.parquet"
    s = _json_run(["sweep", str(files["trace"]), "--grid", str(grid), "--cluster",
                   str(files["h100"]), "--calibration", str(files["cal"]), "-o", str(out),
                   "--workers", "1"], capsys)
    assert s["failed"] == 0 and s["cluster"]["calibration"]["level"] == "intra-node"
    df = pd.read_parquet(out)
    assert df["network.intra_bus_efficiency"].tolist() == [pytest.approx(0.8, abs=1e-4)]
    ref = _json_run(["replay", str(files["trace"]), "--cluster", str(files["h100"]),
                     "--calibration", str(files["cal"]), "--set", "overlap.mode=serial"],
                    capsys)
    assert int(df["step_time_ns"].iloc[0]) == ref["step_time_ns"]["replayed"]
    _fails(["sweep", str(files["trace"]), "--grid", str(grid), "--cluster",
            str(files["other"]), "--calibration", str(files["cal"]), "-o", str(d / "n.parquet")],
           capsys, "measured on cluster 'dgx-h100'")
    assert not (d / "n.parquet").exists()


def test_cost_collective_prices_with_the_measured_efficiency(files, capsys):
    argv = ["cost", "collective", "all_reduce", "--cluster", str(files["h100"]), "--algo",
            "ring", "--proto", "Simple", "--sizes", "4G"]
    model = _json_run(argv, capsys)
    cal = _json_run([*argv, "--calibration", str(files["cal"])], capsys)
    # ring bus bandwidth is the intra-node rate x efficiency: 0.8 / 0.82 of the model's
    ratio = cal["rows"][0]["busbw_gbps"] / model["rows"][0]["busbw_gbps"]
    assert ratio == pytest.approx(0.8 / 0.82, rel=0.01)
    assert cal["measured"][0].startswith("intra-node efficiency 0.8 ")
    assert model["measured"] == []
    _fails([*argv[:3], "--cluster", str(files["other"]), "--calibration", str(files["cal"])],
           capsys, "measured on cluster 'dgx-h100'")


def test_synth_on_a_calibrated_cluster_prices_as_the_cluster_stating_it(files, capsys):
    d, cl = files["dir"], str(files["h100"])
    base = ["synth", "--model-file", str(files["model"]), *LAYOUT, "--cluster", cl]
    plain = _json_run([*base, "-o", str(d / "plain.retime")], capsys)
    cal = _json_run([*base, "--calibration", str(files["cal"]), "-o", str(d / "cal.retime")],
                    capsys)
    # 0.8 of NVLink4 measured where the model assumes 0.82: the TP collectives take longer
    assert cal["step_time_ns"] > plain["step_time_ns"]
    assert cal["cluster"]["calibration"]["level"] == "intra-node"
    assert cal["cluster"]["calibration"]["lines"][0].startswith(
        "measured: intra-node efficiency 0.8 of the nominal 450 GB/s")
    # one source of truth: the same cluster file stating that efficiency gives the same run
    eff = read_calibration(files["cal"])["cluster"]["efficiency"]
    stated = d / "stated.toml"
    stated.write_text(files["h100"].read_text().replace(
        "[network]", f"efficiency = {eff!r}\n\n[network]", 1))
    assert read_cluster(stated).intra_eff == eff
    by_file = _json_run(["synth", "--model-file", str(files["model"]), *LAYOUT, "--cluster",
                         str(stated), "-o", str(d / "stated.retime")], capsys)
    assert by_file["step_time_ns"] == cal["step_time_ns"]
    # and replay refines the same way: the run re-timed onto the calibrated cluster is the
    # run synthesized on it (the keys of `replay --cluster F --calibration C`)
    rep = _json_run(["replay", str(files["trace"]), "--cluster", cl, "--calibration",
                     str(files["cal"])], capsys)
    on = _json_run(["replay", str(d / "cal.retime")], capsys)
    assert on["step_time_ns"]["replayed"] == rep["step_time_ns"]["replayed"]
    # a gloo calibration refines nothing and says so
    gl = _json_run([*base, "--calibration", str(files["gloo"]), "-o", str(d / "gl.retime")],
                   capsys)
    assert gl["step_time_ns"] == plain["step_time_ns"]
    assert gl["cluster"]["calibration"]["lines"][0].startswith("assumed: intra-node")
    # bad input: one line, exit 2, nothing written
    never = str(d / "never.retime")
    _fails(["synth", "--model-file", str(files["model"]), *LAYOUT, "--hardware", "h100-sxm",
            "--calibration", str(files["cal"]), "-o", never], capsys,
           "--calibration needs --cluster")
    _fails(["synth", "--model-file", str(files["model"]), *LAYOUT, "--cluster",
            str(files["other"]), "--calibration", str(files["cal"]), "-o", never], capsys,
           "measured on cluster 'dgx-h100'", "not on --cluster")
    assert not Path(never).exists()


# An nccl-tests all_reduce_perf table (8 x A100-SXM4-80GB on one NVSwitch host, out-of-place
# columns; the busbw column is the shape of REFERENCES.md C1's published series), written by
# hand: what an NCCL calibration's sweep times on such a host.
NCCL_TABLE = """
#       size         count      type   redop    root     time   algbw   busbw  #wrong
     1048576       262144     float     sum      -1      50.7   20.70   36.22       0
     2097152       524288     float     sum      -1      68.5   30.59   53.54       0
     4194304      1048576     float     sum      -1     102.8   40.82   71.43       0
     8388608      2097152     float     sum      -1     163.1   51.42   89.99       0
    16777216      4194304     float     sum      -1     268.8   62.41  109.22       0
    33554432      8388608     float     sum      -1     442.3   75.87  132.77       0
    67108864     16777216     float     sum      -1     704.8   95.22  166.63       0
   134217728     33554432     float     sum      -1    1348.5   99.53  174.18       0
   268435456     67108864     float     sum      -1    2196.5  122.21  213.87       0
   536870912    134217728     float     sum      -1    4240.1  126.62  221.58       0
  1073741824    268435456     float     sum      -1    8237.8  130.34  228.10       0
"""


def _nccl_ranks(table: str, world: int = 8, reps: int = 5) -> tuple[list[int], list[dict]]:
    """Every rank's record as :func:`measure` gathers it on an NCCL run of the table's sizes:
    the slowest rank at the table's time, the others up to 3% earlier, repetitions within
    +-1% (a fixed seed)."""
    rng = np.random.default_rng(7)
    rows = [ln.split() for ln in table.strip().splitlines() if not ln.startswith("#")]
    sizes = [int(r[0]) for r in rows]
    times_ns = [float(r[5]) * 1e3 for r in rows]
    ranks = []
    for k in range(world):
        lag = 1.0 if k == world - 1 else 1.0 - 0.03 * rng.random()
        ranks.append({"rank": k, "host": "dgx0", "all_reduce": [
            {"bytes": b, "ns": [int(t * lag * (1 + 0.01 * (rng.random() - 0.5)))
                                for _ in range(reps)]} for b, t in zip(sizes, times_ns,
                                                                       strict=True)]})
    return sizes, ranks


def test_an_nccl_sweep_is_assembled_fitted_and_refines_the_cluster(tmp_path, capsys):
    """The NCCL path of `retime calibrate` short of the GPUs: the records every rank gathers,
    the file, the fit and the refinement, on an nccl-tests-shaped sweep (latency at 1 MB, the
    pipeline ramp to hundreds of MB, NVLink3's plateau at 1 GB)."""
    from retime.collectors.calibrate import assemble

    sizes, ranks = _nccl_ranks(NCCL_TABLE)
    cal = assemble(ranks, sizes, "nccl", "2.x+cu12")
    assert (cal["backend"], cal["world_size"], cal["ranks_per_host"]) == ("nccl", 8, 8)
    assert [r["bytes"] for r in cal["collectives"]["all_reduce"]] == sizes
    assert all(len(r["ns_by_rank"]) == 8 and len(r["ns_by_rank"][0]) == 5
               for r in cal["collectives"]["all_reduce"])
    assert "overlap_probe" not in cal  # NCCL runs no CPU overlap probe
    a100 = tmp_path / "a100.toml"
    assert run(["cost", "cluster", "--preset", "dgx-a100", "-o", str(a100)]) == 0
    cal["cluster"] = cluster_record(read_cluster(a100), cal, "NVIDIA A100-SXM4-80GB")
    rec = read_calibration(_write(tmp_path / "nccl.json", cal))["cluster"]
    assert rec["level"] == "intra-node" and rec["refines"] and rec["nominal_gbps"] == 300.0
    assert "nccl all_reduce on 8 GPU rank(s) (NVIDIA A100-SXM4-80GB)" in rec["measured"]
    fit = rec["fit"]
    # the line through the slowest rank's medians: bandwidth near the 1 GB plateau (the
    # large sizes dominate a least-squares line); the pipeline ramp's fill lands in the
    # latency term, which is so ~140 us, not NCCL's few tens
    assert fit["identifiable"] and fit["points"] == 11
    assert 225.0 < fit["busbw_gbps"] < 236.0
    assert 100.0 < fit["alpha_us"] < 200.0
    assert rec["efficiency"] == pytest.approx(fit["busbw_gbps"] / 300.0, rel=1e-4)
    # refined, the cost layer's ring at 1 GB lands on the table's busbw (the model's own
    # NVLink3 efficiency is 0.78: it was fitted on C1's plateau, so both agree)
    argv = ["cost", "collective", "all_reduce", "--cluster", str(a100), "--algo", "ring",
            "--sizes", "1G"]
    got = _json_run([*argv, "--calibration", str(tmp_path / "nccl.json")], capsys)
    assert got["rows"][0]["busbw_gbps"] == pytest.approx(228.10, rel=0.05)
    assert got["measured"][0].startswith(f"intra-node efficiency {rec['efficiency']:.3g}")
    # a sweep whose sizes cannot tell latency from bandwidth is recorded as such
    few, fr = _nccl_ranks("\n".join(NCCL_TABLE.strip().splitlines()[:3]))
    short = assemble(fr, few, "nccl", "2.x+cu12")
    srec = cluster_record(read_cluster(a100), short)
    assert not srec["fit"]["identifiable"] and "fewer than 3 sizes" in srec["fit"]["why"]


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="needs torch (retime[torch])")
def test_calibrate_cluster_checks_then_records_a_real_gloo_run(tmp_path):
    pc = tmp_path / "pc.toml"
    assert run(["cost", "cluster", "--preset", "pcie-4gpu", "-o", str(pc)]) == 0
    out = tmp_path / "cal.json"
    base = [sys.executable, "-m", "retime", "calibrate", "--cluster", str(pc), "--sizes",
            "64K:256K", "--reps", "2", "--no-probe", "-o", str(out), "--json"]
    # more local ranks than the cluster's GPUs per node: one line, exit 2, nothing written
    p = subprocess.run([*base, "-n", "5"], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert p.returncode == 2 and "4 GPUs per node" in _one_json(p.stdout)["error"]
    assert not out.exists()
    import torch

    if not torch.cuda.is_available():
        p = subprocess.run([*base, "--backend", "nccl"], capture_output=True, text=True,
                           timeout=300, cwd=ROOT)
        assert p.returncode == 2 and "0 CUDA GPU" in _one_json(p.stdout)["error"]
        assert not out.exists()
    p = subprocess.run([*base, "-n", "2"], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    s = _one_json(p.stdout)
    cal = read_calibration(out)
    rec = cal["cluster"]
    assert s["cluster"] == rec
    assert (rec["name"], rec["source"], rec["gpu"], rec["gpus_per_node"], rec["nodes"],
            rec["level"]) == ("pcie-4gpu", str(pc), "h100-pcie", 4, 1, "intra-node")
    assert rec["nominal_gbps"] == 64.0 and not rec["refines"] and "gloo" in rec["measured"]
    # the fit is the sweep's own: recomputed here from the file's times
    f = 2.0 * (2 - 1) / 2
    xs = np.asarray([r["bytes"] * f for r in cal["collectives"]["all_reduce"]])
    ys = np.asarray([np.median(np.max(np.asarray(r["ns_by_rank"], float), axis=0))
                     for r in cal["collectives"]["all_reduce"]])
    assert rec["fit"]["busbw_gbps"] == pytest.approx(fit_alpha_beta(xs, ys)["busbw_gbps"],
                                                     rel=1e-3)
    assert rec["efficiency"] == pytest.approx(rec["fit"]["busbw_gbps"] / 64.0, rel=1e-3)


def test_measured_gpu_trace_keeps_the_nccl_model_with_a_levels_efficiency(dlrm_trace):
    """A measured NCCL trace on a cluster stays on the NCCL model with a calibration's
    efficiency: the model's own value gives the model's step, a lower one a slower step."""
    from retime.collectors.costs.nccl_params import LINK_EFF
    from retime.replay import whatif
    from retime.replay.policies.scenario import cluster_keys

    keys = cluster_keys(load_preset("dgx-a100"), dlrm_trace).keys
    base = whatif(dlrm_trace, keys)
    same = whatif(dlrm_trace, {**keys,
                               "network.intra_bus_efficiency": LINK_EFF["nvlink3"].value})
    slow = whatif(dlrm_trace, {**keys, "network.intra_bus_efficiency": 0.05})
    step = [r.summary()["step_time_ns"]["replayed"] for r in (base, same, slow)]
    assert step[0] == step[1] <= step[2]  # its all-reduces hide behind compute
    nets = [p for p in slow.meta["scenario"] if p.get("policy") == "network"]
    assert nets and nets[0].get("model") == "nccl"
    lv = [r.meta["whatif"]["nccl_network"]["levels"]["intra-node"] for r in (base, same, slow)]
    assert lv[0]["model_busbw_new_gbps"] == lv[1]["model_busbw_new_gbps"]
    # the new link's model bus bandwidth at the same message size: 0.05 / 0.78 of the model's
    # where the protocol's cap does not bind (LL's cap sets the model's at 1.58 MB)
    assert lv[2]["model_busbw_new_gbps"] < 0.2 * lv[0]["model_busbw_new_gbps"]
    assert lv[2]["model_busbw_gbps"] == lv[0]["model_busbw_gbps"]  # the trace's own link
