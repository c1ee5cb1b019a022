"""Clusters as clients see them: a map of positions (who holds each, in which state), channels to them.

`ClusterMap` is what a `Client` needs from any cluster. `CoordinatedMap` keeps the map a
coordinator process owns (node processes); `RemoteCluster` is one reached from its TOML
file (`ectable.connect`). Clusters started from Python are in `process/local.py`.
"""
from __future__ import annotations

import time
from collections import deque

import zmq

from .. import config as cluster_config
from ..config import DEADLINE, ClusterConfig
from ..errors import Error, NodeDown, Unavailable
from ..transport import ZmqChannel

MAP_RECHECK = 0.2  # seconds between map reads while a request waits on a node


class ClusterMap:
    """What every cluster offers its clients: the config, each position's state and channel, spares."""

    def __init__(self, config: ClusterConfig):
        self.config = config
        self.redo_log = [deque() for _ in range(config.nodes)]  # clients' writes per position, until durable
        self._failed_over: set = set()

    epoch = 0  # maps that change are kept by a coordinator (see CoordinatedMap)
    rebuilds_itself = False  # True: rebuilding nodes pull their rows; else clients push them in step()

    def refresh(self) -> None:
        """Re-read the map from where it is kept."""

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


class CoordinatedMap:
    """A cluster map kept by a coordinator process: cached here, re-read when a node's reply
    carries a newer epoch, when a request fails, or (while waiting on a node) every MAP_RECHECK seconds."""

    context: zmq.Context | None = None  # until _attach

    def _attach(self, endpoint: str, curve: dict | None) -> None:
        self.context = zmq.Context()
        self.curve = curve
        self.coordinator_endpoint = endpoint
        self._coordinator = ZmqChannel(endpoint, self.context, curve)
        self._channels: dict[str, ZmqChannel] = {}
        self._rebuilding: set[str] = set()  # identities this client saw lack rows before the map said so
        self._checked = 0.0
        self.refresh()

    rebuilds_itself = True

    @property
    def epoch(self) -> int:
        return self._view["epoch"]

    def refresh(self) -> None:
        """Read the map from the coordinator."""
        self._view = self._ask({"op": "map"})
        self._checked = time.monotonic()

    def _ask(self, header: dict) -> dict:
        try:
            reply = self._coordinator.call(header, [], DEADLINE)[0]
        except NodeDown:
            raise Unavailable(f"the coordinator at {self.coordinator_endpoint} does not answer") from None
        if "map" not in reply:
            raise Error(f"coordinator: {reply.get('message')}")
        return reply["map"]

    def _live(self, endpoint: str) -> bool:
        """While a request waits on `endpoint`: is it still a live member (re-reading the map every MAP_RECHECK s)?"""
        if time.monotonic() - self._checked > MAP_RECHECK:
            try:
                self.refresh()
            except Error:
                pass
        view = self._view
        return any(e == endpoint and s != "dead" for e, s in zip(view["endpoints"], view["states"]))

    def channel(self, p: int) -> ZmqChannel:
        endpoint = self._view["endpoints"][p]
        if endpoint not in self._channels:
            self._channels[endpoint] = ZmqChannel(endpoint, self.context, self.curve, lambda: self._live(endpoint))
        return self._channels[endpoint]

    def source(self, p: int) -> str | None:
        return None if self.state(p) == "dead" else self._view["sources"][p]

    def state(self, p: int) -> str:
        state, source = self._view["states"][p], self._view["sources"][p]
        if state == "dead":
            return "dead"
        return "rebuilding" if state == "rebuilding" or source in self._rebuilding else "up"

    def mark_dead(self, p: int) -> None:
        """A request to p failed: the coordinator pings it and fails it over if it is silent."""
        self._view = self._ask({"op": "suspect", "position": p, "source": self._view["sources"][p], **self._evidence(p)})
        self._checked = time.monotonic()

    def _evidence(self, p: int) -> dict:
        return {}

    def mark_rebuilding(self, p: int) -> None:
        self._rebuilding.add(self._view["sources"][p])

    def rebuilt(self, p: int) -> None:
        """Its rebuild is done: trust the map again (it says so within a heartbeat)."""
        self._rebuilding.discard(self._view["sources"][p])

    def replace(self, p: int) -> bool:
        return False  # the coordinator puts spares in place

    def spares_left(self) -> int:
        return self._view["spares"]

    @property
    def endpoints(self) -> list[str]:
        return list(self._view["endpoints"])

    def _detach(self) -> None:
        for channel in [*self._channels.values(), self._coordinator]:
            channel.close()
        self._channels.clear()
        self.context.term()
        self.context = None


class RemoteCluster(CoordinatedMap, ClusterMap):
    """A cluster started elsewhere, reached through its coordinator (`ectable.connect`)."""

    def __init__(self, coordinator: str, curve: dict | None = None):
        self._attach(coordinator, curve)
        ClusterMap.__init__(self, ClusterConfig(**self._view["config"]))

    @classmethod
    def from_file(cls, path: str) -> "RemoteCluster":
        """The cluster a TOML file names ([coordinator] endpoint, [security] keys)."""
        data = cluster_config.load(path)
        if "coordinator" not in data:
            raise Error(f"{path} names no [coordinator] endpoint")
        return cls(data["coordinator"]["endpoint"], data.get("security"))

    def close(self) -> None:
        if self.context is not None:
            self._detach()
