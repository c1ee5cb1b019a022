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

from ..cluster.store import open_store
from .metrics import NodeMetrics
from ..membership import LeaseNotFound, MembershipUnavailable
from ..protocol import messages
from ..protocol.messages import ErrorCode
from .host import NodeHost
from .rebuilder import Rebuilder
from . import trace
from ..transport import codec
from ..transport.zeromq import bind_to, make_socket, start_authenticator

HEARTBEAT = 0.5  # seconds between keep-alives of a node's presence (and of reads of the map while it changes)
RESYNC = 5.0  # seconds between reads of the map and the writers when no change was seen
NODE_TTL = 3.0  # a node whose presence was not kept alive this long is failed over
RESEND = 0.5  # seconds before an unacknowledged delta is sent again
TICK = 0.02  # seconds between passes of a node's loop while a window is open, a delta unacknowledged or a rebuild runs
IDLE_TICK = 0.1  # ... and while none is: a request or an acknowledgement wakes it at once
DYING = {"die_before_deltas", "die_after_write"}  # faults that SIGKILL the node, maybe before its answer to `fault` left
FAULTS = DYING | {"duplicate_deltas", "reorder_deltas", "delay_deltas", "hold_deltas_to"}
GRACE = 0.002  # deferred parity work waits for this much quiet, so it runs while the trainer computes

METRICS_EVERY = 1.0  # seconds between updates of the metrics' gauges


