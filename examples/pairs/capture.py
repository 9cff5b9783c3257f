"""Capture the paired-capture suite: the same real job twice, differing in one knob (issue 17).

For each pair (``PAIRS``, defined in ``pair_suite.py``; ``--pair NAME`` to choose) on the two
emulated hosts of ``hosts.py`` (needs root):

1. the machine's load is sampled (``/proc/loadavg``, 3 s of ``/proc/stat``); if other
   processes keep more than ``--quiet`` of the cores busy, it waits up to ``--wait-quiet`` s
   for a quieter moment (the captures run under real-time scheduling either way; the load is
   recorded);
2. one capture of A is run and discarded (warm-up: caches, page cache of the libraries);
3. ``--reps`` captures of each setting, interleaved A B B A A B ... so that a drift of the
   machine hits both alike. Each capture is a fresh launch of ``job.py`` on every host
   (``--settle`` unprofiled steps, then the profiler's wait=1 warmup=1 active=``--active``,
   or the pair's own schedule where it sets one);
   its step time is ``bench/pairs.py``'s :func:`measured_step_ns` (median over the recorded
   steps of the slowest rank), its load what ``job.py`` measured during the profiled steps;
4. for each setting the capture closest to the setting's median is kept and copied to
   ``traces/pairs/<pair>/<A|B>/``; ``traces/pairs/pairs.json`` gets the pair's record (knob,
   settings, the what-if keys that turn A into B and B into A, every capture's step time and
   load, medians, spread = (max - min) / median) and ``traces/pairs/README.md`` its table row;
5. with ``--commit`` the pair is committed at once (git, only those paths).

Run (root; the raw captures go to ``--work``, default bench/out/pairs-work/)::

    python examples/pairs/capture.py --pair mlp-bandwidth --commit
    python examples/pairs/capture.py --all --commit          # every pair, in PAIRS order
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(HERE)]

from hosts import ADDR, VETH, Hosts, burst_bytes  # noqa: E402
from pair_suite import BASE, FROZEN, LATER, PAIRS, stated  # noqa: E402
from pairs import load_capture, measured_step_ns  # noqa: E402

OUT = ROOT / "traces" / "pairs"  # --out changes it (a trial run)
#: a capture's processes are killed after this long (a hung rendezvous, a stuck rank)
CAPTURE_TIMEOUT_S = 300


# ---------------------------------------------------------------------------- machine load
def _stat() -> tuple[float, int, int]:
    f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    v = [int(x) for x in f[:8]]
    return time.monotonic(), sum(v) - v[3] - v[4], sum(v)


def machine_load(seconds: float = 3.0) -> dict:
    """Share of all cores busy over ``seconds`` (nothing of ours runs then) and loadavg."""
    a = _stat()
    time.sleep(seconds)
    b = _stat()
    busy = (b[1] - a[1]) / max(b[2] - a[2], 1)
    return {"busy": round(busy, 3),
            "loadavg": [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]],
            "unix_s": int(time.time())}


# ---------------------------------------------------------------------------- one capture
def job_argv(s: dict, host: int, out: Path, port: int) -> list[str]:
    argv = [sys.executable, str(HERE / "job.py"), "--out", str(out), "--model", s["model"],
            "--batch", str(s["batch"]),
            "--bucket-cap-mb", f"{s['bucket_cap_mb']:g}", "--threads", str(s["threads"]),
            "--nhosts", str(s["nhosts"]), "--nproc-per-host", str(s["nproc_per_host"]),
            "--host-rank", str(host), "--master-addr", ADDR[0], "--master-port", str(port),
            "--ifname", VETH[host], "--settle", str(s["settle"]), "--active", str(s["active"]),
            "--wait", str(s.get("wait", 1)), "--warmup", str(s.get("warmup", 1)),
            "--extra", json.dumps({"rate_mbit": s["rate_mbit"], "speed_pct": s["speed_pct"],
                                   # the link's shaper, for retime's link model
                                   "tbf_burst_bytes": burst_bytes(s["rate_mbit"],
                                                                  s.get("burst_x", 1.0))})]
    if "layers" in s:  # the emb model has no stack of blocks
        argv += ["--layers", str(s["layers"])]
    if s["model"] == "mlp":
        argv += ["--hidden", str(s["hidden"])]
    elif s["model"] == "emb":
        argv += ["--tables", str(s["tables"]), "--rows", str(s["rows"]), "--dim", str(s["dim"]),
                 "--bag", str(s["bag"]), "--dense", str(s["dense"])]
    elif s["model"] == "cnn":
        argv += ["--channels", str(s["channels"]), "--image", str(s["image"])]
    else:
        argv += ["--d-model", str(s["d_model"]), "--seq", str(s["seq"])]
    if s["checkpoint"]:
        argv.append("--checkpoint")
    if s["nhosts"] == 1 and s["nproc_per_host"] > 1:
        argv += ["--cpus", ",".join(str(c) for c in range(s["nproc_per_host"]))]
    return argv


class CaptureFailed(RuntimeError):
    pass


def capture_one(hosts: Hosts, s: dict, out: Path, port: int) -> dict:
    """Run the job on its hosts into ``out``; return the job record + the measured step."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if hosts.rate_mbit != s["rate_mbit"] or hosts.burst_x != s.get("burst_x", 1.0):
        hosts.shape(s["rate_mbit"], burst_x=s.get("burst_x", 1.0))
    hosts.speed(s["speed_pct"])
    # one host alone gets both cores (one rank per core); two hosts one core each
    cpus = ",".join(str(c) for c in range(2)) if s["nhosts"] == 1 else None
    log = out.with_suffix(".log").open("w")
    procs = [subprocess.Popen(hosts.command(h, job_argv(s, h, out, port), cpus=cpus),
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
             for h in range(s["nhosts"])]
    deadline = time.monotonic() + CAPTURE_TIMEOUT_S
    try:
        for p in procs:
            rc = p.wait(timeout=max(deadline - time.monotonic(), 1))
            if rc != 0:
                raise CaptureFailed(f"{out}: a host's job exited with {rc} (log: {log.name})")
    except (subprocess.TimeoutExpired, CaptureFailed) as exc:
        for p in procs:  # our own launches: their session's processes (the ranks)
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        raise CaptureFailed(str(exc)) from exc
    finally:
        log.close()
    rec = json.loads(Path(f"{out}.job.json").read_text())
    trace = load_capture(out)
    rec["step_ns"] = int(measured_step_ns(trace))
    rec["hosts_state"] = hosts.state()
    return rec


# ---------------------------------------------------------------------------- one pair
def run_pair(name: str, hosts: Hosts, args: argparse.Namespace) -> dict:
    model, pair = PAIRS[name]
    settings = {}
    for label, over in (("A", pair.a), ("B", pair.b)):
        # a pair may set its own profiler schedule (settle / wait / warmup / active steps)
        settings[label] = {**BASE[model], "settle": args.settle, "active": args.active, **over}
    before = machine_load()
    waited = 0.0
    while before["busy"] > args.quiet and waited < args.wait_quiet:
        time.sleep(10)
        waited += 10 + 3
        before = machine_load()
    print(f"[{name}] machine before: busy {before['busy']:.0%} of the cores, loadavg "
          f"{before['loadavg']} (waited {waited:.0f} s)", flush=True)
    # the link's achieved TCP rate at each rate the pair uses (a socket test, both directions)
    achieved = {}
    for rate in sorted({settings[lab]["rate_mbit"] for lab in ("A", "B")}):
        hosts.shape(rate, burst_x=settings["A"].get("burst_x", 1.0))
        achieved[rate] = hosts.measure_mbit()
        print(f"[{name}] link at {rate:g} Mbit/s: achieved TCP {achieved[rate]}", flush=True)
    work = args.work / name
    shutil.rmtree(work, ignore_errors=True)
    order = ["A"]  # discarded warm-up
    for r in range(args.reps):
        order += ["A", "B"] if r % 2 == 0 else ["B", "A"]
    reps: dict[str, list] = {"A": [], "B": []}
    port = 29600
    for i, label in enumerate(order):
        warm = i == 0
        out = work / (f"warmup-{label}" if warm else f"{label}-{len(reps[label]):02d}")
        port += 1
        t = time.perf_counter()
        rec = None
        for attempt in range(2):  # one retry: a rendezvous can fail when a port lingers
            try:
                rec = capture_one(hosts, settings[label], out, port + 100 * attempt)
                break
            except CaptureFailed as exc:
                print(f"[{name}]   capture failed: {exc}", flush=True)
        if rec is None:
            raise SystemExit(f"[{name}] captures keep failing; see the logs in {work}")
        row = {"rep": None if warm else len(reps[label]), "order": i, "folder": out.name,
               "step_ns": rec["step_ns"], "load": rec["load"], "load_run": rec["load_run"],
               "settle_ms": rec["settle_ms"]}
        print(f"[{name}] {'warm-up ' if warm else ''}{label}: step {rec['step_ns'] / 1e6:7.1f} ms"
              f"  load foreign {rec['load']['foreign']:.2f} ours {rec['load']['ours']:.2f}"
              f"  ({time.perf_counter() - t:.0f} s)", flush=True)
        if not warm:
            reps[label].append(row)
    after = machine_load()
    rec_pair: dict = {"model": model, "knob": pair.knob, "A": settings["A"], "B": settings["B"],
                      "changed": {k: [settings["A"][k], settings["B"][k]] for k in settings["A"]
                                  if settings["A"][k] != settings["B"][k]},
                      "whatif": {"A->B": pair.a_to_b, "B->A": pair.b_to_a},
                      "achieved_mbit": {lab: min(achieved[settings[lab]["rate_mbit"]].values())
                                        for lab in ("A", "B")},
                      "achieved_mbit_by_direction": {f"{r:g}": v for r, v in achieved.items()},
                      "machine_before": before, "machine_after": after, "reps": reps,
                      "median_ns": {}, "spread": {}, "mad": {}, "kept": {}}
    for label in ("A", "B"):
        steps = [r["step_ns"] for r in reps[label]]
        med = statistics.median(steps)
        keep = min(reps[label], key=lambda r: (abs(r["step_ns"] - med), r["order"]))
        rec_pair["median_ns"][label] = int(med)
        rec_pair["spread"][label] = round((max(steps) - min(steps)) / med, 4)
        rec_pair["mad"][label] = round(statistics.median(abs(x - med) for x in steps) / med, 4)
        rec_pair["kept"][label] = {"rep": keep["rep"], "step_ns": keep["step_ns"]}
        dst = OUT / name / label
        shutil.rmtree(dst, ignore_errors=True)
        dst.mkdir(parents=True)
        for f in sorted((work / keep["folder"]).glob("rank-*.pt.trace.json.gz")):
            shutil.copy2(f, dst / f.name)
    rec_pair["change"] = round(rec_pair["median_ns"]["B"] / rec_pair["median_ns"]["A"] - 1, 4)
    if name in FROZEN:
        rec_pair["after_freeze"] = True
    for batch, names in enumerate(LATER, start=2):
        if name in names:
            rec_pair["after_freeze"] = batch
            rec_pair["frozen_commit"] = args.frozen_commit
    facts = stated(pair, settings["A"], settings["B"])
    if facts:
        rec_pair["stated"] = facts
        rec_pair["stated_why"] = ("facts about the cluster a user states: the nominal rate of "
                                  "the link the trace ran on; each host gives the job one CPU "
                                  "core (examples/pairs/hosts.py pins host k to CPU k); not "
                                  "read from any trace")
    return rec_pair


def save(name: str, rec: dict) -> None:
    idx = OUT / "pairs.json"
    doc = json.loads(idx.read_text()) if idx.is_file() else {}
    doc.setdefault("about", "paired real captures: examples/pairs/capture.py made them; "
                   "traces/pairs/README.md describes the protocol and fields")
    pairs = doc.setdefault("pairs", {})
    pairs[name] = rec
    doc["pairs"] = {n: pairs[n] for n in PAIRS if n in pairs}  # PAIRS order
    idx.write_text(json.dumps(doc, indent=1) + "\n")
    write_table(doc["pairs"])


TABLE_START, TABLE_END = "<!-- pairs-table -->", "<!-- /pairs-table -->"


def write_table(pairs: dict) -> None:
    """The measured table of traces/pairs/README.md (between its markers)."""
    lines = [TABLE_START, "",
             "| pair | A | B | captures | A median ms (spread, MAD) | B median ms (spread, MAD) "
             "| B/A | foreign load A / B (max) | loadavg before |",
             "|---|---|---|---|---|---|---|---|---|"]
    for n, r in pairs.items():
        ch = r["changed"]
        a = ", ".join(f"{k}={v[0]}" for k, v in ch.items())
        b = ", ".join(f"{k}={v[1]}" for k, v in ch.items())
        fo = {lab: max(x["load"]["foreign"] for x in r["reps"][lab]) for lab in ("A", "B")}
        mad = r.get("mad") or {"A": float("nan"), "B": float("nan")}
        med = {lab: f"{r['median_ns'][lab] / 1e6:.1f} ({r['spread'][lab]:.1%}, {mad[lab]:.1%})"
               for lab in ("A", "B")}
        lines.append(
            f"| {n} | {a} | {b} | {len(r['reps']['A'])} + {len(r['reps']['B'])} | {med['A']} | "
            f"{med['B']} | {r['median_ns']['B'] / r['median_ns']['A']:.2f} | "
            f"{fo['A']:.2f} / {fo['B']:.2f} | {r['machine_before']['loadavg'][0]:.1f} |")
    lines += ["", TABLE_END]
    readme = OUT / "README.md"
    text = readme.read_text() if readme.is_file() else f"# Paired captures\n\n{TABLE_START}\n{TABLE_END}\n"
    head, _, rest = text.partition(TABLE_START)
    _, _, tail = rest.partition(TABLE_END)
    readme.write_text(head + "\n".join(lines) + tail)


def commit(name: str, rec: dict) -> None:
    rel = OUT.relative_to(ROOT)
    paths = [str(rel / name), str(rel / "pairs.json"), str(rel / "README.md")]
    msg = (f"pairs: {name} captured ({rec['knob'].split(':')[0].split('(')[0].strip()}; "
           f"A {rec['median_ns']['A'] / 1e6:.1f} ms, B {rec['median_ns']['B'] / 1e6:.1f} ms, "
           f"spread {max(rec['spread'].values()):.1%})")
    subprocess.run(["git", "-C", str(ROOT), "add", "--", *paths], check=True)
    subprocess.run(["git", "-C", str(ROOT), "commit", "-q", "-m", msg, "--", *paths], check=True)


def main(argv: list[str] | None = None) -> int:
    global OUT
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", action="append", default=[], choices=list(PAIRS))
    p.add_argument("--all", action="store_true", help="every pair, in PAIRS order")
    p.add_argument("--reps", type=int, default=5, help="captures per setting (interleaved)")
    p.add_argument("--settle", type=int, default=3)
    p.add_argument("--active", type=int, default=3)
    p.add_argument("--quiet", type=float, default=0.5,
                   help="wait for other processes to use less than this share of the cores")
    p.add_argument("--wait-quiet", type=float, default=60.0, help="...for at most this long (s)")
    p.add_argument("--work", type=Path, default=ROOT / "bench" / "out" / "pairs-work")
    p.add_argument("--out", type=Path, default=OUT, help="where the kept captures go")
    p.add_argument("--commit", action="store_true", help="git commit each pair when captured")
    p.add_argument("--list", action="store_true", help="print the pairs and exit")
    p.add_argument("--frozen-commit", default="",
                   help="the frozen model's commit, recorded with the FROZEN_2 ... FROZEN_10 "
                        "pairs")
    args = p.parse_args(argv)
    OUT = args.out.resolve()
    names = list(PAIRS) if args.all else args.pair
    if args.list or not names:
        for n, (_m, pr) in PAIRS.items():
            print(f"{n:<28} {pr.knob}; A {pr.a} B {pr.b}; keys A->B {pr.a_to_b}")
        return 0
    later = [n for n in names if any(n in b for b in LATER)]
    if later and not args.frozen_commit:
        print(f"capture: {', '.join(later)} are judged after a freeze; give the frozen "
              "model's commit with --frozen-commit SHA", file=sys.stderr)
        return 2
    # a kill (SIGTERM) leaves through the `with` below: the hosts are removed, the slice restored
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with Hosts(rate_mbit=BASE["mlp"]["rate_mbit"]) as hosts:
        for n in names:
            rec = run_pair(n, hosts, args)
            save(n, rec)
            print(f"[{n}] medians A {rec['median_ns']['A'] / 1e6:.1f} ms, B "
                  f"{rec['median_ns']['B'] / 1e6:.1f} ms (B/A {1 + rec['change']:.2f}), spread "
                  f"A {rec['spread']['A']:.1%} B {rec['spread']['B']:.1%}", flush=True)
            if args.commit:
                commit(n, rec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
