"""Chakra execution traces (MLCommons Chakra ET, ``et_def.proto``): write and read.

A Chakra ET file holds one rank: a stream of length-delimited protobuf messages (each a
varint byte count, then the message), ``GlobalMetadata`` first, then ``Node`` messages.
The message types are built here from the published schema (package ``ChakraProtoMsg``:
``AttributeProto`` with its ``oneof value``, ``NodeType``, ``CollectiveCommType``,
``GlobalMetadata``, ``Node``, ``IOInfo``, ``Tensor``) through ``descriptor_pb2`` and the
message factory, so no ``protoc`` step is needed; the bytes are those the schema defines.

What :func:`write_chakra` writes per rank (``DIR/PREFIX.RANK.et``):

* every op of the rank as a node (id = its op id): kernels, copies, sets and host ops as
  ``COMP_NODE`` (attr ``is_cpu_op``; ``num_ops`` = FLOPs where known), collectives as
  ``COMM_COLL_NODE`` (``comm_type``, ``comm_size`` bytes, ``pg_name`` = process group,
  ``comm_group_ranks``), sends / receives as ``COMM_SEND_NODE`` / ``COMM_RECV_NODE``
  (``comm_dst`` / ``comm_src``, ``comm_size``, ``comm_tag`` = the pair's order);
  ``start_time_micros`` / ``duration_micros`` from the trace (rounded to us; ``dur_ns`` and
  ``start_ns`` keep the nanoseconds);
* dependencies from retime's edges inside the rank: ``SYNC`` and ``DATA`` edges as
  ``data_deps``; ``LAUNCH`` and ``HOST_ORDER`` edges, and each op's predecessor on its lane
  (streams and threads run in order), as ``ctrl_deps``. Cross-rank edges (collective
  membership, p2p pairs) are carried by the comm attributes, as Chakra expects;
* host time the edges carry (a ``HOST_ORDER`` gap: Python / framework time between traced
  ops) and the time an op waited beyond all its dependencies (a wait on something
  unrecorded) become ``COMP_NODE``\\s named ``retime:host_gap`` / ``retime:delay``
  (``is_cpu_op`` true, ids after the ops) between the two ops, so that a simulator
  replaying the file keeps them (Chakra's own PyTorch converter drops them). A dependency
  the measurement shows overlapping (a kernel starting before its launch call returned,
  ops overlapping on a lane) cannot be an end-to-start edge: it becomes a
  ``retime:start_offset`` node that waits for what the source waited for and lasts the
  measured start offset. List-scheduling a rank's file (each node starts when all its
  dependencies have ended) gives back every op's measured start, collectives aside (they
  also wait for other ranks).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .enums import CommOp, EdgeKind, LaneKind, OpKind
from .errors import TraceFormatError
from .trace import Trace

__all__ = ["SCHEMA_VERSION", "NODE_TYPES", "COLL_TYPES", "chakra_messages", "write_chakra",
           "read_chakra", "encode_stream", "decode_stream"]

#: Chakra ET schema version this writer follows
SCHEMA_VERSION = "0.0.4"
NODE_TYPES = {"INVALID_NODE": 0, "METADATA_NODE": 1, "MEM_LOAD_NODE": 2, "MEM_STORE_NODE": 3,
              "COMP_NODE": 4, "COMM_SEND_NODE": 5, "COMM_RECV_NODE": 6, "COMM_COLL_NODE": 7}
COLL_TYPES = {"ALL_REDUCE": 0, "REDUCE": 1, "ALL_GATHER": 2, "GATHER": 3, "SCATTER": 4,
              "BROADCAST": 5, "ALL_TO_ALL": 6, "REDUCE_SCATTER": 7, "REDUCE_SCATTER_BLOCK": 8,
              "BARRIER": 9}
_COMM_TO_COLL = {CommOp.ALL_REDUCE: 0, CommOp.REDUCE: 1, CommOp.ALL_GATHER: 2,
                 CommOp.GATHER: 3, CommOp.SCATTER: 4, CommOp.BROADCAST: 5,
                 CommOp.ALL_TO_ALL: 6, CommOp.REDUCE_SCATTER: 7, CommOp.BARRIER: 9}

# AttributeProto's oneof: (field name, number, scalar type or list message)
_SCALARS = [("double", 3, "TYPE_DOUBLE"), ("float", 5, "TYPE_FLOAT"), ("int32", 7, "TYPE_INT32"),
            ("int64", 9, "TYPE_INT64"), ("uint32", 11, "TYPE_UINT32"),
            ("uint64", 13, "TYPE_UINT64"), ("sint32", 15, "TYPE_SINT32"),
            ("sint64", 17, "TYPE_SINT64"), ("fixed32", 19, "TYPE_FIXED32"),
            ("fixed64", 21, "TYPE_FIXED64"), ("sfixed32", 23, "TYPE_SFIXED32"),
            ("sfixed64", 25, "TYPE_SFIXED64"), ("bool", 27, "TYPE_BOOL"),
            ("string", 29, "TYPE_STRING"), ("bytes", 31, "TYPE_BYTES")]

_MESSAGES: dict[str, Any] | None = None


def chakra_messages() -> dict[str, Any]:
    """The Chakra ET message classes (``GlobalMetadata``, ``Node``, ``AttributeProto``,
    ``IOInfo``, ``Tensor`` and the ``*List`` helpers), built once from the schema."""
    global _MESSAGES
    if _MESSAGES is not None:
        return _MESSAGES
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError as exc:  # a declared dependency; guard a broken install
        raise TraceFormatError("Chakra export needs the 'protobuf' package; "
                               "pip install protobuf") from exc
    F = descriptor_pb2.FieldDescriptorProto
    fp = descriptor_pb2.FileDescriptorProto(name="retime_chakra/et_def.proto",
                                            package="ChakraProtoMsg", syntax="proto3")

    def msg(name: str, fields: list[tuple], oneof: str | None = None):
        m = fp.message_type.add(name=name)
        if oneof:
            m.oneof_decl.add(name=oneof)
        for fname, num, ftype, label, tname, in_oneof in fields:
            f = m.field.add(name=fname, number=num, type=getattr(F, ftype),
                            label=getattr(F, label))
            if tname:
                f.type_name = f".ChakraProtoMsg.{tname}"
            if in_oneof:
                f.oneof_index = 0
        return m

    for base, _num, ftype in _SCALARS:
        msg(f"{base.capitalize()}List",
            [("values", 1, ftype, "LABEL_REPEATED", None, False)])
    attr_fields = [("name", 1, "TYPE_STRING", "LABEL_OPTIONAL", None, False),
                   ("doc_string", 2, "TYPE_STRING", "LABEL_OPTIONAL", None, False)]
    for base, num, ftype in _SCALARS:
        attr_fields.append((f"{base}_val", num, ftype, "LABEL_OPTIONAL", None, True))
        attr_fields.append((f"{base}_list", num + 1, "TYPE_MESSAGE", "LABEL_OPTIONAL",
                            f"{base.capitalize()}List", True))
    msg("AttributeProto", attr_fields, oneof="value")
    for ename, vals in (("NodeType", NODE_TYPES), ("CollectiveCommType", COLL_TYPES)):
        en = fp.enum_type.add(name=ename)
        for k, v in vals.items():
            en.value.add(name=k, number=v)
    msg("GlobalMetadata", [("version", 1, "TYPE_STRING", "LABEL_OPTIONAL", None, False),
                           ("attr", 2, "TYPE_MESSAGE", "LABEL_REPEATED", "AttributeProto",
                            False)])
    msg("IOInfo", [("values", 1, "TYPE_STRING", "LABEL_OPTIONAL", None, False),
                   ("shapes", 2, "TYPE_STRING", "LABEL_OPTIONAL", None, False),
                   ("types", 3, "TYPE_STRING", "LABEL_OPTIONAL", None, False)])
    msg("Tensor", [("tensor_id", 1, "TYPE_UINT64", "LABEL_OPTIONAL", None, False),
                   ("storage_id", 2, "TYPE_UINT64", "LABEL_OPTIONAL", None, False),
                   ("offset", 3, "TYPE_UINT64", "LABEL_OPTIONAL", None, False),
                   ("num_elem", 4, "TYPE_UINT64", "LABEL_OPTIONAL", None, False),
                   ("elem_bytes", 5, "TYPE_UINT64", "LABEL_OPTIONAL", None, False),
                   ("device", 6, "TYPE_STRING", "LABEL_OPTIONAL", None, False)])
    node = msg("Node", [
        ("id", 1, "TYPE_UINT64", "LABEL_OPTIONAL", None, False),
        ("name", 2, "TYPE_STRING", "LABEL_OPTIONAL", None, False),
        ("type", 3, "TYPE_ENUM", "LABEL_OPTIONAL", "NodeType", False),
        ("ctrl_deps", 4, "TYPE_UINT64", "LABEL_REPEATED", None, False),
        ("data_deps", 5, "TYPE_UINT64", "LABEL_REPEATED", None, False),
        ("start_time_micros", 6, "TYPE_UINT64", "LABEL_OPTIONAL", None, False),
        ("duration_micros", 7, "TYPE_UINT64", "LABEL_OPTIONAL", None, False),
        ("inputs", 8, "TYPE_MESSAGE", "LABEL_OPTIONAL", "IOInfo", False),
        ("outputs", 9, "TYPE_MESSAGE", "LABEL_OPTIONAL", "IOInfo", False),
        ("attr", 10, "TYPE_MESSAGE", "LABEL_REPEATED", "AttributeProto", False)])
    del node
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fp)
    out = {}
    for m in fp.message_type:
        out[m.name] = message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"ChakraProtoMsg.{m.name}"))
    _MESSAGES = out
    return out


# ---------------------------------------------------------------------------- framing
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_stream(messages) -> bytes:
    """Messages as Chakra frames them: varint length, then the serialized message."""
    parts = []
    for m in messages:
        b = m.SerializeToString()
        parts.append(_varint(len(b)))
        parts.append(b)
    return b"".join(parts)


def decode_stream(data: bytes, where: str = "stream") -> list[bytes]:
    """The message payloads of a length-delimited stream."""
    out, i, n = [], 0, len(data)
    while i < n:
        size, shift = 0, 0
        while True:
            if i >= n or shift > 63:
                raise TraceFormatError(f"{where}: truncated length prefix at byte {i}; not a "
                                       "Chakra ET file (or a damaged one)")
            b = data[i]
            i += 1
            size |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if i + size > n:
            raise TraceFormatError(f"{where}: message at byte {i} runs past the end "
                                   f"({size} bytes, {n - i} left); the file is truncated")
        out.append(data[i:i + size])
        i += size
    return out


def read_chakra(path: str | os.PathLike[str]) -> tuple[Any, list[Any]]:
    """``(GlobalMetadata, [Node, ...])`` of one Chakra ET file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise TraceFormatError(f"{p}: cannot read ({exc.strerror})") from exc
    msgs = chakra_messages()
    frames = decode_stream(data, str(p))
    if not frames:
        raise TraceFormatError(f"{p}: empty; a Chakra ET file starts with GlobalMetadata")
    meta = msgs["GlobalMetadata"]()
    try:
        meta.ParseFromString(frames[0])
        nodes = []
        for f in frames[1:]:
            nd = msgs["Node"]()
            nd.ParseFromString(f)
            nodes.append(nd)
    except Exception as exc:  # protobuf's DecodeError
        raise TraceFormatError(f"{p}: not a Chakra ET protobuf stream ({exc})") from exc
    return meta, nodes


