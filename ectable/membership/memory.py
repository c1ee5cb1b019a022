"""`MemoryMembership`: the membership store in one process's memory, for tests and the simulator.

Deterministic: lease ids count up from 1, leases expire on the injected `clock` (once
`clock() >= last grant or keepalive + ttl`), checked at the start of every call and by `expire()`. Watch callbacks run synchronously, outside the store's lock,
in revision order, before the call that made the change returns.
"""
from __future__ import annotations

import bisect
import heapq
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ..errors import InvalidRequest
from .base import (Compacted, Compare, Delete, Event, KeyValue, LeaseNotFound, Membership, Op, Put, Watch,
                   check_txn)

log = logging.getLogger(__name__)


@dataclass
class _Lease:
    ttl: float
    deadline: float
    keys: set[str] = field(default_factory=set)


class _MemoryWatch(Watch):
    def __init__(self, store: "MemoryMembership", prefix: str, callback: Callable[[list[Event]], None]):
        self.store, self.prefix, self.callback = store, prefix, callback
        self.cancelled = False

    def cancel(self) -> None:
        self.store._cancel(self)


class MemoryMembership(Membership):
    """The whole store in memory, behind one lock; `history`: how many events watches can replay."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, history: int = 10_000, min_ttl: float = 0.0):
        self.clock, self.min_ttl, self.max_history = clock, min_ttl, history
        self._lock = threading.Lock()
        self._kvs: dict[str, KeyValue] = {}
        self._keys: list[str] = []  # the keys of _kvs, sorted
        self._revision = 1
        self._leases: dict[int, _Lease] = {}
        self._deadlines: list[tuple[float, int]] = []  # heap; entries whose lease moved on are skipped
        self._next_lease = 1
        self._history: deque[tuple[int, list[Event]]] = deque()
        self._history_events = 0
        self._floor = 1  # the oldest revision a watch can start from
        self._watches: list[_MemoryWatch] = []
        self._pending: deque[tuple[_MemoryWatch, list[Event]]] = deque()  # callbacks still to make, in order
        self._deliver = threading.RLock()
        self._delivering = False

    # --- reads ---
    def get(self, key: str) -> KeyValue | None:
        if not key:
            raise InvalidRequest("empty key")
        with self._lock:
            expired = self._expire_locked()
            kv = self._kvs.get(key)
        if expired:
            self._drain()
        return kv

    def range(self, prefix: str) -> tuple[list[KeyValue], int]:
        with self._lock:
            expired = self._expire_locked()
            found = [self._kvs[k] for k in self._under(prefix)]
            revision = self._revision
        if expired:
            self._drain()
        return found, revision

    # --- writes ---
    def txn(self, compare: Sequence[Compare], success: Iterable[Op], failure: Iterable[Op] = ()) -> tuple[bool, int]:
        success, failure = list(success), list(failure)
        check_txn(compare, success, failure)
        try:
            with self._lock:
                self._expire_locked()
                held = all(self._holds(c) for c in compare)
                ops = success if held else failure
                for op in ops:
                    if isinstance(op, Put) and op.lease and op.lease not in self._leases:
                        raise LeaseNotFound(f"lease {op.lease} is gone")
                self._apply(ops)
                return held, self._revision
        finally:
            self._drain()

    # --- leases ---
    def grant(self, ttl: float) -> int:
        with self._lock:
            expired = self._expire_locked()
            lease, self._next_lease = self._next_lease, self._next_lease + 1
            ttl = max(float(ttl), self.min_ttl)
            self._leases[lease] = _Lease(ttl, self.clock() + ttl)
            heapq.heappush(self._deadlines, (self._leases[lease].deadline, lease))
        if expired:
            self._drain()
        return lease

    def keepalive(self, lease: int) -> bool:
        with self._lock:
            expired = self._expire_locked()
            entry = self._leases.get(lease)
            if entry is not None:
                entry.deadline = self.clock() + entry.ttl
                heapq.heappush(self._deadlines, (entry.deadline, lease))
        if expired:
            self._drain()
        return entry is not None

    def revoke(self, lease: int) -> None:
        with self._lock:
            self._expire_locked()
            entry = self._leases.pop(lease, None)
            if entry is not None:
                self._apply([Delete(k) for k in sorted(entry.keys)])
        self._drain()

    def expire(self) -> int:
        """End every lease whose time is up (deleting its keys); how many ended."""
        with self._lock:
            ended = self._expire_locked()
        self._drain()
        return ended

    # --- watches ---
    def watch(self, prefix: str, callback: Callable[[list[Event]], None], start_revision: int | None = None) -> Watch:
        w = _MemoryWatch(self, prefix, callback)
        with self._lock:
            self._expire_locked()
            if start_revision is not None and 0 < start_revision:
                if start_revision < self._floor:
                    raise Compacted(f"revision {start_revision} is compacted (oldest kept: {self._floor})", self._floor)
                replay = [e for rev, events in self._history if rev >= start_revision
                          for e in events if e.key.startswith(prefix)]
                if replay:
                    self._pending.append((w, replay))
            self._watches.append(w)
        self._drain()
        return w

    def close(self) -> None:
        for w in list(self._watches):
            w.cancel()

    # --- inside the lock ---
    def _under(self, prefix: str) -> list[str]:
        i = bisect.bisect_left(self._keys, prefix)
        j = i
        while j < len(self._keys) and self._keys[j].startswith(prefix):
            j += 1
        return self._keys[i:j]

    def _holds(self, c: Compare) -> bool:
        kv = self._kvs.get(c.key)
        if c.target == "value":
            return kv is not None and kv.value == c.value
        if kv is None:
            return c.value == 0
        return {"mod": kv.mod_revision, "create": kv.create_revision, "version": kv.version}[c.target] == c.value

    def _apply(self, ops: Sequence[Op]) -> None:
        """Apply `ops` at one new revision (none if nothing changes) and queue their events."""
        rev = self._revision + 1
        events: list[Event] = []
        for op in ops:
            if isinstance(op, Put):
                old = self._kvs.get(op.key)
                if old is None:
                    bisect.insort(self._keys, op.key)
                else:
                    self._detach(old)
                self._kvs[op.key] = KeyValue(op.key, op.value, rev, old.create_revision if old else rev,
                                             old.version + 1 if old else 1, op.lease)
                if op.lease:
                    self._leases[op.lease].keys.add(op.key)
                events.append(Event("put", op.key, op.value, rev))
            else:
                for key in self._under(op.key) if op.prefix else [op.key] if op.key in self._kvs else []:
                    self._detach(self._kvs.pop(key))
                    del self._keys[bisect.bisect_left(self._keys, key)]
                    events.append(Event("delete", key, b"", rev))
        if not events:
            return
        self._revision = rev
        self._history.append((rev, events))
        self._history_events += len(events)
        while self._history_events > self.max_history and len(self._history) > 1:
            old_rev, old = self._history.popleft()
            self._history_events -= len(old)
            self._floor = old_rev + 1
        for w in self._watches:
            mine = [e for e in events if e.key.startswith(w.prefix)]
            if mine:
                self._pending.append((w, mine))

    def _detach(self, kv: KeyValue) -> None:
        if kv.lease and kv.lease in self._leases:
            self._leases[kv.lease].keys.discard(kv.key)

    def _expire_locked(self) -> int:
        if not self._deadlines or self._deadlines[0][0] > self.clock():
            return 0
        now, ended = self.clock(), 0
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, lease = heapq.heappop(self._deadlines)
            entry = self._leases.get(lease)
            if entry is None or entry.deadline != deadline:
                continue  # revoked, or kept alive since this entry was pushed
            del self._leases[lease]
            self._apply([Delete(k) for k in sorted(entry.keys)])
            ended += 1
        return ended

    # --- outside the lock ---
    def _drain(self) -> None:
        """Make the queued callbacks, in order; returns once those queued before the call are made."""
        with self._deliver:
            if self._delivering:
                return  # a callback called the store: the loop below delivers the new events next
            self._delivering = True
            try:
                while True:
                    with self._lock:
                        if not self._pending:
                            return
                        w, events = self._pending.popleft()
                        if w.cancelled:
                            continue
                    try:
                        w.callback(events)
                    except Exception:  # the owner's bug: the other watches still get their events
                        log.exception("watch callback on %r failed", w.prefix)
            finally:
                self._delivering = False

    def _cancel(self, w: _MemoryWatch) -> None:
        with self._lock:
            w.cancelled = True
            if w in self._watches:
                self._watches.remove(w)
        with self._deliver:  # waits for a callback running on another thread
            pass
