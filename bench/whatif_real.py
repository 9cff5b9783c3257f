"""A real what-if check: predict a DDP run with other gradient buckets from a captured one.

Captures a small 2-process CPU DDP job (examples/capture_ddp.py, gloo) with two settings —
the base (one large bucket, ``--base-mb``) and the target (small buckets, ``--target-mb``) —
several times each, interleaved, then predicts the target's step time from each base trace
with the replay engine and the overlap what-if policy (``overlap.bucket_mb`` =
``--target-mb``), and prints measured vs predicted with the error (issue target: within 10%).

When the bucket policy cannot be applied (missing, or it refuses measured traces: today
``overlap.bucket_mb`` re-buckets only synthesized runs, whose per-layer gradient sizes it
knows) the prediction falls back to the identity replay of the base trace ("nothing
changes") and the output says why and what that prediction lacks.

Run-to-run noise is printed next to the error (the spread between repeats of one setting);
on a 2-core machine shared with other work it can exceed the effect being predicted.

Usage::

    python bench/whatif_real.py [--repeats 2] [--hidden 1024] [--layers 6] [--keep DIR]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collectors.errors import RetimeError  # noqa: E402
from collectors.ingest import read  # noqa: E402
from collectors.trace import Trace  # noqa: E402
from replay.engine import replay  # noqa: E402

EXAMPLE = ROOT / "examples" / "capture_ddp.py"


def capture(out: Path, bucket_mb: float, args: argparse.Namespace) -> float:
    """Run the DDP example once with capture; return its wall time in seconds."""
    cmd = [sys.executable, str(EXAMPLE), "--trace-dir", str(out), "--steps",
           str(args.active + 3), "--wait", "1", "--warmup", "1", "--active", str(args.active),
           "--hidden", str(args.hidden), "--layers", str(args.layers), "--batch",
           str(args.batch), "--bucket-cap-mb", str(bucket_mb)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"capture failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t0


def step_ms(trace: Trace, start_ns: np.ndarray, end_ns: np.ndarray) -> float:
    """Median over recorded steps of the slowest rank's step span (ms).

    A rank's step span is first start to last end of its ops attributed to that step
    (``ops.step``, from the ProfilerStep ranges); medians keep one disturbed step of a
    shared machine from dominating.
    """
    o = trace.ops
    step = o["step"].to_numpy()
    rank = o["rank"].to_numpy()
    spans = []
    for s in np.unique(step[step >= 0]):
        worst = 0
        for r in np.unique(rank):
            sel = (step == s) & (rank == r)
            if sel.any():
                worst = max(worst, int(end_ns[sel].max() - start_ns[sel].min()))
        spans.append(worst)
    return float(np.median(spans)) / 1e6 if spans else float("nan")


def per_step_ms(trace: Trace) -> tuple[float, float]:
    """(measured, identity-replayed) median step time in ms."""
    res = replay(trace)
    o = trace.ops
    s = o["start_ns"].to_numpy()
    return step_ms(trace, s, s + o["dur_ns"].to_numpy()), step_ms(trace, res.start_ns, res.end_ns)


def allreduce_stats(trace: Trace) -> tuple[int, float]:
    """(all-reduce instances, mean bytes) from the matched collectives of rank 0."""
    o = trace.ops
    sel = (o["coll_id"].to_numpy() >= 0) & (o["rank"].to_numpy() == 0)
    n = int(np.unique(o["coll_id"].to_numpy()[sel]).size)
    b = o["bytes"].to_numpy()[sel]
    return n, float(b.mean()) if len(b) else 0.0


def predict_ms(trace: Trace, bucket_mib: float) -> tuple[float, str, str | None]:
    """Predicted median step ms with DDP buckets of ``bucket_mib`` MiB, from ``trace``.

    DDP's ``bucket_cap_mb`` counts MiB; the policy's ``overlap.bucket_mb`` counts 10^6
    bytes, so the size is converted. Returns (ms, how, refusal): ``refusal`` is the reason
    the bucket policy could not be applied (then the prediction is the identity replay).
    """
    try:
        from replay.whatif import whatif
    except ImportError as exc:  # a checkout without the what-if layer
        ms = per_step_ms(trace)[1]
        return ms, "identity replay", f"replay.whatif is missing ({exc})"
    try:
        res = whatif(trace, {"overlap.mode": "async",
                             "overlap.bucket_mb": bucket_mib * 2**20 / 1e6})
    except RetimeError as exc:
        return per_step_ms(trace)[1], "identity replay", str(exc)
    sc = res.meta.get("scenario") or [{}]
    info = ", ".join(f"{k} {v}" for k, v in sc[-1].items() if k.startswith("buckets_"))
    return step_ms(res.trace, res.start_ns, res.end_ns), f"whatif overlap.bucket_mb; {info}", None


def _predictions(label: str, traces: list[Trace], bucket_mib: float, truth_ms: float,
                 refusals: set[str]) -> list[float]:
    errs = []
    for i, t in enumerate(traces):
        pred, how, refusal = predict_ms(t, bucket_mib)
        ident = per_step_ms(t)[1]
        if refusal:
            refusals.add(refusal)
        err = (pred - truth_ms) / truth_ms
        errs.append(abs(err))
        print(f"  {label} run {i}: predicted {pred:8.2f} ms/step (identity {ident:8.2f}), "
              f"error {err:+.1%} vs measured mean {truth_ms:.2f}  [{how}]")
    return errs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-mb", type=float, default=100.0, help="base DDP bucket_cap_mb (MiB)")
    p.add_argument("--target-mb", type=float, default=1.0, help="target DDP bucket_cap_mb (MiB)")
    p.add_argument("--repeats", type=int, default=2, help="captures per setting (interleaved)")
    p.add_argument("--active", type=int, default=5, help="recorded steps per capture")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--keep", type=Path, default=None, help="keep the traces in this folder")
    p.add_argument("--reuse", action="store_true",
                   help="with --keep: analyse traces already there instead of capturing again")
    args = p.parse_args(argv)

    work = args.keep or Path(tempfile.mkdtemp(prefix="retime-whatif-"))
    settings = {"base": args.base_mb, "target": args.target_mb}
    measured: dict[str, list[float]] = {k: [] for k in settings}
    traces: dict[str, list[Trace]] = {k: [] for k in settings}
    n_params = args.layers * (args.hidden * args.hidden + args.hidden) + args.hidden + 1
    print(f"model: {args.layers} x Linear({args.hidden}, {args.hidden}) + head, "
          f"{n_params * 4 / 2**20:.1f} MiB of fp32 gradients; 2 ranks, gloo, CPU; "
          f"{args.active} recorded steps per capture")
    for rep in range(args.repeats):
        for name, mb in settings.items():
            out = work / f"{name}-{rep}"
            if args.reuse and out.is_dir():
                wall = float("nan")
            else:
                if out.exists():
                    shutil.rmtree(out)
                wall = capture(out, mb, args)
            t = read(out)
            meas, ident = per_step_ms(t)
            n_ar, mean_b = allreduce_stats(t)
            measured[name].append(meas)
            traces[name].append(t)
            print(f"  captured {name:6s} bucket {mb:g} MiB, run {rep}: {meas:8.2f} ms/step "
                  f"(identity replay {ident:8.2f}; median of steps), {n_ar} all-reduces of {mean_b / 2**20:.2f} "
                  f"MiB mean in the window, capture wall {wall:.1f} s")

    m_base = statistics.mean(measured["base"])
    m_tgt = statistics.mean(measured["target"])
    noise = {k: (max(v) - min(v)) / statistics.mean(v) if len(v) > 1 else float("nan")
             for k, v in measured.items()}
    print(f"\nmeasured base   (bucket {args.base_mb:g} MiB): {m_base:8.2f} ms/step "
          f"(runs {', '.join(f'{x:.2f}' for x in measured['base'])}; spread {noise['base']:.1%})")
    print(f"measured target (bucket {args.target_mb:g} MiB): {m_tgt:8.2f} ms/step "
          f"(runs {', '.join(f'{x:.2f}' for x in measured['target'])}; spread {noise['target']:.1%})")
    print(f"measured change target/base: {m_tgt / m_base:.3f}x")
    refusals: set[str] = set()
    print(f"\npredict target (bucket {args.target_mb:g} MiB) from each base trace:")
    errs = _predictions("base", traces["base"], args.target_mb, m_tgt, refusals)
    print(f"predict base (bucket {args.base_mb:g} MiB) from each target trace (reverse check):")
    rev = _predictions("target", traces["target"], args.base_mb, m_base, refusals)
    print(f"\nmean |error| target from base {statistics.mean(errs):.1%}, base from target "
          f"{statistics.mean(rev):.1%} (target: within 10%); run-to-run spread of the "
          f"measurements {max(noise.values()):.1%}")
    for r in sorted(refusals):
        print(f"NOTE: the bucket what-if was not applied: {r}")
    if refusals:
        print("So those predictions are the identity replay of the input trace ('nothing "
              "changes'): they lack the re-bucketing of the gradient all-reduce.")
    print("NOTE: what the prediction models: each gloo:all_reduce is tied to the c10d call "
          "that issued it and to the training-thread op that waited for it (when the thread "
          "was visibly idle until it ended); re-bucketing re-sizes and re-times the all-reduces "
          "on the trace's own alpha-beta fit. Not modeled: CPU contention between gloo threads "
          "and compute on a small machine (the run-to-run spread above bounds what any "
          "prediction can match on a loaded machine).")
    if args.keep is None:
        print(f"(traces in {work}; pass --keep DIR to choose where)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
