"""A simulated cluster as its clients see it: the production `StoredMap` over the simulated network."""
from __future__ import annotations

from ...cluster.maps import WRITER_TTL, ClusterMap, SeesExits, StoredMap, WriterFence, writer_patience
from ...cluster.store import ClusterStore
from ...config import ClusterConfig
from ...errors import Error
from ...protocol.messages import Ping
from .network import Network, SimChannel
from .world import World


class SimCluster(SeesExits, StoredMap, ClusterMap):
    """The map in the simulation's store, read by actor `owner` (a client process, or a rebuilder). With
    `sees_exits`, the owner started the node processes, as a `LocalCluster` does: it sees a node's process
    gone at once, and reading a position's state then declares it dead (so a state getter waits)."""

    rebuilds_itself = True  # rebuilding nodes run their own rebuilders

    def __init__(self, world: World, network: Network, store: ClusterStore, owner: str, sees_exits: bool = False):
        self.world, self.network, self.owner, self.sees_exits = world, network, owner, sees_exits
        self._attach(store)
        ClusterMap.__init__(self, ClusterConfig(**self._map.config))

    def _open_channel(self, endpoint: str) -> SimChannel:
        return SimChannel(self.network, self.owner, endpoint, lambda: self._live(endpoint))

    def _exited(self, endpoint: str) -> bool:
        return self.sees_exits and endpoint in self.world.killed  # SIGKILLed, or exited once drained

    def _answers(self, p: int) -> bool:
        try:
            channel = SimChannel(self.network, self.owner, self._map.endpoints[p])
            return channel.call(Ping().header(), [], 0.5)[0].get("position") == p
        except Error:
            return False

    def _keep_writer(self, writer: str) -> int:
        """Registered under a lease kept alive every WRITER_TTL / 6 s until it lapses (as `maps._WriterLease`)."""
        membership = self.store.membership
        lease = membership.grant(WRITER_TTL)
        fence = self._fence = WriterFence(self.world.now, writer_patience(self.config))
        self.store.register_writer(writer, lease)

        def keep():
            sent = self.world.now
            if membership.keepalive(lease):
                fence.kept(sent)
            else:  # it expired: this writer's clients stop writing
                fence.lost = True
            if fence.fenced(self.world.now):
                membership.revoke(lease)
            else:
                self.world.at(WRITER_TTL / 6, keep, self.owner)
        self.world.at(WRITER_TTL / 6, keep, self.owner)
        return lease
