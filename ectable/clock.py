"""The clock and the source of fresh names that ectable's nodes, clients and deciders read.

Production code calls `clock.monotonic()`, `clock.sleep(seconds)` and `clock.token_hex(n)`
instead of `time` and `secrets` directly, so that the deterministic simulation
(`ectable.testing.sim`) can run the same code on simulated time with seeded names:
`with clock.use(world): ...` swaps all three for the calling program until the block ends.
"""
from __future__ import annotations

import contextlib
import secrets
import time


class Clock:
    """Real time and real randomness (the default)."""

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def token_hex(self, nbytes: int) -> str:
        return secrets.token_hex(nbytes)


_clock: Clock = Clock()


def monotonic() -> float:
    """Seconds on a clock that never goes back."""
    return _clock.monotonic()


def sleep(seconds: float) -> None:
    """Let `seconds` pass (in a simulation: let the simulated world run that long)."""
    _clock.sleep(seconds)


def token_hex(nbytes: int) -> str:
    """A fresh random name of `2 * nbytes` hex digits."""
    return _clock.token_hex(nbytes)


@contextlib.contextmanager
def use(replacement: Clock):
    """Read time and names from `replacement` until the block ends."""
    global _clock
    previous, _clock = _clock, replacement
    try:
        yield replacement
    finally:
        _clock = previous
