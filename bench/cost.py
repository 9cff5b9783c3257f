"""The cost layer against published measurements, row by row.

Run: ``python bench/cost.py [--json]`` (seconds). Data: ``bench/data/cost_published.toml``
(every series cited in ``collectors/costs/REFERENCES.md``).

Printed per series: each row's predicted and published value (collectives: nccl-tests bus
bandwidth in GB/s per message size; GEMMs: TFLOP/s per shape; same-shape GEMMs on two GPUs:
the op's time in us on each GPU and the speed-up between them), the error
``predicted / published - 1``, the row's role (``fit``: a parameter was set from it, shown
but never counted as the model's accuracy; ``judge``: no parameter came from it), and per
series the median and worst |error| over its judged rows (over its fit rows for a fit
series, marked as such). A judged series' ``fit_rows`` are rows a model change was chosen
on after they had been seen; they are printed as fit. Four are (issue 32): C18 16 MB, C9
16 MB and C3 8 MB, the rows at the old hard corner of the pipeline fill, which is a soft
minimum since (REFERENCES.md, "The pipeline fill's soft corner"); and C19's 64-GPU
all_reduce 1 MB row, which sets the NVLS per-head latency (REFERENCES.md C21; the NVLS
change was chosen after all of C19's rows had been seen). The ring LL128 base latency paid
inside one NVLink domain (LL's, REFERENCES.md C22) was chosen on the fit series C1 after C3's
and C19's judged LL128 rows had been seen, and kept off rings that cross a network after C18's
judged rows had been seen (which it leaves unchanged). Point-to-point LL up to 512 KiB per peer
inside one NVLink domain (REFERENCES.md C24: NCCL's rule and channel counts, the model's ring
LL rate; nothing fitted) was looked for because of C19's in-rack alltoall rows, all seen
before. C19's series read OCI's deployment from
``bench/data/oci-gb300-4.toml`` (a series' ``cluster`` key), not from preset overrides; every
figure is what the overrides gave. C25 (OCI's GB200 guide: 1 host to 3 racks, 4 / 8 GB rows,
all judged) reads ``bench/data/oci-gb200-4.toml``; two things were done **after its rows had
been seen**: its table printed under "2 Nodes on a Single Rack" is read as the 64 ranks its
own busbw / algbw ratio (2 x 63/64) says (found while looking at that row's miss as 8 GPUs),
and NVLS-tree now leaves each NVLink domain on one NIC per NVLS head (NCCL's NVLS graph:
``min(32, GPUs)`` heads; REFERENCES.md C25), looked for because of its 2-rack all_reduce rows
(-13.9 / -16.2% before; +8.2 / +5.5% after); it also moves C19's 2-rack all_reduce rows
(median 90.1% -> 121.1%) and C25's 3-rack ones (-7.6 / -10.3% -> +16.1 / +12.8%). C27 (GCP
A3 Mega, 2 x 8 H100 on GPUDirect-TCPXO) is a held-out series added after the last model change
and scored once (REFERENCES.md C27). C28 (an HGX B200 report: four collectives on 1 and 2
nodes) and C29 (2 x 8 H200, one row) are held-out series scored once before any change
(first scores in REFERENCES.md); the 2-node NVLS-tree network leg and fill (C30) were chosen
**after seeing** them and C27. C31 (2 x 8 A100 on 16 x 100 Gb/s RoCE, two 1 GB rows) was scored
once after that; one ring channel per NIC below 25 GB/s (C32) was chosen **after seeing** it.
C33 (one 8 x H100 node, four collectives), C34 (2 x 8 H200 RoCE all_gather) and C35 (2 x 8
B200 RoCE all_gather) are held-out series scored once after that; nothing changed on them.
NVLS all-gather / reduce-scatter inside one NVLink domain (REFERENCES.md C39, from NCCL's
source) was looked for **after seeing** C28's and C33's one-node rows (C33 reduce_scatter
median 17.4% -> 8.0%). C41 (CoreWeave GB200 NVL72 over 2 racks, 512 MB / 1 GB) is a held-out
series scored once after that (all_reduce, which C39 does not touch); nothing changed on it.
C42 (one 8 x H100 node, reduce_scatter with the ring forced, NVIDIA/nccl #1047) and C43 (GKE A4,
2 x 8 B200 RoCE all_gather, cluster-toolkit's expected output) likewise.
C44 / C45 (OCI's BM.GPU4.8 tutorial: one 8 x A100 node and 2 x 8 on RoCE, all_reduce) and C46
(Azure NDm A100 v4 at 1 GB: all_gather, all_reduce, alltoall on 1 x 8, 2 x 8, 2 x 1) are held-out
series scored once with the model of commit 947581f (helper N9), and C47 (OCI GB200 on 2 racks,
all_reduce, oci-hpc-oke's README) and C48 (p4dn on EFA, 1-4 instances, all_reduce 1 GB,
NVIDIA/nccl #527) and C49 (2 x p4d on EFA, all_reduce 1 MB - 1 GB, aws-efa-eks) and C50 (GKE A3 Mega:
one H100 node's all_reduce, 2 x 8 over TCPXO all_gather) likewise; nothing changed on them.
NCCL's own model corrections (REFERENCES.md C51: the tree all-reduce bandwidth table at medium
sizes, ring Simple latency x 1.4 across nodes) and Hopper's 24 collective channels (C52, an NCCL
log; was an assumed 32) came later (helper NC), **after every row here had been seen**; nothing
in them is fitted (C11, C33, C42, C45, C48, C49 and C31 / C46 moved; REFERENCES.md says how).
Last, the
hard rule: no matmul the
model prices (every shape of a grid from 256 to 65536 per dimension, and every published
shape above) exceeds the GPU's published maximum achievable matmul TFLOP/s for that dtype,
nor any published MAMF row of ``bench/data/kernel_published.toml`` (Stas Bekman's tables,
REFERENCES.md K1 / K28 / K30, for every built-in profile they cover); the exit status is 1
if one does. That file also holds K29's GEMM rows (cuBLAS on one H100, M = N = K = 2048 /
4096 judged, 8192 fit), added and scored once for issue 32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import tomllib

from retime.collectors.costs import collective_cost, load_preset
from retime.collectors.costs import kernels as K
from retime.collectors.costs.cluster import read_cluster
from retime.collectors.costs.gpus import gpu_names, gpu_spec

DATA = Path(__file__).with_name("data") / "cost_published.toml"
#: matmul rows added for issue 32 (K28-K30): published MAMF per GPU / dtype, cuBLAS sweeps
KDATA = DATA.with_name("kernel_published.toml")
_CLUSTER_KEYS = ("gpu", "nodes", "gpus_per_node", "nvlink_domain", "nics_per_node", "nic_gbit",
                 "nvls", "net_fabric")
#: the ceiling check's grid: powers of two and transformer-like sizes (hidden, FFN, TP shards)
_GRID = (256, 512, 1024, 1280, 2048, 3584, 4096, 7168, 8192, 12288, 16384, 28672, 32768,
         65536)


def load(path: Path = DATA) -> dict:
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def cluster_of(series: dict):
    """The series' cluster: a cluster file in ``bench/data`` (``cluster``, the deployment as
    its source describes it, written as a user would with ``retime cost cluster``) or a
    built-in ``preset``, then the series' own fields (nodes, GPUs per node, ...)."""
    c = read_cluster(DATA.with_name(series["cluster"])) if "cluster" in series \
        else load_preset(series["preset"])
    return c.with_overrides(**{k: series[k] for k in _CLUSTER_KEYS if k in series})


