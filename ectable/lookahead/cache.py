"""The trainer-side row cache of a lookahead: pure bookkeeping, no I/O.

A row is named by a key, `table index << 40 | row id` (row ids are below 2**40), so the rows of
every table live in one sorted key array and each batch is looked up with one `searchsorted`.
A cached row holds a slot of the arena (its whole record: weights, then optimizer state) and a
count of the admitted batches that use it; when the last of them is done, the row leaves. A row
updated since it was read or last written back is dirty: it must be written back when it leaves.
"""
from __future__ import annotations

import numpy as np

ID_BITS = 40
ID_MASK = (1 << ID_BITS) - 1


def keys_of(table_index: int, ids: np.ndarray) -> np.ndarray:
    """The keys of rows `ids` of the table numbered `table_index`."""
    return ids | np.int64(table_index << ID_BITS)


def split_keys(keys: np.ndarray) -> list[tuple[int, slice, np.ndarray]]:
    """[(table index, slice of `keys`, row ids)] of sorted `keys`, table by table."""
    tables = keys >> ID_BITS
    bounds = np.flatnonzero(tables[1:] != tables[:-1]) + 1
    starts, ends = np.concatenate([[0], bounds]), np.concatenate([bounds, [keys.size]])
    return [(int(tables[a]), slice(int(a), int(b)), keys[a:b] & ID_MASK) for a, b in zip(starts, ends) if b > a]


class CacheFull(Exception):
    """Admitting a batch would need more free slots than there are."""

    def __init__(self, needed: int, free: int):
        super().__init__(f"{needed} rows to add, {free} slots free")
        self.needed, self.free = needed, free


class RowCache:
    """At most `capacity` records of `width` float32 values, each counted by the batches that use it."""

    def __init__(self, capacity: int, width: int):
        self.capacity = capacity
        self.arena = np.empty((capacity, width), dtype=np.float32)  # pages are touched as slots are used
        self.keys = np.empty(0, dtype=np.int64)  # sorted
        self.slots = np.empty(0, dtype=np.int64)  # the arena slot of each key
        self.refs = np.empty(0, dtype=np.int32)  # admitted batches using each key
        self.dirty = np.zeros(capacity, dtype=bool)  # by slot
        self._free = np.arange(capacity - 1, -1, -1, dtype=np.int64)  # a stack: free slots at [:_top]
        self._top = capacity

    def __len__(self) -> int:
        return int(self.keys.size)

    @property
    def free(self) -> int:
        return self._top

    def admit(self, keys: np.ndarray, room: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Count one more batch on sorted unique `keys`, adding those not cached: (slot of each key, mask of
        the keys added, whose records the caller must fill). `CacheFull`, and nothing changes, if more than
        `room` (default: every free slot) would be added."""
        pos, hit = self._found(keys)
        new = ~hit
        added = int(new.sum())
        room = self._top if room is None else min(room, self._top)
        if added > room:
            raise CacheFull(added, room)
        self.refs[pos[hit]] += 1
        slots = np.empty(keys.size, dtype=np.int64)
        slots[hit] = self.slots[pos[hit]]
        slots[new] = fresh = self._free[self._top - added: self._top][::-1]
        self._top -= added
        self.dirty[fresh] = False
        at = pos[new]
        self.keys = np.insert(self.keys, at, keys[new])
        self.slots = np.insert(self.slots, at, fresh)
        self.refs = np.insert(self.refs, at, np.int32(1))
        return slots, new

    def release(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Count one batch less on sorted unique cached `keys`; the rows no batch uses any more leave:
        (keys, records) of those of them that are dirty, copied out, their slots free again."""
        pos, hit = self._found(keys)
        if not hit.all():
            raise KeyError(f"{int((~hit).sum())} keys released are not cached")
        self.refs[pos] -= 1
        gone = pos[self.refs[pos] == 0]
        slots = self.slots[gone]
        dirty = self.dirty[slots]
        out = keys[self.refs[pos] == 0][dirty], self.arena[slots[dirty]]
        self.dirty[slots] = False
        self._free[self._top: self._top + slots.size] = slots
        self._top += slots.size
        self.keys, self.slots, self.refs = (np.delete(a, gone) for a in (self.keys, self.slots, self.refs))
        return out

    def take_dirty(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, records) of every dirty row, copied out; they stay cached, clean."""
        dirty = self.dirty[self.slots]
        slots = self.slots[dirty]
        self.dirty[slots] = False
        return self.keys[dirty], self.arena[slots]

    def _found(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(insertion position of each key, whether it is cached)."""
        pos = np.searchsorted(self.keys, keys)
        hit = pos < self.keys.size
        hit[hit] = self.keys[pos[hit]] == keys[hit]
        return pos, hit
