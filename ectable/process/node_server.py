"""A node process: serves one Node over a ZeroMQ ROUTER socket and carries its deltas to peers.

One thread does everything (the node's logic is not thread-safe): it answers requests,
sends each outgoing delta to its target's DEALER socket and resends it until the target
acknowledges it, so delivery is asynchronous and exactly once (the receiver dedups).
A node starts without a position; the cluster's `map` message gives it one (or, for a
spare, later), the endpoints of its peers and the positions that are dead.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
import traceback

import zmq

from ..config import ENDPOINT, ClusterConfig
from ..storage.node import Node
from .coordinator import HEARTBEAT
from .rebuilder import Rebuilder
from ..transport import codec
from ..transport.zeromq import bind_to, make_socket, start_authenticator

RESEND = 0.5  # seconds before an unacknowledged delta is sent again
TICK = 0.02
FAULTS = {"die_before_deltas", "die_after_write", "duplicate_deltas", "reorder_deltas", "delay_deltas", "hold_deltas_to"}
GRACE = 0.002  # deferred parity work waits for this much quiet, so it runs while the trainer computes


class NodeServer:
    """The process side of a node: sockets, delta delivery, and the control ops `map` and `sync`."""

    def __init__(self, bind: str, curve: dict | None = None, parent: int | None = None, token: str | None = None):
        self.context = zmq.Context()
        self.curve, self.parent, self.token = curve, parent, token
        self.auth = start_authenticator(self.context, curve)
        self.router = make_socket(self.context, zmq.ROUTER, curve, server=True)
        self.endpoint = bind_to(self.router, bind)
        self.node: Node | None = None
        self.epoch = 0  # of the last map taken
        self.heart: _Heart | None = None  # beats to the coordinator, once a map names it
        self.rebuilder: Rebuilder | None = None
        self.next_rebuilder = 0.0
        self.endpoints: list[str] = []
        self.sources: dict[int, str] = {}  # identity last seen at each position
        self.dead: set[int] = set()
        self.peers: dict[int, zmq.Socket] = {}
        self.inflight: dict[tuple[int, int], tuple[list, float]] = {}  # (target, seq) -> (frames, last sent)
        self.malformed = 0
        self.faults: dict[str, float] = {}  # armed by the owning cluster's `fault` op, for tests
        self.fault_hits = 0
        self.last_request = 0.0
        self.running = True
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)

    # -- control ---------------------------------------------------------
    def control(self, header: dict, arrays: list) -> tuple[dict, list] | None:
        op = header.get("op")
        if op in ("map", "shutdown", "fault") and (self.token is None or header.get("token") != self.token):
            return {"error": "invalid", "message": f"{op} is only taken from the cluster that started this node"}, []
        if op == "fault":  # fault injection for tests: arm one of FAULTS
            if header.get("name") not in FAULTS:
                return {"error": "invalid", "message": f"faults are {sorted(FAULTS)}"}, []
            self.faults[header["name"]] = float(header.get("value", 1.0))
            return {}, []
        if op == "map":
            return self.apply_map(header), []
        if op == "ping":
            return {"position": None if self.node is None else self.node.position}, []
        if op == "shutdown":
            self.running = False
            return {}, []
        if self.node is None:
            return {"error": "not_member", "message": "this node holds no position (a spare)"}, []
        return None

    def apply_map(self, header: dict) -> dict:
        """Take a position (once), learn the coordinator, peers' endpoints and which positions are dead."""
        endpoints, dead = header.get("endpoints"), header.get("dead", [])
        coordinator = header.get("coordinator")
        if not (isinstance(endpoints, list) and all(isinstance(e, str) and ENDPOINT.match(e) for e in endpoints)
                and isinstance(dead, list) and all(isinstance(d, int) and 0 <= d < len(endpoints) for d in dead)
                and (self.node is None or len(endpoints) == self.node.config.nodes)):
            return {"error": "invalid", "message": "map needs tcp://host:port endpoints, one per node, and dead positions"}
        if coordinator is not None and not (isinstance(coordinator, str) and ENDPOINT.match(coordinator)):
            return {"error": "invalid", "message": "map names a bad coordinator endpoint"}
        if isinstance(header.get("epoch"), int):
            if header["epoch"] < self.epoch:  # an older map overtaken by a newer one: keep the newer
                return {"source": self.node and self.node.source}
            self.epoch = header["epoch"]
        if coordinator is not None and self.heart is None:
            self.heart = _Heart(self, coordinator)
            self.heart.start()
        if self.node is None and header.get("position") is not None:
            try:
                config = ClusterConfig(**header["config"])
                position = int(header["position"])
                if not 0 <= position < config.nodes or len(endpoints) != config.nodes:
                    raise ValueError("position or endpoints do not fit the cluster")
            except (TypeError, ValueError, KeyError) as exc:
                return {"error": "invalid", "message": f"bad map: {exc}"}
            self.node = Node(position, config, rebuilding=bool(header.get("rebuilding")), lazy_close=True)
        if self.node is None:
            return {"source": None}
        sources = header.get("sources")
        if not (isinstance(sources, list) and len(sources) == len(endpoints)):
            sources = [None] * len(endpoints)
        for target, endpoint in enumerate(endpoints):
            moved = target < len(self.endpoints) and (self.endpoints[target] != endpoint or (
                sources[target] is not None and self.sources.get(target) not in (None, sources[target])))
            if moved and target != self.node.position:  # a new node there (maybe at the same endpoint)
                self._drop_peer(target)
                self.node.peer_replaced(target)
            if sources[target] is not None:
                self.sources[target] = sources[target]
        self.endpoints = endpoints
        self.dead = set(dead)
        self.node.fenced |= {f for f in header.get("fenced", []) if isinstance(f, str)}
        for target in self.dead:
            self._drop_peer(target)
        for target in range(len(endpoints)):  # connect now, so the first window's deltas need not wait
            if target != self.node.position and target not in self.dead:
                self._peer(target)
        return {"source": self.node.source}

    def beat(self) -> dict:
        """This node's heartbeat: who it is, and whether (and since which invalidation) it rebuilds."""
        node = self.node
        return {"op": "heartbeat", "token": self.token, "epoch": self.epoch, "endpoint": self.endpoint,
                "source": node and node.source, "position": node and node.position,
                "rebuilding": bool(node and node.rebuilding), "generation": node.generation if node else 0}

    def rebuild(self) -> None:
        """While this node is rebuilding, a rebuilder thread pulls what it lacks (restarted if it stops)."""
        node = self.node
        if node is None or not node.rebuilding or self.heart is None:
            return
        if (self.rebuilder is not None and self.rebuilder.is_alive()) or time.monotonic() < self.next_rebuilder:
            return
        self.next_rebuilder = time.monotonic() + 1.0
        self.rebuilder = Rebuilder(self.heart.endpoint, self.curve, node.position, node.source)
        self.rebuilder.start()

    def leave(self) -> None:
        """This node was declared dead while it was away: drop everything and wait as a spare."""
        if self.rebuilder is not None:
            self.rebuilder.stop()
        for sock in self.peers.values():  # its deltas go nowhere now: the node that made them is gone
            self.poller.unregister(sock)
            sock.close(0)
        self.peers, self.inflight = {}, {}
        self.node = None
        self.endpoints, self.dead, self.sources = [], set(), {}

    def _drop_peer(self, target: int) -> None:
        """Deltas to `target` are moot (it died, or a replacement rebuilds its parity from data)."""
        for key in [key for key in self.inflight if key[0] == target]:
            del self.inflight[key]
            self.node.acked(*key)
        sock = self.peers.pop(target, None)
        if sock is not None:
            self.poller.unregister(sock)
            sock.close(0)

    # -- the loop --------------------------------------------------------
    def serve(self) -> None:
        while self.running:
            busy = self.node is not None and (self.node.close_pending or self.node.queued)
            events = dict(self.poller.poll(int((GRACE if busy else TICK) * 1000)))
            if self.router in events:
                self.last_request = time.monotonic()
                for _ in range(64):  # a burst at most, then the peers get a turn
                    try:
                        frames = self.router.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self.answer(frames)
            for target, sock in list(self.peers.items()):
                if sock in events:
                    self.read_acks(target, sock)
            self.send_outbox()
            self.resend()
            fenced = self.heart.fenced if self.heart is not None else None
            if fenced is not None and self.node is not None and self.node.source == fenced:
                self.leave()
            self.rebuild()
            if busy and self.node is not None and time.monotonic() - self.last_request > GRACE:  # quiet a while: the trainer is computing
                if self.node.close_pending:
                    self.node.close_window()
                    self.send_outbox()
                elif self.node.queued:
                    self.node.apply_queued()
            if self.parent and os.getppid() != self.parent:
                break  # the process that started us is gone: never outlive it
        self.close()

    def answer(self, frames) -> None:
        identity, body = frames[0], frames[1:]
        try:
            header, arrays = codec.decode(body)
        except Exception as exc:  # Malformed, or anything a decoder bug lets through: never die of input
            self.malformed += 1
            self._reply(identity, {"error": "malformed", "message": str(exc)}, [])
            return
        rid = header.get("id")
        try:
            reply = self._dispatch(header, arrays)
        except Exception as exc:  # a node never dies of a request
            self.malformed += 1
            reply = {"error": "internal", "message": f"{type(exc).__name__}: {exc}"}, []
        if "die_after_write" in self.faults and header.get("op") == "write" and "seq" in reply[0]:
            os.kill(os.getpid(), signal.SIGKILL)  # applied, not answered, no delta sent
        out_header, out_arrays = reply
        if header.get("op") == "status" and "status" in out_header:
            out_header["status"]["malformed"] = self.malformed
            out_header["status"]["endpoint"] = self.endpoint
            out_header["status"]["fault_hits"] = self.fault_hits
        try:
            self._reply(identity, {**out_header, "id": rid, "epoch": self.epoch}, out_arrays)
        except (TypeError, ValueError):
            self._reply(identity, {"error": "internal", "message": "reply not encodable"}, [])

    def _dispatch(self, header, arrays):
        reply = self.control(header, arrays)
        if reply is None:
            reply = self.node.handle(header, arrays)
        return reply

    def _reply(self, identity, header, arrays) -> None:
        try:
            self.router.send_multipart([identity, *codec.encode(header, arrays)], flags=zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:
            pass  # the asker is gone or not reading: drop the reply (ROUTER_MANDATORY said so)

    def send_outbox(self) -> None:
        if self.node is None:
            return
        outbox = self.node.take_outbox()
        if outbox and "die_before_deltas" in self.faults:
            os.kill(os.getpid(), signal.SIGKILL)  # the window is closed and its deltas built, none sent
        now = time.monotonic()
        for target, header, arrays in outbox:
            if target in self.dead:
                self.node.acked(target, header["seq"])
                continue
            key = (target, header["seq"])
            self.inflight[key] = (codec.encode(header, arrays), 0.0)
            hold = self.faults.get("delay_deltas", 0.0)
            if "reorder_deltas" in self.faults and header["seq"] % 2:  # odd ones overtaken by the next
                hold = self.faults["reorder_deltas"]
            if target == self.faults.get("hold_deltas_to"):
                hold = 1e9  # never sent: as if lost in the network until this node dies
            if hold:
                self.fault_hits += 1
                self.inflight[key] = (self.inflight[key][0], now + hold - RESEND)  # the resend pass sends it then
            else:
                self._send(*key)

    def _peer(self, target: int) -> zmq.Socket:
        sock = self.peers.get(target)
        if sock is None:
            sock = make_socket(self.context, zmq.DEALER, self.curve, immediate=False)
            sock.connect(self.endpoints[target])
            self.peers[target] = sock
            self.poller.register(sock, zmq.POLLIN)
        return sock

    def _send(self, target, seq) -> None:
        frames, _ = self.inflight[(target, seq)]
        try:
            for _ in range(2 if "duplicate_deltas" in self.faults else 1):
                self._peer(target).send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            self.fault_hits += "duplicate_deltas" in self.faults
            sent = time.monotonic()
        except zmq.Again:
            sent = 0.0  # not connected yet: try again at the next resend pass
        self.inflight[(target, seq)] = (frames, sent)

    def resend(self) -> None:
        now = time.monotonic()
        held = self.faults.get("hold_deltas_to")
        for (target, seq), (_, sent) in list(self.inflight.items()):
            if now - sent > RESEND and target != held:
                self._send(target, seq)

    def read_acks(self, target, sock) -> None:
        while True:
            try:
                frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                header, _ = codec.decode(frames)
            except codec.Malformed:
                continue
            seq = header.get("ack")
            if isinstance(seq, int) and self.inflight.pop((target, seq), None) is not None:
                self.node.acked(target, seq)
            elif header.get("error") == "out_of_order":  # an earlier delta was lost: send them all again now
                for key, (frames, _) in list(self.inflight.items()):
                    if key[0] == target:
                        self.inflight[key] = (frames, 0.0)

    def close(self) -> None:
        if self.rebuilder is not None:
            self.rebuilder.stop()
            self.rebuilder.join(5)
        for sock in self.peers.values():
            sock.close(0)
        if self.heart is not None:
            self.heart.stop.set()
            self.heart.join(2)
        self.router.close(0)
        if self.auth is not None:
            self.auth.stop()
        self.context.term()


class _Heart(threading.Thread):
    """Heartbeats to the coordinator every HEARTBEAT seconds, from a thread of their own so that
    a long request (a big table's initial parity) does not make a node look dead. A reply saying
    this node's identity is fenced is passed to the main loop, which then leaves. A main loop
    that hangs is still found out: clients' requests time out and the coordinator's ping fails."""

    def __init__(self, server: NodeServer, endpoint: str):
        super().__init__(name="heartbeat", daemon=True)
        self.server, self.endpoint = server, endpoint
        self.stop = threading.Event()
        self.fenced: str | None = None  # an identity of this node the coordinator declared dead

    def run(self) -> None:
        sock = make_socket(self.server.context, zmq.DEALER, self.server.curve)
        sock.connect(self.endpoint)
        try:
            while not self.stop.is_set():
                beat = self.server.beat()  # plain attributes only: safe beside the main thread
                try:
                    sock.send_multipart(codec.encode(beat, []), flags=zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass  # not connected yet, or the queue is full: the next beat tries again
                deadline = time.monotonic() + HEARTBEAT
                while not self.stop.is_set() and sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                    try:
                        header, _ = codec.decode(sock.recv_multipart(copy=False))
                    except codec.Malformed:
                        continue
                    if header.get("fenced") and beat["source"] is not None:
                        self.fenced = beat["source"]
        finally:
            sock.close(0)


def die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no orphans)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        sys.exit(0)


def run(bind: str, curve: dict | None = None, parent: int | None = None, map_header: dict | None = None,
        token: str | None = None) -> None:
    """Serve until told to shut down; prints `READY <endpoint>` once listening."""
    if parent:
        die_with_parent(parent)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints where the node is
    server = NodeServer(bind, curve, parent, token)
    if map_header is not None:
        server.apply_map(map_header)
    print(f"READY {server.endpoint}", flush=True)
    profile = os.environ.get("ECTABLE_PROFILE")  # a directory: each node writes its cProfile there on exit
    if not profile:
        try:
            server.serve()
        except Exception:  # a bug, not input: die at once (crash-only) rather than hang half-alive
            traceback.print_exc()
            os._exit(70)
        return
    import cProfile
    prof = cProfile.Profile()
    try:
        prof.runcall(server.serve)
    finally:
        prof.dump_stats(os.path.join(profile, f"node-{os.getpid()}.prof"))
