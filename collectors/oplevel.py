"""Op-level timelines (the StragglerAnalysis Parquet layout) -> :class:`Trace`.

Input: a folder holding ``trace-NAME.parquet`` and ``meta-NAME.yaml`` (or the Parquet file
itself; the YAML next to it is optional, sizes are then inferred from the data).  One row per
operation of one rank in one training step, columns ``dp_rank, stage, rank, step, optype,
start_ts, duration`` (seconds, relative to the step's start), ``seq_id`` (issue order of that
optype on the rank within the step), ``mc`` (model chunk), ``mb_id`` (micro-batch), ``gmc``
(global model chunk = chunk index along the whole pipeline).  The YAML holds ``dp_size,
pp_size, tp_size, dsp_size, vpp_size, world_size``.  Other files of the folder
(``result-*.json``, ``timeline-*.json.gz``) are listed in ``meta["skipped_files"]``.

Time: steps are laid back to back (step *k+1*'s earliest op starts when step *k*'s last op
ends, over all ranks); ``meta["oplevel"]["step_offsets_ns"]`` maps each step to the offset
added to its relative timestamps.  Times are rounded to integer ns (the file stores float32).

Optypes (Megatron-LM timers) and what they become:

===========================  ==========  ==============  =====================================
optype                       kind        lane            meaning
===========================  ==========  ==============  =====================================
forward-compute              COMPUTE     compute         forward of one micro-batch and chunk
backward-compute             COMPUTE     compute         backward of one micro-batch and chunk
forward-send / -recv         P2P         pp-fwd-send/-recv  activations to / from stage s+1 / s-1
backward-send / -recv        P2P         pp-bwd-send/-recv  gradients to / from stage s-1 / s+1
params-all-gather            COLLECTIVE  dp-comm         distributed-optimizer param all-gather
grads-reduce-scatter         COLLECTIVE  dp-comm         DP gradient reduce-scatter
separate-grads-all-reduce    COLLECTIVE  dp-comm         overlapped-DP leftover all-reduce
layernorm-grads-all-reduce   COLLECTIVE  compute         TP/SP layernorm grad all-reduce
embedding-grads-all-reduce   COLLECTIVE  compute         tied-embedding all-reduce, stage 0+last
optimizer-clip-main-grad     COLLECTIVE  compute         grad-norm all-reduce over all ranks
gc                           COMPUTE     compute         Python garbage collection
optimizer                    COMPUTE     compute         optimizer step (end of the step)
other optypes                COMPUTE     other           kept, no dependencies
===========================  ==========  ==============  =====================================

Lanes are FIFO (order by start time is implied, no edges): one compute lane, four PP lanes and
one DP lane per rank, as in StragglerAnalysis' streams.  Edges (all ``DATA``, ``lag_ns`` 0;
measured timestamps may violate a few by float32 rounding, counted in
``meta["oplevel"]["negative_slack_edges"]``), per rank and step:

- send: the compute it carries -> the send (the k-th non-no-op ``t-send`` carries the k-th
  ``t-compute`` of that rank, t = forward/backward);
- recv: the recv -> the compute it feeds, and the previous ``t-compute`` -> the recv (a recv is
  posted after the previous micro-batch's compute).  If a rank has one recv fewer than
  computes, the first compute has none.  "No-op" p2p ops (recorded but never launched: a recv
  starting after the last ``t-compute`` started, a send ending before the first ended) get no
  compute edges;
- the first backward-send/-recv (seq_id 0) <- the second forward-compute before the first
  backward-compute (1F1B warm-up boundary);
- params-all-gather -> the first forward-compute of its model chunk;
- post-compute chain: last compute -> gc -> layernorm -> embedding (stages 0 and last) ->
  grads-reduce-scatter (all, in seq order) -> optimizer-clip-main-grad -> optimizer; with a
  ``separate-grads-all-reduce`` (overlapped DP) the reduce-scatters instead follow the last
  backward-compute of their chunk, and the chain is (last reduce-scatter, gc) -> layernorm ->
  embedding -> separate-grads-all-reduce -> clip -> optimizer; without DP there is no DP op;
- next step: optimizer of step k -> the first op of step k+1 on each lane of the rank.

Cross-rank instances share a ``coll_id`` (the replay starts members together at the latest
member's ready time; a member's pure transfer time is its end minus the latest member start):

- P2P: the v-th non-no-op ``forward-send`` of stage s pairs with the v-th ``forward-recv`` of
  stage s+1 (same dp_rank and step), ``backward-send`` of s with ``backward-recv`` of s-1;
  ``peer`` holds the partner rank.  No send -> recv edge is written (it would be a cycle with
  the start-together rule); no-op p2p ops keep ``coll_id`` -1 (``collectives["p2p_noops"]``);
- params-all-gather / grads-reduce-scatter / separate-grads-all-reduce: same (step, stage,
  seq_id) over the DP ranks of the stage (group ``dp:stageS``);
- embedding-grads-all-reduce: stages 0 and pp-1 of one dp_rank (group ``embedding:dpD``);
- optimizer-clip-main-grad: every rank of the step (group ``world``);
- layernorm-grads-all-reduce: a one-member instance per rank (TP is folded into a rank here).

``meta["collectives"]`` counts instances (``matched``/``unmatched`` with reasons) and their
ops (``ops_matched``/``ops_unmatched``), as the Kineto reader does, plus ``p2p_noops``.
``dp_rank`` and ``stage`` of each rank are in ``meta["oplevel"]["ranks"]`` and in the groups.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .enums import CommOp, EdgeKind, LaneKind, OpKind, Phase
from .errors import TraceFormatError
from .trace import StringTable, Trace

__all__ = ["read_oplevel", "REQUIRED_COLUMNS", "OPTYPES", "LANE_NAMES", "pipeline_layout"]

REQUIRED_COLUMNS = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration",
                    "seq_id", "mc", "mb_id", "gmc")
_EPS_NS = 50_000  # StragglerAnalysis' 5e-5 s tolerance for no-op p2p detection

# lanes of a rank
_COMPUTE, _FS, _FR, _BS, _BR, _DP, _OTHER = range(7)
_LANE_NAMES = ("compute", "pp-fwd-send", "pp-fwd-recv", "pp-bwd-send", "pp-bwd-recv",
               "dp-comm", "other")
#: lane names of a rank, in lane-role order (what-if re-layouts build the same lanes)
LANE_NAMES = _LANE_NAMES

#: optype -> (OpKind, CommOp, Phase, lane)
OPTYPES: dict[str, tuple[OpKind, CommOp, Phase, int]] = {
    "forward-compute": (OpKind.COMPUTE, CommOp.NONE, Phase.FWD, _COMPUTE),
    "backward-compute": (OpKind.COMPUTE, CommOp.NONE, Phase.BWD, _COMPUTE),
    "forward-send": (OpKind.P2P, CommOp.SEND, Phase.FWD, _FS),
    "forward-recv": (OpKind.P2P, CommOp.RECV, Phase.FWD, _FR),
    "backward-send": (OpKind.P2P, CommOp.SEND, Phase.BWD, _BS),
    "backward-recv": (OpKind.P2P, CommOp.RECV, Phase.BWD, _BR),
    "params-all-gather": (OpKind.COLLECTIVE, CommOp.ALL_GATHER, Phase.FWD, _DP),
    "grads-reduce-scatter": (OpKind.COLLECTIVE, CommOp.REDUCE_SCATTER, Phase.BWD, _DP),
    "separate-grads-all-reduce": (OpKind.COLLECTIVE, CommOp.ALL_REDUCE, Phase.BWD, _DP),
    "layernorm-grads-all-reduce": (OpKind.COLLECTIVE, CommOp.ALL_REDUCE, Phase.BWD, _COMPUTE),
    "embedding-grads-all-reduce": (OpKind.COLLECTIVE, CommOp.ALL_REDUCE, Phase.BWD, _COMPUTE),
    "optimizer-clip-main-grad": (OpKind.COLLECTIVE, CommOp.ALL_REDUCE, Phase.OPT, _COMPUTE),
    "gc": (OpKind.COMPUTE, CommOp.NONE, Phase.OTHER, _COMPUTE),
    "optimizer": (OpKind.COMPUTE, CommOp.NONE, Phase.OPT, _COMPUTE),
}
# p2p optype -> (direction t, send?, delta of the peer's stage / gmc, peer optype)
_P2P = {"forward-send": ("forward", True, 1, "forward-recv"),
        "forward-recv": ("forward", False, -1, "forward-send"),
        "backward-send": ("backward", True, -1, "backward-recv"),
        "backward-recv": ("backward", False, 1, "backward-send")}


def _inputs(paths: list[Path]) -> tuple[Path, Path | None, dict[str, str]]:
    """(parquet, yaml or None, skipped files) from the given folder or file paths."""
    parquets: list[Path] = []
    yamls: list[Path] = []
    skipped: dict[str, str] = {}
    for p in paths:
        if p.is_dir():
            for f in sorted(p.iterdir()):
                if f.name.startswith("trace-") and f.suffix == ".parquet":
                    parquets.append(f)
                elif f.name.startswith("meta-") and f.suffix in (".yaml", ".yml"):
                    yamls.append(f)
                elif f.is_file():
                    skipped[str(f)] = "not an op-level trace or meta file"
        elif p.suffix == ".parquet":
            parquets.append(p)
        elif p.suffix in (".yaml", ".yml"):
            yamls.append(p)
        else:
            raise TraceFormatError(f"{p}: not an op-level input (expected a folder with "
                                   "trace-NAME.parquet and meta-NAME.yaml, or the .parquet file)")
    if not parquets:
        raise TraceFormatError(f"{paths[0]}: no trace-NAME.parquet found; op-level input is a "
                               "folder with trace-NAME.parquet and meta-NAME.yaml")
    if len(parquets) > 1:
        raise TraceFormatError(
            f"{len(parquets)} op-level traces given ({', '.join(p.name for p in parquets)}); "
            "each is one job: ingest them one at a time by passing the .parquet file")
    pq_path = parquets[0]
    name = pq_path.stem[len("trace-"):] if pq_path.stem.startswith("trace-") else pq_path.stem
    meta = [y for y in yamls if y.stem == f"meta-{name}"]
    if not meta:
        sib = pq_path.with_name(f"meta-{name}.yaml")
        meta = [sib] if sib.is_file() else []
    for y in yamls:
        if not meta or y != meta[0]:
            skipped[str(y)] = f"meta file of another trace than {pq_path.name}"
    return pq_path, (meta[0] if meta else None), skipped


def _job_meta(yaml_path: Path | None, df: pd.DataFrame) -> dict[str, Any]:
    job: dict[str, Any] = {}
    if yaml_path is not None:
        import yaml

        try:
            with open(yaml_path, encoding="utf-8") as fh:
                job = yaml.safe_load(fh) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise TraceFormatError(f"{yaml_path}: unreadable job metadata ({exc}); it must be a "
                                   "YAML mapping with dp_size, pp_size, tp_size, ...") from exc
        if not isinstance(job, dict):
            raise TraceFormatError(f"{yaml_path}: expected a YAML mapping, got {type(job).__name__}")
    inferred = {"dp_size": int(df["dp_rank"].max()) + 1, "pp_size": int(df["stage"].max()) + 1,
                "vpp_size": max(int(df["mc"].max()) + 1, 1), "tp_size": 1, "dsp_size": 1}
    for k, v in inferred.items():
        job.setdefault(k, v)
    for k in ("dp_size", "pp_size", "tp_size", "dsp_size", "vpp_size"):
        if not isinstance(job[k], int) or job[k] <= 0:
            raise TraceFormatError(f"{yaml_path}: {k}={job[k]!r} must be a positive integer")
    if job["dp_size"] < inferred["dp_size"] or job["pp_size"] < inferred["pp_size"]:
        raise TraceFormatError(
            f"{yaml_path}: dp_size={job['dp_size']}, pp_size={job['pp_size']} but the trace has "
            f"dp_rank up to {inferred['dp_size'] - 1} and stage up to {inferred['pp_size'] - 1}; "
            "fix the YAML")
    job.setdefault("world_size", job["dp_size"] * job["pp_size"] * job["tp_size"] * job["dsp_size"])
    return job


def read_oplevel(paths: list[str | os.PathLike[str]] | str | os.PathLike[str]) -> Trace:
    """Read an op-level timeline (StragglerAnalysis layout) into a Trace.

    Parameters
    ----------
    paths
        A folder with ``trace-NAME.parquet`` and ``meta-NAME.yaml``, or the Parquet file.

    Returns
    -------
    Trace
        OP_STREAM lanes per rank, ops with step / stage / microbatch / chunk / phase, DATA
        edges from the pipeline schedule and cross-rank ``coll_id`` instances (see the module
        docstring for every optype and edge).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    pq_path, yaml_path, skipped = _inputs([Path(p) for p in paths])
    try:
        table = pq.read_table(pq_path)
    except (OSError, pa.ArrowException) as exc:
        raise TraceFormatError(f"{pq_path}: unreadable Parquet ({exc})") from exc
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise TraceFormatError(f"{pq_path}: missing column(s) {', '.join(missing)}; an op-level "
                               f"trace needs {', '.join(REQUIRED_COLUMNS)}")
    raw = table.select(list(REQUIRED_COLUMNS)).to_pandas()
    acc: dict[str, Any] = {"events_read": len(raw), "kept": {}, "dropped": {}}
    df = pd.DataFrame({c: raw[c].to_numpy() for c in REQUIRED_COLUMNS if c != "optype"})
    df["optype"] = raw["optype"].astype(str).to_numpy()
    df["row"] = np.arange(len(df))
    bad_num = df[["start_ts", "duration", "dp_rank", "stage", "rank", "step", "seq_id"]].isna().any(axis=1)
    neg = ~bad_num & (df["duration"] < 0)
    dup = ~bad_num & ~neg & df.duplicated(["rank", "step", "optype", "seq_id"], keep="first")
    for reason, m in (("missing_value", bad_num), ("negative_duration", neg), ("duplicate_op", dup)):
        if m.any():
            acc["dropped"][reason] = int(m.sum())
    df = df[~(bad_num | neg | dup)].reset_index(drop=True)
    if df.empty:
        raise TraceFormatError(f"{pq_path}: no usable rows (dropped: {acc['dropped']})")
    for c in ("dp_rank", "stage", "rank", "step", "seq_id", "mc", "mb_id", "gmc"):
        df[c] = df[c].fillna(-1).to_numpy(np.int64)
    job = _job_meta(yaml_path, df)
    rk = df.groupby("rank")[["dp_rank", "stage"]].agg(["min", "max"])
    incons = rk[(rk[("dp_rank", "min")] != rk[("dp_rank", "max")])
                | (rk[("stage", "min")] != rk[("stage", "max")])]
    if len(incons):
        raise TraceFormatError(f"{pq_path}: rank {int(incons.index[0])} has several dp_rank/stage "
                               "values; each rank must keep one (dp_rank, stage)")
    for op, n in df["optype"].value_counts().items():
        acc["kept"][str(op)] = int(n)

    # exact ns: float32 seconds -> float64 -> rounded ns; steps laid back to back
    start = np.rint(df["start_ts"].to_numpy(np.float64) * 1e9).astype(np.int64)
    dur = np.rint(df["duration"].to_numpy(np.float64) * 1e9).astype(np.int64)
    st = pd.DataFrame({"step": df["step"], "s": start, "e": start + dur}).groupby("step").agg(
        s=("s", "min"), e=("e", "max")).sort_index()
    # step k+1's earliest op starts at step k's latest end (after both are offset)
    off = np.concatenate([[0], np.cumsum(st["e"].to_numpy()[:-1] - st["s"].to_numpy()[1:])])
    off = off.astype(np.int64) - int(st["s"].iloc[0])
    step_off = pd.Series(off, index=st.index)
    df["start"] = start + step_off.reindex(df["step"]).to_numpy()
    df["dur"] = dur
    df["end"] = df["start"] + dur

    spec = df["optype"].map(lambda o: OPTYPES.get(o, (OpKind.COMPUTE, CommOp.NONE,
                                                       Phase.UNKNOWN, _OTHER)))
    df["kind"] = np.array([int(s[0]) for s in spec], np.int8)
    df["comm_op"] = np.array([int(s[1]) for s in spec], np.int8)
    df["phase"] = np.array([int(s[2]) for s in spec], np.int8)
    df["role"] = np.array([s[3] for s in spec], np.int64)
    unknown = sorted(set(df["optype"]) - set(OPTYPES))

    # lanes: (rank, role)
    lk = df[["rank", "role"]].drop_duplicates().sort_values(["rank", "role"]).reset_index(drop=True)
    lk["lane"] = np.arange(len(lk), dtype=np.int32)
    df = df.merge(lk, on=["rank", "role"], how="left")
    df = df.sort_values(["rank", "lane", "start", "seq_id"], kind="stable").reset_index(drop=True)
    df["op_id"] = np.arange(len(df), dtype=np.int64)

    strings = StringTable()
    names = pd.Index(sorted(set(df["optype"])))
    ids = np.array([strings.intern(n) for n in names], np.int32)
    df["name_id"] = ids[names.get_indexer(df["optype"])]

    edges: list[pd.DataFrame] = []
    df["microbatch"] = np.where(df["kind"] == int(OpKind.COMPUTE), df["mb_id"], -1)
    df["chunk"] = np.where(df["mc"] >= 0, df["mc"], -1)
    p2p_info = _p2p(df, job, edges)
    _schedule(df, job, edges)
    groups, colls = _collectives(df, job, p2p_info)

    e = pd.concat(edges, ignore_index=True) if edges else pd.DataFrame({"src": [], "dst": []})
    e = e.drop_duplicates(["src", "dst"])
    e = e[e["src"] != e["dst"]]
    src, dst = e["src"].to_numpy(np.int64), e["dst"].to_numpy(np.int64)
    slack = df["start"].to_numpy()[dst] - df["end"].to_numpy()[src]
    ranks = df.groupby("rank")[["dp_rank", "stage"]].first().reset_index()
    meta = {
        "source_format": "oplevel",
        "sources": [{"path": str(pq_path), "format": "oplevel"}]
        + ([{"path": str(yaml_path), "format": "oplevel-meta"}] if yaml_path else []),
        "world_size": int(job["world_size"]),
        "devices": {},
        "job": {k: v for k, v in job.items() if isinstance(v, (int, float, str, bool))},
        "accounting": {str(pq_path): acc},
        "collectives": colls,
        "skipped_files": skipped,
        "oplevel": {
            "ranks": [{"rank": int(r.rank), "dp_rank": int(r.dp_rank), "stage": int(r.stage)}
                      for r in ranks.itertuples()],
            "steps": [int(s) for s in st.index],
            "step_offsets_ns": {str(int(k)): int(v) for k, v in step_off.items()},
            "negative_slack_edges": int((slack < 0).sum()),
            "max_negative_slack_ns": int(max(0, -slack.min())) if len(slack) else 0,
            "unknown_optypes": unknown,
            "layout": pipeline_layout(
                df["rank"].to_numpy(), df["step"].to_numpy(), df["stage"].to_numpy(),
                df["mc"].to_numpy(), df["mb_id"].to_numpy(), df["optype"].to_numpy(),
                df["start"].to_numpy(), job),
        },
    }
    lanes = {"lane": lk["lane"].to_numpy(), "rank": lk["rank"].to_numpy(),
             "device": lk["rank"].to_numpy(), "lane_kind": np.full(len(lk), int(LaneKind.OP_STREAM)),
             "native_id": lk["role"].to_numpy(),
             "name": [_LANE_NAMES[r] for r in lk["role"].to_numpy()]}
    ops = {"op_id": df["op_id"].to_numpy(), "rank": df["rank"].to_numpy(),
           "lane": df["lane"].to_numpy(), "kind": df["kind"].to_numpy(),
           "name_id": df["name_id"].to_numpy(), "start_ns": df["start"].to_numpy(),
           "dur_ns": df["dur"].to_numpy(), "step": df["step"].to_numpy(),
           "phase": df["phase"].to_numpy(), "microbatch": df["microbatch"].to_numpy(),
           "stage": df["stage"].to_numpy(), "chunk": df["chunk"].to_numpy(),
           "coll_id": df["coll_id"].to_numpy(), "comm_op": df["comm_op"].to_numpy(),
           "group_id": df["group_id"].to_numpy(), "peer": df["peer"].to_numpy(),
           "external_id": df["row"].to_numpy()}
    return Trace.build(ops=ops, lanes=lanes, strings=strings,
                       edges={"src": src, "dst": dst, "kind": np.full(len(src), int(EdgeKind.DATA)),
                              "lag_ns": np.zeros(len(src), np.int64)},
                       groups=groups, meta=meta)


