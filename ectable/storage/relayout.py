"""A cluster's nodes laid out again over more positions: `ectable node add`.

Placement rotates stripes over the active positions (`layout.Layout`), so a cluster of `n` nodes
that takes one more moves nearly every row. `Relayout` lays the rows copied from every node while
they serve (`handover.copy_rows`) over the new layout, to be sent to the nodes ahead; then, from the
exports of every quiet, frozen node (`handover.export`: the rows changed since, no parity), gives the
states of the `n + 1` nodes of the new layout in `handover.export`'s format, so the nodes' hosts
build them with `handover.restore` over the rows they were sent ahead:

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

from ..arrays import unique
from ..config import ClusterConfig
from ..errors import InvalidRequest
from .handover import VERSION
from .initializers import init_rows
from .table import TableSpec
from .window import CHECKPOINT_BITS

NO_CHAIN = ["relayout", -1]  # the checkpoint mark of a table whose nodes' marks disagreed: no chain fits


class Relayout:
    """The `config.nodes` positions of a cluster of `old_nodes` laid out again, built in two steps: from the rows
    copied while the nodes serve (`copied`, then `rows_for(q)`, sent to the node at q ahead, and `encode` once
    every node has them), and from the frozen nodes' exports (`finish`), which then carry only the rows changed
    since."""

    def __init__(self, config: ClusterConfig, old_nodes: int):
        if config.nodes <= old_nodes:
            raise InvalidRequest(f"growing {old_nodes} positions needs more positions, got {config.nodes}")
        self.config, self.old = config, ClusterConfig(**{**config.get_config(), "nodes": old_nodes})
        self.full: dict[str, np.ndarray] = {}  # table -> its rows by id (padded to whole stripes), as copied
        self.specs: dict[str, TableSpec] = {}
        self.coded: dict[str, list] = {}  # table -> its parity blocks [stripes, width * 4] of the rows as copied

    def copied(self, p: int, state: dict, rows: dict) -> None:
        """Lay the rows copied from old position p (`handover.copy_rows`: its state, and {table: rows})."""
        for config in state.get("specs", []):
            spec = TableSpec.from_config(config)
            if spec.name in rows and self.specs.setdefault(spec.name, spec) == spec:
                full = self.full.setdefault(spec.name, _rows_of(spec, self.old.k))
                _lay(full, rows[spec.name], self.old.layout(spec), p)

    def rows_for(self, q: int) -> tuple[dict, list]:
        """({"tables": names}, rows) of new position q, from the copies: what `copy_rows` gives of a node."""
        names = sorted(self.full)
        return {"tables": names}, [_pick(self.full[name], self.config.layout(self.specs[name]), q) for name in names]

    def encode(self) -> None:
        """Encode the parity of the rows as copied, once every new position holds its rows as copied (`finish` then
        sends only the rows changed since, and encodes only their stripes)."""
        code = self.config.make_code()
        for name, full in self.full.items():
            self.coded[name] = _encode(code, full, self.config.k) if self.config.r else []

    def finish(self, states: list, sources: list[str]) -> list:
        """[(header, arrays)] of every new position from `states`, the (header, arrays) of `handover.export` of
        every old position (rows changed since the copy; parity left out); `sources[q]` names the new node at q."""
        if len(states) != self.old.nodes or len(sources) != self.config.nodes:
            raise InvalidRequest(f"a grow needs the state of every one of {self.old.nodes} positions and an "
                                 f"identity for each of {self.config.nodes}")
        tables = _tables(states)
        out = [_header(q, source, states) for q, source in enumerate(sources)]
        arrays: list[list] = [[] for _ in sources]
        code = self.config.make_code()
        for name, spec in tables.items():
            full, flags, marks, changed = self._gather(name, spec, states)
            layout = self.config.layout(spec)
            k, r, width = layout.k, layout.r, spec.width
            if changed is not None and name in self.coded:  # encoded ahead: only the stripes that changed since
                coded, stripes = self.coded[name], unique(changed // k)
                touched = full.reshape(-1, k, width)[stripes].reshape(-1, width)
                for j, block in enumerate(_encode(code, touched, k) if r and stripes.size else []):
                    coded[j][stripes] = block
            else:
                coded = _encode(code, full, k) if r else []
            if changed is not None:
                where, local = layout.data_node(changed), layout.data_offset(changed)
            for q in range(self.config.nodes):
                put = _appender(arrays[q])
                parity = np.zeros((layout.parity_capacity(), width * 4), dtype=np.uint8)
                for t, stripes, n in _slots(layout, q, range(k, k + r)):
                    parity.reshape(-1, r, width * 4)[:n, t - k] = coded[t - k][stripes]
                if changed is None:
                    records, rows = put(_pick(full, layout, q)), None
                else:  # the node holds the rows sent ahead: only those changed since
                    mine = where == q
                    records, rows = None, [put(local[mine]), put(full[changed[mine]])]
                out[q]["shards"].append({
                    "spec": spec.get_config(), "records": records, "changed": rows, "parity": put(parity),
                    "versions": put(np.zeros(parity.shape[0], dtype=np.int64)), "flags": put(_pick(flags, layout, q)),
                    "marks": marks, "fresh": None, "fresh_parity": None, "left": [0, 0]})
        return list(zip(out, arrays))

    def _gather(self, name: str, spec: TableSpec, states: list):
        """(every row of table `name` by id, their checkpoint flags, the table's checkpoint marks, the ids of rows
        changed since the rows were sent ahead, or None: every node is sent all its rows)."""
        layout = self.old.layout(spec)
        copied = self.specs.get(name) == spec
        full = self.full[name] if copied else _rows_of(spec, layout.k)
        flags = np.zeros(full.shape[0], dtype=np.uint8)
        fresh = np.zeros(full.shape[0], dtype=bool)
        changed, marks = [], []
        for p, (header, arrays) in enumerate(states):
            entry = next(e for e in header["shards"] if e["spec"]["name"] == name)
            if entry["changed"] is None:  # not copied: all its rows
                _lay(full, arrays[entry["records"]], layout, p)
                changed.append(layout.rows_on(p))
            else:  # the rows copied while the node served, and those changed since
                if not copied:
                    raise InvalidRequest(f"table {name!r}: the rows of position {p} were not copied")
                ids = layout.data_ids(p, arrays[entry["changed"][0]])
                full[ids] = arrays[entry["changed"][1]]
                changed.append(ids)
            _lay(flags, arrays[entry["flags"]] & CHECKPOINT_BITS, layout, p)
            if entry["fresh"] is not None:
                _lay(fresh, arrays[entry["fresh"]].view(bool), layout, p)
            marks.append(entry["marks"])
        todo = np.flatnonzero(fresh)
        if todo.size:  # rows still at their initial values (a pure function of the table and id)
            full[todo] = 0
            full[todo, : spec.dim] = init_rows(spec.init, spec.seed, spec.name, todo, spec.dim)
        agreed = all(mark == marks[0] for mark in marks)
        mark = marks[0] if agreed else {"checkpoint": NO_CHAIN, "full": NO_CHAIN}
        ahead = copied and name in self.coded
        return full, flags, dict(mark), unique(np.concatenate([*changed, todo])) if ahead else None


def _encode(code, rows: np.ndarray, k: int) -> list:
    """The parity blocks [stripes, width * 4] of rows by id (whole stripes of k)."""
    data = rows.view(np.uint8).reshape(-1, k, rows.shape[1] * 4)
    return code.encode([np.ascontiguousarray(data[:, i]) for i in range(k)])


def _rows_of(spec: TableSpec, k: int) -> np.ndarray:
    """Zero rows of a table by id, padded to whole stripes."""
    return np.zeros((-(-spec.num_rows // k) * k, spec.width), dtype=np.float32)


def _lay(by_id: np.ndarray, local: np.ndarray, layout, p: int) -> None:
    """Put the node-local rows (or per-row flags) of position p of `layout` where they go by id."""
    k = layout.k
    shape = (-1, k, *by_id.shape[1:])
    for i, stripes, n in _slots(layout, p, range(k)):  # node-local row j * k + i is row i of stripe j
        by_id.reshape(shape)[stripes, i] = local.reshape(shape)[:n, i]


def _pick(by_id: np.ndarray, layout, q: int) -> np.ndarray:
    """The node-local rows (or per-row flags) of position q of `layout`, from rows by id (zeros elsewhere)."""
    k = layout.k
    shape = (-1, k, *by_id.shape[1:])
    out = np.zeros((layout.data_capacity(), *by_id.shape[1:]), dtype=by_id.dtype)
    for i, stripes, n in _slots(layout, q, range(k)):
        out.reshape(shape)[:n, i] = by_id.reshape(shape)[stripes, i]
    return out


def _slots(layout, node: int, slots):
    """(slot, the stripes whose slot it is on `node` as a slice, how many) for each of `slots`. The node keeps the
    n-th of those stripes' data slot i at local row n * k + i, their parity slot k + j at parity row n * r + j."""
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


