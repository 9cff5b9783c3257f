"""`retime analyze` against a recount from the raw JSON of every shared Kineto trace.

The recount below reads the files with gzip + json and plain Python only (none of the
reader's code): kernels per name (count, total time), communication kernel time, and per
step window the union lengths that make analyze's breakdown (compute, overlapped and
exposed communication, memcpy, host-bound, idle). The windows are the ones analyze reports
(their definition is checked in test_steps.py); everything measured inside them is
recounted here. Every figure must match exactly, in integer nanoseconds.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import KINETO, ingest_cached

from retime.analysis.stream import store_analysis
from retime.cli import run

CASES = {
    "dlrm-v100-8rank": KINETO / "dlrm-v100-8rank",
    "a100-ddp-nccl": KINETO / "a100-ddp-nccl" / "nccl_data.json.gz",
    "v100-ddp-sgd": KINETO / "v100-ddp-sgd" / "df_index_resolver.json.gz",
    "mi300x-resnet-ddp": KINETO / "mi300x-resnet-ddp" / "resnet_act_checkpoint.json.gz",
    "cpu-gloo-rank34": next((KINETO / "cpu-gloo-rank34").glob("*.json.gz")),
    "h100-vgg13": KINETO / "h100-vgg13" / "profiler_vgg13-iter41.json.gz",
    "event-sync-multi": KINETO / "a100-event-sync" / "multi_stream.json.gz",
    "event-sync-single": KINETO / "a100-event-sync" / "single_stream.json.gz",
    "edge-dist-info": KINETO / "edge-cases" / "distributed_info_not_found.json.gz",
    "edge-rank-non-gpu": KINETO / "edge-cases" / "rank_non_gpu.json.gz",
    "edge-rank-not-found": KINETO / "edge-cases" / "rank_not_found.json.gz",
}

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "concurrent kernel"}
HOST_CODE = {**dict.fromkeys(("cuda_runtime", "cuda_driver", "runtime", "driver",
                              "hip_runtime"), 0),
             **dict.fromkeys(("cpu_op", "operator", "python_function", "cpu_instant_event"), 1),
             "user_annotation": 2}
STEP = re.compile(r"^ProfilerStep#\d+$")


def _ns(ts: float, base: int) -> int:
    ti = math.floor(ts)
    return base + int(ti) * 1000 + round((ts - ti) * 1000.0)


def raw_rank(path: Path) -> dict:
    """One file's device and host intervals (ns), straight from the JSON."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    evs = doc["traceEvents"] if isinstance(doc, dict) else doc
    base = int(doc.get("baseTimeNanoseconds") or 0) if isinstance(doc, dict) else 0
    gpu, host = [], []
    for e in evs:
        if e.get("ph") != "X" or e.get("dur") is None:
            continue
        cat = (e.get("cat") or "").lower()
        name = str(e.get("name"))
        s = _ns(e["ts"], base)
        iv = (s, s + max(round(e["dur"] * 1000.0), 0))
        if cat in GPU_CATS:
            kind = ("comm" if cat == "kernel" and name.lower().startswith(("nccl", "rccl"))
                    else "compute" if cat == "kernel" else "mem")
            gpu.append((kind, name, *iv))
        elif cat in HOST_CODE:
            code = 3 if cat == "user_annotation" and name.startswith("gloo:") else HOST_CODE[cat]
            host.append(((e.get("pid"), e.get("tid")), code, name, *iv))
    return {"gpu": gpu, "host": host}


def leaf_host_ops(host: list) -> list:
    """Host events that enclose no other host event of their thread (the reader's ops; gloo
    collectives and runtime calls are ops whatever they enclose)."""
    order = sorted(range(len(host)), key=lambda i: (str(host[i][0]), host[i][3], -host[i][4],
                                                    host[i][1]))
    container = [False] * len(host)
    stack: list[int] = []
    lane = None
    for i in order:
        if host[i][0] != lane:
            stack, lane = [], host[i][0]
        while stack and host[stack[-1]][4] <= host[i][3]:
            stack.pop()
        if stack:
            container[stack[-1]] = True
        stack.append(i)
    return [h for i, h in enumerate(host) if h[1] in (0, 3) or (h[1] == 1 and not container[i])]


