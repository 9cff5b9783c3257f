"""Does the synthesizer rank parallel layouts right? Error, Spearman rank correlation and
regret against measured iteration times.

Run: ``python bench/synth_ranking.py [runs.csv] [--json]`` (default:
``bench/data/megatron_a100_runs.csv``, public Megatron-LM measurements with their sources in
the file's header).

The CSV has one measured run per row: ``cluster`` (rows of one cluster are the same job on
the same machine, differing in layout; the ranking is judged inside a cluster), ``model`` (a
zoo name, or ``gpt`` with ``hidden``, ``heads``, ``layers``: ffn 4h, sequence 2048,
vocabulary 51,200, unfused attention), ``hardware``, ``tp``, ``pp``, ``dp``,
``micro_batch``, ``global_batch``, ``schedule``, ``chunks``, ``recompute``,
``sequence_parallel`` and ``measured_s``; optional ``cp``, ``zero``, ``dtype`` (default
fp16), ``ep``. Lines starting with ``#`` are comments.

Printed: each row's predicted and measured time and the error; per cluster the mean
|error|, the Spearman rank correlation of predicted vs measured times (clusters of 2 or more
rows) and the regret of running the layout the model predicts fastest (its measured time
over the best measured time, minus 1); overall the mean and worst |error|.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import time
from pathlib import Path

import numpy as np

from retime.collectors.synth import synthesize

DEFAULT = Path(__file__).with_name("data") / "megatron_a100_runs.csv"


def ranks(x) -> np.ndarray:
    """Ranks 1..n with ties averaged (the Spearman convention)."""
    x = np.asarray(x, np.float64)
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):
        tie = x == v
        r[tie] = r[tie].mean()
    return r


def spearman(a, b) -> float:
    """Spearman rank correlation of two sequences (NaN when either is constant)."""
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def regret(predicted, measured) -> float:
    """Measured time of the layout predicted fastest over the best measured time, - 1."""
    p, m = np.asarray(predicted, np.float64), np.asarray(measured, np.float64)
    return float(m[int(np.argmin(p))] / m.min() - 1)


def read_runs(path: str | Path) -> list[dict]:
    text = Path(path).read_text()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return list(csv.DictReader(io.StringIO("\n".join(lines))))


def _model(row: dict):
    if row["model"] != "gpt":
        return row["model"]
    h = int(row["hidden"])
    return {"name": f"gpt-h{h}-l{row['layers']}", "hidden": h, "ffn": 4 * h,
            "heads": int(row["heads"]), "layers": int(row["layers"]), "seq": 2048,
            "vocab": 51200, "attention": "unfused"}


def predict(row: dict) -> dict:
    """The synthesized step of one CSV row."""
    def get(k, default):
        v = row.get(k)
        return default if v in (None, "") else v
    kw = dict(tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]),
              cp=int(get("cp", 1)), micro_batch=int(row["micro_batch"]),
              global_batch=int(row["global_batch"]), schedule=get("schedule", "1f1b"),
              chunks=int(get("chunks", 1)), recompute=get("recompute", "none"),
              sequence_parallel=str(get("sequence_parallel", "false")).lower() == "true",
              zero=int(get("zero", 0)), dtype=get("dtype", "fp16"), ep=int(get("ep", 1)))
    s = synthesize(_model(row), row["hardware"], expand="unique", check_memory=False,
                   **kw).meta["synth"]
    return {"predicted_s": s["step_time_ns"] / 1e9, "mfu": s["mfu"], "oom": s["oom"]}


def evaluate(runs: list[dict]) -> dict:
    rows = []
    for r in runs:
        t0 = time.perf_counter()
        p = predict(r)
        meas = float(r["measured_s"])
        rows.append({"cluster": r["cluster"], "source": r.get("source", ""),
                     "model": r["model"] if r["model"] != "gpt" else _model(r)["name"],
                     "layout": f"tp{r['tp']} pp{r['pp']} dp{r['dp']} mb{r['micro_batch']} "
                               f"{r.get('schedule', '1f1b')}"
                               f"{'/' + r['chunks'] if r.get('chunks', '1') not in ('', '1') else ''}"
                               f" {r.get('recompute', 'none')}"
                               f"{' sp' if str(r.get('sequence_parallel')).lower() == 'true' else ''}",
                     "measured_s": meas, **p, "error": p["predicted_s"] / meas - 1,
                     "seconds": time.perf_counter() - t0})
    clusters = {}
    for c in dict.fromkeys(r["cluster"] for r in rows):
        sel = [r for r in rows if r["cluster"] == c]
        pred = [r["predicted_s"] for r in sel]
        meas = [r["measured_s"] for r in sel]
        clusters[c] = {"rows": len(sel),
                       "mean_abs_error": float(np.mean([abs(r["error"]) for r in sel])),
                       "spearman": spearman(pred, meas) if len(sel) > 1 else None,
                       "regret": regret(pred, meas) if len(sel) > 1 else None}
    errs = np.abs([r["error"] for r in rows])
    ranked = [c for c in clusters.values() if c["spearman"] is not None]
    summary = {"rows": len(rows), "mean_abs_error": float(errs.mean()),
               "max_abs_error": float(errs.max()),
               "clusters_ranked": len(ranked),
               "min_spearman": min((c["spearman"] for c in ranked
                                    if c["spearman"] == c["spearman"]), default=None),
               "max_regret": max((c["regret"] for c in ranked), default=None)}
    return {"rows": rows, "clusters": clusters, "summary": summary}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", nargs="?", default=str(DEFAULT))
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    res = evaluate(read_runs(args.csv))
    if args.json:
        json.dump(res, sys.stdout)
        print()
        return
    print(f"{'cluster':10s} {'model':18s} {'layout':38s} {'predicted':>10s} {'measured':>9s} "
          f"{'error':>7s}")
    for r in res["rows"]:
        print(f"{r['cluster']:10s} {r['model']:18s} {r['layout']:38s} {r['predicted_s']:8.3f} s "
              f"{r['measured_s']:7.3f} s {100 * r['error']:+6.1f}%")
    print()
    print(f"{'cluster':10s} {'rows':>4s} {'mean |err|':>10s} {'Spearman':>9s} {'regret':>7s}")
    for c, v in res["clusters"].items():
        sp = "" if v["spearman"] is None else f"{v['spearman']:+.2f}"
        rg = "" if v["regret"] is None else f"{100 * v['regret']:.1f}%"
        print(f"{c:10s} {v['rows']:4d} {100 * v['mean_abs_error']:9.1f}% {sp:>9s} {rg:>7s}")
    s = res["summary"]
    print()
    print(f"{s['rows']} runs: mean |error| {100 * s['mean_abs_error']:.2f}%, worst "
          f"{100 * s['max_abs_error']:.2f}%; {s['clusters_ranked']} clusters ranked"
          + (f", lowest Spearman {s['min_spearman']:+.2f}, worst regret "
             f"{100 * s['max_regret']:.1f}%" if s["clusters_ranked"] else ""))


if __name__ == "__main__":
    main()