def _header(q: int, source: str, states: list) -> dict:
    """The header of the new node at q: a fresh identity and fresh streams; what the old nodes knew of
    writers and identities, merged (the checkpoint writer of the old node at q, which clients may still ask)."""
    headers = [h for h, _ in states]
    fenced = set().union(*(h["fenced"] for h in headers)) | {h["source"] for h in headers}
    seen, gone = _youngest(h["writer_seen"].items() for h in headers), _youngest(h["gone"] for h in headers)
    return {
        "version": VERSION, "position": q, "source": source, "generation": 0, "shards": [],
        "dropped": sorted(set().union(*(h["dropped"] for h in headers))),
        "write_seq": 0, "closed_windows": 0, "durable_window": 0, "next_seq": [], "applied": {},
        "fenced": sorted(fenced), "skipped_from": {}, "promised": {}, "rejected": 0,
        "client_marks": {}, "closed_marks": {}, "client_writes": {}, "applied_clients": {},
        "retained": {"base": 0, "level": {}, "windows": {}}, "replayed": [], "late": [], "replay_seqs": {},
        "writer_seen": seen, "gone": sorted([w, age] for w, age in gone.items()),
        "writer": headers[q]["writer"] if q < len(headers) else None,
    }


def _youngest(ages) -> dict:
    """{writer: the least of its ages} over several nodes' [(writer, age)]."""
    out: dict = {}
    for pairs in ages:
        for w, age in pairs:
            out[w] = min(age, out.get(w, age))
    return out
