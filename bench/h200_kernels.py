"""Held-out H200 training traces against the cost layer, per kernel class (issues 27, 32;
REFERENCES.md K47).

Run: ``python bench/h200_kernels.py [--json] [--cache DIR] [--worst N]`` (about 1-2 min: it
ingests 17 traces once into DIR, default ``/tmp/retime-h200-kernels``).

The traces are ``traces/gpu_pairs/g{1,2}/<config>/rep1.pt.trace.json.gz`` (one NVIDIA H200,
torch 2.11.0+cu130, plain torch.profiler with ``record_shapes=True``; kit
``examples/gpu_pairs/capture.py``). Every operator call with recorded shapes that launched GPU
work is priced as ``retime cost op --trace`` prices it (:func:`analysis.cost_check.op_check`:
the cost layer on the trace's own GPU, h200, with the fitted curves and one launch floor per
kernel the call launched), grouped by name, shapes and dtype; the error of a group is its
model time per call / its measured device time per call - 1. Groups are put in classes by
operator name (:func:`op_class`); per class the bench prints the groups, the median |error|
over groups, the time-weighted error (sum of model / sum of measured - 1) and the share of
the traces' priced device time; then the worst groups among those holding at least 0.5% of
their trace's priced time.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces" / "gpu_pairs"

_CLASSES = (
    ("attention", ("scaled_dot_product", "flash_attention", "efficient_attention",
                   "cudnn_attention")),
    ("gemm", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
              "aten::linear", "aten::_scaled_mm")),
    ("norm", ("layer_norm", "rms_norm", "batch_norm", "group_norm")),
    ("optimizer", ("adam", "_foreach_", "sgd")),
    ("softmax/loss", ("softmax", "nll_loss", "cross_entropy")),
    ("embedding", ("embedding",)),
    ("copy/fill", ("copy_", "_to_copy", "fill_", "zero_", "clone", "contiguous")),
    ("reduction", ("aten::sum", "aten::mean", "aten::max", "aten::amax", "aten::norm",
                   "aten::linalg_vector_norm")),
)


def op_class(name: str) -> str:
    for cls, keys in _CLASSES:
        if any(k in name for k in keys):
            return cls
    return "elementwise"


def traces() -> list[tuple[str, Path]]:
    out = []
    for batch in ("g1", "g2"):
        for d in sorted((TRACES / batch).iterdir()):
            f = d / "rep1.pt.trace.json.gz"
            if f.is_file():
                out.append((f"{batch}/{d.name}", f))
    return out


def _store(name: str, path: Path, cache: Path) -> Path:
    s = cache / (name.replace("/", "-") + ".retime")
    if not s.exists():
        subprocess.run([sys.executable, "-m", "retime", "ingest", str(path), "-o", str(s)],
                       check=True, capture_output=True, cwd=ROOT)
    return s


def score(cache: Path) -> tuple[list[dict], list[str]]:
    from retime.analysis.cost_check import op_check
    from retime.collectors.errors import RetimeError
    from retime.collectors.trace import read_trace

    cache.mkdir(parents=True, exist_ok=True)
    rows, skipped = [], []
    for name, path in traces():
        try:
            df = op_check(read_trace(_store(name, path, cache)), top=10**6)
        except RetimeError as e:
            skipped.append(f"{name}: {e}")
            continue
        if df.attrs["trace_gpu"] != "h200":
            raise SystemExit(f"{name}: priced on {df.attrs['trace_gpu']}, not h200")
        tot = float((df["measured_us"] * df["count"]).sum())
        for r in df.to_dict("records"):
            rows.append({"trace": name, "class": op_class(r["op"]), "op": r["op"],
                         "shapes": r["shapes"], "dtype": r["dtype"], "count": int(r["count"]),
                         "measured_us": float(r["measured_us"]), "model_us": float(r["model_us"]),
                         "error": float(r["error"]), "bound": r["bound"],
                         "share": float(r["measured_us"] * r["count"]) / tot})
    return rows, skipped


def by_class(rows: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for cls in sorted({r["class"] for r in rows}):
        rs = [r for r in rows if r["class"] == cls]
        meas = sum(r["measured_us"] * r["count"] for r in rs)
        mod = sum(r["model_us"] * r["count"] for r in rs)
        out[cls] = {"groups": len(rs), "calls": sum(r["count"] for r in rs),
                    "median_abs_error": statistics.median(abs(r["error"]) for r in rs),
                    "time_weighted_error": mod / meas - 1,
                    "measured_ms": meas / 1e3}
    total = sum(v["measured_ms"] for v in out.values())
    for v in out.values():
        v["time_share"] = v["measured_ms"] / total
    return out


def worst(rows: list[dict], n: int) -> list[dict]:
    big = [r for r in rows if r["share"] >= 0.005]
    return sorted(big, key=lambda r: -abs(r["error"]))[:n]


def main() -> int:
    argv = sys.argv[1:]
    cache = Path(argv[argv.index("--cache") + 1]) if "--cache" in argv else \
        Path("/tmp/retime-h200-kernels")
    n = int(argv[argv.index("--worst") + 1]) if "--worst" in argv else 12
    rows, skipped = score(cache)
    cls = by_class(rows)
    if "--json" in argv:
        print(json.dumps({"classes": cls, "worst": worst(rows, n), "skipped": skipped,
                          "groups": rows}, indent=1))
        return 0
    print(f"{len({r['trace'] for r in rows})} H200 traces, {len(rows)} operator groups priced "
          f"on h200 (model / measured - 1 per group)")
    print("| class | groups | calls | share of time | median abs error | time-weighted error |")
    print("|---|---|---|---|---|---|")
    for k, v in sorted(cls.items(), key=lambda kv: -kv[1]["time_share"]):
        print(f"| {k} | {v['groups']} | {v['calls']} | {100 * v['time_share']:.1f}% | "
              f"{100 * v['median_abs_error']:.1f}% | {100 * v['time_weighted_error']:+.1f}% |")
    med = statistics.median(abs(r["error"]) for r in rows)
    print(f"\nall groups: median |error| {100 * med:.1f}%")
    print(f"\nworst groups holding >= 0.5% of their trace's priced device time (top {n}):")
    print("| trace | op | dtype | shapes | calls | measured us | model us | error | bound |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in worst(rows, n):
        print(f"| {r['trace']} | {r['op']} | {r['dtype']} | {r['shapes'][:60]} | {r['count']} "
              f"| {r['measured_us']:.1f} | {r['model_us']:.1f} | {100 * r['error']:+.1f}% | "
              f"{r['bound']} |")
    for s in skipped:
        print(f"skipped: {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
