"""NCCL what-ifs on the shared GPU traces (issue 27 parts 2-3): bucket sizes, link rates and
the SM share of NCCL kernels, priced by the cost layer's NCCL and interference models.

Prints, per trace and what-if, the slowest rank's mean step (and its range) and the exposed /
overlapped communication summed over each rank's steps (``analysis.breakdown``), next to the
identity replay. It judges nothing: the figures are for reading (README, issue 27).

    python bench/whatif_nccl.py            # ~1 min on 2 shared cores (ingest included)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KINETO = ROOT.parent / "shared" / "traces" / "kineto"

CASES = {
    "a100-ddp-nccl": [{"overlap.bucket_mb": 1}, {"overlap.bucket_mb": 5},
                      {"overlap.bucket_mb": 25}, {"overlap.bucket_mb": 100},
                      {"network.intra_node_gbps": 150}, {"overlap.sm_share": 0.0}],
    "dlrm-v100-8rank": [{"network.intra_node_gbps": 150}, {"network.intra_node_gbps": 300},
                        {"network.intra_node_gbps": 25}, {"overlap.sm_share": 0.0}],
    "mi300x-resnet-ddp": [{"overlap.bucket_mb": 1}, {"overlap.bucket_mb": 25},
                          {"network.intra_node_gbps": 224}, {"overlap.sm_share": 0.0},
                          {"overlap.sm_share": 0.2}],
    "v100-ddp-sgd": [{"overlap.sm_share": 0.0}, {"overlap.sm_share": 0.3}],
}


def main() -> None:
    from retime.analysis.breakdown import breakdown
    from retime.collectors.errors import RetimeError
    from retime.collectors.ingest import read
    from retime.replay import prediction_range, replay, whatif

    def row(name, label, res, rng=None):
        bd = breakdown(res, by="rank")
        st = res.step_times()["replayed_step_ns"].max() / 1e6
        r = f"{rng[0] / 1e6:8.2f}-{rng[1] / 1e6:<8.2f}" if rng else " " * 17
        print(f"{name:18s} {label:34s} {st:9.2f} {r} {bd['exposed_comm_ns'].mean() / 1e6:9.2f} "
              f"{bd['overlapped_comm_ns'].mean() / 1e6:9.2f}")

    print(f"{'trace':18s} {'what-if':34s} {'step ms':>9s} {'range ms':^17s} {'exposed':>9s} "
          f"{'overlap':>9s}")
    for name, scenarios in CASES.items():
        t0 = time.perf_counter()
        tr = read([KINETO / name])
        row(name, "identity", replay(tr))
        for sc in scenarios:
            label = ", ".join(f"{k.split('.')[1]}={v:g}" for k, v in sc.items())
            try:
                res = whatif(tr, sc)
                row(name, label, res, prediction_range(res))
            except RetimeError as exc:
                print(f"{name:18s} {label:34s} refused: {str(exc)[:70]}")
        print(f"{'':18s} ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
