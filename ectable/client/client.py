"""The client: routes rows to nodes, keeps writes until their parity is safe, fails over."""
from __future__ import annotations

import functools

import numpy as np

from ..arrays import put_rows, unique
from .. import clock
from ..config import DEADLINE
from ..layout import Layout
from ..errors import (Error, HandingOver, InvalidRequest, NodeDown, Replaced, Replaying, StaleCut, Unavailable,
                      WritesLost)
from .checkpoints import Checkpoints, Restored, export
from .lacks import Lacks
from .repair import Begun, Repair
from ..protocol import messages as m, validate
from ..protocol.messages import ErrorCode, writer_of
from ..storage.shard import NotRebuilt
from ..storage.table import TableSpec

CREATE_DEADLINE = 120.0  # a node allocates a new table (its rows are computed when first used)
REBUILD_BUDGET = 1 << 15  # rows rebuilt per step() while training goes on
WAIT_POLL = 0.05  # longest rest between two looks of `wait_recovered` at the cluster
LAPSED = ("this client's writer lease expired (its process lost the membership store for too long), so nodes "
          "no longer take its writes: connect again (a new client)")
REPLAY_WAIT = 15.0  # longest a client waits for a replacement to apply every writer's replays
HANDOVER_WAIT = 150.0  # longest a client waits for a frozen node (a drain's handover, a grow) to be moved or thawed:
# longer than a decider keeps it frozen when a message of its two big transfers (HANDOVER_TIMEOUT each) is lost,
# so that a lost message costs time, not a failed call (a grow of much data takes its encode on top)
RELAYOUT_TRIES = 4  # times one call is planned again because the cluster was laid out again meanwhile


class _Write:
    """A logged write: what was sent to one node, under this client's sequence number."""

    __slots__ = ("writes", "cid", "cseq", "seq", "replayed", "node")

    def __init__(self, writes, cid, cseq):
        self.writes, self.cid, self.cseq = writes, cid, cseq
        self.seq = None  # the node's sequence number, once it answered
        self.replayed = False  # a failover took it
        self.node = None  # the identity of the node it was last sent to

    def drop(self, table: str) -> bool:
        """Forget the writes to `table` (dropped); whether any write is left."""
        self.writes = [w for w in self.writes if w[0] != table]
        return bool(self.writes)


class _Relaid(Exception):
    """The cluster was laid out again over more positions (a grow) since this client looked: what it planned by
    the old layout is planned again. `left`: the writes of a position not applied there (a frozen node refused
    them), to be written by the new layout."""

    def __init__(self, left=()):
        super().__init__()
        self.left = list(left)


class _Moved(Exception):
    """Position `position` holds another node than when this client last looked: fail it over first."""

    def __init__(self, position):
        super().__init__(position)
        self.position = position


