"""The NCCL model's two fitted pipeline parameters, refit on their fit series.

Run: ``python bench/cost_fit.py`` (a few seconds). Prints, for the pipeline fill taken as a
hard ``min(S, I)`` and as the soft minimum the model uses (``nccl.fill_bytes``), the median
and worst |error| of the fit series' 1 MB - 1 GB rows over each parameter's grid:

* the ring chunk per channel in flight (``nccl_params.CHUNK_BYTES``) on C1 (8 x A100
  all-reduce), powers of two 16 - 256 KiB;
* the NVLS fill fraction (``nccl_params.NVLS_FILL``) on C7 (8 x H100 NVLS all-reduce),
  0.25 - 1.5.

Only fit rows are read (REFERENCES.md C1, C7); the judged series never enter. The grid
points are evaluated by temporarily replacing the parameter (and the fill's form) inside
this process; nothing is written.
"""

from __future__ import annotations

import statistics
import sys
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cost as bench  # noqa: E402  (bench/cost.py: the rows and their errors)

import retime.collectors.costs.nccl as nccl  # noqa: E402
from retime.collectors.costs import nccl_params as P  # noqa: E402

CHUNKS_KIB = (16, 32, 64, 128, 256)
NVLS_FRACTIONS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5)


@contextmanager
def _replaced(param: P.Param, value: float):
    old = param.value
    object.__setattr__(param, "value", float(value))  # frozen: this process only
    try:
        yield
    finally:
        object.__setattr__(param, "value", old)


@contextmanager
def _fill_form(form):
    old = nccl.fill_bytes
    nccl.fill_bytes = form
    try:
        yield
    finally:
        nccl.fill_bytes = old


def fit_errors(series_id: str) -> tuple[float, float]:
    """(median, worst) |error| of a fit series' 1 MB - 1 GB rows."""
    s = next(x for x in bench.load()["collective"] if x["id"] == series_id
             and x["role"] == "fit")
    errs = [abs(r["error"]) for r in bench.collective_rows(s) if 2**20 <= r["bytes"] <= 2**30]
    return statistics.median(errs), max(errs)


def main() -> int:
    forms = (("hard min(S, I)", min), ("soft minimum", nccl.fill_bytes))
    for name, form in forms:
        print(f"fill as a {name}")
        with _fill_form(form):
            for kib in CHUNKS_KIB:
                with _replaced(P.CHUNK_BYTES, kib * 1024):
                    m, w = fit_errors("C1")
                print(f"  C1 chunk {kib:4d} KiB   median {100 * m:5.1f}%  worst {100 * w:5.1f}%")
            for f in NVLS_FRACTIONS:
                with _replaced(P.NVLS_FILL, f):
                    m, w = fit_errors("C7")
                print(f"  C7 NVLS fill {f:4.2f}   median {100 * m:5.1f}%  worst {100 * w:5.1f}%")
    print(f"in use: chunk {P.CHUNK_BYTES.value / 1024:g} KiB, NVLS fill {P.NVLS_FILL.value:g}, "
          "soft minimum")
    return 0


if __name__ == "__main__":
    sys.exit(main())