def _sorted(df: pd.DataFrame, mask: np.ndarray) -> pd.DataFrame:
    return df[mask].sort_values(["step", "rank", "start", "seq_id"], kind="stable")


def _p2p(df: pd.DataFrame, job: dict[str, Any], edges: list[pd.DataFrame]) -> pd.DataFrame:
    """Match p2p ops to computes (edges) and number the valid ones for cross-rank pairing."""
    pp, vpp = int(job["pp_size"]), int(job["vpp_size"])
    ot = df["optype"].to_numpy()
    out = []
    for t in ("forward", "backward"):
        comp = _sorted(df, ot == f"{t}-compute")
        comp = comp.assign(k=comp.groupby(["step", "rank"]).cumcount())
        g = comp.groupby(["step", "rank"])
        bounds = pd.DataFrame({"last_start": g["start"].max(), "first_end": g["end"].min(),
                               "n_comp": g.size()}).reset_index()
        for sr in ("send", "recv"):
            optype = f"{t}-{sr}"
            _, is_send, delta, _ = _P2P[optype]
            c = _sorted(df, ot == optype).merge(bounds, on=["step", "rank"], how="left")
            if c.empty:
                continue
            if is_send:
                noop1 = (c["end"] < c["first_end"] - _EPS_NS).to_numpy()
            else:
                noop1 = (c["start"] > c["last_start"] + _EPS_NS).to_numpy()
            noop1 = noop1 | c["n_comp"].isna().to_numpy()
            c["noop1"] = noop1
            v = c[~noop1].copy()
            v["j"] = v.groupby(["step", "rank"]).cumcount()
            cnt = v.groupby(["step", "rank"])["j"].transform("size")
            shift = ((not is_send) & (cnt == v["n_comp"] - 1)).astype(np.int64)
            v["k"] = v["j"] + shift
            m = v.merge(comp[["step", "rank", "k", "op_id", "gmc", "mb_id", "mc"]].rename(
                columns={"op_id": "comp", "gmc": "cgmc", "mb_id": "cmb", "mc": "cmc"}),
                on=["step", "rank", "k"], how="left")
            has = m["comp"].notna().to_numpy()
            m = m[has].astype({"comp": np.int64})
            if is_send:
                edges.append(pd.DataFrame({"src": m["comp"], "dst": m["op_id"]}))
            else:
                edges.append(pd.DataFrame({"src": m["op_id"], "dst": m["comp"]}))
                prev = m[["step", "rank", "k", "op_id"]].assign(k=m["k"] - 1).merge(
                    comp[["step", "rank", "k", "op_id"]].rename(columns={"op_id": "pc"}),
                    on=["step", "rank", "k"])
                edges.append(pd.DataFrame({"src": prev["pc"], "dst": prev["op_id"]}))
            # matched p2p ops inherit the micro-batch and chunk of their compute
            df.loc[m["op_id"].to_numpy(), "microbatch"] = m["cmb"].to_numpy()
            df.loc[m["op_id"].to_numpy(), "chunk"] = m["cmc"].to_numpy()
            peer_gmc = m["cgmc"].to_numpy() + delta
            noop2 = pd.Series(False, index=c["op_id"].to_numpy())
            noop2.loc[m["op_id"].to_numpy()] = (peer_gmc < 0) | (peer_gmc >= vpp * pp)
            c["noop"] = c["noop1"].to_numpy() | noop2.reindex(c["op_id"]).to_numpy()
            out.append(c[["op_id", "step", "rank", "dp_rank", "stage", "optype", "start",
                          "seq_id", "noop"]])
    # first backward send/recv (seq 0) <- second forward-compute before the first backward
    comp = _sorted(df, np.isin(ot, ["forward-compute", "backward-compute"]))
    comp = comp.assign(i=comp.groupby(["step", "rank"]).cumcount())
    fb = comp[comp["optype"] == "backward-compute"].groupby(["step", "rank"])["i"].min()
    fb = fb[fb >= 2].rename("i").reset_index()
    fb["i"] -= 2
    anchor = fb.merge(comp[["step", "rank", "i", "op_id", "optype"]], on=["step", "rank", "i"])
    anchor = anchor[anchor["optype"] == "forward-compute"]
    first = df[np.isin(ot, ["backward-send", "backward-recv"]) & (df["seq_id"] == 0).to_numpy()]
    a = first[["step", "rank", "op_id"]].merge(anchor[["step", "rank", "op_id"]].rename(
        columns={"op_id": "src"}), on=["step", "rank"])
    edges.append(pd.DataFrame({"src": a["src"], "dst": a["op_id"]}))
    if not out:
        return pd.DataFrame(columns=["op_id", "step", "rank", "dp_rank", "stage", "optype",
                                     "start", "seq_id", "noop"])
    return pd.concat(out, ignore_index=True)


