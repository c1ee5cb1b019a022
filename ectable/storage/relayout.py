"""A cluster's nodes laid out again over more positions: `ectable node add`.

Placement rotates stripes over the active positions (`layout.Layout`), so a cluster of `n` nodes
that takes one more moves nearly every row. `grow(states, config, sources)` takes the exports of
every quiet, frozen node (`handover.export`, their copied rows laid under them) and gives the
states of `n + 1` nodes under the layout of `config` (its `nodes` one more), in the same format,
so the nodes' hosts build them with `handover.restore`:

- each table's rows go where the new layout puts them, with their checkpoint flags (rows still
  at their initial values are computed first: the new nodes have none left to compute);
- parity is encoded again from the rows (every window was closed and acknowledged: the parity
  they had held exactly these rows, and no degraded write is outstanding);
- each position gets a new identity (`sources`): a request or delta meant for the old layout is
  refused by the identity check, and the new nodes begin their delta streams, window numbers and
  client marks afresh (no write is in flight and every write is in parity: no redo log entry
  from before is ever replayed). Checkpoint chains go on: pieces name rows by global id, and a
  table whose nodes' checkpoint marks disagreed takes a full checkpoint next.
"""
from __future__ import annotations

import numpy as np

from ..config import ClusterConfig
from ..errors import InvalidRequest
from .handover import VERSION
from .initializers import init_rows
from .table import TableSpec
from .window import CHECKPOINT_BITS

NO_CHAIN = ["relayout", -1]  # the checkpoint mark of a table whose nodes' marks disagreed: no chain fits


def grow(states: list, config: ClusterConfig, sources: list[str], rows: list | None = None) -> list:
    """[(header, arrays)] of the `config.nodes` positions laid out again from `states`, the (header, arrays) of
    `handover.export` of positions 0..len(states)-1 (`rows[p]`: the {table: rows} copied from position p before,
    whose changed rows the header carries). `sources[q]` names the new node at q."""
    old = ClusterConfig(**{**config.get_config(), "nodes": len(states)})
    if len(sources) != config.nodes or config.nodes <= old.nodes:
        raise InvalidRequest(f"growing {old.nodes} positions needs more positions and one identity each, "
                             f"got {config.nodes} and {len(sources)}")
    tables = _tables(states)
    out = [_header(q, source, states) for q, source in enumerate(sources)]
    arrays: list[list] = [[] for _ in sources]
    code = config.make_code()
    for name, spec in tables.items():
        full, flags, marks = _gather(name, spec, old, states, rows or [{}] * len(states))
        layout = config.layout(spec)
        k, r, width = layout.k, layout.r, spec.width
        data = full.view(np.uint8).reshape(-1, k, width * 4)
        coded = code.encode([np.ascontiguousarray(data[:, i]) for i in range(k)]) if r else []  # per stripe
        for q in range(config.nodes):
            records = np.zeros((layout.data_capacity(), width), dtype=np.float32)
            dirty = np.zeros(records.shape[0], dtype=np.uint8)
            for i, stripes, n in _slots(layout, q, range(k)):  # node-local row j * k + i is row i of stripe j
                records.reshape(-1, k, width)[:n, i] = full.reshape(-1, k, width)[stripes, i]
                dirty.reshape(-1, k)[:n, i] = flags.reshape(-1, k)[stripes, i]
            parity = np.zeros((layout.parity_capacity(), width * 4), dtype=np.uint8)
            for t, stripes, n in _slots(layout, q, range(k, k + r)):
                parity.reshape(-1, r, width * 4)[:n, t - k] = coded[t - k][stripes]
            put = _appender(arrays[q])
            out[q]["shards"].append({
                "spec": spec.get_config(), "records": put(records), "changed": None, "parity": put(parity),
                "versions": put(np.zeros(parity.shape[0], dtype=np.int64)), "flags": put(dirty), "marks": marks,
                "fresh": None, "fresh_parity": None, "left": [0, 0]})
    return list(zip(out, arrays))


def _slots(layout, node: int, slots):
    """(slot, the stripes whose slot it is on `node` as a slice, how many) for each of `slots`: the node's local
    rows of data slot `i` are `j * k + i`, of parity slot `k + j` are `j * r + j'`, for its j-th such stripe."""
    for t in slots:
        first = (node - t - layout.offset) % layout.nodes
        yield t, slice(first, layout.num_stripes, layout.nodes), len(range(first, layout.num_stripes, layout.nodes))


