"""LocalCluster: an embedded cluster of nodes on this machine."""
from __future__ import annotations

import os
from collections import deque

from .client import Client
from .errors import Error
from .node import ClusterConfig, Node
from .transport import InProcessChannel

DEFAULT_R = {"none": 0, "xor": 1, "rs": 2}


class LocalCluster:
    """`nodes` active nodes plus `spares`, protected by `code` with k data and r parity slots per stripe.

    With `processes=False` the nodes live in this process and `kill(i)` drops
    node i's memory; the semantics are those of a process cluster.
    """

    def __init__(self, nodes: int = 5, code: str = "xor", k: int = 4, r: int | None = None, spares: int = 0,
                 processes: bool = True, window_rows: int = 1 << 20, window_seconds: float = 5.0):
        if r is None:
            r = DEFAULT_R.get(code, 1)
        if nodes < k + r:
            raise ValueError(f"nodes must be at least k + r = {k + r}, got {nodes}")
        if spares < 0:
            raise ValueError(f"spares must be >= 0, got {spares}")
        self.config = ClusterConfig(nodes, code, k, r, window_rows, window_seconds)
        self.config.make_code()  # reject bad codes now
        if processes:
            raise Error("process nodes come with the ZeroMQ transport; use LocalCluster(..., processes=False) for now")
        self.processes = processes
        self._nodes: list[Node | None] = [Node(p, self.config) for p in range(nodes)]
        self._spares = spares
        self.redo_log = [deque() for _ in range(nodes)]  # clients' writes per position, until durable
        self._failed_over: set = set()
        self._channels = [InProcessChannel(lambda p=p: self._nodes[p], self._deliver) for p in range(nodes)]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self._nodes = [None] * len(self._nodes)

    def connect(self) -> Client:
        return Client(self)

    # -- fault injection and inspection -----------------------------------
    def kill(self, i: int) -> None:
        """Kill active node i (in process: drop its memory)."""
        self._nodes[i] = None

    def node_pids(self) -> list[int]:
        return [os.getpid()] * len(self._nodes)

    @property
    def endpoints(self) -> list[str]:
        return [f"inproc://ectable-node-{p}" for p in range(len(self._nodes))]

    def node(self, i: int) -> Node | None:
        """The in-process node at position i (for tests and inspection)."""
        return self._nodes[i]

    # -- the cluster map, as clients see it --------------------------------
    def channel(self, p: int) -> InProcessChannel:
        return self._channels[p]

    def state(self, p: int) -> str:
        node = self._nodes[p]
        return "dead" if node is None else "rebuilding" if node.rebuilding else "up"

    def source(self, p: int) -> str | None:
        """The identity of the node now at position p (None: dead)."""
        node = self._nodes[p]
        return None if node is None else node.source

    def spares_left(self) -> int:
        return self._spares

    def mark_dead(self, p: int) -> None:
        self._nodes[p] = None

    def claim_failover(self, source) -> bool:
        """True for the first client to ask about a dead node's identity: it fails that node over."""
        if source is None or source in self._failed_over:
            return False
        self._failed_over.add(source)
        return True

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
                return
