"""The lookahead's store I/O: one thread that owns the client and carries out reads, write-backs and
other calls in the order they were asked, merging neighbours of the same kind into one request."""
from __future__ import annotations

import threading
from collections import deque

import numpy as np

from ..arrays import unique
from ..errors import Error, Unavailable


class Future:
    """The result of a task, once the worker has done it."""

    def __init__(self):
        self._done = threading.Event()
        self._result = self._error = None

    def set(self, result=None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float):
        if not self._done.wait(timeout):
            raise Unavailable(f"the lookahead's store I/O did not finish within {timeout:.0f} s")
        if self._error is not None:
            raise self._error
        return self._result


class Worker:
    """Runs tasks on `client` in order: "read" {table: (ids, slots)} puts the records of rows `ids` into
    those slots of `arena`; "write" {table: (ids, records)}; "call" fn(client). Neighbouring reads go
    as one request. Writes are held and sent together (then `step()`) once GROUP of them are held or
    before a call; a read of rows that held writes carry takes their records from there (the last
    written), so it never reads the store behind a write. After a failure every later task fails with
    it: nothing is read past a write-back that did not happen."""

    GROUP = 8  # writes held before they go, as one request per node

    def __init__(self, client, arena: np.ndarray):
        self.client, self.arena = client, arena
        self.held = 0  # rows of write-backs not done yet
        self._tasks: deque = deque()
        self._writes: list = []  # held: (payload, future, rows)
        self._cv = threading.Condition()
        self._failed: BaseException | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="ectable-lookahead", daemon=True)
        self._thread.start()

    def submit(self, kind: str, payload, rows: int = 0) -> Future:
        """Queue a task; `rows`: of a write-back, counted in `held` until it is done."""
        return self.submit_all(kind, [payload], rows)[0]

    def submit_all(self, kind: str, payloads: list, rows: int = 0) -> list[Future]:
        """Queue tasks of one kind at once (reads queued together go as one request); `rows` each."""
        futures = [Future() for _ in payloads]
        with self._cv:
            if self._stop:
                raise Error("the lookahead is closed")
            self.held += rows * len(payloads)
            self._tasks.extend((kind, payload, future, rows) for payload, future in zip(payloads, futures))
            self._cv.notify()
        return futures

    def stop(self, timeout: float) -> None:
        """Finish the queued tasks, then end the thread."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._tasks and not self._stop:
                    self._cv.wait()
                if not self._tasks:
                    break
                group = [self._tasks.popleft()]
                if group[0][0] == "read":
                    while self._tasks and self._tasks[0][0] == "read":
                        group.append(self._tasks.popleft())
            self._do(group)
        self._do([("call", lambda client: None, Future(), 0)])  # what is still held goes out

    def _do(self, group: list) -> None:
        kind = group[0][0]
        if kind == "write":
            self._writes.append(group[0][1:])
            if len(self._writes) < self.GROUP:
                return
        try:
            if self._failed is not None:
                raise self._failed
            if kind == "read":
                results = self._read([payload for _, payload, _, _ in group])
            else:
                self._flush()
                results = [None] if kind == "write" else [group[0][1](self.client)]
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer, which raises it
            if kind != "call":
                self._failed = exc
            results, error = [None] * len(group), exc
            self._finish_writes(exc)
        else:
            error = None
        if kind != "write":
            for (_, _, future, _), result in zip(group, results):
                future.set(result, error)

    def _flush(self) -> None:
        """Send the held writes: one request per node, then a step."""
        if self._writes:
            payloads = [payload for payload, _, _ in self._writes]
            tables = {table for payload in payloads for table in payload}
            merged = {table: _last(*(np.concatenate(a) for a in zip(*(p[table] for p in payloads if table in p))))
                      for table in tables}
            if merged:
                self.client.put_many(merged, records=True)
                self.client.step()
            self._finish_writes(None)

    def _finish_writes(self, error) -> None:
        writes, self._writes = self._writes, []
        with self._cv:
            self.held -= sum(rows for _, _, rows in writes)
        for _, future, _ in writes:
            future.set(None, error)

    def _read(self, payloads: list[dict]) -> list[None]:
        merged = _merged([{table: ids for table, (ids, _) in payload.items()} for payload in payloads])
        slots = _merged([{table: where for table, (_, where) in payload.items()} for payload in payloads])
        held = {table: self._held(table, ids) for table, ids in merged.items()}
        ask = {table: ids if held[table][0] is None else ids[~held[table][0]] for table, ids in merged.items()}
        got = self.client.get_many({table: ids for table, ids in ask.items() if ids.size}, records=True)
        records = {}
        for table, ids in merged.items():
            found, rows = held[table]
            if found is None:
                records[table] = got[table]
            else:
                records[table] = np.empty((ids.size, rows.shape[1]), dtype=np.float32)
                records[table][found] = rows
                if table in got:
                    records[table][~found] = got[table]
        for table, rows in records.items():
            self.arena[slots[table], : rows.shape[1]] = rows  # slots no one else uses until the batch is current
        return [None] * len(payloads)

    def _held(self, table: str, ids: np.ndarray) -> tuple:
        """(mask of `ids` that held writes carry, their last records), or (None, None)."""
        parts = [payload[table] for payload, _, _ in self._writes if table in payload]
        if not parts:
            return None, None
        every = np.concatenate([written for written, _ in parts])
        uniq, first = np.unique(every[::-1], return_index=True)
        pos = np.searchsorted(uniq, ids)
        found = pos < uniq.size
        found[found] = uniq[pos[found]] == ids[found]
        if not found.any():
            return None, None
        where = every.size - 1 - first[pos[found]]  # the last write of each, among every write's rows
        ends = np.cumsum([written.size for written, _ in parts])
        which = np.searchsorted(ends, where, side="right")
        held = np.empty((where.size, parts[0][1].shape[1]), dtype=np.float32)
        for n in unique(which):  # a loop over held writes (at most GROUP), not rows
            mine = which == n
            held[mine] = parts[n][1][where[mine] - (ends[n] - parts[n][0].size)]
        return found, held


def _merged(payloads: list[dict]) -> dict:
    tables = {table for payload in payloads for table in payload}
    return {table: np.concatenate([p[table] for p in payloads if table in p]) for table in tables}


def _last(ids: np.ndarray, records: np.ndarray) -> tuple:
    """(ids, records) keeping each id's last record only (a row written back twice: by a sync, then as it
    left the cache, or as it left the cache twice)."""
    uniq, first = np.unique(ids[::-1], return_index=True)
    if uniq.size == ids.size:
        return ids, records
    keep = ids.size - 1 - first
    return ids[keep], records[keep]