def _appender(arrays: list):
    def put(a: np.ndarray) -> int:
        arrays.append(np.ascontiguousarray(a))
        return len(arrays) - 1
    return put


def _tables(states: list) -> dict:
    """{name: spec} of the tables every node holds (they must hold the same)."""
    names = None
    for header, _ in states:
        these = {entry["spec"]["name"]: TableSpec.from_config(entry["spec"]) for entry in header["shards"]}
        if names is not None and these.keys() != names.keys():
            raise InvalidRequest("the nodes hold different tables (a create or drop was under way): try again")
        names = these
    return names or {}


def _gather(name: str, spec: TableSpec, old: ClusterConfig, states: list, rows: list):
    """(every row of table `name` by id [rows padded to whole stripes, width], their checkpoint flags,
    the table's checkpoint marks) from the old positions' states."""
    layout = old.layout(spec)
    stripes = -(-spec.num_rows // old.k)
    full = np.zeros((stripes * old.k, spec.width), dtype=np.float32)
    flags = np.zeros(full.shape[0], dtype=np.uint8)
    fresh = np.zeros(full.shape[0], dtype=bool)
    marks = []
    for p, (header, arrays) in enumerate(states):
        entry = next(e for e in header["shards"] if e["spec"]["name"] == name)
        if entry["changed"] is None:
            records = arrays[entry["records"]]
        else:  # the rows copied while the node served, and those changed since
            records = rows[p].get(name)
            if records is None:
                raise InvalidRequest(f"table {name!r}: the rows of position {p} were not copied")
            records[arrays[entry["changed"][0]]] = arrays[entry["changed"][1]]
        by_stripe, local = full.reshape(-1, layout.k, spec.width), records.reshape(-1, layout.k, spec.width)
        dirty, was_fresh = arrays[entry["flags"]].reshape(-1, layout.k), entry["fresh"]
        for i, stripes, n in _slots(layout, p, range(layout.k)):
            by_stripe[stripes, i] = local[:n, i]
            flags.reshape(-1, layout.k)[stripes, i] = dirty[:n, i] & CHECKPOINT_BITS
            if was_fresh is not None:
                fresh.reshape(-1, layout.k)[stripes, i] = arrays[was_fresh].view(bool).reshape(-1, layout.k)[:n, i]
        marks.append(entry["marks"])
    todo = np.flatnonzero(fresh)
    if todo.size:  # rows still at their initial values (a pure function of the table and id)
        full[todo] = 0
        full[todo, : spec.dim] = init_rows(spec.init, spec.seed, spec.name, todo, spec.dim)
    agreed = all(mark == marks[0] for mark in marks)
    mark = marks[0] if agreed else {"checkpoint": NO_CHAIN, "full": NO_CHAIN}
    return full, flags, dict(mark)


def _header(q: int, source: str, states: list) -> dict:
    """The header of the new node at q: a fresh identity and fresh streams; what the old nodes knew of
    writers and identities, merged (the checkpoint writer of the old node at q, which clients may still ask)."""
    headers = [h for h, _ in states]
    fenced = set().union(*(h["fenced"] for h in headers)) | {h["source"] for h in headers}
    seen: dict = {}
    for h in headers:
        for w, age in h["writer_seen"].items():
            seen[w] = min(age, seen.get(w, age))
    gone: dict = {}
    for h in headers:
        for w, age in h["gone"]:
            gone[w] = min(age, gone.get(w, age))
    return {
        "version": VERSION, "position": q, "source": source, "generation": 0, "shards": [],
        "dropped": sorted(set().union(*(h["dropped"] for h in headers))),
        "write_seq": 0, "closed_windows": 0, "durable_window": 0, "next_seq": [], "applied": {},
        "fenced": sorted(fenced), "skipped_from": {}, "promised": {}, "rejected": 0,
        "client_marks": {}, "closed_marks": {}, "client_writes": {}, "applied_clients": {},
        "retained": {"base": 0, "level": {}, "windows": {}}, "replayed": [], "replay_seqs": {},
        "writer_seen": seen, "gone": sorted([w, age] for w, age in gone.items()),
        "writer": headers[q]["writer"] if q < len(headers) else None,
    }
