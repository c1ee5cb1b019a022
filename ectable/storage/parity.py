"""Parity deltas of many tables at once, on one node: its closing window split by target, a received
delta's rows checked and placed, queued deltas folded into parity.

Each works on every table of a width in a few vectorised passes instead of a pass per table: the
placement math takes one table offset per row (`Layout.of_rows`). A node of the criteo-like bench
holds 26 tables; per-table calls, not bytes, were most of what parity cost.
"""
from __future__ import annotations

import numpy as np

from ..codes import gf256
from ..errors import InvalidRequest
from ..layout import Layout


class Named:
    """The shards of the tables a delta message names, as arrays: what its checks and `delta_slots` need of
    each (`kept`: the message's indices of these tables; the others were dropped here)."""

    __slots__ = ("shards", "names", "kept", "all", "bytes", "width", "num_rows", "offsets")

    def __init__(self, shards: list, kept: list, tables: int):
        self.shards, self.kept, self.all = shards, kept, len(kept) == tables
        self.names = [s.spec.name for s in shards]
        self.bytes = np.array([s.width * 4 for s in shards], dtype=np.int64)
        self.width = self.bytes[0] if shards and (self.bytes == self.bytes[0]).all() else None  # bytes a row: one
        self.num_rows = np.array([s.spec.num_rows for s in shards], dtype=np.int64)
        self.offsets = np.array([s.layout.offset for s in shards], dtype=np.int64)


def delta_slots(shards: list, counts: np.ndarray, ids: np.ndarray, named: Named | None = None) -> tuple:
    """`Shard.delta_slots` of the rows of several tables of one node at once: `ids` holds each shard's rows
    one shard after the other, `counts[t]` of them for `shards[t]` (`named`: of these shards, if at hand).
    Raises InvalidRequest naming the table of the first row that is out of range, whose parity is not on this
    node, or whose stripe does not ascend within its table."""
    if not shards:
        return ids[:0], ids[:0], ids[:0]
    node, bounds = shards[0].node, np.cumsum(counts)
    layout = Layout.of_rows([s.layout for s in shards], counts, named and named.offsets)
    name = lambda row: shards[int(np.searchsorted(bounds, row, side="right"))].spec.name  # noqa: E731
    limit = shards[0].spec.num_rows if len(shards) == 1 else np.repeat(
        named.num_rows if named else [s.spec.num_rows for s in shards], counts)
    bad = np.flatnonzero(np.asarray(ids, dtype=np.int64).view(np.uint64) >= limit)  # a negative id: a huge one
    if bad.size:
        raise InvalidRequest(f"table {name(bad[0])!r}: id {ids[bad[0]]} is out of range "
                             f"[0, {np.broadcast_to(limit, ids.shape)[bad[0]]})")
    stripes = layout.stripe(ids)
    j = layout.slot_on(node, stripes) - layout.k
    bad = np.flatnonzero(j.view(np.uint64) >= layout.r)  # negative j wraps to a huge unsigned value
    if bad.size:
        raise InvalidRequest(f"table {name(bad[0])!r}: node {node} holds no parity of some stripes")
    descending = np.concatenate(([False], stripes[1:] <= stripes[:-1]))  # rows not above the one before...
    descending[bounds[:-1][bounds[:-1] < ids.size]] = False  # ...within their table
    if descending.any():
        raise InvalidRequest(f"table {name(np.argmax(descending))!r}: a delta must name its stripes in ascending "
                             f"order, each once")
    return j, layout.parity_offset(stripes, j), layout.position(ids)


def window_deltas(windows, position: int, config) -> dict:
    """Close node `position`'s windows (`window.Windows`): {target: (tables, delta arrays)} for every other node,
    each target's rows of every table in one payload (`protocol.deltas`), the tables of a width computed
    together."""
    r, nodes = config.r, config.nodes
    found: dict[int, list] = {t: [] for t in range(nodes) if t != position}
    for group in windows.by_width.values():
        drained = [window.drain_tables() for window in group if len(window)]  # (tables, table, local, delta) each
        if not drained:
            continue
        if len(drained) == 1:
            shards, table, local, delta = drained[0]
        else:  # tables of this width in several windows: number them together
            first = np.cumsum([0] + [len(d[0]) for d in drained[:-1]])
            shards = [shard for d in drained for shard in d[0]]
            table = np.concatenate([d[1] + f for d, f in zip(drained, first)])
            local, delta = (np.concatenate([d[n] for d in drained]) for n in (2, 3))
        layout = Layout.with_offsets(shards[0].layout, np.array([s.layout.offset for s in shards])[table])
        ids = layout.data_ids(position, local)
        stripes = layout.stripe(ids)
        targets = np.concatenate([layout.parity_node(stripes, j) for j in range(r)])
        if nodes * len(shards) < 1 << 22:  # by target, table, stripe (stripes < 2**40): one sort key
            order = np.argsort((targets * len(shards) + np.tile(table, r)) << 40 | np.tile(stripes, r))
        else:
            order = np.lexsort((np.tile(stripes, r), np.tile(table, r), targets))
        rows = np.tile(np.arange(ids.size), r)[order]
        bounds = np.searchsorted(targets[order], np.arange(nodes + 1)).tolist()
        for target in np.flatnonzero(np.diff(bounds)).tolist():  # only the nodes this window has rows for
            pick = rows[bounds[target]:bounds[target + 1]]
            found[target].append((shards, np.bincount(table[pick], minlength=len(shards)), ids[pick],
                                   np.take(delta, pick, axis=0)))
    parts = {}
    for target, pieces in found.items():
        names = [shard.spec.name for group, n, _, _ in pieces for shard, c in zip(group, n) if c]
        shape = np.array([[c, shard.width * 4] for group, n, _, _ in pieces for shard, c in zip(group, n) if c],
                         dtype=np.int64).reshape(-1, 2)
        if len(pieces) == 1:  # one width: the target's rows as gathered
            ids, delta = pieces[0][2], pieces[0][3].reshape(-1)
        else:
            ids = np.concatenate([p[2] for p in pieces] or [np.empty(0, np.int64)])
            delta = np.concatenate([p[3].reshape(-1) for p in pieces] or [np.empty(0, np.uint8)])
        parts[target] = (names, [shape, ids, delta])
    return parts


