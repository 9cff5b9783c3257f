"""What-if fidelity on real single-GPU pairs (issues 26 and 27): GPU batches G1, G2 and G3.

Every pair in ``examples/gpu_pairs/pairs.json`` (``pairs`` = batch G1, ``pairs_g2`` = batch
G2, ``pairs_g3`` = batch G3, captured after FREEZE-11 and summed apart: G1 and G2 shaped the
model, G3 is held out) is two configurations of ``examples/gpu_pairs/capture.py`` captured on one NVIDIA H200
with plain ``torch.profiler`` (``traces/gpu_pairs/<batch>/<config>/rep{1,2}.pt.trace.json.gz``,
3 profiled steps each). For each pair and direction this goes **through the CLI** exactly as
a user would:

- ``retime ingest`` the source capture (rep1 is the scored source; rep2 is a second source,
  printed as a side column);
- ``retime replay STORE --set K=V ... --json``: the predicted step is the number the CLI
  prints (``step_time_ns.per_step.replayed``) and its range (``step_time_ns.range``);
  exit 2 is a refusal, shown with its one-line reason;
- the truth is what ``retime analyze --json`` prints for the target
  (``step_time_ns.slowest_rank_mean``: the mean over its ProfilerStep windows), averaged over
  the target's two reps; the rep spread is |rep1 - rep2| / their mean.

Also printed: the error of answering "no change" (the source's own analyze step), and, as a
side column only, the unprofiled CUDA-event ratio B/A from ``job.json`` (median of the 10
timed steps each) against the predicted ratio. The profiled traces are what is scored.

Reads only the committed traces (no GPU), so it runs anywhere::

    python bench/gpu_pairs.py [--batch g1|g2|g3|g4] [--pair NAME] [--json]

(G1 and G2 shaped the model; G3 = ``pairs_g3`` and G4 = ``pairs_g4`` were captured after
FREEZE-11 and are summed apart from them.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAIRS_JSON = ROOT / "examples" / "gpu_pairs" / "pairs.json"
TRACES = ROOT / "traces" / "gpu_pairs"
#: batch name -> key in pairs.json; its captures are in traces/gpu_pairs/<batch name>/
BATCHES = {"g1": "pairs", "g2": "pairs_g2", "g3": "pairs_g3", "g4": "pairs_g4",
           "g5": "pairs_g5"}
#: the batches that shaped the model, summed together; later batches are summed apart
IN_SAMPLE = ("g1", "g2")
#: captured after FREEZE-11 (held out from every change before it), summed together
HELD_OUT = ("g3", "g4")
#: captured after FREEZE-12 (the launch-queue waits)
HELD_OUT_12 = ("g5",)
#: what runs without --batch: every batch whose captures are here
DEFAULT_BATCHES = [b for b in BATCHES if (TRACES / b).is_dir()]
#: a what-if is "within" when |error| <= this
WITHIN = 0.10
#: a "change" worth predicting: the measured step moves by more than this
CHANGE = 0.10


class BenchError(Exception):
    """Bad input to the bench (one line, exit 2)."""


def cli(*args: str) -> tuple[int, dict]:
    """Run ``python -m retime ARGS --json`` from this checkout; (exit code, printed JSON)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "retime", *args, "--json"], env=env,
                       capture_output=True, text=True)
    try:
        out = json.loads(p.stdout)
    except ValueError:
        out = {"error": (p.stderr.strip().splitlines() or ["no output"])[-1]}
    return p.returncode, out


