"""Parse bench: CPU time of parsing one Kineto rank (54.6 MB, bench/scale.py's rank file),
per stage, and against another checkout in interleaved fresh processes.

    python bench/parse_rank.py [--baseline CHECKOUT] [--pairs P] [--repeat R] [--file F]

Each parse reads the file as ``retime ingest``'s worker processes do (mapped, where the
checkout has ``parse_kineto_file(mapped=)``).
Each measurement is a fresh process of one checkout (numba's cache warm: one parse first),
``R`` parses, the median CPU time (``time.process_time``: on a shared machine CPU time moves
less with other load than wall time). With ``--baseline``, ours and the baseline's processes
alternate ``P`` times and the bench prints each pair's ratio and their median. Then the
stages of our parse (median over ``R`` parses): the scanner kernel, the block step (rows ->
column parts, decoding the events kept whole), the concatenation, the dependency assembly
and its largest parts, for ours and the baseline; "other" is the rest (reading the file,
mostly). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import collections, functools, statistics, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from collectors.kineto.reader import parse_kineto_file
path, repeat, stages = Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
acc = collections.Counter()
if stages:
    import collectors.kineto.scan as S, collectors.kineto.links as L, collectors.kineto.assemble as A
    import collectors.kineto._scan_kernels as K
    def wrap(mod, name, label):
        f = getattr(mod, name)
        @functools.wraps(f)
        def w(*a, **k):
            t0 = time.process_time()
            try:
                return f(*a, **k)
            finally:
                acc[label] += time.process_time() - t0
        setattr(mod, name, w)
    wrap(K, "scan_events", "scanner kernel")
    wrap(S._Reader, "block", "block: rows -> column parts (total)")
    wrap(S, "_decode_events", "block: decode events kept whole (msgspec)")
    wrap(L.EventLoop, "finish", "concatenate parts")
    wrap(L, "assemble", "assemble: lanes, ops, edges (total)")
    for n in ("sync_edges", "comm_info", "attribute", "_lane_key_ids", "_comm_blocks"):
        wrap(A, n, "assemble: " + n)
import inspect
# as ingest's workers read (mapped), where this checkout has it
kw = {"mapped": True} if "mapped" in inspect.signature(parse_kineto_file).parameters else {}
parse_kineto_file(path, **kw)
runs = []
for _ in range(repeat):
    acc.clear()
    t0 = time.process_time()
    parse_kineto_file(path, **kw)
    runs.append((time.process_time() - t0, dict(acc)))
tot = statistics.median(r[0] for r in runs)
print(f"TOTAL {tot * 1000:.2f}")
for k in sorted({k for _, d in runs for k in d}):
    print(f"{k}\t{statistics.median(d.get(k, 0.0) for _, d in runs) * 1000:.2f}")
"""


def measure(root: Path, path: Path, repeat: int, stages: bool = False) -> tuple[float, dict]:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(root), str(path), str(repeat),
                          "1" if stages else "0"], capture_output=True, text=True, cwd=root)
    if out.returncode:
        raise SystemExit(f"{root}: parse failed: {out.stderr.strip().splitlines()[-1:]}")
    lines = out.stdout.strip().splitlines()
    total = float(lines[0].split()[1])
    return total, {k: float(v) for k, v in (ln.split("\t") for ln in lines[1:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, default=None, help="another retime checkout")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--file", type=Path, default=None,
                    help="a Kineto file (default: rank 1 of bench/scale.py's generated set)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="retime-parse-") as tmp:
        path = a.file
        if path is None:
            sys.path.insert(0, str(ROOT / "bench"))
            from scale import generate

            generate(Path(tmp), 2)
            path = Path(tmp) / "rank-1.json"
        print(f"file {path} ({path.stat().st_size / 1e6:.1f} MB); CPU ms per parse, median of "
              f"{a.repeat} per process", flush=True)
        if a.baseline is not None:
            ours, base = [], []
            for k in range(a.pairs):
                for root in ((ROOT, a.baseline) if k % 2 == 0 else (a.baseline, ROOT)):
                    (ours if root == ROOT else base).append(measure(root, path, a.repeat)[0])
            ratio = [o / b for o, b in zip(ours, base, strict=True)]
            print(f"  ours     {' '.join(f'{x:6.1f}' for x in ours)}  median "
                  f"{statistics.median(ours):.1f}")
            print(f"  baseline {' '.join(f'{x:6.1f}' for x in base)}  median "
                  f"{statistics.median(base):.1f}")
            print(f"  ours / baseline per pair {' '.join(f'{x:.3f}' for x in ratio)}; median "
                  f"{statistics.median(ratio):.3f} ({1 / statistics.median(ratio):.2f}x faster)")
        roots = [("ours", ROOT)] + ([("baseline", a.baseline)] if a.baseline else [])
        got = {name: measure(root, path, a.repeat, stages=True) for name, root in roots}
        print("stages (one process each, medians of the parses; nested stages indented), ms: "
              + " / ".join(f"{name} total {t:.1f}" for name, (t, _) in got.items()))
        keys = sorted({k for _, st in got.values() for k in st}, key=lambda k: -got["ours"][1].get(k, 0))
        rest = {name: t - sum(v for k, v in st.items() if k.endswith("(total)") or ":" not in k)
                for name, (t, st) in got.items()}
        for k in keys:
            pad = "    " if ":" in k and not k.endswith("(total)") else "  "
            print(f"{pad}{k:<48} " + " / ".join(f"{st.get(k, 0.0):6.1f}" for _, st in got.values()))
        print(f"  {'other (reading the file, carry, setup)':<48} "
              + " / ".join(f"{v:6.1f}" for v in rest.values()))

if __name__ == "__main__":
    main()
