"""The clock and the source of fresh names that ectable's nodes, clients and deciders read.

Production code calls `clock.monotonic()`, `clock.sleep(seconds)` and `clock.token_hex(n)`
instead of `time` and `secrets` directly, so that the deterministic simulation
(`ectable.testing.sim`) can run the same code on simulated time with seeded names:
`with clock.use(world): ...` swaps all three for the calling thread until the block ends. Other
threads keep theirs: a thread left running by other code never reads a simulated world's time
nor draws from its seeded names (which would make the world's run depend on that thread).
"""
from __future__ import annotations

import contextlib
import secrets
import threading
import time


class Clock:
    """Real time and real randomness (the default)."""

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def token_hex(self, nbytes: int) -> str:
        return secrets.token_hex(nbytes)


class _ThreadClock(threading.local):
    clock: Clock = Clock()  # each thread's, until it calls `use`


_current = _ThreadClock()


def monotonic() -> float:
    """Seconds on a clock that never goes back."""
    return _current.clock.monotonic()


def sleep(seconds: float) -> None:
    """Let `seconds` pass (in a simulation: let the simulated world run that long)."""
    _current.clock.sleep(seconds)


def token_hex(nbytes: int) -> str:
    """A fresh random name of `2 * nbytes` hex digits."""
    return _current.clock.token_hex(nbytes)


@contextlib.contextmanager
def use(replacement: Clock):
    """Read time and names from `replacement` in the calling thread until the block ends."""
    previous, _current.clock = _current.clock, replacement
    try:
        yield replacement
    finally:
        _current.clock = previous
