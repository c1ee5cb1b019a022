"""Clusters started from Python: `LocalCluster`, with node processes on loopback, their failover
deciders and a one-member etcd (`processes=True`) or nodes inside this process (`processes=False`), same
semantics; process management and fault injection. Clients' view of a map: `maps.py`.
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time

from .. import config as cluster_config, security
from ..client import Client
from ..cluster import plans
from ..cluster.decider import Decider
from ..cluster.map import Map
from ..cluster.maps import WRITER_TTL, ClusterMap, SeesExits, StoredMap, ZmqStoredMap
from ..cluster.store import ClusterStore, open_store
from ..config import MAX_STREAMS, ClusterConfig
from ..errors import Error, NodeDown
from ..membership.memory import MemoryMembership
from ..membership.server import EtcdServer
from ..storage.node import Node
from ..protocol.messages import ErrorCode, Fault
from .host import NodeHost
from .node_server import DYING, HEARTBEAT, TICK
from ..transport import InProcessChannel, ZmqChannel

DEFAULT_R = {"none": 0, "xor": 1, "rs": 2}
START_TIMEOUT = 60.0
SPARE_KEYS = 16  # node keys made beyond the nodes and spares started, for spares added later (keys=True)
# How much lower a local node process's CPU priority is than its parent's, by default: on the bench's 2 cores, 10
# rather than 0 trained rs(6,3) 4-8% faster with a 20 ms model step (the trainer woke from the step on time instead of
# 2-3 ms late behind parity work), xor and rs(6,3) 10-17% faster with none, and 5-8% faster through a rebuild
# (docs/benchmarks.md, "Node processes below the trainer's priority").
NODE_NICE = 10


def _checked_config(nodes, code, k, r, spares, **tuning) -> ClusterConfig:
    if r is None:
        r = DEFAULT_R.get(code, 1)
    if nodes < k + r:
        raise ValueError(f"nodes must be at least k + r = {k + r}, got {nodes}")
    if spares < 0:
        raise ValueError(f"spares must be >= 0, got {spares}")
    window_seconds = tuning.get("window_seconds", ClusterConfig.window_seconds)
    if not (isinstance(window_seconds, (int, float)) and 0 < window_seconds < float("inf")):
        raise ValueError(f"window_seconds must be a positive number of seconds, got {window_seconds!r}")
    steps = tuning.get("window_steps", ClusterConfig.window_steps)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"window_steps must be a positive integer, got {steps!r}")
    streams = tuning.get("rebuild_streams", ClusterConfig.rebuild_streams)
    if isinstance(streams, bool) or not isinstance(streams, int) or not 1 <= streams <= MAX_STREAMS:
        raise ValueError(f"rebuild_streams must be an integer from 1 to {MAX_STREAMS}, got {streams!r}")
    grace = tuning.get("writer_grace", ClusterConfig.writer_grace)
    if not (isinstance(grace, (int, float)) and 2 * WRITER_TTL <= grace < float("inf")):
        raise ValueError(f"writer_grace must be at least {2 * WRITER_TTL} seconds (twice a writer's lease), "
                         f"got {grace!r}")
    config = ClusterConfig(nodes, code, k, r, **tuning)
    config.make_code()  # reject bad codes now
    return config


class LocalCluster(ClusterMap):
    """`nodes` active nodes plus `spares`, protected by `code` with k data and r parity slots per stripe.

    With `processes=True` every node is a process on 127.0.0.1 talking ZeroMQ and `kill(i)`
    sends SIGKILL; with `processes=False` the nodes live in this process and `kill(i)`
    drops node i's memory.
    """

    def __new__(cls, *args, processes: bool = True, **kwargs):
        if cls is LocalCluster:
            cls = ProcessCluster if processes else InProcessCluster
        return super().__new__(cls)

    def __init__(self, nodes: int = 5, code: str = "xor", k: int = 4, r: int | None = None, spares: int = 0,
                 processes: bool = True, **tuning):
        """`tuning`: window_rows, window_seconds, window_steps, rebuild_batch, rebuild_share, rebuild_streams, writer_grace (see
        ClusterConfig)."""
        super().__init__(_checked_config(nodes, code, k, r, spares, **tuning))
        self.processes = processes
        self._spares = spares

    def connect(self) -> Client:
        """A client of this cluster."""
        return Client(self)

    def drain(self, i: int, timeout: float = START_TIMEOUT) -> None:
        """Hand active node i's position to a spare and stop the node, with no failure to detect (`ectable node
        drain`); returns once a spare holds the position (it continues the node: see `Decider._hand_over`). Error if the drain
        could not start within `timeout` seconds (the request is then withdrawn), or no spare took the position."""
        endpoint = self._map.endpoints[i]
        if self._map.states[i] == "dead":
            raise Error(f"position {i} is dead already")
        self.store.request_drain(endpoint)
        deadline = time.monotonic() + timeout
        while True:
            self.refresh()
            if self._map.endpoints[i] != endpoint and self._map.states[i] != "dead":
                return
            if time.monotonic() > deadline:
                m = self.store.read_map()
                if m.position_of(endpoint) == i and self.store.cancel_drain(endpoint, m):
                    drains = self.store.drains()
                    why = plans.drain_waits(m, plans.free_spares(m, self.store.presence(), drains))
                    raise Error(f"position {i} was not drained within {timeout} s: {why or 'the decider did not act'}")
                raise Error(f"position {i} was drained but no spare took it within {timeout} s")
            time.sleep(0.02)

    def add_node(self, timeout: float = START_TIMEOUT) -> int:
        """One more active node (`ectable node add`): a spare is started, and the cluster laid out again over it
        while it serves (see `cluster.grow`); returns its position. Error if the decider did not add it within
        `timeout` seconds (the request is then withdrawn)."""
        endpoint, asked = self.add_spare(), self.config.nodes
        self.store.request_grow(endpoint)
        deadline = time.monotonic() + timeout
        while True:
            self.refresh()
            if endpoint in self._map.endpoints and self.config.nodes > asked:
                return self._map.endpoints.index(endpoint)
            if endpoint in self._map.endpoints:
                raise Error(f"the spare at {endpoint} took a dead position instead (no other spare was free)")
            if time.monotonic() > deadline or endpoint not in self.store.grows():
                why = plans.grow_waits(self.store.read_map(), self.store.presence())
                self.store.cancel_grow(endpoint)
                self.refresh()
                if endpoint in self._map.endpoints:
                    return self._map.endpoints.index(endpoint)
                raise Error(f"the spare at {endpoint} was not added within {timeout} s "
                            f"({why or 'see the decider log'})")
            time.sleep(0.02)


class InProcessCluster(StoredMap, LocalCluster):
    """Nodes inside this process (`LocalCluster(..., processes=False)`): the same map, membership
    interface (in memory) and failover decider as node processes, run synchronously; deltas are
    delivered at once after every request. One timer thread closes windows that are due (as a node
    process's loop does); it and the callers take turns under one lock."""

    def __init__(self, *args, **kwargs):
        LocalCluster.__init__(self, *args, **kwargs)
        store = ClusterStore(MemoryMembership(), "/ectable/local")
        token = secrets.token_hex(8)
        endpoints = [f"inproc://ectable-node-{i}" for i in range(self.config.nodes + self._spares)]
        self._hosts = {e: InProcessHost(e, token, store) for e in endpoints}
        store.swap_map(None, Map.initial(self.config.get_config(), endpoints[: self.config.nodes]))
        self.decider = Decider(store, _HostControl(self._hosts, self._deliver), "decider/local", token)
        self.lock = threading.RLock()
        self._stopped = threading.Event()
        self._failure: Exception | None = None  # met by the timer's delivery: raised to the next caller
        self._attach(store)  # reads the map once the decider gave every node its position
        threading.Thread(target=self._timer, name="ectable-windows", daemon=True).start()

    def _timer(self) -> None:
        beat = 0.0
        while not self._stopped.wait(TICK):
            with self.lock:
                if time.monotonic() - beat >= HEARTBEAT:  # as a node process's presence thread reads them
                    beat, writers = time.monotonic(), self.store.writers()
                    for host in self._hosts.values():
                        if host.alive and host.node is not None:
                            host.node.take_writers(writers, beat)
                closed = [host.expire_window() for host in self._hosts.values() if host.alive]
                if any(closed):
                    try:
                        self._deliver()
                    except Exception as exc:  # a bug, not input: the next request raises it
                        self._failure = exc

    def decide(self) -> None:
        """Let the decider act until it has nothing more to change (nodes first report what changed),
        then read the map."""
        with self.lock:
            for host in self._hosts.values():
                if host.alive:
                    host.announce()
            while self.decider.step():
                pass
            StoredMap.refresh(self)

    def refresh(self) -> None:
        """The map once the decider caught up (as it does on its own, in a process of its own)."""
        self.decide()

    def _open_channel(self, endpoint: str) -> InProcessChannel:
        host = self._hosts[endpoint]
        return InProcessChannel(lambda: host if host.alive and host.node is not None else None, self._deliver,
                                self.lock)

    def _host(self, p: int) -> "InProcessHost":
        return self._hosts[self._map.endpoints[p]]

    def mark_dead(self, p: int) -> bool:
        """A request to p failed: if its node is gone, the decider fails it over now."""
        if not self._host(p).alive:
            self.decide()
        return True

    def state(self, p: int) -> str:
        if self._map.states[p] != "dead" and not self._host(p).alive:  # as a parent knows its child exited
            self.mark_dead(p)
        return super().state(p)

    def wait_reconciled(self, p: int) -> None:
        self.decide()

    def wait_replaced(self, p: int) -> None:
        self.decide()

    def kill(self, i: int) -> None:
        """Kill active node i: drop its memory (its presence goes with it)."""
        with self.lock:
            self._host(i).kill()

    def add_spare(self) -> str:
        """One more spare node (its endpoint); the decider puts it in a dead position at once if there is one."""
        with self.lock:
            endpoint = f"inproc://ectable-node-{len(self._hosts)}"
            self._hosts[endpoint] = InProcessHost(endpoint, self.decider.token, self.store)
            self.decide()
            return endpoint

    def node_pids(self) -> list[int]:
        return [os.getpid()] * self.config.nodes

    def node(self, i: int) -> Node | None:
        """The in-process node at position i (for tests and inspection)."""
        host = self._host(i)
        return host.node if host.alive else None

    def close(self) -> None:
        self._stopped.set()
        with self.lock:
            for host in self._hosts.values():
                host.kill()

    def _deliver(self, _host=None) -> None:
        """Carry every node's outgoing deltas to their targets (synchronously, in process)."""
        if self._failure is not None:
            raise self._failure
        hosts = [h for h in self._hosts.values() if h.alive and h.node is not None]
        held = []  # deltas to a node handing its position over: delivered once the map moved it
        while True:
            moved = False
            for host in hosts:
                node = host.node
                for target, header, arrays in node.take_outbox() if node is not None else ():
                    moved = True
                    peer = self._hosts.get(host.endpoints[target]) if target < len(host.endpoints) else None
                    if peer is None or not peer.alive or peer.node is None:
                        node.acked(target, header["seq"])  # moot: a replacement rebuilds from data
                        continue
                    reply, _ = peer.handle(header, arrays)
                    if reply.get("error") == ErrorCode.MOVED:
                        held.append((node, (target, header, arrays)))
                    elif "ack" not in reply:
                        raise Error(f"node {target} refused a delta: {reply}")
                    else:
                        node.acked(target, reply["ack"])
            if not moved:
                for node, delta in held:
                    node.outbox.append(delta)
                for host in hosts:
                    if host.node is not None:
                        host.node.apply_queued()
                return


class InProcessHost(NodeHost):
    """A node inside this process; its presence is kept in the cluster's in-memory store."""

    endpoint_pattern = re.compile(r"^inproc://ectable-node-\d+$")

    def __init__(self, endpoint: str, token: str, store: ClusterStore):
        super().__init__(endpoint, token)
        self.store, self.alive = store, True
        self.lease = store.membership.grant(3600.0)  # it ends when the node is killed
        self.announced: dict | None = None

    def announce(self) -> None:
        info = self.beat()
        if self.alive and info != self.announced:
            self.store.announce(self.endpoint, info, self.lease)
            self.announced = info

    def writers(self) -> set[str]:
        return self.store.writers()

    def kill(self) -> None:
        self.alive, self.node = False, None
        self.store.membership.revoke(self.lease)

    def control(self, msg, arrays=()) -> tuple[dict, list]:
        reply = super().control(msg, arrays)
        if not self.running:  # told to stop (drained): gone as a process would be
            self.kill()
        return reply


class _HostControl:
    """The decider's control calls to in-process hosts, answered at once (and the deltas they made delivered)."""

    def __init__(self, hosts: dict, deliver=lambda: None):
        self.hosts, self.deliver = hosts, deliver

    def keep(self, endpoints) -> None:
        """No channels to close."""

    def call_all(self, requests: dict, timeout: float, again: bool = True) -> dict:
        out = {}
        for endpoint, (header, arrays) in requests.items():
            host = self.hosts.get(endpoint)
            if host is None or not host.alive:
                out[endpoint] = NodeDown(f"{endpoint} is down")
                continue
            reply = host.handle(header, list(arrays))
            out[endpoint] = Error(f"node {endpoint}: {reply[0].get('message')}") if reply[0].get("error") else reply
        self.deliver()
        return out


class ProcessCluster(SeesExits, ZmqStoredMap, LocalCluster):
    """Node processes and failover deciders on 127.0.0.1, with a one-member etcd for their membership
    unless `etcd` names one (`LocalCluster(..., processes=True)`); everything stopped on exit.

    `keys`: CURVE keys by role (`ectable.security`): a directory `ectable keygen` wrote (one file per
    node, decider and client; each process started takes a file of its role, this object client-0's),
    or True for keys made here (with SPARE_KEYS node keys to spare, for spares added later).

    `node_nice`: how much lower the node processes' CPU priority is than this process's (`ectable node --nice`).
    They share this machine with the training loop: on its cores, the loop's work goes first and parity work
    fills the time the loop leaves (0: the same priority)."""

    def __init__(self, *args, keys: str | bool | None = None, etcd: list[str] | None = None, deciders: int = 2,
                 metrics_port: int | None = None, node_nice: int = NODE_NICE, **kwargs):
        LocalCluster.__init__(self, *args, **kwargs)
        if not isinstance(node_nice, int) or not 0 <= node_nice <= 19:
            raise ValueError(f"node_nice must be 0 to 19, got {node_nice!r}")
        self._nice = ["--nice", str(node_nice)] if node_nice else []
        self._metrics_port = metrics_port  # the next node process's Prometheus port (None: no metrics)
        self.metrics: dict[str, int] = {}  # node endpoint -> its metrics port
        self._token = secrets.token_hex(16)  # only this cluster's deciders may re-map, fault or stop its nodes
        self._procs: dict[str, subprocess.Popen] = {}  # endpoint (or decider name) -> the process serving it
        self._deciders: list[str] = []
        self._etcd = None
        self._keys = _keyring(keys, self.config.nodes + self._spares + SPARE_KEYS, deciders)  # name -> [security]
        self.curve = self._keys and self._keys.pop("client-0")  # this object's own key
        try:
            if etcd is None:
                self._etcd = EtcdServer()
                self._etcd.start()
                etcd = self._etcd.endpoints
            self.membership = {"endpoints": list(etcd), "prefix": f"/ectable/{secrets.token_hex(6)}"}
            store = open_store(self.membership)
            nodes = self._spawn_nodes(self.config.nodes + self._spares)  # all announce themselves as spares
            if store.swap_map(None, Map.initial(self.config.get_config(), nodes[: self.config.nodes])) is None:
                raise Error(f"a cluster map exists under {self.membership['prefix']} already")
            self._attach(store, self.curve)
            self._deciders = self._spawn_role("decider", ["decider"], deciders)
            deadline = time.monotonic() + START_TIMEOUT
            while None in self._map.sources:
                if time.monotonic() > deadline:
                    raise Error("nodes did not take their positions in time")
                time.sleep(0.02)
                self.refresh()
        except BaseException:
            self.close()
            raise

    def _spawn_nodes(self, count: int) -> list[str]:
        if self._metrics_port is None:
            return self._spawn_role("node", ["node", "--bind", "tcp://127.0.0.1:0", *self._nice], count)
        ports = list(range(self._metrics_port, self._metrics_port + count))
        self._metrics_port += count
        endpoints = self._spawn_role("node", ["node", "--bind", "tcp://127.0.0.1:0", *self._nice], count,
                                     [["--metrics-port", str(port)] for port in ports])
        self.metrics.update(zip(endpoints, ports))
        return endpoints

    def _spawn_role(self, role: str, command: list[str], count: int, extra: list[list[str]] | None = None) -> list[str]:
        """Start `count` processes of `ectable COMMAND` (the n-th with arguments `extra[n]` more), each with a
        TOML naming the store and, with keys, its own key of `role` (used up: no two processes share one)."""
        with contextlib.ExitStack() as files:
            paths = []
            for _ in range(count):
                data = {"membership": self.membership}
                if self._keys is not None:
                    name = next((n for n in sorted(self._keys) if n.startswith(f"{role}-")), None)
                    if name is None:
                        raise Error(f"no {role} key left for another {role}: make more with `ectable keygen --{role}s`")
                    data["security"] = self._keys.pop(name)
                paths.append(files.enter_context(_secret_toml(data)))
            return self._spawn([[*command, "--config", path, *(extra[n] if extra else [])]
                                for n, path in enumerate(paths)])

    def inject(self, i: int, fault: str, value: float = 1.0) -> None:
        """Arm a fault in active node i: die_before_deltas, die_after_write (SIGKILL at that point),
        duplicate_deltas, reorder_deltas, delay_deltas (value: seconds), hold_deltas_to (value: a
        position whose deltas are not sent until the hold moves; -1 lifts it). A node armed to die may
        die at once, before its answer leaves it: then this returns as soon as its process is gone."""
        endpoint = self._map.endpoints[i]
        try:
            self._control(endpoint, Fault(token=self._token, name=fault, value=value).header(),
                          alive=lambda: not self._exited(endpoint))
        except NodeDown:
            if fault not in DYING or not self._exited(endpoint):
                raise

    def _control(self, endpoint: str, header: dict, alive=None) -> None:
        channel = ZmqChannel(endpoint, self.context, self.curve, alive)
        try:
            reply = channel.call(header, [], 10.0)[0]
        finally:
            channel.close()
        if reply.get("error"):
            raise Error(f"node {endpoint}: {reply.get('message')}")

    def add_spare(self) -> str:
        """Start one more spare node process (its endpoint); returns once the cluster counts it (or used it at
        once)."""
        (endpoint,) = self._spawn_nodes(1)
        deadline = time.monotonic() + START_TIMEOUT
        while endpoint not in self.store.presence() and endpoint not in self._map.endpoints:
            if time.monotonic() > deadline:
                raise Error(f"spare {endpoint} did not announce itself")
            time.sleep(0.02)
            self.refresh()
        self.refresh()
        return endpoint

    def _spawn(self, commands: list[list[str]]) -> list[str]:
        """Start a process of `ectable COMMAND` per command; what each printed after READY (endpoint or name)."""
        env = dict(os.environ, PYTHONUNBUFFERED="1", ECTABLE_CONTROL_TOKEN=self._token)
        started = [subprocess.Popen([sys.executable, "-m", "ectable", *command, "--parent", str(os.getpid())],
                                    stdout=subprocess.PIPE, env=env, text=True) for command in commands]
        deadline = time.monotonic() + START_TIMEOUT
        endpoints = []
        for n, proc in enumerate(started):
            line = _read_line(proc, deadline)
            if not line.startswith("READY "):
                for other in started[n:]:  # the ones not registered yet: close() does not know them
                    _stop(other)
                raise Error(f"{commands[n][0]} process {proc.pid} failed to start: {line!r}")
            endpoints.append(line.split()[1])
            self._procs[endpoints[-1]] = proc
        return endpoints

    def _exited(self, endpoint: str) -> bool:
        """This process started it, so it knows at once when it exits."""
        return self._procs[endpoint].poll() is not None

    def describe(self) -> dict:
        """The cluster's TOML contents for `ectable.connect` (no control token)."""
        data = {"cluster": self.config.get_config(), "membership": self.membership,
                "nodes": {"endpoints": self.endpoints}}
        if self.curve:
            data["security"] = self.curve
        if self.metrics:
            data["metrics"] = {"endpoints": list(self.metrics), "ports": list(self.metrics.values())}
        return data

    # -- processes ---------------------------------------------------------
    def kill(self, i: int) -> None:
        """SIGKILL the process of active node i (the cluster notices on its next use)."""
        proc = self._procs[self._map.endpoints[i]]
        proc.kill()
        proc.wait(10)

    def kill_decider(self, i: int) -> None:
        """SIGKILL failover decider process i."""
        proc = self._procs[self._deciders[i]]
        proc.kill()
        proc.wait(10)

    def acting_decider(self) -> int | None:
        """Which of this cluster's deciders holds the election now (None: none yet)."""
        kv = self.store.membership.get(self.store.decider_key)
        name = kv.value.decode() if kv is not None else None
        return self._deciders.index(name) if name in self._deciders else None

    def node_pids(self) -> list[int]:
        return [self._procs[e].pid for e in self._map.endpoints]

    def decider_pids(self) -> list[int]:
        return [self._procs[name].pid for name in self._deciders]

    def close(self) -> None:
        if self.context is not None:
            self._detach()
        for proc in self._procs.values():
            _stop(proc)
        self._procs = {}
        if self._etcd is not None:
            self._etcd.stop()
            self._etcd = None

    def __del__(self):
        if getattr(self, "_procs", None) or getattr(self, "_etcd", None):
            self.close()


def _keyring(keys: str | bool | None, nodes: int, deciders: int) -> dict | None:
    """{name: [security] section} from `ectable keygen`'s directory, or made now (True), or None."""
    if keys is None or keys is False:
        return None
    if keys is True:
        return security.keygen(nodes, deciders, 1)
    out = {}
    for name in sorted(os.listdir(keys)):
        if name.endswith(".toml"):
            out[name[:-5]] = security.checked(cluster_config.load(os.path.join(keys, name)).get("security"))
    if "client-0" not in out:
        raise Error(f"{keys} holds no client-0.toml: make keys with `ectable keygen --out {keys}`")
    return out


@contextlib.contextmanager
def _secret_toml(data: dict):
    """A temporary TOML file readable only by this user (it may hold CURVE secrets), removed after use."""
    fd, path = tempfile.mkstemp(suffix=".toml")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(cluster_config.dumps(data))
        yield path
    finally:
        os.unlink(path)


def _read_line(proc: subprocess.Popen, deadline: float) -> str:
    import selectors
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(max(0.0, deadline - time.monotonic())):
            return "timed out"
    return proc.stdout.readline().strip()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()  # SIGTERM: the node exits at once (and writes its profile, if asked)
        try:
            proc.wait(2)
        except subprocess.TimeoutExpired:
            proc.kill()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass
    if proc.stdout:
        proc.stdout.close()