def _schedule(df: pd.DataFrame, job: dict[str, Any], edges: list[pd.DataFrame]) -> None:
    """params all-gather, post-compute chain and step-to-step edges."""
    ot = df["optype"].to_numpy()
    use_dp = int(job["dp_size"]) * int(job["dsp_size"]) > 1
    ovlp = "separate-grads-all-reduce" in set(ot)
    key = ["step", "rank"]
    # params-all-gather (highest seq per chunk) -> first forward-compute of that chunk
    ag = df[ot == "params-all-gather"].sort_values("seq_id").drop_duplicates(key + ["mc"], keep="last")
    fwd = _sorted(df, ot == "forward-compute").drop_duplicates(key + ["mc"], keep="first")
    m = ag[key + ["mc", "op_id"]].merge(fwd[key + ["mc", "op_id"]], on=key + ["mc"],
                                        suffixes=("_s", "_d"))
    if use_dp:
        edges.append(pd.DataFrame({"src": m["op_id_s"], "dst": m["op_id_d"]}))
    comp = df[np.isin(ot, ["forward-compute", "backward-compute"])]
    last = comp.sort_values("end", kind="stable").drop_duplicates(key, keep="last")
    # chain members in order (rank 0..): list of (order, optype filter)
    rs = df[ot == "grads-reduce-scatter"]
    parts = [last[key + ["op_id"]].assign(o=0, sub=0)]
    for o, name in ((1, "gc"), (2, "layernorm-grads-all-reduce"),
                    (3, "embedding-grads-all-reduce")):
        parts.append(df[ot == name][key + ["op_id", "seq_id"]].rename(
            columns={"seq_id": "sub"}).assign(o=o))
    if use_dp and not ovlp:
        parts.append(rs[key + ["op_id", "seq_id"]].rename(columns={"seq_id": "sub"}).assign(o=4))
    for o, name in ((5, "separate-grads-all-reduce"), (6, "optimizer-clip-main-grad"),
                    (7, "optimizer")):
        parts.append(df[ot == name][key + ["op_id", "seq_id"]].rename(
            columns={"seq_id": "sub"}).assign(o=o))
    ch = pd.concat(parts, ignore_index=True).sort_values(key + ["o", "sub"], kind="stable")
    same = (ch["step"].to_numpy()[1:] == ch["step"].to_numpy()[:-1]) & \
        (ch["rank"].to_numpy()[1:] == ch["rank"].to_numpy()[:-1])
    edges.append(pd.DataFrame({"src": ch["op_id"].to_numpy()[:-1][same],
                               "dst": ch["op_id"].to_numpy()[1:][same]}))
    if use_dp and ovlp:
        # reduce-scatters follow the last backward of their chunk; the last one feeds layernorm
        lb = df[ot == "backward-compute"].sort_values("end", kind="stable").drop_duplicates(
            key + ["mc"], keep="last")
        rs1 = rs.sort_values("seq_id").drop_duplicates(key + ["mc"], keep="first")
        m = rs1[key + ["mc", "op_id"]].merge(lb[key + ["mc", "op_id"]], on=key + ["mc"],
                                             suffixes=("_d", "_s"))
        edges.append(pd.DataFrame({"src": m["op_id_s"], "dst": m["op_id_d"]}))
        rl = rs.sort_values("seq_id").drop_duplicates(key, keep="last")
        nxt = ch[ch["o"] > 1].drop_duplicates(key, keep="first")
        m = rl[key + ["op_id"]].merge(nxt[key + ["op_id"]], on=key, suffixes=("_s", "_d"))
        edges.append(pd.DataFrame({"src": m["op_id_s"], "dst": m["op_id_d"]}))
    # optimizer of step k -> first op of step k+1 on each lane of the rank
    steps = np.sort(df["step"].unique())
    nxt_step = pd.Series(np.append(steps[1:], -1), index=steps)
    opt = df[ot == "optimizer"][key + ["op_id"]].copy()
    opt["step"] = nxt_step.reindex(opt["step"]).to_numpy()
    firsts = df.sort_values("start", kind="stable").drop_duplicates(key + ["lane"], keep="first")
    m = opt.merge(firsts[key + ["op_id"]], on=key, suffixes=("_s", "_d"))
    edges.append(pd.DataFrame({"src": m["op_id_s"], "dst": m["op_id_d"]}))


