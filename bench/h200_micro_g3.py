"""Batch G3's held-out H200 kernel rows against ``retime cost op`` (issues 27, 32).

Run: ``python bench/h200_micro_g3.py [--json] [--subprocess]``.

The rows are ``traces/gpu_pairs/g3/micro.json`` (``examples/gpu_pairs/capture.py``
``micro_g3()``: shapes no earlier row or trace had, defined before capture, captured after
FREEZE-11 on one NVIDIA H200, torch 2.11.0+cu130; CUDA-event timing of 20 back-to-back calls
after 3 warm-ups, one process: one rep). Each row is priced as ``bench/h200_micro.py`` prices
G1/G2's (same CLI path, same 15% bar, same host-floor rule), with these G3 kinds:

- matmul: ``cost op matmul --m --n --k --dtype`` (fp32 rows ran with TF32 off);
- attention: ``cost op attention ... --kv-heads H_KV [--causal] --attn-kernel cudnn``, fp16
  rows as ``--dtype fp16``; fwd, and fwd+bwd = fwd + ``--backward``;
- add fp32 (x + y): ``cost op elementwise --reads 2 --writes 1``;
- gelu bf16 and the in-place scalar mul bf16: ``cost op elementwise --reads 1 --writes 1``;
- layer_norm fp32 forward: ``cost op norm`` (its one read + one write, plus the norm's own
  parameter read). Its fwd+bwd row has no ``cost op`` kind (``norm`` has no ``--backward``):
  reported "not priced", not dropped.

The error is predicted / measured - 1. ``host_bound`` marks rows whose measured time is within
1.5x of the run's fastest row (the Python issue floor of the timed loop), printed, not judged.
"""

from __future__ import annotations

import json
import statistics
import sys
from math import prod
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from h200_micro import BAR, HOST_FLOOR_X, _price  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MICRO = ROOT / "traces" / "gpu_pairs" / "g3" / "micro.json"
_DT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
#: elementwise rows: (tensors read, tensors written) of the call
_STREAMS = {"add": (2, 1), "gelu": (1, 1), "mul_scalar_inplace": (1, 1)}


def _argv(row: dict, backward: bool = False) -> list[str] | None:
    """The ``retime cost op`` arguments pricing a row, or None when no op kind matches."""
    k = row["kind"]
    dt = _DT.get(row["dtype"], row["dtype"])
    if k == "matmul":
        return ["matmul", "--m", str(row["m"]), "--n", str(row["n"]), "--k", str(row["k"]),
                "--dtype", dt]
    if k == "attention":
        a = ["attention", "--batch", str(row["batch"]), "--heads", str(row["heads"]),
             "--kv-heads", str(row["kv_heads"]), "--seq", str(row["seq"]),
             "--head-dim", str(row["head_dim"]), "--dtype", dt, "--attn-kernel", "cudnn"]
        return a + (["--causal"] if row["causal"] else []) + (["--backward"] if backward else [])
    if k in _STREAMS:
        r, w = _STREAMS[k]
        return ["elementwise", "--elements", str(prod(row["shape"])), "--dtype", dt,
                "--reads", str(r), "--writes", str(w)]
    if k == "layer_norm" and not backward:
        return ["norm", "--elements", str(prod(row["shape"])), "--dtype", dt]
    return None


def _label(row: dict, part: str = "") -> str:
    k = row["kind"]
    dt = _DT.get(row["dtype"], row["dtype"])
    if k == "matmul":
        return f"matmul {row['m']}x{row['n']}x{row['k']} {dt}"
    if k == "attention":
        gqa = f" kv{row['kv_heads']}" if row["kv_heads"] != row["heads"] else ""
        return (f"attention b{row['batch']} h{row['heads']}{gqa} s{row['seq']} "
                f"d{row['head_dim']}{' causal' if row['causal'] else ''} {dt} {part}")
    shape = "x".join(str(x) for x in row["shape"])
    return f"{k} {shape} {dt}" + (f" {part}" if part else "")


def _parts(row: dict) -> list[tuple[str, str]]:
    if "fwd_us" in row:
        return [("fwd", "fwd_us"), ("fwd+bwd", "fwd_bwd_us")]
    return [("", "time_us")]


