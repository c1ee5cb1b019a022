"""`Lookahead`: Bagpipe's prefetching and oracle caching over a stream of batches known in advance.

While the trainer works on batch t, the rows of batches t+1 .. t+L are read from the store in the
background. A row that a batch within that window uses again stays in the trainer's cache, where its
updates are applied with the nodes' own optimizer code; it is written back (its whole record,
weights and optimizer state) once no batch of the window uses it. A row is read from the store
only when no admitted batch holds it, after its last write-back: no read is ever stale.
"""
from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np

from ..errors import Error, InvalidRequest
from ..protocol import validate
from ..storage.optimizers import Optimizer, write_rows
from ..storage.table import TableSpec
from .cache import CacheFull, RowCache, keys_of, split_keys
from .reader import END, Reader
from .worker import Worker

TIMEOUT = 300.0  # longest wait for the store (a failover included) before `Unavailable`


class _Table(NamedTuple):
    spec: TableSpec
    index: int  # in the cache's keys
    width: int
    optimizer: Optimizer
    group: tuple  # tables of one group take one optimizer call together: (dim, width, optimizer config)


class _Part(NamedTuple):
    """One table's rows in a batch: the ids as named (flat), their unique ids, the inverse, where they are
    among the batch's keys."""
    ids: np.ndarray
    uniq: np.ndarray
    inverse: np.ndarray
    at: slice


class _Batch:
    """An admitted batch: the user's value, its rows by table, its unique rows as keys and their cache slots."""

    __slots__ = ("value", "parts", "keys", "slots", "future")

    def __init__(self, value, parts: dict, keys: np.ndarray):
        self.value, self.parts, self.keys = value, parts, keys
        self.slots = self.future = None


def _dict_ids(batch) -> dict:
    return batch


def _same_ids(a: np.ndarray, b: np.ndarray) -> bool:
    return a is b or (a.size == b.size and bool((a == b).all()))


