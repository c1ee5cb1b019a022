"""Clusters started from Python: `LocalCluster`, with node processes on loopback and their
coordinator (`processes=True`) or nodes inside this process (`processes=False`), same
semantics; process management and fault injection. Clients' view of a map: `maps.py`.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import time

from .. import config as cluster_config
from ..client import Client
from ..cluster.maps import ClusterMap, CoordinatedMap
from ..config import ClusterConfig
from ..errors import Error
from ..storage.node import Node
from ..transport import InProcessChannel, ZmqChannel

DEFAULT_R = {"none": 0, "xor": 1, "rs": 2}
START_TIMEOUT = 60.0


def _checked_config(nodes, code, k, r, spares, **tuning) -> ClusterConfig:
    if r is None:
        r = DEFAULT_R.get(code, 1)
    if nodes < k + r:
        raise ValueError(f"nodes must be at least k + r = {k + r}, got {nodes}")
    if spares < 0:
        raise ValueError(f"spares must be >= 0, got {spares}")
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
        """`tuning`: window_rows, window_seconds, rebuild_batch, rebuild_share (see ClusterConfig)."""
        super().__init__(_checked_config(nodes, code, k, r, spares, **tuning))
        self.processes = processes
        self._spares = spares

    def spares_left(self) -> int:
        return self._spares

    def connect(self) -> Client:
        """A client of this cluster."""
        return Client(self)


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


class ProcessCluster(CoordinatedMap, LocalCluster):
    """Node processes and a coordinator on 127.0.0.1 (`LocalCluster(..., processes=True)`), stopped on exit."""

    def __init__(self, *args, curve: dict | None = None, **kwargs):
        LocalCluster.__init__(self, *args, **kwargs)
        self._token = secrets.token_hex(16)  # only this cluster's coordinator may re-map or stop its nodes
        self._procs: dict[str, subprocess.Popen] = {}  # endpoint -> the process serving it
        self.curve = curve  # _attach sets it again, with the context, for the map's own connections
        try:
            nodes = self._spawn_nodes(self.config.nodes + self._spares)
            data = {"cluster": self.config.get_config(),
                    "nodes": {"endpoints": nodes[: self.config.nodes], "spares": nodes[self.config.nodes:]}}
            with _secret_toml({**data, "security": curve} if curve else data) as path:
                (endpoint,) = self._spawn(["coordinator", "--config", path, "--bind", "tcp://127.0.0.1:0"], 1)
            self._attach(endpoint, curve)
            deadline = time.monotonic() + START_TIMEOUT
            while None in self._view["sources"]:
                if time.monotonic() > deadline:
                    raise Error("nodes did not take their positions in time")
                time.sleep(0.02)
                self.refresh()
        except BaseException:
            self.close()
            raise

    def _spawn_nodes(self, count: int) -> list[str]:
        with _secret_toml({"security": self.curve} if self.curve else {}) as path:
            return self._spawn(["node", "--bind", "tcp://127.0.0.1:0", "--config", path], count)

    def inject(self, i: int, fault: str, value: float = 1.0) -> None:
        """Arm a fault in active node i: die_before_deltas, die_after_write (SIGKILL at that point),
        duplicate_deltas, reorder_deltas, delay_deltas (value: seconds), hold_deltas_to (value: a
        position whose deltas are never sent)."""
        self._control(self._view["endpoints"][i], {"op": "fault", "token": self._token, "name": fault, "value": value})

    def _control(self, endpoint: str, header: dict) -> None:
        channel = ZmqChannel(endpoint, self.context, self.curve)
        try:
            reply = channel.call(header, [], 10.0)[0]
        finally:
            channel.close()
        if reply.get("error"):
            raise Error(f"node {endpoint}: {reply.get('message')}")

    def add_spare(self) -> None:
        """Start one more spare node process and register it with the coordinator."""
        (endpoint,) = self._spawn_nodes(1)
        # a node with no position only learns where the coordinator is; the coordinator maps it later
        self._control(endpoint, {"op": "map", "token": self._token, "endpoints": [],
                                 "coordinator": self.coordinator_endpoint})
        spares, deadline = self._view["spares"], time.monotonic() + START_TIMEOUT
        while self._view["spares"] <= spares and endpoint not in self._view["endpoints"]:  # it registered, or
            # the coordinator put it straight into a dead position
            if time.monotonic() > deadline:
                raise Error(f"spare {endpoint} did not register with the coordinator")
            time.sleep(0.02)
            self.refresh()

    def _spawn(self, command: list[str], count: int) -> list[str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1", ECTABLE_CONTROL_TOKEN=self._token)
        args = [sys.executable, "-m", "ectable", *command, "--parent", str(os.getpid())]
        started = [subprocess.Popen(args, stdout=subprocess.PIPE, env=env, text=True) for _ in range(count)]
        deadline = time.monotonic() + START_TIMEOUT
        endpoints = []
        for n, proc in enumerate(started):
            line = _read_line(proc, deadline)
            if not line.startswith("READY "):
                for other in started[n:]:  # the ones not registered yet: close() does not know them
                    _stop(other)
                raise Error(f"{command[0]} process {proc.pid} failed to start: {line!r}")
            endpoints.append(line.split()[1])
            self._procs[endpoints[-1]] = proc
        return endpoints

    def _exited(self, endpoint: str) -> bool:
        """This process started it, so it knows at once when it exits."""
        return self._procs[endpoint].poll() is not None

    def _live(self, endpoint: str) -> bool:
        """Not exited, and not declared dead by the coordinator."""
        return not self._exited(endpoint) and super()._live(endpoint)

    def state(self, p: int) -> str:
        if self._view["states"][p] != "dead" and self._exited(self._view["endpoints"][p]):
            self.mark_dead(p)
        return super().state(p)

    def _evidence(self, p: int) -> dict:
        """The process at p is gone (this cluster is its parent): the coordinator need not ping it."""
        return {"token": self._token, "exited": True} if self._exited(self._view["endpoints"][p]) else {}

    def describe(self) -> dict:
        """The cluster's TOML contents for `ectable.connect` (no control token)."""
        data = {"cluster": self.config.get_config(), "coordinator": {"endpoint": self.coordinator_endpoint},
                "nodes": {"endpoints": self.endpoints}}
        if self.curve:
            data["security"] = self.curve
        return data

    # -- processes ---------------------------------------------------------
    def kill(self, i: int) -> None:
        """SIGKILL the process of active node i (the cluster notices on its next use)."""
        proc = self._procs[self._view["endpoints"][i]]
        proc.kill()
        proc.wait(10)

    def node_pids(self) -> list[int]:
        return [self._procs[e].pid for e in self._view["endpoints"]]

    def close(self) -> None:
        if self.context is not None:
            self._detach()
        for node in self._procs.values():
            _stop(node)
        self._procs = {}

    def __del__(self):
        if getattr(self, "_procs", None):
            self.close()


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
