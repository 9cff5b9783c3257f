"""CLI: ``retime cost`` (the cost layer's front door): ``cluster`` writes a cluster
description, ``collective NAME`` predicts an nccl-tests table, ``op KIND`` prices one kernel
(``retime/cmd_cost_op.py``). Every number comes from :mod:`retime.collectors.costs`, the
functions the synthesizer and the replay what-ifs call."""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from retime.cli import FORCE_HELP, app, check_output, emit_json, say
from retime.collectors.errors import ConfigError

cost_app = typer.Typer(
    name="cost", no_args_is_help=True, add_completion=False, rich_markup_mode=None,
    help="Ask the cost model directly: a cluster description (cluster), the time of one "
         "collective per message size on a described cluster (collective), or one kernel "
         "from its shape (op). Rates you pass are nominal (datasheet) and per direction; the "
         "model applies the efficiencies and says where each came from.")
app.add_typer(cost_app, name="cost")


class Intra(str, Enum):
    nvswitch = "nvswitch"
    pcie = "pcie"
    xgmi = "xgmi"


class NetFabric(str, Enum):
    infiniband = "infiniband"
    roce = "roce"
    efa = "efa"
    slingshot = "slingshot"


# Options shared by the subcommands that take a cluster (typer has no option groups).
PresetOpt = Annotated[str | None, typer.Option(
    "--preset", help="Built-in cluster: dgx-a100, dgx-h100, hgx-h200, dgx-b200, dgx-b300, "
    "gb200-nvl72, gb300-nvl72, gb200-nvl36 (racks: 4 GPUs per tray, one NVLink domain), "
    "mi300x-8x, mi325x-8x, mi355x-8x, pcie-4gpu, pcie-8gpu (default dgx-h100).")]
ClusterOpt = Annotated[Path | None, typer.Option(
    "--cluster", exists=True, dir_okay=False,
    help="Cluster TOML (write one with `retime cost cluster --preset NAME -o FILE`).")]
GpuOpt = Annotated[str | None, typer.Option(
    "--gpu", help="GPU profile: v100-sxm2, a100-40gb, a100-80gb, h100-sxm, h100-pcie, h200, "
    "b200, b300, gb200, gb300, mi250x, mi300x, mi325x, mi355x, or a hardware TOML path.")]
GpnOpt = Annotated[int | None, typer.Option(
    "--gpus-per-node", min=1, help="GPUs per node (at most the preset's).")]
NodesOpt = Annotated[int | None, typer.Option("--nodes", min=1, help="Number of nodes.")]
NicsOpt = Annotated[int | None, typer.Option("--nics-per-node", min=0,
                                             help="Network adapters per node.")]
NicGbitOpt = Annotated[float | None, typer.Option(
    "--nic-gbit", min=0.001, help="Line rate per NIC in Gbit/s per direction (e.g. 400).")]
IntraOpt = Annotated[Intra | None, typer.Option(
    "--intra", help="Intra-node fabric; its generation and rate follow the GPU.")]
IntraGbpsOpt = Annotated[float | None, typer.Option(
    "--intra-gbps", min=0.001, help="Intra-node rate in GB/s per GPU per direction (nominal).")]
FabricOpt = Annotated[NetFabric | None, typer.Option("--fabric", help="Network fabric kind.")]
NvlsOpt = Annotated[bool | None, typer.Option(
    "--nvls/--no-nvls", help="NVLink SHARP (in-switch reduction) available.")]
SharpOpt = Annotated[bool | None, typer.Option(
    "--sharp/--no-sharp", help="SHARP in-network reduction on the InfiniBand switches.")]
