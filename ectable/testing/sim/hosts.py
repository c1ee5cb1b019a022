"""The processes of a simulated cluster: node hosts, their rebuilders, and failover deciders.

`SimNodeHost` is a node process as `process/node_server.py` runs it (the same `NodeHost` and
`Node`), with the simulated network instead of ZeroMQ and the world's events instead of a poll
loop: it answers requests, sends its deltas to peers and resends them until acknowledged,
closes windows when idle, keeps its presence alive under a lease, reads the map and the writers when
`_Presence` would (`reads_due`: on a change its watch reports, after a random lag of up to a beat; at every
beat while it awaits replays; every RESYNC s), follows the map and runs
`rebuild_streams` fibers of `RebuildRounds` while it rebuilds. `SimDecider` runs the production `Decider`.
"""
from __future__ import annotations

import re

from ...cluster.decider import Decider
from ...cluster.store import ClusterStore
from ...config import MAX_STREAMS
from ...errors import Error, Unavailable
from ...membership import LeaseNotFound
from ...process.host import NodeHost
from ...process.node_server import GRACE, HEARTBEAT, NODE_TTL, RESEND, TICK, reads_due
from ...process.rebuilder import RebuildRounds
from ...protocol import messages
from ...protocol.messages import ErrorCode
from ...transport import codec
from .network import Network, SimControl
from .world import World

DECIDER_IDLE = 0.25  # a decider process steps on a watch's event at once, and polls every ELECTION_TTL / 4 s


