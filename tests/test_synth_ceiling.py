"""The synthesizer's / ``cost op --training``'s GEMM ceiling never exceeds a published maximum
achievable matmul rate (collectors/costs/REFERENCES.md K1, K5, K28, K30): by table, every
built-in profile x dtype against every published row for it; no timings."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from retime.collectors.costs.gpus import gpu_names, gpu_spec
from retime.collectors.synth.costs import _ceiling, gemm
from retime.collectors.synth.hardware import load_hardware

KDATA = Path(__file__).resolve().parents[1] / "bench" / "data" / "kernel_published.toml"


def _published() -> dict[tuple[str, str], list[tuple[float, str]]]:
    """(profile, dtype) -> [(published MAMF TFLOP/s, reference id)]: Stas Bekman's tables
    (bench/data/kernel_published.toml ``[[mamf]]``: K1, K28, K30) plus each profile's own
    ``[published] mamf_tflops`` (K1, K3, K4, K5, K6, K20, K28). A 16-bit row counts for
    both fp16 and bf16 (the same tensor-core rate)."""
    out: dict[tuple[str, str], list[tuple[float, str]]] = {}
    with open(KDATA, "rb") as fh:
        tables = tomllib.load(fh)["mamf"]
    for t in tables:
        for name, dtype, v, _what in t["rows"]:
            for d in ("fp16", "bf16") if dtype in ("fp16", "bf16") else (dtype,):
                out.setdefault((name, d), []).append((float(v), t["id"]))
    for name in gpu_names():
        for d, v in gpu_spec(name).mamf_tflops.items():
            out.setdefault((name, d), []).append((float(v), f"{name}.toml"))
    return out


PUBLISHED = _published()
CASES = [(n, d) for n in gpu_names() for d in sorted(load_hardware(n).peak_tflops)]


def test_the_table_covers_every_published_profile():
    # K1 / K28 / K30 rows name 12 built-in profiles; every one is checked below
    named = {n for n, _ in PUBLISHED}
    assert named <= set(gpu_names())
    assert {"a100-80gb", "h100-sxm", "h200", "b200", "b300", "gb200", "mi250x", "mi300x",
            "mi325x", "mi355x"} <= named


@pytest.mark.parametrize("name,dtype", CASES)
def test_training_ceiling_below_every_published_mamf(name, dtype):
    g = gpu_spec(name)
    ceil, src = g.training_ceiling(dtype)
    syn = _ceiling(load_hardware(name), dtype)
    assert syn == (ceil, src)  # one ceiling for the synthesizer and cost op --training
    assert ceil <= g.mamf(dtype)[0] + 1e-9
    assert ceil <= g.peak_tflops(dtype) * g.hw.gemm_max_of(dtype) + 1e-9
    for v, ref in PUBLISHED.get((name, dtype), []):
        assert ceil <= v + 1e-9, (name, dtype, ceil, v, ref)


@pytest.mark.parametrize("name,dtype,want,src", [
    ("mi300x", "bf16", 668.4, "published"),   # 0.6 x 1307.4 = 784.4 -> K28's v2 MAMF
    ("mi300x", "fp16", 668.4, "published"),
    ("mi250x", "bf16", 147.0, "published"),   # 0.77 x 191.5 = 147.5 -> K1's one-GCD MAMF
    ("gb200", "fp8", 2906.9, "published"),    # 0.6 x 5000 = 3000 -> K5's cuBLASLt sweep max
    ("gb200", "fp4", 7627.6, "published"),    # 0.8 x 10000 = 8000 -> K5's NVFP4 sweep max
    ("a100-80gb", "bf16", 0.79 * 312.0, "fitted"),   # below K1's 267.9: the fraction binds
    ("h100-sxm", "fp8", 0.66 * 1978.9, "fitted"),    # below K3's 1382.2 and K28's 1402.6
    ("gb200", "bf16", 0.7 * 2500.0, "fitted"),       # below K30's 1822.0
])
def test_which_ceiling_binds(name, dtype, want, src):
    ceil, s = gpu_spec(name).training_ceiling(dtype)
    assert ceil == pytest.approx(want, rel=1e-12)
    assert s == src


@pytest.mark.parametrize("name,dtype", [(n, d) for n, d in CASES
                                        if d in ("bf16", "fp8", "fp4")])
def test_a_large_synthesized_gemm_stays_below_the_published_mamf(name, dtype):
    # 16384^3 (the sweep maxima's shape, K5): its priced rate is at most the ceiling
    s = 16384
    c = gemm(load_hardware(name), dtype, s, s, s)
    tflops = c.flops / (c.dur_ns * 1e3)
    assert tflops <= gpu_spec(name).training_ceiling(dtype)[0] * (1 + 1e-3)
    for v, ref in PUBLISHED.get((name, dtype), []):
        assert tflops <= v, (name, dtype, tflops, v, ref)
