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
- Every call that talks to a server raises `MembershipUnavailable` once its `timeout`
  (seconds) passes with no answer; no call waits forever.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence, Union

from ..errors import Error


class MembershipUnavailable(Error):
    """The membership store did not answer in time (no etcd majority, or it is unreachable)."""


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
