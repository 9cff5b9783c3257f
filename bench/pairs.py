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

Which rows shaped what: every pair without ``after_freeze`` in pairs.json shaped the model.
The scheduler-turn cost of a re-bucketed transfer on a one-bucket plain trace
(``cpu_overlap.turn_delay_ns``, 4 turns of Linux's 3 ms default slice for a 2-rank ring) was
chosen after the 12 bucket predictions had been seen (6, 12 and 20 ms were tried on them; 12
ms is also the kit's own SCHED_RR slice times the hand-offs), so those rows judge nothing;
the post-freeze pairs have no bucket change and were not looked at for it.

Three groups are scored apart: the pairs that shaped the model (no ``after_freeze``), the
first post-freeze batch (``after_freeze: true``, frozen at 981b888; two fixes were made after
their predictions were seen, so they shaped it too), and the second (``after_freeze: 2``,
captured after the freeze at the pair's ``frozen_commit``; scored once as frozen, those
figures are the official post-freeze result, in traces/pairs/README.md).

One fix was made after batch 2 had been seen: ``emb-bucket`` A -> B (-30.6% as frozen) replayed
the one 10.0 MB bucket at 3.7 Gbit/s on a 1600 Mbit/s link, an intercept fitted on buckets
that ran two at a time on gloo's two worker threads (``gloo_fit._fit_cpu``: transfers
that ran concurrently now give the link's aggregate rate). That pair is marked
``"shaped_after_freeze": true`` in pairs.json and is scored apart as well: batch 2 is printed
whole (as the code now predicts it), then without the pairs that shaped the model after the
freeze, then those pairs alone.

A third batch (``after_freeze: 3``, frozen at FREEZE-3 ``cc60cda``, the model of main
``da5b91a`` unchanged) was defined after that freeze and captured after its definitions were
committed (traces/pairs/README.md); it is scored apart as well. One fix was made after it had
been seen: ``mlp-batch-32-16`` (+17.9% / -10.0% as frozen: the MLP's host GEMMs at batch 16-32
are bound by reading their weights, and Python / autograd time does not scale with the batch;
``replay/policies/batch_cpu.py``), marked ``shaped_after_freeze`` and printed apart; batch 3
is printed whole (as the code now predicts it), then without it.

A fourth batch (``after_freeze: 4``, frozen at FREEZE-4 ``c945718``, after that fix) is scored
apart too; it was scored once. Its ``emb-batch-64-16`` shaped the model after it was seen
(the embedding's batch from its indices; a parameter-shaped zero-fill keeps its time), so it
is ``shaped_after_freeze``. A fifth batch (``after_freeze: 5``, frozen at FREEZE-5
``4ae6ed3``, after those fixes) was scored once; the only code change after its predictions
were seen made the zero-fill match work under ``retime replay``'s projected read (no figure
changed). A sixth batch (``after_freeze: 6``, frozen at FREEZE-6, after the calibrated
re-bucketing floor that ``emb-bucket-800mbit`` and ``transformer-bucket-1000mbit``'s calibrated
rows shaped: both are ``shaped_after_freeze``) is scored apart as well, and so is a seventh
(``after_freeze: 7``, frozen at the second FREEZE-7 commit, the model of FREEZE-6 unchanged),
an eighth (``after_freeze: 8``, frozen at FREEZE-8, main 7194928's model unchanged) and a
ninth (``after_freeze: 9``, frozen at FREEZE-9, the range-only link bound added).

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


#: the records only retime's pair kit writes (a user's torch.profiler trace has none)
KIT_KEYS = ("retimeCapture",)


def plain_copy(folder: Path, into: Path) -> Path:
    """Copy a capture folder's rank files into ``into`` with every kit record removed: what a
    plain ``torch.profiler`` export of the same run holds (the ``retimeCapture`` block: job
    knobs, ``ddp_param_bytes``, ``cpu_affinity``, the shaped-link declaration, the overlap
    probe). Everything else is byte-for-byte the profiler's."""
    into.mkdir(parents=True, exist_ok=True)
    for f in sorted(folder.glob("rank-*.pt.trace.json.gz")):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        for k in KIT_KEYS:
            doc.pop(k, None)
        (into / f.name).write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))
    return into


_PLAIN_DIR: Path | None = None


def _work_dir() -> Path:
    """This process's folder for the plain copies and calibration files (removed at exit)."""
    global _PLAIN_DIR
    if _PLAIN_DIR is None:
        import atexit
        import shutil
        import tempfile
        _PLAIN_DIR = Path(tempfile.mkdtemp(prefix="retime-plain-pairs-"))
        atexit.register(shutil.rmtree, _PLAIN_DIR, True)
    return _PLAIN_DIR


def calibration_file(folder: Path) -> Path | None:
    """The calibration file ``retime calibrate`` would have written for a capture's setting,
    from what the kit measured before the capture with the same code
    (``retime.collectors.calibrate.overlap_probe``, recorded in the job block): the overlap
    probe only (the kit ran no size sweep). None for captures made without the probe."""
    job = job_record(folder)
    probe = job.get("overlap_probe")
    if not isinstance(probe, dict):
        return None
    from retime.collectors.calibrate import FORMAT

    hosts = list(job.get("hosts") or [])
    cal = {"format": FORMAT, "backend": "gloo", "world_size": int(probe.get("world", 2)),
           "hosts": hosts, "ranks_per_host": max((hosts.count(h) for h in hosts), default=1),
           "collectives": {"all_reduce": []}, "overlap_probe": probe,
           "made_from": f"{folder}: the pair kit's overlap_probe record"}
    out = _work_dir() / f"{folder.parent.name}-{folder.name}.calibration.json"
    out.write_text(json.dumps(cal))
    return out


def load_capture(folder: Path, *, plain: bool = False, calibrated: bool = False) -> Trace:
    """Ingest a capture folder.

    ``plain=True`` ingests a copy with the kit's records stripped (:func:`plain_copy`): the
    trace a user has; with ``calibrated=True`` also the calibration file of its setting
    (:func:`calibration_file`). Otherwise the kit's job record is lifted into ``Trace.meta``:
    ``ddp_param_bytes`` (the gradient sizes, exact) and ``job`` (the knobs, the shaped link,
    the overlap probe) -- for the tests of the kit's own records, not scored by the bench."""
    import retime

    if plain:
        dst = _work_dir() / folder.parent.name / folder.name
        if not dst.exists():
            plain_copy(folder, dst)
        trace = retime.load(str(dst))
        cal = calibration_file(folder) if calibrated else None
        if cal is not None:
            from retime.collectors.calibrate import attach, read_calibration
            trace = attach(trace, read_calibration(cal))
        return trace
    trace = retime.load(str(folder))
    job = job_record(folder)
    if "ddp_param_bytes" in job:
        trace.meta["ddp_param_bytes"] = list(job["ddp_param_bytes"])
    trace.meta["job"] = {k: v for k, v in job.items() if k != "ddp_param_bytes"}
    return trace


def whatif_summary(trace: Trace, keys: dict) -> dict:
    """What ``retime replay --json --set ...`` prints for the what-if (its
    ``step_time_ns.per_step.replayed`` is the step the CLI shows: the slowest rank's mean
    replayed step)."""
    from retime.replay import prediction_range, whatif

    res = whatif(trace, dict(keys))
    prediction_range(res)
    s = res.summary()
    s["whatif"] = res.meta.get("whatif", {})
    rng = s["whatif"].get("step_range_ns")
    if rng:
        s["step_time_ns"]["range"] = list(rng)
    return s


def predict(trace: Trace, keys: dict) -> float:
    """The step the CLI prints for the what-if (``step_time_ns.per_step.replayed``)."""
    return whatif_summary(trace, keys)["step_time_ns"]["per_step"]["replayed"]


def run_pair(name: str, spec: dict, modes: tuple[str, ...] = ("plain", "cal")) -> list[dict]:
    """Both directions of one pair: one row each. For each mode (``plain``: the kit's
    records stripped, what a user has; ``cal``: the same plain trace with the calibration
    file of its setting, :func:`calibration_file`) the prediction is the step the CLI
    prints; ``err`` / ``predicted_ms`` are the plain figures, ``cal_err`` the other."""
    rows = []
    for src, dst in (("A", "B"), ("B", "A")):
        truth = spec["median_ns"][dst]
        keys = dict(spec["whatif"][f"{src}->{dst}"])
        keys.update(spec.get("stated", {}).get(f"{src}->{dst}", {}))
        row: dict = {"pair": name, "direction": f"{src}->{dst}", "keys": keys,
                     "measured_ms": truth / 1e6}
        t0 = time.perf_counter()
        for mode in modes:
            pre = "" if mode == "plain" else f"{mode}_"
            trace = load_capture(PAIRS / name / src, plain=True, calibrated=(mode == "cal"))
            try:
                ident = whatif_summary(trace, {})
                source = ident["step_time_ns"]["per_step"]["measured"]
                row[pre + "identity_err"] = ident["step_time_ns"]["per_step"]["replayed"] \
                    / source - 1
            except RetimeError as exc:
                source = measured_step_ns(trace)
                row[pre + "identity_err"] = None
                row[pre + "identity_refused"] = str(exc)
            if mode == "plain":
                row["source_ms"] = source / 1e6
                row["change"] = truth / source - 1
                row["no_change_err"] = source / truth - 1
            try:
                s = whatif_summary(trace, keys)
                pred = s["step_time_ns"]["per_step"]["replayed"]
                row[pre + "predicted_ms"] = pred / 1e6
                row[pre + "err"] = pred / truth - 1
                rng = s["step_time_ns"].get("range")
                if rng:
                    row[pre + "range_ms"] = [rng[0] / 1e6, rng[1] / 1e6]
                    row[pre + "in_range"] = bool(rng[0] <= truth <= rng[1])
                    row[pre + "half_width"] = (rng[1] - rng[0]) / 2 / pred
            except RetimeError as exc:
                row[pre + "predicted_ms"] = row[pre + "err"] = None
                row[pre + "refused"] = f"{type(exc).__name__}: {exc}"
        row["seconds"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
    return rows


def summary(rows: list[dict], pre: str = "") -> dict:
    """Scores of one mode's predictions (``pre``: "" plain, "cal_" plain + calibration)."""
    errs = [abs(r[pre + "err"]) for r in rows if r.get(pre + "err") is not None]
    big = [r for r in rows if abs(r["change"]) > CHANGE]
    beats = [r for r in big if r.get(pre + "err") is not None
             and abs(r[pre + "err"]) < abs(r["no_change_err"])]
    nc = [abs(r["no_change_err"]) for r in rows]
    ranged = [r for r in rows if pre + "in_range" in r]
    out = {"predictions": len(rows), "refused": sum(r.get(pre + "err") is None for r in rows),
           "within_10pct": sum(e <= 0.10 for e in errs),
           "median_abs_err": statistics.median(errs) if errs else None,
           "worst_abs_err": max(errs) if errs else None,
           "changes_over_10pct": len(big), "beats_no_change": len(beats),
           "no_change_within_10pct": sum(e <= 0.10 for e in nc),
           "no_change_median_abs_err": statistics.median(nc) if nc else None,
           "with_range": len(ranged),
           "in_range": sum(r[pre + "in_range"] for r in ranged),
           "median_half_width": statistics.median(r[pre + "half_width"] for r in ranged)
           if ranged else None}
    return out


def freeze_batch(spec: dict) -> int:
    """Which freeze a pair was captured after (pairs.json ``after_freeze``): 0 for the pairs
    that shaped the model, 1 for the first batch (``true``), 2 for the second, 3 for the
    third, 4 for the fourth, 5 for the fifth, 6 for the sixth, 7 for the seventh, 8 for the
    eighth, 9 for the ninth."""
    return int(spec.get("after_freeze") or 0)


def _batch_label(batch: int, specs: list[dict]) -> str:
    if batch == 0:
        return "pairs that shaped the model"
    if batch == 1:
        return ("batch 1, captured after the first freeze (981b888; the model was changed "
                "after they were seen)")
    commits = sorted({str(s.get("frozen_commit", ""))[:7] for s in specs})
    nth = {2: "second", 3: "third", 4: "fourth", 5: "fifth", 6: "sixth",
           7: "seventh", 8: "eighth", 9: "ninth"}.get(batch, f"#{batch}")
    return f"batch {batch}, captured after the {nth} freeze ({', '.join(commits)})"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", action="append", default=None,
                   help="only this pair (repeatable); default: every pair in pairs.json")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plain-only", action="store_true",
                   help="only the plain-trace predictions (skip the with-calibration column)")
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
    modes = ("plain",) if args.plain_only else ("plain", "cal")
    for n in names:
        rows += run_pair(n, pairs[n], modes)
    groups = {"all": rows}
    by_batch = {b: [r for r in rows if freeze_batch(pairs[r["pair"]]) == b]
                for b in sorted({0, 1, 2} | {freeze_batch(pairs[n]) for n in names})}
    if sum(bool(rs) for rs in by_batch.values()) > 1:
        for b, rs in by_batch.items():
            if rs:
                groups[_batch_label(b, [pairs[r["pair"]] for r in rs])] = rs
        late = [r for r in rows if pairs[r["pair"]].get("shaped_after_freeze")]
        if late:
            for b in sorted({freeze_batch(pairs[r["pair"]]) for r in late}):
                rest = [r for r in by_batch[b]
                        if not pairs[r["pair"]].get("shaped_after_freeze")]
                if rest:
                    groups[f"batch {b} less the pairs fixed after they were seen"] = rest
            groups["pairs fixed after they were seen post-freeze (shaped_after_freeze: "
                   + ", ".join(sorted({r["pair"] for r in late})) + ")"] = late
    summ = {g: {m: summary(rs, "" if m == "plain" else f"{m}_") for m in modes}
            for g, rs in groups.items()}
    if args.json:
        print(json.dumps({"rows": rows, "summary": summ}, indent=1))
        return 0
    hdr = (f"{'pair':<30} {'dir':<5} {'source':>7} {'measured':>8} {'change':>7} "
           f"{'predicted':>9} {'range':>13} {'error':>7} {'cal-err':>7} {'no-change':>9} "
           f"{'identity':>8}")
    print("step times in ms per step. predicted: the step `retime replay --set ...` prints "
          "(slowest rank's mean replayed step) on the PLAIN trace (kit records stripped); "
          "cal-err: the same plain trace with a calibration file (--calibration; the bucket "
          "pairs' settings have one); measured: median of the target's captures")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        pred = "refused" if r["predicted_ms"] is None else f"{r['predicted_ms']:.1f}"
        rng = (f"{r['range_ms'][0]:.0f}-{r['range_ms'][1]:.0f}" if "range_ms" in r else "-")
        print(f"{r['pair']:<30} {r['direction']:<5} {r['source_ms']:7.1f} "
              f"{r['measured_ms']:8.1f} {r['change']:+7.1%} {pred:>9} {rng:>13} "
              f"{_pct(r['err']):>7} {_pct(r.get('cal_err')):>7} {r['no_change_err']:+9.1%} "
              f"{_pct(r['identity_err']):>8}")
        if "refused" in r:
            print(f"{'':<36}refused: {r['refused']}")
    for g, by_mode in summ.items():
        if not by_mode["plain"]["predictions"]:
            continue
        for m, sm in by_mode.items():
            med = "-" if sm["median_abs_err"] is None else f"{sm['median_abs_err']:.1%}"
            worst = "-" if sm["worst_abs_err"] is None else f"{sm['worst_abs_err']:.1%}"
            rng = ("" if not sm["with_range"] else
                   f"; measured inside the range {sm['in_range']}/{sm['with_range']}, median "
                   f"half-width {sm['median_half_width']:.1%}")
            label = "plain traces" if m == "plain" else "plain traces + calibration files"
            print(f"\n{g}, {label}: {sm['within_10pct']}/{sm['predictions']} within 10% "
                  f"({sm['refused']} refused), median |error| {med}, worst {worst}; beats "
                  f"no-change on {sm['beats_no_change']}/{sm['changes_over_10pct']} directions "
                  f"whose change exceeds 10%{rng}")
        ncmed = by_mode["plain"]["no_change_median_abs_err"]
        print(f"{g}, answering no-change: {by_mode['plain']['no_change_within_10pct']}/"
              f"{by_mode['plain']['predictions']} within 10%, median |error| {ncmed:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
