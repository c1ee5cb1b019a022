"""The cluster's keys in a membership store: the map, node presence and the decider's election.

    <prefix>/map              the cluster map (`Map`), changed by compare-and-swap only
    <prefix>/alive/<endpoint> a node process's presence, under its lease: who it is, where it is,
                              whether it rebuilds; gone when the process dies (its lease expires)
    <prefix>/decider          the failover decider that acts now, under its lease
    <prefix>/writers/<id>     a writer (a process's cluster object whose clients write), under its
                              lease: a spare waits for every live writer to replay before serving
    <prefix>/tables/<name>    a table's definition, written once by the first client to create it
    <prefix>/drain/<endpoint> an operator's request that the node at an endpoint leave the cluster
                              (`ectable node drain`); gone once it has
    <prefix>/grow/<endpoint>  an operator's request that the spare at an endpoint be added as one more
                              position (`ectable node add`); gone once it is
"""
from __future__ import annotations

import msgpack

from ..membership import Compare, Delete, Membership, Put
from .map import Map


class ClusterStore:
    def __init__(self, membership: Membership, prefix: str):
        self.membership, self.prefix = membership, prefix.rstrip("/")
        self.map_key = f"{self.prefix}/map"
        self.alive_prefix = f"{self.prefix}/alive/"
        self.decider_key = f"{self.prefix}/decider"
        self.writers_prefix = f"{self.prefix}/writers/"
        self.tables_prefix = f"{self.prefix}/tables/"
        self.dropping_prefix = f"{self.prefix}/dropping/"
        self.dropped_prefix = f"{self.prefix}/dropped/"
        self.tables_epoch_key = f"{self.prefix}/tables-epoch"  # rewritten by every create and drop
        self.drain_prefix = f"{self.prefix}/drain/"
        self.grow_prefix = f"{self.prefix}/grow/"

    # -- the map -----------------------------------------------------------
    def read_map(self) -> Map | None:
        kv = self.membership.get(self.map_key)
        return None if kv is None else Map.decode(kv.value, kv.mod_revision)

    def swap_map(self, old: Map | None, new: Map, guard=()) -> Map | None:
        """Write `new` if the map is still `old` (None: absent) and every `guard` holds; the map as
        written (its epoch set), or None if another writer came first."""
        cond = [Compare.unchanged(self.map_key, old.epoch) if old is not None else Compare.absent(self.map_key), *guard]
        ok, revision = self.membership.txn(cond, [Put(self.map_key, new.encode())])
        return new.replace(epoch=revision) if ok else None

    # -- presence ----------------------------------------------------------
    def presence(self) -> dict[str, dict]:
        """{endpoint: what its node announced} for every node process alive now."""
        kvs, _ = self.membership.range(self.alive_prefix)
        out = {}
        for kv in kvs:
            try:
                info = msgpack.unpackb(kv.value, raw=False)
            except Exception:  # not ours: ignore
                continue
            if isinstance(info, dict):
                out[kv.key[len(self.alive_prefix):]] = info
        return out

    def announce(self, endpoint: str, info: dict, lease: int) -> None:
        self.membership.put(self.alive_prefix + endpoint, msgpack.packb(info, use_bin_type=True), lease)

    def withdraw(self, endpoint: str) -> None:
        """The node at `endpoint` is known to be dead (its parent saw it exit): fail it over now."""
        self.membership.txn([], [Delete(self.alive_prefix + endpoint)])

    # -- drains ------------------------------------------------------------
    def request_drain(self, endpoint: str) -> None:
        """Ask that the node at `endpoint` leave the cluster (its position handed to a spare first)."""
        self.membership.put(self.drain_prefix + endpoint, b"")

    def cancel_drain(self, endpoint: str, m: Map | None = None) -> bool:
        """Withdraw a drain request; with `m`, only while the map is still `m` (a decider that acted on the request
        changed it); whether it was withdrawn."""
        guard = [] if m is None else [Compare.unchanged(self.map_key, m.epoch)]
        ok, _ = self.membership.txn(guard, [Delete(self.drain_prefix + endpoint)])
        return ok

    def drains(self) -> dict[str, int]:
        """{endpoint whose node is asked to leave: the request's revision}."""
        return self._requests(self.drain_prefix)

    def drain_guard(self, endpoint: str, revision: int) -> list:
        """A comparison that holds while the drain request for `endpoint` stands as read (at `revision`)."""
        return [Compare.unchanged(self.drain_prefix + endpoint, revision)]

    # -- grows -------------------------------------------------------------
    def request_grow(self, endpoint: str) -> None:
        """Ask that the spare at `endpoint` be added as one more position (the cluster laid out again)."""
        self.membership.put(self.grow_prefix + endpoint, b"")

    def cancel_grow(self, endpoint: str) -> bool:
        ok, _ = self.membership.txn([], [Delete(self.grow_prefix + endpoint)])
        return ok

    def grows(self) -> dict[str, int]:
        """{endpoint of a spare to add as a position: the request's revision}."""
        return self._requests(self.grow_prefix)

    def grow_guard(self, endpoint: str, revision: int) -> list:
        return [Compare.unchanged(self.grow_prefix + endpoint, revision)]

    def _requests(self, prefix: str) -> dict[str, int]:
        kvs, _ = self.membership.range(prefix)
        return {kv.key[len(prefix):]: kv.mod_revision for kv in kvs}

    # -- writers -----------------------------------------------------------
    def register_writer(self, writer: str, lease: int) -> None:
        self.membership.put(self.writers_prefix + writer, b"", lease)

    def moves_nodes(self, events) -> bool:
        """Whether watch events (of the whole prefix) change what a node follows: the map or the writers."""
        return any(e.key == self.map_key or e.key.startswith(self.writers_prefix) for e in events)

    def writers(self) -> set[str]:
        """The writers alive now."""
        kvs, _ = self.membership.range(self.writers_prefix)
        return {kv.key[len(self.writers_prefix):] for kv in kvs}

    # -- tables ------------------------------------------------------------
    def claim_table(self, config: dict) -> dict | None:
        """The definition of table `config["name"]` that holds: `config` if no client claimed the name before
        (one transaction: of racing claims exactly one wins), else the first claim's; None if the name is
        being dropped or was dropped (a dropped table's name is not used again: clients may still hold its
        definition, and redo logs its writes)."""
        name = config["name"]
        key, marks = self.tables_prefix + name, [self.dropping_prefix + name, self.dropped_prefix + name]
        ok, _ = self.membership.txn([Compare.absent(key), *map(Compare.absent, marks)],
                                    [Put(key, msgpack.packb(config, use_bin_type=True)), Put(self.tables_epoch_key, b"")])
        if ok:
            return config
        if any(self.membership.get(mark) is not None for mark in marks):
            return None
        kv = self.membership.get(key)
        return config if kv is None else msgpack.unpackb(kv.value, raw=False)

    def drop_table(self, name: str, owner: str) -> bool:
        """Mark table `name` as being dropped by writer `owner` (one transaction: of racing drops exactly one
        wins, and no create claims the name again); False if there is no such table, or a live writer drops
        it now. A drop whose writer died half way is taken over."""
        key, mark = self.tables_prefix + name, self.dropping_prefix + name
        kv = self.membership.get(key)
        if kv is None:
            return False
        marked = self.membership.get(mark)
        if marked is None:
            cond = [Compare.unchanged(key, kv.mod_revision), Compare.absent(mark)]
        elif marked.value.decode(errors="replace") in self.writers():
            return False
        else:
            cond = [Compare.unchanged(mark, marked.mod_revision)]
        ok, _ = self.membership.txn(cond, [Put(mark, owner.encode()), Put(self.tables_epoch_key, b"")])
        return ok

    def table_dropped(self, name: str) -> None:
        """Table `name` is gone from every node (its name stays taken)."""
        self.membership.txn([], [Delete(self.tables_prefix + name), Delete(self.dropping_prefix + name),
                                 Put(self.dropped_prefix + name, b""), Put(self.tables_epoch_key, b"")])

    def tables(self) -> tuple[list[dict], list[str], list]:
        """The tables claimed and not being dropped; the names dropped or being dropped; and a comparison that
        holds while both stay so (a spare is installed with them only if no create or drop came between)."""
        kv = self.membership.get(self.tables_epoch_key)
        guard = [Compare.absent(self.tables_epoch_key) if kv is None else
                 Compare.unchanged(self.tables_epoch_key, kv.mod_revision)]
        gone = sorted({kv.key[len(prefix):] for prefix in (self.dropping_prefix, self.dropped_prefix)
                       for kv in self.membership.range(prefix)[0]})
        specs = [msgpack.unpackb(kv.value, raw=False) for kv in self.membership.range(self.tables_prefix)[0]
                 if kv.key[len(self.tables_prefix):] not in gone]
        return specs, gone, guard

    # -- election ----------------------------------------------------------
    def campaign(self, name: str, lease: int) -> bool:
        """Become the decider if there is none; True if `name` is the decider now."""
        ok, _ = self.membership.txn([Compare.absent(self.decider_key)], [Put(self.decider_key, name.encode(), lease)])
        if ok:
            return True
        kv = self.membership.get(self.decider_key)
        return kv is not None and kv.value == name.encode()

    def leader_guard(self, name: str) -> list:
        """A comparison that holds only while `name` is the decider (every map change it makes carries it)."""
        return [Compare(self.decider_key, "value", name.encode())]


def own_connection(store: ClusterStore) -> ClusterStore:
    """The same cluster store over a new connection (for a thread of its own), where its backend has connections."""
    endpoints = getattr(store.membership, "endpoints", None)
    if not endpoints:
        return store
    from ..membership.etcd import EtcdMembership
    return ClusterStore(EtcdMembership(endpoints), store.prefix)


def open_store(section: dict) -> ClusterStore:
    """The cluster store a TOML `[membership]` section names: etcd `endpoints`, key `prefix`."""
    from ..membership.etcd import EtcdMembership
    return ClusterStore(EtcdMembership(list(section["endpoints"])), section["prefix"])
