"""Event traces of a cluster's processes, for a failure that a rerun does not show again (node processes are not
replayable; the simulation is, but does not reach every race).

With `ECTABLE_TRACE=<directory>` in its environment, a node process (and any process that calls `install`)
appends to `<directory>/<pid>.trace` each change to its rows, in order: writes and replays as applied (the
records after them), restores of data records and of parity rows, received deltas as folded (sender, number,
rows, and which of their parity rows the node lacked), rollbacks, invalidations, closed windows, and each decode
of its clients (the slots it read and the delta numbers it checked them with). `events` reads them back in time
order; `history` picks out what touched given rows. Each event is a msgpack map, arrays as [dtype, shape, bytes]:
no pickle. Not set, it costs nothing: nothing is wrapped.

    python -m ectable.testing.kill_loop --code rs --double 1 --trace /tmp/trace  # sets ECTABLE_TRACE
"""
from __future__ import annotations

import functools
import glob
import os
import threading
import time

import msgpack
import numpy as np

ENV = "ECTABLE_TRACE"
_lock = threading.Lock()
_out: dict = {}  # pid -> open file (a forked child opens its own)
_installed = False


def _pack(value):
    if isinstance(value, np.ndarray):
        value = np.ascontiguousarray(value)
        return {"__nd__": [value.dtype.str, list(value.shape), value.tobytes()]}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def _unpack(obj):
    if "__nd__" in obj:
        dtype, shape, data = obj["__nd__"]
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    return obj


def record(kind: str, **fields) -> None:
    """Append one event to this process's trace (when tracing)."""
    directory = os.environ.get(ENV)
    if not directory:
        return
    data = msgpack.packb({"t": time.time(), "pid": os.getpid(), "kind": kind, **fields}, default=_pack,
                         strict_types=False)
    with _lock:
        out = _out.get(os.getpid())
        if out is None:
            out = _out[os.getpid()] = open(os.path.join(directory, f"{os.getpid()}.trace"), "ab")
        out.write(data)
        out.flush()


def clear(directory: str) -> None:
    """Empty every trace in `directory` (the processes writing them go on appending)."""
    for path in glob.glob(os.path.join(directory, "*.trace")):
        with open(path, "r+b") as f:
            f.truncate(0)


def events(directory: str) -> list[dict]:
    """Every event of the traces in `directory`, in time order."""
    out = []
    for path in glob.glob(os.path.join(directory, "*.trace")):
        with open(path, "rb") as f:
            unpacker = msgpack.Unpacker(f, object_hook=_unpack, raw=False, strict_map_key=False)
            try:
                out.extend(unpacker)
            except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
                pass  # a process killed in the middle of an event: what came before stands
    return sorted(out, key=lambda e: e["t"])


def install() -> None:
    """Wrap the methods that change rows so that each records its event (once per process; only when tracing)."""
    global _installed
    if _installed or not os.environ.get(ENV):
        return
    _installed = True
    from ..client.cut import Cut
    from ..storage.node import Node
    from ..storage.shard import Shard

    def after(cls, name, note):
        method = getattr(cls, name)

        @functools.wraps(method)
        def call(self, *args, **kwargs):
            if not os.environ.get(ENV):  # (a test process traces only while it asks)
                return method(self, *args, **kwargs)
            before = note(self, *args, **kwargs)
            result = method(self, *args, **kwargs)
            if before is not None:
                before(result)
            return result
        setattr(cls, name, call)

    def applied(node, computed, cid, cseq):
        return lambda seq: [record("apply", node=node.source, seq=seq, cid=cid, cseq=cseq, table=shard.spec.name,
                                   ids=shard.layout.data_ids(node.position, local), records=new)
                            for shard, local, _, new in computed[0]]

    def restored(shard, ids, records):
        todo = shard.missing_data[shard.layout.data_offset(ids)].copy()
        return lambda _: record("restore", node=shard.node, table=shard.spec.name, ids=ids, records=records, todo=todo)

    def restored_parity(shard, stripes, rows, versions, later=()):
        todo = shard.missing_parity[shard.parity_slots(stripes)[1]].copy()
        return lambda _: record("restore_parity", node=shard.node, table=shard.spec.name, stripes=stripes,
                                todo=todo, later=len(later))

    def folded(node):
        for entry in node.queued:
            for shard, ids, _, slots in entry.parts():
                lacked = None if shard.missing_parity is None else shard.missing_parity[slots[1]].copy()
                record("delta", node=node.source, sender=entry.source, seq=entry.seq, table=shard.spec.name, ids=ids,
                       lacked=lacked)

    def closed(node):
        sent = dict(node._next_seq)
        return lambda _: record("close", node=node.source, window=node.closed_windows, sent=node._next_seq) \
            if node._next_seq != sent else None

    def decoded(cut):
        for t, table in enumerate(cut.tables):
            span = slice(cut.bounds[t], cut.bounds[t + 1])
            record("decode", table=table, stripes=cut.stripes[span], nodes=cut.nodes[span], read=cut.chosen[span],
                   senders={str(d): [s[0], s[1]] for d, s in cut.senders.items()},
                   holders={str(q): [h[0], h[1]] for q, h in cut.holders.items()})

    after(Node, "_apply_write", applied)
    after(Shard, "restore", restored)
    after(Shard, "restore_parity", restored_parity)
    after(Node, "apply_queued", folded)
    after(Node, "close_window", closed)
    after(Node, "op_rollback", lambda node, msg, arrays: record("rollback", node=node.source, source=msg.source,
                                                                window=msg.window))
    after(Node, "op_invalidate", lambda node, msg, arrays: record("invalidate", node=node.source, table=msg.table,
                                                                  stripes=arrays[0] if arrays else None))
    after(Cut, "split", decoded)


def history(evs: list[dict], table: str, ids, layout) -> list[tuple[dict, np.ndarray]]:
    """[(event, which of its rows or stripes are those asked)] of the events of `evs` that touched rows `ids` of
    `table` (placed by `layout`): their writes and restores, and the deltas, parity restores, invalidations and
    decodes of their stripes."""
    ids = np.asarray(ids)
    stripes = layout.stripe(ids)
    out = []
    for e in evs:
        if e.get("table") != table:
            continue
        if e["kind"] in ("apply", "restore"):
            hit = np.isin(e["ids"], ids)
        elif e["kind"] == "delta":
            hit = np.isin(layout.stripe(e["ids"]), stripes)
        elif e.get("stripes") is not None:
            hit = np.isin(e["stripes"], stripes)
        else:
            continue
        if hit.any():
            out.append((e, hit))
    return out


def describe(e: dict, hit: np.ndarray | None = None, t0: float = 0.0) -> str:
    """One line of an event: its arrays cut to the rows `hit` picks (records left out)."""
    fields = []
    for key, value in e.items():
        if key in ("t", "pid", "kind", "records"):
            continue
        if isinstance(value, np.ndarray):
            if hit is not None and value.shape[:1] == hit.shape:
                value = value[hit]
            value = value.tolist() if value.size <= 24 else f"<{value.shape}>"
        fields.append(f"{key}={value}")
    return f"{e['t'] - t0:9.3f} pid {e['pid']} {e['kind']} " + " ".join(fields)
