"""Store write bench: one real rank's tables written the store's way against the former way.

Parses the largest shared Kineto trace (``shared/traces/kineto/v100-ddp-sgd``, one rank,
216k events), builds the per-rank tables the rank-wise ingest writes
(:func:`collectors.rankwise.rank_tables`), and writes them ``--repeat`` times each way,
alternating: ``collectors.trace.parquet_options`` (LZ4, no dictionary pages, delta-encoded
64-bit integers, statistics only for the filtered columns), the same with every integer column
delta-encoded (as before), with zstd and every column's statistics (earlier) and the former
options (zstd with dictionary pages). Prints the median write and read-back CPU times (this
process's user + system time: on a shared host they move less with other load than wall
times) and the bytes on disk per way, and checks that all read back equal.
Figures are printed, never asserted.

    python bench/store_write.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SRC = ROOT.parent / "shared" / "traces" / "kineto" / "v100-ddp-sgd" / "df_index_resolver.json.gz"


def main() -> None:
    from retime.collectors import rankwise
    from retime.collectors.kineto import merge_parts, parse_kineto_file
    from retime.collectors.trace import parquet_options

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    part = parse_kineto_file(SRC)
    sk = rankwise.skeleton(part)
    plan = rankwise.plans(merge_parts([sk[0]]), [sk])[0][3]
    tables = rankwise.rank_tables(part, 0, plan)
    print("tables of one rank: " + ", ".join(f"{k} {t.num_rows:,} rows x {t.num_columns}"
                                             for k, t in tables.items()))

    def delta_all(s):  # every integer column delta-encoded, the narrow ones too
        ints = [f.name for f in s if pa.types.is_integer(f.type)]
        return {**parquet_options(s), "column_encoding": dict.fromkeys(ints, "DELTA_BINARY_PACKED")}

    ways = {"store (parquet_options)": parquet_options,
            "before (delta for all integers)": delta_all,
            "previous (zstd, all statistics)": lambda s: {
                **parquet_options(s), "compression": "zstd", "write_statistics": True},
            "former (zstd, dictionaries)": lambda _s: {"compression": "zstd"}}
    res: dict[str, dict[str, list[float]]] = {w: {"write": [], "read": []} for w in ways}
    size = {}
    back = {}
    with tempfile.TemporaryDirectory(prefix="retime-store-write-") as d:
        for _ in range(a.repeat):
            for w, opts in ways.items():
                files = {k: Path(d) / f"{k}-{len(res[w]['write'])}.parquet" for k in tables}
                t0 = time.process_time()
                for k, t in tables.items():
                    pq.write_table(t, files[k], **opts(t.schema))
                res[w]["write"].append(time.process_time() - t0)
                t0 = time.process_time()
                back[w] = {k: pq.read_table(f) for k, f in files.items()}
                res[w]["read"].append(time.process_time() - t0)
                size[w] = sum(f.stat().st_size for f in files.values())
    for w in ways:
        print(f"  {w:<32} write {1e3 * float(np.median(res[w]['write'])):6.1f} ms, read back "
              f"{1e3 * float(np.median(res[w]['read'])):6.1f} ms CPU (medians of {a.repeat}), "
              f"{size[w] / 1e6:.2f} MB on disk")
    a_, *others = ways
    for b_ in others:
        same = all(back[a_][k].to_pandas().equals(back[b_][k].to_pandas()) for k in tables)
        print(f"  store / {b_.split(' (')[0]}: write "
              f"{np.median(res[a_]['write']) / np.median(res[b_]['write']):.2f}x, read back "
              f"{np.median(res[a_]['read']) / np.median(res[b_]['read']):.2f}x, size "
              f"{size[a_] / size[b_]:.2f}x; read back equal: {same}")


if __name__ == "__main__":
    main()
