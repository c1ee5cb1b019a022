"""The failover decider: keeps the cluster map true to which nodes are alive.

Stateless: everything it knows is read from the membership store (the map, node presence)
or asked of the nodes; any number of copies run, and only the one holding the election key
acts (every map change it makes is guarded by that key, so a deposed decider changes
nothing). Each `step()` makes one decision, in this order:

1. positions whose node is gone (its presence expired, or another incarnation is there) are
   declared dead and their identities fenced (one map change), and the map is pushed to
   every live node before anything else happens, so survivors refuse the dead node's late
   deltas;
2. nodes left frozen by a handover or grow that did not finish (its decider died or was deposed) are
   thawed; then a dead position whose stripes' parity holders may disagree (`failing`) is reconciled:
   holders behind a stripe's most advanced holder forget their parity row, to be rebuilt
   from the data (`plans.stale_parity`); then it leaves `failing` and clients replay;
3. live nodes' up/rebuilding states follow what they report;
4. nodes without an identity in the map (at start) are given their position;
5. nodes that hold a position the map does not give them are fenced (a decider died while
   installing them);
6. a live spare is put in a dead position, with the tables, rebuilding;
7. a spare an operator asked to add (`ectable node add`) becomes one more position once every
   position is up: the cluster is laid out again over it (`grow`);
8. a node an operator asked to leave (`ectable node drain`) hands its position, identity and state
   over to a spare once every position is up, and is told to stop (after HANDOVER_TRIES failed
   handovers it is failed over instead); a leaving spare is told to stop.

The pure decisions live in `plans`; this module does the talking. `control` sends requests
to nodes by endpoint: `call_all({endpoint: (header, arrays)}, timeout)` returns
`{endpoint: (reply, arrays) or the exception met}`.
"""
from __future__ import annotations

import numpy as np

from ..arrays import union, unique
from .. import clock
from ..config import ClusterConfig
from ..errors import Error
from ..membership import LeaseNotFound
from ..protocol.messages import (Applied, CreateTable, DropTable, Freeze, Holds, Invalidate, MapUpdate, Rollback,
                                 Shutdown, Sync, Tables)
from ..storage.table import TableSpec
from . import plans
from .grow import Grow
from .handover import Handover
from .map import Map
from .store import ClusterStore

CONTROL_TIMEOUT = 2.0  # one round of control calls to nodes
PATIENCE = 3  # rounds a live node (its lease kept) may fail to answer a reconcile before it is failed too
ELECTION_TTL = 2.0  # a dead decider is replaced within this many seconds
STORE_GRACE = 3.5  # on etcd, a decider leading again after its lease ran out waits this long before it declares
# silent nodes dead (and so does any new leader that finds more than r silent): when etcd was away long enough for
# leases to run out (every node's, and the decider's), nodes announce themselves again under new leases within a
# heartbeat; without the wait every node was declared dead at once
INSTALL_TRIES = 5  # times an install is tried again after a create or drop came between
FLUSH_SECONDS = 1.0  # longest a drain waits for the leaving node's deltas to be acknowledged before fencing it
GROW_TRIES = 3  # attempts to add one spare as a position before its request is withdrawn
HANDOVER_TRIES = 3  # handovers of one node that may fail before its drain fails the position over instead
RETELL_SECONDS = 5.0  # a node told to stop (drained) whose presence is still there is told again after this long
SETTLED_MAX_ROWS = 4096  # parity rows a reconcile may list as lacking in the map (the map stays small)


