"""Degraded reads, degraded writes and rebuilds: decoding rows from the survivors of their stripes.

Survivors return their *committed* records (as of their open window's start) with the numbers
of the deltas those records were sent in; parity holders return what they applied. Reads are
repeated for whatever does not match, so every decode reads a consistent cut without stopping
writers (see `recover_many`).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..arrays import unique
from .. import clock
from ..config import DEADLINE
from ..errors import Error, NodeDown, StaleCut
from ..protocol import deltas as payload, validate
from ..protocol.messages import (Delta, GetCommitted, GetParityMany, Holds, HoldsMany, Missing, Restore, RestoreRows,
                                 Status)
from ..storage.optimizers import write_rows
from ..storage.shard import NotRebuilt
from .cut import Cut, lag


class Begun(NamedTuple):
    """A decode of data rows whose first reads are sent (`Repair.read_ahead`)."""
    ids: dict  # {table: ids, ascending}
    plan: dict  # {table: (stripes, each id's stripe among them)}
    unread: dict  # as `recover_many`'s
    cuts: dict  # {group: Cut}, as `_cuts` made them
    sent: tuple  # (what was asked of each (node, kind), (requests in flight, a failure to send))


class Unsettled(Error):
    """A cut whose slots still moved after `Repair.patience` reads (writes went on meanwhile)."""


class Repair:
    """Decoding paths of one client; `client` supplies tables, node states and calls."""

    def __init__(self, client):
        self.client = client
        self.code = client.config.make_code()
        self.source = f"repair/{clock.token_hex(8)}"
        self._next_seq: dict[int, int] = {}
        self.patience: int | None = None  # reads of one cut before `Unsettled` (None: until its 30 s deadline)
        self.rereads = 0  # reads beyond the first of every cut so far
        self._waited: set = set()  # failures (position, identity) whose reconcile a decode waited for already

    def forget(self, position: int) -> None:
        """A new node took `position`: its delta sequence starts again."""
        self._next_seq.pop(position, None)

    def _settle(self) -> None:
        """Wait (bounded, once per failure) until the decider reconciled every dead position the map lists as
        failing: until then a dead node's last window may be in one parity holder of a stripe and not in
        another, and a decode through both would mix them. A client that knew the node waits in its failover;
        this is for one that first meets the death in the map (connected since, or its map skipped a node)."""
        for failure in self.client.cluster.failing():
            if failure not in self._waited:
                self._waited.add(failure)
                self.client.cluster.wait_reconciled(failure[0])

    # -- reading whole stripes -------------------------------------------
    def _cuts(self, stripes: dict, skip, unread: dict, states=None) -> dict:
        """{group: a fresh `Cut` of the stripes ({table: stripes}) of the tables of that group (one record size and
        layout shape)}, with every position's `states` (or the client's now); `unread` ({group: slots}) keeps
        what rebuilding nodes said they lack across fresh starts."""
        groups: dict = {}
        for table, s in stripes.items():
            spec, layout = self.client._table(table)
            groups.setdefault((spec.width, layout.nodes, layout.k, layout.r), {})[table] = s
        states = self.client._states() if states is None else states
        known = self.client.cluster.known()
        cuts = {}
        for group, tables in groups.items():
            specs = [self.client._table(table) for table in tables]
            cuts[group] = Cut(tables, [layout for _, layout in specs], [spec.num_rows for spec, _ in specs],
                              group[0] * 4, skip, unread.get(group), states, known)
            unread[group] = cuts[group].unread
        return cuts

    def check(self, ids: dict, states: np.ndarray) -> None:
        """Raise Unavailable unless every row of `ids` ({table: ids}) can be decoded, with every position's
        `states`."""
        self._cuts({table: unique(self.client._table(table)[1].stripe(i)) for table, i in ids.items()}, None, {}, states)

    def recover_many(self, stripes: dict, skip: int | None = None, begun: Begun | None = None) -> dict:
        """{table: stripes} -> {table: (blocks, cut, counts)}: every slot (data records and parity, as bytes) of
        the stripes, [n, k + r, record bytes], decoded from a consistent cut; that cut: {position: (source,
        delta numbers sent per target, marks, ...)} of the data nodes read for the table; and per stripe the
        degraded writes its parity rows read hold (-1: none read). Slots on node `skip` (the one being rebuilt)
        are not read. Every table's reads are in flight at once, and the tables of one record size are read,
        checked and decoded as one `Cut`. `begun`: these stripes' first reads, sent (`_begin`).

        Slots are read from any live node, rebuilding ones included (a slot they have not rebuilt yet
        counts as lost). The cut is consistent when every parity holder read has applied exactly the
        deltas that the data nodes read had sent it; otherwise the parity of holders still waiting for
        deltas, or the data of nodes that moved on, is read again until it is. Raises `Unsettled` once the
        cut still moved after `patience` reads (when set).
        """
        deadline, reads = clock.monotonic() + 30, 0
        unread = begun.unread if begun else {}  # per group: slots a rebuilding node said it has not rebuilt
        while True:
            if begun:
                cuts, sent, begun = begun.cuts, begun.sent, None
            else:
                self._settle()
                cuts, sent = self._cuts(stripes, skip, unread), None
            try:
                while any(cut.pending() for cut in cuts.values()):  # every slot, then what moved
                    self._read(cuts, sent)
                    reads, sent = reads + 1, None
                    if any(cut.stale() for cut in cuts.values()):  # planned again on the map read now: `_states`
                        self.client.cluster.refresh()  # fails over the position that node took; the cut counts it
                        break
                    for cut in cuts.values():
                        cut.check(*self._lag(cut.senders, cut.holders))
                    if any(cut.pending() for cut in cuts.values()):
                        self.rereads += 1
                        if clock.monotonic() > deadline:
                            raise Error(f"tables {list(stripes)}: parity holders kept lagging behind the data")
                        if self.patience is not None and reads >= self.patience:
                            raise Unsettled(f"tables {list(stripes)}: the stripes still moved after {reads} reads")
                        clock.sleep(0.001)
            except NotRebuilt as exc:  # every table's slots the node lacks
                for cut in cuts.values():
                    self._not_rebuilt(exc.position, exc.kind, exc.missing, cut)
                continue
            if any(cut.pending() for cut in cuts.values()):
                if clock.monotonic() > deadline:
                    raise Error(f"tables {list(stripes)}: parity holders kept naming nodes the map does not know")
                continue
            break
        out = {}
        for cut in cuts.values():
            self.code.decode_stripes(cut.blocks, cut.chosen)
            out.update(cut.split())
        return out

    _lag = staticmethod(lag)

    @staticmethod
    def _not_rebuilt(node: int, kind: str, missing: dict, cut: Cut) -> None:
        """Rebuilding `node` lacks slots of `cut` (`Cut.not_rebuilt`)."""
        cut.not_rebuilt(node, kind, missing)

    def _begin(self, ids: dict, skip: int | None) -> Begun:
        """`read_many(ids, skip)`'s first reads, sent (`ids` ascending and unique)."""
        plan = self._plan(ids)
        self._settle()
        unread: dict = {}
        cuts = self._cuts({table: stripes for table, (stripes, _) in plan.items()}, skip, unread)
        return Begun(ids, plan, unread, cuts, self._send(cuts))

    def _read(self, cuts: dict, sent: tuple | None = None) -> None:
        """Read every cut's `read` slots into its blocks (or take the replies of those `sent`), one request per
        node and kind (data or parity) for every table, all in flight at once; note what each data node had
        sent (`senders`) and each parity holder applied."""
        asked, started = sent or self._send(cuts)
        for (node, kind), (reply, arrays) in self.client._gathered(started).items():
            at = 0
            for cut, (tables, _, rows, cols) in asked[(node, kind)]:
                n = len(tables)
                if kind == "parity":
                    cut.put(rows, cols, arrays[2 * at: 2 * (at + n): 2])
                    if rows.size:
                        cut.versions[rows, cols] = np.concatenate(arrays[2 * at + 1: 2 * (at + n): 2])
                    cut.holders[node] = (reply.get("source"), reply["applied"])
                else:
                    cut.put(rows, cols, arrays[at: at + n])
                    marks = reply.get("marks") if isinstance(reply.get("marks"), dict) else {}
                    peers = reply.get("peers") if isinstance(reply.get("peers"), dict) else {}
                    cut.senders[node] = (reply["source"], reply["sent"], marks, peers, reply.get("window"))
                at += n

    def _send(self, cuts: dict) -> tuple:
        """Send the reads of every cut's `read` slots: (what was asked of each (node, kind): [(cut, its ask)],
        the requests)."""
        asked: dict = {}
        for cut in cuts.values():
            for key, ask in cut.asks().items():
                asked.setdefault(key, []).append((cut, ask))
        kinds = {"data": GetCommitted, "parity": GetParityMany}
        requests = {(node, kind): (kinds[kind](tables=[t for _, ask in asks for t in ask[0]], node=self._node(node))
                                   .header(), [keys for _, ask in asks for keys in ask[1]])
                    for (node, kind), asks in asked.items()}
        return asked, self.client._start_all(requests)

    def read_many(self, ids: dict, skip: int | None = None, ahead: Begun | None = None) -> dict:
        """{table: ids} -> {table: committed records}, decoded from their stripes, all tables at once. `ahead`
        (`read_ahead`): rows decoding already, taken for those of `ids` it holds if it succeeds."""
        if ahead is None:
            return self._decode(ids, skip)
        early = self._finish(ahead, skip)
        out, rest = {}, {}
        for table, want in ids.items():
            have, records = early.get(table, (want[:0], None))
            at = np.minimum(np.searchsorted(have, want), max(have.size - 1, 0))
            hit = have[at] == want if have.size else np.zeros(want.size, dtype=bool)
            if have.size and hit.all():
                out[table] = records[at]
                continue
            out[table] = np.empty((want.size, self.client._table(table)[0].width), dtype=np.float32)
            if hit.any():
                out[table][hit] = records[at[hit]]
            if not hit.all():
                rest[table] = (want[~hit], ~hit)
        if rest:
            decoded = self._decode({table: want for table, (want, _) in rest.items()}, skip)
            for table, (_, miss) in rest.items():
                out[table][miss] = decoded[table]
        return out

    def read_ahead(self, ids: dict, skip: int | None = None) -> Begun | None:
        """`read_many(ids, skip)` begun: its first reads sent, to be finished as `read_many`'s `ahead` (or
        dropped with `drop_ahead`); None if it could not begin."""
        try:
            return self._begin({table: np.unique(i) for table, i in ids.items()}, skip)
        except Error:
            return None

    def drop_ahead(self, ahead: Begun | None) -> None:
        """A `read_ahead` not needed after all: its replies are collected by the client's next request."""
        if ahead is not None:
            pending, _ = ahead.sent[1]
            self.client._ahead.extend((key[0], request, True) for key, request in pending.items())

    def _finish(self, ahead: Begun | None, skip: int | None) -> dict:
        """{table: (ids ascending, records)} that `read_ahead` decoded ({} if it failed)."""
        try:
            decoded = self._decode(ahead.ids, skip, ahead) if ahead is not None else {}
        except Error:
            return {}
        return {table: (ahead.ids[table], records) for table, records in decoded.items()}

    def _decode(self, ids: dict, skip: int | None, begun: Begun | None = None) -> dict:
        """{table: records of `ids`}, decoded (from the reads `begun` sent, if given)."""
        plan = begun.plan if begun is not None else self._plan(ids)
        return self._records(ids, plan, self.recover_many({table: s for table, (s, _) in plan.items()}, skip, begun))

    def _plan(self, ids: dict) -> dict:
        """{table: (stripes of `ids`, each id's stripe among them)}."""
        return {table: np.unique(self.client._table(table)[1].stripe(i), return_inverse=True) for table, i in ids.items()}

    def _records(self, ids: dict, plan: dict, blocks: dict) -> dict:
        """{table: records of `ids`} out of their decoded stripes."""
        return {table: blocks[table][0][inverse.reshape(-1), self.client._table(table)[1].position(ids[table])]
                .view(np.float32) for table, (_, inverse) in plan.items()}

    # -- writing through parity ------------------------------------------
    def write_many(self, writes: list, dead: str | None = None) -> None:
        """Apply writes of several tables ([(table, kind, ids, values)]) to rows of a dead node (identity `dead`)
        by updating their parity alone, all at once: one decode, one round of promises and one delta per parity
        holder for every table, every table's new records checked before anything is sent. `Replaced` (nothing
        changed) if a parity holder knows the position has a replacement."""
        old = self.read_many({table: ids for table, _, ids, _ in writes})
        deltas, stripes, position = {}, {}, None
        for table, kind, ids, values in writes:
            spec, layout = self.client._table(table)
            new = old[table].copy()
            write_rows(spec.make_optimizer(), kind, new, values, spec.dim)
            validate.finite_result(table, kind, ids, new)  # as a node refuses it
            deltas[table] = (ids, old[table].view(np.uint8) ^ new.view(np.uint8))
            stripes[table] = layout.stripe(ids)
            if position is None and ids.size:
                position = int(layout.data_node(ids[:1])[0])
        # The holders asked first are the holders written: a spare that comes meanwhile rebuilds its rows
        # once this writer checked in, so from parity that has the write.
        states = self.client._states()
        self._parity_ready(stripes, position, dead, states)
        pieces: dict = {}  # {target: {table: (ids, delta)}}
        for table, (ids, delta) in deltas.items():
            layout = self.client._table(table)[1]
            holders = np.stack([layout.parity_node(stripes[table], j) for j in range(layout.r)], axis=1)
            for target in unique(holders[states[holders] != "dead"]).tolist():  # a dead one's parity is rebuilt
                pick = (holders == target).any(axis=1)  # from the data later; a holder holds one slot of a stripe
                pieces.setdefault(target, {})[table] = (ids[pick], delta[pick])
        self.send_deltas(pieces, position, dead)

    def _parity_ready(self, stripes: dict, position, dead, states) -> None:
        """Before a degraded write of the rows of `stripes` ({table: stripes}): every live holder agrees to take
        it (`Replaced` if one knows of a replacement: nothing was sent) and has their parity rows (a rebuilding
        one rebuilds those it lacks now), so that its delta is applied everywhere or nowhere, never skipped by a
        row that is rebuilt later from data that does not hold it. `states`: the positions' states to go by."""
        held: dict = {}  # {target: {table: [stripes]}}: a node may hold parity j of some stripes and j' of others
        for table, of_table in stripes.items():
            layout = self.client._table(table)[1]
            for j in range(layout.r):
                targets = layout.parity_node(of_table, j)
                for target in unique(targets[states[targets] != "dead"]).tolist():
                    held.setdefault(target, {}).setdefault(table, []).append(of_table[targets == target])
        asks = {(target,): (HoldsMany(tables=list(tables), source=self.source, position=position, dead=dead).header(),
                            [unique(np.concatenate(parts)) for parts in tables.values()])
                for target, tables in held.items()}
        for _ in range(3):  # a rebuild gives up when its holder moved on meanwhile: ask again
            lacking: dict = {}  # {target: ({table: stripes}, generation)}
            for (target,), (reply, arrays) in self.client._gather(asks).items():
                header, asked = asks[(target,)]
                rows = {table: of_table[has == 0] for table, of_table, has in zip(header["tables"], asked, arrays[::2])
                        if not has.all()}
                if rows:
                    lacking[target] = (rows, reply.get("generation", 0))
            for target, (rows, generation) in lacking.items():
                self._rebuild_parity(target, rows, generation)
            if not lacking:
                return
        target, (rows, _) = next(iter(lacking.items()))
        exc = NotRebuilt.of(rows, "parity")  # the write is tried again from the start
        exc.position = target
        raise exc

    def send_deltas(self, pieces: dict, position: int | None = None, dead: str | None = None) -> None:
        """Send each parity holder its delta ({target: {table: (ids, delta)}}, one message per holder for every
        table), all at once, until each acknowledges it or is failed over (then its parity is rebuilt from the
        data). At once, so that a holder that died holds up no other: a degraded write's holders take it only
        while their promise lasts (`PROMISE_SECONDS`), and one taken by some and refused by others would be
        split. The same delta number to a holder each time: it applies it once, whatever was lost on the way. A
        refusal (`Replaced`, or any other error reply: nothing was applied, the number is free again) is raised
        once every other holder has answered."""
        sends = {}
        for target, tables in pieces.items():
            seq = self._next_seq.get(target, 0) + 1
            self._next_seq[target] = seq
            header = Delta(source=self.source, seq=seq, tables=list(tables), position=position, dead=dead).header()
            parts = []
            for ids, delta in tables.values():
                order = np.argsort(ids)  # a delta names its stripes in ascending order
                parts.append((ids[order], delta[order]))
            sends[target] = (header, payload.pack(parts), self.client.cluster.source(target))
        refused = None
        self.client._collect_ahead()  # before any holder takes the delta: a failure it raises leaves none applied
        while sends:
            pending, down = {}, []
            for target, (header, arrays, _) in sends.items():
                try:
                    pending[target] = self.client.cluster.channel(target).start(header, arrays)
                except NodeDown:
                    down.append(target)
            for target, request in pending.items():
                try:
                    self.client._check_reply(target, *request.wait(DEADLINE))
                    del sends[target]
                except NodeDown:
                    down.append(target)
                except Error as exc:  # refused before it was applied: the number is free again
                    self._next_seq[target] = sends.pop(target)[0]["seq"] - 1
                    refused = refused or exc
            for target in down:  # wait until it is failed over (or answers); the client fails over after the
                self.client.cluster.mark_dead(target)  # write: failing over now could raise before every holder
                if self.client.cluster.state(target) == "dead" or self.client.cluster.source(target) != sends[target][2]:
                    del sends[target]  # has it; its parity is rebuilt from the data (the others' parity gives it)
        if refused is not None:
            raise refused

    # -- rebuilding a replacement ----------------------------------------
    def rebuild_rows(self, position: int, ids: dict, wait: bool = True, ahead: Begun | None = None) -> dict:
        """Rebuild data rows ({table: ids}) of the node at `position` now (touched before their turn); returns
        their records as decoded ({table: records}). Unless `wait`, the restore is sent and its reply left
        to the client's next request: a write the client sends the node after it finds the rows restored,
        or, should the restore fail or come late, refused as not rebuilt (a restore never overwrites a row
        already rebuilt). `ahead`: as `read_many`'s."""
        rows = self.read_many(ids, skip=position, ahead=ahead)
        header = RestoreRows(tables=list(ids), node=self._node(position)).header()
        arrays = [a for table in ids for a in (ids[table], rows[table])]
        if wait:
            self.client._gather({(position,): (header, arrays)})
        else:
            self.client._send_later(position, header, arrays)
        return rows

    def _node(self, position: int) -> str | None:
        """The identity this client expects at `position`: restores meant for it go nowhere else."""
        return self.client._sources.get(position)

    def _rebuild_parity(self, position: int, stripes: dict, generation: int) -> None:
        """Parity rows ({table: stripes}) of `position` from their stripes' data, with the deltas the data
        was read at (the node adds the newer ones it skipped meanwhile, and waits for older ones still on
        their way). A table is given up (the next round reads again) if the node moved on further than
        it remembers."""
        for table, (blocks, senders, counts) in self.recover_many(stripes, skip=position).items():
            layout = self.client._table(table)[1]
            slot = layout.slot_on(position, stripes[table])
            rows = np.ascontiguousarray(blocks[np.arange(stripes[table].size), slot])
            counts = self._degraded_counts(table, layout, stripes[table], counts, position)
            cut = {source: int(sent.get(str(position), 0)) for source, sent, *_ in senders.values()}
            marks = {source: m for source, _, m, *_ in senders.values()}  # which writes the rebuilt rows hold
            seen = {source: peers.get(str(position)) for source, _, _, peers, _ in senders.values()}
            windows = {source: window for source, _, _, _, window in senders.values()}
            header = Restore(table=table, kind="parity", cut=cut, generation=generation, node=self._node(position),
                             marks=marks, seen=seen, windows=windows).header()
            wait, deadline = 0.001, clock.monotonic() + 5.0
            while True:
                try:
                    self.client._call(position, header, [stripes[table], rows, counts])
                    break
                except StaleCut as stale:
                    if not stale.behind or clock.monotonic() > deadline:
                        break
                    clock.sleep(wait)
                    wait = min(2 * wait, 0.05)

    def _degraded_counts(self, table: str, layout, stripes, counts, position: int) -> np.ndarray:
        """How many degraded writes rebuilt parity rows hold: as the parity rows their decode read, or,
        where it read none (all data was there), as another live holder's row."""
        counts = counts.copy()
        states = self.client._states()
        for j in range(layout.r):
            unknown = counts < 0
            if not unknown.any():
                break
            holders = layout.parity_node(stripes, j)
            asks = {(int(q),): (Holds(table=table).header(), [stripes[unknown & (holders == q)]])
                    for q in unique(holders[unknown]).tolist() if q != position and states[q] != "dead"}
            try:
                answers = self.client._gather(asks)
            except (NodeDown, NotRebuilt):
                continue
            for (q,), (_, arrays) in answers.items():
                pick = unknown & (holders == q)
                counts[pick] = np.where(arrays[0].astype(bool), arrays[1], -1)
        return np.maximum(counts, 0)

    def rebuild_step(self, position: int, budget: int, part: tuple = (0, 1)) -> int:
        """Rebuild up to `budget` rows and parity rows of the node at `position`, from `part` (part, parts) of
        what it lacks (see `Missing`); returns how many remain."""
        ask = Missing(limit=budget, part=part[0], parts=part[1], node=self._node(position))
        reply, arrays = self.client._call(position, ask.header(), [])
        generation = reply.get("generation", 0)
        data = {table: arrays[2 * t] for t, table in enumerate(reply["tables"]) if arrays[2 * t].size}
        if data:
            self.rebuild_rows(position, data)
        parity = {table: arrays[2 * t + 1] for t, table in enumerate(reply["tables"]) if arrays[2 * t + 1].size}
        if parity:
            self._rebuild_parity(position, parity, generation)
        left = self.client._call(position, Status().header(), [])[0]["status"]["rebuild_missing"]
        if left == 0:
            self.client.cluster.rebuilt(position)
        return left