class Lookahead:
    """Iterate over `batches` (any iterable) through a trainer-side cache of `cache_rows` records,
    reading the rows of the next `lookahead` batches while the caller computes.

    Each batch's rows are named by `ids(batch)`, a dict {table: ids} (the default takes the batch
    itself as that dict). Inside the loop, use the lookahead in place of the client: `get_many`,
    `get`, `apply_gradient_many`, `apply_gradient` and `step` act on the current batch's rows (the
    last one the iteration gave) exactly as the client's verbs would, bit for bit. The iteration
    ends, once `batches` do, with every update written back; `close()` (or leaving a `with` block)
    writes back what an unfinished loop holds. Rows updated and kept in the cache are also written
    back every `sync_every` batches (None: only when they leave the cache), which bounds what a
    trainer crash loses. The client is used by the lookahead's own thread until `close()`.

    Memory: at most `cache_rows` rows are cached; rows that left the cache count against that bound
    until their write-back is done, so when the batches ahead would need more, fewer are read ahead
    (the lookahead shrinks, it never writes back early). A sync's copies add to it while they are
    being written."""

    def __init__(self, client, batches, lookahead: int = 8, cache_rows: int = 1 << 20, ids=None,
                 sync_every: int | None = 100, timeout: float = TIMEOUT):
        for name, value, low in (("lookahead", lookahead, 0), ("cache_rows", cache_rows, 1),
                                 ("sync_every", 1 if sync_every is None else sync_every, 1)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise InvalidRequest(f"{name} must be an integer >= {low}, got {value!r}")
        if ids is not None and not callable(ids):
            raise InvalidRequest(f"ids must be a function batch -> {{table: ids}}, got {type(ids).__name__}")
        self.lookahead, self.sync_every, self.timeout = int(lookahead), sync_every, float(timeout)
        self._tables: dict[str, _Table] = {}
        self._learn(client.tables())
        self.cache = RowCache(int(cache_rows), max((t.width for t in self._tables.values()), default=1))
        self._ids = ids or _dict_ids
        self._window: deque[_Batch] = deque()  # admitted, not given yet
        self._waiting: _Batch | None = None  # read from `batches`, not admitted yet (no room)
        self._current: _Batch | None = None
        self._exhausted = self._closed = False
        self._error: Exception | None = None  # what reading a batch raised, for when the loop reaches it
        self._counts = dict.fromkeys(("batches", "rows", "fetched", "written", "bytes_read", "bytes_written"), 0)
        self._worker = Worker(client, self.cache.arena)
        self._reader = Reader(iter(batches), self._prepare, self.lookahead + 1)

    # -- the loop --------------------------------------------------------
    def __iter__(self):
        return self

    def __next__(self):
        self._open()
        if self._current is not None:
            self._finish(self._current)
            self._current = None
        self._admit()
        if not self._window:
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            self.flush()
            raise StopIteration
        batch = self._window.popleft()
        if batch.future is not None:
            batch.future.result(self.timeout)  # its rows are in their slots
            batch.future = None
        self._current = batch
        self._counts["batches"] += 1
        if self.sync_every is not None and self._counts["batches"] % self.sync_every == 0:
            self._write_back(*self.cache.take_dirty())
        return batch.value

    def _admit(self) -> None:
        """Admit batches until `lookahead` + 1 are ahead or the cache has no room for the next one's rows; once
        a quarter of the window is free, so that their reads go as one request."""
        if self._window and len(self._window) > self.lookahead + 1 - max(1, (self.lookahead + 1) // 4):
            return
        reads = []
        try:
            self._admit_some(reads)
        finally:
            futures = self._worker.submit_all("read", [payload for _, payload in reads])
            for (batch, _), future in zip(reads, futures):
                batch.future = future

    def _admit_some(self, reads: list) -> None:
        while len(self._window) <= self.lookahead:
            if self._waiting is None:
                if self._exhausted:
                    return
                try:
                    self._waiting = self._reader.take(not self._window, self.timeout)
                except Exception as exc:  # raised when the loop reaches this batch
                    self._exhausted, self._error = True, exc
                    return
                if self._waiting is None:
                    return  # not prepared yet: admitted at the next batch
                if self._waiting is END:
                    self._exhausted, self._waiting = True, None
                    return
            batch = self._waiting
            try:  # rows whose write-back is in flight count against the cache's capacity
                batch.slots, new = self.cache.admit(batch.keys, self.cache.free - self._worker.held)
            except CacheFull:
                if self._window:
                    return  # the batches ahead free slots as they are done
                self._drain()  # only write-backs in flight hold slots
                try:
                    batch.slots, new = self.cache.admit(batch.keys)
                except CacheFull:
                    raise InvalidRequest(f"a batch names {batch.keys.size} unique rows, more than cache_rows="
                                         f"{self.cache.capacity}") from None
            if new.any():
                payload, slots = {}, batch.slots[new]
                for index, part, ids in split_keys(batch.keys[new]):
                    payload[self._names[index]] = (ids, slots[part])
                reads.append((batch, payload))
                self._count_io("fetched", "bytes_read", {t: ids for t, (ids, _) in payload.items()})
            self._counts["rows"] += batch.keys.size
            self._window.append(batch)
            self._waiting = None

    def _prepare(self, value) -> _Batch:
        ids = self._ids(value)
        if not isinstance(ids, dict):
            raise InvalidRequest(f"a lookahead batch's ids must be a dict {{table: ids}}, got {type(ids).__name__}"
                                 " (pass ids=, a function of the batch, for other batches)")
        named = {}
        for table, given in ids.items():
            flat = validate.shaped_ids(table, given, self._table(table).spec.num_rows)[0]
            named[table] = (flat, *np.unique(flat, return_inverse=True))
        parts, keys, at = {}, [], 0
        for table in sorted(named, key=lambda t: self._tables[t].index):  # keys ascending: tables in index order
            flat, uniq, inverse = named[table]
            keys.append(keys_of(self._tables[table].index, uniq))
            parts[table] = _Part(flat, uniq, inverse, slice(at, at + uniq.size))
            at += uniq.size
        return _Batch(value, parts, np.concatenate(keys) if keys else np.empty(0, dtype=np.int64))

    def _finish(self, batch: _Batch) -> None:
        """The batch is done: its rows no batch ahead uses leave the cache, written back if updated."""
        self._write_back(*self.cache.release(batch.keys), held=True)

    def _write_back(self, keys: np.ndarray, records: np.ndarray, held: bool = False) -> None:
        """Write records back; `held`: rows that left the cache, counted against its capacity until written."""
        if keys.size:
            payload = {}
            for index, part, ids in split_keys(keys):
                table = self._names[index]
                payload[table] = (ids, records[part, : self._tables[table].width])
            self._worker.submit("write", payload, rows=int(keys.size) if held else 0)
            self._count_io("written", "bytes_written", {t: ids for t, (ids, _) in payload.items()})

    def _count_io(self, rows: str, size: str, payload: dict) -> None:
        for table, ids in payload.items():
            self._counts[rows] += ids.size
            self._counts[size] += ids.size * self._tables[table].width * 4

    def _drain(self) -> None:
        """Wait until every task queued so far is done (raising its failure)."""
        self._worker.submit("call", lambda client: None).result(self.timeout)

    # -- the verbs of the current batch ----------------------------------
    def get_many(self, batch: dict) -> dict:
        """{table: ids} -> {table: rows [*S, dim]}, as `Client.get_many`; the ids must be among the current
        batch's."""
        current = self._now()
        out = {}
        for table, ids in self._checked(batch).items():
            t = self._table(table)
            flat, shape = validate.shaped_ids(table, ids, t.spec.num_rows)
            part = current.parts.get(table)
            if part is not None and _same_ids(flat, part.ids):  # each row copied once, then repeated
                rows = np.take(self.cache.arena[current.slots[part.at], : t.spec.dim], part.inverse, axis=0)
            else:
                rows = self.cache.arena[self._slots(current, table, flat), : t.spec.dim]
            out[table] = rows.reshape(*shape, t.spec.dim)
        return out

    def get(self, table: str, ids) -> np.ndarray:
        """Rows of `ids` of `table`, as `Client.get`."""
        return self.get_many({table: ids})[table]

    def apply_gradient_many(self, batch: dict) -> None:
        """{table: (ids, grads)}, as `Client.apply_gradient_many`, applied to the cached rows: every table is
        checked before any is written."""
        current = self._now()
        groups: dict[tuple, list] = {}
        for table, value in self._checked(batch).items():
            ids, grads = validate.pair(table, value, "grads")
            t = self._table(table)
            ids, shape = validate.shaped_ids(table, ids, t.spec.num_rows)
            grads = validate.rows(table, grads, ids.size, t.spec.dim, "gradients", shape)
            part = current.parts.get(table)
            if part is not None and _same_ids(ids, part.ids):  # the batch's ids as named: sum as the client does
                ids, slots = part.uniq, current.slots[part.at]
                with np.errstate(over="ignore"):
                    grads = validate.sum_rows(part.inverse, grads, ids.size)
            else:  # other ids of the batch (the PyTorch adapter sends each row once)
                ids, grads = validate.coalesce(ids, grads)
                slots = self._slots(current, table, ids)
            groups.setdefault(t.group, []).append((table, t, ids, slots, validate.finite_sums(table, grads)))
        work = []
        for members in groups.values():  # the tables of one optimizer config in one call
            t = members[0][1]
            slots = np.concatenate([m[3] for m in members])
            records = self.cache.arena[slots, : t.width]
            write_rows(t.optimizer, "apply_gradient", records, np.concatenate([m[4] for m in members]), t.spec.dim)
            if not np.isfinite(records).all():  # name the table and rows, as a node does
                at = 0
                for table, _, ids, _, _ in members:
                    validate.finite_result(table, "apply_gradient", ids, records[at: at + ids.size])
                    at += ids.size
            work.append((slots, t.width, records))
        for slots, width, records in work:
            self.cache.arena[slots, :width] = records
            self.cache.dirty[slots] = True

    def apply_gradient(self, table: str, ids, grads) -> None:
        """As `Client.apply_gradient`, on the current batch's rows."""
        self.apply_gradient_many({table: (ids, grads)})

    def step(self) -> None:
        """Nothing: the iteration boundary is the loop's next batch (kept so a lookahead stands in for a client)."""
        self._open()

    def _now(self) -> _Batch:
        self._open()
        if self._current is None:
            raise InvalidRequest("no current batch: iterate over the lookahead first (its rows are those of the "
                                 "batch it gave last)")
        return self._current

    def _checked(self, batch) -> dict:
        if not isinstance(batch, dict):
            raise InvalidRequest(f"a multi-table batch must be a dict of table -> values, got {type(batch).__name__}")
        return batch

    def _slots(self, current: _Batch, table: str, ids: np.ndarray) -> np.ndarray:
        """The cache slots of rows `ids` of `table`, which the current batch must name."""
        part = current.parts.get(table)
        uniq = part.uniq if part is not None else np.empty(0, dtype=np.int64)
        pos = np.searchsorted(uniq, ids)
        found = pos < uniq.size
        found[found] = uniq[pos[found]] == ids[found]
        if not found.all():
            raise InvalidRequest(f"table {table!r}: rows {ids[~found][:8].tolist()} are not in the lookahead's "
                                 f"current batch (it holds only the rows its batches name)")
        return current.slots[part.at][pos]

    # -- tables ----------------------------------------------------------
    def tables(self) -> dict:
        """{name: config} of the cluster's tables, as `Client.tables`."""
        self._open()
        tables = self._worker.submit("call", lambda client: client.tables()).result(self.timeout)
        self._learn(tables)
        return tables

    def _learn(self, tables: dict) -> None:
        """Know `tables` ({name: config}); a table keeps its index. The dicts are replaced, never changed,
        so the reader's thread and the trainer's may both read them."""
        known = dict(self._tables)
        for name, config in tables.items():
            spec = TableSpec.from_config(config)
            group = (spec.dim, spec.width, tuple(sorted(spec.optimizer.items())))
            known[name] = _Table(spec, known[name].index if name in known else len(known), spec.width,
                                 spec.make_optimizer(), group)
        self._tables, self._names = known, {t.index: name for name, t in known.items()}

    def _table(self, table) -> _Table:
        if not isinstance(table, str):
            raise InvalidRequest(f"a table is named by a string, got {type(table).__name__}")
        if table not in self._tables:
            self.tables()  # created since
        if table not in self._tables:
            raise InvalidRequest(f"unknown table {table!r}")
        t = self._tables[table]
        if t.width > self.cache.arena.shape[1]:
            raise InvalidRequest(f"table {table!r} was created after this lookahead, with wider records "
                                 f"({t.width} values) than its cache holds ({self.cache.arena.shape[1]})")
        return t

    # -- write-back, checkpoints, the end ----------------------------------
    def flush(self) -> None:
        """Write back every updated cached row and wait: the store then holds every update so far."""
        self._open()
        self._write_back(*self.cache.take_dirty())
        self._drain()

    def checkpoint(self, path: str, **kwargs):
        """`Client.checkpoint` of the store after writing back the cache, so the checkpoint holds every update
        so far."""
        self.flush()
        return self._worker.submit("call", lambda client: client.checkpoint(path, **kwargs)).result(self.timeout)

    def checkpoint_wait(self, timeout: float | None = None):
        """`Client.checkpoint_wait`."""
        self._open()
        wait = self.timeout if timeout is None else timeout + self.timeout
        return self._worker.submit("call", lambda client: client.checkpoint_wait(timeout)).result(wait)

    @property
    def stats(self) -> dict:
        """Counts so far: batches given, unique rows they named, rows fetched from the store and written back
        (and their bytes), the hit rate (rows named that were cached already), rows cached and batches ahead."""
        out = dict(self._counts)
        out["hit_rate"] = 1 - out["fetched"] / out["rows"] if out["rows"] else 0.0
        out["cached"], out["ahead"] = len(self.cache), len(self._window)
        return out

    def close(self) -> None:
        """Write back every update the cache holds and stop the lookahead's thread (the client stays open)."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._reader.stop()
            self._worker.stop(self.timeout)

    def _open(self) -> None:
        if self._closed:
            raise Error("the lookahead is closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
