"""One simulated world: a clock, an event queue and a seeded random source, in one thread.

Every actor of the simulation (a node, a decider, a rebuilder, a client) is ordinary production
code; the world replaces only what it waits on. `ectable.clock` reads the world's time, so a
`clock.sleep(s)` or a channel's wait *runs the world* (`run_until`) until the awaited thing
happened or the simulated deadline passed. Waits nest: an actor whose event runs inside another
actor's wait may wait itself. Killing an actor drops its queued events and unwinds, with
`Killed`, whatever of its code is on the stack, the next time the world gets control.
Everything random (delays, faults, names) comes from `rng`, so a seed decides the whole run.
"""
from __future__ import annotations

import contextlib
import hashlib
import heapq
import itertools
import random

from ...clock import Clock


class Killed(BaseException):
    """Raised through the code of an actor that was killed (a SIGKILL in the real world)."""


class Stuck(Exception):
    """The world used up its budget of events before the awaited thing happened."""


class World(Clock):
    """Simulated time and events for one seed. `at(delay, fn, actor)` runs `fn()` as `actor` later."""

    def __init__(self, seed: int, max_events: int = 2_000_000):
        self.seed, self.rng = seed, random.Random(seed)
        self.now = 0.0
        self.max_events, self.events = max_events, 0
        self._queue: list = []
        self._order = itertools.count()
        self.killed: set[str] = set()
        self.stack: list[str] = []  # the actors whose code is running, innermost last
        self._exclusive = 0  # exclusive events running
        self.digest = hashlib.sha256()  # of every event run: two runs of one seed must agree
        self.problems: list[str] = []  # what actors met that must never happen (a node's internal error)

    # -- the clock ectable reads -----------------------------------------
    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.run_until(None, self.now + max(seconds, 0.0))

    def token_hex(self, nbytes: int) -> str:
        return self.rng.getrandbits(8 * nbytes).to_bytes(nbytes, "big").hex()

    # -- events ----------------------------------------------------------
    def at(self, delay: float, fn, actor: str, exclusive: bool = False) -> None:
        """Run `fn()` as `actor` after `delay` simulated seconds. `exclusive` (a process's own work that
        waits: a decider's step, a rebuilder's round): not inside another exclusive event's wait (it is
        put off a little instead), so waits nest at most client -> process -> node."""
        heapq.heappush(self._queue, (self.now + max(delay, 0.0), next(self._order), fn, actor, exclusive))

    def kill(self, actor: str) -> None:
        self.killed.add(actor)

    def run_until(self, done, deadline: float) -> bool:
        """Run events in time order until `done()` is true (True) or `deadline` passed (False)."""
        while True:
            self._unwind_if_killed()
            if done is not None and done():
                return True
            if not self._queue or self._queue[0][0] > deadline:
                self.now = max(self.now, deadline)
                return done is not None and done()
            when, _, fn, actor, exclusive = heapq.heappop(self._queue)
            self.now = max(self.now, when)
            if actor in self.killed:
                continue
            if exclusive and self._exclusive:
                self.at(0.01, fn, actor, exclusive)
                continue
            self.events += 1
            if self.events > self.max_events:
                raise Stuck(f"more than {self.max_events} events by t={self.now:.3f}")
            self.digest.update(f"{self.now:.9f} {actor}|".encode())
            self.stack.append(actor)
            self._exclusive += exclusive
            try:
                fn()
            except Killed:
                if actor not in self.killed:  # an actor further out was killed: unwind to it
                    raise
            finally:
                self.stack.pop()
                self._exclusive -= exclusive

    def _unwind_if_killed(self) -> None:
        if self.stack and self.stack[-1] in self.killed:  # the waiting code is the innermost actor's
            raise Killed(self.stack[-1])

    @contextlib.contextmanager
    def acting(self, actor: str):
        """Run the block as `actor` (the driver of a scenario runs its own code so)."""
        self.stack.append(actor)
        try:
            yield
        finally:
            self.stack.pop()

    def note(self, text: str) -> None:
        """Add something that happened to the run's digest (and print it, when tracing)."""
        self.digest.update(text.encode() + b"|")
        if self.tracing:
            print(f"{self.now:10.4f} {'/'.join(self.stack) or '-'}: {text}")

    tracing = False
