"""Degraded reads, degraded writes and rebuilds: decoding rows from the survivors of their stripes.

Survivors return their *committed* records (as of their open window's start),
which are exactly what the parity holds, so every decode reads a consistent cut.
"""
from __future__ import annotations

import itertools
import time

import numpy as np

from .errors import NodeDown, Unavailable

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
    def _survivors(self, table: str, stripes: np.ndarray):
        """(slot nodes, known-zero slots, readable slots) of stripes; Unavailable if one has < k."""
        spec, layout = self.client._table(table)
        k, slots = layout.k, np.arange(layout.width)
        nodes = layout.slot_node(stripes[:, None], slots)
        virtual = np.zeros(nodes.shape, dtype=bool)
        virtual[:, :k] = stripes[:, None] * k + slots[:k] >= spec.num_rows  # past the last row: zeros
        have = self.client._usable()[nodes] | virtual
        short = have.sum(axis=1) < k
        if short.any():
            raise Unavailable(f"table {table!r}: stripe {stripes[short][0]} lost more than r={layout.r} slots")
        return nodes, virtual, have

    def check(self, table: str, ids: np.ndarray) -> None:
        """Raise Unavailable unless every row of `ids` can be decoded."""
        self._survivors(table, np.unique(self.client._table(table)[1].stripe(ids)))

    def recover(self, table: str, stripes: np.ndarray) -> np.ndarray:
        """Every slot (data records and parity, as bytes) of `stripes`: [n, k + r, record bytes]."""
        spec, layout = self.client._table(table)
        k, width = layout.k, layout.width
        nbytes = spec.width * 4
        slots = np.arange(width)
        self.client.settle(time.monotonic() + 30)  # a consistent cut: parity holds every closed window
        nodes, virtual, have = self._survivors(table, stripes)  # after settle, which may fail nodes over
        chosen = have & (np.cumsum(have, axis=1) <= k)
        blocks = np.zeros((stripes.size, width, nbytes), dtype=np.uint8)
        read = chosen & ~virtual
        for node in np.unique(nodes[read]):
            mine = read & (nodes == node)
            rows, cols = np.nonzero(mine[:, :k])
            if rows.size:
                ids = stripes[rows] * k + cols
                recs = self.client._call(int(node), {"op": "get", "table": table, "committed": True, "records": True}, [ids])[1][0]
                blocks[rows, cols] = recs.view(np.uint8)
            rows, cols = np.nonzero(mine[:, k:])
            if rows.size:
                blocks[rows, k + cols] = self.client._call(int(node), {"op": "get_parity", "table": table}, [stripes[rows]])[1][0]
        pattern = chosen @ (1 << slots)
        for value in np.unique(pattern):
            group = np.flatnonzero(pattern == value)
            have_slots = [int(t) for t in slots if value >> t & 1]
            lost = [int(t) for t in slots if not value >> t & 1]
            if lost:
                found = self.code.decode({t: blocks[group, t] for t in have_slots}, lost)
                for t in lost:
                    blocks[group, t] = found[t]
        return blocks

    def read(self, table: str, ids: np.ndarray) -> np.ndarray:
        """Committed records of data rows, decoded from their stripes."""
        _, layout = self.client._table(table)
        stripes, inverse = np.unique(layout.stripe(ids), return_inverse=True)
        blocks = self.recover(table, stripes)
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
        seq = self._next_seq.get(target, 0) + 1
        self._next_seq[target] = seq
        header = {"op": "delta", "source": self.source, "seq": seq, "tables": [table]}
        self.client._call(target, header, [ids, delta])

    # -- rebuilding a replacement ----------------------------------------
    def rebuild_rows(self, position: int, table: str, ids: np.ndarray) -> None:
        """Rebuild data rows of the node at `position` now (they were touched before their turn)."""
        self.client._call(position, {"op": "restore", "table": table, "kind": "data"}, [ids, self.read(table, ids)])

    def rebuild_step(self, position: int, budget: int) -> int:
        """Rebuild up to `budget` rows and parity rows of the node at `position`; returns how many remain."""
        reply, arrays = self.client._call(position, {"op": "missing", "limit": budget}, [])
        for t, table in enumerate(reply["tables"]):
            ids, stripes = arrays[2 * t], arrays[2 * t + 1]
            if ids.size:
                self.rebuild_rows(position, table, ids)
            if stripes.size:
                _, layout = self.client._table(table)
                blocks = self.recover(table, stripes)
                slot = layout.slot_on(position, stripes)
                rows = np.ascontiguousarray(blocks[np.arange(stripes.size), slot])
                self.client._call(position, {"op": "restore", "table": table, "kind": "parity"}, [stripes, rows])
        left = self.client._call(position, {"op": "status"}, [])[0]["status"]["rebuild_missing"]
        if left == 0:
            self.client.cluster.rebuilt(position)
        return left
