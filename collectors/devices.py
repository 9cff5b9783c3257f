"""Peak rates of common accelerators, looked up by the device name a profiler reports.

Dense peak FLOP/s for 16-bit tensor math and HBM bandwidth, from vendor data sheets
(SXM/OAM parts). Used to fill ``meta["devices"]`` so MFU and rooflines have a reference.
"""

from __future__ import annotations

__all__ = ["device_peaks"]

# (substring of the reported name, peak bf16/fp16 dense FLOP/s, HBM bytes/s)
_TABLE = [
    ("B200", 2.25e15, 8.0e12),
    ("H200", 989e12, 4.8e12),
    ("H100", 989e12, 3.35e12),
    ("H800", 989e12, 3.35e12),
    ("A100", 312e12, 2.039e12),
    ("A800", 312e12, 2.039e12),
    ("V100", 125e12, 0.9e12),
    ("MI300X", 1307e12, 5.3e12),
    ("MI250", 383e12, 3.2e12),
    ("L40", 181e12, 0.864e12),
]


def device_peaks(name: str | None) -> dict:
    """``{"peak_flops": ..., "mem_bw_bytes_per_s": ...}`` for a device name, or {} if unknown."""
    if not name:
        return {}
    for key, flops, bw in _TABLE:
        if key.lower() in name.lower():
            return {"peak_flops": flops, "mem_bw_bytes_per_s": bw}
    return {}
