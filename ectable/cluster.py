"""Clusters as clients see them: configuration, a map of positions, channels, fault injection.

`LocalCluster` starts an embedded cluster: real node processes on loopback
(`processes=True`) or nodes inside this process (`processes=False`), same semantics.
`RemoteCluster` (from `ectable.connect`) attaches to nodes started elsewhere.
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections import deque

import zmq

from . import config as cluster_config
from .client import Client
from .errors import Error, NodeDown
from .node import ClusterConfig, Node
from .transport import InProcessChannel, ZmqChannel

DEFAULT_R = {"none": 0, "xor": 1, "rs": 2}
START_TIMEOUT = 60.0


class ClusterMap:
    """What every cluster offers its clients: the config, each position's state and channel, spares."""

    def __init__(self, config: ClusterConfig):
        self.config = config
        self.redo_log = [deque() for _ in range(config.nodes)]  # clients' writes per position, until durable
        self._failed_over: set = set()

    def connect(self) -> Client:
        return Client(self)

    def claim_failover(self, source) -> bool:
        """True for the first client to ask about a dead node's identity: it fails that node over."""
        if source is None or source in self._failed_over:
            return False
        self._failed_over.add(source)
        return True

    def rebuilt(self, p: int) -> None:
        """The node at p reported nothing left to rebuild."""

    def mark_rebuilding(self, p: int) -> None:
        """The node at p was told some of its parity rows are stale and must be rebuilt."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Stop what this object started."""


def _checked_config(nodes, code, k, r, spares, window_rows, window_seconds) -> ClusterConfig:
    if r is None:
        r = DEFAULT_R.get(code, 1)
    if nodes < k + r:
        raise ValueError(f"nodes must be at least k + r = {k + r}, got {nodes}")
    if spares < 0:
        raise ValueError(f"spares must be >= 0, got {spares}")
    config = ClusterConfig(nodes, code, k, r, window_rows, window_seconds)
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
                 processes: bool = True, window_rows: int = 1 << 20, window_seconds: float = 5.0, **options):
        super().__init__(_checked_config(nodes, code, k, r, spares, window_rows, window_seconds))
        self.processes = processes
        self._spares = spares

    def spares_left(self) -> int:
        return self._spares


class InProcessCluster(LocalCluster):
    """Nodes inside this process (`LocalCluster(..., processes=False)`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        n = self.config.nodes
        self._nodes: list[Node | None] = [Node(p, self.config) for p in range(n)]
        self._channels = [InProcessChannel(lambda p=p: self._nodes[p], self._deliver) for p in range(n)]

    def close(self) -> None:
        self._nodes = [None] * len(self._nodes)

    def kill(self, i: int) -> None:
        """Kill active node i: drop its memory."""
        self._nodes[i] = None

    def node_pids(self) -> list[int]:
        return [os.getpid()] * len(self._nodes)

    @property
    def endpoints(self) -> list[str]:
        return [f"inproc://ectable-node-{p}" for p in range(len(self._nodes))]

    def node(self, i: int) -> Node | None:
        """The in-process node at position i (for tests and inspection)."""
        return self._nodes[i]

    def channel(self, p: int) -> InProcessChannel:
        return self._channels[p]

    def source(self, p: int) -> str | None:
        """The identity of the node now at position p (None: dead)."""
        node = self._nodes[p]
        return None if node is None else node.source

    def state(self, p: int) -> str:
        node = self._nodes[p]
        return "dead" if node is None else "rebuilding" if node.rebuilding else "up"

    def mark_dead(self, p: int) -> None:
        self._nodes[p] = None

    def replace(self, p: int) -> bool:
        """Put a spare in dead position p, empty and rebuilding; False when none is left."""
        if self._spares == 0 or self._nodes[p] is not None:
            return False
        self._spares -= 1
        self._nodes[p] = Node(p, self.config, rebuilding=True)
        for node in self._nodes:
            if node is not None and node.position != p:
                node.peer_replaced(p)
        return True

    def _deliver(self, _node=None) -> None:
        """Carry every node's outgoing deltas to their targets (synchronously, in process)."""
        while True:
            moved = False
            for node in self._nodes:
                for target, header, arrays in node.take_outbox() if node is not None else ():
                    moved = True
                    peer = self._nodes[target]
                    if peer is None:
                        node.acked(target, header["seq"])  # moot: a replacement rebuilds from data
                        continue
                    reply, _ = peer.handle(header, arrays)
                    if "ack" not in reply:
                        raise Error(f"node {target} refused a delta: {reply}")
                    node.acked(target, reply["ack"])
            if not moved:
                for node in self._nodes:
                    if node is not None:
                        node.apply_queued()
                return


