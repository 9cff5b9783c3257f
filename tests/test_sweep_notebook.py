"""Sweep frames: Pareto front against a brute-force dominance check, plot helpers return
Figures; examples/whatif.ipynb executed top to bottom with nbclient, outputs checked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from naive_steps import naive_rank_totals

from retime.analysis.sweep_plots import pareto_front, plot_pareto, plot_sweep

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "whatif.ipynb"
DLRM = ROOT.parent / "shared" / "traces" / "kineto" / "dlrm-v100-8rank"


def _frame(seed: int, n: int = 60) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({
        "scenario_id": np.arange(n),
        "parallel.tp": rng.choice([1, 2, 4, 8], n),
        "cache.recompute": rng.choice(["none", "selective", "full"], n),
        "step_time_ns": pd.array(rng.integers(1, 40, n) * 10_000_000, dtype="Int64"),
        "peak_memory_bytes": pd.array(rng.integers(1, 30, n) * 2**30, dtype="Int64"),
        "oom": pd.array(rng.random(n) < 0.15, dtype="boolean"),
        "error": pd.array([None] * n, dtype="string"),
    })
    df.loc[3, "error"] = "PolicyError: no"
    df.loc[3, ["step_time_ns", "peak_memory_bytes"]] = pd.NA
    return df


@pytest.mark.parametrize("seed", range(5))
def test_pareto_front_is_the_non_dominated_set(seed):
    df = _frame(seed)
    front = pareto_front(df)
    ok = df[df["error"].isna() & ~df["oom"].fillna(False)]
    pts = list(zip(ok["peak_memory_bytes"].astype(int), ok["step_time_ns"].astype(int),
                   ok["scenario_id"], strict=True))
    # brute force: not dominated (<= on both, < on one) by any other candidate; among exact
    # duplicates the first in (memory, step, input) order is kept
    expect = set()
    for m, s, i in pts:
        dominated = any((m2 <= m and s2 <= s) and (m2 < m or s2 < s) for m2, s2, _ in pts)
        first_dup = min(j for m2, s2, j in pts if (m2, s2) == (m, s)) == i
        if not dominated and first_dup:
            expect.add(i)
    assert set(front["scenario_id"]) == expect
    assert front["peak_memory_bytes"].is_monotonic_increasing
    assert front["step_time_ns"].is_monotonic_decreasing


def test_plots_return_figures():
    df = _frame(0)
    f1 = plot_sweep(df, x="parallel.tp", hue="cache.recompute")
    f2 = plot_sweep(df, x="cache.recompute")
    f3 = plot_pareto(df, label="scenario_id")
    for f in (f1, f2, f3):
        assert isinstance(f, Figure) and len(f.axes) == 1
    assert len(f1.axes[0].get_legend().get_texts()) == 3  # one line per recompute mode
    assert [t.get_text() for t in f2.axes[0].get_xticklabels()] == list(
        dict.fromkeys(df["cache.recompute"].drop(index=3)))
    empty = plot_pareto(df.assign(error="x"))
    assert not empty.axes[0].axison


@pytest.mark.slow  # a kernel start and a small sweep: ~25 s on 2 idle cores
def test_notebook_runs_top_to_bottom():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from retime.collectors.ingest import read

    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "data" in o and "image/png" in o["data"]]
    assert len(images) >= 3  # breakdown, step time vs key, Pareto
    rec = json.loads(nb.cells[-1].outputs[-1]["text"])
    t = read(DLRM)
    assert rec["ops"] == t.n_ops and rec["world_size"] == 8
    assert rec["identity_step_time_ns"] == max(naive_rank_totals(t).values())
    w = rec["whatif_step_time_ms"]
    assert w["measured"] == rec["identity_step_time_ns"] / 1e6
    assert w["no stragglers"] <= w["measured"] <= w["serialized communication"]
    assert rec["sweep_rows"] == 8 and rec["sweep_errors"] == 0
    assert rec["pareto_ids"] and rec["sweep_best_step_time_ns"] > 0
    # the fastest scenario (2x compute, no recompute, async) is on the front
    assert 4 in rec["pareto_ids"]


def test_notebook_is_saved_with_its_outputs():
    """Opened on the web the notebook shows its outputs (python examples/run_notebook.py
    regenerates them); they are current: the record matches the bundled trace."""
    import nbformat

    import retime

    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs for c in code)
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert len([o for o in outputs if "data" in o and "image/png" in o["data"]]) >= 3
    rec = json.loads(code[-1].outputs[-1]["text"])
    t = retime.load(retime.sample_trace_path())
    assert rec["ops"] == t.n_ops
    assert rec["identity_step_time_ns"] == max(naive_rank_totals(t).values())
    assert "2x faster host CPU" in rec["whatif_step_time_ms"]