class Queued:
    """One received delta message's rows of its tables of one width, checked and placed (`delta_slots`), until
    they are folded into parity: `counts[t]` rows of `shards[t]`, one table after the other, in `ids`,
    `delta` (uint8 [n, bytes]) and `slots` (j, local parity offset, position)."""

    __slots__ = ("shards", "counts", "ids", "delta", "slots", "source", "seq", "at")

    def __init__(self, shards: list, counts: list, ids, delta, slots: tuple, source: str, seq: int):
        self.shards, self.counts, self.ids, self.delta, self.slots = shards, counts, ids, delta, slots
        self.source, self.seq = source, seq
        self.at = np.cumsum([0, *counts]).tolist()  # where each table's rows begin, and the end

    def parts(self) -> list:
        """[(shard, ids, delta, slots)] per table."""
        return [(shard, self.ids[a:b], self.delta[a:b], tuple(s[a:b] for s in self.slots))
                for shard, a, b in zip(self.shards, self.at, self.at[1:])]

    def take(self, tables: list, delta=None) -> "Queued":
        """The same message's rows of tables `tables` (indices into `shards`) only (`delta`: their delta rows,
        if this entry has none)."""
        if len(tables) == len(self.shards) and delta is None:
            return self
        at = self.at
        pick = np.concatenate([np.arange(at[t], at[t + 1]) for t in tables] or [np.arange(0)])
        return Queued([self.shards[t] for t in tables], [self.counts[t] for t in tables], self.ids[pick],
                      np.take(self.delta, pick, axis=0) if delta is None else delta, tuple(s[pick] for s in self.slots),
                      self.source, self.seq)

    def without(self, table: str) -> "Queued":
        """The same message without table `table`'s rows."""
        return self.take([t for t, s in enumerate(self.shards) if s.spec.name != table])

    def runs(self) -> list:
        """[(block, first row, end row, rows in the block)]: the message's parity rows in the node's arena,
        by runs of tables in one block, their initial values computed."""
        shards, local, at = self.shards, self.slots[1], self.at
        for shard, a, b in zip(shards, at, at[1:]):
            if shard.fresh_parity is not None:
                shard.block_rows(local[a:b])
        rows = np.repeat([s.parity_base for s in shards], self.counts) + local
        starts = [0] + [t for t in range(1, len(shards)) if shards[t].block is not shards[t - 1].block]
        return [(shards[a].block, at[a], at[b], rows[at[a]:at[b]])
                for a, b in zip(starts, starts[1:] + [len(shards)])]


def fold(code, entries: list) -> None:
    """Fold queued deltas of one width (`Queued`, from any senders) into their shards' parity rows (every
    parity row of those shards is there). Each message's rows go into the parity rows of all its tables with
    one gather, XOR and scatter per block of the node's arena (a message names each table once and each parity
    row of a table once; two messages may name the same parity row). With GF(2^8) coefficients, the rows of
    such a run are taken in order of coefficient, and their parity rows gathered in that order, so that each
    term is XORed in as it is computed (`gf256.addmul_sorted`)."""
    delta = np.concatenate([e.delta for e in entries]) if len(entries) > 1 else entries[0].delta
    runs, at = [], 0  # (block, first and end row of the deltas, parity rows)
    for entry in entries:
        runs.extend((block, at + start, at + end, rows) for block, start, end, rows in entry.runs())
        at += entry.ids.size
    if code.unit:  # XOR: a delta is its own term
        for block, start, end, rows in runs:
            gf256.xor_rows(block.rows, rows, delta[start:end])
        return
    j, pos = (np.concatenate([e.slots[n] for e in entries]) for n in (0, 2))
    run = np.repeat(np.arange(len(runs)), [end - start for _, start, end, _ in runs])
    order, coef = code.grouped(j, pos, run)  # each run's rows in its place, by coefficient
    for block, start, end, rows in runs:
        gf256.addmul_rows(block.rows, rows[order[start:end] - start], coef[start:end], delta, order[start:end])
