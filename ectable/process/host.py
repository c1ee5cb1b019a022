"""A node's membership side, whatever carries its messages.

A `NodeHost` wraps one `Node`: it takes a position when a decider's map gives it one (once),
follows newer maps (peers' endpoints and identities, dead positions, fenced identities),
answers the control ops (`map`, `ping`, `shutdown`, and a drain's handover or a grow: `freeze`,
`hand_over`, `take_over`) and dispatches everything else to its node. It leaves its position,
and waits as a spare, when the map fences its identity or gives it to another endpoint; it
replaces its node by the one it was given when a map lays the cluster out over more positions. Node
processes (`node_server.NodeServer`, ZeroMQ) and in-process clusters (`local.py`) host
nodes through it, so both follow maps with the same code.
"""
from __future__ import annotations

from .. import clock, security
from ..config import ENDPOINT, ClusterConfig
from ..errors import InvalidRequest
from ..protocol import messages
from ..protocol.messages import ErrorCode
from ..storage import handover
from ..storage.node import Node

TOKEN_OPS = {"map", "shutdown", "fault", "freeze", "hand_over", "take_over"}  # control ops taken with the token only
FROZEN_TAKES = {"get", "get_committed", "get_many", "get_parity", "get_parity_many", "missing", "status", "tables",
                "snapshot_progress", "sync", "step"}
# what a node frozen for a handover still answers (it changes nothing); `applied` and `holds` too, unless they fence
# or promise. Once its state is handed over it answers nothing but `moved`: its successor may have taken writes. A
# retry of a write it applied is answered as ever, handed over or not (after a grow, the node that continues it
# does not know the write: sent there again, it would be applied twice).
CLIENT_OPS = frozenset({"get_many", "write"})  # the requests with which clients read and write rows
BUSY_SECONDS = 1.0  # a node clients read or wrote within this long is serving them (`serving_clients`)


