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


def delta_slots(shards: list, counts: np.ndarray, ids: np.ndarray) -> tuple:
    """`Shard.delta_slots` of the rows of several tables of one node at once: `ids` holds each shard's rows
    one shard after the other, `counts[t]` of them for `shards[t]`. Raises InvalidRequest naming the table
    of the first row that is out of range, whose parity is not on this node, or whose stripe does not
    ascend within its table."""
    if not shards:
        return ids[:0], ids[:0], ids[:0]
    node, bounds = shards[0].node, np.cumsum(counts)
    layout = Layout.of_rows([s.layout for s in shards], counts)
    name = lambda row: shards[int(np.searchsorted(bounds, row, side="right"))].spec.name  # noqa: E731
    limit = shards[0].spec.num_rows if len(shards) == 1 else np.repeat([s.spec.num_rows for s in shards], counts)
    bad = np.flatnonzero((ids < 0) | (ids >= limit))
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


def window_deltas(shards, position: int, config) -> dict:
    """Close the windows of node `position`'s shards: {target: (tables, delta arrays)} for every other node,
    each target's rows of every table in one payload (`protocol.deltas`), tables of a width computed together."""
    r, nodes = config.r, config.nodes
    by_width: dict[int, list] = {}
    for shard in shards:
        if len(shard.window):
            by_width.setdefault(shard.width, []).append(shard)
    found: dict[int, list] = {t: [] for t in range(nodes) if t != position}
    for group in by_width.values():
        drained = [shard.window.drain() for shard in group]  # (local rows, old ^ new record bytes) each
        counts = np.array([local.size for local, _ in drained])
        layout = Layout.of_rows([shard.layout for shard in group], counts)
        ids = layout.data_ids(position, np.concatenate([local for local, _ in drained]))
        delta = np.concatenate([delta for _, delta in drained])
        table = np.repeat(np.arange(len(group)), counts)
        stripes = layout.stripe(ids)
        targets = np.concatenate([layout.parity_node(stripes, j) for j in range(r)])
        if nodes * len(group) < 1 << 22:  # by target, table, stripe (stripes < 2**40): one sort key
            order = np.argsort((targets * len(group) + np.tile(table, r)) << 40 | np.tile(stripes, r))
        else:
            order = np.lexsort((np.tile(stripes, r), np.tile(table, r), targets))
        rows = np.tile(np.arange(ids.size), r)[order]
        bounds = np.searchsorted(targets[order], np.arange(nodes + 1)).tolist()
        for target in np.flatnonzero(np.diff(bounds)).tolist():  # only the nodes this window has rows for
            pick = rows[bounds[target]:bounds[target + 1]]
            found[target].append((group, np.bincount(table[pick], minlength=len(group)), ids[pick], delta[pick]))
    parts = {}
    for target, pieces in found.items():
        names = [shard.spec.name for group, n, _, _ in pieces for shard, c in zip(group, n) if c]
        shape = np.array([[c, shard.width * 4] for group, n, _, _ in pieces for shard, c in zip(group, n) if c],
                         dtype=np.int64).reshape(-1, 2)
        ids = np.concatenate([p[2] for p in pieces] or [np.empty(0, np.int64)])
        delta = np.concatenate([p[3].reshape(-1) for p in pieces] or [np.empty(0, np.uint8)])
        parts[target] = (names, [shape, ids, delta])
    return parts


def fold(code, entries: list) -> None:
    """Fold queued deltas of one width, [(shard, ids, delta, slots, source, seq)] from any senders and tables,
    into their shards' parity rows (every parity row of those shards is there). The GF(2^8) terms of all of
    them take one pass per coefficient (at most k * r passes, however many deltas); then each message's
    terms go into the parity rows of all its tables with one gather, XOR and scatter per block of the node's
    arena (a message names each table once and each parity row of a table once)."""
    entries = sorted(entries, key=lambda e: (e[4], e[5]))  # each message's tables together
    delta = np.concatenate([e[2] for e in entries])
    if code.unit:  # XOR: a delta is its own term
        terms = delta
    else:
        j, pos = (np.concatenate([e[3][n] for e in entries]) for n in (0, 2))
        terms = code.delta_terms(j, pos, delta)
    rows = np.concatenate([shard.block_rows(slots[1]) for shard, _, _, slots, *_ in entries])
    at = np.cumsum([0] + [e[1].size for e in entries]).tolist()
    starts = [0] + [n for n in range(1, len(entries))  # where a message's run of tables in one block begins
                    if entries[n][4:6] != entries[n - 1][4:6] or entries[n][0].block is not entries[n - 1][0].block]
    for first, end in zip(starts, starts[1:] + [len(entries)]):
        pick = slice(at[first], at[end])
        gf256.xor_rows(entries[first][0].block.rows, rows[pick], terms[pick])