def _open(method, read: bool = False):
    """A public call: `Error("client closed")` once the client was closed. A `step()` not sent yet goes before
    it, or, for a `read`, after it (the caller's model computes next: the nodes close their windows meanwhile).
    A call (and its step) that a grow met is planned again by the new layout (`_Relaid`; writes take care
    themselves not to apply anything twice, `Client._write`)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if self._closed:
            raise Error("client closed")

        def attempt():
            if not read:
                self._send_step()
            return method(self, *args, **kwargs)
        out = self._by_layout(attempt)
        if read:
            try:
                self._send_step()
            except _Relaid:
                self._step_due = True  # sent with the next call, by the new layout
        return out
    return call


_read = functools.partial(_open, read=True)


class Client:
    """get / put / apply_gradient over a cluster's nodes (see SPEC section 3)."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.config = cluster.config
        self.nodes = self.config.nodes
        self._tables: dict[str, tuple[TableSpec, object]] = {}
        self._log = cluster.redo_log  # per position: writes not yet in parity, shared by the cluster's clients
        self._sources: dict[int, str] = {}
        self.repair = Repair(self)
        self._checkpoints = Checkpoints(self)
        self.rebuild_budget = REBUILD_BUDGET
        self._ahead: list = []  # (node, request, quiet): sent ahead (steps, restores), replies not collected yet
        self._step_due = False  # step() was called, its requests not sent yet (`step`)
        self._token = clock.token_hex(8)
        self.cid: str | None = None  # "writer/token" from its first write: names its writes in the nodes' deltas
        self._cseq = 0
        self._writer: str | None = None
        self._closed = False
        self._read_ids: dict[str, tuple] = {}  # per table, the last read's ids, their unique ids and inverse
        self._lacks = Lacks()  # what rebuilding nodes are believed to lack (`_decode_ahead`)
        for p in range(self.nodes):
            self._sources[p] = cluster.source(p)
        self._refresh_tables()

    owns_cluster = False

    def close(self) -> None:
        """Close the windows of a `step()` not sent yet, then release the connection (and the cluster map, for
        clients of `ectable.connect`); later calls raise `Error("client closed")`."""
        if self._step_due and not self._closed:
            try:
                self._close_windows(wait=True)
            except Exception:  # nodes unreachable, or the cluster closed already: their own timers close them
                pass
        if self._checkpoints.pending is not None and not self._closed:
            try:
                self._checkpoints.wait()
            except Exception:  # it is never taken for a whole one: it has no manifest
                pass
        if self.owns_cluster and not self._closed:
            self.cluster.close()
        self.cluster.take_cut_off(self.cid)  # a closed client is told nothing more
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- tables ----------------------------------------------------------
    @_open
    def create_table(self, name: str, num_rows: int, dim: int, optimizer: str = "sgd", lr: float = 0.01,
                     eps: float = 1e-8, init: str = "uniform", seed: int = 0, **init_args) -> None:
        """Create a table on every node (idempotent for an identical definition)."""
        spec = TableSpec.from_config({"name": name, "num_rows": num_rows, "dim": dim, "seed": seed,
                                      "optimizer": {"name": optimizer, "lr": lr, "eps": eps},
                                      "init": {"kind": init, **init_args}})
        claimed = self.cluster.claim_table(spec.get_config())  # racing creators: exactly one definition wins
        if claimed is None:
            raise InvalidRequest(f"table {name!r} was dropped (or is being dropped): a dropped table's name is not "
                                 f"used again; choose another name")
        existing = TableSpec.from_config(claimed)
        if existing != spec:
            raise InvalidRequest(f"table {name!r} exists with a different definition "
                                 f"(existing vs requested: {existing.differences(spec)})")
        self._to_every_node(m.CreateTable(spec=spec.get_config()).header())
        self._remember(spec)

    @_open
    def drop_table(self, name: str) -> None:
        """Drop table `name` on every node, its rows with their parity. Of racing drops one does it and the
        others raise `InvalidRequest` (no such table). The name is not used again (a create of it raises
        `InvalidRequest`). A write racing with it lands before it on its node, or is refused naming the
        table; its writes are never replayed, and a dead node's replacement never gets it."""
        if not isinstance(name, str) or not self.cluster.drop_table(name):
            raise InvalidRequest(f"no table {name!r} to drop (or another client drops it now)")
        for log in [*self._log, *self.cluster.replays.values()]:  # its writes are never replayed, not even by a
            kept = [entry for entry in log if entry.drop(name)]  # failover while the nodes drop it
            log.clear()
            log.extend(kept)
        self._to_every_node(m.DropTable(table=name).header())
        self._tables.pop(name, None)
        self._read_ids.pop(name, None)
        self.cluster.table_dropped(name)

    def _to_every_node(self, header: dict) -> None:
        """Send a table's create or drop to every position at once, after the claim in the store: the map is
        read again (a spare installed before the claim got the tables as they were then), and a node that
        dies meanwhile is failed over and what stands at its position is asked too. A create returns only
        once every node knows the node at every live position: a node that still took a replacement's
        position for dead would drop its deltas for the new table's rows there, which no rebuild reads. A grow
        meanwhile: sent again to every node of the new layout (a create or drop is taken twice as once)."""
        self._by_layout(lambda: self._to_every_node_of_the_layout(header))

    def _to_every_node_of_the_layout(self, header: dict) -> None:
        self.cluster.refresh()
        pending = self._positions()
        deadline = clock.monotonic() + CREATE_DEADLINE
        while pending:
            replies, failed = self._gather_live({(p,): (header, []) for p in pending}, timeout=CREATE_DEADLINE)
            for q in failed:
                self._lost(q)
            states = self._catch_up()
            behind = [key[0] for key, (reply, _) in replies.items()
                      if not self._knows_the_map(key[0], reply.get("peers"))]
            pending = [q for q in failed if states[q] != "dead"] + behind
            if behind:
                if clock.monotonic() > deadline:
                    raise Error(f"nodes {behind} did not learn the cluster map within {CREATE_DEADLINE} s")
                clock.sleep(0.01)
                self.cluster.refresh()
                self._catch_up()

    def _knows_the_map(self, q: int, peers) -> bool:
        """Whether node q's view of its peers ({position: identity}; None: a reply that carries none, a drop's)
        names the node this client knows at every other live position."""
        if peers is None:
            return True
        return all(peers.get(str(p)) == self.cluster.source(p) for p in range(self.nodes)
                   if p != q and self.cluster.source(p) is not None)

    @_open
    def tables(self) -> dict:
        """{name: config} of the cluster's tables, as the nodes list them now (created or dropped by any
        client)."""
        self._refresh_tables()
        return {name: spec.get_config() for name, (spec, _) in self._tables.items()}

    def _remember(self, spec):
        self._tables[spec.name] = (spec, self.config.layout(spec))

    def _table(self, table):
        if isinstance(table, str) and table not in self._tables:
            self._refresh_tables()  # another client may have created it
        try:
            return self._tables[table]
        except (KeyError, TypeError):
            raise InvalidRequest(f"unknown table {table!r}") from None

    def _refresh_tables(self):
        """Learn the tables from the first up node that answers (and forget those dropped since)."""
        for p in range(self.nodes):
            if self.cluster.state(p) == "up":
                try:
                    tables = self._call(p, m.Tables().header(), [])[0]["tables"]
                except NodeDown:  # it died, or is cut off: another node knows the tables as well
                    continue
                self._tables.clear()
                for config in tables:
                    self._remember(TableSpec.from_config(config))
                return

    # -- reads -----------------------------------------------------------
    @_read
    def get(self, table: str, ids=None) -> np.ndarray:
        """Rows of `ids` (any shape S, as torch's `embedding` takes them) as float32 [*S, dim], in order,
        duplicates repeated."""
        if ids is None:
            raise InvalidRequest(f"get({table!r}) needs the ids to read: get(table, ids)")
        self._table(table)  # a table named by something unhashable is refused by name
        return self.get_many({table: ids})[table]

    @_read
    def get_many(self, batch: dict, records: bool = False) -> dict:
        """{table: ids} -> {table: rows}, one request per node for all tables, sent in parallel. With
        `records`, whole records: weights then optimizer state, [*S, `TableSpec.width`]."""
        plan = {}
        for table, ids in self._check_many(batch).items():
            spec, _ = self._table(table)
            flat, shape = validate.shaped_ids(table, ids, spec.num_rows)
            if validate.ascending(flat):  # unique already, as the PyTorch adapter sends them: no expansion
                uniq, inverse = flat, None
            else:
                uniq, inverse = np.unique(flat, return_inverse=True)
                self._read_ids[table] = (flat.copy(), uniq, inverse.reshape(-1))  # the gradients' ids, usually
                inverse = inverse.reshape(shape)
            width = spec.width if records else spec.dim
            plan[table] = (uniq, (inverse, shape), np.empty((uniq.size, width), dtype=np.float32))
        parts = self._parts({table: uniq for table, (uniq, _, _) in plan.items()})
        rebuilding, now = {p for p in parts if self.cluster.state(p) == "rebuilding"}, clock.monotonic()
        asking = {p for p in rebuilding if self._lacks.due(p, self._sources.get(p), now)}  # what it lacks, afresh
        ahead: dict = {}  # per rebuilding node: the decode of rows it is believed to lack, begun
        try:
            for p in rebuilding:
                ahead[p] = self._decode_ahead(p, parts[p])
            done = self._fan_out({p: (m.GetMany(tables=[t for t, _, _ in ps], records=records,
                                                partial=p in rebuilding or None, lacking=p in asking or None,
                                                node=self._sources.get(p)).header(), [ids for _, ids, _ in ps])
                                  for p, ps in parts.items()})
            for p, ps in parts.items():
                rows = done.get(p)
                if rows is not None and p in rebuilding:  # it may lack some: decode those
                    rows = self._fill_in(p, ps, rows, records, ahead.pop(p, None))
                if rows is None:
                    rows = self._read_node(p, {table: ids for table, ids, _ in ps}, records)
                for n, (table, _, where) in enumerate(ps):
                    put_rows(plan[table][2], where, rows[n])
        finally:
            for early in ahead.values():  # not needed after all: the next request collects the replies
                self.repair.drop_ahead(early)
        for p in parts.keys() - rebuilding:
            self._lacks.forget(p)
        return {table: rows.reshape(shape + rows.shape[1:]) if inverse is None else np.take(rows, inverse, axis=0)
                for table, (_, (inverse, shape), rows) in plan.items()}  # np.take copies a row whole, indexing by item

    def _decode_ahead(self, p, ps: list) -> Begun | None:
        """The decode of rows of rebuilding node p's part `ps` of a read that p is believed to lack, begun."""
        source, guess = self._sources.get(p), {}
        for table, ids, _ in ps:
            lacks = self._lacks.guess(p, source, table, self._table(table)[1].data_offset(ids))
            if lacks.any():
                guess[table] = ids[lacks]
        if not guess:
            return None
        self._collect_ahead()  # (a step's failure is the caller's, not the decode's)
        try:
            return self.repair.read_ahead(guess, skip=p)
        except _Moved:  # a node moved: the read meets it too, and fails it over
            return None

    def _fill_in(self, p, ps: list, out: list, records: bool, ahead: Begun | None = None) -> list | None:
        """Rows of rebuilding node p's answer `out` (rows; if partial, then per table the ids it lacked, then maybe
        what it lacks: `Lacks`), those it lacked decoded (or taken from the decode begun `ahead`) and rebuilt
        there; None if that failed (`_read_node` then reads them all again). A row p lacked had no write since
        p began to serve reads (none reaches a row before its rebuild), so any decode since then holds its value."""
        count, source = len(ps), self._sources.get(p)
        rows, lacks = list(out[:count]), out[count:2 * count]
        if len(out) == 3 * count:
            self._lacks.learn(p, source, clock.monotonic(), [table for table, _, _ in ps], out[2 * count:])
        for table, ids, _ in ps:  # p has them now, or is sent them below
            self._lacks.present(p, source, table, self._table(table)[1].data_offset(ids))
        missing = {table: ids for (table, _, _), ids in zip(ps, lacks) if ids.size}
        if not missing:
            self.repair.drop_ahead(ahead)
            return rows
        try:
            decoded = self.repair.rebuild_rows(p, missing, wait=False, ahead=ahead)  # restored as the caller computes
        except (Error, _Moved):  # a node died or moved meanwhile: the slow path fails it over
            return None
        for n, (table, ids, _) in enumerate(ps):
            if table in missing:  # (a reply's arrays may be read-only views of its frames)
                rows[n] = np.array(rows[n])
                rows[n][np.isin(ids, missing[table])] = decoded[table][:, : rows[n].shape[1]]
        return rows

    def _read_node(self, p, ids: dict, records: bool = False) -> list:
        """Rows (or whole `records`) of {table: ids}, in that order, from node p, decoding them if it is
        dead and rebuilding them first if needed."""
        def attempt():
            if self._state(p) == "dead":
                out = self.repair.read_many(ids)
                return [out[t] if records else np.ascontiguousarray(out[t][:, : self._table(t)[0].dim]) for t in ids]
            header = m.GetMany(tables=list(ids), records=records, node=self._sources.get(p)).header()
            return self._call(p, header, list(ids.values()))[1]
        return self._with_failover(p, attempt)

    def _with_failover(self, p, attempt):
        """attempt() until it succeeds: nodes that die are failed over, rows not rebuilt are rebuilt first, and a
        position this client saw dead is looked up again when its parity holders know of a replacement."""
        tries, replaced_until = 0, None
        while tries < 4 * self.nodes:
            tries += 1
            try:
                try:
                    return attempt()
                except NotRebuilt as exc:
                    if exc.position not in (None, p):  # a survivor read for a decode was told to rebuild
                        self.cluster.mark_rebuilding(exc.position)
                        continue
                    if exc.kind == "data":
                        self.repair.rebuild_rows(p, exc.missing)  # every table's rows the request touched
            except NodeDown as exc:
                self._lost(exc.position)
            except _Moved as moved:
                self._failover(moved.position)
            except HandingOver:  # met by a survivor read (a decode): that node is moved within seconds
                self.cluster.refresh()
                self._check_layout()
                replaced_until = replaced_until or clock.monotonic() + HANDOVER_WAIT
                if clock.monotonic() < replaced_until:
                    tries -= 1
                    clock.sleep(0.05)
            except Replaced:  # a holder knows of a replacement, or does not know yet that p's node died
                self.cluster.refresh()
                replaced_until = replaced_until or clock.monotonic() + DEADLINE
                if clock.monotonic() < replaced_until:
                    tries -= 1  # the holder learns the map within a heartbeat: not a failure
                    clock.sleep(0.02)
        raise Unavailable(f"node {p}: nodes kept failing while serving a request")

    # -- writes ----------------------------------------------------------
    @_open
    def put(self, table: str, ids, rows) -> None:
        """Assign the weights of rows `ids` (unique; any shape S, with rows [*S, dim]); their optimizer
        state is kept."""
        self._table(table)
        self.put_many({table: (ids, rows)})

    @_open
    def put_many(self, batch: dict, records: bool = False) -> None:
        """{table: (ids, rows)}: `put` to several tables, every table checked before any is written; one
        request per node. With `records`, whole records (weights and optimizer state, as `get_many` gives
        them with `records`) are assigned."""
        checked = {}
        for table, value in self._check_many(batch).items():
            ids, rows = validate.pair(table, value, "rows")
            spec, _ = self._table(table)
            ids, shape = validate.shaped_ids(table, ids, spec.num_rows)
            validate.unique(table, ids)
            rows = validate.rows(table, rows, ids.size, spec.width if records else spec.dim,
                                 "records" if records else "rows", shape)
            checked[table] = ("records" if records else "put", ids, rows)
        self._write(checked)

    @_open
    def apply_gradient(self, table: str, ids, grads) -> None:
        """Sum the gradients of duplicate ids (any shape S, with grads [*S, dim]), then take one optimizer
        step per unique row. Refused, nothing applied on a node, if a row would become non-finite."""
        self._table(table)
        self.apply_gradient_many({table: (ids, grads)})

    @_open
    def apply_gradient_many(self, batch: dict) -> None:
        """{table: (ids, grads)}: every table is checked before any is written; one request per node."""
        checked = {}
        for table, value in self._check_many(batch).items():
            checked[table] = ("apply_gradient", *self._gradients(table, *validate.pair(table, value, "grads")))
        self._write(checked)

    def _gradients(self, table, ids, grads):
        spec, _ = self._table(table)
        ids, shape = validate.shaped_ids(table, ids, spec.num_rows)
        grads = validate.rows(table, grads, ids.size, spec.dim, "gradients", shape)
        read = self._read_ids.get(table)
        known = read[1:] if read is not None and np.array_equal(read[0], ids) else None  # the read's ids again
        ids, grads = validate.coalesce(ids, grads, known)
        return ids, validate.finite_sums(table, grads)

    def _check_many(self, batch):
        if not isinstance(batch, dict):
            raise InvalidRequest(f"a multi-table batch must be a dict of table -> values, got {type(batch).__name__}")
        for table in batch:
            self._table(table)
        return batch

    def _write(self, batch: dict) -> None:
        """Write {table: (kind, ids, values)}: one request per node, in parallel."""
        states = self._catch_up()
        if self._writer is not None and self.cluster.writer_lapsed(self._writer):
            raise Error(LAPSED)
        parts = self._parts({table: ids for table, (_, ids, _) in batch.items()})
        for p, ps in parts.items():  # refuse before writing anything if some rows cannot be served
            if states[p] == "dead":
                self.repair.check({table: ids for table, ids, _ in ps}, states)
        writes = {p: [(table, batch[table][0], ids, np.take(batch[table][2], where, axis=0)) for table, ids, where in ps]
                  for p, ps in parts.items()}
        entries = {p: self._logged(p, w) for p, w in writes.items() if states[p] != "dead"}
        try:
            done = self._fan_out({p: self._write_request(e, self._sources.get(p)) for p, e in entries.items()}, entries)
        except _Relaid:  # nothing was sent
            for p, entry in entries.items():
                self._unlog(p, entry)
            raise
        left = []  # writes a grow's frozen nodes refused: written again by the new layout
        for p, w in writes.items():
            if p in done:
                entries[p].seq = done[p]
                continue
            try:
                self._write_node(p, w, entries.get(p))
            except _Relaid as relaid:
                left += relaid.left
        if left:  # a second grow meanwhile: nothing of `left` was sent
            self._by_layout(lambda: self._write({table: (kind, np.concatenate([i for t, _, i, _ in left if t == table]),
                                                         np.concatenate([v for t, _, _, v in left if t == table]))
                                                 for table, kind in dict.fromkeys((t, k) for t, k, _, _ in left)}))

    def _unlog(self, p, entry) -> None:
        """Take a write that was not applied out of p's redo log."""
        try:
            self._log[p].remove(entry)
        except (ValueError, IndexError):  # the cluster's logs were begun again (a grow) since
            pass

    def _logged(self, p, writes) -> "_Write":
        """A write to node p, kept in the redo log from before it is sent until its parity is safe."""
        if self._writer is None:
            self._writer = self.cluster.writer_id()  # replacements wait for this writer's replays
            self.cid = f"{self._writer}/{self._token}"
        self._cseq += 1
        entry = _Write(writes, self.cid, self._cseq)
        self._log[p].append(entry)
        return entry

    @staticmethod
    def _write_request(entry, node):
        """A logged write's request to the node identity `node` (another incarnation at its position refuses it)."""
        entry.node = node
        header = m.Write(parts=[[table, kind] for table, kind, _, _ in entry.writes], cid=entry.cid, node=node,
                         cseq=entry.cseq).header()
        return header, [a for _, _, ids, values in entry.writes for a in (ids, values)]

    def _write_node(self, p, writes, entry=None):
        """Apply [(table, kind, ids, values)] at position p exactly once: on node p, through the parity if
        it is dead, or by the replay of a failover that took its redo-log entry."""
        def attempt():
            nonlocal entry
            self._collect_ahead()  # may fail p over: before deciding, not between deciding and sending
            state = self._state(p)  # `_Moved`: failed over (which takes its redo log), then tried again
            if state == "dead" and self.cluster.spares_left():
                # a spare is on its way: write to it, not through the parity, which its rebuild may
                # have read already (the write would then be missing from its rows)
                self.cluster.wait_replaced(p)
                state = self._state(p)
            if entry is not None and entry.replayed:
                return  # a failover took it: replayed there, unless its parity already held it
            if state == "dead":  # (`Replaced`: its parity holders know of a spare this client has not seen)
                self.repair.write_many(writes, self.cluster.last_source(p))  # every table at once
                return
            if entry is None:  # a spare came meanwhile
                entry = self._logged(p, writes)
            entry.seq = self._call(p, *self._write_request(entry, self._sources.get(p)))[0]["seq"]
        try:
            self._with_failover(p, attempt)
        except _Relaid as relaid:  # not sent, refused by a frozen node, or applied and its answer lost
            if entry is not None:
                self._unlog(p, entry)
            applied = entry is not None and self.cluster.applied_before_grow(self._sources.get(p), entry.cid,
                                                                              entry.cseq)
            if applied is None:  # more grows came while it waited than the map keeps records of
                raise Unavailable(f"node {p} was laid out again before it answered a write, and the cluster no "
                                  f"longer records whether it applied it") from None
            relaid.left = [] if applied else writes
            raise

    def _parts(self, ids_by_table: dict) -> dict:
        """{node: [(table, ids, indices into that table's ids)]}, tables in the order given, each table's ids
        in theirs; the ids of all tables routed in one vectorised pass."""
        tables, arrays = list(ids_by_table), list(ids_by_table.values())
        layouts = [self._table(table)[1] for table in tables]
        parts: dict[int, list] = {}
        if not tables:
            return parts
        counts, flat = [ids.size for ids in arrays], np.concatenate(arrays)
        first = np.repeat(np.cumsum([0] + counts[:-1]), counts)  # each id's table's first id
        key = Layout.of_rows(layouts, counts).data_node(flat) * len(tables) + \
            np.repeat(np.arange(len(tables)), counts)  # node, then table
        order = np.argsort(key, kind="stable")
        bounds = np.searchsorted(key[order], np.arange(self.nodes * len(tables) + 1)).tolist()
        ids, where = flat[order], order - first[order]
        for cell in np.flatnonzero(np.diff(bounds)).tolist():  # the (node, table) pairs with ids
            a, b = bounds[cell], bounds[cell + 1]
            parts.setdefault(cell // len(tables), []).append((tables[cell % len(tables)], ids[a:b], where[a:b]))
        return parts

    def _fan_out(self, requests: dict, entries: dict | None = None) -> dict:
        """Send {node: (header, arrays)} to all live nodes at once; {node: result} of those that
        answered plainly ("write": its seq, else its arrays). The others are left to the slow path,
        and so are logged writes (`entries`) that a failover met on the way has replayed already."""
        self._collect_ahead()
        self._catch_up()  # a failover takes the logged writes of its position: they are replayed there
        pending, done = {}, {}
        for p, (header, arrays) in requests.items():
            if self._known_live(p) and not (entries and entries[p].replayed):
                try:
                    pending[p] = self.cluster.channel(p).start(header, arrays)
                except NodeDown:
                    pass
        for p, request in pending.items():
            try:
                reply, out = self._check_reply(p, *request.wait(DEADLINE))
            except (NodeDown, NotRebuilt, Replaying, HandingOver, _Relaid):
                continue
            done[p] = reply["seq"] if "seq" in reply else out
        return done

    def _gather(self, requests: dict, timeout: float = DEADLINE) -> dict:
        """{(node, ...): (header, arrays)} sent all at once -> {key: (reply, arrays)}; once every reply is
        in, raises the first failure (NodeDown or NotRebuilt carry their position)."""
        return self._gathered(self._start_all(requests), timeout)

    def _start_all(self, requests: dict) -> tuple[dict, Error | None]:
        """`_gather`'s sending: ({key: request in flight}, the first failure to send)."""
        self._collect_ahead()
        pending, failure = {}, None
        for key, (header, arrays) in requests.items():
            try:
                pending[key] = self.cluster.channel(key[0]).start(header, arrays)
            except NodeDown as exc:
                exc.position, failure = key[0], failure or exc
        return pending, failure

    def _gathered(self, started: tuple, timeout: float = DEADLINE) -> dict:
        """`_gather`'s waiting, for the requests `_start_all` sent."""
        pending, failure = started
        out = {}
        for key, request in pending.items():
            try:
                out[key] = self._check_reply(key[0], *request.wait(timeout))
            except NodeDown as exc:
                exc.position, failure = key[0], failure or exc
            except Error as exc:  # NotRebuilt and the like: every reply is still read first
                failure = failure or exc
        if failure is not None:
            raise failure
        return out

    # -- iteration boundary ----------------------------------------------
    @_open
    def step(self) -> None:
        """Mark the iteration boundary: every node's dirty window is closed and its parity deltas go out, asked
        for as the next read (`get`, `get_many`) returns, so that the nodes do it while the caller's model
        computes, or before any other call, whichever comes first. In process, it also advances any rebuild
        (node processes rebuild themselves)."""
        self._step_due = True
        if not self.cluster.rebuilds_itself:
            for p in self._positions():
                self._rebuild_some(p, self.rebuild_budget)

    def _rebuild_some(self, p, budget, part: tuple = (0, 1)) -> int:
        """If node p is rebuilding, rebuild up to `budget` of its rows, from `part` (part, parts) of them (failing
        over if nodes die meanwhile); returns how many it still lacks (0 once it is not rebuilding)."""
        left = self._with_failover(p, lambda: self._state(p) == "rebuilding" and self.repair.rebuild_step(p, budget, part))
        return left or 0

    def _send_step(self) -> None:
        if self._step_due:
            self._close_windows()

    def _close_windows(self, wait: bool = False) -> None:
        """Ask every node to close its window; the replies are collected by the next request
        (so a node's closing overlaps the caller's own work), or now if `wait`."""
        self._collect_ahead()
        positions = self._positions()  # (`_Relaid`: the step stays due, for the call planned again)
        self._step_due = False
        for p in positions:
            try:
                self._ahead.append((p, self.cluster.channel(p).start(m.Step().header(), []), False))
            except NodeDown:
                self._lost(p)
        if wait:
            self._collect_ahead()

    def _send_later(self, p, header, arrays) -> None:
        """Send node p a request whose reply the next request collects, and whose failure changes nothing
        the caller relies on (a restore of rebuilt rows: rows it did not install are rebuilt again later)."""
        try:
            self._ahead.append((p, self.cluster.channel(p).start(header, arrays), True))
        except NodeDown:
            pass  # the next request to p meets it

    def _collect_ahead(self) -> None:
        """Collect the replies of requests sent ahead (`_close_windows`, `_send_later`)."""
        sent, self._ahead = self._ahead, []
        for p, pending, quiet in sent:
            try:
                self._check_reply(p, *pending.wait(DEADLINE))
            except NodeDown:
                self._lost(p)
            except (HandingOver, _Relaid):
                pass  # the node that continues it starts with its window closed
            except (Error, _Moved):
                if not quiet:
                    raise

    @_open
    def flush(self, timeout: float = DEADLINE) -> None:
        """Return once every node's parity reflects every acknowledged write."""
        self._close_windows(wait=True)
        self.settle(clock.monotonic() + timeout, close=True)

    @_open
    def settle(self, deadline: float, close: bool = False) -> None:
        """Wait until no node has deltas in flight to a live node. With `close`, every node is also asked to
        close its window (until it answers once: its step may not have reached it), and a live node that
        does not answer has not settled: only a node failed over meanwhile is left out."""
        closed = set()  # (position, identity) of the nodes that closed their window
        while True:
            busy = []
            for p in self._positions():
                key = (p, self._sources.get(p))
                reply = self._try(p, m.Sync(close=close and key not in closed).header())
                if reply is None:  # no answer: it died and was failed over, or it did not answer in time
                    if close and self.cluster.state(p) != "dead":
                        busy.append(p)
                    continue
                closed.add(key)
                if reply[0]["unacked"]:
                    busy.append(p)
            if not busy:
                return
            if clock.monotonic() > deadline:
                raise Error(f"nodes {busy} did not settle: parity deltas still unacknowledged, or no answer")
            clock.sleep(0.002)

    @_open
    def status(self) -> dict:
        """Nodes with their roles and health, parity lag, dirty rows, recovery progress (rows, rate, ETA) and the
        positions whose nodes are asked to leave (`draining`)."""
        nodes = []
        for p in range(self.nodes):
            states = self._catch_up()  # a reply may have shown a newer map
            try:
                if states[p] == "dead":
                    raise NodeDown(f"node {p} is dead")
                node = self._call(p, m.Status().header(), [])[0]["status"]
                node["health"] = "up"
            except NodeDown:
                node = {"position": p, "role": "dead", "health": "down"}
            nodes.append(node)
        live = [n for n in nodes if n["health"] == "up"]
        rebuilding = [n for n in live if n["role"] == "rebuilding"]
        done = sum(n["rebuild"].get("done", 0) for n in rebuilding)
        left = sum(n["rebuild_missing"] for n in live)
        rate = sum(n["rebuild"].get("rate", 0.0) for n in rebuilding)
        leaving = self.cluster.draining()
        return {
            "nodes": nodes,
            "code": self.config.make_code().get_config(),
            "epoch": self.cluster.epoch,
            "spares": self.cluster.spares_left(),
            "tables": self.tables(),
            "dirty_rows": sum(n["dirty_rows"] for n in live),
            "parity_lag_writes": sum(n["write_seq"] - n["durable_seq"] for n in live),
            "unacked_deltas": sum(n["unacked_deltas"] for n in live),
            "degraded": [n["position"] for n in nodes if n["health"] == "down"],
            "draining": [n["position"] for n in live if self.cluster.endpoints[n["position"]] in leaving],
            "checkpoint": self._checkpoints.progress(),
            "recovery": {"rebuilding": [n["position"] for n in rebuilding], "rows_done": done, "rows_left": left,
                         "rows_per_s": rate, "eta_s": left / rate if rate else None},
        }

    # -- checkpoints -------------------------------------------------------
    @_read  # a step not sent yet goes out after it: the nodes copy their rows first, then close their windows
    def checkpoint(self, path: str, policy="intermittent", bits: int | None = None, adaptive: bool = False,
                   extra: bytes | None = None, keep: int | None = None, state_bits: int | None = None) -> int:
        """Checkpoint every table into the chain of checkpoints at `path` (a directory or fsspec URL) at this
        point of the caller's writes; returns its number once every node has copied its rows, which it then
        writes in the background (`checkpoint_wait`). `policy`: "full", "incremental", "differential" or
        "intermittent" (or {name, threshold}); `bits`: 2, 3, 4 or 8 to store weights quantized per row
        (`adaptive`: ranges fitted to minimise the error), None exact; optimizer state is stored exactly
        unless `state_bits` (2, 3, 4 or 8) asks otherwise.
        `extra`: bytes stored with it (a data reader's position, a dense model's state) that restore
        returns. `keep`: delete the checkpoints no restore of the last `keep` needs."""
        return self._checkpoints.take(path, policy, bits, adaptive, extra, keep, state_bits)

    @_open
    def checkpoint_wait(self, timeout: float | None = None) -> dict | None:
        """Block until the checkpoint being written is complete (its manifest written: only then is it one);
        its manifest, or None if none was being written. `Error` if a node failed to write its part (take
        another) or past `timeout` (wait again)."""
        return self._checkpoints.wait(timeout)

    @_open
    def restore(self, path: str, number: int | None = None) -> Restored:
        """Install checkpoint `number` (default: the last) of the chain at `path` into this cluster, of any
        shape; its tables must not exist here. Every piece is checked before anything changes: a corrupt,
        partial or mismatched checkpoint raises `BadCheckpoint` naming the piece. Returns the number,
        `extra`, tables and rows restored."""
        return self._checkpoints.restore(path, number)

    @_open
    def export(self, table: str, path: str, state: bool = False) -> int:
        """Write every row of `table` as a float32 .npy file [num_rows, dim] (with `state`, whole records:
        weights then optimizer state) at `path`, a local path or fsspec URL; `ectable.load_rows` reads it.
        Returns the rows written."""
        self._table(table)
        if not isinstance(path, str) or not path:
            raise InvalidRequest(f"export needs a file path or fsspec URL, got {path!r}")
        return export(self, table, path, state)

    @_open
    def wait_recovered(self, timeout: float = 60.0) -> None:
        """Block until every stripe is fully protected again: no position dead, none rebuilding, and every
        node holding all its rows, all seen in one pass. Raises `Unavailable` at once, naming the lost
        stripes, when more than r positions are down (they cannot be rebuilt), and when a position is
        down with no spare left; `Error` past `timeout`."""
        deadline, rest = clock.monotonic() + timeout, 0.005
        while True:
            self.cluster.refresh()  # a spare may have been added since this client last read the map
            self._check_recoverable(self._catch_up())
            left = {p: self._rebuild_left(p) for p in range(self.nodes) if self.cluster.state(p) != "dead"}
            states = self._catch_up()  # a node that died meanwhile was failed over
            if len(left) == self.nodes and not any(left.values()) and all(s == "up" for s in states):
                return
            dead = [p for p, s in enumerate(states) if s == "dead"]
            if dead and not self.cluster.spares_left():
                raise Unavailable(f"nodes {dead} are down and no spare is left: the cluster serves degraded")
            if clock.monotonic() > deadline:
                busy = [p for p, n in left.items() if n or states[p] != "up"]
                raise Error(f"not recovered after {timeout} s: nodes {dead} down, {busy} rebuilding "
                            f"({sum(left.values())} rows left)")
            if not self.cluster.rebuilds_itself:
                for p, n in left.items():
                    if n:
                        self._rebuild_some(p, max(self.rebuild_budget, REBUILD_BUDGET))
            else:
                rest = min(2 * rest, WAIT_POLL)  # rebuilders work, a spare is on its way, the map catches up:
                clock.sleep(rest)  # polled ever less often, as a poll (the map read, a status per node) takes CPU

    def _check_recoverable(self, states) -> None:
        """Raise `Unavailable` naming every table's stripes that lost more than r slots (`states`: `_catch_up`'s)."""
        dead = np.flatnonzero(states == "dead").tolist()
        if len(dead) <= self.config.r:
            return
        lost = {}
        for name, (_, layout) in self._tables.items():
            stripes = unique(np.concatenate([layout.stripes_of(p, t) for p in dead for t in range(layout.width)]))
            nodes = layout.slot_node(stripes[:, None], np.arange(layout.width))
            bad = stripes[np.isin(nodes, dead).sum(axis=1) > layout.r]
            if bad.size:
                lost[name] = bad
        if lost:
            named = "; ".join(f"table {t!r}: {s.size} stripes ({', '.join(map(str, s[:5].tolist()))}"
                              f"{', ...' if s.size > 5 else ''})" for t, s in lost.items())
            raise Unavailable(f"nodes {dead} are down, more than r={self.config.r}: these stripes cannot be "
                              f"rebuilt and are lost: {named}")

    def _rebuild_left(self, p) -> int:
        """Rows node p still has to rebuild (0 if it died meanwhile: it is failed over)."""
        reply = self._try(p, m.Status().header())
        if reply is not None and reply[0]["status"].get("rebuild_lost"):  # its rebuilder met rows lost for good
            raise Unavailable(f"node {p} cannot be rebuilt whole: {reply[0]['status']['rebuild_lost']}")
        left = reply[0]["status"]["rebuild_missing"] if reply is not None else 0
        if not left and self.cluster.state(p) == "rebuilding":
            self.cluster.rebuilt(p)
        return left

    # -- plumbing --------------------------------------------------------
    def _by_node(self, layout, ids):
        """(node, indices into ids) for each node holding some of `ids`."""
        nodes = layout.data_node(ids)
        order = np.argsort(nodes, kind="stable")
        bounds = np.searchsorted(nodes[order], np.arange(self.nodes + 1))
        for p in range(self.nodes):
            if bounds[p] < bounds[p + 1]:
                yield p, order[bounds[p]:bounds[p + 1]]

    def _check_layout(self) -> None:
        """`_Relaid` if the cluster was laid out again since this client planned its call."""
        if self.cluster.config is not self.config:
            raise _Relaid()

    def _by_layout(self, fn):
        """fn(), done again by the new layout each time a grow laid the cluster out again meanwhile (`_Relaid`)."""
        for _ in range(RELAYOUT_TRIES):
            self._follow_layout()
            try:
                return fn()
            except _Relaid:
                continue
        raise Unavailable(f"the cluster was laid out again {RELAYOUT_TRIES} times during one call")

    def _follow_layout(self) -> None:
        """Plan by the cluster's layout from now on (a grow laid it out again over more positions, each under a new
        identity). Every position is then caught up on as one that moved (`_catch_up`): nothing is failed over
        (no identity is known here), but a writer checks in with each node, so a node that replaced one of the
        grow's since, and waits for every live writer's replays, is not kept waiting for this one."""
        config = self.cluster.config
        if config is self.config:
            return
        self.config, self.nodes = config, config.nodes
        self._tables = {name: (spec, config.layout(spec)) for name, (spec, _) in self._tables.items()}
        self._sources = {}
        self.repair, self._ahead = Repair(self), []
        self._checkpoints.relaid({p: self.cluster.source(p) for p in range(self.nodes)})
        self._cut_off()

    def _cut_off(self) -> None:
        """WritesLost if a grow began the redo logs again while they held writes of this client that no parity
        held, their node gone: it failed while they sat in its open window, and this client, idle, never
        replayed them before its replacement stopped waiting (`LATE_WAIT`) and the grow went ahead."""
        lost = [entry for entry, sure in self.cluster.take_cut_off(self.cid) if sure or self._unsettled(entry)]
        if not lost:
            return
        rows: dict[str, list] = {}
        for entry in lost:
            for table, _, ids, _ in entry.writes:
                rows.setdefault(table, []).append(ids)
        rows = {table: unique(np.concatenate(ids)) for table, ids in rows.items()}
        named = ", ".join(f"{table!r} ({ids.size})" for table, ids in rows.items())
        raise WritesLost(f"{len(lost)} acknowledged write(s) of this client are lost: the node that applied them "
                         f"failed before their parity was complete, and a node was added to the cluster before this "
                         f"client (idle meanwhile) replayed them; rows of {named} hold what they held before them "
                         f"(write them again; `rows` names them)", rows)

    def _unsettled(self, entry) -> bool:
        """Whether a logged write's node was failed over (reconciled) before parity was known to hold it: some
        survivor had taken no delta of it, or lacked rows of its tables."""
        settled = self.cluster.settled_marks(entry.node) if entry.node is not None else None
        if settled is None:
            return False  # its node lived until the grow, which waited for every write to be in parity
        marks, lacking = settled
        tables = {table for table, _, _, _ in entry.writes}
        return any(table in tables for _, table, _ in lacking) or \
            entry.cseq > min((c.get(entry.cid, 0) for c in marks.values()), default=0)

    def _catch_up(self) -> np.ndarray:
        """Fail over every position whose node changed since this client last looked (until none did: a
        failover's own requests may show a newer map, and a node whose process is found gone on the way is
        declared dead); every position's state then, "up", "rebuilding" or "dead", to plan a request from."""
        self._check_layout()
        while True:  # one at a time: failing one over may fail over others
            moved = [p for p in range(self.nodes)
                     if self.cluster.source(p) != self._sources.get(p) and p not in self.cluster.taking]
            if moved:
                self._failover(moved[0])
                continue
            try:
                return self._states()
            except _Moved:
                continue  # it moved since the look above

    def _positions(self) -> list[int]:
        """The positions not dead, once every one that moved was failed over (`_catch_up`)."""
        return np.flatnonzero(self._catch_up() != "dead").tolist()

    def _state(self, p):
        """Position p's state: "up", "rebuilding" or "dead"; `_Moved` if its node changed since this
        client last looked (and no failover of it is under way): `_failover(p)` first."""
        self._check_layout()
        if self.cluster.source(p) != self._sources.get(p) and p not in self.cluster.taking:
            raise _Moved(p)
        return self.cluster.state(p)

    def _known_live(self, p) -> bool:
        """p holds the node this client knows, and it is not dead."""
        return self._sources.get(p) is not None and self.cluster.source(p) == self._sources[p]

    def _states(self) -> np.ndarray:
        """Every position's state: "up", "rebuilding" or "dead"."""
        return np.array([self._state(p) for p in range(self.nodes)])

    def _try(self, p, header):
        try:
            return self._call(p, header, [])
        except NodeDown:
            self._lost(p)

    def _lost(self, p):
        """A call to p failed: the cluster learns it is dead, and this client fails over."""
        if self.cluster.source(p) == self._sources.get(p) and not self.cluster.mark_dead(p):
            raise Unavailable(f"node {p} ({self.cluster.endpoints[p]}) does not answer this client, but the cluster "
                              f"counts it alive (its lease is kept): a partition between them? Its rows are not read "
                              f"through the parity, which may lag it; try again once it is reachable")
        if self.cluster.source(p) != self._sources.get(p):
            self._failover(p)

    def _call(self, p, header, arrays):
        if self._ahead:
            self._collect_ahead()
        deadline, pause = None, 0.002
        while True:
            channel = self.cluster.channel(p)
            try:
                reply = channel.call(header, arrays, DEADLINE)
            except NodeDown as exc:
                if self._handed_over(p, channel):
                    continue
                exc.position = p
                raise
            try:
                return self._check_reply(p, *reply)
            except Replaying:  # a replacement waits for writers' replays (this client's too, once it sees it)
                deadline = deadline or clock.monotonic() + REPLAY_WAIT
                if clock.monotonic() > deadline:
                    raise Error(f"node {p} waited for writers' replays longer than {REPLAY_WAIT} s") from None
                clock.sleep(pause)
                pause = min(pause * 2, 0.05)  # a replay takes a round trip; a writer that is away, seconds
                self._catch_up()  # this client replays into a replacement it sees
            except HandingOver:  # a drain moves the node: the map gives its identity another endpoint soon
                deadline = deadline or clock.monotonic() + HANDOVER_WAIT
                if clock.monotonic() > deadline:
                    raise Error(f"node {p} was handing its position over for longer than {HANDOVER_WAIT} s") from None
                clock.sleep(pause)
                pause = min(pause * 2, 0.05)
                self.cluster.refresh()
                self._check_layout()  # a grow froze it: the new layout plans the request again

    def _handed_over(self, p, channel) -> bool:
        """Whether node p, which did not answer on `channel`, is the same node at another endpoint now (channels
        are one per endpoint)."""
        self.cluster.refresh()
        return self.cluster.channel(p) is not channel and self.cluster.source(p) == self._sources.get(p) \
            and self.cluster.state(p) != "dead"

    def _check_reply(self, p, reply, out):
        epoch = reply.get("epoch")
        if isinstance(epoch, int) and epoch > self.cluster.epoch:
            self.cluster.refresh()  # the map changed: the next _catch_up() fails over what moved
        error = reply.get("error")
        if error == ErrorCode.NOT_REBUILT:
            names = reply.get("tables")
            missing = dict(zip(names, out[1:])) if isinstance(names, list) and len(names) == len(out) - 1 else None
            exc = NotRebuilt(reply["table"], out[0], "parity" if reply.get("kind") == "parity" else "data", missing)
            exc.position = p
            raise exc
        if error == ErrorCode.STALE_CUT:
            stale = StaleCut(reply.get("message"))
            stale.behind = bool(reply.get("behind"))
            raise stale
        if error == ErrorCode.NOT_MEMBER:  # it was declared dead while away and waits as a spare now
            self.cluster.refresh()
            self._check_layout()  # or the cluster was laid out again: the request was meant for the old layout
            down = NodeDown(f"node {p} no longer holds its position")
            down.position = p
            raise down
        if error == ErrorCode.REPLAYING:
            raise Replaying(reply.get("message"))
        if error == ErrorCode.MOVED:
            raise HandingOver(reply.get("message"))
        if error == ErrorCode.REPLACED:
            raise Replaced(reply.get("message"))
        if error == ErrorCode.INVALID:
            raise InvalidRequest(reply["message"])
        if error == ErrorCode.EXPIRED:
            raise Error(f"node {p}: {LAPSED}")
        if error:
            raise Error(f"node {p}: {reply.get('message')}")
        durable = reply.get("durable")
        if durable is not None and self.cluster.source(p) == self._sources.get(p):
            log = self._log[p]
            while log and log[0].seq is not None and log[0].seq <= durable:
                log.popleft()
        return reply, out

    def _failover(self, p):
        """The node this client knew at p is gone. The first client of this cluster object to notice takes
        the writes of its redo log that no parity holds; they are replayed into the replacement at p,
        together with every other writer's and in the order the dead node applied them (the replacement
        waits for all live writers), or into the parity, in that order, when no spare is left."""
        self._check_layout()  # a grow gave every position a new node: none of them failed
        source = self._sources.get(p)
        if self.cluster.source(p) == source:  # this client saw it fail first
            self.cluster.mark_dead(p)
        self.repair.forget(p)
        if self.cluster.claim_failover(source):
            self.cluster.taking.add(p)
            try:
                self._take_log(p, source)
            finally:
                self.cluster.taking.discard(p)
        elif p in self.cluster.taking:
            return  # met while taking p's log (its survivors are asked): that failover goes on
        if self.cluster.source(p) is None and self.cluster.replays.get(p) and self.cluster.spares_left():
            self.cluster.wait_replaced(p)  # replays go to the spare, not into parity its rebuild may have read
        self._sources[p] = now = self.cluster.source(p)
        if now is None:
            for entry in self._replays(p):
                self._write_node(p, entry.writes)  # through the parity
        elif self.cluster.claim_checkin(now):
            self._replay(p, now)

    def _take_log(self, p, source) -> None:
        """Move the writes of p's redo log that no parity holds to the cluster's replays for p (writes to
        tables dropped since are never replayed)."""
        self.cluster.wait_reconciled(p)
        self._refresh_tables()
        for entry in self._log[p]:
            for table in {w[0] for w in entry.writes} - self._tables.keys():
                entry.drop(table)
        log = [entry for entry in self._log[p] if entry.writes]
        settled = self.cluster.settled_marks(source)
        if settled is not None:  # what the survivors held when the decider reconciled p (see Map.settled)
            marks, lacking = settled
            held = self._parity_recorded(log, marks, lacking)
        else:  # not reconciled (the decider is away) or long ago: ask the survivors now
            answers = self._ask_survivors({(q,): (m.Applied(source=source).header(), []) for q in range(self.nodes)
                                           if q != p and self.cluster.state(q) != "dead"})
            # per survivor: the last write of each client from the dead node that it holds
            marks = {key[0]: reply["clients"] for key, (reply, _) in answers.items()}
            held = self._parity_held(log, marks)
        replays = self.cluster.replays.setdefault(p, [])
        for entry in log:  # before the log lets go
            writes = self._unapplied(entry, marks, held) if not self._lapsed(entry) else None
            if writes:
                replay = _Write(writes, entry.cid, entry.cseq)
                replay.seq = entry.seq  # the dead node's order
                replays.append(replay)
        self._log[p].clear()
        for entry in log:
            entry.replayed = True

    def _replays(self, p) -> list:
        """The logged writes taken for replay at p, in the dead node's order, less those of lapsed writers."""
        return _in_node_order([e for e in self.cluster.replays.pop(p, []) if not self._lapsed(e)])

    def _lapsed(self, entry) -> bool:
        """Whether a logged write's writer lapsed: it is never replayed (nodes may have forgotten its marks,
        and it would then apply twice); it is lost only if it is not durable yet, which takes a window."""
        return self.cluster.writer_lapsed(writer_of(entry.cid))

    def _replay(self, p, source) -> None:
        """Replay this cluster object's writes for p into the replacement `source` (none: say so) and wait
        until it applied every live writer's; they stay in the redo log under its sequence numbers."""
        entries = self._replays(p)
        if not entries and not self.cluster.is_writer():
            return  # it never wrote (a reader, a rebuilder): nothing to replay, and no replacement waits for it
        replayer = self.cluster.writer_id()
        header = m.Replay(replayer=replayer, entries=[[e.seq, e.cid, e.cseq, [[t, k] for t, k, _, _ in e.writes]]
                                                     for e in entries]).header()
        arrays = [a for e in entries for _, _, ids, values in e.writes for a in (ids, values)]
        fresh = [_Write(e.writes, e.cid, e.cseq) for e in entries]
        self._log[p].extend(fresh)  # if the replacement dies too, the next failover takes them
        deadline = clock.monotonic() + REPLAY_WAIT
        while self.cluster.source(p) == source:
            try:
                reply, _ = self._call(p, header, arrays)
            except NotRebuilt as exc:  # replays touch rows rebuilt first
                try:
                    self.repair.rebuild_rows(p, exc.missing)
                except NodeDown as down:  # a survivor it decodes from died: fail that one over, then again
                    self._lost(p if down.position is None else down.position)
                except _Moved as moved:
                    self._failover(moved.position)
                continue
            except NodeDown:
                self._lost(p)  # if it is gone, its failover takes the replays on
                continue
            if reply.get("done"):
                for entry, seq in zip(fresh, reply.get("seqs", [])):
                    entry.seq = seq
                return
            if clock.monotonic() > deadline:
                raise Error(f"node {p} did not apply writers' replays within {REPLAY_WAIT} s")
            header, arrays = m.Replay(replayer=replayer, entries=[]).header(), []  # accepted: ask again
            clock.sleep(0.002)

    def _ask_survivors(self, requests: dict) -> dict:
        """`_gather`, leaving out nodes that do not answer (they died too: they hold nothing)."""
        while True:
            try:
                return self._gather(requests)
            except NodeDown as down:
                if down.position is None:
                    raise
                requests = {key: r for key, r in requests.items() if key[0] != down.position}

    def _gather_live(self, requests: dict, timeout: float = DEADLINE) -> tuple[dict, list]:
        """Send {(node,): (header, arrays)} to all at once and wait for every reply: ({key: (reply, arrays)}
        of those that answered, the nodes that did not (NodeDown) or are being moved (HandingOver), to be
        failed over or asked again. Any other error is raised once every reply is in."""
        self._collect_ahead()
        pending, replies, failed, failure, moving = {}, {}, [], None, False
        for key, (header, arrays) in requests.items():
            try:
                pending[key] = self.cluster.channel(key[0]).start(header, arrays)
            except NodeDown:
                failed.append(key[0])
        for key, request in pending.items():
            try:
                replies[key] = self._check_reply(key[0], *request.wait(timeout))
            except NodeDown:
                failed.append(key[0])
            except HandingOver:
                failed.append(key[0])
                moving = True
            except Error as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        if moving:  # the map moves it within a moment
            clock.sleep(0.01)
            self.cluster.refresh()
        return replies, failed

    def _touched_stripes(self, log, marks) -> dict:
        """{(holder, table): stripes ascending} of the stripes the writes of `log` touched, per parity holder
        in `marks`."""
        asks: dict = {}
        for entry in log:
            for table, _, ids, _ in entry.writes:
                layout = self._table(table)[1]
                stripes = layout.stripe(ids)
                for j in range(layout.r):
                    holders = layout.parity_node(stripes, j)
                    for q in set(unique(holders).tolist()) & marks.keys():
                        asks.setdefault((q, table), []).append(stripes[holders == q])
        return {key: unique(np.concatenate(parts)) for key, parts in asks.items()}

    def _parity_recorded(self, log, marks, lacking) -> dict:
        """`_parity_held` as recorded when the dead node was reconciled: every holder had its rows but
        those listed in `lacking` [(q, table, stripes)]."""
        lacked = {(q, table): np.asarray(stripes, dtype=np.int64) for q, table, stripes in lacking}
        return {key: (stripes, ~np.isin(stripes, lacked.get(key, stripes[:0])))
                for key, stripes in self._touched_stripes(log, marks).items()}

    def _parity_held(self, log, marks) -> dict:
        """{(holder, table): (stripes ascending, whether it has their parity row)} for the stripes the
        writes of `log` touched, asked of every surviving parity holder at once (a rebuilding node
        may lack some rows)."""
        stripes = self._touched_stripes(log, marks)
        answers = self._ask_survivors({key: (m.Holds(table=key[1]).header(), [s]) for key, s in stripes.items()})
        return {key: (stripes[key], arrays[0].astype(bool)) for key, (_, arrays) in answers.items()}

    def _unapplied(self, entry, marks, held):
        """The rows of a logged write whose parity does not hold it yet: for each row, the most
        advanced of its parity holders that has the row's parity row (the decider made the
        others agree, or forget theirs)."""
        out = []
        for table, kind, ids, values in entry.writes:
            layout = self._table(table)[1]
            stripes = layout.stripe(ids)
            last = np.full(ids.size, -1, dtype=np.int64)  # per row: the last of this client's writes its parity has
            for j in range(layout.r):
                holders = layout.parity_node(stripes, j)
                for q in unique(holders).tolist():
                    if (q, table) in held:
                        pick = holders == q
                        known, have = held[(q, table)]
                        has = have[np.searchsorted(known, stripes[pick])]
                        last[pick] = np.maximum(last[pick], np.where(has, marks[q].get(entry.cid, 0), -1))
            todo = last < entry.cseq
            if todo.any():
                out.append((table, kind, ids[todo], values[todo]))
        return out


def _in_node_order(entries: list) -> list:
    """Replayed writes in the order the dead node applied them; one whose reply never came goes right after
    the write logged before it."""
    keys, last = [], 0
    for n, entry in enumerate(entries):
        if entry.seq is not None:
            last = entry.seq
        keys.append((entry.seq if entry.seq is not None else last, entry.seq is None, n))
    return [entries[n] for *_, n in sorted(keys)]
