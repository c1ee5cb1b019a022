"""One simulated world: a clock, an event queue and a seeded random source.

Every actor of the simulation (a node, a decider, a rebuilder, a client) is ordinary production
code; the world replaces only what it waits on. `ectable.clock` reads the world's time, so a
`clock.sleep(s)` or a channel's wait *runs the world* (`run_until`) until the awaited thing
happened or the simulated deadline passed.

Processes whose code blocks (a client, a decider, a rebuilder) are *fibers*: each has a thread,
but exactly one thread runs at any moment and control passes only where the code waits, so a run
is a pure function of its seed. Nodes never block: their events run inline, in whichever fiber
is running the world. Killing an actor drops its queued events and unwinds whatever of its code
is running with `Killed`. Everything random (delays, faults, names) comes from `rng`.
"""
from __future__ import annotations

import contextlib
import hashlib
import heapq
import itertools
import math
import random
import threading

from ...clock import Clock, use


CLOSE_TIMEOUT = 60.0  # real seconds a fiber may take to unwind once its world closed


class Killed(BaseException):
    """Raised through the code of an actor that was killed (a SIGKILL in the real world)."""


class Stuck(Exception):
    """The world used up its budget, or had nothing left to run, before the awaited thing happened."""


class _Fiber:
    def __init__(self, world: "World", name: str, order: int):
        self.world, self.name, self.order = world, name, order
        self.baton = threading.Event()
        self.task = None  # what to run when handed the baton idle
        self.waiting = None  # (done, deadline) while in run_until
        self.thread: threading.Thread | None = None
        self.stack: list[str] = []  # the actors whose code runs in this fiber, innermost last

    def ready(self) -> bool:
        done, deadline = self.waiting
        return self.name in self.world.killed or self.world.now >= deadline or (done is not None and done())

    def main(self) -> None:
        """The fiber's thread: run each task it is handed, and the world in between, on the world's clock."""
        with use(self.world):
            self._main()

    def _main(self) -> None:
        world = self.world
        self.baton.wait()
        self.baton.clear()
        while not world.closed:
            task, self.task = self.task, None
            try:
                with world.acting(self.name):
                    task()
            except Killed:
                pass
            except Exception as exc:  # a crash of a process: never expected
                world.problems.append(f"{self.name} crashed: {exc!r}")
                world.killed.add(self.name)
            try:
                world._run(self)  # returns when handed a new task (or the world closed)
            except BaseException as exc:  # Stuck, or a bug met while running others' events: the main fiber raises it
                world.failure, world.closed = exc, True
                world.main.baton.set()
                return


