"""The lookahead's store I/O: one thread that owns the client and carries out reads, write-backs and
other calls in the order they were asked, merging neighbours of the same kind into one request."""
from __future__ import annotations

import threading
from collections import deque

import numpy as np

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
    """Runs tasks on `client` in order: "read" {table: ids} -> {table: records}; "write" {table: (ids,
    records)}, then `step()`; "call" fn(client). Neighbouring reads (and writes) go as one request: a
    row is never read and written back in one merged request, since a read of a row written back
    comes after its write-back. After a failure every later task fails with it: nothing is read
    past a write-back that did not happen."""

    def __init__(self, client):
        self.client = client
        self.held = 0  # rows of write-backs not done yet
        self._tasks: deque = deque()
        self._cv = threading.Condition()
        self._failed: BaseException | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="ectable-lookahead", daemon=True)
        self._thread.start()

    def submit(self, kind: str, payload, rows: int = 0) -> Future:
        """Queue a task; `rows`: of a write-back, counted in `held` until it is done."""
        future = Future()
        with self._cv:
            if self._stop:
                raise Error("the lookahead is closed")
            if kind == "write":
                self.held += rows
            self._tasks.append((kind, payload, future, rows))
            self._cv.notify()
        return future

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
                    return
                group = [self._tasks.popleft()]
                if group[0][0] != "call":
                    while self._tasks and self._tasks[0][0] == group[0][0]:
                        group.append(self._tasks.popleft())
            self._do(group)

    def _do(self, group: list) -> None:
        kind = group[0][0]
        try:
            if self._failed is not None:
                raise self._failed
            if kind == "read":
                results = self._read([payload for _, payload, _, _ in group])
            elif kind == "write":
                self._write([payload for _, payload, _, _ in group])
                results = [None] * len(group)
            else:
                results = [group[0][1](self.client)]
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer, which raises it
            if kind != "call":
                self._failed = exc
            results, error = [None] * len(group), exc
        else:
            error = None
        if kind == "write":
            with self._cv:
                self.held -= sum(rows for *_, rows in group)
        for (_, _, future, _), result in zip(group, results):
            future.set(result, error)

    def _read(self, payloads: list[dict]) -> list[dict]:
        merged = _merged(payloads)
        records = self.client.get_many(merged, records=True) if merged else {}
        out, at = [], {table: 0 for table in merged}
        for payload in payloads:
            part = {}
            for table, ids in payload.items():
                part[table] = records[table][at[table]: at[table] + ids.size]
                at[table] += ids.size
            out.append(part)
        return out

    def _write(self, payloads: list[dict]) -> None:
        tables = {table for payload in payloads for table in payload}
        merged = {table: _last((np.concatenate([p[table][0] for p in payloads if table in p]),
                                np.concatenate([p[table][1] for p in payloads if table in p]))) for table in tables}
        if merged:
            self.client.put_many(merged, records=True)
            self.client.step()


def _merged(payloads: list[dict]) -> dict:
    tables = {table for payload in payloads for table in payload}
    return {table: np.concatenate([p[table] for p in payloads if table in p]) for table in tables}


def _last(write: tuple) -> tuple:
    """(ids, records) keeping each id's last record only (a row written back twice in a row: by a sync,
    then as it left the cache)."""
    ids, records = write
    rev = ids[::-1]
    uniq, first = np.unique(rev, return_index=True)
    if uniq.size == ids.size:
        return write
    keep = ids.size - 1 - first
    return ids[keep], records[keep]