def _collectives(df: pd.DataFrame, job: dict[str, Any],
                 p2p: pd.DataFrame) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Fill coll_id / group_id / peer; return the groups table and the match counts."""
    pp, dp = int(job["pp_size"]), int(job["dp_size"])
    rank_of = df.groupby(["dp_rank", "stage"])["rank"].first()
    groups: list[dict[str, Any]] = []
    gid: dict[str, int] = {}

    def group(name: str, ranks: list[int]) -> int:
        if name not in gid:
            gid[name] = len(groups)
            groups.append({"group_id": gid[name], "name": name, "ranks": sorted(ranks)})
        return gid[name]

    ranks_all = sorted(int(r) for r in df["rank"].unique())
    world = group("world", ranks_all)
    dp_g = {s: group(f"dp:stage{s}", [int(r) for (d, st), r in rank_of.items() if st == s])
            for s in sorted(df["stage"].unique())}
    pp_g = {d: group(f"pp:dp{d}", [int(r) for (dd, st), r in rank_of.items() if dd == d])
            for d in sorted(df["dp_rank"].unique())}
    coll = np.full(len(df), -1, np.int64)
    grp = np.full(len(df), -1, np.int32)
    peer = np.full(len(df), -1, np.int32)
    colls: dict[str, Any] = {"matched": 0, "unmatched": 0, "unmatched_reasons": {},
                             "ops_matched": 0, "ops_unmatched": 0, "p2p_noops": 0}
    next_id = 0

    def count(ok_inst: np.ndarray, ops_ok: int, ops_bad: int, reason: str) -> None:
        colls["matched"] += int(ok_inst.sum())
        bad = int((~ok_inst).sum())
        colls["unmatched"] += bad
        if bad:
            colls["unmatched_reasons"][reason] = colls["unmatched_reasons"].get(reason, 0) + bad
        colls["ops_matched"] += ops_ok
        colls["ops_unmatched"] += ops_bad

    def assign(members: pd.DataFrame, by: list[str], expected: int, reason: str) -> None:
        # like the Kineto matcher, an incomplete instance keeps its coll_id (its members still
        # start together) and is counted as unmatched
        nonlocal next_id
        if members.empty:
            return
        inst = members.groupby(by, sort=True).ngroup().to_numpy()
        ok_inst = np.bincount(inst) == expected
        coll[members["op_id"].to_numpy()] = inst + next_id
        next_id += len(ok_inst)
        ok = ok_inst[inst]
        count(ok_inst, int(ok.sum()), int((~ok).sum()), reason)

    ot = df["optype"]
    # DP collectives over the DP ranks of a stage
    dpm = df[ot.isin(["params-all-gather", "grads-reduce-scatter", "separate-grads-all-reduce"])]
    grp[dpm["op_id"].to_numpy()] = [dp_g[s] for s in dpm["stage"].to_numpy()]
    assign(dpm, ["step", "stage", "optype", "seq_id"], dp, "dp_collective_missing_members")
    emb = df[ot == "embedding-grads-all-reduce"]
    if len(emb):
        eg = {d: group(f"embedding:dp{d}", sorted({int(rank_of.get((d, 0), -1)),
                                                   int(rank_of.get((d, pp - 1), -1))} - {-1}))
              for d in sorted(emb["dp_rank"].unique())}
        grp[emb["op_id"].to_numpy()] = [eg[d] for d in emb["dp_rank"].to_numpy()]
        assign(emb, ["step", "dp_rank", "seq_id"], 2 if pp > 1 else 1,
               "embedding_missing_members")
    clip = df[ot == "optimizer-clip-main-grad"]
    grp[clip["op_id"].to_numpy()] = world
    assign(clip, ["step", "seq_id"], len(ranks_all), "clip_missing_members")
    ln = df[ot == "layernorm-grads-all-reduce"]
    if len(ln):
        tg = {r: group(f"tp:rank{r}", [int(r)]) for r in sorted(ln["rank"].unique())}
        grp[ln["op_id"].to_numpy()] = [tg[r] for r in ln["rank"].to_numpy()]
        assign(ln, ["step", "rank", "seq_id"], 1, "layernorm_missing")
    # P2P pairs
    if len(p2p):
        grp[p2p["op_id"].to_numpy()] = [pp_g[d] for d in p2p["dp_rank"].to_numpy()]
        noop = p2p["noop"].to_numpy(bool)
        colls["p2p_noops"] = int(noop.sum())
        v = p2p[~noop].sort_values(["step", "rank", "start", "seq_id"], kind="stable").copy()
        v["v"] = v.groupby(["step", "rank", "optype"]).cumcount()
        info = v["optype"].map(_P2P)
        v["peer_stage"] = (v["stage"].to_numpy() + np.array([i[2] for i in info]) + pp) % pp
        v["peer_optype"] = [i[3] for i in info]
        m = v.merge(v[["step", "dp_rank", "stage", "optype", "v", "op_id", "rank"]].rename(
            columns={"stage": "peer_stage", "optype": "peer_optype", "op_id": "peer_op",
                     "rank": "peer_rank"}), on=["step", "dp_rank", "peer_stage", "peer_optype", "v"])
        sends = m[m["optype"].str.endswith("send")]
        ids = np.arange(len(sends), dtype=np.int64) + next_id
        next_id += len(sends)
        coll[sends["op_id"].to_numpy()] = ids
        coll[sends["peer_op"].to_numpy()] = ids
        peer[m["op_id"].to_numpy()] = m["peer_rank"].to_numpy()
        unpaired = len(v) - 2 * len(sends)
        count(np.ones(len(sends), bool), 2 * len(sends), unpaired, "p2p_partner_missing")
        if unpaired:  # one-member instances without coll_id
            colls["unmatched"] += unpaired
            colls["unmatched_reasons"]["p2p_partner_missing"] = unpaired
    df["coll_id"] = coll
    df["group_id"] = grp
    df["peer"] = peer
    return groups, colls


def pipeline_layout(rank: np.ndarray, step: np.ndarray, stage: np.ndarray, chunk: np.ndarray,
                    microbatch: np.ndarray, optype: np.ndarray, start_ns: np.ndarray,
                    job: dict[str, Any]) -> dict[str, Any]:
    """The job's layout as measured: ``dp, pp, tp, cp, chunks`` from the job metadata,
    ``microbatches`` (the most common count of a rank's forward computes in a step, over
    ``chunks``), and ``schedule`` / ``schedule_match`` from the program order of the computes
    of each (rank, step), at most 4096 of them (:func:`collectors.synth.schedule.
    match_schedule`; 1.0: every one ran exactly that order)."""
    from .synth.schedule import match_schedule

    p, v = int(job["pp_size"]), int(job["vpp_size"])
    out: dict[str, Any] = {"dp": int(job["dp_size"]), "pp": p, "tp": int(job["tp_size"]),
                           "cp": int(job["dsp_size"]), "chunks": v, "microbatches": 0,
                           "schedule": "unknown", "schedule_match": 0.0}
    comp = (optype == "forward-compute") | (optype == "backward-compute")
    if not comp.any():
        return out
    idx = np.flatnonzero(comp)
    idx = idx[np.lexsort((start_ns[idx], step[idx], rank[idx]))]
    key = np.stack([rank[idx], step[idx]], axis=1)
    cut = np.flatnonzero(np.any(key[1:] != key[:-1], axis=1)) + 1
    groups = np.split(idx, cut)
    n_fwd = np.array([(optype[g] == "forward-compute").sum() for g in groups])
    vals, cnt = np.unique(n_fwd, return_counts=True)
    m = int(vals[np.argmax(cnt)]) // max(v, 1)
    out["microbatches"] = m
    if m == 0:
        return out
    if len(groups) > 4096:  # bounded ingest time: an even sample of (rank, step) sequences
        groups = groups[::-(-len(groups) // 4096)]
    seqs = [(int(stage[g[0]]), list(zip((optype[g] == "backward-compute").tolist(),
                                        microbatch[g].tolist(), np.maximum(chunk[g], 0).tolist(),
                                        strict=True))) for g in groups]
    out["schedule"], out["schedule_match"] = match_schedule(seqs, p, m, v)
    return out
