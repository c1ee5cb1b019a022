"""Clusters as clients see them: a map of positions (who holds each, in which state), channels to them.

`ClusterMap` is what a `Client` needs from any cluster. `StoredMap` follows the map kept in
the cluster's membership store (node processes); `RemoteCluster` is one reached from its TOML
file (`ectable.connect`). Clusters started from Python are in `process/local.py`.
"""
from __future__ import annotations

import threading
from collections import deque

import zmq

from .. import clock
from .. import config as cluster_config, security
from ..config import ClusterConfig
from ..errors import Error, Unavailable
from ..membership import MembershipUnavailable
from ..protocol.messages import Ping
from ..transport import ZmqChannel
from . import plans
from .store import ClusterStore, open_store, own_connection

MAP_RECHECK = 0.2  # seconds between map reads while a request waits on a node
DEATH_WAIT = 10.0  # how long a client waits for a node it could not reach to be failed over
WRITER_TTL = 3.0  # a writer whose lease was not kept alive this long is not waited for by replacements


class ClusterMap:
    """What every cluster offers its clients: the config, each position's state and channel, spares."""

    def __init__(self, config: ClusterConfig):
        self.config = config
        self.redo_log = [deque() for _ in range(config.nodes)]  # clients' writes per position, until durable
        self.replays: dict[int, list] = {}  # position -> writes taken from a dead node's log, not replayed yet
        self.cut_off: list = []  # (logged write, whether surely lost) left when a grow began the logs again
        self._failed_over: set = set()
        self._checked_in: set = set()
        self.taking: set[int] = set()  # positions whose redo log a failover is taking now

    epoch = 0  # maps that change are kept in a membership store (see StoredMap)
    rebuilds_itself = False  # True: rebuilding nodes pull their rows; else clients push them in step()

    def refresh(self) -> None:
        """Re-read the map from where it is kept."""

    def relaid(self, config: ClusterConfig) -> None:
        """The map lays the cluster out over more positions (a grow): clients plan by `config` from now on. The
        redo logs begin again: the grow took place once every node was quiet (each write in parity) and no writer
        owed a late replay (`plans.growable`), and nothing was written since. Writes still logged are kept in
        `cut_off` for their clients to judge (`Client._cut_off`): a writer idle past a node's `LATE_WAIT` may
        have lost some."""
        self.config = config
        self.cut_off += [(e, False) for log in self.redo_log for e in log if e.seq is not None and not e.replayed]
        self.cut_off += [(e, True) for log in self.replays.values() for e in log]  # taken, never replayed
        self.redo_log[:] = [deque() for _ in range(config.nodes)]
        self.replays.clear()

    def take_cut_off(self, cid) -> list:
        """The (write, surely lost) pairs of client `cid` in `cut_off`, taken out of it."""
        mine = [x for x in self.cut_off if x[0].cid == cid]
        if mine:
            self.cut_off[:] = [x for x in self.cut_off if x[0].cid != cid]
        return mine

    def claim_failover(self, source) -> bool:
        """True for the first client to ask about a dead node's identity: it fails that node over."""
        if source is None or source in self._failed_over:
            return False
        self._failed_over.add(source)
        return True

    def claim_checkin(self, source) -> bool:
        """True for the first client to see a replacement `source`: it replays this cluster object's
        writes into it (or tells it there are none)."""
        if source is None or source in self._checked_in:
            return False
        self._checked_in.add(source)
        return True

    writer = "local"  # what names this object's writes to replacements (see StoredMap.writer_id)

    def writer_id(self) -> str:
        """This object's name as a writer, registered before its first write."""
        return self.writer

    def writer_lapsed(self, writer: str) -> bool:
        """Whether `writer` (a name this object's `writer_id` gave) may no longer write: its lease lapsed, so
        nodes may forget its clients' marks. Here, with no lease, never."""
        return False

    def is_writer(self) -> bool:
        """Whether this object is a writer already (registered when a client of it first wrote): only
        writers are waited for by replacements, so only they check in with one."""
        return self.writer is not None

    def rebuilt(self, p: int) -> None:
        """The node at p reported nothing left to rebuild."""

    def claim_table(self, config: dict) -> dict | None:
        """The definition that holds for table `config["name"]`: the first a client claimed (see
        `ClusterStore.claim_table`; None while the name is being dropped); here, with no store to agree
        in, `config`."""
        return config

    def drop_table(self, name: str) -> bool:
        """Claim the drop of table `name` for this writer (see `ClusterStore.drop_table`); here, with no
        store, True."""
        return True

    def table_dropped(self, name: str) -> None:
        """Table `name` is gone from every node."""

    def last_source(self, p: int) -> str | None:
        """The identity that held position p last, dead or alive."""
        return None

    def draining(self) -> set[str]:
        """Endpoints whose nodes an operator asked to leave (`ectable node drain`), as the store says now."""
        return set()

    def settled_marks(self, source):
        """What survivors' parity held of dead `source`'s writes when it was reconciled (`Map.settled_marks`),
        or None if not recorded."""
        return None

    def applied_before_grow(self, source, cid: str, cseq: int) -> bool | None:
        """Whether node identity `source`, retired by a grow, applied write `cseq` of client `cid`
        (`Map.applied_before_grow`; None: not recorded)."""
        return None

    def failing(self) -> tuple:
        """((position, identity), ...): dead positions whose stripes' parity holders may not agree yet (the decider
        has not reconciled them), as the map read last says."""
        return ()

    def wait_reconciled(self, p: int) -> None:
        """Return once the parity holders of dead position p's stripes agree (clients replay after)."""

    def wait_replaced(self, p: int) -> None:
        """Return once a spare stands at dead position p, or none is left."""

    def mark_rebuilding(self, p: int) -> None:
        """The node at p was told some of its parity rows are stale and must be rebuilt."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Stop what this object started."""


