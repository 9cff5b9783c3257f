"""The cost layer against published measurements, row by row.

Run: ``python bench/cost.py [--json]`` (seconds). Data: ``bench/data/cost_published.toml``
(every series cited in ``collectors/costs/REFERENCES.md``).

Printed per series: each row's predicted and published value (collectives: nccl-tests bus
bandwidth in GB/s per message size; GEMMs: TFLOP/s per shape), the error
``predicted / published - 1``, the row's role (``fit``: a parameter was set from it, shown
but never counted as the model's accuracy; ``judge``: no parameter came from it), and per
series the median and worst |error| over its judged rows (over its fit rows for a fit
series, marked as such). GEMM rows also check the hard rule that no prediction exceeds the
GPU's published maximum achievable matmul rate.
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
from retime.collectors.costs.gpus import gpu_spec

DATA = Path(__file__).with_name("data") / "cost_published.toml"
_CLUSTER_KEYS = ("gpu", "nodes", "gpus_per_node", "nvlink_domain", "nics_per_node", "nic_gbit",
                 "nvls")


def load(path: Path = DATA) -> dict:
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def cluster_of(series: dict):
    c = load_preset(series["preset"])
    return c.with_overrides(**{k: series[k] for k in _CLUSTER_KEYS if k in series})


def collective_rows(series: dict) -> list[dict]:
    c = cluster_of(series)
    out = []
    for nbytes, pub in series["rows"]:
        r = collective_cost(c, series["collective"], int(nbytes), algo=series.get("algo"))
        out.append({"bytes": int(nbytes), "published": pub, "predicted": r.busbw_gbps,
                    "error": r.busbw_gbps / pub - 1, "algorithm": r.algorithm,
                    "protocol": r.protocol, "role": series["role"]})
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
    for s in data["gemm"]:
        rows = gemm_rows(s)
        out["gemm"].append({"id": s["id"], "title": s["title"], "rows": rows,
                            **summarize(rows)})
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
    print("\nsummary (median / worst |error|, judged rows only):")
    for s in res["collective"] + res["gemm"]:
        if s["basis"] == "judge":
            print(f"  {s['id']:>4} {100 * s['median']:5.1f}% / {100 * s['worst']:5.1f}%  "
                  f"({s['judged']} rows)  {s['title']}")
    print("fit series (parameters set from them; not a measure of accuracy):")
    for s in res["collective"] + res["gemm"]:
        if s["basis"] == "fit":
            print(f"  {s['id']:>4} {100 * s['median']:5.1f}% / {100 * s['worst']:5.1f}%  "
                  f"({s['n_rows']} rows)  {s['title']}")
    if bad:
        print(f"\n{bad} GEMM prediction(s) above the published ceiling", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
