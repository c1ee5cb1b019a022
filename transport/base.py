"""The channel interface every transport implements."""
from __future__ import annotations

from abc import ABC, abstractmethod


class Pending(ABC):
    """A request on its way; `wait` returns its reply."""

    @abstractmethod
    def wait(self, timeout: float) -> tuple[dict, list]:
        """The reply (header, arrays); raises `ectable.NodeDown` past `timeout` seconds."""


class Done(Pending):
    """A reply that is already here."""

    def __init__(self, reply):
        self.reply = reply

    def wait(self, timeout):
        return self.reply


class Channel(ABC):
    """A request/reply path to one node.

    `start` sends a header (a small dict of plain values) and a list of numpy arrays
    and returns at once; `Pending.wait` returns the node's reply in the same form, or
    raises `ectable.NodeDown` when the node cannot be reached in time. Starting
    requests to many nodes before waiting on any is how a client fans out in parallel.
    Error replies come back as headers with an "error" key; turning them into
    exceptions is the caller's business. A channel belongs to one thread.
    """

    @abstractmethod
    def start(self, header: dict, arrays: list) -> Pending:
        """Send one request."""

    def call(self, header: dict, arrays: list, timeout: float) -> tuple[dict, list]:
        """Send one request and wait for its reply."""
        return self.start(header, arrays).wait(timeout)

    def close(self) -> None:
        """Release the channel's resources."""