class _NodeProcess:
    """One node process started by this cluster."""

    def __init__(self, proc: subprocess.Popen, endpoint: str):
        self.proc, self.endpoint = proc, endpoint
        self.source: str | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None


class ProcessCluster(LocalCluster):
    """Node processes on 127.0.0.1 (`LocalCluster(..., processes=True)`), stopped on exit."""

    def __init__(self, *args, curve: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.curve = curve
        self._token = secrets.token_hex(16)  # only this object may re-map or stop its nodes
        self.context = zmq.Context()
        self._procs: list[_NodeProcess] = []
        self._channels: dict[int, ZmqChannel] = {}
        try:
            procs = self._spawn(self.config.nodes + self._spares)
            self._active = procs[: self.config.nodes]
            self._idle = procs[self.config.nodes:]
            self._dead: set[int] = set()
            self._rebuilding: set[int] = set()
            self._fenced: list[str] = []
            for p in range(self.config.nodes):
                self._assign(p, rebuilding=False)
        except BaseException:
            self.close()
            raise

    def _spawn(self, count: int) -> list[_NodeProcess]:
        env = dict(os.environ, PYTHONUNBUFFERED="1", ECTABLE_CONTROL_TOKEN=self._token)
        args = [sys.executable, "-m", "ectable", "node", "--bind", "tcp://127.0.0.1:0", "--parent", str(os.getpid())]
        if self.curve:
            self._keyfile = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
            self._keyfile.write(cluster_config.dumps({"security": self.curve}))
            self._keyfile.close()
            args += ["--config", self._keyfile.name]
        started = [subprocess.Popen(args, stdout=subprocess.PIPE, env=env, text=True) for _ in range(count)]
        for proc in started:
            self._procs.append(_NodeProcess(proc, ""))
        deadline = time.monotonic() + START_TIMEOUT
        for node in self._procs[-count:]:
            line = _read_line(node.proc, deadline)
            if not line.startswith("READY "):
                raise Error(f"node process {node.proc.pid} failed to start: {line!r}")
            node.endpoint = line.split()[1]
        return self._procs[-count:]

    def _map(self) -> dict:
        return {"op": "map", "token": self._token, "config": self.config.get_config(), "endpoints": [n.endpoint for n in self._active],
                "dead": sorted(self._dead), "fenced": self._fenced}

    def _assign(self, p: int, rebuilding: bool) -> None:
        node = self._active[p]
        reply, _ = self._control(node, {**self._map(), "position": p, "rebuilding": rebuilding})
        node.source = reply["source"]
        if rebuilding:
            self._rebuilding.add(p)

    def _control(self, node: _NodeProcess, header: dict):
        channel = ZmqChannel(node.endpoint, self.context, self.curve, node.alive)
        try:
            reply = channel.call(header, [], 10.0)
        finally:
            channel.close()
        if reply[0].get("error"):
            raise Error(f"node {node.endpoint}: {reply[0]}")
        return reply

    def _broadcast(self) -> None:
        header = self._map()
        for p, node in enumerate(self._active):
            if p not in self._dead and node.alive():
                try:
                    self._control(node, header)
                except NodeDown:
                    pass

    # -- the map -----------------------------------------------------------
    def channel(self, p: int) -> ZmqChannel:
        node = self._active[p]
        key = id(node)
        if key not in self._channels:
            self._channels[key] = ZmqChannel(node.endpoint, self.context, self.curve, node.alive)
        return self._channels[key]

    def source(self, p: int) -> str | None:
        return None if self.state(p) == "dead" else self._active[p].source

    def state(self, p: int) -> str:
        if p not in self._dead and not self._active[p].alive():
            self.mark_dead(p)
        return "dead" if p in self._dead else "rebuilding" if p in self._rebuilding else "up"

    def mark_dead(self, p: int) -> None:
        if p in self._dead:
            return
        self._dead.add(p)
        self._rebuilding.discard(p)
        self._fenced.append(self._active[p].source)
        _stop(self._active[p].proc)
        self._broadcast()

    def replace(self, p: int) -> bool:
        if not self._idle or p not in self._dead:
            return False
        self._spares -= 1
        self._active[p] = self._idle.pop(0)
        self._dead.discard(p)
        self._assign(p, rebuilding=True)
        self._broadcast()
        return True

    def rebuilt(self, p: int) -> None:
        self._rebuilding.discard(p)

    def mark_rebuilding(self, p: int) -> None:
        self._rebuilding.add(p)

    # -- processes ---------------------------------------------------------
    def kill(self, i: int) -> None:
        """SIGKILL the process of active node i (the cluster notices on its next use)."""
        self._active[i].proc.kill()
        self._active[i].proc.wait(10)

    def node_pids(self) -> list[int]:
        return [n.proc.pid for n in self._active]

    @property
    def endpoints(self) -> list[str]:
        return [n.endpoint for n in self._active]

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        for node in self._procs:
            _stop(node.proc)
        self._procs = []
        keyfile = getattr(self, "_keyfile", None)
        if keyfile is not None and os.path.exists(keyfile.name):
            os.unlink(keyfile.name)
        if getattr(self, "context", None) is not None:
            self.context.term()
            self.context = None

    def __del__(self):
        if self._procs:
            self.close()


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


class RemoteCluster(ClusterMap):
    """Nodes started elsewhere, named by a cluster TOML file (`ectable.connect`)."""

    def __init__(self, path: str):
        data = cluster_config.load(path)
        super().__init__(ClusterConfig(**data["cluster"]))
        self.endpoints = data["nodes"]["endpoints"]
        self.spare_endpoints = data["nodes"].get("spares", [])
        self.curve = data.get("security")
        self.context = zmq.Context()
        self._channels = [ZmqChannel(e, self.context, self.curve) for e in self.endpoints]
        self._dead: set[int] = set()
        self._rebuilding: set[int] = set()
        self._sources = {}

    def channel(self, p):
        return self._channels[p]

    def source(self, p):
        if p in self._dead:
            return None
        if p not in self._sources:
            try:
                self._sources[p] = self._channels[p].call({"op": "status"}, [], 5.0)[0]["status"]["source"]
            except (NodeDown, KeyError, TypeError):
                self.mark_dead(p)
                return None
        return self._sources[p]

    def state(self, p):
        return "dead" if self.source(p) is None else "rebuilding" if p in self._rebuilding else "up"

    def mark_dead(self, p):
        self._dead.add(p)

    def mark_rebuilding(self, p):
        self._rebuilding.add(p)

    def rebuilt(self, p):
        self._rebuilding.discard(p)

    def replace(self, p):
        return False

    def spares_left(self):
        return len(self.spare_endpoints)  # listed for operators; replacing onto them is the coordinator's job

    def close(self):
        for channel in self._channels:
            channel.close()
        self.context.term()


def connect(path: str) -> Client:
    """A client of the cluster described by the TOML file at `path`; `close()` it when done."""
    client = RemoteCluster(path).connect()
    client.owns_cluster = True
    return client