def attr_value(a) -> Any:
    """The Python value of an ``AttributeProto`` (lists as lists)."""
    which = a.WhichOneof("value")
    if which is None:
        return None
    v = getattr(a, which)
    return list(v.values) if which.endswith("_list") else v


# ---------------------------------------------------------------------------- writing
def _attr(msgs, name: str, kind: str, value) -> Any:
    a = msgs["AttributeProto"](name=name)
    if kind.endswith("_list"):
        getattr(a, kind).values.extend(value)
    else:
        setattr(a, kind, value)
    return a


def write_chakra(trace: Trace, out_dir: str | os.PathLike[str], *, prefix: str = "et",
                 overwrite: bool = False) -> list[Path]:
    """Write one Chakra ET file per rank of ``trace`` into ``out_dir`` (module docstring).

    The directory is written next to its final place and renamed in, so nothing partial is
    left behind. ``overwrite`` replaces an existing directory only if it holds nothing but
    ``*.et`` files. Returns the files written.
    """
    out = Path(out_dir)
    if out.exists():
        if not out.is_dir():
            raise TraceFormatError(f"{out}: exists and is not a folder; give --chakra a folder")
        others = [p.name for p in out.iterdir() if not p.name.endswith(".et")]
        if others:
            raise TraceFormatError(f"{out}: holds other files ({', '.join(others[:3])}); "
                                   "retime replaces only a folder of Chakra .et files, choose "
                                   "another folder")
        if not overwrite:
            raise TraceFormatError(f"{out}: already exists; pass --force to replace it")
    if trace.n_ops == 0:
        raise TraceFormatError("the trace has no ops; nothing to export")
    msgs = chakra_messages()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    files = []
    try:
        for r, blob in _rank_streams(trace, msgs, prefix):
            f = tmp / f"{prefix}.{r}.et"
            f.write_bytes(blob)
            files.append(out / f.name)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return files


