"""A node's whole state as one message, so that another process can take over its identity.

A drained node hands its position to a spare without a failure: it is frozen (it takes no more
writes or deltas), its window is closed and every delta it sent is acknowledged, and then
`export(node)` gives everything the node holds — rows, parity rows, degraded-write counts,
checkpoint flags, what it applied of every peer and client, the deltas it keeps for rollbacks —
as a small msgpack-able header and a list of arrays. `restore(state, arrays, config)` builds the
node that continues it: same identity, same sequence numbers, so peers and clients carry on as
if nothing moved (see `NodeHost` and the decider's drain). Times travel as ages: the two
processes' clocks have nothing in common.

`ready(node)` says why a node cannot be exported now (None: it can): only a node with nothing in
flight moves, so nothing in flight has to.

The data rows are most of a node's memory. So that the node is frozen only for as long as its
parity and the rows that changed take to cross, `copy_rows(node)` first gives every table's rows as
they are while the node still serves, and flags rows changed from then on (`window.SINCE_COPY`);
`export(node, copied)` then carries only those of the copied tables, and `restore(..., rows)`
lays them over the copy.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from ..config import ClusterConfig
from ..errors import InvalidRequest
from .node import Node
from .parity import Queued
from .snapshots import Writer
from .table import TableSpec
from .window import SINCE_COPY

VERSION = 2


def ready(node: Node) -> str | None:
    """Why `node` cannot be exported now, or None. Its window must be closed and acknowledged, nothing
    received left unfolded, no rebuild, replay or checkpoint writing under way."""
    if node.rebuilding:
        return "it is rebuilding"
    if node.window_open or node.dirty.rows():
        return "its window is open"
    if node.unacked or node.outbox or node.windows:
        return f"{len(node.unacked) + len(node.outbox)} of its deltas wait for an acknowledgement"
    if node.replay_from is not None or node.replay_buffer:
        return "it waits for writers' replays"
    if node.writer is not None and not node.writer.done:
        return "it is writing a checkpoint"
    if any(s.frozen for s in node.shards.values()):
        return "it is copying rows for a checkpoint"
    return None


def copy_rows(node: Node, mark: bool = True) -> tuple[dict, list]:
    """({"tables": names, "specs": their configs}, their data rows) as they are now, the node serving on; rows
    changed from now on are flagged (`mark`; else those changed since the last mark stay flagged, for a repeated
    request). The arrays are the node's own (not copies): a row changed while they are read is flagged."""
    names = list(node.shards)
    for shard in node.shards.values() if mark else ():
        shard.window.dirty &= np.uint8(~SINCE_COPY & 0xFF)
    return ({"tables": names, "specs": [node.shards[name].spec.get_config() for name in names]},
            [node.shards[name].records for name in names])


def copied_rows(state: dict, arrays: list) -> dict:
    """{table: rows} of a `copy_rows` reply, checked for form (shapes are checked by `restore`), each a copy of
    this process's own: `restore` takes them as the shards' rows, so the node is not frozen while they are
    copied."""
    names = state.get("tables") if isinstance(state, dict) else None
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names) and len(names) == len(arrays)
            and all(isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == 2 for a in arrays)):
        raise InvalidRequest("copied rows must be {tables: [names]} with one float32 [rows, width] array each")
    return {name: np.array(a) for name, a in zip(names, arrays)}


def export(node: Node, copied=frozenset(), parity: bool = True) -> tuple[dict, list]:
    """(header, arrays) of everything `node` holds; `ready(node)` must be None. Of the tables in `copied`
    (given by `copy_rows` before), only the rows changed since; without `parity`, no parity rows (a grow
    encodes them again)."""
    why = ready(node)
    if why is not None:
        raise InvalidRequest(f"node {node.position} cannot hand over: {why}")
    node.apply_queued()
    now, arrays = node.clock(), []

    def put(a: np.ndarray) -> int:
        arrays.append(np.ascontiguousarray(a))
        return len(arrays) - 1

    def maybe(flags):
        return None if flags is None else put(flags.view(np.uint8))  # bools travel as bytes

    shards = []
    for name, s in node.shards.items():
        changed = np.flatnonzero(s.window.dirty & SINCE_COPY) if name in copied else None
        rows = None if changed is None else [put(changed), put(s.records[changed])]
        shards.append({"spec": s.spec.get_config(), "records": None if rows else put(s.records), "changed": rows,
                       "parity": put(s.parity) if parity else None,
                       "versions": put(s.versions), "flags": put(s.window.dirty), "marks": s.marks,
                       "fresh": maybe(s.fresh), "fresh_parity": maybe(s.fresh_parity), "left": list(s._fresh_left)})
    retained = {source: [[w, now - arrival, rows, [[[s.spec.name for s in part.shards], part.counts, part.seq,
                                                    put(part.ids), put(part.delta), *map(put, part.slots)]
                                                   for part in parts]]
                         for w, arrival, parts, rows in log]
                for source, log in node.retained.windows.items()}
    state = {
        "version": VERSION, "position": node.position, "source": node.source, "generation": node.generation,
        "shards": shards, "dropped": sorted(node.dropped),
        "write_seq": node.write_seq, "closed_windows": node.closed_windows, "durable_window": node.durable_window,
        "next_seq": [[t, s] for t, s in node._next_seq.items()],
        "applied": node.applied, "fenced": sorted(node.fenced), "skipped_from": node.skipped_from,
        "skipped_rows": [[source, table, maybe(rows)] for (source, table), rows in node.skipped_rows.items()],
        "promised": {s: until - now for s, until in node.promised.items()}, "rejected": node.rejected,
        "client_marks": node.client_marks, "closed_marks": node.closed_marks,
        "client_writes": {c: list(v) for c, v in node.client_writes.items()},
        "applied_clients": node.applied_clients,
        "retained": {"base": node.retained.base, "level": node.retained.level, "windows": retained},
        "replayed": sorted(node.replayed), "late": [[w, now - t] for w, t in node.late.items()],
        "replay_seqs": {w: [[n, s] for n, s in seqs.items()] for w, seqs in node.replay_seqs.items()},
        "writer_seen": {w: now - t for w, t in node.writer_seen.items()},
        "gone": [[w, now - t] for w, t in node.gone.items()],
        "writer": node.writer.progress() if node.writer is not None else None,
    }
    return state, arrays