def read_cluster(store: ClusterStore) -> tuple:
    """(the stored map or None, how many spares wait for a position (none asked to leave), the endpoints of live
    node processes)."""
    m = store.read_map()
    presence = store.presence()
    if m is None:
        return None, 0, frozenset(presence)
    free = plans.free_spares(m, presence)
    if free:  # the drain requests are read only when there is a spare they may take out of the count
        free = plans.free_spares(m, presence, store.drains())
    spares = len(free) + len(plans.arriving(m, presence))
    return m, spares, frozenset(presence)


class StoredMap:
    """A cluster map kept in the cluster's membership store: cached here, re-read when a node's reply
    carries a newer epoch, when a request fails, or (while waiting on a node) every MAP_RECHECK seconds."""

    def _attach(self, store: ClusterStore) -> None:
        self.store = store
        self._channels: dict = {}
        self._rebuilding: set[str] = set()  # identities this client saw lack rows before the map said so
        self._checked, self._read_at = 0.0, float("-inf")
        self.refresh()

    @property
    def epoch(self) -> int:
        return self._map.epoch

    def refresh(self) -> None:
        """Read the map (and how many spares wait) from the store."""
        began = clock.monotonic()
        try:
            read = read_cluster(self.store)
        except MembershipUnavailable as exc:
            raise Unavailable(f"the cluster's membership store does not answer: {exc}") from None
        if read[0] is None:
            raise Unavailable(f"no cluster map under {self.store.prefix!r} in the membership store")
        self._checked = clock.monotonic()
        self._adopt(began, *read)

    def _adopt(self, began: float, m, spares: int, present: frozenset) -> None:
        """Take what a read begun at `began` found, unless a read begun later was taken already."""
        if began < self._read_at:
            return
        self._read_at, self._map, self._spares, self._present = began, m, spares, present
        config = getattr(self, "config", None)  # (none yet while a cluster reached remotely reads its first map)
        if config is not None and m.config.get("nodes") != config.nodes:
            self.relaid(ClusterConfig(**m.config))
        for endpoint in self._channels.keys() - set(m.endpoints):  # a node replaced: its sockets are freed
            self._channels.pop(endpoint).close()

    def claim_table(self, config: dict) -> dict | None:
        return self._stored(self.store.claim_table, config)

    def drop_table(self, name: str) -> bool:
        return self._stored(self.store.drop_table, name, self.writer_id())

    def table_dropped(self, name: str) -> None:
        self._stored(self.store.table_dropped, name)

    def draining(self) -> set[str]:
        return set(self._stored(self.store.drains))

    @staticmethod
    def _stored(call, *args):
        try:
            return call(*args)
        except MembershipUnavailable as exc:
            raise Unavailable(f"the cluster's membership store does not answer: {exc}") from None

    def _recheck(self, every: float = MAP_RECHECK) -> None:
        """The map as read again if `every` seconds passed since the last read."""
        if clock.monotonic() - self._checked > every:
            try:
                self.refresh()
            except Error:
                pass

    def _live(self, endpoint: str) -> bool:
        """While a request waits on `endpoint`: is it still a live member (re-reading the map every MAP_RECHECK s)?"""
        self._recheck()
        return self._map.position_of(endpoint) is not None

    def channel(self, p: int):
        endpoint = self._map.endpoints[p]
        if endpoint not in self._channels:
            self._channels[endpoint] = self._open_channel(endpoint)
        return self._channels[endpoint]

    def _open_channel(self, endpoint: str):
        raise NotImplementedError

    def source(self, p: int) -> str | None:
        return None if self.state(p) == "dead" else self._map.sources[p]

    def known(self) -> frozenset:
        """The node identities the map read last names: at a position, or fenced."""
        m = self._map
        if self._known[0] is not m:
            self._known = (m, frozenset(m.sources) | frozenset(m.fenced))
        return self._known[1]

    _known: tuple = (None, frozenset())  # (a map, the identities it names)

    def failing(self) -> tuple:
        return self._map.failing

    def state(self, p: int) -> str:
        state, source = self._map.states[p], self._map.sources[p]
        if state == "dead":
            return "dead"
        return "rebuilding" if state == "rebuilding" or source in self._rebuilding else "up"

    def mark_dead(self, p: int) -> bool:
        """A request to p failed: wait (bounded) until the decider failed it over, or it answers again. False
        when neither happened and its node is alive for the cluster (its presence is kept alive in the store),
        but this client cannot reach it: a partition between the two."""
        source = self._map.sources[p]
        self._evidence(p)
        deadline = clock.monotonic() + DEATH_WAIT
        while self._map.sources[p] == source and self._map.states[p] != "dead" and clock.monotonic() < deadline:
            clock.sleep(MAP_RECHECK / 4)
            self._recheck(MAP_RECHECK / 4)  # waiting on the decider: read as often as it sleeps
            if self._answers(p):
                return True
        m = self._map
        return m.sources[p] != source or m.states[p] == "dead" or m.endpoints[p] not in self._present

    def _answers(self, p: int) -> bool:
        """Whether the node at p answers a ping now."""
        return False

    def _evidence(self, p: int) -> None:
        """Tell the store what this client knows of p's death (the owner of its process knows it exited)."""

    def wait_reconciled(self, p: int, timeout: float = DEATH_WAIT) -> None:
        """Wait (bounded) until the decider reconciled the parity of dead position p's stripes."""
        deadline = clock.monotonic() + timeout
        while any(q == p for q, _ in self._map.failing) and clock.monotonic() < deadline:
            clock.sleep(MAP_RECHECK / 4)
            self._recheck(MAP_RECHECK / 4)  # waiting on the decider: read as often as it sleeps

    def wait_replaced(self, p: int, timeout: float = DEATH_WAIT) -> None:
        """Wait (bounded) until a spare stands at dead position p, or none is left."""
        deadline = clock.monotonic() + timeout
        while self._map.states[p] == "dead" and self._spares and clock.monotonic() < deadline:
            clock.sleep(MAP_RECHECK / 4)
            self._recheck(MAP_RECHECK / 4)  # waiting on the decider: read as often as it sleeps

    def mark_rebuilding(self, p: int) -> None:
        self._rebuilding.add(self._map.sources[p])

    def settled_marks(self, source):
        return self._map.settled_marks(source)

    def applied_before_grow(self, source, cid: str, cseq: int) -> bool | None:
        return self._map.applied_before_grow(source, cid, cseq)

    def last_source(self, p: int) -> str | None:
        return self._map.sources[p]

    writer: str | None = None
    _writer_lease: int | None = None
    _fence: "WriterFence | None" = None  # when the writer's lease was last known alive (kept by a keeper)

    def writer_id(self) -> str:
        """Registered in the store under a lease the first time (and again, under a new name, once that
        lease lapsed): a replacement node then waits for this object's replays (its clients' writes the dead
        node applied) before serving anyone."""
        if self.writer is None or self.writer_lapsed(self.writer):
            writer = f"{clock.token_hex(8)}"
            self._writer_lease = self._keep_writer(writer)
            self.writer = writer
        return self.writer

    def writer_lapsed(self, writer: str) -> bool:
        return writer != self.writer or (self._fence is not None and self._fence.fenced(clock.monotonic()))

    def _keep_writer(self, writer: str) -> int:
        """Register `writer` under a lease that lasts as long as this object; the lease."""
        lease = self.store.membership.grant(float("inf"))  # in process: the writer lives as long as the nodes
        self.store.register_writer(writer, lease)
        return lease

    def rebuilt(self, p: int) -> None:
        """Its rebuild is done: trust the map again (its presence says so within a keep-alive)."""
        self._rebuilding.discard(self._map.sources[p])

    def spares_left(self) -> int:
        return self._spares

    @property
    def endpoints(self) -> list[str]:
        return list(self._map.endpoints)



