"""The simulated network: messages cross it encoded as on the wire (`transport.codec`), each after a
seeded delay, or lost, duplicated, overtaken by a later one, or cut off by a partition.

`SimChannel` is the `Channel` clients and deciders use in a simulation; its `wait` runs the world
until the reply is in or the (simulated) timeout passed. `SimControl` is the deciders' control calls.
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

from ...errors import NodeDown
from ...process.control import Control
from ...transport import Channel, Pending, Resends, codec
from .world import World

STORM = 200_000  # messages in one run beyond which a run is failed as a livelock (runs send a few thousand)


@dataclass
class Faults:
    """What the network does to messages (chances per message) and how often nodes die at one."""

    drop: float = 0.0  # lost
    duplicate: float = 0.0  # arrives twice
    delay: tuple = (0.0001, 0.002)  # seconds, uniform
    spike: float = 0.0  # held up to `spike_delay` seconds instead (so later messages overtake it)
    spike_delay: float = 0.5
    kill_at_message: float = 0.0  # the node a message reaches dies just before or just after handling it


class Network:
    """Carries frames between endpoints. A host (see `hosts.py`) registers under its endpoint and
    answers `receive(frames) -> reply frames or None`."""

    def __init__(self, world: World, faults: Faults):
        self.world, self.faults = world, faults
        self.hosts: dict = {}
        self.cut: dict[str, float] = {}  # endpoint -> until when it is partitioned from everyone
        self.arrival = None  # chaos hook: called with a host's endpoint before and after it handles a message
        self.counts: Counter = Counter()

    def reachable(self, a: str, b: str) -> bool:
        now = self.world.now
        return self.cut.get(a, 0.0) <= now and self.cut.get(b, 0.0) <= now

    def send(self, src: str, dst: str, frames: list, handle, actor: str) -> None:
        """Carry `frames` from `src` to `dst`, where `handle(frames)` runs as `actor` on arrival."""
        rng, faults = self.world.rng, self.faults
        if self.counts["sent"] >= STORM:  # a sender that never waits: a livelock, not a run
            raise AssertionError(f"{STORM} messages sent: {actor} sends {src} -> {dst} in a loop that never waits")
        frames = [bytes(f) for f in frames]  # what was sent is fixed now, whatever the sender does next
        if not self.reachable(src, dst) or rng.random() < faults.drop:
            self.counts["dropped"] += 1
            return
        copies = 2 if rng.random() < faults.duplicate else 1
        self.counts["duplicated"] += copies - 1
        for _ in range(copies):
            delay = rng.uniform(*faults.delay)
            if rng.random() < faults.spike:
                delay = rng.uniform(0.0, faults.spike_delay)
                self.counts["delayed"] += 1

            def arrive(frames=frames):
                if self.reachable(src, dst):
                    handle(frames)
                else:
                    self.counts["dropped"] += 1
            self.world.at(delay, arrive, actor)
        self.counts["sent"] += 1

    def request(self, src: str, dst: str, frames: list, on_reply) -> None:
        """A request to the host at `dst`; its reply comes back to `on_reply(frames)`, run as `src`."""
        def at_host(frames):
            host = self.hosts.get(dst)
            if host is None or not host.alive:
                return
            if self.arrival is not None:
                self.arrival(dst)
            if not host.alive:
                return
            reply = host.receive(frames)
            if self.arrival is not None:
                self.arrival(dst)
            if reply is not None and host.alive:
                self.send(dst, src, reply, on_reply, src)
        self.send(src, dst, frames, at_host, dst)


class SimChannel(Channel):
    """Requests from actor `owner` to the host at `endpoint`; `alive()` lets a wait end early when the
    node is no longer a live member (as `ZmqChannel` does)."""

    def __init__(self, network: Network, owner: str, endpoint: str, alive=None):
        self.network, self.owner, self.endpoint, self._alive = network, owner, endpoint, alive
        self._ids = itertools.count(1)
        self._replies: dict[int, tuple] = {}
        self._waiting: set[int] = set()

    def start(self, header, arrays, again=True):
        rid = next(self._ids)
        self._waiting.add(rid)
        frames = codec.encode({**header, "id": rid}, arrays)
        self.network.request(self.owner, self.endpoint, frames, self._reply)
        return _SimPending(self, rid, frames, again)

    def _reply(self, frames) -> None:
        try:
            header, arrays = codec.decode(frames)
        except codec.Malformed:
            return
        rid = header.get("id")
        if rid in self._waiting:  # a late copy of one already taken is dropped, as a closed socket would
            self._waiting.discard(rid)
            self._replies[rid] = (header, arrays)

    def _wait(self, rid, frames, timeout, again=True):
        world = self.network.world
        deadline, resends = world.now + timeout, Resends(world.now, frames, again)
        alive = self._alive
        while rid not in self._replies:
            if alive is not None and not alive():
                self._waiting.discard(rid)
                raise NodeDown(f"{self.endpoint} died (it is no longer a live member) before it answered")
            if world.now >= deadline:
                self._waiting.discard(rid)
                raise NodeDown(f"{self.endpoint} did not answer within {timeout} s")
            if resends.due(world.now):  # as `ZmqChannel` does
                world.note(f"resend {codec.decode(frames)[0].get('op')} request {rid} to {self.endpoint}")
                self.network.request(self.owner, self.endpoint, frames, self._reply)
            world.run_until(lambda: rid in self._replies, min(deadline, world.now + 0.2, resends.at))
        return self._replies.pop(rid)


class _SimPending(Pending):
    def __init__(self, channel: SimChannel, rid: int, frames: list, again: bool):
        self.channel, self.rid, self.frames, self.again = channel, rid, frames, again

    def wait(self, timeout):
        return self.channel._wait(self.rid, self.frames, timeout, self.again)


class SimControl(Control):
    """A decider's control calls to nodes, over the simulated network."""

    def __init__(self, network: Network, owner: str):
        super().__init__()
        self.network, self.owner = network, owner

    def open(self, endpoint: str, timeout: float) -> SimChannel:
        return SimChannel(self.network, self.owner, endpoint)
