"""Synthesizer vs published figures: predicted vs measured, with the error.

Run: ``python bench/synth_validation.py`` (about a minute on 2 cores; ``--quick`` for the
development points only).

Development points (../shared/reference/PUBLISHED.md §1): Megatron-LM 22B iteration times,
Korthikanti et al. 2022 Table 5. The same paper's per-layer forward/backward times of the 22B
model (Table 4) were also looked at while choosing the A100 profile's GEMM parameters, so
they are printed as calibration points. Held-out points (not used for calibration): the
other Table 5 rows (175B on 64 GPUs, 530B and 1T on 280 and 512 GPUs: TP 8, micro-batch 1,
one sequence per GPU per step) and the MFU the paper's abstract reports for 530B on 2240
A100s (54.2% with selective recompute + SP, 42.1% with full recompute; TP 8, PP 35, DP 8,
global batch 2240 assumed). Caveat: only the 22B rows are in PUBLISHED.md; the Table 4/5
values and configurations for the other rows were written down from memory of the paper and
are not verified against it (the abstract's MFU figures are from the MLSys abstract page). Hardware parameters are the built-in
profile; nothing is fitted per data point.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from retime.collectors.synth import synthesize

# (label, model, tp, pp, dp, global batch, micro-batch, recompute, sp, published s, dev?)
ITERATION = [
    ("22B full recompute", "megatron-22b", 8, 1, 1, 4, 4, "full", False, 1.42, True),
    ("22B selective + SP", "megatron-22b", 8, 1, 1, 4, 4, "selective", True, 1.10, True),
    ("175B full recompute", "megatron-175b", 8, 8, 1, 64, 1, "full", False, 18.13, False),
    ("175B selective + SP", "megatron-175b", 8, 8, 1, 64, 1, "selective", True, 13.75, False),
    ("530B full recompute", "megatron-530b", 8, 35, 1, 280, 1, "full", False, 49.05, False),
    ("530B selective + SP", "megatron-530b", 8, 35, 1, 280, 1, "selective", True, 37.83, False),
    ("1T full recompute", "megatron-1t", 8, 64, 1, 512, 1, "full", False, 94.42, False),
    ("1T selective + SP", "megatron-1t", 8, 64, 1, 512, 1, "selective", True, 71.49, False),
]

# (label, model, tp, pp, dp, global batch, recompute, sp, published MFU)
MFU = [("530B/2240 GPUs full", "megatron-530b", 8, 35, 8, 2240, "full", False, 0.421),
       ("530B/2240 GPUs sel. + SP", "megatron-530b", 8, 35, 8, 2240, "selective", True, 0.542)]

# Korthikanti et al. Table 4: 22B, one transformer layer, forward / backward ms
LAYER = [("no recompute", "none", False, 7.7, 11.9), ("SP", "none", True, 7.2, 11.8),
         ("selective", "selective", False, 7.7, 13.2),
         ("selective + SP", "selective", True, 7.2, 13.1),
         ("full recompute", "full", False, 7.7, 19.5)]


def _layer_ms(tr, layer: int) -> tuple[float, float]:
    o = tr.ops
    sel = (o["rank"] == 0) & (o["layer"] == layer)
    out = []
    for ph in (0, 1):
        x = o[sel & (o["phase"] == ph)]
        out.append(((x["start_ns"] + x["dur_ns"]).max() - x["start_ns"].min()) / 1e6)
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hardware", default="a100-80gb")
    ap.add_argument("--quick", action="store_true", help="only the 22B points")
    args = ap.parse_args()
    errs_dev: list[float] = []
    errs_held: list[float] = []
    errs_cal: list[float] = []
    print(f"{'iteration time':28s} {'predicted':>11s} {'published':>10s} {'error':>8s}  MFU    "
          f"peak mem")
    for label, model, tp, pp, dp, gb, mb, rc, sp, pub, dev in ITERATION:
        if args.quick and not dev:
            continue
        t0 = time.perf_counter()
        tr = synthesize(model, args.hardware, tp=tp, pp=pp, dp=dp, global_batch=gb,
                        micro_batch=mb, recompute=rc, sequence_parallel=sp, dtype="fp16",
                        expand="unique", check_memory=False)
        s = tr.meta["synth"]
        pred = s["step_time_ns"] / 1e9
        err = pred / pub - 1
        (errs_dev if dev else errs_held).append(abs(err))
        print(f"{label:28s} {pred:9.3f} s {pub:8.2f} s {100 * err:+7.1f}%  "
              f"{100 * s['mfu']:4.1f}%  {s['peak_memory_bytes'] / 2**30:5.1f} GiB"
              f"{'  (dev)' if dev else ''}  [{time.perf_counter() - t0:.1f}s]")
    if not args.quick:
        print()
        print(f"{'MFU':28s} {'predicted':>11s} {'published':>10s} {'error':>8s}")
        for label, model, tp, pp, dp, gb, rc, sp, pub in MFU:
            tr = synthesize(model, args.hardware, tp=tp, pp=pp, dp=dp, global_batch=gb,
                            micro_batch=1, recompute=rc, sequence_parallel=sp, dtype="fp16",
                            expand="unique", check_memory=False)
            mfu = tr.meta["synth"]["mfu"]
            errs_held.append(abs(mfu / pub - 1))
            print(f"{label:28s} {100 * mfu:9.1f} % {100 * pub:8.1f} % "
                  f"{100 * (mfu / pub - 1):+7.1f}%")
    print()
    print(f"{'22B per layer (Table 4)':28s} {'fwd ms':>8s} {'pub':>6s} {'err':>7s} "
          f"{'bwd ms':>8s} {'pub':>6s} {'err':>7s}")
    for label, rc, sp, pf, pb in LAYER:
        tr = synthesize("megatron-22b", args.hardware, tp=8, pp=1, dp=1, global_batch=4,
                        micro_batch=4, recompute=rc, sequence_parallel=sp, dtype="fp16",
                        check_memory=False)
        f, b = _layer_ms(tr, 24)
        errs_cal += [abs(f / pf - 1), abs(b / pb - 1)]
        print(f"{label:28s} {f:8.2f} {pf:6.1f} {100 * (f / pf - 1):+6.1f}% "
              f"{b:8.2f} {pb:6.1f} {100 * (b / pb - 1):+6.1f}%")
    print()
    line = (f"mean |error|: development points {100 * np.mean(errs_dev):.1f}% "
            f"(max {100 * np.max(errs_dev):.1f}%); per-layer calibration points "
            f"{100 * np.mean(errs_cal):.1f}% (max {100 * np.max(errs_cal):.1f}%)")
    if errs_held:
        line += (f"; held-out points {100 * np.mean(errs_held):.1f}% "
                 f"(max {100 * np.max(errs_held):.1f}%)")
    print(line)


if __name__ == "__main__":
    main()