class SeesExits:
    """For a map object whose owner started the node processes and so knows at once when one exits
    (`_exited`): reading a position's state declares its gone node dead (the read may then wait), its
    presence is withdrawn without waiting for its lease, and no request waits on it. Mixed in before a
    `StoredMap`."""

    def _exited(self, endpoint: str) -> bool:
        raise NotImplementedError

    def _live(self, endpoint: str) -> bool:
        return not self._exited(endpoint) and super()._live(endpoint)

    def _answers(self, p: int) -> bool:
        return not self._exited(self._map.endpoints[p]) and super()._answers(p)

    def state(self, p: int) -> str:
        if self._map.states[p] != "dead" and self._exited(self._map.endpoints[p]):
            self.mark_dead(p)
        return super().state(p)

    def _evidence(self, p: int) -> None:
        if self._exited(self._map.endpoints[p]):
            self.store.withdraw(self._map.endpoints[p])


class ZmqStoredMap(StoredMap):
    """A stored map whose nodes are reached over ZeroMQ (node processes, here or elsewhere)."""

    context: zmq.Context | None = None  # until _attach
    rebuilds_itself = True  # a rebuilding node process pulls its rows itself

    def _attach(self, store: ClusterStore, curve: dict | None = None) -> None:
        self.context = zmq.Context()
        self.curve = curve
        super()._attach(store)

    def _open_channel(self, endpoint: str) -> ZmqChannel:
        return ZmqChannel(endpoint, self.context, self.curve, lambda: self._live(endpoint))

    def _recheck(self, every: float = MAP_RECHECK) -> None:
        """While a request waits: the map as the background reader last read it (asked for again every `every`
        s), so a request never waits on the store (when the store is away, training goes on)."""
        if self._reader is None:
            self._reader = _MapReader(self.store)
            self._reader.start()
        read = self._reader.take()
        if read is not None and read[1] is not None:
            self._adopt(*read)
        if clock.monotonic() - self._checked > every:
            self._checked = clock.monotonic()
            self._reader.ask()

    def _keep_writer(self, writer: str) -> int:
        """A thread keeps the lease alive (over a connection of its own) until this object closes or the
        lease lapses."""
        if self._keeper is not None:  # the writer before, whose lease lapsed
            self._keeper.close()
        keeper = _WriterLease(self.store, writer, writer_patience(self.config))
        lease = keeper.lease
        self._keeper, self._fence = keeper, keeper.fence
        keeper.start()
        return lease

    def _answers(self, p: int) -> bool:
        try:
            channel = ZmqChannel(self._map.endpoints[p], self.context, self.curve, connect_timeout=0.2)
            try:
                return channel.call(Ping().header(), [], 0.5)[0].get("position") == p
            finally:
                channel.close()
        except Error:
            return False

    _keeper = None
    _reader = None

    def _detach(self) -> None:
        if self._keeper is not None:
            self._keeper.close()
            self._keeper = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self.store.membership.close()
        self.context.term()
        self.context = None


