"""Speed and memory of ``synthesize`` on large 3D-parallel jobs.

Run: ``python bench/synth_speed.py``. Each case runs in a fresh process (after a JIT
warm-up there) and reports wall time of ``synthesize`` (model -> scheduled Trace, not
saving), ops, edges and the process's peak RSS. ``expand="all"`` materializes every rank;
``expand="unique"`` one representative rank per pipeline stage (identical ranks share one
timeline; ``meta["synth"]["rank_classes"]`` maps them).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

# (label, model, tp, pp, dp, global batch, micro-batch, schedule, chunks, expand)
CASES = [
    ("GPT-3 175B, 1024 GPUs, m=16", "gpt3-175b", 8, 8, 16, 256, 1, "1f1b", 1, "all"),
    ("GPT-3 175B, 1024 GPUs, m=16, interleaved v=2", "gpt3-175b", 8, 8, 16, 256, 1,
     "interleaved", 2, "all"),
    ("Llama-2 70B, 1024 GPUs, m=8", "llama2-70b", 8, 4, 32, 256, 1, "1f1b", 1, "all"),
    ("GPT-3 175B, 1024 GPUs, m=96", "gpt3-175b", 8, 8, 16, 1536, 1, "1f1b", 1, "unique"),
    ("GPT-3 175B, 8192 GPUs, m=96", "gpt3-175b", 8, 8, 128, 12288, 1, "1f1b", 1, "unique"),
    ("Llama-3 405B, 16416 GPUs, m=18", "llama3-405b", 8, 9, 228, 4104, 1, "interleaved", 2,
     "unique"),
    ("Llama-3 405B, 131040 GPUs, m=18", "llama3-405b", 8, 9, 1820, 32760, 1, "interleaved",
     2, "unique"),
    # mixture of experts: the DeepSeek-V3 layout (EP 64, FP8)
    ("DeepSeek-V3, 2048 GPUs, EP 64, m=120", "deepseek-v3", 1, 16, 128, 15360, 1, "1f1b", 1,
     "auto"),
    ("DeepSeek-V3, 2048 GPUs, EP 64, DualPipe", "deepseek-v3", 1, 16, 128, 15360, 1,
     "dualpipe", 1, "auto"),
]


def _one(i: int) -> dict:
    from retime.collectors.synth import synthesize

    label, model, tp, pp, dp, gb, mb, sched, v, expand = CASES[i]
    synthesize("gpt3-125m", "h100-sxm", tp=1, pp=2, dp=1, global_batch=2, micro_batch=1)
    t0 = time.perf_counter()
    moe = model == "deepseek-v3"
    extra = dict(ep=64, dtype="fp8") if moe else dict(sequence_parallel=True)
    tr = synthesize(model, "h100-sxm", tp=tp, pp=pp, dp=dp, global_batch=gb, micro_batch=mb,
                    schedule=sched, chunks=v, recompute="selective", expand=expand,
                    max_ops=12_000_000 if expand == "auto" else 10**9, check_memory=False,
                    **extra)
    dt = time.perf_counter() - t0
    s = tr.meta["synth"]
    return {"label": label, "seconds": dt, "ops": tr.n_ops, "edges": len(tr.edges),
            "world_size": s["world_size"], "ranks_emitted": s["ranks_emitted"],
            "step_time_s": s["step_time_ns"] / 1e9, "mfu": s["mfu"],
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case is not None:
        print(json.dumps(_one(args.case)))
        return
    print(f"{'case':48s} {'GPUs':>7s} {'ranks':>6s} {'ops':>11s} {'edges':>11s} "
          f"{'time':>7s} {'RSS':>8s}  step / MFU")
    for i in range(len(CASES)):
        p = subprocess.run([sys.executable, __file__, "--case", str(i)], capture_output=True,
                           text=True)
        if p.returncode:
            print(f"{CASES[i][0]:48s} failed: {p.stderr.strip().splitlines()[-1]}")
            continue
        r = json.loads(p.stdout)
        print(f"{r['label']:48s} {r['world_size']:7d} {r['ranks_emitted']:6d} {r['ops']:11,d} "
              f"{r['edges']:11,d} {r['seconds']:6.2f}s {r['peak_rss_gib']:6.2f}GiB  "
              f"{r['step_time_s']:.2f} s / {100 * r['mfu']:.1f}%")


if __name__ == "__main__":
    main()