class NodeServer(NodeHost):
    """A node process: the node behind a ROUTER socket, delta delivery to peers with resends until
    acknowledged, its presence in the store, its rebuilder, and injected faults."""

    late_writers = True  # the trainer waits for the snapshot's answer, not for the writing
    owns_arrays = True

    def __init__(self, bind: str, curve: dict | None = None, parent: int | None = None, token: str | None = None,
                 membership: dict | None = None, metrics: int | None = None):
        self.context = zmq.Context()
        self.parent = parent
        self.auth = start_authenticator(self.context, curve)
        self.router = make_socket(self.context, zmq.ROUTER, curve, server=True)
        super().__init__(bind_to(self.router, bind), token)
        self.keys = curve  # its own key pair (peers, rebuilder) and who may send what (`NodeHost.handle`)
        self.lazy_close = True
        self.membership = membership  # the [membership] section: where the cluster's store is
        self.presence: _Presence | None = None  # this node's presence in the store, once serving
        self.writers_taken = 0  # the presence's read of the live writers the node last expired writers by
        self.rebuilder: Rebuilder | None = None
        self.next_rebuilder = 0.0
        self.peers: dict[int, zmq.Socket] = {}
        self.malformed = 0
        self.faults: dict[str, float] = {}  # armed by the owning cluster's `fault` op, for tests
        self.fault_hits = 0
        self.last_request = 0.0
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        self.metrics = None if metrics is None else NodeMetrics(metrics)  # Prometheus, on this port
        self.metrics_at = 0.0

    # -- control ---------------------------------------------------------
    def control(self, msg, arrays=()) -> tuple[dict, list]:
        if msg.op == "fault":  # fault injection for tests: arm one of FAULTS
            if self.token is None or msg.token != self.token:
                return messages.error(ErrorCode.INVALID, "fault is only taken from the cluster that started this node"), []
            if msg.name not in FAULTS:
                return messages.error(ErrorCode.INVALID, f"faults are {sorted(FAULTS)}"), []
            if msg.name == "hold_deltas_to":  # held deltas (of a hold moved or lifted) go at the next resend pass
                held = self.faults.get(msg.name)
                self.inflight.update({key: (frames, 0.0) for key, (frames, _) in self.inflight.items()
                                      if key[0] == held})
            self.faults[msg.name] = msg.value
            return {}, []
        return super().control(msg, arrays)

    def announce(self) -> None:
        if self.presence is not None:
            self.presence.announce()

    def writers(self) -> set[str]:
        if self.presence is None:
            return set()
        try:
            with self.presence.lock:
                return self.presence.store.writers()
        except MembershipUnavailable:
            return set(self.presence.writers or ())  # as last read
    def rebuild(self) -> None:
        """While this node is rebuilding, a rebuilder thread pulls what it lacks (restarted if it stops)."""
        node = self.node
        if node is None or not node.rebuilding or self.membership is None:
            return
        if (self.rebuilder is not None and self.rebuilder.is_alive()) or time.monotonic() < self.next_rebuilder:
            return
        self.next_rebuilder = time.monotonic() + 1.0
        self.rebuilder = Rebuilder(self.membership, self.keys, node.position, node.source, self.serving_clients)
        self.rebuilder.start()

    def leave(self) -> None:
        """This node was declared dead while it was away: drop everything and wait as a spare."""
        if self.rebuilder is not None:
            self.rebuilder.stop()
        for sock in self.peers.values():  # its deltas go nowhere now: the node that made them is gone
            self.poller.unregister(sock)
            sock.close(0)
        self.peers, self.inflight = {}, {}
        super().leave()

    def _drop_peer(self, target: int) -> None:
        for key in [key for key in self.inflight if key[0] == target]:
            del self.inflight[key]
            self.node.acked(*key)
        sock = self.peers.pop(target, None)
        if sock is not None:
            self.poller.unregister(sock)
            sock.close(0)

    def _relocate_peer(self, target: int, endpoint: str) -> None:
        sock = self.peers.pop(target, None)
        if sock is not None:
            self.poller.unregister(sock)
            sock.close(0)
        for key, (frames, _) in list(self.inflight.items()):
            if key[0] == target:
                self.inflight[key] = (frames, float("-inf"))  # sent again, to the new endpoint, at the next pass

    def _connect(self, target: int) -> None:
        self._peer(target)

    # -- the loop --------------------------------------------------------
    def serve(self) -> None:
        while self.running:
            node = self.node
            busy = node is not None and (node.close_pending or node.queued)
            waiting = self.inflight or (node is not None and (node.window_open or node.rebuilding))
            events = dict(self.poller.poll(int((GRACE if busy else TICK if waiting else IDLE_TICK) * 1000)))
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
            self.expire_window()
            self.send_outbox()
            self.resend()
            if self.presence is not None:
                self.follow_map(self.presence.map)  # the newest map its thread read
                if self.node is not None and self.presence.writers_read != self.writers_taken:  # a fresh read
                    self.writers_taken = self.presence.writers_read
                    self.node.take_writers(self.presence.writers, self.presence.writers_since)
            self.rebuild()
            self.measure()
            if busy and self.node is not None and time.monotonic() - self.last_request > GRACE:  # quiet a while: the trainer is computing
                if self.node.close_pending:
                    self.node.close_window()
                    self.send_outbox()
                elif self.node.queued:
                    self.node.apply_queued()
            if self.parent and os.getppid() != self.parent:
                break  # the process that started us is gone: never outlive it
        self.close()

    def measure(self) -> None:
        """Set the metrics' gauges from the node's status, about once a second."""
        now = time.monotonic()
        if self.metrics is not None and self.node is not None and now - self.metrics_at >= METRICS_EVERY:
            self.metrics_at = now
            node = self.node
            age = node.clock() - node.window_opened if node.window_open else 0.0
            self.metrics.update({**node.status(), "rss_bytes": resident_bytes()}, age)

    def answer(self, frames) -> None:
        identity, body = frames[0], frames[1:]
        try:
            header, arrays = codec.decode(body)
        except Exception as exc:  # Malformed, or anything a decoder bug lets through: never die of input
            self.malformed += 1
            self._reply(identity, messages.error(ErrorCode.MALFORMED, str(exc)), [])
            return
        rid = header.get("id")
        key = body[0].get("User-Id") if self.keys else None  # the sender's public key, as CURVE proved it
        try:
            reply = self.handle(header, arrays, key)
        except Exception as exc:  # a node never dies of a request
            self.malformed += 1
            reply = messages.error(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"), []
        if "die_after_write" in self.faults and header.get("op") == "write" and "seq" in reply[0]:
            os.kill(os.getpid(), signal.SIGKILL)  # applied, not answered, no delta sent
        out_header, out_arrays = reply
        if header.get("op") == "status" and "status" in out_header:
            out_header["status"]["malformed"] = self.malformed
            out_header["status"]["endpoint"] = self.endpoint
            out_header["status"]["fault_hits"] = self.fault_hits
            out_header["status"]["rebuild_lost"] = self.rebuilder.lost if self.rebuilder is not None else None
            out_header["status"]["pid"] = os.getpid()
            out_header["status"]["rss_bytes"] = resident_bytes()
            out_header["status"]["metrics_port"] = self.metrics.port if self.metrics is not None else None
        if self.metrics is not None and isinstance(header.get("op"), str):
            self.metrics.answered(header["op"], *_rows_of(header["op"], arrays, out_header))
        try:
            self._reply(identity, {**out_header, "id": rid, "epoch": self.epoch}, out_arrays)
        except (TypeError, ValueError):
            self._reply(identity, messages.error(ErrorCode.INTERNAL, "reply not encodable"), [])
        if header.get("op") == "snapshot" and self.node is not None:
            self.node.start_writer()

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
                hold = 1e9  # not sent while held (as if lost in the network): the hold moving sends it
            if hold:
                self.fault_hits += 1
                self.inflight[key] = (self.inflight[key][0], now + hold - RESEND)  # the resend pass sends it then
            else:
                self._send(*key)

    def _peer(self, target: int) -> zmq.Socket:
        sock = self.peers.get(target)
        if sock is None:
            sock = make_socket(self.context, zmq.DEALER, self.keys, immediate=False)
            sock.connect(self.endpoints[target])
            self.peers[target] = sock
            self.poller.register(sock, zmq.POLLIN)
        return sock

    def _send(self, target, seq) -> None:
        frames, _ = self.inflight[(target, seq)]
        try:
            for _ in range(2 if "duplicate_deltas" in self.faults else 1):
                self._peer(target).send_multipart(frames, flags=zmq.NOBLOCK, copy=True)
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
                frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            try:
                header, _ = codec.decode(frames)
            except codec.Malformed:
                continue
            self.take_ack(target, header)

    def close(self) -> None:
        if self.rebuilder is not None:
            self.rebuilder.stop()
            self.rebuilder.join(5)
        for sock in self.peers.values():
            sock.close(0)
        if self.presence is not None:
            self.presence.stop.set()
            self.presence.changed.set()  # wakes it
            self.presence.join(2)
        self.router.close(0)
        if self.auth is not None:
            self.auth.stop()
        if self.metrics is not None:
            self.metrics.close()
        self.context.term()


class _Presence(threading.Thread):
    """Keeps this node's presence in the cluster store alive under a lease (every HEARTBEAT s, from a
    thread of its own, so a long request does not make the node look dead), announces who it is
    whenever that changes, and reads the map, which the main loop then follows, and the live writers. A
    main loop that hangs is still found out: clients' requests time out.

    It reads the map and the writers when a watch of the store says either changed (at once), at every beat
    while the node waits for writers to replay (a wait ends on a read begun after it) or has no watch, and
    every RESYNC s anyway; not at every beat: on the benchmark's 9 nodes that kept the store (etcd) and these
    threads busy for 12-17 ms of CPU a training iteration. At a beat with no read, the writers last read are
    taken as alive then (the watch saw none go): a node counts a writer's absence from when it went, not from
    the last read (`Node.expire_writers`; a writer fences itself `writer_grace` / 2 after its lease ends). A
    watch that lags can only make that count start later, which keeps a gone writer's state longer."""

    def __init__(self, server: "NodeServer"):
        super().__init__(name="presence", daemon=True)
        self.server = server
        self.store = open_store(server.membership)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.lease: int | None = None
        self.announced: dict | None = None
        self.map = None  # the newest map read
        self.writers: set[str] | None = None  # the writers alive at the last read
        self.writers_read = 0  # counts successful reads of `writers`
        self.writers_since = float("-inf")  # when the last successful read of `writers` began
        self.changed = threading.Event()  # the map or the writers changed since they were last read
        self.changed.set()
        self.read_at = float("-inf")  # when they were last read

    def announce(self) -> None:
        """Publish this node's presence now if it changed (from any thread)."""
        with self.lock:
            info = self.server.beat()
            if self.lease is None:
                self.lease = self.store.membership.grant(NODE_TTL)
            if info != self.announced:
                try:
                    self.store.announce(self.server.endpoint, info, self.lease)
                except LeaseNotFound:  # it expired meanwhile: under a new one
                    self.lease = self.store.membership.grant(NODE_TTL)
                    self.store.announce(self.server.endpoint, info, self.lease)
                self.announced = info

    def run(self) -> None:
        store, watch, next_watch = self.store, None, 0.0
        while not self.stop.is_set():
            try:
                with self.lock:
                    if self.lease is not None and not store.membership.keepalive(self.lease):
                        self.lease, self.announced = None, None  # expired: this node was failed over
                self.announce()
                watching = watch is not None and watch.error is None
                if not watching and time.monotonic() >= next_watch:
                    try:  # not made yet, or the backend ended it: watch from now on, then read
                        watch, watching = store.membership.watch(store.prefix + "/", self._changes), True
                        self.changed.set()
                    except MembershipUnavailable:  # until one is made, read at every beat
                        watch, next_watch = None, time.monotonic() + RESYNC
                began = time.monotonic()
                if reads_due(began, self.read_at, watching, self.changed.is_set(), self.server.node):
                    self.changed.clear()  # first: a change made during the reads is read again at once
                    latest = store.read_map()
                    if latest is not None:
                        self.map = latest
                    self.writers, self.read_at = store.writers(), began
                if self.writers is not None:  # read now, or unchanged since as the watch says: alive at `began`
                    self.writers_read, self.writers_since = self.writers_read + 1, began
            except MembershipUnavailable:  # the store is away: keep trying; the lease tells the others
                self.changed.set()
                self.stop.wait(HEARTBEAT)
                continue
            self.changed.wait(HEARTBEAT)  # a change of the map is followed at once
        if watch is not None:
            watch.cancel()
        store.membership.close()

    def _changes(self, events) -> None:
        """The watch's callback: note a change of the map or of the writers."""
        if self.store.moves_nodes(events):
            self.changed.set()


def reads_due(now: float, read_at: float, watching: bool, changed: bool, node) -> bool:
    """Whether a node's presence reads the map and the writers at a beat at `now` (they were last read at
    `read_at`): when it has no working watch of the store, the watch saw either change, `node` waits for
    writers to replay (a read of the writers may end the wait), or RESYNC s passed."""
    awaits = node is not None and (node.replay_from is not None or bool(node.late))
    return not watching or changed or awaits or now - read_at >= RESYNC


HEAP_KEEPS = 256 << 20  # a node process's malloc serves blocks below this from its heap, and keeps freed ones


def keep_freed_buffers() -> bool:
    """Have glibc's malloc serve allocations below `HEAP_KEEPS` from the heap and keep what is freed there
    (up to twice that at its top) for the next, instead of mapping each large one anew and unmapping it when
    freed: a rebuild round's 42 MB of stripe blocks would otherwise be page-faulted in again every round.
    False where the C library has no `mallopt` (not glibc), which changes nothing."""
    try:
        import ctypes
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, HEAP_KEEPS)) and bool(mallopt(m_trim_threshold, 2 * HEAP_KEEPS))