class RemoteCluster(ZmqStoredMap, ClusterMap):
    """A cluster started elsewhere, reached through its membership store (`ectable.connect`)."""

    def __init__(self, membership: dict, curve: dict | None = None):
        self._attach(open_store(membership), curve)
        try:
            ClusterMap.__init__(self, ClusterConfig(**self._map.config))
        except BaseException:
            self._detach()
            raise

    @classmethod
    def from_file(cls, path: str) -> "RemoteCluster":
        """The cluster a TOML file names ([membership] endpoints and prefix, [security] keys)."""
        data = cluster_config.load(path)
        if "membership" not in data:
            raise Error(f"{path} names no [membership] store")
        try:
            return cls(data["membership"], security.checked(data.get("security")))
        except ValueError as exc:
            raise Error(f"{path}: {exc}") from None

    def close(self) -> None:
        if self.context is not None:
            self._detach()


def writer_patience(config: ClusterConfig) -> float:
    """How long a writer whose keep-alives get no answer goes on writing: its lease's time, plus half the
    grace nodes give a writer gone from the store (an answer that the lease expired stops it at once)."""
    return WRITER_TTL + config.writer_grace / 2


class WriterFence:
    """Whether a writer may still write: not once its lease expired, nor once no keep-alive succeeded for
    `patience` seconds (the store may have expired it meanwhile, and nodes forget its clients' marks
    `writer_grace` after they last saw it: `patience` must stay well below WRITER_TTL + writer_grace)."""

    def __init__(self, since: float, patience: float):
        self.alive_at = since  # when the last keep-alive that succeeded was sent
        self.patience = patience
        self.lost = False

    def kept(self, sent: float) -> None:
        """A keep-alive sent at `sent` found the lease alive."""
        self.alive_at = max(self.alive_at, sent)

    def fenced(self, now: float) -> bool:
        """Whether the writer must stop writing (for good, once true)."""
        self.lost = self.lost or now - self.alive_at > self.patience
        return self.lost