DomainOpt = Annotated[int | None, typer.Option(
    "--nvlink-domain", min=1, help="GPUs in one NVLink domain (72 on a GB200 NVL72 rack; "
    "collectives inside it run on NVLink, across domains on the network; it must divide the "
    "cluster's GPUs, e.g. 64 for 16 of a rack's 18 trays).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


def build_cluster(preset, cluster, gpu, gpus_per_node, nodes, nics_per_node, nic_gbit, intra,
                  intra_gbps, fabric, nvls, sharp, nvlink_domain):
    """The command's cluster: the file or preset, then the flags, validated as a whole."""
    from retime.collectors.costs import resolve_cluster

    base = resolve_cluster(preset, cluster)
    return base.with_overrides(
        gpu=gpu, gpus_per_node=gpus_per_node, nodes=nodes, nics_per_node=nics_per_node,
        nic_gbit=nic_gbit, intra_fabric=intra.value if intra else None, intra_gbps=intra_gbps,
        net_fabric=fabric.value if fabric else None, nvls=nvls, sharp=sharp,
        nvlink_domain=nvlink_domain)


_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20,
          "MIB": 2**20, "G": 2**30, "GB": 2**30, "GIB": 2**30, "T": 2**40, "TB": 2**40}


def parse_size(text: str) -> int:
    """``4096``, ``64K``, ``1M``, ``1.5G`` (K/M/G/T are powers of 1024, as nccl-tests' -b/-e)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ConfigError(f"--sizes: cannot read {text!r} as a size; write bytes or a number "
                          "with K, M, G or T (powers of 1024), e.g. 1M:1G or 8M,64M,1G")
    v = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if v < 1:
        raise ConfigError(f"--sizes: {text!r} is below one byte")
    return int(v)


def parse_sizes(text: str) -> list[int]:
    """``A:B`` (A, 2A, 4A, ... up to B), ``A:B:F`` (factor F) or a list ``A,B,C``."""
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ConfigError(f"--sizes {text!r}: write FROM:TO or FROM:TO:FACTOR, e.g. 1M:1G")
        lo, hi = parse_size(parts[0]), parse_size(parts[1])
        f = 2.0
        if len(parts) == 3:
            try:
                f = float(parts[2])
            except ValueError:
                raise ConfigError(f"--sizes {text!r}: factor {parts[2]!r} is not a number") \
                    from None
        if hi < lo or f <= 1:
            raise ConfigError(f"--sizes {text!r}: need FROM <= TO and FACTOR > 1")
        out, v = [], float(lo)
        while v <= hi * (1 + 1e-9) and len(out) < 200:
            out.append(int(round(v)))
            v *= f
        return out
    sizes = [parse_size(t) for t in text.split(",") if t.strip()]
    if not sizes:
        raise ConfigError(f"--sizes {text!r}: no size given")
    return sizes


@cost_app.command("cluster")
def cluster_cmd(
    preset: PresetOpt = None, cluster: ClusterOpt = None, gpu: GpuOpt = None,
    gpus_per_node: GpnOpt = None, nodes: NodesOpt = None, nics_per_node: NicsOpt = None,
    nic_gbit: NicGbitOpt = None, intra: IntraOpt = None, intra_gbps: IntraGbpsOpt = None,
    fabric: FabricOpt = None, nvls: NvlsOpt = None, sharp: SharpOpt = None,
    nvlink_domain: DomainOpt = None,
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", dir_okay=False, help="Write the TOML here instead of stdout.")] = None,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    json_out: JsonOpt = False,
) -> None:
    """Write a cluster description (documented TOML) from a preset or file plus flags:
    `retime cost cluster --preset dgx-h100 --nodes 4 > ours.toml`, edit it, then pass
    `--cluster ours.toml` to `retime cost collective` / `op`."""
    from retime.collectors.costs import format_cluster

    c = build_cluster(preset, cluster, gpu, gpus_per_node, nodes, nics_per_node, nic_gbit,
                      intra, intra_gbps, fabric, nvls, sharp, nvlink_domain)
    text = format_cluster(c)
    if output is not None:
        check_output(output, force)
        from retime.collectors.fsutil import atomic_output

        with atomic_output(output) as tmp:  # creates missing parent folders, as every -o does
            tmp.write_text(text)
    if json_out:
        emit_json({"cluster": c.to_dict(), "world_size": c.world_size,
                   "output": None if output is None else str(output)})
    elif output is None:
        typer.echo(text, nl=False)
    else:
        say(f"wrote {output} ({c.name}: {c.world_size} GPUs)")


# The choices as the CLI offers them: copies of collectors.costs.nccl's Collective, Algo and
# Proto, because importing that module pulls numpy and pandas into every `retime` start-up
# (tests/test_cost_cli.py keeps the copies equal to the originals).
class CollectiveName(str, Enum):
    all_reduce = "all_reduce"
    all_gather = "all_gather"
    reduce_scatter = "reduce_scatter"
    alltoall = "alltoall"
    broadcast = "broadcast"
    sendrecv = "sendrecv"


class AlgoName(str, Enum):
    ring = "ring"
    tree = "tree"
    nvls = "nvls"
    nvls_tree = "nvls_tree"
    collnet = "collnet"


class ProtoName(str, Enum):
    LL = "LL"
    LL128 = "LL128"
    Simple = "Simple"


def _normalize_collective(name: str) -> str:
    n = name.strip().lower().replace("-", "_").replace("/", "")
    n = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter":
         "reduce_scatter", "all_to_all": "alltoall", "send_recv": "sendrecv", "p2p": "sendrecv"
         }.get(n, n)
    if n not in CollectiveName.__members__:
        raise ConfigError(f"unknown collective {name!r}; choose one of "
                          f"{', '.join(CollectiveName.__members__)}")
    return n


def _assumed_lines(c, rows, coll: str) -> list[str]:
    from retime.collectors.costs import nccl_params as P
    from retime.collectors.costs.nccl import efficiencies, nvls_eff

    ip, npar = efficiencies(c)
    out = [f"{c.name}: {c.world_size} GPUs = {c.gpus_per_node} per node x {c.nodes} node(s), "
           f"{c.gpu}; intra {c.intra_fabric}/{c.intra_generation} {c.intra_gbps:g} GB/s per "
           f"GPU per direction (nominal) x {ip.value} ({ip.source}: {ip.ref})"]
    doms = -(-c.world_size // c.nvlink_domain)
    if c.nvlink_domain > c.gpus_per_node or doms > 1:
        out.append(f"ranks grouped by NVLink domain ({c.nvlink_domain} GPUs), not by node: "
                   f"{doms} domain(s); inside one the collective never touches a NIC, across "
                   "domains rings / trees leave each on its NICs (two channels per NIC, one "
                   "below 25 GB/s per NIC; NVLS-tree: one NIC per NVLS head, at most 32 heads, "
                   "S per direction on 2 domains, 2S on more; REFERENCES.md C16, C17, C25, "
                   "C30, C32)")
    if c.nodes > 1 and doms > 1:
        out.append(f"network {c.net_fabric}: {c.nics_per_node} x {c.nic_gbit:g} Gbit/s per node "
                   f"x {npar.value} ({npar.source}: {npar.ref})")
    if any(r["algorithm"] in ("nvls", "nvls_tree") for r in rows):
        ne = nvls_eff(c)
        ref = P.NVLS_REF_RANKS.get(c.intra_generation, P.NVLS_REF_RANKS["nvlink4"])
        out.append(f"NVLS algorithm bandwidth {ne.value} x nominal {c.intra_generation} rate "
                   f"on {ref} GPUs ({ne.source}: {ne.ref}), x k/(k+1) for k GPUs in the "
                   f"domain; NVLS latency + {P.NVLS_HEAD_US.value:g} us per GPU of the domain "
                   f"beyond {P.NVLS_REF_HEADS} ({P.NVLS_HEAD_US.source}: {P.NVLS_HEAD_US.ref}; "
                   "REFERENCES.md C21); NVLS inside one NVLink domain, also one spanning trays "
                   "(MNNVL)"
                   + ("; all-gather / reduce-scatter NVLS (one NVLink domain only) moves S one "
                      "way at that link rate: x (k+1)/k of the all-reduce's (REFERENCES.md C39)"
                      if coll in ("all_gather", "reduce_scatter") else ""))
    ll128 = (f"; a ring LL128 inside one NVLink domain pays LL's base, "
             f"{P.LL128_WALL_BASE_US.value:g} us, not the table's "
             f"{P.BASE_LAT_US['ring'][1]:g} (which still ranks; REFERENCES.md C22)"
             if doms == 1 and any(r["algorithm"] == "ring" and r["protocol"] == "LL128"
                                  for r in rows) else "")
    out.append("latency: NCCL's tuning tables (base + hops x per-hop latency; REFERENCES.md C0"
               f"{ll128}) + {P.CALL_US.value:g} us per call (assumed); pipeline fill: one pass "
               "of the soft minimum of the message and "
               f"{P.CHUNK_BYTES.value / 1024:g} KiB per channel in flight (fitted)"
               + ("; a ring leaving its NVLink domain pays its NVLink hops' share of that pass "
                  "at the NVLink rate" if doms > 1 else ""))
    out.append("algorithm/protocol: the least tuner time, as NCCL picks without NCCL_ALGO / "
               "NCCL_PROTO; range: published +-5%, fitted +-10%, assumed +-25% per parameter")
    if coll in ("alltoall", "sendrecv"):
        out.append(f"point-to-point at {P.P2P_EFF.value} of the ring rate ({P.P2P_EFF.source}: "
                   f"{P.P2P_EFF.ref}); off-node peers through each GPU's own NIC share")
        if any(r["protocol"] == "LL" for r in rows):
            out.append("point-to-point LL where every peer is over NVLink and a peer's message "
                       "is at most p2pnChannelsPerPeer x "
                       f"{P.P2P_LL_THRESHOLD.value / 1024:g} KiB (512 KiB with 32 channels per "
                       "peer): the channels busy x half a ring LL channel's rate (NCCL 2.27 "
                       "enqueue.cc and init; REFERENCES.md C24)")
    return out


@cost_app.command("collective")
def collective_cmd(
    name: Annotated[str, typer.Argument(
        help="all_reduce, all_gather, reduce_scatter, alltoall, broadcast or sendrecv.")],
    preset: PresetOpt = None, cluster: ClusterOpt = None, gpu: GpuOpt = None,
    gpus_per_node: GpnOpt = None, nodes: NodesOpt = None, nics_per_node: NicsOpt = None,
    nic_gbit: NicGbitOpt = None, intra: IntraOpt = None, intra_gbps: IntraGbpsOpt = None,
    fabric: FabricOpt = None, nvls: NvlsOpt = None, sharp: SharpOpt = None,
    nvlink_domain: DomainOpt = None,
    sizes: Annotated[str, typer.Option(
        "--sizes", help="Message sizes in bytes as nccl-tests counts them (all_reduce and "
        "broadcast: the buffer; all_gather / reduce_scatter: the full gathered buffer; "
        "alltoall: each rank's send buffer; sendrecv: the message): FROM:TO (doubling), "
        "FROM:TO:FACTOR or a list A,B,C; K/M/G/T are powers of 1024.")] = "1M:1G",
    dtype: Annotated[str, typer.Option(
        "--dtype", help="Element type for the count column: fp32, bf16, fp16, fp8, ...")] = "fp32",
    algo: Annotated[AlgoName | None, typer.Option(
        "--algo", help="Force the algorithm, as NCCL_ALGO does.")] = None,
    proto: Annotated[ProtoName | None, typer.Option(
        "--proto", help="Force the protocol, as NCCL_PROTO does.")] = None,
    channels: Annotated[int | None, typer.Option(
        "--channels", min=1, help="Channels NCCL runs with (one CTA, i.e. one SM, each), as "
        "NCCL_MIN_NCHANNELS = NCCL_MAX_NCHANNELS force it, or as a trace measured it (its NCCL "
        "kernels' launch grid, what `retime replay` uses); default: the model's table.")] = None,
    plot: Annotated[Path | None, typer.Option(
        "--plot", dir_okay=False, help="Write bus bandwidth vs size (log x, range band) to a "
        ".png or .html file.")] = None,
    calibration: Annotated[Path | None, typer.Option(
        "--calibration", exists=True, dir_okay=False,
        help="A calibration file from `retime calibrate --cluster F` measured on this "
             "cluster (same name, else exit 2): its measured efficiency replaces the model's "
             "for the level it measured (nccl calibrations only; gloo ones are reported).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    json_out: JsonOpt = False,
) -> None:
    """Predict nccl-tests' table for one collective on a described cluster: per size the time
    (us), algbw and busbw (GB/s), the algorithm and protocol NCCL's tuner would pick, the
    channels and a range (us), then `assumed:` lines saying where each figure came from."""
    from retime.collectors.costs import collective_cost
    from retime.collectors.costs.gpus import DTYPE_BYTES

    coll = _normalize_collective(name)
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPE_BYTES)}")
    size_list = parse_sizes(sizes)
    c = build_cluster(preset, cluster, gpu, gpus_per_node, nodes, nics_per_node, nic_gbit,
                      intra, intra_gbps, fabric, nvls, sharp, nvlink_domain)
    refined: tuple[str, ...] = ()
    if calibration is not None:
        from retime.collectors.calibrate import read_calibration
        from retime.replay.policies.cluster_cal import refine

        ref = refine(c, read_calibration(calibration))
        c, refined = ref.cluster, ref.lines
    if plot is not None:
        if plot.suffix.lower() not in (".png", ".html"):
            raise ConfigError(f"--plot {plot}: write a .png or .html file")
        check_output(plot, force)
    costs = [collective_cost(c, coll, s, algo=algo.value if algo else None,
                             proto=proto.value if proto else None, channels=channels)
             for s in size_list]
    rows = [x.to_row() for x in costs]
    assumed = _assumed_lines(c, rows, coll)
    measured = [x.split(": ", 1)[1] for x in refined if x.startswith("measured:")]
    assumed += [x.split(": ", 1)[1] for x in refined if x.startswith("assumed:")]
    if channels:
        assumed.append(f"{channels} channels as stated (--channels), in place of the model's "
                       "table")
    if plot is not None:
        _write_plot(plot, costs, f"{coll} on {c.name}: {costs[0].ranks} ranks")
    if json_out:
        emit_json({"collective": coll, "cluster": c.to_dict(), "ranks": costs[0].ranks,
                   "dtype": dtype, "rows": rows, "assumed": assumed, "measured": measured,
                   "plot": None if plot is None else str(plot)})
        return
    eb = DTYPE_BYTES[dtype]
    say(f"# retime cost collective {coll}: {c.name}, {costs[0].ranks} ranks "
        f"({c.gpus_per_node} per node x {c.nodes} node(s)), {c.gpu}")
    say(f"# {'size':>12} {'count':>12} {'type':>5} {'time':>10} {'algbw':>8} {'busbw':>8} "
        f"{'algo':>9} {'proto':>6} {'ch':>3}  range")
    say(f"# {'(B)':>12} {'(elements)':>12} {'':>5} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} "
        f"{'':>9} {'':>6} {'':>3}  (us)")
    for r in rows:
        say(f"  {r['bytes']:>12} {int(r['bytes'] // eb):>12} {dtype:>5} {r['time_us']:>10.1f} "
            f"{r['algbw_gbps']:>8.2f} {r['busbw_gbps']:>8.2f} {r['algorithm']:>9} "
            f"{r['protocol']:>6} {r['channels']:>3}  {r['range_us'][0]:.1f}-"
            f"{r['range_us'][1]:.1f}")
    for line in measured:
        say(f"measured: {line}")
    for line in assumed:
        say(f"assumed: {line}")
    if plot is not None:
        say(f"wrote {plot}")


def _write_plot(path: Path, costs, title: str) -> None:
    import pandas as pd

    from retime.analysis.cost_plots import figure_to_html, plot_busbw

    df = pd.DataFrame({
        "bytes": [x.nbytes for x in costs], "busbw_gbps": [x.busbw_gbps for x in costs],
        "busbw_lo": [x.busbw_gbps * x.time_us / x.range_us[1] for x in costs],
        "busbw_hi": [x.busbw_gbps * x.time_us / x.range_us[0] for x in costs],
        "algorithm": [x.algorithm for x in costs], "protocol": [x.protocol for x in costs]})
    from retime.collectors.fsutil import atomic_output

    fig = plot_busbw(df, title=title)
    with atomic_output(path) as tmp:  # creates missing parent folders, as every -o does
        if path.suffix.lower() == ".html":
            tmp.write_text(figure_to_html(fig, title))
        else:
            fig.savefig(tmp, format=path.suffix.lower().lstrip("."))


from retime import cmd_cost_op  # noqa: E402,F401  op (registers on cost_app)