def collective_rows(series: dict) -> list[dict]:
    """Per row of a collective series: bytes, published and predicted bus bandwidth (GB/s),
    error, the algorithm / protocol chosen and the row's role: the series' ``role``, except
    the sizes in its ``fit_rows`` (rows a model change was chosen on), which are ``fit``."""
    c = cluster_of(series)
    fit = {int(b) for b in series.get("fit_rows", [])}
    out = []
    for nbytes, pub in series["rows"]:
        r = collective_cost(c, series["collective"], int(nbytes), algo=series.get("algo"))
        out.append({"bytes": int(nbytes), "published": pub, "predicted": r.busbw_gbps,
                    "error": r.busbw_gbps / pub - 1, "algorithm": r.algorithm,
                    "protocol": r.protocol,
                    "role": "fit" if int(nbytes) in fit else series["role"]})
    return out


def gemm_rows(series: dict) -> list[dict]:
    g = gpu_spec(series["gpu"])
    fit = {tuple(x) for x in series.get("fit_rows", [])}
    ceiling = g.mamf(series["dtype"])[0]
    out = []
    for m, n, k, pub in series["rows"]:
        r = K.matmul(g, m, n, k, 1, series["dtype"])
        out.append({"shape": f"{m}x{n}x{k}", "published": pub, "predicted": r.tflops,
                    "error": r.tflops / pub - 1, "bound": r.bound,
                    "above_ceiling": r.tflops > ceiling * (1 + 1e-9),
                    "role": "fit" if (m, n, k) in fit else "judge"})
    return out