class _MapReader(threading.Thread):
    """Reads the map (over a store connection of its own) when asked; `take()` gives the last read once, with
    when it began."""

    def __init__(self, store: ClusterStore):
        super().__init__(name="map-reader", daemon=True)
        self.store = own_connection(store)
        self.own = self.store is not store
        self.wanted, self.closed = threading.Event(), False
        self.last: tuple | None = None
        self.lock = threading.Lock()

    def ask(self) -> None:
        self.wanted.set()

    def take(self) -> tuple:
        with self.lock:
            last, self.last = self.last, None
        return last

    def run(self) -> None:
        while not self.closed:
            self.wanted.wait()
            self.wanted.clear()
            if self.closed:
                break
            began = clock.monotonic()
            try:
                read = read_cluster(self.store)
            except MembershipUnavailable:
                continue  # asked again while the store is away
            with self.lock:
                self.last = (began, *read)
        if self.own:
            self.store.membership.close()

    def close(self) -> None:
        self.closed = True
        self.wanted.set()
        self.join(10)


class _WriterLease(threading.Thread):
    """Keeps a writer's registration alive every WRITER_TTL / 6 s until the lease lapses (`fence`); revokes
    it on close."""

    def __init__(self, store: ClusterStore, writer: str, patience: float):
        super().__init__(name="writer-lease", daemon=True)
        self.store = own_connection(store)
        self.fence = WriterFence(clock.monotonic(), patience)
        self.lease = self.store.membership.grant(WRITER_TTL)
        self.store.register_writer(writer, self.lease)
        self.writer = writer
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(WRITER_TTL / 6):
            sent = clock.monotonic()
            try:
                if self.store.membership.keepalive(self.lease):
                    self.fence.kept(sent)
                else:  # it expired (the store was away): its clients stop writing; a new writer takes over
                    self.fence.lost = True
            except MembershipUnavailable:
                pass
            if self.fence.fenced(clock.monotonic()):
                try:
                    self.store.membership.revoke(self.lease)  # so nodes see it gone (it may still be alive)
                except Exception:  # the store is away: the lease expires on its own
                    pass
                return

    def close(self) -> None:
        self.halt.set()
        self.join(2)
        try:
            self.store.membership.revoke(self.lease)
        except Exception:  # the store is away: the lease expires on its own
            pass
        self.store.membership.close()