class Decider:
    def __init__(self, store: ClusterStore, control, name: str, token: str | None = None, ttl: float = ELECTION_TTL,
                 log=None, grace: float = 0.0):
        self.store, self.control, self.name, self.token, self.ttl = store, control, name, token, ttl
        self.log = log or (lambda message: None)
        self.lease: int | None = None
        self.grace = grace  # see STORE_GRACE
        self.led: tuple = (None, 0.0, False)  # (the lease it won the election with, when, whether one ran out before)
        self.lapsed = False  # its lease ran out since it last won
        self.silences: dict[str, int] = {}  # endpoint -> reconcile rounds it did not answer (soft state)
        self.told: dict[str, float] = {}  # endpoint -> when it was last told to stop, being drained (soft state)
        self.handovers_failed: dict[str, int] = {}  # endpoint -> handovers of its position that failed (soft state)
        self.grows_failed: dict[str, int] = {}  # spare endpoint -> attempts to add it that failed (soft state)
        self.busy_since: float | None = None  # since when a long step runs, a handover or a reconcile (a process
        # keeps the election lease alive meanwhile: on a loaded machine a reconcile of many tables outlasts the lease,
        # and a decider that lost it mid-way had its map change refused, and the other decider began it again)
        self.copies = 0  # copies of nodes' rows it asked for (each handover names its own)

    # -- election ----------------------------------------------------------
    def leading(self) -> bool:
        """Keep (or try to win) the election; True while this decider may act."""
        membership = self.store.membership
        if self.lease is not None and not membership.keepalive(self.lease):
            self.lease, self.lapsed = None, True  # the store may have been away: every lease ran out
        if self.lease is None:
            self.lease = membership.grant(self.ttl)
        try:
            won = self.store.campaign(self.name, self.lease)
        except LeaseNotFound:  # it expired between the keep-alive and the campaign
            self.lease = None
            return False
        if won and self.led[0] != self.lease:
            self.led, self.lapsed = (self.lease, clock.monotonic(), self.lapsed), False
        return won

    def _waits(self, m: Map, dead: list[int]) -> bool:
        """Whether silent positions `dead` may be nodes that have yet to announce themselves again after the store
        was away: this decider leads since less than `grace`, after its own lease ran out or finding more than r."""
        _, since, lapsed = self.led
        return clock.monotonic() - since < self.grace and (lapsed or len(dead) > m.config.get("r", 1))

    def resign(self) -> None:
        if self.lease is not None:
            self.store.membership.revoke(self.lease)
            self.lease = None

    # -- decisions ---------------------------------------------------------
    def step(self) -> bool:
        """Make the next decision if this decider leads; True if the map changed (step again now)."""
        if not self.leading():
            return False
        m = self.store.read_map()
        if m is None:
            return False
        presence = self.store.presence()
        self.control.keep(set(m.endpoints) | presence.keys())
        dead = plans.silent(m, presence)
        if dead and self._waits(m, dead):
            return False  # the store may have been away: nodes announce themselves again
        if dead:
            self.log(f"epoch {m.epoch}: positions {dead} lost their node (presence gone or replaced): declared dead")
            return self._swap(m, plans.declare_dead(m, dead)) is not None
        frozen, given = plans.frozen(m, presence), plans.given(m, presence)
        if frozen or given:  # before a reconcile: a frozen node answers it with `moved` (it would be failed for silence)
            self.log(f"epoch {m.epoch}: {frozen + given} left frozen, or given a node, by a handover or grow that did "
                     f"not finish: thawed")
            return self._thaw(frozen, given)
        if m.failing:
            self.busy_since = clock.monotonic()
            try:
                return self._reconcile(m, *m.failing[0])
            finally:
                self.busy_since = None
        states = plans.rebuild_states(m, presence)
        if states != m:
            return self._swap(m, states) is not None
        unassigned = plans.unassigned(m, presence)
        if unassigned:
            return self._assign(m, unassigned, presence)
        strays = plans.strays(m, presence)
        if strays:
            return self._swap(m, m.replace(fenced=m.fenced + tuple(strays))) is not None
        drains, grows = self.store.drains(), self.store.grows()
        spares = sorted(plans.free_spares(m, presence, drains), key=lambda e: e in grows)  # those to add go last
        if m.dead() and spares:
            return self._install(m, m.dead()[0], spares, presence)
        if grows and self._grow(m, presence, grows, drains):
            return True
        return bool(drains) and self._drain(m, presence, drains, spares)

    def _swap(self, old: Map, new: Map, guard=()) -> Map | None:
        """Change the map (only while leading); push it to every live node at once. A step that waited on
        nodes may have outlived the election lease: it is kept alive (or won again, if no other decider
        took it meanwhile; the map's compare-and-swap still refuses a map another decider changed)."""
        if not self.leading():
            return None
        written = self.store.swap_map(old, new, [*self.store.leader_guard(self.name), *guard])
        if written is not None:
            self.broadcast(written)
        return written

    def map_header(self, m: Map, **extra) -> dict:
        return MapUpdate(token=self.token, **m.view(), **extra).header()

    def broadcast(self, m: Map) -> None:
        """The map to every live node (one that does not answer learns it from the store)."""
        header = self.map_header(m)
        self.control.call_all({m.endpoints[p]: (header, []) for p in m.live()}, CONTROL_TIMEOUT)

    def _ask(self, requests: dict) -> tuple[dict, list]:
        """({endpoint: (reply, arrays)}, [endpoints that failed])."""
        answers = self.control.call_all(requests, CONTROL_TIMEOUT)
        return ({e: a for e, a in answers.items() if not isinstance(a, Exception)},
                [e for e, a in answers.items() if isinstance(a, Exception)])

    def _tables(self, m: Map) -> list | None:
        """The tables' definitions, from any live node, up ones first (None: none answered)."""
        for p in sorted(m.live(), key=lambda q: m.states[q] != "up"):  # a rebuilding node has every table too
            ok, _ = self._ask({m.endpoints[p]: (Tables().header(), [])})
            if ok:
                return ok[m.endpoints[p]][0]["tables"]
        return None

    def _reconcile(self, m: Map, p: int, source: str) -> bool:
        survivors = m.live()
        ok, failed = self._ask({m.endpoints[q]: (Applied(source=source, fence=True).header(), []) for q in survivors})
        if failed:
            return self._unanswered(m, failed)
        replies = {q: ok[m.endpoints[q]][0] for q in survivors}
        marks = {q: reply["clients"] for q, reply in replies.items()}
        tables = self._tables(m)
        if tables is None:
            return False  # nobody to ask for the tables now: try again at the next step
        config = ClusterConfig(**m.config)
        layouts = [config.layout(TableSpec.from_config(spec)) for spec in tables]
        holders = plans.parity_holders(layouts, p)
        has = [self._holds(m, layout, spec["name"], p) for spec, layout in zip(tables, layouts)]
        moot = plans.holding_none(has)  # rebuilding holders lacking every such row: rebuilt later, from holders that agree
        holding = [q for q in survivors if q in holders and q not in moot]  # the others' levels are moot
        floor = plans.rollback_level({q: replies[q].get("window") for q in holding},
                                     {q: replies[q].get("kept") for q in holding})
        score = None  # with a floor, no parity row is forgotten
        if floor is not None:  # every holder goes back to the lowest window any holds
            base = next(marks[q] for q in holding if replies[q]["window"] == floor)
            ok, failed = self._ask({m.endpoints[q]: (Rollback(source=source, window=floor, clients=base).header(), [])
                                    for q in holding if replies[q]["window"] > floor})
            if failed:
                return self._unanswered(m, failed)
            marks = dict.fromkeys(survivors, base)
        else:  # some survivor cannot go back that far: each stripe's holders behind its most advanced forget
            score = np.full(m.nodes, -1, dtype=np.int64)  # how much of p's writes each survivor's parity holds
            for q in survivors:
                score[q] = sum(marks[q].values())
        new, lacking = m, []
        for spec, layout, h in zip(tables, layouts, has):
            new, failed, lack = self._forget_stale(new, layout, spec["name"], p, score, h)
            if failed:
                return self._unanswered(m, failed)
            lacking += [[q, spec["name"], stripes.tolist()] for q, stripes in lack.items() if stripes.size]
        self.log(f"epoch {m.epoch}: position {p} reconciled" + (f" at window {floor}" if floor is not None else "")
                 + (f"; rebuilding parity on {[q for q in range(m.nodes) if new.generations[q] != m.generations[q]]}" if new != m else ""))
        if sum(len(stripes) for _, _, stripes in lacking) > SETTLED_MAX_ROWS:
            lacking = None  # too large for the map: clients that take p's log late ask the survivors
        return self._swap(m, new.settle(p, source, marks, lacking)) is not None

    def _unanswered(self, m: Map, failed: list[str]) -> bool:
        """Survivors that did not answer a reconcile: asked again at the next steps; failed (a node that
        cannot be asked is as good as dead) once they stayed silent PATIENCE times."""
        for e in failed:
            self.silences[e] = self.silences.get(e, 0) + 1
        hopeless = [e for e in failed if self.silences[e] >= PATIENCE]
        if not hopeless:
            return False
        dead = [m.position_of(e) for e in hopeless]
        self.log(f"epoch {m.epoch}: positions {dead} did not answer {PATIENCE} times while reconciling: declared dead")
        for e in hopeless:
            del self.silences[e]
        return self._swap(m, plans.declare_dead(m, dead)) is not None

    def _holds(self, m: Map, layout, table: str, p: int) -> dict:
        """{rebuilding holder: which parity rows of `table`'s stripes that p held data in it has (None: it did
        not answer)}."""
        stripes, holders = plans.reconcile_stripes(layout, p)
        rebuilding = [int(q) for q in unique(holders) if m.states[q] == "rebuilding"]
        ok, _ = self._ask({m.endpoints[q]: (Holds(table=table).header(), [stripes[(holders == q).any(axis=1)]])
                           for q in rebuilding})
        return {q: ok[m.endpoints[q]][1][0].astype(bool) if m.endpoints[q] in ok else None for q in rebuilding}

    def _forget_stale(self, m: Map, layout, table: str, p: int, score, has: dict) -> tuple[Map, list, dict]:
        """Invalidate, on every holder behind (by `score`; None: none is), the parity rows of `table`'s stripes
        that p held data in (`has`: see `_holds`); also {holder: stripes whose parity row it lacks now}
        (rebuilding, or just invalidated)."""
        stripes, holders = plans.reconcile_stripes(layout, p)
        rows = {q: (holders == q).any(axis=1) for q in has}
        has = {q: np.zeros(rows[q].sum(), bool) if h is None else h for q, h in has.items()}
        lacking = {q: stripes[rows[q]][~has[q]] for q in has}
        stale = plans.stale_parity(stripes, holders, score, has) if score is not None else {}
        ok, failed = self._ask({m.endpoints[q]: (Invalidate(table=table).header(), [s]) for q, s in stale.items()})
        for q, s in stale.items():
            lacking[q] = union(lacking.get(q, s[:0]), s)
            if m.endpoints[q] in ok:
                generation = max(m.generations[q], ok[m.endpoints[q]][0].get("generation", 0))
                m = m.with_position(q, state="rebuilding" if m.states[q] != "dead" else "dead", generation=generation)
        return m, failed, lacking

    def _assign(self, m: Map, positions: list[int], presence: dict) -> bool:
        """Nodes named in the map but not yet holding their position take it and say who they are (and, with
        CURVE keys, the key they announced goes in the map: peers take deltas only from the map's keys)."""
        ok, _ = self._ask({m.endpoints[p]: (self.map_header(m, position=p, rebuilding=m.states[p] == "rebuilding"), [])
                           for p in positions})
        new = m
        for p in positions:
            source = ok.get(m.endpoints[p], ({}, []))[0].get("source")
            if isinstance(source, str):
                new = new.with_position(p, source=source, key=presence.get(m.endpoints[p], {}).get("key"))
        return new != m and self._swap(m, new) is not None

    def _install(self, m: Map, p: int, spares: list[str], presence: dict) -> bool:
        """Put the first spare that takes it in dead position p, with every table the store lists (the map
        change holds only if no create or drop came between: then the spare's tables are put right and
        the change tried again), rebuilding."""
        for spare in spares:
            ok, _ = self._ask({spare: (self.map_header(m, position=p, rebuilding=True), [])})
            source = ok.get(spare, ({}, []))[0].get("source")
            if not isinstance(source, str):
                continue
            new = m.with_position(p, endpoint=spare, source=source, state="rebuilding", generation=0,
                                  key=presence.get(spare, {}).get("key"))
            for _ in range(INSTALL_TRIES):
                try:
                    guard = self._give_tables(spare)
                except Error:
                    self._swap(m, m.replace(fenced=m.fenced + (source,)))  # it took the position, then failed
                    return True
                if self._swap(m, new, guard) is not None:
                    self.log(f"epoch {m.epoch}: spare {spare} put in position {p}")
                    return True
                latest = self.store.read_map()
                if latest is None or latest.epoch != m.epoch or not self.leading():
                    return True  # another change came first (a stray spare is fenced), or another decider acts
            return False
        return False

    def _drain(self, m: Map, presence: dict, drains: dict, spares: list[str]) -> bool:
        """Nodes asked to leave: the first holding a position hands it over to a spare (`_hand_over`) once
        `plans.drain_waits` allows, and is told to stop; after HANDOVER_TRIES failed handovers it is failed over
        instead (fenced, to be replaced by a spare like a dead node). One holding no position (a spare, or fenced
        already) is told to stop; a request whose node is gone is done."""
        live = {m.endpoints[p] for p in m.live()}
        for endpoint in sorted(drains.keys() - live):
            if endpoint not in presence:
                self.store.cancel_drain(endpoint)
                self.told.pop(endpoint, None)
                self.log(f"epoch {m.epoch}: {endpoint} drained: gone")
            elif clock.monotonic() - self.told.get(endpoint, float("-inf")) >= RETELL_SECONDS:
                self._stop(endpoint)
        p = plans.drainable(m, drains, spares)
        if p is None:
            return False
        endpoint = m.endpoints[p]
        if self.handovers_failed.get(endpoint, 0) < HANDOVER_TRIES or not ClusterConfig(**m.config).r:
            self.busy_since = clock.monotonic()  # without parity, a failover would lose its rows
            try:
                return self._hand_over(m, p, spares[0], drains)
            finally:
                self.busy_since = None
        self.log(f"epoch {m.epoch}: {HANDOVER_TRIES} handovers of position {p} failed: failing it over instead")
        self._flush(endpoint)
        presence = self.store.presence()  # the flush took a while: a node may have gone meanwhile
        if plans.silent(m, presence) or plans.drainable(m, drains, plans.free_spares(m, presence, drains)) != p:
            return False
        if self._swap(m, plans.declare_dead(m, [p]), self.store.drain_guard(endpoint, drains[endpoint])) is None:
            return False  # the map changed, or the request was withdrawn
        self.log(f"epoch {m.epoch}: position {p} drained: {endpoint} fenced, to be replaced by a spare")
        self._stop(endpoint)
        return True

    def _hand_over(self, m: Map, p: int, spare: str, drains: dict) -> bool:
        """Move position p, its node's identity and everything it holds, to `spare` (`handover.Handover`), and
        tell the node to stop. An attempt that fails thaws the node (a later step tries again); a decider that
        dies meanwhile leaves it frozen, and the next one thaws it (`plans.frozen`)."""
        endpoint = m.endpoints[p]
        attempt = Handover(self, m, p, spare, self.store.drain_guard(endpoint, drains[endpoint]))
        why = attempt.run()
        if why is not None:
            self.log(f"epoch {m.epoch}: handing position {p} over from {endpoint} to {spare} failed ({why}): "
                     f"thawed, to be tried again")
            self._thaw([endpoint], [spare])
            self.handovers_failed[endpoint] = self.handovers_failed.get(endpoint, 0) + 1
            return False
        self.handovers_failed.pop(endpoint, None)
        self.log(f"epoch {m.epoch}: position {p} drained: handed over from {endpoint} to {spare} ({attempt.summary()})")
        self._stop(endpoint)
        return True

    def _grow(self, m: Map, presence: dict, grows: dict, drains: dict) -> bool:
        """A spare an operator asked to add (`ectable node add`) becomes one more position: the cluster is laid out
        again (`grow.Grow`). A request whose spare holds a position now is done; one that failed GROW_TRIES times
        is withdrawn (the operator asks again). An attempt that fails thaws the nodes; a decider that dies
        meanwhile leaves them frozen, and the next one thaws them (`plans.frozen`)."""
        for endpoint in sorted(grows.keys() & {m.endpoints[p] for p in m.live()}):
            self.store.cancel_grow(endpoint)
            self.log(f"epoch {m.epoch}: {endpoint} holds position {m.endpoints.index(endpoint)}: its request to be "
                     f"added is closed")
        spare = plans.growable(m, presence, grows, drains)
        if spare is None:
            return False
        attempt = Grow(self, m, spare, self.store.grow_guard(spare, grows[spare]))
        self.busy_since = clock.monotonic()
        try:
            why = attempt.run()
        finally:
            self.busy_since = None
        if why is None:
            self.grows_failed.pop(spare, None)
            self.log(f"epoch {m.epoch}: {spare} added as position {m.nodes}: {m.nodes + 1} positions now "
                     f"({attempt.summary()})")
            return True
        self.log(f"epoch {m.epoch}: adding {spare} failed ({why}): thawed, to be tried again")
        self._thaw(list(m.endpoints), [spare])
        self.grows_failed[spare] = self.grows_failed.get(spare, 0) + 1
        if self.grows_failed[spare] >= GROW_TRIES:
            self.log(f"epoch {m.epoch}: adding {spare} failed {GROW_TRIES} times: the request is withdrawn")
            self.store.cancel_grow(spare)
            self.grows_failed.pop(spare)
        return True  # the thaw changed the map: decide again on it

    def _thaw(self, endpoints: list[str], spares: list[str] = ()) -> bool:
        """Frozen nodes take writes again, and `spares` drop the node a handover or grow gave them (told the map as
        it stands). The map is written first (unchanged, at a new epoch), so that a handover of one of them begun on
        an older map (by a decider deposed meanwhile) can no longer change it; a node frozen since, at that epoch
        or later, refuses the thaw."""
        m = self.store.read_map()
        m = m and self._swap(m, m)
        if m is not None:
            self._ask({**{e: (Freeze(on=False, epoch=m.epoch, token=self.token).header(), []) for e in endpoints},
                       **{e: (self.map_header(m), []) for e in spares}})
        return False

    def _flush(self, endpoint: str) -> None:
        """Close the window of the node at `endpoint`, then wait until none of its deltas waits for an
        acknowledgement (FLUSH_SECONDS at most), so that the reconcile after it is fenced likely finds every
        parity holder at the same window: nothing rolled back, little replayed. Writes that come after are
        reconciled as usual."""
        deadline, close = clock.monotonic() + FLUSH_SECONDS, True
        while True:
            ok, _ = self._ask({endpoint: (Sync(close=close).header(), [])})
            close = False
            if endpoint not in ok or ok[endpoint][0].get("unacked") == 0 or clock.monotonic() > deadline:
                return
            clock.sleep(0.02)

    def _stop(self, endpoint: str) -> None:
        self.told[endpoint] = clock.monotonic()
        answer = self.control.call_all({endpoint: (Shutdown(token=self.token).header(), [])}, CONTROL_TIMEOUT)
        if isinstance(answer[endpoint], Exception):
            self.log(f"{endpoint}, drained, was not told to stop: {answer[endpoint]}")

    def _give_tables(self, spare: str) -> list:
        """Create on `spare` every table the store lists, and drop those dropped (deltas and replays naming
        them are then skipped there); a comparison that holds while the store's tables stay so."""
        tables, gone, guard = self.store.tables()
        for spec in tables:
            self._call(spare, CreateTable(spec=spec).header())
        for name in gone:
            self._call(spare, DropTable(table=name).header())
        return guard

    def _call(self, endpoint: str, header: dict) -> dict:
        answer = self.control.call_all({endpoint: (header, [])}, CONTROL_TIMEOUT)[endpoint]
        if isinstance(answer, Exception):
            raise answer if isinstance(answer, Error) else Error(str(answer))
        return answer[0]
