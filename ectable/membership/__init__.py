"""Membership: the etcd-shaped store behind the cluster map, liveness and elections.

`MemoryMembership` (in process), `EtcdMembership` (on etcd, needs `etcd3gw`) and `EtcdServer` (a
one-member etcd) are imported on first use, so the memory backend needs neither etcd3gw nor etcd.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import (Compacted, Compare, Delete, Event, KeyValue, LeaseNotFound, Membership, MembershipUnavailable,
                   Put, Watch)

if TYPE_CHECKING:
    from .etcd import EtcdMembership
    from .memory import MemoryMembership
    from .server import EtcdServer

_LAZY = {"MemoryMembership": ".memory", "EtcdMembership": ".etcd", "EtcdServer": ".server"}

__all__ = ["Membership", "MembershipUnavailable", "Compacted", "LeaseNotFound", "KeyValue", "Compare", "Put",
           "Delete", "Event", "Watch", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
