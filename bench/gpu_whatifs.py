"""GPU what-ifs on the shared GPU traces, with each result's breakdown and ``assumed:`` lines.

Run: ``PYTHONPATH=. python bench/gpu_whatifs.py [--json] [--trace NAME ...]`` (minutes on a
loaded machine: one ingest per trace, one replay per what-if).

For each shared GPU trace (kineto and nsys) it replays the identity and each what-if of
:data:`WHATIFS` (``hardware.gpu``, ``parallel.micro_batch`` x2 and /2, ``parallel.tp=2``,
``overlap.bucket_mb`` 1 and 100, ``network.intra_node_gbps`` at the trace's GPU's nominal
NVLink / Infinity Fabric rate /4 and x4) and prints the step time before and after, where the
replayed time goes (per rank: ``kern`` compute kernels, memsets and copies; ``comm``
collective and p2p kernels; ``host`` CPU operators and runtime calls, the sum of their replayed
durations, which a GPU change must leave alone; ``wait`` the host's blocking
``*Synchronize`` calls, which wait for the GPU and so move with it) and the what-if's ``assumed:`` lines. A
refused what-if prints its one-line reason. ``checks`` flags what breaks physics by hand: a
faster GPU (every FP32 / TF32 / FP16 / BF16 peak PyTorch can use and HBM at
least the measured GPU's) replayed slower, a bigger batch replayed faster per step,
host time moved by a GPU swap, a faster network replayed slower. It prints; nothing is
asserted (the closed-form checks live in tests/).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"

#: trace name -> (path under shared/traces, measured GPU profile, its nominal intra-node rate
#: in GB/s per GPU per direction: V100 NVLink2 150, A100 NVLink3 300, H100 NVLink4 450,
#: MI300X Infinity Fabric 7 x 64 = 448; datasheet figures, only to set the /4 and x4 values)
TRACES = {
    "dlrm-v100-8rank": ("kineto/dlrm-v100-8rank", "v100-sxm2", 150.0),
    "a100-ddp-nccl": ("kineto/a100-ddp-nccl/nccl_data.json.gz", "a100-40gb", 300.0),
    "v100-ddp-sgd": ("kineto/v100-ddp-sgd/df_index_resolver.json.gz", "v100-sxm2", 150.0),
    "mi300x-resnet-ddp": ("kineto/mi300x-resnet-ddp/resnet_act_checkpoint.json.gz", "mi300x",
                          448.0),
    "h100-vgg13": ("kineto/h100-vgg13/profiler_vgg13-iter41.json.gz", "h100-sxm", 450.0),
    "h100-2gpu-fastvideo": ("nsys/h100-2gpu-fastvideo.sqlite", "h100-sxm", 450.0),
}

#: traces whose file names no GPU (the nsys export has no TARGET_INFO_GPU table): the what-ifs
#: on them pass ``hardware.from_gpu`` from the traces' README ("H100 class")
FROM_GPU = {"h100-2gpu-fastvideo": "h100-sxm"}

GPUS = ("v100-sxm2", "a100-80gb", "h100-sxm", "b200", "mi300x")


def whatifs(name: str) -> list[tuple[str, object]]:
    """(key, value) pairs replayed on trace ``name``; micro_batch ones are resolved against
    the trace's batch later (``"x2"``, ``"/2"``)."""
    _, _, nominal = TRACES[name]
    out: list[tuple[str, object]] = [("hardware.gpu", g) for g in GPUS]
    out += [("parallel.micro_batch", "x2"), ("parallel.micro_batch", "/2"),
            ("parallel.tp", 2), ("overlap.bucket_mb", 1), ("overlap.bucket_mb", 100),
            ("network.intra_node_gbps", nominal / 4), ("network.intra_node_gbps", nominal * 4)]
    return out


def _path(rel: str) -> Path:
    for base in (SHARED, Path("/work/shared/traces")):
        if (base / rel).exists():
            return base / rel
    raise FileNotFoundError(f"{rel} not found under {SHARED}")


def breakdown(r) -> dict:
    """Per-rank mean replayed time (ms) of compute kernels, communication kernels and host
    calls (sums of durations, not the critical path)."""
    from retime.collectors.enums import OpKind
    ops = r.trace.ops
    kind = ops["kind"].to_numpy()
    dur = np.asarray(r.dur_ns, dtype=np.float64)
    nr = max(int(ops["rank"].nunique()), 1) if "rank" in ops else 1
    kern = np.isin(kind, (OpKind.KERNEL, OpKind.MEMSET, OpKind.MEMCPY))
    comm = np.isin(kind, (OpKind.COLLECTIVE, OpKind.P2P))
    host = np.isin(kind, (OpKind.CPU_OP, OpKind.RUNTIME))
    names = np.asarray(r.trace.strings, dtype=object)[ops["name_id"].to_numpy()].astype(str)
    wait = host & (np.char.find(names, "ynchronize") >= 0)
    return {k: float(dur[m].sum()) / nr / 1e6 for k, m in
            (("kern", kern), ("comm", comm), ("host", host & ~wait), ("wait", wait))}


def _batch(trace) -> int | str:
    """The trace's per-rank batch, or why it has none (the policy's own refusal)."""
    from retime.replay.policies.batch_measured import measured_batch
    try:
        return int(measured_batch(trace))
    except Exception as e:  # noqa: BLE001 - a trace without a batch prints the reason
        return str(e).splitlines()[0] or type(e).__name__


