"""CLI: ``retime calibrate`` (measure a cluster's collectives and compute/transfer overlap)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Annotated

import typer

from retime.cli import FORCE_HELP, app, check_output, emit_json, say
from retime.collectors.errors import RetimeError


@app.command("calibrate")
def calibrate_cmd(
    output: Annotated[Path, typer.Option("-o", "--output", dir_okay=False,
                                         help="The calibration file to write (JSON).")],
    nproc: Annotated[int, typer.Option("-n", "--nproc", min=2,
                                       help="Ranks to start on this host (ignored under "
                                            "torchrun, which starts them).")] = 2,
    sizes: Annotated[str, typer.Option("--sizes", help="All-reduce sizes in bytes: FIRST:LAST "
                                       "doubling (64K:16M) or a list (1M,4M,16M); K, M, G "
                                       "are powers of 1024.")] = "64K:16M",
    reps: Annotated[int, typer.Option("--reps", min=1, help="Timed repetitions per size "
                                      "(after one warm-up).")] = 5,
    backend: Annotated[str, typer.Option("--backend", help="gloo (CPU) or nccl (GPU; "
                                         "untested until run on a GPU machine).")] = "gloo",
    probe: Annotated[bool, typer.Option("--probe/--no-probe", help="Also time 1 and 4 MiB "
                                        "all-reduces next to a busy compute thread (gloo: how "
                                        "a transfer shares the CPU with training).")] = True,
    cluster: Annotated[Path | None, typer.Option(
        "--cluster", exists=True, dir_okay=False,
        help="The cluster TOML this run measures (`retime cost cluster --preset NAME -o "
             "F.toml`). Checked before measuring (ranks on this host <= its GPUs per node, "
             "ranks <= its GPUs, hosts <= its nodes; --backend nccl needs a CUDA GPU per "
             "local rank); the file then records the cluster, the level measured (intra-node: "
             "every rank on one host; inter-node otherwise), the sweep's latency (us) and bus "
             "bandwidth (GB/s) and the efficiency against the level's nominal rate, which "
             "`retime replay/sweep/cost collective --cluster F --calibration C` use instead "
             "of the model's (nccl only: gloo measures host TCP, recorded as such).")] = None,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Measure this cluster once, for what-ifs on its traces (`retime replay --calibration FILE`).

    Times one all-reduce per size on every rank (as nccl-tests does: after a barrier, the
    slowest rank counts), so latency and bandwidth can be told apart where a trace holds one
    gradient-bucket size; and, with gloo, how a transfer and a busy training thread share a
    rank's CPU (the all-reduce alone and next to matmuls). One host: `retime calibrate -n 2
    -o cal.json`. Several hosts: run it under torchrun on each, e.g. `torchrun --nnodes 2
    --nproc-per-node 1 --rdzv-endpoint HOST:PORT --no-python retime calibrate -o cal.json`
    (rank 0 writes the file). With `--cluster F.toml` the run is checked against the
    cluster first and the file records what it measured of it (`retime replay --cluster F
    --calibration cal.json` then uses the measured efficiency). Needs the torch extra
    (`pip install "retime[torch]"`).
    """
    from retime.collectors.calibrate import parse_sizes, run_distributed, run_local

    if backend not in ("gloo", "nccl"):
        raise RetimeError(f"--backend {backend!r}: use gloo (CPU) or nccl (GPU)")
    try:
        sz = parse_sizes(sizes)
    except ValueError as exc:
        raise RetimeError(f"--sizes: {exc}") from None
    if len(sz) < 3:
        raise RetimeError(f"--sizes {sizes!r} gives {len(sz)} size(s); give at least 3 spanning "
                          "2x or more, so latency and bandwidth can be told apart")
    if importlib.util.find_spec("torch") is None:
        raise RetimeError('retime calibrate needs PyTorch, which is not installed here; '
                          'install it with `pip install "retime[torch]"`')
    under_torchrun = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    rank0 = not under_torchrun or os.environ.get("RANK") == "0"
    cl, device = None, None
    if cluster is not None:
        from retime.collectors.costs import read_cluster
        from retime.replay.policies.cluster_cal import check_calibrate_cluster

        cl = read_cluster(cluster)
        world = int(os.environ["WORLD_SIZE"]) if under_torchrun else nproc
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if under_torchrun else nproc
        cuda = 0
        if backend == "nccl":
            import torch

            cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
            device = torch.cuda.get_device_name(0) if cuda else None
        check_calibrate_cluster(cl, local_ranks=local, world=world, backend=backend,
                                cuda_devices=cuda)
    if rank0:
        check_output(output, force)
    say(f"retime calibrate: {len(sz)} sizes {sz[0]}..{sz[-1]} B x {reps} reps on "
        f"{os.environ['WORLD_SIZE'] + ' ranks (torchrun)' if under_torchrun else str(nproc) + ' local ranks'}"
        f"{' + overlap probe' if probe and backend == 'gloo' else ''}", quiet=json_out)
    cal = run_distributed(sz, reps, probe, backend) if under_torchrun \
        else run_local(nproc, sz, reps, probe, backend)
    if cal is None:  # not rank 0 under torchrun
        return
    if cl is not None:
        from retime.replay.policies.cluster_cal import cluster_record

        cal["cluster"] = cluster_record(cl, cal, device)
    import json

    from retime.collectors.fsutil import atomic_output

    with atomic_output(output) as tmp:  # creates missing parent folders, as every -o does
        tmp.write_text(json.dumps(cal, indent=1) + "\n")
    rows = cal["collectives"]["all_reduce"]
    summary = {"output": str(output), "world_size": cal["world_size"],
               "ranks_per_host": cal["ranks_per_host"], "backend": cal["backend"],
               "sizes": [r["bytes"] for r in rows],
               "slowest_rank_median_ns": [
                   sorted(max(x[i] for x in r["ns_by_rank"]) for i in range(len(r["ns_by_rank"][0])))
                   [len(r["ns_by_rank"][0]) // 2] for r in rows],
               "overlap_probe": "overlap_probe" in cal}
    if "cluster" in cal:
        summary["cluster"] = cal["cluster"]
    if json_out:
        emit_json(summary)
        return
    for b, t in zip(summary["sizes"], summary["slowest_rank_median_ns"]):
        say(f"  all_reduce {b:>10} B: {t / 1e3:10.1f} us (slowest rank, median of {reps})")
    if "cluster" in cal:
        c = cal["cluster"]
        f = c["fit"]
        say(f"  cluster {c['name']} ({c['source']}), {c['level']}: {f['busbw_gbps']:.4g} GB/s "
            f"bus bandwidth, {f['alpha_us']:.3g} us latency"
            + ("" if f["identifiable"] else f" (not identifiable: {f['why']})")
            + f"; efficiency {c['efficiency']:.3g} of the nominal {c['nominal_gbps']:g} GB/s "
            f"({c['link']}; the model assumes {c['model_efficiency']:g})")
        say(f"  measured: {c['measured']}"
            + ("" if c["refines"] else "; recorded, does not refine the cluster"))
    say(f"wrote {output} ({cal['world_size']} ranks, {cal['ranks_per_host']} per host)")