def union(iv: list[tuple[int, int]]) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(iv):
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


def recount_window(raw: dict, a: int, b: int) -> dict:
    def clip(iv):
        return [(max(s, a), min(e, b)) for s, e in iv if min(e, b) > max(s, a)]

    if raw["gpu"]:
        C = clip([(s, e) for k, _, s, e in raw["gpu"] if k == "compute"])
        M = clip([(s, e) for k, _, s, e in raw["gpu"] if k == "comm"])
        Y = clip([(s, e) for k, _, s, e in raw["gpu"] if k == "mem"])
        H = clip([(s, e) for _, code, name, s, e in raw["host"]
                  if code != 3 and not STEP.match(name)])
    else:  # a CPU-only rank computes (and talks, gloo) on its host threads
        leaves = leaf_host_ops(raw["host"])
        C = clip([(s, e) for _, code, _, s, e in leaves if code in (0, 1)])
        M = clip([(s, e) for _, code, _, s, e in leaves if code == 3])
        # Python and annotation time outside every op is host work, not idle
        Y = []
        H = clip([(s, e) for _, code, name, s, e in raw["host"]
                  if code != 3 and not STEP.match(name)])
    u_c, u_m, u_cm = union(C), union(M), union(C + M)
    u_cmy = union(C + M + Y)
    u_all = union(C + M + Y + H)
    return {"compute_ns": u_cm - u_m, "overlapped_comm_ns": u_c + u_m - u_cm,
            "exposed_comm_ns": u_cm - u_c, "memcpy_ns": u_cmy - u_cm,
            "host_bound_ns": u_all - u_cmy, "idle_ns": (b - a) - u_all}


@pytest.mark.parametrize("name", sorted(CASES))
def test_analyze_matches_a_recount_of_the_raw_json(name, tmp_path, capsys):
    t = ingest_cached(CASES[name])
    store = t.save(tmp_path / "t.retime")
    raws = {int(s["rank"]): raw_rank(Path(s["path"])) for s in t.meta["sources"]}
    assert run(["analyze", str(store), "--json", "--top", "100000"]) == 0
    out = json.loads(capsys.readouterr().out)
    # kernels: count and total time per name (GPU ops; gloo collectives of CPU-only ranks)
    want: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    comm_ns = 0
    for raw in raws.values():
        dev = [(n, s, e) for _, n, s, e in raw["gpu"]] if raw["gpu"] else [
            (n, s, e) for _, code, n, s, e in leaf_host_ops(raw["host"]) if code == 3]
        for n, s, e in dev:
            want[n][0] += 1
            want[n][1] += e - s
        comm_ns += sum(e - s for k, _, s, e in raw["gpu"] if k == "comm")
        if not raw["gpu"]:
            comm_ns += sum(e - s for _, s, e in dev)
    got = {r["name"]: [r["count"], r["total_ns"]] for r in out["top_ops"]}
    assert got == dict(want)
    assert sum(r["total_ns"] for r in out["top_ops"]
               if r["kernel_class"] == "communication") == comm_ns
    # the breakdown of every step window, recounted
    bd = store_analysis(store, stream=False)["breakdown"]
    totals: dict[str, int] = defaultdict(int)
    for row in bd.itertuples():
        rc = recount_window(raws[int(row.rank)], int(row.start_ns), int(row.end_ns))
        assert {k: int(getattr(row, k)) for k in rc} == rc, (row.rank, row.step)
        for k, v in rc.items():
            totals[k] += v
    assert {k: out["breakdown"]["total_ns"][k] for k in totals} == dict(totals)
