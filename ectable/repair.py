"""Degraded reads, degraded writes and rebuilds: decoding rows from the survivors of their stripes.

Survivors return their *committed* records (as of their open window's start) with the numbers
of the deltas those records were sent in; parity holders return what they applied. Reads are
repeated for whatever does not match, so every decode reads a consistent cut without stopping
writers (see `recover`).
"""
from __future__ import annotations

import itertools
import time

import numpy as np

from .errors import Error, NodeDown, StaleCut, Unavailable
from .shard import NotRebuilt

_repairers = itertools.count(1)


class Repair:
    """Decoding paths of one client; `client` supplies tables, node states and calls."""

    def __init__(self, client):
        self.client = client
        self.code = client.config.make_code()
        self.source = f"repair/{next(_repairers)}/{id(self):x}"
        self._next_seq: dict[int, int] = {}

    def forget(self, position: int) -> None:
        """A new node took `position`: its delta sequence starts again."""
        self._next_seq.pop(position, None)

    # -- reading whole stripes -------------------------------------------
    def _slots(self, table: str, stripes: np.ndarray):
        """(slot nodes, known-zero slots, slots on live nodes) of stripes."""
        spec, layout = self.client._table(table)
        k, slots = layout.k, np.arange(layout.width)
        nodes = layout.slot_node(stripes[:, None], slots)
        virtual = np.zeros(nodes.shape, dtype=bool)
        virtual[:, :k] = stripes[:, None] * k + slots[:k] >= spec.num_rows  # past the last row: zeros
        return nodes, virtual, (self.client._states() != "dead")[nodes] | virtual

    def _short(self, table, stripes, have) -> None:
        short = have.sum(axis=1) < self.client._table(table)[1].k
        if short.any():
            raise Unavailable(f"table {table!r}: stripe {stripes[short][0]} lost more than r="
                              f"{self.client._table(table)[1].r} slots")

    def check(self, table: str, ids: np.ndarray) -> None:
        """Raise Unavailable unless every row of `ids` can be decoded."""
        stripes = np.unique(self.client._table(table)[1].stripe(ids))
        self._short(table, stripes, self._slots(table, stripes)[2])

    def recover(self, table: str, stripes: np.ndarray, skip: int | None = None) -> tuple[np.ndarray, dict]:
        """Every slot (data records and parity, as bytes) of `stripes`, [n, k + r, record bytes], decoded
        from a consistent cut; and that cut: {position: (source, delta numbers sent per target)} of the
        data slots read directly. Slots on node `skip` (the one being rebuilt) are not read.

        Slots are read from any live node, rebuilding ones included (a slot they have not rebuilt yet
        counts as lost). The cut is consistent when every parity holder read has applied exactly the
        deltas that the data nodes read had sent it; otherwise the parity of holders still waiting for
        deltas, or the data of nodes that moved on, is read again until it is.
        """
        spec, layout = self.client._table(table)
        deadline = time.monotonic() + 30
        unread = None  # slots a rebuilding node said it has not rebuilt
        while True:
            nodes, virtual, have = self._slots(table, stripes)  # again after a failover
            if unread is None:
                unread = nodes == skip
            have &= ~unread
            self._short(table, stripes, have)
            chosen = have & (np.cumsum(have, axis=1) <= layout.k)
            read = chosen & ~virtual
            blocks = np.zeros((stripes.size, layout.width, spec.width * 4), dtype=np.uint8)
            senders, holders = {}, {}
            try:
                while read.any():  # the first time every slot; then only what moved on or lagged behind
                    self._read(table, stripes, nodes, read, blocks, senders, holders)
                    read = self._inconsistent(nodes, chosen & ~virtual, senders, holders, layout.k)
                    if read.any():
                        if time.monotonic() > deadline:
                            raise Error(f"table {table!r}: parity holders kept lagging behind the data")
                        time.sleep(0.001)
            except NotRebuilt as exc:
                self._not_rebuilt(table, stripes, nodes, unread, exc)
                continue
            break
        self._decode(blocks, chosen, layout.width)
        return blocks, senders

    @staticmethod
    def _inconsistent(nodes, read, senders, holders, k) -> np.ndarray:
        """Slots to read again: parity of holders that have not applied every delta the data nodes
        read had sent them, and data of nodes that sent deltas a holder applied after the data was read."""
        lagging, ahead = set(), set()
        for q, applied in holders.items():
            for d, (source, sent) in senders.items():
                have, want = applied.get(source, 0), int(sent.get(str(q), 0))
                if have < want:
                    lagging.add(q)
                elif have > want:
                    ahead.add(d)
        again = np.zeros(read.shape, dtype=bool)
        again[:, :k] = np.isin(nodes[:, :k], list(ahead))
        again[:, k:] = np.isin(nodes[:, k:], list(lagging))
        return again & read

    def _read(self, table, stripes, nodes, read, blocks, senders, holders) -> None:
        """Read the `read` slots into `blocks`, one request per node and kind, all in flight at once;
        note what each data node had sent (`senders`) and each parity holder applied (`holders`)."""
        k = self.client._table(table)[1].k
        requests, where = {}, {}
        for node in np.unique(nodes[read]):
            mine = read & (nodes == node)
            rows, cols = np.nonzero(mine[:, :k])
            if rows.size:
                requests[(int(node), "data")] = ({"op": "get", "table": table, "committed": True, "records": True},
                                                 [stripes[rows] * k + cols])
                where[(int(node), "data")] = (rows, cols)
            rows, cols = np.nonzero(mine[:, k:])
            if rows.size:
                requests[(int(node), "parity")] = ({"op": "get_parity", "table": table}, [stripes[rows]])
                where[(int(node), "parity")] = (rows, k + cols)
        for (node, kind), (reply, arrays) in self.client._gather(requests).items():
            rows, cols = where[(node, kind)]
            blocks[rows, cols] = arrays[0].view(np.uint8) if kind == "data" else arrays[0]
            if kind == "data":
                senders[node] = (reply["source"], reply["sent"])
            else:
                holders[node] = reply["applied"]

    def _not_rebuilt(self, table, stripes, nodes, unread, exc) -> None:
        """A rebuilding node lacks some slots: mark them unread (data ids or parity stripes)."""
        _, layout = self.client._table(table)
        node = exc.position
        if exc.kind == "parity":
            rows = np.isin(stripes, exc.ids)
            unread[rows, layout.k:] |= nodes[rows, layout.k:] == node
        else:
            rows = np.isin(stripes, layout.stripe(exc.ids))
            unread[rows, :layout.k] |= (nodes[rows, :layout.k] == node) & np.isin(
                stripes[rows, None] * layout.k + np.arange(layout.k), exc.ids)

    def _decode(self, blocks, chosen, width) -> None:
        slots = np.arange(width)
        pattern = chosen @ (1 << slots)
        for value in np.unique(pattern):
            group = np.flatnonzero(pattern == value)
            have_slots = [int(t) for t in slots if value >> t & 1]
            lost = [int(t) for t in slots if not value >> t & 1]
            if lost:
                every = group.size == blocks.shape[0]  # one pattern for all stripes: views, no copies
                found = self.code.decode({t: blocks[:, t] if every else blocks[group, t] for t in have_slots}, lost)
                for t in lost:
                    blocks[group, t] = found[t]

    def read(self, table: str, ids: np.ndarray, skip: int | None = None) -> np.ndarray:
        """Committed records of data rows, decoded from their stripes."""
        _, layout = self.client._table(table)
        stripes, inverse = np.unique(layout.stripe(ids), return_inverse=True)
        blocks, _ = self.recover(table, stripes, skip)
        return blocks[inverse.reshape(-1), layout.position(ids)].view(np.float32)

    # -- writing through parity ------------------------------------------
    def write(self, table: str, kind: str, ids: np.ndarray, values: np.ndarray) -> None:
        """Apply a write to rows of a dead node by updating their parity alone."""
        spec, layout = self.client._table(table)
        old = self.read(table, ids)
        new = old.copy()
        if kind == "put":
            new[:, : spec.dim] = values
        else:
            spec.make_optimizer().step(new, values, spec.dim)
        delta = old.view(np.uint8) ^ new.view(np.uint8)
        stripes = layout.stripe(ids)
        usable = self.client._states() != "dead"
        lost = []
        for j in range(layout.r):
            targets = layout.parity_node(stripes, j)
            for target in np.unique(targets):
                if not usable[target]:
                    continue  # its parity is rebuilt from the data later
                pick = targets == target
                try:
                    self.send_delta(int(target), table, ids[pick], delta[pick])
                except NodeDown:  # never retry a half-applied degraded write: the dead holder is rebuilt
                    lost.append(int(target))
        for target in lost:
            self.client._lost(target)

    def send_delta(self, target: int, table: str, ids, delta) -> None:
        order = np.argsort(ids)  # a delta names its stripes in ascending order
        ids, delta = ids[order], delta[order]
        seq = self._next_seq.get(target, 0) + 1
        self._next_seq[target] = seq
        header = {"op": "delta", "source": self.source, "seq": seq, "tables": [table]}
        self.client._call(target, header, [ids, delta])

    # -- rebuilding a replacement ----------------------------------------
    def rebuild_rows(self, position: int, table: str, ids: np.ndarray) -> None:
        """Rebuild data rows of the node at `position` now (they were touched before their turn)."""
        rows = self.read(table, ids, skip=position)
        self.client._call(position, {"op": "restore", "table": table, "kind": "data", "node": self._node(position)},
                          [ids, rows])

    def _node(self, position: int) -> str | None:
        """The identity this client expects at `position`: restores meant for it go nowhere else."""
        return self.client._sources.get(position)

    def _rebuild_parity(self, position: int, table: str, stripes: np.ndarray, generation: int) -> None:
        """Parity rows of `position` from their stripes' data, with the deltas the data was read at
        (the node adds the newer ones it skipped meanwhile, and waits for older ones still on their way).
        Given up (the next round reads again) if the node moved on further than it remembers."""
        _, layout = self.client._table(table)
        slot = layout.slot_on(position, stripes)
        blocks, senders = self.recover(table, stripes, skip=position)
        rows = np.ascontiguousarray(blocks[np.arange(stripes.size), slot])
        cut = {source: int(sent.get(str(position), 0)) for source, sent in senders.values()}
        header = {"op": "restore", "table": table, "kind": "parity", "cut": cut, "generation": generation,
                  "node": self._node(position)}
        wait, deadline = 0.001, time.monotonic() + 5.0
        while True:
            try:
                self.client._call(position, header, [stripes, rows])
                return
            except StaleCut as stale:
                if not stale.behind or time.monotonic() > deadline:
                    return
                time.sleep(wait)
                wait = min(2 * wait, 0.05)

    def rebuild_step(self, position: int, budget: int) -> int:
        """Rebuild up to `budget` rows and parity rows of the node at `position`; returns how many remain."""
        reply, arrays = self.client._call(position, {"op": "missing", "limit": budget, "node": self._node(position)}, [])
        generation = reply.get("generation", 0)
        for t, table in enumerate(reply["tables"]):
            ids, stripes = arrays[2 * t], arrays[2 * t + 1]
            if ids.size:
                self.rebuild_rows(position, table, ids)
            if stripes.size:
                self._rebuild_parity(position, table, stripes, generation)
        left = self.client._call(position, {"op": "status"}, [])[0]["status"]["rebuild_missing"]
        if left == 0:
            self.client.cluster.rebuilt(position)
        return left
