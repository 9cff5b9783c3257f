"""Compression what-ifs: shrink the messages of one parallel dimension, pay a codec.

``compression.dp`` / ``tp`` / ``pp`` (ratios >= 1) divide the bytes that collectives of
that dimension move; ``compression.codec_gbps`` is the codec's throughput per GPU (each
pass over the uncompressed bytes: compressing before the transfer, decompressing after;
not given: an ideal codec that costs nothing).

Which collectives belong to a dimension:

* synthesized runs: by process group (``tp*``; ``dp*`` and ``emb*``, the gradient
  all-reduces; ``pp*`` and pipeline send/receive);
* measured traces: a group whose name says ``tp`` / ``tensor``, ``pp`` / ``pipe`` or
  ``dp`` / ``data`` belongs there; otherwise (the usual ``default_pg``) all-reduces,
  reduce-scatters and all-gathers are data-parallel (gradients and parameters; all-to-all
  and broadcasts are not compressed) and send/receive are pipeline-parallel. A ratio for
  a dimension the trace has no collectives of is refused, naming the groups it has.

Transfer time. A compressed collective's transfer tail shrinks by
``S f (1 - 1/r) / B``: ``S`` its bytes, ``f`` the nccl-tests bus factor, ``B`` the bus
bandwidth of its level; latency terms are unchanged. Synthesized runs use the synthesizer's
own alpha-beta model per group (so the change is exactly the model's ``t(S) - t(S/r)``);
measured traces the alpha-beta fit per level of :func:`.link_fit.calibrate` (collectives
must carry sizes).

Codec. On each member's rank the compressor runs on the compute stream right after the
last compute op that ended before the collective started (the collective now waits for
it) and the decompressor before the first compute op that started after the collective
ended (that op now waits for the collective): ``S / codec_gbps`` each, so they delay the
compute behind them on the stream, as kernels on the compute stream do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from retime.collectors.enums import CommOp, LaneKind, OpKind
from retime.collectors.errors import PolicyError

from .base import Policy, WhatIfState, check_positive, known_fields
from .link_fit import calibrate, collective_table

__all__ = ["Compression", "DIMS", "dimension_of"]

DIMS = ("dp", "tp", "pp")
_NAMED = {"tp": re.compile(r"(^|[^a-z])(tp|tensor)", re.I),
          "pp": re.compile(r"(^|[^a-z])(pp|pipe)", re.I),
          "dp": re.compile(r"(^|[^a-z])(dp|data|emb|fsdp|zero)", re.I)}
_DP_OPS = (CommOp.ALL_REDUCE, CommOp.REDUCE_SCATTER, CommOp.ALL_GATHER)


@dataclass(frozen=True)
class Compression(Policy):
    """Per-dimension compression ratios (>= 1) and codec throughput (GB/s per GPU)."""

    dp: float | None = None
    tp: float | None = None
    pp: float | None = None
    codec_gbps: float | None = None
    table: ClassVar[str] = "compression"

    @classmethod
    def synth_columns_for(cls, fields: frozenset[str]) -> tuple[str, ...] | None:
        """On a synthesized store the compressed collectives are re-priced from the run's
        hardware: no ops column beyond :data:`replay.footprint.WHATIF_COLUMNS`."""
        return () if fields <= known_fields(cls) else None

    def __post_init__(self) -> None:
        for f in DIMS:
            v = getattr(self, f)
            check_positive("compression", f, v)
            if v is not None and v < 1:
                raise PolicyError(f"compression.{f}={v!r} must be >= 1 (the factor the "
                                  "messages shrink by; 1 = uncompressed)")
        check_positive("compression", "codec_gbps", self.codec_gbps)

    def ratios(self) -> dict[str, float]:
        return {d: float(getattr(self, d)) for d in DIMS if getattr(self, d) is not None}

    def apply(self, state: WhatIfState) -> None:
        d = self.describe()
        ratios = {k: v for k, v in self.ratios().items() if v > 1}
        if ratios:
            d["compression_effect"] = _compress(state, ratios, self.codec_gbps)
        state.applied.append(d)


def dimension_of(trace) -> tuple[np.ndarray, dict[str, str]]:
    """Per op: 0 dp, 1 tp, 2 pp, -1 not compressible (module docstring); and the rule used
    per group name."""
    o = trace.ops
    kind = o["kind"].to_numpy()
    cop = o["comm_op"].to_numpy()
    gid = o["group_id"].to_numpy()
    dim = np.full(len(o), -1, np.int8)
    rules: dict[str, str] = {}
    gname = {int(g): str(n) for g, n in zip(trace.groups["group_id"], trace.groups["name"],
                                            strict=True)} if len(trace.groups) else {}
    coll = kind == OpKind.COLLECTIVE
    for g in np.unique(gid[coll | (kind == OpKind.P2P)]).tolist():
        name = gname.get(int(g), str(g))
        hit = [k for k in ("tp", "pp", "dp") if _NAMED[k].search(name.split(":", 1)[-1])]
        on = (gid == g) & (coll | (kind == OpKind.P2P))
        if hit:
            dim[on] = DIMS.index(hit[0])
            rules[name] = hit[0]
        else:
            dim[on & coll & np.isin(cop, [int(c) for c in _DP_OPS])] = 0
            dim[on & (kind == OpKind.P2P)] = 2
            rules[name] = "dp (all-reduce / reduce-scatter / all-gather), pp (send / recv)"
    return dim, rules


def _compress(state: WhatIfState, ratios: dict[str, float],
              codec_gbps: float | None) -> dict[str, Any]:
    t = state.trace
    o = t.ops
    dim, rules = dimension_of(t)
    nbytes = o["bytes"].to_numpy().astype(np.float64)
    sel = np.zeros(len(o), bool)
    r_of = np.ones(len(o))
    for k, r in ratios.items():
        m = dim == DIMS.index(k)
        if not m.any():
            raise PolicyError(f"compression.{k}: the trace has no {k} collectives (groups: "
                              f"{'; '.join(f'{n} -> {v}' for n, v in rules.items()) or 'none'})")
        if not (nbytes[m] > 0).any():
            raise PolicyError(f"compression.{k}: the trace's {k} collectives carry no sizes "
                              "(ops.bytes is 0), so the transfer they save is unknown; "
                              "re-ingest a trace whose NCCL kernels record message sizes")
        sel |= m
        r_of[m] = r
    sel &= nbytes > 0
    ops = np.flatnonzero(sel)
    save = (1.0 - 1.0 / r_of[ops])
    if state.is_synth:
        delta, model = _synth_saving(state, ops, nbytes, r_of)
    else:
        delta, model = _measured_saving(state, ops, nbytes, save)
    state.dur[ops] -= delta
    out: dict[str, Any] = {"collectives": int(len(ops)), "model": model,
                           "bytes_saved": int(round(float((nbytes[ops] * save).sum()))),
                           "transfer_saved_ns": int(round(float(delta.sum())))}
    if codec_gbps:
        out.update(_codec(state, ops, nbytes, float(codec_gbps)))
    return out


def _measured_saving(state: WhatIfState, ops: np.ndarray, nbytes: np.ndarray,
                     save: np.ndarray) -> tuple[np.ndarray, str]:
    tab = collective_table(state.trace, state.graph, state.ranks_per_node)
    cal = calibrate(state.trace, state.graph, tab)
    pos = {int(o): i for i, o in enumerate(tab["op"].tolist())}
    idx = np.asarray([pos[int(o)] for o in ops], np.int64)
    x = nbytes[ops] * tab["factor"][idx]
    lv = tab["old_level"][idx]
    bw = np.full(len(ops), np.nan)
    for level in np.unique(lv).tolist():
        c = cal.get(int(level))
        if c is None or not np.isfinite(c["busbw_gbps"]):
            raise PolicyError("compression: the trace's collectives at the "
                              f"{['intra', 'inter', 'cross_dc'][int(level)]}-node level "
                              "cannot be calibrated (no sized last-arriver transfers); the "
                              "transfer time saved is unknown")
        bw[lv == level] = c["busbw_gbps"]
    state.notes.setdefault("network_calibration", {
        ["intra", "inter", "cross_dc"][k]: v for k, v in cal.items()})
    return x * save / bw, "measured: alpha-beta fit per level (link_fit.calibrate)"


def _synth_saving(state: WhatIfState, ops: np.ndarray, nbytes: np.ndarray,
                  r_of: np.ndarray) -> tuple[np.ndarray, str]:
    from retime.collectors.synth import CommModel, resolve_parallel
    spec = state.synth
    cm = CommModel(spec.hardware, resolve_parallel(dict(spec.parallel)))
    t = state.trace
    o = t.ops
    kind = o["kind"].to_numpy()
    cop = o["comm_op"].to_numpy()
    gid = o["group_id"].to_numpy()
    gname = {int(g): str(n) for g, n in zip(t.groups["group_id"], t.groups["name"],
                                            strict=True)}
    granks = {int(g): list(map(int, r)) for g, r in zip(t.groups["group_id"],
                                                        t.groups["ranks"], strict=True)}
    delta = np.zeros(len(ops))
    memo: dict[tuple, float] = {}
    for j, i in enumerate(ops.tolist()):
        key = (int(kind[i]), int(cop[i]), int(gid[i]), float(nbytes[i]), float(r_of[i]))
        v = memo.get(key)
        if v is None:
            if kind[i] == OpKind.P2P:
                grp = re.sub(r"\d+$", "", gname.get(int(gid[i]), "pp")) or "pp"
                grp = grp if grp in cm.geometry else "pp"
                v = cm.p2p_ns(nbytes[i], grp) - cm.p2p_ns(nbytes[i] / r_of[i], grp)
            else:
                rs = granks.get(int(gid[i]), [])
                stride = int(np.diff(rs).min()) if len(rs) > 1 else 1
                geo = cm.geometry_of(max(len(rs), 1), stride)
                v = cm.collective_ns(int(cop[i]), nbytes[i], geo) \
                    - cm.collective_ns(int(cop[i]), nbytes[i] / r_of[i], geo)
            memo[key] = v = float(max(v, 0))
        delta[j] = v
    return delta, "synthesized: the synthesizer's alpha-beta model per group, t(S) - t(S/r)"


def _codec(state: WhatIfState, ops: np.ndarray, nbytes: np.ndarray,
           codec_gbps: float) -> dict[str, Any]:
    t = state.trace
    o = t.ops
    kind = o["kind"].to_numpy()
    rank = o["rank"].to_numpy()
    lane = o["lane"].to_numpy()
    start = o["start_ns"].to_numpy()
    end = start + o["dur_ns"].to_numpy()
    lanes = t.lanes
    lk = np.full(int(lanes["lane"].max()) + 1, -1, np.int64)
    lk[lanes["lane"].to_numpy()] = lanes["lane_kind"].to_numpy()
    comp = np.isin(kind, [OpKind.KERNEL, OpKind.COMPUTE]) & (lk[lane] != LaneKind.CPU_THREAD)
    # the compute stream of a rank: the device lane with the most compute time
    cs = {}
    ci = np.flatnonzero(comp)
    tot = np.bincount(lane[ci], weights=o["dur_ns"].to_numpy()[ci].astype(float),
                      minlength=len(lk))
    for r in np.unique(rank[ops]).tolist():
        cand = np.unique(lane[ci][rank[ci] == r])
        if len(cand) == 0:
            raise PolicyError(f"compression.codec_gbps: rank {r} has no GPU compute stream to "
                              "run the codec on")
        cs[r] = int(cand[np.argmax(tot[cand])])
    src, dst = [], []
    codec_ns = nbytes / codec_gbps  # bytes / (GB/s) = ns
    added = 0.0
    for r in cs:
        on = np.flatnonzero(comp & (lane == cs[r]))
        on_s = on[np.argsort(start[on], kind="stable")]
        e_sorted = np.sort(end[on])
        e_op = on[np.argsort(end[on], kind="stable")]
        mine = ops[rank[ops] == r]
        # compressor after the last compute op that ended before the collective started
        a = np.searchsorted(e_sorted, start[mine], side="right") - 1
        # decompressor before the first compute op that started after it ended
        b = np.searchsorted(start[on_s], end[mine], side="left")
        for i, ia, ib in zip(mine.tolist(), a.tolist(), b.tolist(), strict=True):
            c = float(codec_ns[i])
            if ia >= 0:
                p = int(e_op[ia])
                state.dur[p] += c
                src.append(p)
                dst.append(i)
            else:  # nothing before it on the stream: the collective itself carries it
                state.dur[i] += c
            if ib < len(on_s):
                q = int(on_s[ib])
                state.dur[q] += c
                src.append(i)
                dst.append(q)
            else:
                state.dur[i] += c
            added += 2 * c
    if src:
        state.add_edges(np.asarray(src, np.int64), np.asarray(dst, np.int64))
    return {"codec_gbps": codec_gbps, "codec_ns": int(round(added)),
            "codec_edges": int(len(src))}