def same_shape_rows(series: dict) -> list[dict]:
    """Per GPU of the series, its rows: the published time (us; from the published TFLOP/s
    with the source's flop count ``m n (2k - 1)``) and the model's, and the error. Row
    keys: ``shape``, ``tokens`` (m), ``gpu``, ``published_us``, ``predicted_us``,
    ``error``, ``bound``, ``role`` (always ``judge``: no parameter comes from these)."""
    out = []
    for i, name in enumerate(series["gpus"]):
        g = gpu_spec(name)
        for row in series["rows"]:
            m, k, n = (int(x) for x in row[:3])
            pub_us = m * n * (2 * k - 1) / (row[3 + i] * 1e6)
            r = K.matmul(g, m, n, k, 1, series["dtype"])
            out.append({"shape": f"{m}x{k}x{n}", "tokens": m, "gpu": name,
                        "published_us": pub_us, "predicted_us": r.time_us,
                        "published": pub_us, "predicted": r.time_us,
                        "error": r.time_us / pub_us - 1, "bound": r.bound, "role": "judge",
                        "in_range": r.range_us[0] <= pub_us <= r.range_us[1]})
    return out


def speedups(rows: list[dict], gpus: list[str]) -> list[dict]:
    """Per shape, the published and predicted time ratio ``gpus[0] / gpus[1]``."""
    by = {(r["shape"], r["gpu"]): r for r in rows}
    out = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        a, b = by[(shape, gpus[0])], by[(shape, gpus[1])]
        pub = a["published_us"] / b["published_us"]
        pred = a["predicted_us"] / b["predicted_us"]
        out.append({"shape": shape, "published": pub, "predicted": pred,
                    "error": pred / pub - 1, "role": "judge"})
    return out


def ceiling_check(extra: list[tuple[str, str, int, int, int]]) -> list[dict]:
    """For every GPU profile and dtype with a published maximum achievable matmul rate
    (``gpus.mamf``): the highest TFLOP/s the model prices over the grid of shapes
    (:data:`_GRID` cubed) and the ``extra`` (gpu, dtype, m, n, k) shapes, against it."""
    out = []
    for name in gpu_names():
        g = gpu_spec(name)
        for dtype in sorted(g.mamf_tflops):
            ceil, src = g.mamf(dtype)
            if src != "published":
                continue
            shapes = [(m, n, k) for m in _GRID for n in _GRID for k in _GRID]
            shapes += [(m, n, k) for gn, dt, m, n, k in extra if gn == name and dt == dtype]
            best, at = 0.0, None
            for m, n, k in shapes:
                t = K.matmul(g, m, n, k, 1, dtype).tflops
                if t > best:
                    best, at = t, (m, n, k)
            out.append({"gpu": name, "dtype": dtype, "ceiling": ceil, "max_predicted": best,
                        "shape": "x".join(map(str, at)), "shapes": len(shapes),
                        "above": best > ceil * (1 + 1e-9)})
    return out