class NodeHost:
    endpoint_pattern = ENDPOINT  # what peers' endpoints look like on this transport
    late_writers = False  # hosts that answer later (node processes) begin a checkpoint's writing once answered
    owns_arrays = False  # whether a request's arrays are this host's own (decoded from the wire), not a sender's

    def __init__(self, endpoint: str, token: str | None):
        self.endpoint, self.token = endpoint, token
        self.node: Node | None = None
        self.epoch = 0  # of the last map taken
        self.endpoints: list[str] = []
        self.sources: dict[int, str] = {}  # identity last seen at each position
        self.dead: set[int] = set()
        self.running = True
        self.keys: dict | None = None  # the [security] section, with CURVE keys: who may send what
        self.peer_keys: dict[str, str] = {}  # identity -> key of the nodes the current map gives a live position
        self.lazy_close = False  # nodes of processes close windows when idle
        self.inflight: dict[tuple[int, int], tuple[list, float]] = {}  # (target, seq) -> (frames, last sent)
        self.frozen = False  # a drain's handover: the node changes no more (`freeze`)
        self.handed = False  # its state was handed over: it answers nothing but `moved`
        self.frozen_at = 0  # the map epoch of the last freeze: only a thaw of a later epoch is taken
        self.given_at = 0  # a spare: the map epoch of the last node it was given; an older one is refused
        self.frozen_deltas = False  # frozen, it still takes peers' deltas until handed over (a grow)
        self.pending: Node | None = None  # a spare: the node it takes over once a map gives it that position
        self.copied_rows: tuple | None = None  # (copy, {table: rows}): rows sent ahead of the node it is to take
        self.copied: tuple[str | None, set] = (None, set())  # the last copy of its rows a handover took: name, tables
        self.client_at = float("-inf")  # when clients last read or wrote rows here (`clock.monotonic`)

    def serving_clients(self) -> bool:
        """Whether clients read or wrote rows here within the last `BUSY_SECONDS` (what its rebuilder asks)."""
        return clock.monotonic() - self.client_at < BUSY_SECONDS

    def handle(self, header: dict, arrays: list, key: str | None = None) -> tuple[dict, list]:
        """Answer one request (sent with CURVE key `key`): a control op here, anything else by the node."""
        try:
            msg = messages.parse(header)
        except InvalidRequest as exc:
            return messages.error(ErrorCode.INVALID, str(exc)), []
        refused = security.refusal(msg, key, self.keys, self.peer_keys)
        if refused:
            return messages.error(ErrorCode.FORBIDDEN, refused), []
        if msg.op in CLIENT_OPS:
            self.client_at = clock.monotonic()
        if msg.op in messages.CONTROL:
            return self.control(msg, arrays)
        if self.node is None:
            return messages.error(ErrorCode.NOT_MEMBER, "this node holds no position (a spare)"), []
        if self.frozen and self.node.is_retry(msg):  # its answer, and nothing else (no window closed)
            reply, out = self.node.op_write(msg, arrays)
            return {**reply, "durable": self.node.durable_seq}, out
        if self.frozen and (self.handed or not (msg.op in FROZEN_TAKES or msg.op == "applied" and not msg.fence
                                                or msg.op == "holds" and msg.source is None
                                                or msg.op == "delta" and self.frozen_deltas)):
            return messages.error(ErrorCode.MOVED, f"node {self.node.position} hands its position over to another "
                                                   f"node: ask again once the map moved it"), []
        rebuilding = self.node.rebuilding
        reply = self.node.dispatch(msg, arrays)
        if rebuilding and not self.node.rebuilding:
            self.announce()  # rebuilt: the decider hears it now, not at the next heartbeat, and marks it up
        if msg.op == "snapshot" and not self.late_writers:
            self.node.start_writer()
        return reply

    # -- control ---------------------------------------------------------
    def control(self, msg: messages.Request, arrays=()) -> tuple[dict, list]:
        if msg.op in TOKEN_OPS and (self.token is None or msg.token != self.token):
            return messages.error(ErrorCode.INVALID, f"{msg.op} is only taken from the cluster that started this node"), []
        if msg.op == "map":
            return self.apply_map(msg), []
        if msg.op == "ping":
            return {"position": None if self.node is None else self.node.position}, []
        if msg.op == "shutdown":
            self.running = False
            return {}, []
        if msg.op in ("freeze", "hand_over", "take_over"):
            return self.hand_over(msg, arrays)
        return messages.error(ErrorCode.INVALID, f"{msg.op} is not taken by this node"), []

    def hand_over(self, msg, arrays) -> tuple[dict, list]:
        """A drain's handover: `freeze` (or thaw) this node, `hand_over` its state once frozen and quiet, or,
        on a spare, `take_over` the state of the node it replaces (see `storage.handover`)."""
        if msg.op == "take_over":
            if self.node is not None and not (msg.rows or self.frozen):  # a grow: new rows ahead, the state once frozen
                return messages.error(ErrorCode.INVALID, f"this node holds position {self.node.position} and is not "
                                                         f"frozen: it takes no state"), []
            copy, rows = self.copied_rows or (None, None)
            if not msg.rows and msg.copy is not None and msg.copy != copy:
                return messages.error(ErrorCode.INVALID, f"take_over: the rows held are not copy {msg.copy!r}"), []
            since = self.frozen_at if self.node is not None else self.given_at
            if not msg.rows and msg.epoch < since:
                return messages.error(ErrorCode.INVALID, f"take_over: for epoch {msg.epoch}, given or frozen since "
                                                         f"{since} (by a decider that came since)"), []
            self.copied_rows = None
            try:
                if msg.rows:
                    self.copied_rows = (msg.copy, handover.copied_rows(msg.state, list(arrays)))
                    return {}, []
                began = clock.monotonic()
                self.pending = handover.restore(msg.state, list(arrays), ClusterConfig(**msg.config), rows,
                                                own=self.owns_arrays)
                self.given_at = max(self.given_at, msg.epoch)
            except (InvalidRequest, TypeError, ValueError) as exc:
                return messages.error(ErrorCode.INVALID, f"take_over: {exc}"), []
            self.pending.lazy_close = self.lazy_close
            self.announce()  # the identity it is to take: the decider waits for it, and then does not fail it over
            return {"source": self.pending.source, "seconds": clock.monotonic() - began}, []
        if self.node is None:
            return messages.error(ErrorCode.NOT_MEMBER, "this node holds no position (a spare)"), []
        if msg.op == "freeze":
            if msg.on and msg.epoch < self.epoch:  # a decider deposed since, or one whose step began before a thaw
                return messages.error(ErrorCode.INVALID, f"a freeze on epoch {msg.epoch}, older than this node's map "
                                                         f"({self.epoch}): the map changed since"), []
            if msg.on:
                self.frozen_at = max(self.frozen_at, msg.epoch)
                self.frozen_deltas = msg.deltas
            elif self.frozen and msg.epoch <= self.frozen_at:
                return messages.error(ErrorCode.INVALID, f"frozen at epoch {self.frozen_at}: a thaw needs a later "
                                                         f"one, not {msg.epoch}"), []
            if not msg.on:
                self.pending = self.copied_rows = None  # what a grow that did not happen gave it
            if msg.on != self.frozen:
                self.frozen, self.handed = msg.on, False
                self.announce()
            if self.frozen:
                self.node.close_window()
            return {"unacked": len(self.node.unacked), "not_ready": handover.ready(self.node)}, []
        if msg.rows:  # the bulk, copied while the node serves
            again = msg.copy is not None and msg.copy == self.copied[0]  # a repeat: the flags stand
            state, out = handover.copy_rows(self.node, mark=not again)
            if not again:
                self.copied = (msg.copy, set(state["tables"]))
            return {"state": state}, out
        if not self.frozen:
            return messages.error(ErrorCode.INVALID, "hand_over needs a frozen node (freeze)"), []
        if msg.copied is not None and msg.copied != self.copied[0]:  # copied since by another: the flags are its own
            return messages.error(ErrorCode.INVALID, f"rows copied again since copy {msg.copied!r}"), []
        try:
            state, out = handover.export(self.node, self.copied[1] if msg.copied else (), msg.parity)
        except InvalidRequest as exc:  # not quiet yet
            return messages.error(ErrorCode.INVALID, str(exc)), []
        self.handed = True
        return {"state": state}, out

    def apply_map(self, msg: messages.MapUpdate) -> dict:
        """Take a position (once), learn peers' endpoints, identities and which positions are dead."""
        endpoints, dead = msg.endpoints, msg.dead
        adopts = self._adopts(endpoints, msg.sources)  # a grow's new layout: the node it was given takes over
        holding = self.pending if adopts else self.node
        position = msg.position if msg.position is not None or not adopts else self.pending.position
        if not (all(isinstance(e, str) and self.endpoint_pattern.match(e) for e in endpoints)
                and all(isinstance(d, int) and 0 <= d < len(endpoints) for d in dead)
                and (holding is None or len(endpoints) == holding.config.nodes)):
            return messages.error(ErrorCode.INVALID, "map needs tcp://host:port endpoints, one per node, and dead positions")
        if msg.epoch is not None:
            if msg.epoch < self.epoch:  # an older map overtaken by a newer one: keep the newer
                return {"source": self.node and self.node.source}
            self.epoch = msg.epoch
        if adopts and self.node is not None:
            self._adopt()
        if self.node is not None and msg.position is not None and msg.position != self.node.position:
            # a decider that read this node's presence from before it took its position: it is no spare
            return messages.error(ErrorCode.NOT_MEMBER, f"this node holds position {self.node.position} already, "
                                                        f"not {msg.position}")
        if self.node is None and position is not None:
            try:
                config = ClusterConfig(**(msg.config or {}))
                if not 0 <= position < config.nodes or len(endpoints) != config.nodes:
                    raise ValueError("position or endpoints do not fit the cluster")
            except (TypeError, ValueError, KeyError) as exc:
                return messages.error(ErrorCode.INVALID, f"bad map: {exc}")
            pending, self.pending = self.pending, None
            if pending is not None and pending.position == position and not msg.rebuilding and \
                    isinstance(msg.sources, list) and msg.sources[position:position + 1] == [pending.source]:
                self.node = pending  # a drain's handover: this spare continues the node it was given
            else:
                self.node = Node(position, config, rebuilding=msg.rebuilding, lazy_close=self.lazy_close)
            if self.node.rebuilding:  # a replacement: writers replay what the dead node applied first
                self.node.expect_replays(self.writers())
            self.announce()  # before the decider hears of it: it then expects this identity
        elif self.node is not None and self._handed_away(endpoints, msg.sources):
            self.leave()  # its identity lives on at another endpoint: a spare again (a drain stops it)
        if self.node is None:  # a spare told the map as it stands: a handover or grow it was given did not happen
            given, self.pending, self.copied_rows = self.pending, None, None
            if given is not None:
                self.announce()  # no longer `pending`: the decider tells it no more
            return {"source": None}
        sources = msg.sources
        if not (isinstance(sources, list) and len(sources) == len(endpoints)):
            sources = [None] * len(endpoints)
        for target, endpoint in enumerate(endpoints):
            known = target != self.node.position and target < len(self.endpoints)
            same = sources[target] is not None and sources[target] == self.sources.get(target)
            if known and same and self.endpoints[target] != endpoint:  # the same node, handed over elsewhere
                self._relocate_peer(target, endpoint)
            elif known and not same and (self.endpoints[target] != endpoint or sources[target] is not None
                                         and self.sources.get(target) is not None):  # a new node there
                self._drop_peer(target)
                self.node.peer_replaced(target)
            if sources[target] is not None:
                self.sources[target] = sources[target]
        self.endpoints = endpoints
        self.node.sources = dict(self.sources)
        self.dead = set(dead)
        if isinstance(msg.keys, list) and len(msg.keys) == len(endpoints):
            self.peer_keys = {self.sources[p]: k for p, k in enumerate(msg.keys)
                              if isinstance(k, str) and p not in self.dead and p in self.sources}
        self.node.fenced |= {f for f in msg.fenced if isinstance(f, str)}
        for target in self.dead:
            self._drop_peer(target)
        for target in range(len(endpoints)):
            if target != self.node.position and target not in self.dead:
                self._connect(target)
        return {"source": self.node.source}

    def _adopts(self, endpoints, sources) -> bool:
        """Whether a map lays the cluster out again over more positions, giving this endpoint the node it was
        given for that (`pending`, built by `storage.relayout`)."""
        pending = self.pending
        return (pending is not None and len(endpoints) == pending.config.nodes
                and isinstance(sources, list) and len(sources) == len(endpoints)
                and sources[pending.position] == pending.source and endpoints[pending.position] == self.endpoint)

    def _adopt(self) -> None:
        """The node built for the new layout replaces this one: the old one's peers and streams are moot (it was
        quiet: every delta it sent was acknowledged)."""
        for target in range(len(self.endpoints)):
            if target != self.node.position:
                self._drop_peer(target)
        self.node, self.pending, self.frozen, self.handed = self.pending, None, False, False
        self.endpoints, self.sources, self.dead = [], {}, set()
        self.announce()

    def _handed_away(self, endpoints: list, sources) -> bool:
        """Whether a map gives this node's position, under its identity, to another endpoint (a handover)."""
        p = self.node.position
        return (endpoints[p] != self.endpoint and isinstance(sources, list) and len(sources) == len(endpoints)
                and sources[p] == self.node.source)

    def take_ack(self, target: int, header: dict) -> None:
        """A peer's answer to one of this node's deltas: acknowledged, or out of order (an earlier one was
        lost: every delta to that peer is sent again at the next resend pass)."""
        seq = header.get("ack")
        if isinstance(seq, int) and self.inflight.pop((target, seq), None) is not None:
            self.node.acked(target, seq)
        elif header.get("error") == ErrorCode.OUT_OF_ORDER:
            for key, (frames, _) in list(self.inflight.items()):
                if key[0] == target:
                    self.inflight[key] = (frames, float("-inf"))

    def expire_window(self) -> bool:
        """The timer every host runs: close the node's window once its oldest write is `window_seconds` old,
        so that parity catches up with no client action (a writer may go idle, or exit). Whether it closed."""
        if self.node is None or not self.node.window_due():
            return False
        self.node.close_window()
        return True

    def beat(self) -> dict:
        """This node's presence: who it is, whether (and since which invalidation) it rebuilds, whether a handover
        froze it, the identity it was given to take once a map gives it (`pending`), and how many writers may
        still replay late what a node it replaced had applied (`late`)."""
        node = self.node
        return {"endpoint": self.endpoint, "source": node and node.source, "position": node and node.position,
                "rebuilding": bool(node and node.rebuilding), "generation": node.generation if node else 0,
                "key": self.keys and self.keys["public"], "frozen": self.frozen,
                "pending": self.pending and self.pending.source, "late": len(node.late) if node else 0}

    def follow_map(self, latest) -> None:
        """Take a map read from the store (`cluster.map.Map`): leave if it fences this node's identity,
        else learn what changed if it is newer."""
        if latest is None or self.node is None and self.pending is None:
            return
        adopts = self._adopts(latest.endpoints, list(latest.sources))
        if self.node is None and not adopts:
            return  # a spare given a node takes a map from its decider only, unless the map gives it that node
        if self.node is not None and self.node.source in latest.fenced and not adopts:
            self.leave()
        elif latest.epoch > self.epoch:
            self.apply_map(messages.MapUpdate(**latest.view()))

    def leave(self) -> None:
        """This node was declared dead while it was away, or handed its position over: drop everything and
        wait as a spare."""
        self.node, self.frozen, self.handed = None, False, False
        self.endpoints, self.dead, self.sources = [], set(), {}
        self.announce()  # a spare again

    def _drop_peer(self, target: int) -> None:
        """Deltas to `target` are moot (it died, or a replacement rebuilds its parity from data)."""

    def _relocate_peer(self, target: int, endpoint: str) -> None:
        """The node at `target` moved to `endpoint`, the same node (a handover): deltas to it go there, and
        those it has not acknowledged are sent again."""

    def _connect(self, target: int) -> None:
        """A live peer: a transport may connect to it now, so the first window's deltas need not wait."""

    def writers(self) -> set[str]:
        """The writers alive now (see `ClusterStore.writers`), where the host can tell."""
        return set()

    def announce(self) -> None:
        """Publish who this node is now (its presence in the cluster's store), where the host keeps one."""

