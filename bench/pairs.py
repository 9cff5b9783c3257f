"""What-if fidelity on real paired captures (issue 17): predicted vs measured, both directions.

Every pair in ``traces/pairs/`` is the same real job captured twice, differing in one knob
(examples/pairs/ made them; traces/pairs/README.md says how). For each pair and direction
(A -> B, B -> A) this loads the kept capture of the source setting, applies the what-if keys
that turn the source into the target (``traces/pairs/pairs.json``) with
``retime.replay.whatif`` and measures the replayed trace (``result.to_trace()``) with the
same metric as the captures, :func:`measured_step_ns`. The truth is the median of the
target's repeated captures. Also printed: the error of answering "no change" (the source's
own measured step as the prediction) and the identity replay of the source (the model's
bias without a what-if). A key the engine refuses (``RetimeError``) is that row's result.

Reads only the committed traces (no capture), so it runs anywhere::

    python bench/pairs.py [--pair NAME] [--json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from retime.collectors.errors import RetimeError  # noqa: E402
from retime.collectors.trace import Trace  # noqa: E402

PAIRS = ROOT / "traces" / "pairs"
STEP_PREFIX = "ProfilerStep#"
#: a "change" worth predicting: the measured step moves by more than this
CHANGE = 0.10


def measured_step_ns(trace: Trace) -> float:
    """A capture's step time (ns): the median over its recorded steps of the slowest rank.

    Per rank, step N spans from the start of its ``ProfilerStep#N`` range to the start of
    the rank's next ``ProfilerStep`` range, or, for the rank's last step, to the end of its
    last op. Steps are matched across ranks by N. Applied unchanged to a replayed trace
    (``ReplayResult.to_trace()`` moves the ranges with their ops).
    """
    r = trace.ranges
    names = np.asarray(trace.strings, dtype=object)[r["name_id"].to_numpy()]
    is_step = np.fromiter((isinstance(n, str) and n.startswith(STEP_PREFIX)
                           and n[len(STEP_PREFIX):].isdigit() for n in names), bool, len(names))
    if not is_step.any():
        raise RetimeError("measured_step_ns: the trace has no ProfilerStep#N ranges; capture "
                          "it with torch.profiler's schedule (retime's Capture) so steps are marked")
    rank = r["rank"].to_numpy()[is_step]
    start = r["start_ns"].to_numpy()[is_step]
    num = np.asarray([int(n[len(STEP_PREFIX):]) for n in names[is_step]])
    o = trace.ops
    o_rank = o["rank"].to_numpy()
    o_end = o["start_ns"].to_numpy() + o["dur_ns"].to_numpy()
    worst: dict[int, int] = {}
    for rk in np.unique(rank):
        sel = rank == rk
        first: dict[int, int] = {}
        for n, s in zip(num[sel], start[sel]):
            first[int(n)] = min(first.get(int(n), s), int(s))
        steps = sorted(first, key=first.get)
        last_end = int(o_end[o_rank == rk].max())
        for i, n in enumerate(steps):
            end = first[steps[i + 1]] if i + 1 < len(steps) else last_end
            worst[n] = max(worst.get(n, 0), end - first[n])
    return float(np.median(list(worst.values())))


def job_record(folder: Path) -> dict:
    """The job record (knobs, ``ddp_param_bytes``) examples/pairs/job.py wrote into each
    trace's ``retimeCapture.job`` block (rank 0's file)."""
    files = sorted(folder.glob("rank-*.pt.trace.json.gz"))
    if not files:
        raise RetimeError(f"{folder}: no rank-*.pt.trace.json.gz; is this a capture folder?")
    doc = json.loads(gzip.decompress(files[0].read_bytes()))
    return (doc.get("retimeCapture") or {}).get("job") or {}


def load_capture(folder: Path) -> Trace:
    """Ingest a capture folder and put what retime needs from the job record into
    ``Trace.meta``: ``ddp_param_bytes`` (the gradient sizes, exact) and ``job`` (the knobs)."""
    import retime

    trace = retime.load(str(folder))
    job = job_record(folder)
    if "ddp_param_bytes" in job:
        trace.meta["ddp_param_bytes"] = list(job["ddp_param_bytes"])
    trace.meta["job"] = {k: v for k, v in job.items() if k != "ddp_param_bytes"}
    if "cpu_affinity" not in trace.meta and "hostnames" in trace.meta:
        trace.meta["cpu_affinity"] = kit_affinity(job, trace.meta["hostnames"])
    return trace


def kit_affinity(job: dict, hostnames: dict) -> dict[str, list[int]]:
    """The CPUs each rank of a kit capture ran on, from the kit's placement rule
    (examples/pairs/hosts.py: host k's processes on CPU k; a single host gets both CPUs, one
    rank per CPU). Captures made with the current ``Capture`` record it themselves
    (``cpu_affinity``); the committed pairs predate that."""
    if int(job.get("nhosts", 2)) == 1:
        local: dict[str, int] = {}
        out = {}
        for r in sorted(hostnames, key=int):
            h = hostnames[r]
            out[r] = [local.get(h, 0)]
            local[h] = local.get(h, 0) + 1
        return out
    return {r: [int(str(h).lstrip("host") or 0)] for r, h in hostnames.items()}


def predict(trace: Trace, keys: dict) -> float:
    from retime.replay import whatif

    return measured_step_ns(whatif(trace, dict(keys)).to_trace())


def run_pair(name: str, spec: dict) -> list[dict]:
    """Both directions of one pair: one row each."""
    rows = []
    for src, dst in (("A", "B"), ("B", "A")):
        row: dict = {"pair": name, "direction": f"{src}->{dst}",
                     "keys": spec["whatif"][f"{src}->{dst}"],
                     "measured_ms": spec["median_ns"][dst] / 1e6}
        t0 = time.perf_counter()
        trace = load_capture(PAIRS / name / src)
        source = measured_step_ns(trace)
        row["source_ms"] = source / 1e6
        row["change"] = spec["median_ns"][dst] / source - 1
        row["no_change_err"] = source / spec["median_ns"][dst] - 1
        try:
            row["identity_err"] = predict(trace, {}) / source - 1
        except RetimeError as exc:
            row["identity_err"] = None
            row["identity_refused"] = str(exc)
        try:
            pred = predict(trace, row["keys"])
            row["predicted_ms"] = pred / 1e6
            row["err"] = pred / spec["median_ns"][dst] - 1
        except RetimeError as exc:
            row["predicted_ms"] = row["err"] = None
            row["refused"] = f"{type(exc).__name__}: {exc}"
        row["seconds"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
    return rows


def summary(rows: list[dict]) -> dict:
    errs = [abs(r["err"]) for r in rows if r["err"] is not None]
    big = [r for r in rows if abs(r["change"]) > CHANGE]
    beats = [r for r in big if r["err"] is not None and abs(r["err"]) < abs(r["no_change_err"])]
    nc = [abs(r["no_change_err"]) for r in rows]
    return {"predictions": len(rows), "refused": sum(r["err"] is None for r in rows),
            "within_10pct": sum(e <= 0.10 for e in errs),
            "median_abs_err": statistics.median(errs) if errs else None,
            "changes_over_10pct": len(big), "beats_no_change": len(beats),
            "no_change_within_10pct": sum(e <= 0.10 for e in nc),
            "no_change_median_abs_err": statistics.median(nc) if nc else None}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", action="append", default=None,
                   help="only this pair (repeatable); default: every pair in pairs.json")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    try:
        pairs = json.loads((PAIRS / "pairs.json").read_text())["pairs"]
    except (OSError, ValueError, KeyError) as exc:
        msg = f"{PAIRS / 'pairs.json'}: cannot read the pair index ({exc})"
        print(json.dumps({"error": msg, "exit_code": 2}) if args.json else f"error: {msg}")
        return 2
    names = args.pair or list(pairs)
    unknown = [n for n in names if n not in pairs]
    if unknown:
        msg = f"unknown pair(s) {', '.join(unknown)}; known: {', '.join(pairs)}"
        print(json.dumps({"error": msg, "exit_code": 2}) if args.json else f"error: {msg}")
        return 2
    rows: list[dict] = []
    for n in names:
        rows += run_pair(n, pairs[n])
    s = summary(rows)
    if args.json:
        print(json.dumps({"rows": rows, "summary": s}, indent=1))
        return 0
    hdr = (f"{'pair':<26} {'dir':<5} {'keys':<58} {'source':>8} {'measured':>8} "
           f"{'change':>7} {'predicted':>9} {'error':>7} {'no-change':>9} {'identity':>8}")
    print("step times in ms (median over recorded steps of the slowest rank; measured = "
          "median of the target's captures)")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        keys = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in r["keys"].items())
        pred = "refused" if r["predicted_ms"] is None else f"{r['predicted_ms']:.1f}"
        print(f"{r['pair']:<26} {r['direction']:<5} {keys:<58} {r['source_ms']:8.1f} "
              f"{r['measured_ms']:8.1f} {r['change']:+7.1%} {pred:>9} {_pct(r['err']):>7} "
              f"{r['no_change_err']:+9.1%} {_pct(r['identity_err']):>8}")
        if "refused" in r:
            print(f"{'':<33}refused: {r['refused']}")
    med = "-" if s["median_abs_err"] is None else f"{s['median_abs_err']:.1%}"
    ncmed = "-" if s["no_change_median_abs_err"] is None else f"{s['no_change_median_abs_err']:.1%}"
    print(f"\nsummary: {s['within_10pct']}/{s['predictions']} predictions within 10% "
          f"({s['refused']} refused), median |error| {med}; beats no-change on "
          f"{s['beats_no_change']}/{s['changes_over_10pct']} directions whose measured change "
          f"exceeds 10%; no-change itself: {s['no_change_within_10pct']}/{s['predictions']} "
          f"within 10%, median |error| {ncmed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