def mamf_check(tables: list[dict], extra: list[tuple[str, str, int, int, int]]) -> list[dict]:
    """For every published maximum achievable matmul rate of a built-in GPU profile and dtype
    (``[[mamf]]`` of :data:`KDATA`: Stas Bekman's tables, K1 / K28 / K30): the highest
    TFLOP/s the model prices over :data:`_GRID` cubed and the ``extra`` shapes, against it,
    and the ceiling the model used (``gpus.mamf``: published, derived or assumed)."""
    known = set(gpu_names())
    out, best_of = [], {}
    for tab in tables:
        for name, dtype, pub, note in tab["rows"]:
            if name not in known:
                continue
            if (name, dtype) not in best_of:
                g = gpu_spec(name)
                shapes = [(m, n, k) for m in _GRID for n in _GRID for k in _GRID]
                shapes += [(m, n, k) for gn, dt, m, n, k in extra if gn == name and dt == dtype]
                best_of[(name, dtype)] = max(
                    (K.matmul(g, m, n, k, 1, dtype).tflops, (m, n, k)) for m, n, k in shapes)
            best, at = best_of[(name, dtype)]
            out.append({"id": tab["id"], "table": tab["table"], "gpu": name, "dtype": dtype,
                        "published": float(pub), "note": note, "max_predicted": best,
                        "shape": "x".join(map(str, at)),
                        "model_ceiling": gpu_spec(name).mamf(dtype),
                        "above": best > float(pub) * (1 + 1e-9)})
    return out


def summarize(rows: list[dict]) -> dict:
    judged = [abs(r["error"]) for r in rows if r["role"] == "judge"]
    basis = "judge" if judged else "fit"
    errs = judged or [abs(r["error"]) for r in rows]
    return {"n_rows": len(rows), "judged": len(judged), "basis": basis,
            "median": statistics.median(errs), "worst": max(errs)}


def run() -> dict:
    data = load()
    out = {"collective": [], "gemm": []}
    for s in data["collective"]:
        rows = collective_rows(s)
        out["collective"].append({"id": s["id"], "title": s["title"], "rows": rows,
                                  **summarize(rows)})
    kdata = load(KDATA)
    extra = []
    for s in data["gemm"] + kdata.get("gemm", []):
        rows = gemm_rows(s)
        out["gemm"].append({"id": s["id"], "title": s["title"], "rows": rows,
                            **summarize(rows)})
        extra += [(s["gpu"], s["dtype"], m, n, k) for m, n, k, _ in s["rows"]]
    out["same_shape"] = []
    for s in data.get("same_shape", []):
        rows = same_shape_rows(s)
        for g in s["gpus"]:
            mine = [r for r in rows if r["gpu"] == g]
            out["same_shape"].append({"id": s["id"], "title": f"{s['title']}: {g}",
                                      "gpu": g, "rows": mine, **summarize(mine)})
        sp = speedups(rows, s["gpus"])
        out["same_shape"].append({"id": s["id"], "title": f"{s['title']}: time "
                                  f"{s['gpus'][0]} / {s['gpus'][1]}", "gpu": None,
                                  "rows": sp, **summarize(sp)})
        extra += [(g, s["dtype"], int(m), int(n), int(k)) for g in s["gpus"]
                  for m, k, n, *_ in s["rows"]]
    out["ceiling"] = ceiling_check(extra)
    out["mamf"] = mamf_check(kdata.get("mamf", []), extra)
    return out