class World(Clock):
    """Simulated time and events for one seed. `at(delay, fn, actor)` runs `fn()` as `actor` later."""

    def __init__(self, seed: int, max_events: int = 1_000_000):
        self.seed, self.rng = seed, random.Random(seed)
        self.now = 0.0
        self.max_events, self.events = max_events, 0
        self._queue: list = []
        self._order = itertools.count()
        self.killed: set[str] = set()
        self.digest = hashlib.sha256()  # of every event run: two runs of one seed must agree
        self.problems: list[str] = []  # what actors met that must never happen (a node's internal error)
        self.closed = False
        self._inline = 0  # inline events running (nodes' code, which never waits)
        self._fibers: dict[str, _Fiber] = {}
        self.failure: BaseException | None = None  # what ended the world inside another fiber
        self.main = self.current = self._fiber("main")  # the thread that made the world
        self.main.thread = threading.current_thread()

    tracing = False

    @property
    def stack(self) -> list[str]:
        """The actors whose code is running in the current fiber, innermost last."""
        return self.current.stack

    # -- the clock ectable reads -----------------------------------------
    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.run_until(None, self.now + max(seconds, 0.0))

    def token_hex(self, nbytes: int) -> str:
        return self.rng.getrandbits(8 * nbytes).to_bytes(nbytes, "big").hex()

    # -- events ----------------------------------------------------------
    def at(self, delay: float, fn, actor: str, fiber: bool = False) -> None:
        """Run `fn()` as `actor` after `delay` simulated seconds; `fiber`: as a task of the fiber of
        that name (it may wait), put off while that fiber is still busy with an earlier one."""
        heapq.heappush(self._queue, (self.now + max(delay, 0.0), next(self._order), fn, actor, fiber))

    def kill(self, actor: str) -> None:
        self.killed.add(actor)

    def run_until(self, done, deadline: float) -> bool:
        """Run the world until `done()` is true (True) or `deadline` passed (False)."""
        me = self.current
        if me.name in self.killed or (self.stack and self.stack[-1] in self.killed):
            raise Killed(me.name)
        if done is not None and done():
            return True
        if self._inline:
            self.problems.append(f"{self.stack[-1]} waited inside an event of its own (node code must never block)")
        outer, me.waiting = me.waiting, (done, deadline)
        try:
            self._run(me)
        finally:
            me.waiting = outer
        if self.failure is not None and me is self.main:
            failure, self.failure = self.failure, None
            raise failure
        if self.closed or me.name in self.killed or (self.stack and self.stack[-1] in self.killed):
            raise Killed(me.name)
        return done is not None and done()

    def _run(self, me: _Fiber) -> None:
        """Run events in time order until fiber `me` (waiting) is ready, or (idle) is handed a task."""
        while not self.closed:
            for fiber in sorted(self._fibers.values(), key=lambda f: f.order):
                if fiber.waiting is not None and fiber.ready():
                    if fiber is me:
                        return
                    self._switch(me, fiber)
                    break
            else:
                if self._step(me):
                    continue
            if me.waiting is None:  # idle, woken with a task
                return

    def _step(self, me: _Fiber) -> bool:
        """Run the next event (time moves on to it, or to the first waiting fiber's deadline). False when
        control went to another fiber."""
        horizon = min((f.waiting[1] for f in self._fibers.values() if f.waiting is not None), default=math.inf)
        if not self._queue or self._queue[0][0] > horizon:
            if horizon == math.inf:
                raise Stuck(f"nothing left to run at t={self.now:.3f}")
            self.now = max(self.now, horizon)
            return True
        when, _, fn, actor, fiber = heapq.heappop(self._queue)
        self.now = max(self.now, when)
        if actor in self.killed:
            return True
        self.events += 1
        if self.events > self.max_events:
            raise Stuck(f"more than {self.max_events} events by t={self.now:.3f}")
        self.digest.update(f"{self.now:.9f} {actor}|".encode())
        if fiber:
            target = self._fiber(actor)
            if target.waiting is not None or target.task is not None or (target is me and me.stack):
                self.at(0.01, fn, actor, fiber)  # still busy with the last one
                return True
            target.task = fn
            if target is not me:
                self._switch(me, target)
            return False
        self._inline += 1
        try:
            with self.acting(actor):
                fn()
        finally:
            self._inline -= 1
        return True

    def _fiber(self, name: str) -> _Fiber:
        fiber = self._fibers.get(name)
        if fiber is None:
            fiber = self._fibers[name] = _Fiber(self, name, len(self._fibers))
        return fiber

    def _switch(self, me: _Fiber, to: _Fiber) -> None:
        """Hand control to fiber `to`; return when some fiber hands it back to `me`."""
        if to.thread is None:
            to.thread = threading.Thread(target=to.main, name=f"sim {to.name}", daemon=True)
            self.current = to
            to.thread.start()
        self.current = to
        to.baton.set()
        me.baton.wait()
        me.baton.clear()
        self.current = me

    def close(self) -> None:
        """End every fiber's thread (the world is done), one after another: each unwinds its code alone,
        and none is still running when this returns."""
        self.closed = True
        stuck = []
        for fiber in self._fibers.values():
            if fiber.thread is not None and fiber.thread is not threading.current_thread():
                fiber.baton.set()
                fiber.thread.join(CLOSE_TIMEOUT)
                if fiber.thread.is_alive():
                    stuck.append(fiber.name)
        if stuck:
            raise Stuck(f"fibers {stuck} still ran {CLOSE_TIMEOUT} s after the world closed")

    @contextlib.contextmanager
    def acting(self, actor: str):
        """Run the block as `actor`."""
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