def restore(state: dict, arrays: list, config: ClusterConfig, rows: dict | None = None, own: bool = False,
            clock=None) -> Node:
    """The node `export` described, on this process: the same identity at the same position (`rows`: the
    `copied_rows` its changed rows go over). `own`: the arrays are this process's (decoded from the wire), and
    the node keeps those it can write in place of copies."""
    if not isinstance(state, dict) or state.get("version") != VERSION:
        raise InvalidRequest(f"handover state must be version {VERSION}")
    try:
        return _restore(state, arrays, config, rows or {}, own, clock)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise InvalidRequest(f"bad handover state: {type(exc).__name__}: {exc}") from None


def _restore(state: dict, arrays: list, config: ClusterConfig, rows: dict, own: bool, clock) -> Node:
    node = Node(state["position"], config, clock=clock)
    now = node.clock()

    def get(i, like: np.ndarray | None = None) -> np.ndarray:
        a = arrays[i]
        if like is not None and (a.dtype != like.dtype or a.shape != like.shape):
            raise ValueError(f"array {i} is {a.dtype}{a.shape}, expected {like.dtype}{like.shape}")
        return a

    def install(holder, name: str, i: int) -> None:
        a = get(i, getattr(holder, name))
        if own and a.flags.writeable and a.flags.c_contiguous and name in ("records", "versions"):  # parity, flags:
            if name == "records":  # in the node's arena and windows
                holder.adopt(a)
            else:
                setattr(holder, name, a)
        else:
            getattr(holder, name)[:] = a

    for entry in state["shards"]:
        node.op_create_table(_Spec(entry["spec"]), [])
        s = node.shards[TableSpec.from_config(entry["spec"]).name]
        if entry["changed"] is None:
            install(s, "records", entry["records"])
        else:  # the copy taken while the node served, and the rows changed since
            base, changed = rows.get(s.spec.name), get(entry["changed"][0])
            if base is None or base.shape != s.records.shape:
                raise ValueError(f"table {s.spec.name!r}: its rows were not copied, or not all of them")
            if changed.dtype != np.int64 or changed.ndim != 1 or changed.size and changed.min() < 0:
                raise ValueError(f"table {s.spec.name!r}: changed rows must be int64 offsets")
            s.adopt(base)
            s.records[changed] = get(entry["changed"][1], s.records[:changed.size])
        install(s, "parity", entry["parity"])
        install(s, "versions", entry["versions"])
        install(s.window, "dirty", entry["flags"])
        s.marks = dict(entry["marks"])
        s.fresh = None if entry["fresh"] is None else get(entry["fresh"]) != 0
        s.fresh_parity = None if entry["fresh_parity"] is None else get(entry["fresh_parity"]) != 0
        s._fresh_left = [int(x) for x in entry["left"]]
    node.source, node.generation = state["source"], int(state["generation"])
    node.dropped = set(state["dropped"])
    node.write_seq = node.closed_upto = node.durable_seq = int(state["write_seq"])
    node.closed_windows = node.durable_window = int(state["closed_windows"])
    node._next_seq = {int(t): int(s) for t, s in state["next_seq"]}
    node.applied, node.fenced = dict(state["applied"]), set(state["fenced"])
    node.skipped_from = dict(state["skipped_from"])
    node.skipped_rows = {(source, table): get(i) != 0 for source, table, i in state.get("skipped_rows", ())}
    node.promised = {s: now + left for s, left in state["promised"].items()}
    node.rejected = int(state["rejected"])
    node.client_marks, node.closed_marks = dict(state["client_marks"]), dict(state["closed_marks"])
    node.client_writes = {c: (int(a), int(b)) for c, (a, b) in state["client_writes"].items()}
    node.applied_clients = {s: dict(m) for s, m in state["applied_clients"].items()}
    retained = state["retained"]
    node.retained.base, node.retained.level = retained["base"], dict(retained["level"])
    node.retained.windows = {
        source: deque((w, now - age, [Queued([node.shards[name] for name in names], list(counts), get(ids),
                                             get(delta), (get(j), get(local), get(pos)), source, seq)
                                      for names, counts, seq, ids, delta, j, local, pos in parts], rows)
                      for w, age, rows, parts in log)
        for source, log in retained["windows"].items()}
    node.replayed, node.late = set(state["replayed"]), {w: now - age for w, age in state["late"]}
    node.replay_seqs = {w: {int(n): s for n, s in seqs} for w, seqs in state["replay_seqs"].items()}
    node.writer_seen = {w: now - age for w, age in state["writer_seen"].items()}
    node.gone = {w: now - age for w, age in state["gone"]}
    if state["writer"] is not None:
        node.writer = Writer.finished(state["writer"])
    return node


class _Spec:
    """What `Node.op_create_table` reads of a request."""

    def __init__(self, spec: dict):
        self.spec = spec