def _size(b: int) -> str:
    for u, f in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if b >= f:
            return f"{b / f:g}{u}"
    return str(b)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    res = run()
    if args.json:
        print(json.dumps(res))
        return 0
    for s in res["collective"]:
        print(f"\n[{s['id']}] {s['title']}")
        print(f"  {'size':>6} {'published':>10} {'predicted':>10} {'error':>8}  choice"
              "            role")
        for r in s["rows"]:
            print(f"  {_size(r['bytes']):>6} {r['published']:>10.2f} {r['predicted']:>10.2f} "
                  f"{100 * r['error']:>+7.1f}%  {r['algorithm'] + '/' + r['protocol']:<16}  "
                  f"{r['role']}")
        print(f"  -> median |error| {100 * s['median']:.1f}%, worst {100 * s['worst']:.1f}% "
              f"over {s['basis']} rows")
    bad = 0
    for s in res["gemm"]:
        print(f"\n[{s['id']}] {s['title']} (TFLOP/s)")
        for r in s["rows"]:
            flag = "  ABOVE THE PUBLISHED CEILING" if r["above_ceiling"] else ""
            bad += r["above_ceiling"]
            print(f"  {r['shape']:>20} {r['published']:>9.1f} {r['predicted']:>9.1f} "
                  f"{100 * r['error']:>+7.1f}%  {r['bound']:<8} {r['role']}{flag}")
        print(f"  -> median |error| {100 * s['median']:.1f}%, worst {100 * s['worst']:.1f}% "
              f"over {s['basis']} rows")
    for s in res["same_shape"]:
        if s["gpu"] is None:
            print(f"\n[{s['id']}] {s['title']} (published vs predicted ratio)")
            for r in s["rows"]:
                print(f"  {r['shape']:>20} {r['published']:>9.3f} {r['predicted']:>9.3f} "
                      f"{100 * r['error']:>+7.1f}%  {r['role']}")
        else:
            print(f"\n[{s['id']}] {s['title']} (op time in us; shape m x k x n)")
            print(f"  {'shape':>20} {'published':>9} {'predicted':>9} {'error':>8}  bound    "
                  "role   in the printed range")
            for r in s["rows"]:
                print(f"  {r['shape']:>20} {r['published_us']:>9.1f} {r['predicted_us']:>9.1f} "
                      f"{100 * r['error']:>+7.1f}%  {r['bound']:<8} {r['role']}  "
                      f"{'yes' if r['in_range'] else 'no'}")
        print(f"  -> median |error| {100 * s['median']:.1f}%, worst {100 * s['worst']:.1f}% "
              f"over {s['basis']} rows")
    print("\nceiling check: the highest matmul rate the model prices vs the published maximum "
          "achievable (TFLOP/s)")
    for c in res["ceiling"]:
        bad += c["above"]
        print(f"  {c['gpu']:>10} {c['dtype']:<5} ceiling {c['ceiling']:>7.1f}  max predicted "
              f"{c['max_predicted']:>7.1f} at {c['shape']:<17} over {c['shapes']} shapes  "
              f"{'ABOVE THE CEILING' if c['above'] else 'ok'}")
    print("\npublished maximum achievable matmul TFLOP/s (MAMF tables, K1 v1 / K28 v2 / K30 "
          "later) vs the highest the model prices on that profile:")
    for c in res["mamf"]:
        bad += c["above"]
        ceil, src = c["model_ceiling"]
        print(f"  {c['id']:>4} {c['table']:<5} {c['gpu']:>10} {c['dtype']:<5} published "
              f"{c['published']:>7.1f}  max predicted {c['max_predicted']:>7.1f} at "
              f"{c['shape']:<17} (model ceiling {ceil:.1f}, {src})  "
              f"{'ABOVE THE PUBLISHED MAMF' if c['above'] else 'ok'}")
    print("\nsummary (median / worst |error|, judged rows only):")
    for s in res["collective"] + res["gemm"] + res["same_shape"]:
        if s["basis"] == "judge":
            print(f"  {s['id']:>4} {100 * s['median']:5.1f}% / {100 * s['worst']:5.1f}%  "
                  f"({s['judged']} rows)  {s['title']}")
    print("fit series (parameters set from them; not a measure of accuracy):")
    for s in res["collective"] + res["gemm"] + res["same_shape"]:
        if s["basis"] == "fit":
            print(f"  {s['id']:>4} {100 * s['median']:5.1f}% / {100 * s['worst']:5.1f}%  "
                  f"({s['n_rows']} rows)  {s['title']}")
    if bad:
        print(f"\n{bad} GEMM prediction(s) or ceiling check(s) above the published ceiling",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
