"""The dirty window: rows written since it opened, each with its parity delta so far; and, in the same flag
byte per row, the rows written since the last checkpoint, since the last full one, and ever (one tracker,
two uses).

A node's tables of one record width share windows (`Windows`): each `Window` holds the flags of a block of
rows, handed out to tables in ranges (`TableWindow`), and one list of the rows written in it, whatever their
table. A write of many tables records its changes with one call per window, and closing reads each window
once: per-table calls, not rows, were most of what the window cost a node.
"""
from __future__ import annotations

import numpy as np

from .arena import Block

IN_WINDOW, SINCE_CHECKPOINT, SINCE_FULL, WRITTEN = 1, 2, 4, 8  # the flag bits
SINCE_COPY = 16  # changed since a handover copied the rows (`storage.handover.copy_rows`), initial values computed too
CHECKPOINT_BITS = SINCE_CHECKPOINT | SINCE_FULL | WRITTEN
BLOCK_ROWS = 1 << 24  # flags in a window, unless one table needs more (then it has a window of its own)


class Window:
    """Rows of records of `width` float32 written since the window opened, and for each the XOR of its record
    bytes then and now (its parity delta), built at write time while both are at hand: closing the window reads
    no record. Rows are numbered in the window (a table's row `local` is `base + local`, see `TableWindow`).

    Costs one flag byte per row (pages never written take no memory); everything else is proportional to the
    rows written in the window.
    """

    def __init__(self, rows: int, width: int):
        self.width = width
        self._block = Block(rows, 1)
        self.flags = self._block.rows[:, 0]  # zero until written
        self.tables: list = []  # TableWindow of each range still in use, by base
        self._bases = np.empty(0, dtype=np.int64)
        self._rows = np.empty(0, dtype=np.int64)
        self._delta = np.empty((0, width), dtype=np.uint32)
        self._order = None  # argsort of the window's rows, for lookups; None: stale
        self.size = 0

    def __len__(self):
        return self.size

    @property
    def used(self) -> int:
        """Rows handed out to tables, from the start."""
        return self._block.used

    def record(self, rows: np.ndarray, old: np.ndarray, new: np.ndarray) -> None:
        """Unique rows `rows` change from records `old` to `new` (float32 [n, width]): add to their deltas."""
        change = old.view(np.uint32) ^ new.view(np.uint32)
        flags = self.flags[rows]
        again = (flags & IN_WINDOW).astype(bool)
        fresh = rows[~again]
        end = self.size + fresh.size
        if end > self._rows.size:  # (flags are set last: a failure before leaves the window as it was)
            grow = max(end, 2 * self._rows.size, 1024)
            self._rows = np.resize(self._rows, grow)
            delta = np.empty((grow, self.width), dtype=np.uint32)
            delta[: self.size] = self._delta[: self.size]
            self._delta = delta
        if fresh.size < rows.size:  # written before in this window: the deltas add up
            self._delta[self._slots(rows[again])] ^= change[again]
            change = change[~again]
        if fresh.size:
            self._rows[self.size:end] = fresh
            self._delta[self.size:end] = change
            self.size = end
            self._order = None
        self.flags[rows] = flags | (IN_WINDOW | CHECKPOINT_BITS | SINCE_COPY)

    def delta(self, rows: np.ndarray) -> np.ndarray:
        """The deltas so far (uint32 [n, width]) of rows `rows`, each in the window."""
        return self._delta[self._slots(rows)]

    def _slots(self, rows: np.ndarray) -> np.ndarray:
        """Where dirty rows `rows` sit in the window's arrays."""
        written = self._rows[: self.size]
        if self._order is None:
            self._order = np.argsort(written, kind="stable")
        return self._order[np.searchsorted(written[self._order], rows)]

    def drain(self, views: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(rows, delta bytes uint8 [n, width * 4]) of the window, which closes and reopens empty. `views`: of
        the window's own buffers, good until its next write."""
        rows, delta = self._rows[: self.size], self._delta[: self.size].view(np.uint8)
        if not views:
            rows, delta = rows.copy(), delta.copy()
        self.flags[rows] &= ~np.uint8(IN_WINDOW)
        self.size = 0
        self._order = None
        if self._rows.size > 1 << 16:  # do not pin the memory of one huge window forever
            self._rows = np.empty(0, dtype=np.int64)
            self._delta = np.empty((0, self.width), dtype=np.uint32)
        return rows, delta

    def drain_tables(self) -> tuple[list, np.ndarray, np.ndarray, np.ndarray]:
        """`drain` (views) as (tables, `tables` index of each row, the row's local offset in its table, delta)."""
        rows, delta = self.drain(views=True)
        table = np.searchsorted(self._bases, rows, side="right") - 1
        return [t.owner for t in self.tables], table, rows - self._bases[table], delta

    def take(self, capacity: int, owner) -> "TableWindow":
        """A range of `capacity` rows for table `owner`."""
        part = TableWindow(self, self._block.hand_out(capacity), capacity, owner)
        self.tables.append(part)
        self._bases = np.array([t.base for t in self.tables], dtype=np.int64)
        return part

    def give(self, part: "TableWindow") -> None:
        """Table `part` is dropped: its rows leave the window, their flags' memory is given back."""
        self.tables.remove(part)
        self._bases = np.array([t.base for t in self.tables], dtype=np.int64)
        written = self._rows[: self.size]
        keep = (written < part.base) | (written >= part.base + part.capacity)
        if not keep.all():
            self.size = int(keep.sum())
            self._rows[: self.size], self._delta[: self.size] = written[keep], self._delta[: keep.size][keep]
            self._order = None
        part.dirty[:] = 0
        self._block.free(part.base, part.capacity)


class TableWindow:
    """One table's rows of a `Window`, by local offset: their flags (`dirty`, a view of the window's) and deltas.
    `modified` and `checkpointed` are the checkpoint tier's side of the flags."""

    __slots__ = ("window", "base", "capacity", "owner", "dirty")

    def __init__(self, window: Window, base: int, capacity: int, owner):
        self.window, self.base, self.capacity, self.owner = window, base, capacity, owner
        self.dirty = window.flags[base: base + capacity]

    def committed(self, local: np.ndarray, records: np.ndarray) -> np.ndarray:
        """Records of rows `local` as of the window's opening (what parity holds)."""
        out = np.take(records, local, axis=0)
        dirty = (self.dirty[local] & IN_WINDOW).astype(bool)
        if dirty.any():
            out[dirty] = (out[dirty].view(np.uint32) ^ self.window.delta(self.base + local[dirty])).view(np.float32)
        return out

    def modified(self, since: str = "checkpoint") -> np.ndarray:
        """Rows written since the last checkpoint, since the last "full" one, or "ever", ascending."""
        return np.flatnonzero(self.dirty & {"checkpoint": SINCE_CHECKPOINT, "full": SINCE_FULL, "ever": WRITTEN}[since])

    def written(self) -> int:
        """How many rows were ever written."""
        return int(np.count_nonzero(self.dirty & WRITTEN))

    def checkpointed(self, full: bool = False) -> None:
        """A checkpoint (`full`: a full one) took every row as it is now: none counts as written since."""
        self.dirty &= np.uint8((IN_WINDOW | WRITTEN if full else IN_WINDOW | SINCE_FULL | WRITTEN) | SINCE_COPY)



class Windows:
    """The windows of one node's tables, by record width (`block_rows`: rows of flags a window holds)."""

    def __init__(self, block_rows: int = BLOCK_ROWS):
        self.block_rows = block_rows
        self.by_width: dict[int, list[Window]] = {}

    def take(self, capacity: int, width: int, owner, modified: bool = False) -> TableWindow:
        """A range of `capacity` rows of records of `width` float32 for table `owner`; `modified`: every row
        counts as written since the last checkpoint (a replacement's rows, rebuilt from a node whose writes
        since then are unknown)."""
        windows = self.by_width.setdefault(width, [])
        window = next((w for w in windows if w.flags.size - w.used >= capacity), None)
        if window is None:
            window = Window(max(capacity, self.block_rows), width)
            windows.append(window)
        part = window.take(capacity, owner)
        if modified:
            part.dirty[:] = CHECKPOINT_BITS
        return part

    def give(self, part: TableWindow) -> None:
        """Table `part` is dropped: its rows leave its window (unmapped once it has no table left)."""
        part.window.give(part)
        if not part.window.tables:
            windows = self.by_width[part.window.width]
            windows.remove(part.window)
            if not windows:
                del self.by_width[part.window.width]

    def __iter__(self):
        return (w for windows in self.by_width.values() for w in windows)

    def rows(self) -> int:
        """Rows in every window."""
        return sum(w.size for w in self)
