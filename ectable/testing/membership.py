"""Test helpers for membership backends: a fake clock, a watch event collector, and a Hypothesis
state machine that runs random puts, deletes, transactions and leases against a dict model.

`Harness` bundles a store under test with its key prefix and its way of letting time pass.
Subclass `MembershipMachine` with `make_store()` returning (store, key prefix, clock or None); with
a `FakeClock` the machine also moves time on and checks lease expiry. Invariant: the keys under the
prefix and the store's revision equal the model's after every step.
"""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ..errors import InvalidRequest
from ..membership.base import Compare, Delete, Event, KeyValue, LeaseNotFound, Membership, Op, Put

if TYPE_CHECKING:
    from ..membership.server import EtcdServer

NAMES = ["a", "ab", "b", "c/x", "c/y"]  # "a" is a prefix of "ab", "c/" of two keys
VALUES = [b"", b"x", b"y", b"\x00\xff"]
UNKNOWN = 7_777_777  # a lease id no backend hands out first


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Collector:
    """A watch callback that keeps every event; `wait(n)` blocks (bounded) until it has n."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.batches = 0
        self._cond = threading.Condition()

    def __call__(self, events: list[Event]) -> None:
        with self._cond:
            self.events.extend(events)
            self.batches += 1
            self._cond.notify_all()

    def wait(self, count: int, timeout: float = 10.0) -> list[Event]:
        with self._cond:
            self._cond.wait_for(lambda: len(self.events) >= count, timeout)
            return list(self.events)


class Harness:
    """A store under test, its key prefix, and how time passes for it."""

    def __init__(self, kind: str, store: Membership, clock: FakeClock | None, server: EtcdServer | None = None):
        self.kind, self.m, self.clock, self.server = kind, store, clock, server
        self.p = f"t/{uuid.uuid4().hex[:8]}/"
        self.ttl = max(1.0, store.min_ttl)

    def elapse(self, seconds: float) -> None:
        """Let `seconds` pass on the store's clock."""
        if self.clock is not None:
            self.clock.advance(seconds)
        else:
            time.sleep(seconds)

    def eventually(self, check: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Whether `check()` holds now (fake clock) or within `timeout` seconds (etcd)."""
        deadline = time.monotonic() + (0 if self.clock is not None else timeout)
        while not check():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def settle(self, watch_prefix: str, collector: Collector, count: int) -> list[Event]:
        """Put a sentinel under `watch_prefix` and wait for it: every earlier event has arrived too."""
        self.m.put(watch_prefix + "~sentinel", b"")
        events = collector.wait(count + 1)
        assert events[-1].key == watch_prefix + "~sentinel", events
        return events[:-1]


@dataclass
class _ModelLease:
    ttl: float
    deadline: float
    keys: set[str] = field(default_factory=set)


class MembershipMachine(RuleBasedStateMachine):
    """Random operations against a store and a dict model, revision bookkeeping included."""

    lease_ttls = (60.0,)  # long enough never to expire without a clock
    steps = (0.5, 1.0, 1.5)  # how far a FakeClock moves

    def make_store(self) -> tuple[Membership, str, FakeClock | None]:
        raise NotImplementedError

    def __init__(self) -> None:
        super().__init__()
        self.store, self.prefix, self.clock = self.make_store()
        self.model: dict[str, KeyValue] = {}
        self.revision = self.store.range(self.prefix)[1]
        self.leases: dict[int, _ModelLease] = {}
        self.gone: list[int] = []  # leases revoked or expired

    def teardown(self) -> None:
        for lease in self.leases:
            self.store.revoke(lease)
        self.store.delete(self.prefix, prefix=True)
        self.store.close()

    # --- the model ---
    def _now(self) -> float:
        return self.clock() if self.clock else 0.0

    def _apply(self, ops: list[Op]) -> None:
        rev, changed = self.revision + 1, False
        for op in ops:
            if isinstance(op, Put):
                old = self.model.get(op.key)
                self._detach(old)
                self.model[op.key] = KeyValue(op.key, op.value, rev, old.create_revision if old else rev,
                                              old.version + 1 if old else 1, op.lease)
                if op.lease:
                    self.leases[op.lease].keys.add(op.key)
                changed = True
            else:
                for key in [k for k in self.model if (k.startswith(op.key) if op.prefix else k == op.key)]:
                    self._detach(self.model.pop(key))
                    changed = True
        self.revision += changed

    def _detach(self, kv: KeyValue | None) -> None:
        if kv is not None and kv.lease in self.leases:
            self.leases[kv.lease].keys.discard(kv.key)

    def _holds(self, c: Compare) -> bool:
        kv = self.model.get(c.key)
        if c.target == "value":
            return kv is not None and kv.value == c.value
        actual = {"mod": kv.mod_revision, "create": kv.create_revision, "version": kv.version}[c.target] if kv else 0
        return actual == c.value

    @staticmethod
    def _valid(ops: list[Op]) -> bool:
        puts = [op.key for op in ops if isinstance(op, Put)]
        deletes = [op for op in ops if isinstance(op, Delete)]
        return len(set(puts)) == len(puts) and not any(
            k.startswith(d.key) if d.prefix else k == d.key for d in deletes for k in puts)

    def _end_lease(self, lease: int) -> None:
        entry = self.leases.pop(lease)
        self.gone.append(lease)
        self._apply([Delete(k) for k in sorted(entry.keys)])

    # --- drawing operations ---
    def _lease(self, data: st.DataObject, none: int = 0) -> int:
        """A live lease, one that is gone, or `none` (0: no lease; else an id never granted)."""
        return data.draw(st.sampled_from([none, none, *self.leases, *self.gone[-2:]]), label="lease")

    def _op(self, data: st.DataObject) -> Op:
        name = data.draw(st.sampled_from(NAMES), label="key")
        if data.draw(st.booleans(), label="put"):
            return Put(self.prefix + name, data.draw(st.sampled_from(VALUES), label="value"), self._lease(data))
        prefix = data.draw(st.booleans(), label="prefix delete")
        return Delete(self.prefix + (name[:1] if prefix else name), prefix)

    def _compare(self, data: st.DataObject) -> Compare:
        key = self.prefix + data.draw(st.sampled_from(NAMES), label="compare key")
        target = data.draw(st.sampled_from(["mod", "create", "version", "value"]), label="target")
        kv = self.model.get(key)
        if target == "value":
            return Compare(key, target, data.draw(st.sampled_from([kv.value if kv else b"", b"x"]), label="value"))
        actual = {"mod": kv.mod_revision, "create": kv.create_revision, "version": kv.version}[target] if kv else 0
        return Compare(key, target, data.draw(st.sampled_from([actual, 0, actual + 1]), label="expected"))

    # --- rules ---
    @rule(data=st.data())
    def txn(self, data: st.DataObject) -> None:
        compare = [self._compare(data) for _ in range(data.draw(st.integers(0, 2), label="compares"))]
        success = [self._op(data) for _ in range(data.draw(st.integers(0, 3), label="success ops"))]
        failure = [self._op(data) for _ in range(data.draw(st.integers(0, 2), label="failure ops"))]
        self._run(compare, success, failure)

    @rule(data=st.data())
    def put(self, data: st.DataObject) -> None:
        op = self._op(data)
        self._run([], [op], [])

    def _run(self, compare: list[Compare], success: list[Op], failure: list[Op]) -> None:
        if not (self._valid(success) and self._valid(failure)):
            try:
                self.store.txn(compare, success, failure)
            except InvalidRequest:
                return
            raise AssertionError("an invalid transaction was accepted")
        held = all(self._holds(c) for c in compare)
        ops = success if held else failure
        if any(isinstance(op, Put) and op.lease and op.lease not in self.leases for op in ops):
            try:
                self.store.txn(compare, success, failure)
            except LeaseNotFound:
                return
            raise AssertionError("a put with a lease that is gone was accepted")
        self._apply(ops)
        assert self.store.txn(compare, success, failure) == (held, self.revision)

    @rule(ttl=st.sampled_from([1.0, 2.0, 3.0]))
    def grant(self, ttl: float) -> None:
        ttl = ttl if self.clock else self.lease_ttls[0]
        lease = self.store.grant(ttl)
        assert lease != 0 and lease not in self.leases
        self.leases[lease] = _ModelLease(ttl, self._now() + ttl)

    @rule(data=st.data())
    def keepalive(self, data: st.DataObject) -> None:
        lease = self._lease(data, UNKNOWN)
        assert self.store.keepalive(lease) == (lease in self.leases)
        if lease in self.leases:
            self.leases[lease].deadline = self._now() + self.leases[lease].ttl

    @rule(data=st.data())
    def revoke(self, data: st.DataObject) -> None:
        lease = self._lease(data, UNKNOWN)
        self.store.revoke(lease)
        if lease in self.leases:
            self._end_lease(lease)

    @precondition(lambda self: self.clock is not None)
    @rule(data=st.data())
    def advance(self, data: st.DataObject) -> None:
        assert self.clock is not None
        self.clock.advance(data.draw(st.sampled_from(self.steps), label="seconds"))
        for lease in sorted(self.leases, key=lambda x: (self.leases[x].deadline, x)):
            if self.leases[lease].deadline <= self._now():
                self._end_lease(lease)

    @invariant()
    def same_as_model(self) -> None:
        kvs, revision = self.store.range(self.prefix)
        assert revision == self.revision
        assert kvs == sorted(self.model.values(), key=lambda kv: kv.key)