class Stores:
    """Ingested stores of the captures, one per (batch, config, rep), made once."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.cache: dict[tuple[str, str, int], Path] = {}
        self.steps: dict[tuple[str, str, int], float] = {}
        #: what ``retime ingest`` reported dropped, per capture (printed, not fatal)
        self.dropped: dict[tuple[str, str, int], dict] = {}

    def store(self, batch: str, config: str, rep: int) -> Path:
        key = (batch, config, rep)
        if key not in self.cache:
            src = TRACES / batch / config / f"rep{rep}.pt.trace.json.gz"
            if not src.is_file():
                raise BenchError(f"{src}: missing capture")
            folder = self.work / f"{batch}-{config}-rep{rep}"
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, folder / src.name)
            out = self.work / f"{batch}-{config}-rep{rep}.retime"
            rc, doc = cli("ingest", str(folder), "-o", str(out))
            if rc != 0:
                raise BenchError(f"{src}: ingest failed ({doc.get('error')})")
            self.dropped[key] = dict(doc.get("dropped") or {})
            self.cache[key] = out
        return self.cache[key]

    def analyze_step_ns(self, batch: str, config: str, rep: int) -> float:
        """The step ``retime analyze`` prints for a capture (slowest rank's mean step)."""
        key = (batch, config, rep)
        if key not in self.steps:
            rc, doc = cli("analyze", str(self.store(*key)))
            if rc != 0:
                raise BenchError(f"{config} rep{rep}: analyze failed ({doc.get('error')})")
            self.steps[key] = float(doc["step_time_ns"]["slowest_rank_mean"])
        return self.steps[key]


def replay(store: Path, keys: list[str]) -> dict:
    """What ``retime replay STORE --set K=V ... --json`` prints: predicted step and range
    (ns per step), or the refusal's one-line reason."""
    args = ["replay", str(store)]
    for k in keys:
        args += ["--set", k]
    rc, doc = cli(*args)
    if rc != 0:
        reason = doc.get("error") or "no reason printed"
        return {"refused": f"exit {rc}: {str(reason).splitlines()[0]}"}
    st = doc["step_time_ns"]
    return {"predicted_ns": float(st["per_step"]["replayed"]),
            "source_replay_base_ns": float(st["per_step"]["measured"]),
            "range_ns": [float(x) for x in st["range"]] if st.get("range") else None}


def unprofiled_ms(batch: str, config: str) -> float | None:
    """Median of the unprofiled CUDA-event step times job.json recorded for a config."""
    try:
        job = json.loads((TRACES / batch / "job.json").read_text())
        ms = job["configs"][config]["unprofiled_step_ms"]
    except (OSError, ValueError, KeyError):
        return None
    return float(statistics.median(ms))


def run_pair(stores: Stores, batch: str, name: str, spec: dict) -> list[dict]:
    rows = []
    for direction, keys in spec["whatif"].items():
        src_side, dst_side = direction.split("->")
        src, dst = spec[src_side], spec[dst_side]
        truth_reps = [stores.analyze_step_ns(batch, dst, r) for r in (1, 2)]
        truth = statistics.fmean(truth_reps)
        source_reps = [stores.analyze_step_ns(batch, src, r) for r in (1, 2)]
        row: dict = {"batch": batch, "pair": name, "direction": direction, "source": src,
                     "target": dst, "keys": list(keys),
                     "source_ms": source_reps[0] / 1e6,
                     "source_rep_spread": abs(source_reps[0] - source_reps[1])
                     / statistics.fmean(source_reps),
                     "measured_ms": truth / 1e6,
                     "measured_reps_ms": [t / 1e6 for t in truth_reps],
                     "measured_rep_spread": abs(truth_reps[0] - truth_reps[1]) / truth,
                     "change": truth / source_reps[0] - 1,
                     "no_change_err": source_reps[0] / truth - 1}
        for rep in (1, 2):
            pre = "" if rep == 1 else "rep2_"
            res = replay(stores.store(batch, src, rep), list(keys))
            if "refused" in res:
                row[pre + "refused"] = res["refused"]
                row[pre + "predicted_ms"] = row[pre + "err"] = None
                continue
            pred = res["predicted_ns"]
            row[pre + "predicted_ms"] = pred / 1e6
            row[pre + "err"] = pred / truth - 1
            if res["range_ns"]:
                lo, hi = res["range_ns"]
                row[pre + "range_ms"] = [lo / 1e6, hi / 1e6]
                row[pre + "in_range"] = bool(lo <= truth <= hi)
            if rep == 1:
                row["predicted_ratio"] = pred / source_reps[0]
        ua, ub = unprofiled_ms(batch, src), unprofiled_ms(batch, dst)
        row["unprofiled_ms"] = [ua, ub]
        row["unprofiled_ratio"] = ub / ua if ua and ub else None
        row["profiled_ratio"] = truth / statistics.fmean(source_reps)
        rows.append(row)
    return rows


def summary(rows: list[dict], pre: str = "") -> dict:
    scored = [r for r in rows if r.get(pre + "err") is not None]
    errs = [abs(r[pre + "err"]) for r in scored]
    big = [r for r in rows if abs(r["change"]) > CHANGE]
    ranged = [r for r in scored if pre + "in_range" in r]
    return {"predictions": len(rows), "refused": len(rows) - len(scored),
            "within_10pct": sum(e <= WITHIN for e in errs),
            "median_abs_err": statistics.median(errs) if errs else None,
            "worst_abs_err": max(errs) if errs else None,
            "in_range": sum(r[pre + "in_range"] for r in ranged), "with_range": len(ranged),
            "closer_than_no_change": sum(abs(r[pre + "err"]) < abs(r["no_change_err"])
                                         for r in scored),
            "changes_over_10pct": len(big),
            "beats_no_change_on_changes": sum(
                r.get(pre + "err") is not None and abs(r[pre + "err"]) < abs(r["no_change_err"])
                for r in big),
            "no_change_within_10pct": sum(abs(r["no_change_err"]) <= WITHIN for r in rows),
            "no_change_median_abs_err": statistics.median(abs(r["no_change_err"]) for r in rows)
            if rows else None}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _yn(r: dict, key: str) -> str:
    return "-" if key not in r else ("yes" if r[key] else "no")


def print_table(rows: list[dict], summ: dict) -> None:
    print("step ms per step, profiled traces (what is scored). source: `retime analyze` of the "
          "source rep1; predicted: `retime replay SOURCE --set ... --json` "
          "(step_time_ns.per_step.replayed) and its range; measured: `retime analyze` of the "
          "target, mean of rep1 and rep2 (spread = |rep1-rep2|/mean); no-chg: error of "
          "answering the source's step; rep2-err: the same what-if from the source's rep2.")
    hdr = (f"{'pair':<15} {'dir':<5} {'source':>7} {'predicted':>9} {'range':>13} "
           f"{'measured':>8} {'spread':>6} {'error':>7} {'<=10%':>5} {'in-rng':>6} "
           f"{'closer':>6} {'no-chg':>7} {'rep2-err':>8} | {'pred B/A':>8} {'unprof B/A':>10}")
    print(hdr)
    print("-" * len(hdr))
    for batch in BATCHES:
        for r in (x for x in rows if x["batch"] == batch):
            pred = "refused" if r["predicted_ms"] is None else f"{r['predicted_ms']:.2f}"
            rng = (f"{r['range_ms'][0]:.1f}-{r['range_ms'][1]:.1f}" if "range_ms" in r else "-")
            err = r["err"]
            within = "-" if err is None else ("yes" if abs(err) <= WITHIN else "no")
            closer = "-" if err is None else (
                "yes" if abs(err) < abs(r["no_change_err"]) else "no")
            pr = r.get("predicted_ratio")
            ur = r.get("unprofiled_ratio")
            print(f"{r['pair']:<15} {r['direction']:<5} {r['source_ms']:7.2f} {pred:>9} "
                  f"{rng:>13} {r['measured_ms']:8.2f} {r['measured_rep_spread']:6.1%} "
                  f"{_pct(err):>7} {within:>5} {_yn(r, 'in_range'):>6} {closer:>6} "
                  f"{r['no_change_err']:+7.1%} {_pct(r.get('rep2_err')):>8} | "
                  f"{('-' if pr is None else f'{pr:.3f}'):>8} "
                  f"{('-' if ur is None else f'{ur:.3f}'):>10}")
            if r.get("refused"):
                print(f"{'':<22}refused: {r['refused']}")
    print("\n(pred B/A: predicted / source step, profiled; unprof B/A: job.json's unprofiled "
          "CUDA-event median, target / source -- a side column, not scored)")
    for g, by in summ.items():
        for label, s in by.items():
            med = "-" if s["median_abs_err"] is None else f"{s['median_abs_err']:.1%}"
            worst = "-" if s["worst_abs_err"] is None else f"{s['worst_abs_err']:.1%}"
            print(f"\n{g} ({label}): {s['within_10pct']}/{s['predictions']} within 10% "
                  f"({s['refused']} refused), median |error| {med}, worst {worst}; measured in "
                  f"range {s['in_range']}/{s['with_range']}; closer than no-change "
                  f"{s['closer_than_no_change']}/{s['predictions'] - s['refused']}; beats "
                  f"no-change on {s['beats_no_change_on_changes']}/{s['changes_over_10pct']} "
                  f"directions whose change exceeds 10%")
        nc = by["source rep1"]
        print(f"{g}, answering no-change: {nc['no_change_within_10pct']}/{nc['predictions']} "
              f"within 10%, median |error| {nc['no_change_median_abs_err']:.1%}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", choices=sorted(BATCHES), action="append", default=None,
                   help="only this batch (repeatable); default: all (g1, g2, g3, g4)")
    p.add_argument("--pair", action="append", default=None, help="only this pair (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--save", metavar="FILE", default=None,
                   help="also write the JSON object (rows and summary) to FILE")
    args = p.parse_args(argv)

    def fail(msg: str) -> int:
        print(json.dumps({"error": msg, "exit_code": 2}) if args.json else f"error: {msg}")
        return 2

    try:
        index = json.loads(PAIRS_JSON.read_text())
        specs = {b: {n: s for n, s in index[k].items() if not n.startswith("_")}
                 for b, k in BATCHES.items()}
    except (OSError, ValueError, KeyError) as exc:
        return fail(f"{PAIRS_JSON}: cannot read the pair index ({exc})")
    batches = args.batch or list(DEFAULT_BATCHES)
    known = {n for b in batches for n in specs[b]}
    unknown = [n for n in (args.pair or []) if n not in known]
    if unknown:
        return fail(f"unknown pair(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    work = Path(tempfile.mkdtemp(prefix="retime-gpu-pairs-"))
    try:
        stores = Stores(work)
        rows: list[dict] = []
        for b in batches:
            for n, spec in specs[b].items():
                if args.pair and n not in args.pair:
                    continue
                rows += run_pair(stores, b, n, spec)
    except BenchError as exc:
        return fail(str(exc))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    groups = {f"batch {b.upper()}": [r for r in rows if r["batch"] == b] for b in batches}
    for name, group in (("G1 + G2", IN_SAMPLE), ("G3 + G4", HELD_OUT)):
        if all(groups.get(f"batch {b.upper()}") for b in group):
            groups[name] = [r for r in rows if r["batch"] in group]
    summ = {g: {"source rep1": summary(rs), "source rep2": summary(rs, "rep2_")}
            for g, rs in groups.items() if rs}
    drops = {f"{b}/{c}/rep{r}": d for (b, c, r), d in stores.dropped.items() if d}
    if args.save:
        Path(args.save).write_text(json.dumps({"rows": rows, "summary": summ, "dropped": drops}, indent=1) + "\n")
    if args.json:
        print(json.dumps({"rows": rows, "summary": summ, "dropped": drops}, indent=1))
    else:
        print_table(rows, summ)
        print(f"\ningest dropped events: {json.dumps(drops) if drops else 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
