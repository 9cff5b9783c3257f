"""Start-up as a user feels it: whole commands in fresh processes, CPU time of each.

Prints, next to the targets of issue 19:

1. ``retime --help`` (target < 0.3 s CPU): the CLI imports typer and its own light modules.
2. The first ``retime demo`` after a fresh install (target < 15 s CPU on 2 cores): numba's
   cache is pointed at an empty folder (``NUMBA_CACHE_DIR``), so every kernel the demo uses
   compiles, as on a new machine; then a later run with that cache (target < 5 s CPU).
3. ``retime ingest`` of the largest shared Kineto trace (v100-ddp-sgd, 216k events) as a
   whole process, warm numba cache, against HolisticTraceAnalysis' ``TraceAnalysis`` on the
   same file as a whole process (target: 5x faster). HTA is installed only for benchmarks
   (``pip install holistictraceanalysis``); without it that row says so.

CPU time is user + system of the child processes (``resource.getrusage``), so a busy machine
inflates wall time more than these figures; each figure is the minimum over ``--repeat``
runs. Never asserts timings.

    python bench/startup.py [--repeat 3] [--skip-hta]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LARGEST = ROOT.parent / "shared" / "traces" / "kineto" / "v100-ddp-sgd"


def _retime() -> list[str]:
    exe = shutil.which("retime", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                       os.environ.get("PATH", "")]))
    return [exe] if exe else [sys.executable, "-m", "retime"]


def cpu_of(cmd: list[str], env: dict | None = None, cwd: str | None = None) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one child process running ``cmd``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-800:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def row(what: str, cpu: float, wall: float, target: str) -> None:
    print(f"{what:<58s} {cpu:7.2f} s CPU {wall:7.2f} s wall   target {target}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-hta", action="store_true")
    a = ap.parse_args()
    rt = _retime()
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; retime = "
          f"{' '.join(rt)}")

    best = min(cpu_of([*rt, "--help"]) for _ in range(max(a.repeat, 3)))
    row("retime --help", *best, "< 0.3 s CPU")

    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, NUMBA_CACHE_DIR=str(Path(tmp) / "numba-cache"),
                   RETIME_PROGRESS="0")
        cold = cpu_of([*rt, "demo", "-o", str(Path(tmp) / "d0")], env=env)
        row("first retime demo (empty numba cache: compiles)", *cold, "< 15 s CPU")
        warm = min(cpu_of([*rt, "demo", "-o", str(Path(tmp) / f"d{i + 1}")], env=env)
                   for i in range(a.repeat))
        row("later retime demo (cached kernels)", *warm, "< 5 s CPU")

        # ingest: warm the cache for this file first (the scanner compiles on first use)
        cpu_of([*rt, "ingest", str(LARGEST), "-o", str(Path(tmp) / "w.retime")], env=env)
        ing = min(cpu_of([*rt, "ingest", str(LARGEST), "-o", str(Path(tmp) / f"i{i}.retime")],
                         env=env) for i in range(a.repeat))
        row(f"retime ingest {LARGEST.name} (whole process)", *ing, "5x HTA")
        if a.skip_hta:
            return
        hta_dir = Path(tmp) / "hta"
        hta_dir.mkdir()
        for f in LARGEST.glob("*.json.gz"):
            shutil.copy(f, hta_dir / f.name)
        code = ("from hta.trace_analysis import TraceAnalysis; "
                f"TraceAnalysis(trace_dir={str(hta_dir)!r})")
        try:
            hta = min(cpu_of([sys.executable, "-c", code]) for _ in range(a.repeat))
        except SystemExit as exc:
            print(f"HTA: not run ({str(exc)[:200]}); pip install holistictraceanalysis")
            return
        row("HTA TraceAnalysis, same file (whole process)", *hta, "")
        print(f"retime ingest is {hta[0] / ing[0]:.1f}x faster than HTA in CPU time "
              f"({hta[1] / ing[1]:.1f}x wall); target 5x")


if __name__ == "__main__":
    main()