def run_trace(name: str) -> dict:
    from retime import whatif
    from retime.collectors.errors import PolicyError
    from retime.collectors.ingest import read
    rel, gpu, _ = TRACES[name]
    p = _path(rel)
    tr = read(sorted(p.glob("*.json.gz")) if p.is_dir() else [p])
    base = whatif(tr)
    b0 = breakdown(base)
    rows = []
    for key, val in whatifs(name):
        if key == "parallel.micro_batch":
            b = _batch(tr)
            if isinstance(b, str):
                rows.append({"key": key, "value": val, "error": b})
                continue
            val = b * 2 if val == "x2" else max(b // 2, 1)
        sc = {key: val}
        if key == "hardware.gpu" and name in FROM_GPU:
            sc["hardware.from_gpu"] = FROM_GPU[name]
        try:
            r = whatif(tr, sc)
        except (PolicyError, ValueError) as e:
            rows.append({"key": key, "value": val, "error": str(e).splitlines()[0]})
            continue
        w = r.meta.get("whatif", {})
        rows.append({"key": key, "value": val, "step_ms": r.step_time_ns / 1e6,
                     "range_ms": [x / 1e6 for x in w.get("step_range_ns", [])] or None,
                     **breakdown(r), "assumed": list(w.get("assumed", []))})
    b = _batch(tr)
    return {"trace": name, "gpu": gpu, "batch": b if isinstance(b, int) else None, "step_ms": base.step_time_ns / 1e6,
            **b0, "rows": rows, "checks": checks(gpu, b0, base.step_time_ns / 1e6, rows)}


def checks(gpu: str, b0: dict, step0: float, rows: list[dict]) -> list[str]:
    """Hand-physics flags (see the module's docstring)."""
    from retime.collectors.costs.gpus import gpu_spec
    out = []
    s0 = gpu_spec(gpu)
    for r in rows:
        if "error" in r:
            continue
        k, v = r["key"], r["value"]
        if k == "hardware.gpu":
            s = gpu_spec(v)
            if abs(r["host"] - b0["host"]) > 1e-3 * max(b0["host"], 1e-9) + 1e-3:
                out.append(f"{k}={v}: host {b0['host']:.2f} -> {r['host']:.2f} ms moved")
            faster = all(_peak(s, d) >= _peak(s0, d) for d in _DTYPES) and _hbm(s) >= _hbm(s0)
            if faster and r["step_ms"] > step0 * 1.001:
                out.append(f"{k}={v}: faster GPU replayed slower {step0:.2f} -> "
                           f"{r['step_ms']:.2f} ms")
        if k == "network.intra_node_gbps" and v > 400 and r["comm"] > b0["comm"] * 1.001:
            out.append(f"{k}={v}: faster network, comm {b0['comm']:.2f} -> {r['comm']:.2f} ms")
    mb = [r for r in rows if r["key"] == "parallel.micro_batch" and "error" not in r]
    mb.sort(key=lambda r: r["value"])
    for a, b in zip(mb, mb[1:]):
        if b["step_ms"] < a["step_ms"]:
            out.append(f"micro_batch {a['value']} -> {b['value']}: bigger batch faster")
    return out


_DTYPES = ("fp32", "tf32", "fp16", "bf16")


def _peak(s, dtype: str) -> float:
    """Datasheet peak of ``dtype`` on spec ``s`` as PyTorch can use it: TF32 is FP32 on a
    GPU without TF32 units PyTorch's switches use (V100, AMD); a missing bf16 is fp16's."""
    from retime.replay.policies.math_modes import tf32_capable
    p = s.hw.peak_tflops
    if dtype == "tf32" and not tf32_capable(s):
        dtype = "fp32"
    if dtype == "bf16" and dtype not in p:
        dtype = "fp16"
    return float(p.get(dtype, 0.0))


def _hbm(s) -> float:
    return float(s.hw.hbm_gbps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--trace", nargs="*", default=list(TRACES), choices=list(TRACES))
    a = ap.parse_args(argv)
    for name in a.trace:
        rep = run_trace(name)
        if a.json:
            print(json.dumps(rep))
            continue
        print(f"{name} ({rep['gpu']}, batch {rep['batch']}): step {rep['step_ms']:.2f} ms "
              f"kern {rep['kern']:.2f} comm {rep['comm']:.2f} host {rep['host']:.2f} "
              f"wait {rep['wait']:.2f}")
        for r in rep["rows"]:
            kv = f"{r['key']}={r['value']:g}" if isinstance(r["value"], float) else \
                f"{r['key']}={r['value']}"
            if "error" in r:
                print(f"  {kv:<34} refused: {r['error'][:150]}")
                continue
            rng = "" if not r["range_ms"] else f" [{r['range_ms'][0]:.2f}-{r['range_ms'][1]:.2f}]"
            print(f"  {kv:<34} {rep['step_ms']:8.2f} -> {r['step_ms']:8.2f} ms{rng}  "
                  f"kern {r['kern']:.2f} comm {r['comm']:.2f} host {r['host']:.2f} "
                  f"wait {r['wait']:.2f}")
            for line in r["assumed"]:
                print(f"      assumed: {line[:200]}")
        for c in rep["checks"]:
            print(f"  CHECK: {c}")
        print(flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
