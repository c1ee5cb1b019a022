"""The in-process transport: calls a node's logic directly, in the caller's thread."""
from __future__ import annotations

import contextlib
from typing import Callable

from ..errors import NodeDown
from .base import Channel, Done


class InProcessChannel(Channel):
    """A channel to the node that `resolve()` returns (None: the node is down); `after(node)` runs after
    each request, both under `lock` (if given: the nodes' other thread, a timer, takes it too)."""

    def __init__(self, resolve: Callable, after: Callable | None = None, lock=None):
        self._resolve, self._after = resolve, after
        self._lock = lock if lock is not None else contextlib.nullcontext()

    def start(self, header, arrays, again=True):
        with self._lock:
            node = self._resolve()
            if node is None:
                raise NodeDown(f"node for {header.get('op')!r} is down")
            reply = node.handle(header, arrays)
            if self._after is not None:
                self._after(node)
        return Done(reply)
