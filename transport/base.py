"""The channel interface every transport implements."""
from __future__ import annotations

from abc import ABC, abstractmethod


RESEND_AFTER = 1.0  # seconds an unanswered request waits before it is sent again (then twice as long, ...)
RESEND_MAX = 8.0
RESEND_RATE = 100e6  # bytes per second a big request is given to cross and be answered before it goes out again
RESEND_BIG = 1 << 20  # requests from this many bytes are big


class Resends:
    """When an unanswered request (`frames`) goes out again: RESEND_AFTER seconds after it was sent, plus a
    second per RESEND_RATE bytes of it, then after twice as long each time, at most RESEND_MAX apart (or the
    first gap, if longer), for requests of RESEND_BIG bytes or more. A message lost on the way (a connection that broke) then costs a second, not the
    request's whole deadline; nodes take a request twice as they take it once (writes, deltas and replays carry
    their numbers); and a big one (a node's state, handed over) is not sent again while it is still crossing."""

    def __init__(self, now: float, frames=(), again: bool = True):
        """`again` False: never (a request whose reply is big, for which a repeat costs more than a timeout)."""
        self.at, self.gap, self.frames = now + RESEND_AFTER if again else float("inf"), RESEND_AFTER, frames

    def due(self, now: float) -> bool:
        """Whether to send again now (and when next)."""
        if now < self.at:
            return False
        if self.frames is not None:  # sized only once it is late: most requests are answered before
            size, self.frames = sum(memoryview(f).nbytes for f in self.frames), None
            if size >= RESEND_BIG:
                self.gap, self.at = self.gap + size / RESEND_RATE, self.at + size / RESEND_RATE
                if now < self.at:
                    return False
        self.gap = max(self.gap, min(2 * self.gap, RESEND_MAX))
        self.at = now + self.gap
        return True


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
    raises `ectable.NodeDown` when the node cannot be reached in time. A transport that
    can lose messages sends an unanswered request again (`Resends`) while it waits. Starting
    requests to many nodes before waiting on any is how a client fans out in parallel.
    Error replies come back as headers with an "error" key; turning them into
    exceptions is the caller's business. A channel belongs to one thread.
    """

    @abstractmethod
    def start(self, header: dict, arrays: list, again: bool = True) -> Pending:
        """Send one request (`again`: it may be sent again while unanswered, see `Resends`)."""

    def call(self, header: dict, arrays: list, timeout: float) -> tuple[dict, list]:
        """Send one request and wait for its reply."""
        return self.start(header, arrays).wait(timeout)

    def close(self) -> None:
        """Release the channel's resources."""
