"""GPU swaps: a shared trace replayed on other GPUs, against published step times where a
verifiable one exists.

Run: ``python bench/gpu_swap.py [--json]`` (a few seconds: one ingest, one what-if per GPU).

For each ``[[pair]]`` of ``bench/data/gpu_swap.toml`` the trace is ingested, its batch set to
``batch`` (``parallel.micro_batch``) and its GPU changed (``hardware.gpu``) to each of ``gpus``,
and the replayed step time is printed with where it goes: the GPU's kernel time (sum of kernel
and memset durations in the replay) and the rest (host issue time the kernels waited on), and
the predicted time ratio between the pair's GPUs. A pair's ``published`` per-iteration times
(only from a source that can be re-read, REFERENCES.md) are printed next to the prediction with
the error; a pair without one says "no verifiable published figure" and judges nothing (K33's
figures were withdrawn: their source could not be re-found).
It also prints, as a diagnosis only, the trace's evidence of per-call profiler recording on
the host (:func:`recording_floor`): what its metadata-only ATen calls take.
Nothing is fitted to published figures. The issue's bar is 10% per step.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import tomllib

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data" / "gpu_swap.toml"
SHARED = ROOT.parent / "shared" / "traces"


def pairs() -> list[dict]:
    with open(DATA, "rb") as fh:
        return tomllib.load(fh)["pair"]


def _trace_path(p: dict) -> Path:
    for base in (SHARED, Path("/work/shared/traces")):
        if (base / p["trace"]).is_file():
            return base / p["trace"]
    raise FileNotFoundError(f"{p['trace']} not found under {SHARED}")


def rows(p: dict, trace=None) -> list[dict]:
    """One row per GPU of pair ``p`` (``gpus``): ``gpu``, ``predicted_ms``, ``kernel_ms`` (the
    replay's kernel and memset time), ``other_ms`` (the rest of the step), ``assumed`` (the
    what-if's lines), and ``published_ms`` / ``error`` (predicted / published - 1): None where
    the pair has no verifiable published figure for that GPU."""
    from retime.collectors.enums import OpKind
    from retime.collectors.ingest import read
    from retime.replay import whatif
    tr = trace if trace is not None else read([_trace_path(p)])
    kind = tr.ops["kind"].to_numpy()
    dev = (kind == OpKind.KERNEL) | (kind == OpKind.MEMSET)
    published = {g: float(ms) for g, ms in p.get("published", [])}
    out = []
    for gpu in p["gpus"]:
        r = whatif(tr, {"parallel.micro_batch": int(p["batch"]), "hardware.gpu": gpu})
        pred = r.step_time_ns / 1e6
        k = float(np.asarray(r.dur_ns)[dev].sum()) / 1e6
        ms = published.get(gpu)
        out.append({"id": p["id"], "gpu": gpu, "batch": int(p["batch"]),
                    "published_ms": ms, "predicted_ms": pred,
                    "error": None if ms is None else pred / ms - 1.0,
                    "kernel_ms": k, "other_ms": pred - k,
                    "assumed": list(r.meta["whatif"]["assumed"])})
    return out


#: ATen operators that only make a new view of a tensor's metadata: no device work, no
#: allocation, no launch; their recorded time is the dispatcher plus the profiler's per-call
#: recording (record_shapes, profile_memory, an execution-trace observer's callbacks)
METADATA_OPS = ("aten::view", "aten::as_strided", "aten::_reshape_alias", "aten::expand",
                "aten::unsqueeze", "aten::squeeze", "aten::alias", "aten::permute")


def recording_floor(trace) -> dict:
    """Evidence in the trace for per-call recording time: the median recorded duration of
    its metadata-only leaf calls (:data:`METADATA_OPS`, ``floor_us``), how many ``aten::``
    operator calls it recorded (``calls``, every depth: each pays the recording) and their
    product (``upper_ms``: at most that much of the host's operator time is recording, the
    floor including the dispatcher's own cost). A diagnosis, not used to predict."""
    from retime.collectors.enums import OpKind
    o = trace.ops
    cpu = o["kind"].to_numpy() == OpKind.CPU_OP
    names = np.asarray(trace.strings, dtype=object)[o["name_id"].to_numpy()]
    aten = int((cpu & np.char.startswith(names.astype(str), "aten::")).sum())
    r = trace.ranges  # calls that enclose others are ranges of the ingested trace
    if r is not None and len(r):
        rn = np.asarray(trace.strings, dtype=object)[r["name_id"].to_numpy()].astype(str)
        aten += int(np.char.startswith(rn, "aten::").sum())
    meta = cpu & np.isin(names.astype(str), METADATA_OPS)
    dur = o["dur_ns"].to_numpy()
    floor = float(np.median(dur[meta])) / 1e3 if meta.any() else 0.0
    return {"floor_us": floor, "calls": aten, "meta_calls": int(meta.sum()),
            "upper_ms": floor * aten / 1e3}


def ratios(rs: list[dict]) -> list[dict]:
    """Each later GPU's time over the first's, predicted, and published where both are."""
    a = rs[0]
    return [{"pair": f"{r['gpu']}/{a['gpu']}",
             "published": (None if r["published_ms"] is None or a["published_ms"] is None
                           else r["published_ms"] / a["published_ms"]),
             "predicted": r["predicted_ms"] / a["predicted_ms"]} for r in rs[1:]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from retime.collectors.ingest import read
    report = []
    for p in pairs():
        tr = read([_trace_path(p)])
        rs = rows(p, tr)
        report.append({"pair": p["id"], "model": p["model"], "rows": rs, "ratios": ratios(rs),
                       "withdrawn": p.get("withdrawn"), "recording": recording_floor(tr)})
    if a.json:
        print(json.dumps(report, indent=1))
        return 0
    for rep in report:
        print(f"{rep['pair']} {rep['model']}")
        if rep["withdrawn"]:
            print(f"  {rep['withdrawn']}: predictions only, nothing is judged")
        print(f"  {'gpu':<11} {'batch':>5} {'published':>10} {'predicted':>10} {'error':>8} "
              f"{'kernels':>8} {'rest':>8}")
        for r in rep["rows"]:
            pub = "n/a" if r["published_ms"] is None else f"{r['published_ms']:.2f}ms"
            err = "" if r["error"] is None else f"{r['error']:+.1%}"
            print(f"  {r['gpu']:<11} {r['batch']:>5} {pub:>10} "
                  f"{r['predicted_ms']:>8.2f}ms {err:>8} {r['kernel_ms']:>6.2f}ms "
                  f"{r['other_ms']:>6.2f}ms")
        for q in rep["ratios"]:
            pub = "n/a" if q["published"] is None else f"{q['published']:.2f}"
            print(f"  ratio {q['pair']}: published {pub}, predicted {q['predicted']:.2f}")
        f = rep["recording"]
        print(f"  host recording (diagnosis): {f['meta_calls']} metadata-only calls (view, "
              f"as_strided, ...) take a median {f['floor_us']:.1f} us under the profiler; "
              f"{f['calls']} aten:: calls recorded: up to {f['upper_ms']:.1f} ms of the "
              "host's operator time is per-call recording an unprofiled run does not pay")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