def lower_priority(nice: int) -> None:
    """Lower this process's CPU priority by `nice`: every thread's on Linux (where a priority is a thread's, and
    threads started so far, such as numpy's, keep theirs), threads started later take it from their creator."""
    level = os.getpriority(os.PRIO_PROCESS, 0) + nice
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: the process's
        threads = [0]
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(level, 19))
        except OSError:  # a thread that ended meanwhile
            pass


def die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no orphans)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        sys.exit(0)


def is_loopback(endpoint: str) -> bool:
    """Whether a tcp:// (or ipc:// / inproc://) endpoint stays on this machine."""
    if not endpoint.startswith("tcp://"):
        return endpoint.startswith(("ipc://", "inproc://"))
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    return host == "localhost" or host.startswith("127.") or host == "::1"


def run(bind: str, curve: dict | None = None, parent: int | None = None, map_header: dict | None = None,
        token: str | None = None, membership: dict | None = None, metrics: int | None = None, nice: int = 0) -> None:
    """Serve until told to shut down; prints `READY <endpoint>` once listening. Without CURVE keys it listens
    on loopback only (anyone who can reach the port could otherwise write to the node). `nice`: how much to
    lower the process's CPU priority (every thread's)."""
    if not curve and not is_loopback(bind):
        sys.exit(f"ectable node: refusing to listen on {bind} without CURVE keys: any host that reaches it could "
                 f"send it requests; make keys with `ectable keygen` and list them in the cluster file's [security], "
                 f"or bind to 127.0.0.1")
    if parent:
        die_with_parent(parent)
    if nice:
        lower_priority(nice)
    trace.install()  # with ECTABLE_TRACE set: this process's changes to rows, logged (`process/trace.py`)
    keep_freed_buffers()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints where the node is
    server = NodeServer(bind, curve, parent, token, membership, metrics)
    if membership is not None:
        server.presence = _Presence(server)
        server.presence.announce()
        server.presence.start()
    if map_header is not None:
        server.apply_map(messages.parse(map_header))
    print(f"READY {server.endpoint}", flush=True)
    profile = os.environ.get("ECTABLE_PROFILE")  # a directory: each node writes its cProfile there on exit,
    # in CPU seconds of its serving thread (on shared cores, wall time would count the waits for a core)
    if not profile:
        try:
            server.serve()
        except Exception:  # a bug, not input: die at once (crash-only) rather than hang half-alive
            traceback.print_exc()
            os._exit(70)
        return
    import cProfile
    prof = cProfile.Profile(time.thread_time)
    try:
        prof.runcall(server.serve)
    finally:
        prof.dump_stats(os.path.join(profile, f"node-{os.getpid()}.prof"))


def _rows_of(op: str, arrays: list, reply: dict) -> tuple[int, int]:
    """(rows read, rows written) by a request that succeeded: the sizes of its ids arrays."""
    if "error" in reply:
        return 0, 0
    if op == "get_many":
        return sum(getattr(a, "size", 0) for a in arrays), 0
    if op == "write":
        return 0, sum(getattr(a, "size", 0) for a in arrays[0::2])
    return 0, 0


def resident_bytes() -> int | None:
    """This process's resident memory (Linux /proc), or None where there is no /proc."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None