def _rank_streams(trace: Trace, msgs, prefix: str):
    o = trace.ops
    n = len(o)
    names = trace.names()  # per op
    rank = o["rank"].to_numpy()
    lane = o["lane"].to_numpy().astype(np.int64)
    kind = o["kind"].to_numpy()
    start = o["start_ns"].to_numpy().astype(np.int64)
    dur = o["dur_ns"].to_numpy().astype(np.int64)
    cop = o["comm_op"].to_numpy()
    nbytes = o["bytes"].to_numpy()
    gid = o["group_id"].to_numpy()
    peer = o["peer"].to_numpy()
    flops = o["flops"].to_numpy()
    lanes = trace.lanes
    lk = np.full(int(lanes["lane"].max()) + 1, -1, np.int64)
    lk[lanes["lane"].to_numpy()] = lanes["lane_kind"].to_numpy()
    cpu = lk[lane] == LaneKind.CPU_THREAD
    groups = {int(g): (str(nm), list(map(int, rs))) for g, nm, rs in
              zip(trace.groups["group_id"], trace.groups["name"], trace.groups["ranks"],
                  strict=True)} if len(trace.groups) else {}
    # lane predecessors (FIFO order by measured start, ties by op id, as the replay)
    lo = np.lexsort((np.arange(n), start, lane))
    same = np.r_[False, lane[lo][1:] == lane[lo][:-1]]
    lane_prev = np.full(n, -1, np.int64)
    lane_prev[lo[same]] = lo[np.flatnonzero(same) - 1]
    e = trace.edges
    es, ed = e["src"].to_numpy(), e["dst"].to_numpy()
    ek, el = e["kind"].to_numpy(), e["lag_ns"].to_numpy()
    local = rank[es] == rank[ed]
    # p2p tags: the order of each (rank, peer, direction) pair
    tag = np.zeros(n, np.int64)
    p2p = np.flatnonzero(kind == OpKind.P2P)
    if len(p2p):
        key = rank[p2p].astype(np.int64) * (1 << 32) + peer[p2p] * 2 + (cop[p2p] == CommOp.RECV)
        srt = np.lexsort((start[p2p], key))
        k2 = key[srt]
        first = np.r_[True, k2[1:] != k2[:-1]]
        idx = np.arange(len(k2)) - np.maximum.accumulate(np.where(first, np.arange(len(k2)), 0))
        tag[p2p[srt]] = idx
    origin = int(start.min())
    world = int(trace.world_size)
    for r in np.unique(rank).tolist():
        ids = np.flatnonzero(rank == r)
        next_id = n  # gap / delay nodes get ids after every op id
        meta = msgs["GlobalMetadata"](version=SCHEMA_VERSION)
        meta.attr.extend([
            _attr(msgs, "schema", "string_val", "retime"),
            _attr(msgs, "rank", "int64_val", int(r)),
            _attr(msgs, "world_size", "int64_val", world),
            _attr(msgs, "source_format", "string_val", str(trace.meta.get("source_format",
                                                                              "unknown"))),
            _attr(msgs, "time_origin_ns", "int64_val", origin),
            # where the rank's first op starts (from the origin); its nodes without
            # dependencies are ready then: list-scheduled starts count from it
            _attr(msgs, "rank_start_ns", "int64_val", int(start[ids].min()) - origin),
            _attr(msgs, "file_prefix", "string_val", prefix)])
        out = [meta]
        ctrl: dict[int, set] = {int(i): set() for i in ids}
        data: dict[int, set] = {int(i): set() for i in ids}
        s2s: dict[int, list[int]] = {}  # op -> ops it starts a fixed offset after
        end = start + dur

        def dep(d_: int, s_: int, is_data: bool, end=end, s2s=s2s, data=data,
                ctrl=ctrl) -> None:
            if start[d_] < end[s_]:  # measured overlap: counts from the source's start
                s2s.setdefault(d_, []).append(s_)
            else:
                (data if is_data else ctrl)[d_].add(s_)
        for i, p in zip(ids.tolist(), lane_prev[ids].tolist(), strict=True):
            if p >= 0:
                dep(i, p, False)
        sel = np.flatnonzero(local & (rank[es] == r))
        extra = []
        node_end: dict[int, int] = {}  # measured end of the gap / offset nodes
        for s_, d_, k_, lag in zip(es[sel].tolist(), ed[sel].tolist(), ek[sel].tolist(),
                                   el[sel].tolist(), strict=True):
            if k_ == EdgeKind.COLLECTIVE:
                continue
            gap = min(int(lag), int(start[d_] - end[s_]))
            if k_ == EdgeKind.HOST_ORDER and gap > 0:
                gid_ = next_id
                next_id += 1
                extra.append((gid_, "retime:host_gap", int(end[s_]), gap, [s_]))
                node_end[gid_] = int(end[s_]) + gap
                ctrl[d_].add(gid_)
            else:
                dep(d_, s_, k_ in (EdgeKind.SYNC, EdgeKind.DATA, EdgeKind.P2P))
        # in measured start order: an op's start offsets and release delay become nodes
        # (the offset node waits for what its source waited for; the delay node for all of
        # the op's dependencies: the measured start minus the latest measured end among
        # them, or minus the rank's first start without any), so list-scheduling the file
        # gives the measured starts
        final: dict[int, list[int]] = {}
        r0 = int(start[ids].min())
        for i in ids[np.lexsort((ids, start[ids]))].tolist():
            for s_ in s2s.get(i, ()):
                on = next_id
                next_id += 1
                off = max(0, int(start[i] - start[s_]))
                extra.append((on, "retime:start_offset", int(start[s_]), off,
                              final.get(s_, sorted(ctrl[s_] | data[s_]))))
                node_end[on] = int(start[s_]) + off
                ctrl[i].add(on)
            deps = ctrl[i] | data[i]
            ready = max((node_end[d] if d >= n else int(end[d]) for d in deps), default=r0)
            if start[i] > ready:
                dn = next_id
                next_id += 1
                extra.append((dn, "retime:delay", ready, int(start[i] - ready), sorted(deps)))
                ctrl[i].add(dn)
            final[i] = sorted(ctrl[i] | data[i])
        for i in ids.tolist():
            out.append(_node(msgs, i, names, kind, cpu, start, dur, cop, nbytes, gid, peer,
                             tag, flops, groups, origin, ctrl[i], data[i]))
        for nid, nm, s0, d0, dep in extra:
            nd = msgs["Node"](id=nid, name=nm, type=NODE_TYPES["COMP_NODE"],
                              start_time_micros=max(0, (s0 - origin) // 1000),
                              duration_micros=int(round(d0 / 1000)))
            nd.ctrl_deps.extend(int(x) for x in dep)
            nd.attr.extend([_attr(msgs, "is_cpu_op", "bool_val", True),
                            _attr(msgs, "dur_ns", "int64_val", d0),
                            _attr(msgs, "start_ns", "int64_val", s0 - origin)])
            out.append(nd)
        yield int(r), encode_stream(out)


def _node(msgs, i, names, kind, cpu, start, dur, cop, nbytes, gid, peer, tag, flops, groups,
          origin, ctrl, data):
    k = int(kind[i])
    a = []
    if k == OpKind.COLLECTIVE and not cpu[i]:
        t = NODE_TYPES["COMM_COLL_NODE"]
        a.append(_attr(msgs, "comm_type", "int64_val", _COMM_TO_COLL.get(CommOp(int(cop[i])), 0)))
        a.append(_attr(msgs, "comm_size", "int64_val", int(nbytes[i])))
    elif k == OpKind.P2P:
        recv = int(cop[i]) == CommOp.RECV
        t = NODE_TYPES["COMM_RECV_NODE" if recv else "COMM_SEND_NODE"]
        a.append(_attr(msgs, "comm_src" if recv else "comm_dst", "int64_val", int(peer[i])))
        a.append(_attr(msgs, "comm_size", "int64_val", int(nbytes[i])))
        a.append(_attr(msgs, "comm_tag", "int64_val", int(tag[i])))
    else:
        t = NODE_TYPES["COMP_NODE"]
        if k == OpKind.COLLECTIVE:  # host-side (gloo) collective: CPU time, sized
            a.append(_attr(msgs, "comm_size", "int64_val", int(nbytes[i])))
    if k in (OpKind.COLLECTIVE, OpKind.P2P) and int(gid[i]) in groups:
        gname, granks = groups[int(gid[i])]
        a.append(_attr(msgs, "pg_name", "string_val", gname))
        a.append(_attr(msgs, "comm_group_ranks", "int64_list", granks))
    elif k in (OpKind.COLLECTIVE, OpKind.P2P) and int(gid[i]) >= 0:
        a.append(_attr(msgs, "pg_name", "string_val", str(int(gid[i]))))
    a.append(_attr(msgs, "is_cpu_op", "bool_val", bool(cpu[i])))
    if np.isfinite(flops[i]) and flops[i] > 0:
        a.append(_attr(msgs, "num_ops", "int64_val", int(flops[i])))
    a.append(_attr(msgs, "op_kind", "string_val", OpKind(k).name))
    a.append(_attr(msgs, "dur_ns", "int64_val", int(dur[i])))
    a.append(_attr(msgs, "start_ns", "int64_val", int(start[i] - origin)))
    nd = msgs["Node"](id=int(i), name=str(names[i]), type=t,
                      start_time_micros=max(0, int(start[i] - origin) // 1000),
                      duration_micros=int(round(int(dur[i]) / 1000)))
    nd.ctrl_deps.extend(sorted(set(ctrl)))
    nd.data_deps.extend(sorted(set(data)))
    nd.attr.extend(a)
    return nd
