"""The membership interface: the small, etcd-shaped key-value store the cluster map, node
liveness and the failover decider's election are built on.

This docstring is the contract every backend meets (`tests/test_membership.py` is its
conformance suite, run against each backend):

- Keys are `str`, values `bytes`. The store has one **revision**, an int that every
  successful change (a put, a delete that removed something, or a transaction with at
  least one such operation) raises by exactly one; all operations of a transaction share
  that one new revision. A fresh store is at revision 1 or more.
- A key's `mod_revision` is the revision of its last change; `create_revision` the revision
  at which it was created (again after a delete). An absent key compares as
  `create_revision == 0`, `mod_revision == 0`, `version == 0`.
- `txn(compare, success, failure)` is atomic: if every `Compare` holds, the `success`
  operations are applied, else the `failure` ones; it returns (whether the comparisons
  held, the store's revision after the transaction). Compare-and-swap on a key's
  `mod_revision` is how every writer of the cluster map avoids lost updates.
- **Leases** (`grant(ttl)`) expire `ttl` seconds after their grant or last `keepalive`,
  measured on the backend's clock; keys put with a lease are deleted when it expires or is
  revoked (one revision for them all). `keepalive` of an expired or unknown lease returns
  False and never revives it. A backend may round `ttl` up to what it supports
  (`min_ttl`).
- **Watches** (`watch(prefix, callback, start_revision)`) call `callback(events)` with
  every change to keys under `prefix`, in revision order, each event exactly once, from
  `start_revision` on (None: changes after the call). Callbacks run on a thread of the
  backend's (etcd) or synchronously after the change (in memory): they must be short and
  must not call the store; they hand the events to their owner. `Watch.cancel()` stops it.
  A `start_revision` older than the history the backend keeps raises `Compacted`; a watch
  the backend has to end itself (its history was compacted while it reconnected) sets
  `Watch.error` and calls back no more.
- Every call that talks to a server raises `MembershipUnavailable` once its `timeout`
  (seconds) passes with no answer; no call waits forever. A `txn` that raised it may or
  may not have been applied (read, or compare, before retrying).
- A `Compare` on "value" never holds for an absent key. Within one branch of a `txn` a
  key may be put at most once and not also be deleted (`InvalidRequest`, nothing applied);
  keys may not be empty (a prefix may: it means every key). A `Put` naming a lease that is
  gone raises `LeaseNotFound` when its branch is chosen (nothing applied). A put without a
  lease takes the key off the lease it had.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence, Union

from ..errors import Error, InvalidRequest


class MembershipUnavailable(Error):
    """The membership store did not answer in time (no etcd majority, or it is unreachable)."""


class Compacted(MembershipUnavailable):
    """A watch asked for revisions the store no longer keeps; `revision`: the oldest it can replay."""

    def __init__(self, message: str, revision: int = 0):
        super().__init__(message)
        self.revision = revision


class LeaseNotFound(Error):
    """A put named a lease that expired, was revoked or was never granted; nothing was applied."""


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    version: int  # changes since creation, 1 for a new key
    lease: int = 0  # 0: no lease


@dataclass(frozen=True)
class Compare:
    """One condition of a transaction: `target` of `key` equals `value`.
    `target` is "mod" (mod_revision), "create" (create_revision), "version" or "value" (bytes)."""

    key: str
    target: str
    value: Union[int, bytes]

    @classmethod
    def absent(cls, key: str) -> "Compare":
        return cls(key, "create", 0)

    @classmethod
    def unchanged(cls, key: str, mod_revision: int) -> "Compare":
        """The key was last changed at `mod_revision` (0: it is absent)."""
        return cls(key, "mod", mod_revision)


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True)
class Delete:
    key: str
    prefix: bool = False  # delete every key under `key`


Op = Union[Put, Delete]


@dataclass(frozen=True)
class Event:
    kind: str  # "put" or "delete"
    key: str
    value: bytes  # b"" for deletes
    mod_revision: int  # the revision of the change


class Watch(ABC):
    error: Exception | None = None  # why the backend ended the watch itself (None: it runs, or was cancelled)

    @abstractmethod
    def cancel(self) -> None:
        """Stop calling back; returns once no callback of this watch is running or will run."""


class Membership(ABC):
    """One backend of the membership store (see the module docstring for the contract)."""

    min_ttl: float = 0.0

    @abstractmethod
    def get(self, key: str) -> KeyValue | None:
        """The key's current value, or None."""

    @abstractmethod
    def range(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under `prefix`, sorted by key, and the store's revision they were read at."""

    @abstractmethod
    def txn(self, compare: Sequence[Compare], success: Iterable[Op], failure: Iterable[Op] = ()) -> tuple[bool, int]:
        """Atomically: if every comparison holds apply `success`, else `failure`; (held, revision after)."""

    def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Set a key (with a lease: deleted when it expires); the new revision."""
        return self.txn([], [Put(key, value, lease)])[1]

    def delete(self, key: str, prefix: bool = False) -> int:
        """Remove a key (or every key under it); the store's revision after."""
        return self.txn([], [Delete(key, prefix)])[1]

    @abstractmethod
    def grant(self, ttl: float) -> int:
        """A new lease of `ttl` seconds (rounded up to `min_ttl`); its id, never 0."""

    @abstractmethod
    def keepalive(self, lease: int) -> bool:
        """Restart the lease's ttl; False if it expired or is unknown (it stays expired)."""

    @abstractmethod
    def revoke(self, lease: int) -> None:
        """End the lease now, deleting its keys (no error if it is already gone)."""

    @abstractmethod
    def watch(self, prefix: str, callback: Callable[[list[Event]], None], start_revision: int | None = None) -> Watch:
        """Call `callback(events)` for every change under `prefix` from `start_revision` on."""

    def close(self) -> None:
        """Release connections and threads (the store itself lives on)."""


TARGETS = {"mod": int, "create": int, "version": int, "value": bytes}


def check_txn(compare: Sequence[Compare], *branches: Sequence[Op]) -> None:
    """Raise `InvalidRequest` unless every comparison and branch is well formed (see the contract)."""
    for c in compare:
        kind = TARGETS.get(c.target)
        if kind is None or not isinstance(c.value, kind) or (kind is int and isinstance(c.value, bool)) or not c.key:
            raise InvalidRequest(f"bad comparison {c!r}")
    for ops in branches:
        puts: set[str] = set()
        deletes: list[Delete] = []
        for op in ops:
            if isinstance(op, Put):
                if not op.key or not isinstance(op.value, bytes) or op.key in puts:
                    raise InvalidRequest(f"bad or repeated put of {op.key!r}")
                puts.add(op.key)
            elif isinstance(op, Delete):
                if not op.key and not op.prefix:
                    raise InvalidRequest("empty key")
                deletes.append(op)
            else:
                raise InvalidRequest(f"not an operation: {op!r}")
        for d in deletes:
            if any(k.startswith(d.key) if d.prefix else k == d.key for k in puts):
                raise InvalidRequest(f"a key is both put and deleted under {d.key!r}")
