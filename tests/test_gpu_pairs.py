"""GPU pair batches G1, G2 and G3 (issues 26 and 27): real single-H200 captures, plain
torch.profiler. G3 was captured after FREEZE-11 and scored once (traces/gpu_pairs/SCORES_G3.md).

What is checked, on the committed traces (traces/gpu_pairs/):
- every capture ingests; the only events ingest drops are Kineto's ``overhead`` category
  (CUPTI's "Command Buffer Full" host stalls, G2 and G3 only), and it drops exactly as many as the
  raw file holds;
- each capture has 3 profiled steps, and the step times ``retime analyze`` prints equal (to
  5 us; 1-2 us apart on the two with_stack G1 captures) a recount from the raw JSON by
  collectors/steps.py's definition (a step ends when its
  ``ProfilerStep#N`` host range and every GPU op launched inside it are done, and never
  before the previous step ends; windows tile, so step N > first lasts ``E_N - E_{N-1}``);
- the bench's prediction is the number ``retime replay --set ... --json`` prints;
- the scores of one direction per knob are pinned (the held-out FREEZE-10 values of
  traces/gpu_pairs/scores_frozen.json, or the in-sample value after a later fix; G3's at
  their held-out FREEZE-11 values of scores_g3_frozen.json), so a model change that moves
  them is visible.
Batch G4 (captured after FREEZE-11, held-out) is checked the same way (ingest + recount of every
configuration; one prediction per knob pinned at its held-out value, scores_g4_frozen.json).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from retime.cli import run

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces" / "gpu_pairs"
BATCH_KEY = {"g1": "pairs", "g2": "pairs_g2", "g3": "pairs_g3"}
CONFIGS = [(b, c) for b in ("g1", "g2", "g3")
           for c in sorted(json.loads((TRACES / b / "job.json").read_text())["configs"])]


def _bench():
    spec = importlib.util.spec_from_file_location("gpu_pairs_bench", ROOT / "bench" / "gpu_pairs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _raw(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def _recount(events: list[dict]) -> dict[int, tuple[float, float]]:
    """Per ProfilerStep#N: (host range start, E_N) in ns of the raw file's clock."""
    steps = {}
    for e in events:
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#"):
            steps[int(e["name"].split("#")[1])] = (e["ts"] * 1e3, (e["ts"] + e["dur"]) * 1e3)
    launch = {}
    end = {n: t for n, (s, t) in steps.items()}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver", "cpu_op") and e.get("ph") == "X":
            for n, (s, t) in steps.items():
                if s <= e["ts"] * 1e3 <= t:  # a host op of step n (it starts inside the range)
                    end[n] = max(end[n], (e["ts"] + e["dur"]) * 1e3)
                    if "correlation" in e.get("args", {}):
                        launch[e["args"]["correlation"]] = n
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            n = launch.get(e.get("args", {}).get("correlation"))
            if n is not None:
                end[n] = max(end[n], (e["ts"] + e["dur"]) * 1e3)
    out, prev = {}, float("-inf")
    for n in sorted(steps):
        prev = max(end[n], prev)
        out[n] = (steps[n][0], prev)
    return out