def score(subproc: bool = False) -> list[dict]:
    rows = json.loads(MICRO.read_text())["rows"]
    out = []
    for a in rows:
        for part, key in _parts(a):
            meas = float(a[key])
            base = {"row": _label(a, part), "kind": a["kind"] + (f" {part}" if part else ""),
                    "measured_us": [meas]}
            fwd = _argv(a)
            bwd = _argv(a, True) if part == "fwd+bwd" else None
            if fwd is None or (part == "fwd+bwd" and bwd is None):
                out.append({**base, "cmd": None, "priced": False, "predicted_us": None,
                            "range_us": None, "error": None, "in_range": None})
                continue
            if part == "fwd+bwd":
                f, bw = _price(fwd, subproc), _price(bwd, subproc)
                pred = f["time_us"] + bw["time_us"]
                rng = [f["range_us"][0] + bw["range_us"][0], f["range_us"][1] + bw["range_us"][1]]
                cmd = " ".join(fwd) + " (+ --backward)"
            else:
                p = _price(fwd, subproc)
                pred, rng, cmd = p["time_us"], p["range_us"], " ".join(fwd)
            out.append({**base, "cmd": f"retime cost op {cmd} --gpu h200", "priced": True,
                        "predicted_us": pred, "range_us": rng, "error": pred / meas - 1,
                        "in_range": rng[0] <= meas <= rng[1]})
    floor = min(r["measured_us"][0] for r in out)
    for r in out:
        r["host_bound"] = r["measured_us"][0] < HOST_FLOOR_X * floor
        r["within_bar"] = None if r["error"] is None else abs(r["error"]) < BAR
    return out


def _cls(r: dict) -> str:
    if r["kind"] == "matmul":
        return f"matmul {r['row'].split()[-1]}"
    if r["kind"].startswith("attention"):
        return r["kind"]
    return "elementwise / norm"


def summary(rows: list[dict]) -> dict:
    judged = [r for r in rows if r["priced"] and not r["host_bound"]]
    by: dict[str, list[float]] = {}
    for r in judged:
        by.setdefault(_cls(r), []).append(abs(r["error"]))
    errs = [abs(r["error"]) for r in judged]
    return {"rows": len(rows), "judged": len(judged),
            "host_bound": sum(r["host_bound"] and r["priced"] for r in rows),
            "not_priced": [r["row"] for r in rows if not r["priced"]],
            "median_abs_error": statistics.median(errs),
            "within_bar": sum(r["within_bar"] for r in judged),
            "in_range": sum(r["in_range"] for r in judged),
            "by_class": {k: {"n": len(v), "median": statistics.median(v), "worst": max(v)}
                         for k, v in by.items()}}


def main() -> int:
    rows = score("--subprocess" in sys.argv)
    s = summary(rows)
    if "--json" in sys.argv:
        print(json.dumps({"rows": rows, "summary": s}, indent=1))
        return 0
    print("| row | predicted us (range) | measured us | error | in range | note |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if not r["priced"]:
            print(f"| {r['row']} | not priced (no `cost op` kind) | {r['measured_us'][0]:.1f} "
                  f"| - | - | not priced |")
            continue
        note = "host-bound (printed, not judged)" if r["host_bound"] else (
            "within 15%" if r["within_bar"] else "MISS")
        print(f"| {r['row']} | {r['predicted_us']:.1f} ({r['range_us'][0]:.1f}-"
              f"{r['range_us'][1]:.1f}) | {r['measured_us'][0]:.1f} "
              f"| {100 * r['error']:+.1f}% | {'yes' if r['in_range'] else 'no'} | {note} |")
    print(f"\n{s['rows']} rows: judged {s['judged']} (host-bound {s['host_bound']}, not priced "
          f"{len(s['not_priced'])}): median |error| {100 * s['median_abs_error']:.1f}%, within "
          f"15% {s['within_bar']}, in range {s['in_range']}")
    for k, v in s["by_class"].items():
        print(f"  {k}: {v['n']} rows, median {100 * v['median']:.1f}%, worst "
              f"{100 * v['worst']:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
