"""Where rows, stripes and parity live: pure placement math, no I/O.

A table of `num_rows` rows is cut into stripes of `k` consecutive row ids;
stripe `s` has `k + r` slots: data slots `0..k-1` (its rows, by position
`id % k`) and parity slots `k..k+r-1`. Slot `t` of stripe `s` sits on node
`(s + t + offset) % nodes`, so the slots of a stripe are on distinct nodes
and over any `nodes` consecutive stripes every node holds every slot once
(data and parity rotate, as in ECRM). `offset` spreads small tables.

On its node, data row `id` of stripe `s` is stored at local offset
`(s // nodes) * k + id % k` and parity slot `j` of stripe `s` at
`(s // nodes) * r + j`; both are dense and unique per node.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np


def table_offset(name: str, nodes: int) -> int:
    """A stable rotation of a table's stripes, so tables start on different nodes."""
    return zlib.crc32(name.encode()) % nodes


@dataclass(frozen=True)
class Layout:
    """Placement of one table's rows and parity over `nodes` active nodes."""

    nodes: int
    k: int
    r: int
    num_rows: int
    offset: int = 0

    def __post_init__(self):
        if self.k < 1 or self.r < 0 or self.nodes < self.k + self.r:
            raise ValueError(f"need k >= 1, r >= 0 and nodes >= k + r, got nodes={self.nodes} k={self.k} r={self.r}")
        if self.num_rows < 1:
            raise ValueError(f"num_rows must be positive, got {self.num_rows}")

    @property
    def num_stripes(self) -> int:
        return -(-self.num_rows // self.k)

    @property
    def width(self) -> int:
        """Slots per stripe: k + r."""
        return self.k + self.r

    @staticmethod
    def of_rows(layouts: list, counts, offsets: np.ndarray | None = None) -> "Layout":
        """A layout of rows of several tables of the same nodes, k and r (`counts[t]` rows of `layouts[t]`,
        one table after the other; `offsets`: the layouts' offsets, if at hand): its offset is one per row, so
        the placement math of them all is one vectorised call each."""
        if len(layouts) == 1:
            return layouts[0]
        if offsets is None:
            offsets = [layout.offset for layout in layouts]
        return Layout.with_offsets(layouts[0], np.repeat(offsets, counts))

    @staticmethod
    def with_offsets(layout: "Layout", offset: np.ndarray) -> "Layout":
        """`layout` with one offset per row (`offset`, int64): rows of tables of its nodes, k and r, in any order."""
        rows = object.__new__(Layout)  # __init__ would check the fields again: the tables' layouts passed
        rows.__dict__.update(layout.__dict__, offset=offset)
        return rows

    # -- rows -> nodes ---------------------------------------------------
    def stripe(self, ids):
        return np.asarray(ids, dtype=np.int64) // self.k

    def position(self, ids):
        return np.asarray(ids, dtype=np.int64) % self.k

    def slot_node(self, stripes, slot):
        """Node holding slot `slot` (0..k+r-1) of each stripe."""
        return (np.asarray(stripes, dtype=np.int64) + slot + self.offset) % self.nodes

    def data_node(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        return (ids // self.k + ids % self.k + self.offset) % self.nodes

    def data_offset(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        return (ids // self.k // self.nodes) * self.k + ids % self.k

    def parity_node(self, stripes, j):
        return self.slot_node(stripes, self.k + j)

    def parity_offset(self, stripes, j):
        return (np.asarray(stripes, dtype=np.int64) // self.nodes) * self.r + j

    def slot_on(self, node: int, stripes):
        """Which slot of each stripe `node` holds (>= k + r: none)."""
        return (node - np.asarray(stripes, dtype=np.int64) - self.offset) % self.nodes

    # -- node -> rows ----------------------------------------------------
    def data_capacity(self) -> int:
        """Local data slots per node (enough for every node)."""
        return -(-self.num_stripes // self.nodes) * self.k

    def parity_capacity(self) -> int:
        return -(-self.num_stripes // self.nodes) * self.r

    def stripes_of(self, node: int, slot: int):
        """Stripes whose slot `slot` is on `node`, ascending."""
        first = (node - slot - self.offset) % self.nodes
        return np.arange(first, self.num_stripes, self.nodes, dtype=np.int64)

    def data_ids(self, node: int, local):
        """Global row ids of local data offsets on `node` (may be >= num_rows: unused)."""
        local = np.asarray(local, dtype=np.int64)
        pos = local % self.k
        stripe = (local // self.k) * self.nodes + (node - pos - self.offset) % self.nodes
        return stripe * self.k + pos

    def parity_stripes(self, node: int, local):
        """(stripe, j) of local parity offsets on `node` (stripe may be >= num_stripes: unused)."""
        local = np.asarray(local, dtype=np.int64)
        j = local % self.r
        stripe = (local // self.r) * self.nodes + (node - self.k - j - self.offset) % self.nodes
        return stripe, j

    def rows_on(self, node: int):
        """Global ids of every data row stored on `node`, in local order."""
        ids = self.data_ids(node, np.arange(self.data_capacity()))
        return ids[ids < self.num_rows]