@pytest.mark.parametrize("batch,config", CONFIGS, ids=[f"{b}-{c}" for b, c in CONFIGS])
def test_capture_ingests_and_analyze_steps_equal_the_raw_recount(batch, config, tmp_path,
                                                                  capsys):
    src = TRACES / batch / config / "rep1.pt.trace.json.gz"
    events = _raw(src)
    store = tmp_path / "s.retime"
    assert run(["ingest", str(src), "-o", str(store), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    overhead = sum(e.get("cat") == "overhead" and e.get("ph") == "X" for e in events)
    reason = ("CUPTI/driver overhead records (e.g. 'Command Buffer Full': a launch waited for "
              "room in the driver's command buffer) are not used")
    assert doc["dropped"] == ({reason: overhead} if overhead else {})
    assert all(e["name"] == "Command Buffer Full" for e in events if e.get("cat") == "overhead")
    assert run(["analyze", str(store), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    got = {r["step"]: r["step_ns"] for r in a["job_steps"]}
    want = _recount(events)
    assert sorted(got) == sorted(want) and len(got) == 3
    first, *rest = sorted(want)
    for n in rest:  # windows tile: a later step lasts from the previous step's end to its own
        prev = max(k for k in want if k < n)
        # to 5 us: on the with_stack captures (gpt-b8, gpt-b8-ckpt) analyze's step ends 1-2 us
        # later than this recount (the python frames around the profiler's step() call, it
        # seems; not traced further); the plain captures agree to the ns
        assert got[n] == pytest.approx(want[n][1] - want[prev][1], abs=5000)
    # the first window ends at E_first and starts no earlier than its host range
    assert got[first] <= want[first][1] - want[first][0] + 5000
    assert a["step_time_ns"]["slowest_rank_mean"] == pytest.approx(sum(got.values()) / 3)


#: the predictions of one direction per knob, source rep1, in ms per step: the held-out
#: (FREEZE-10) values of traces/gpu_pairs/scores_frozen.json, except where a later model
#: change moved them (then an in-sample figure; the frozen one is in the comment). A model
#: change that moves one fails here.
PINNED = {("g1", "gpu-ckpt", "A->B"): 71.329557,
          ("g1", "gpu-graph-gpt", "A->B"): 27.121105,
          ("g2", "g2-ckpt", "A->B"): 79.028447,
          # FREEZE-10: 87.253183 (-24.5%); b*s rows rescaled (kernel_cost.token_rows)
          # then 109.245427; moved by the H200 pricing changes of costs K47, K50-K52
          ("g2", "g2-batch-16", "A->B"): 109.185826,
          # FREEZE-10: 146.747911; 147.779525 after costs K47, K50-K52; 143.902844 after TF32
          # nt (K56, K57); then launches blocked on a full launch queue wait on the GPU
          # (replay/launch_queue.py, issue 27)
          ("g2", "g2-tf32", "A->B"): 73.576563,
          # G3, held-out (FREEZE-11, scores_g3_frozen.json); measured in the comment
          ("g3", "g3-batch-12", "A->B"): 88.402705,  # measured 91.17 (-3.0%)
          # held-out FREEZE-11: 151.286531 (+28.4%, a miss); then the launch-queue waits
          # (after FREEZE-11, so not held-out): +12.7%
          ("g3", "g3-batch-32", "B->A"): 132.717144,  # measured 117.78
          ("g3", "g3-fp32-batch", "A->B"): 548.452590,  # measured 569.35 (-3.7%)
          ("g3", "g3-ckpt-s512", "A->B"): 48.297730,  # measured 47.11 (+2.5%)
          # held-out FREEZE-11: 195.845247 (+163.8%, a miss); then the launch-queue waits
          # (not held-out): -36.5%, the TF32 speed-up no longer capped by the host's pace
          ("g3", "g3-tf32-wide", "A->B"): 47.149368}  # measured 74.23
#: G3's held-out (FREEZE-11) values where a later change moved the pin
G3_FROZEN = {("g3", "g3-batch-32", "B->A"): 151.286531,
             ("g3", "g3-tf32-wide", "A->B"): 195.845247}


def _frozen_row(batch: str, pair: str, direction: str) -> dict:
    name = "scores_g3_frozen.json" if batch == "g3" else "scores_frozen.json"
    rows = json.loads((TRACES / name).read_text())["rows"]
    return next(r for r in rows if (r["batch"], r["pair"], r["direction"]) == (batch, pair,
                                                                                  direction))


@pytest.mark.parametrize("key", sorted(PINNED), ids=["-".join(k) for k in sorted(PINNED)])
def test_prediction_is_pinned_at_its_scored_value(key):
    import retime
    from retime.replay import whatif
    from retime.replay.policies.scenario import scenario_from_cli

    batch, pair, direction = key
    spec = json.loads((ROOT / "examples" / "gpu_pairs" / "pairs.json").read_text())
    spec = spec[BATCH_KEY[batch]][pair]
    src = spec[direction.split("->")[0]]
    trace = retime.load(str(TRACES / batch / src / "rep1.pt.trace.json.gz"))
    res = whatif(trace, scenario_from_cli(None, list(spec["whatif"][direction])))
    pred_ms = res.summary()["step_time_ns"]["per_step"]["replayed"] / 1e6
    assert pred_ms == pytest.approx(PINNED[key], rel=1e-5)


def test_g3_pins_are_the_held_out_scores():
    """G3's pins are the numbers its one held-out run printed (SCORES_G3.md's rows), or, where
    a later change moved the pin, G3_FROZEN holds that number."""
    for (batch, pair, direction), ms in {**PINNED, **G3_FROZEN}.items():
        if batch == "g3":
            ms = G3_FROZEN.get((batch, pair, direction), ms)
            assert _frozen_row(batch, pair, direction)["predicted_ms"] == pytest.approx(ms,
                                                                                      rel=1e-6)


def test_bench_knows_batch_g3_and_sums_it_apart():
    bench = _bench()
    assert bench.BATCHES["g3"] == "pairs_g3" and "g3" not in bench.IN_SAMPLE
    spec = json.loads((ROOT / "examples" / "gpu_pairs" / "pairs.json").read_text())["pairs_g3"]
    job = json.loads((TRACES / "g3" / "job.json").read_text())["configs"]
    for name, pair in spec.items():
        if not name.startswith("_"):
            assert pair["A"] in job and pair["B"] in job


def test_bench_prediction_is_the_number_the_cli_prints(tmp_path, capsys):
    bench = _bench()
    src = TRACES / "g1" / "tiny-eager" / "rep1.pt.trace.json.gz"
    store = tmp_path / "s.retime"
    assert run(["ingest", str(src), "-o", str(store)]) == 0
    capsys.readouterr()
    assert run(["replay", str(store), "--set", "hardware.cuda_graphs=step", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)["step_time_ns"]
    got = bench.replay(store, ["hardware.cuda_graphs=step"])
    assert got["predicted_ns"] == printed["per_step"]["replayed"]
    assert got["range_ns"] == [float(x) for x in printed["range"]]
    assert got["predicted_ns"] / 1e6 == pytest.approx(
        _frozen_row("g1", "gpu-graph-tiny", "A->B")["predicted_ms"], rel=1e-9)
    assert "refused" in bench.replay(store, ["parallel.micro_batch=0"])


def test_batch_folded_with_the_sequence_is_rescaled():
    """A transformer's GEMMs run on ``[b*s, d]``: the rows (and a weight gradient's reduction)
    of b*s become b2*s; parameters and other sizes keep theirs."""
    import retime
    from retime.replay.policies.kernel_cost import (
        _weight_shapes,
        scaled_dims,
        shaped_kernels,
        token_rows,
    )

    assert scaled_dims("aten::addmm", [[2048], [8192, 2048], [2048, 6144]], 8, 16, set(),
                       8192) == [[2048], [16384, 2048], [2048, 6144]]
    assert scaled_dims("aten::mm", [[2048, 8192], [8192, 6144]], 8, 4, set(), 8192) == \
        [[2048, 4096], [4096, 6144]]
    assert scaled_dims("aten::_log_softmax", [[8192, 32768]], 8, 2, set(), 8192) == \
        [[2048, 32768]]
    assert scaled_dims("aten::add_", [[8192, 2048]], 8, 2, {(8192, 2048)}, 8192) == \
        [[8192, 2048]]  # a parameter of that shape keeps it
    assert scaled_dims("aten::mm", [[8192, 2048]], 8, 16, set()) == [[8192, 2048]]
    sk = shaped_kernels(retime.load(str(TRACES / "g2" / "big-b8-nostack" / "rep1.pt.trace.json.gz")))
    assert token_rows(sk, 8, _weight_shapes(sk)) == 8 * 1024


# --- batch G4 (captured after FREEZE-11; held-out, scored once: traces/gpu_pairs/SCORES_G4.md) ---

CONFIGS_G4 = sorted(json.loads((TRACES / "g4" / "job.json").read_text())["configs"])


@pytest.mark.parametrize("config", CONFIGS_G4, ids=[f"g4-{c}" for c in CONFIGS_G4])
def test_g4_capture_ingests_and_analyze_steps_equal_the_raw_recount(config, tmp_path, capsys):
    test_capture_ingests_and_analyze_steps_equal_the_raw_recount("g4", config, tmp_path, capsys)


#: one direction per G4 knob, source rep1, ms per step: the held-out FREEZE-11 values of
#: traces/gpu_pairs/scores_g4_frozen.json (a model change that moves one fails here; the
#: held-out figure stays in SCORES_G4.md)
PINNED_G4 = {("g4-llama-batch", "A->B"): 57.038807,
             ("g4-llama-ckpt", "A->B"): 46.833778,
             ("g4-r50-batch", "A->B"): 55.872456,
             ("g4-r50-graph", "A->B"): 30.287827,
             ("g4-r50-tf32", "A->B"): 78.727455}


def test_g4_pins_are_the_frozen_rows_and_the_bench_knows_g4():
    bench = _bench()
    assert bench.BATCHES["g4"] == "pairs_g4" and "g4" in bench.HELD_OUT
    spec = json.loads((ROOT / "examples" / "gpu_pairs" / "pairs.json").read_text())["pairs_g4"]
    pairs = {n: s for n, s in spec.items() if not n.startswith("_")}
    for s in pairs.values():  # every source and target is a G4 capture
        assert {s["A"], s["B"]} <= set(CONFIGS_G4)
    assert {p for p, _ in PINNED_G4} == {n for n in pairs}  # one pin per knob
    rows = json.loads((TRACES / "scores_g4_frozen.json").read_text())["rows"]
    assert len(rows) == sum(len(s["whatif"]) for s in pairs.values()) == 9
    for (pair, direction), ms in PINNED_G4.items():
        row = next(r for r in rows if (r["pair"], r["direction"]) == (pair, direction))
        assert row["batch"] == "g4" and row["predicted_ms"] == pytest.approx(ms, rel=1e-6)


@pytest.mark.parametrize("key", sorted(PINNED_G4), ids=["-".join(k) for k in sorted(PINNED_G4)])
def test_g4_prediction_is_pinned_at_its_held_out_value(key):
    import retime
    from retime.replay import whatif
    from retime.replay.policies.scenario import scenario_from_cli

    pair, direction = key
    spec = json.loads((ROOT / "examples" / "gpu_pairs" / "pairs.json").read_text())["pairs_g4"][pair]
    src = spec[direction.split("->")[0]]
    trace = retime.load(str(TRACES / "g4" / src / "rep1.pt.trace.json.gz"))
    res = whatif(trace, scenario_from_cli(None, list(spec["whatif"][direction])))
    pred_ms = res.summary()["step_time_ns"]["per_step"]["replayed"] / 1e6
    assert pred_ms == pytest.approx(PINNED_G4[key], rel=1e-5)
