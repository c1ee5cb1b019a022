"""A read of whole stripes towards a consistent cut: which slots to read from which node, what the replies
said, and which slots to read again (`Repair.recover_many` does the I/O). Pure bookkeeping: no I/O.

One `Cut` covers every table of a decode whose records have one size (and whose layouts one shape), their
stripes one after the other in one set of arrays: the slots of all of them are placed, asked for, filled
in, checked and decoded with one call each, not one per table.
"""
from __future__ import annotations

import numpy as np

from ..arrays import unique
from ..errors import Unavailable
from ..layout import Layout

NONE = np.zeros(0, dtype=np.int64)


class Cut:
    """Slots of `stripes` ({table: stripes}, tables of one record size and layout shape), [n, k + r] per array,
    rows table after table; slots on node `skip` (the one being rebuilt) and those `unread` marks ([n, k + r]
    bool, None: none yet) are not read. Raises Unavailable if a stripe lacks k slots to read, with every
    position's `states`; `known`: the node identities the map of those states names (at a position or fenced)."""

    def __init__(self, stripes: dict, layouts: list, num_rows: list, record_bytes: int, skip, unread, states,
                 known: frozenset):
        self.tables = list(stripes)
        counts = [s.size for s in stripes.values()]
        self.bounds = np.cumsum([0] + counts)
        self.stripes = np.concatenate(list(stripes.values())) if len(counts) > 1 else next(iter(stripes.values()))
        layout = Layout.of_rows(layouts, counts)
        self.k = k = layout.k
        slots = np.arange(layout.width)
        self.nodes = nodes = (layout.slot_node(self.stripes, 0)[:, None] + slots) % layout.nodes
        self.virtual = virtual = np.zeros(nodes.shape, dtype=bool)  # past a table's last row: zeros
        virtual[:, :k] = self.stripes[:, None] * k + slots[:k] >= np.repeat(num_rows, counts)[:, None]
        alive = (np.asarray(states) != "dead")[nodes] & ~virtual
        self.unread = nodes == skip if unread is None else unread
        have = (alive | virtual) & ~self.unread
        short = have.sum(axis=1) < k
        if short.any():
            at = int(np.argmax(short))
            table = self.tables[int(np.searchsorted(self.bounds, at, side="right")) - 1]
            raise Unavailable(f"table {table!r}: stripe {self.stripes[at]} lost more than r={layout.r} slots")
        self.chosen = have & (np.cumsum(have, axis=1) <= k)
        self.read = self.chosen & ~virtual  # slots to read (again) next
        # Live data nodes whose slots are decoded, not read (they are rebuilding them): what they had sent each
        # holder is part of the cut all the same, or deltas they send meanwhile would be missed by a rebuilt
        # parity row (a holder lacking the row skips them, and folds in at restore only those of the cut). So is
        # the node rebuilt (`skip`): rows it lacked when it said so may be rebuilt and written since, by others.
        self._data = alive[:, :k] & (nodes[:, :k] != skip)  # every data node whose sends a restore is told of
        self.markers = set(_distinct(nodes[:, :k][alive[:, :k] & ~self.chosen[:, :k]]))
        self.known = known
        self.mark = set(self.markers)  # markers to ask (again) next: no rows, what they had sent
        self.senders: dict = {}  # data node -> (source, sent, marks, peers, window) of its last reply
        self.holders: dict = {}  # parity holder -> (source, applied) of its last reply
        self.versions = np.full(nodes.shape, -1, dtype=np.int64)  # degraded writes of each parity slot read
        self.blocks = np.zeros((self.stripes.size, layout.width, record_bytes), dtype=np.uint8)

    def pending(self) -> bool:
        """Whether some slots (or markers) are to be read (again)."""
        return bool(self.read.any() or self.mark)

    def asks(self) -> dict:
        """{(node, "data" or "parity"): (tables, one keys array each (data ids or stripes), rows, cols)} of the
        slots to read now, rows and cols table after table; a marker not asked for rows is asked for none."""
        rows, cols = np.nonzero(self.read)  # row-major: each table's slots stay in order
        table = np.searchsorted(self.bounds, rows, side="right") - 1
        key = (self.nodes[rows, cols] * 2 + (cols >= self.k)) * len(self.tables) + table
        order = np.argsort(key, kind="stable")
        key, rows, cols, table = key[order], rows[order], cols[order], table[order]
        keys = np.where(cols >= self.k, self.stripes[rows], self.stripes[rows] * self.k + cols)
        out = {}
        node_kind = key // len(self.tables)
        starts = np.flatnonzero(np.diff(node_kind)) + 1
        for seg in np.split(np.arange(key.size), starts) if key.size else ():
            node, parity = divmod(int(node_kind[seg[0]]), 2)
            names = table[seg]
            at = np.flatnonzero(np.diff(names)) + 1
            out[(node, "parity" if parity else "data")] = (
                [self.tables[t] for t in names[np.concatenate([[0], at])].tolist()],
                np.split(keys[seg], at), rows[seg], cols[seg])
        for node in self.mark:  # no rows: its reply's delta numbers are what the cut needs of it
            out.setdefault((node, "data"), ([self.tables[0]], [NONE], NONE, NONE))
        return out

    def put(self, rows, cols, records: list) -> None:
        """blocks[rows, cols] = `records` (arrays of whole records, one after the other), each record copied as
        one block."""
        n, width, size = self.blocks.shape
        cell = np.dtype((np.void, size))
        cells = self.blocks.reshape(n * width, size).view(cell)[:, 0]
        at, start = rows * width + cols, 0
        for part in records:  # not concatenated first: a rebuild's replies are large
            part = np.ascontiguousarray(part).view(np.uint8).reshape(-1, size).view(cell)[:, 0]
            cells[at[start: start + part.size]] = part
            start += part.size

    def check(self, lagging: set, ahead: set) -> None:
        """The reads so far, with the holders `lagging` behind the data read and the data nodes `ahead` of the
        parity read (`lag`): set the slots to read again (`inconsistent`)."""
        self.read = inconsistent(self.nodes, self.chosen & ~self.virtual, lagging, ahead, self.k, self.versions)
        self.mark = self.markers & ahead

    def stale(self) -> bool:
        """Whether a parity holder read applied deltas of a node that the plan's map named nowhere: one that took a
        position since, which that map showed dead. The cut counts what each live data node sent (those read and
        the `markers`), so not that node's deltas, which some holders of a stripe may have applied and others not
        yet: decoded from both, its rows would be wrong. The stripes are to be planned again on a newer map."""
        return any(s.startswith("node/") for _, applied in self.holders.values() for s in applied.keys() - self.known)

    def not_rebuilt(self, node: int, kind: str, missing: dict) -> None:
        """Rebuilding `node` lacks some slots ({table: ids}, if `kind` is "data", else stripes): mark them unread."""
        k, nodes = self.k, self.nodes
        for name, ids in missing.items():
            if name not in self.tables:
                continue
            t = self.tables.index(name)
            span = slice(self.bounds[t], self.bounds[t + 1])
            stripes, unread = self.stripes[span], self.unread[span]
            if kind == "parity":
                rows = np.isin(stripes, ids)
                unread[rows, k:] |= nodes[span][rows, k:] == node
            else:
                rows = np.isin(stripes, ids // k)
                unread[rows, :k] |= (nodes[span][rows, :k] == node) & np.isin(stripes[rows, None] * k + np.arange(k), ids)

    def split(self) -> dict:
        """{table: (blocks, the data nodes read (their `senders` entries), the degraded writes per stripe)}."""
        out = {}
        for t, table in enumerate(self.tables):
            span = slice(self.bounds[t], self.bounds[t + 1])
            read = _distinct(self.nodes[span, :self.k][self._data[span]])
            senders = {d: self.senders[d] for d in read if d in self.senders}
            out[table] = (self.blocks[span], senders, self.versions[span].max(axis=1))
        return out


def _distinct(nodes: np.ndarray) -> list:
    """The distinct node positions in `nodes`, ascending (counted: they are few and small)."""
    return np.flatnonzero(np.bincount(nodes, minlength=1)).tolist()


def lag(senders: dict, holders: dict) -> tuple[set, set]:
    """(holders that have not applied every delta the data nodes read had sent them, data nodes that sent
    deltas a holder applied after the data was read). A holder and a data node that disagree on who holds the
    holder's position are both read again: a data node counts its deltas per node, and sends none to a position
    it takes for replaced (that parity is rebuilt from data)."""
    lagging, ahead = set(), set()
    for q, (holder, applied) in holders.items():
        for d, (source, sent, _, peers, _) in senders.items():
            if peers.get(str(q), holder) != holder:
                lagging.add(q)
                ahead.add(d)
                continue
            have, want = applied.get(source, 0), int(sent.get(str(q), 0))
            if have < want:
                lagging.add(q)
            elif have > want:
                ahead.add(d)
    return lagging, ahead


def inconsistent(nodes, read, lagging: set, ahead: set, k: int, versions) -> np.ndarray:
    """Slots to read again: parity of `lagging` holders, or of holders with fewer degraded writes than another
    holder of the stripe read (one is on its way to them), and data of nodes `ahead`. A holder read again is read
    again whole (all its parity slots of the cut): what one reply says it applied holds only for the slots that
    reply carried."""
    again = np.zeros(read.shape, dtype=bool)
    again[:, :k] = np.isin(nodes[:, :k], list(ahead))
    again[:, k:] = np.isin(nodes[:, k:], list(lagging))
    counts = np.where(read[:, k:], versions[:, k:], -1)
    again[:, k:] |= read[:, k:] & (counts < counts.max(axis=1, keepdims=True))
    again &= read
    again[:, k:] |= np.isin(nodes[:, k:], unique(nodes[:, k:][again[:, k:]])) & read[:, k:]
    return again
