"""The channel interface every transport implements."""
from __future__ import annotations

from abc import ABC, abstractmethod


class Channel(ABC):
    """A request/reply path to one node.

    `call` sends a header (a small dict of plain values) and a list of numpy
    arrays and returns the node's reply in the same form. It raises
    `ectable.NodeDown` when the node cannot be reached within `timeout`
    seconds. Error replies come back as headers with an "error" key; turning
    them into exceptions is the caller's business.
    """

    @abstractmethod
    def call(self, header: dict, arrays: list, timeout: float) -> tuple[dict, list]:
        """Send one request and wait for its reply."""

    def close(self) -> None:
        """Release the channel's resources."""