class SimNodeHost(NodeHost):
    endpoint_pattern = re.compile(r"^sim://node-\d+$")
    owns_arrays = True  # decoded from its own frames, as a node process's

    def __init__(self, world: World, network: Network, store: ClusterStore, endpoint: str, token: str, cluster_of):
        super().__init__(endpoint, token)
        self.world, self.network, self.store = world, network, store
        self.cluster_of = cluster_of  # actor -> a cluster map of its own (for the rebuilder's clients)
        self.alive, self.lazy_close = True, True
        self.links: dict[int, int] = {}  # target -> how often the link to it was dropped (late acks are moot)
        self.lease: int | None = None
        self.announced: dict | None = None
        self.last_request = 0.0
        self.ticking = False
        self.rebuilding_with = None  # the identity being rebuilt, while its streams of rounds run
        self.rebuild_streams: set[int] = set()  # the parts whose streams still run
        self.rebuild_number = 0  # which rebuild a stream's fiber belongs to (one left after `leave` ends quietly)
        self.rebuild_lost: str | None = None
        self.watch = None  # of the store, made at the first beat that reaches it
        self.changed = True  # the watch reported a change of the map or the writers not read yet
        self.read_at = float("-inf")  # when the map and the writers were last read
        self.map_read, self.live = None, None  # as last read
        network.hosts[endpoint] = self
        self.announce()
        world.at(HEARTBEAT, self.heartbeat, endpoint)

    # -- the store (unreachable while partitioned) ------------------------
    def _store_reachable(self) -> bool:
        return self.network.cut.get(self.endpoint, 0.0) <= self.world.now

    def announce(self) -> None:
        if not self._store_reachable():
            return
        info = self.beat()
        membership = self.store.membership
        if self.lease is None:
            self.lease = membership.grant(NODE_TTL)
        if info != self.announced:
            try:
                self.store.announce(self.endpoint, info, self.lease)
            except LeaseNotFound:
                self.lease = membership.grant(NODE_TTL)
                self.store.announce(self.endpoint, info, self.lease)
            self.announced = info

    def writers(self) -> set[str]:
        return self.store.writers() if self._store_reachable() else set()

    def heartbeat(self) -> None:
        """Every HEARTBEAT: keep the lease alive, announce, follow the map, start a rebuilder if needed."""
        if self._store_reachable():
            if self.lease is not None and not self.store.membership.keepalive(self.lease):
                self.lease, self.announced = None, None  # expired: this node was failed over
            self.announce()
            self.presence()
        self.rebuild()
        self.send_outbox()
        self.world.at(HEARTBEAT, self.heartbeat, self.endpoint)

    def presence(self) -> None:
        """Read the map and the writers if due (`reads_due`), follow the map; the writers last read stand as
        alive now (as `_Presence` vouches for them at a beat with no read)."""
        if not self._store_reachable():
            return  # a change reported meanwhile is read once the store is reached
        if self.watch is None:  # made before the first read (`changed` starts set), as `_Presence` does
            self.watch = self.store.membership.watch(self.store.prefix + "/", self._changes)
        now = self.world.now
        if reads_due(now, self.read_at, True, self.changed, self.node):
            self.changed = False
            self.map_read = self.store.read_map() or self.map_read
            self.live, self.read_at = self.store.writers(), now
        self.follow_map(self.map_read)
        if self.node is not None and self.live is not None:
            self.node.take_writers(self.live, now)

    def _changes(self, events) -> None:
        """The watch's callback: a change of the map or the writers reaches this node after a lag."""
        if self.store.moves_nodes(events):
            self.world.at(self.world.rng.uniform(0.0, HEARTBEAT), self._changed, self.endpoint)

    def _changed(self) -> None:
        self.changed = True
        self.presence()
        self.rebuild()
        self.send_outbox()

    # -- requests --------------------------------------------------------
    def receive(self, frames: list) -> list:
        """Answer one request's frames (as `NodeServer.answer` does)."""
        self.last_request = self.world.now
        try:
            header, arrays = codec.decode(frames)
        except codec.Malformed as exc:
            return codec.encode(messages.error(ErrorCode.MALFORMED, str(exc)), [])
        try:
            out, out_arrays = self.handle(header, arrays)
        except Exception as exc:  # a node never dies of a request; in a simulation it is a bug to report
            self.world.problems.append(f"node {self.endpoint} failed on {header.get('op')!r}: {exc!r}")
            out, out_arrays = messages.error(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"), []
        if header.get("op") == "status" and "status" in out:
            out["status"]["rebuild_lost"] = self.rebuild_lost
        self.world.note(f"{self.endpoint} {header.get('op')}{' -> ' + out['error'] if out.get('error') else ''}")
        self.send_outbox()
        if not self.running:  # told to stop (drained): the process exits once it answered
            self.world.at(0.0, self.kill, f"{self.endpoint}/exit")
        return codec.encode({**out, "id": header.get("id"), "epoch": self.epoch}, out_arrays)

    # -- deltas to peers ----------------------------------------------------
    def send_outbox(self) -> None:
        if self.node is not None:
            for target, header, arrays in self.node.take_outbox():
                if target in self.dead:
                    self.node.acked(target, header["seq"])
                    continue
                self.inflight[(target, header["seq"])] = (codec.encode(header, arrays), 0.0)
                self._send(target, header["seq"])
        self._schedule()

    def _send(self, target: int, seq: int) -> None:
        frames, _ = self.inflight[(target, seq)]
        link, source = self.links.get(target, 0), self.node.source
        self.network.request(self.endpoint, self.endpoints[target], frames,
                             lambda reply: self._acked(target, link, source, reply))
        self.inflight[(target, seq)] = (frames, self.world.now)

    def _acked(self, target: int, link: int, source: str, frames: list) -> None:
        if self.node is None or self.node.source != source or self.links.get(target, 0) != link:
            return  # the reply of a link since dropped (its socket would be closed)
        try:
            self.take_ack(target, codec.decode(frames)[0])
        except codec.Malformed:
            return

    def _drop_peer(self, target: int) -> None:
        for key in [key for key in self.inflight if key[0] == target]:
            del self.inflight[key]
            self.node.acked(*key)
        self.links[target] = self.links.get(target, 0) + 1

    def _relocate_peer(self, target: int, endpoint: str) -> None:
        self.links[target] = self.links.get(target, 0) + 1  # replies from the old endpoint are moot
        for key, (frames, _) in list(self.inflight.items()):
            if key[0] == target:
                self.inflight[key] = (frames, float("-inf"))  # sent again, to the new endpoint, at the next tick
        self._schedule()

    def leave(self) -> None:
        self.inflight, self.rebuilding_with, self.rebuild_streams = {}, None, set()
        self.links = {t: n + 1 for t, n in self.links.items()}
        super().leave()

    def _schedule(self) -> None:
        """A tick soon while there is work: resends, a window to close or deltas to apply when idle."""
        node = self.node
        if not self.ticking and self.alive and (self.inflight or (node is not None and (
                node.close_pending or node.queued or node.window_open))):
            self.ticking = True
            self.world.at(TICK, self._tick, self.endpoint)

    def _tick(self) -> None:
        self.ticking = False
        node = self.node
        if node is not None and self.world.now - self.last_request >= GRACE:  # quiet: the trainer computes
            if node.close_pending:
                node.close_window()
            elif node.queued:
                node.apply_queued()
        self.expire_window()
        for (target, seq), (_, sent) in list(self.inflight.items()):
            if self.world.now - sent > RESEND:
                self._send(target, seq)
        self.send_outbox()

    # -- rebuilding --------------------------------------------------------
    def rebuild(self) -> None:
        """While this node is rebuilding, `rebuild_streams` rebuilders (fibers of this process) pull what it lacks,
        each from its own part."""
        node = self.node
        if node is None or not node.rebuilding or self.rebuilding_with is not None:
            return
        self.rebuilding_with, self.rebuild_number = node.source, self.rebuild_number + 1
        parts = node.config.rebuild_streams
        self.rebuild_streams = set(range(parts))
        for part in range(parts):
            self._next_round(0.0, self.rebuild_number, part, parts, None)

    def _next_round(self, delay: float, number: int, part: int, parts: int, rounds) -> None:
        self.world.at(delay, lambda: self._rebuild_round(number, part, parts, rounds),
                      f"{self.endpoint}/rebuilder/{part}", fiber=True)

    def _rebuild_round(self, number: int, part: int, parts: int, rounds) -> None:
        if number != self.rebuild_number:
            return  # of a rebuild that ended (`leave`)
        source = self.rebuilding_with
        rest = None
        if source is not None and self.node is not None and self.node.source == source:
            try:
                rounds = rounds or RebuildRounds(self.cluster_of(self.endpoint), self.node.position, source, part, parts,
                                                self.serving_clients)
                rest = rounds.round()
            except Unavailable as exc:  # more than r slots of some stripes lost
                self.rebuild_lost = str(exc)
            except Error:  # a node or the cluster went away: a later heartbeat starts again
                pass
        if rest is not None:
            self._next_round(rest, number, part, parts, rounds)
            return
        self.rebuild_streams.discard(part)
        if not self.rebuild_streams:
            self.rebuilding_with = None

    def kill(self) -> None:
        """SIGKILL: everything of this process stops at once; its lease expires on its own."""
        self.alive = False
        self.world.kill(self.endpoint)
        if self.watch is not None:
            self.watch.cancel()
        for part in range(MAX_STREAMS):
            self.world.kill(f"{self.endpoint}/rebuilder/{part}")


class SimDecider:
    """A failover decider process: the production `Decider`, stepped while it has something to change."""

    def __init__(self, world: World, network: Network, store: ClusterStore, name: str, token: str):
        self.world, self.name = world, name
        self.decider = Decider(store, SimControl(network, name), name, token, log=world.note)
        world.at(0.0, self.tick, name, fiber=True)

    def tick(self) -> None:
        while self.decider.step():
            pass
        self.world.at(DECIDER_IDLE, self.tick, self.name, fiber=True)

    def kill(self) -> None:
        self.world.kill(self.name)
