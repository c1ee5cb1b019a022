"""The dirty window: rows written since it opened, with their records before the first write."""
from __future__ import annotations

import numpy as np


class Window:
    """Copy-on-first-write tracking over a shard of `capacity` records of `width` float32.

    Costs one byte per row of the shard (the dirty flag); everything else is proportional
    to the rows written in the window.
    """

    def __init__(self, capacity: int, width: int):
        self.dirty = np.zeros(capacity, dtype=bool)
        self._local = np.empty(0, dtype=np.int64)
        self._old = np.empty((0, width), dtype=np.float32)
        self._order = None  # argsort of the window's rows, for lookups; None: stale
        self.size = 0

    def __len__(self):
        return self.size

    def touch(self, local: np.ndarray, records: np.ndarray) -> None:
        """Call before writing unique rows `local`: keeps the old record of each row's first write."""
        fresh = local[~self.dirty[local]]
        if fresh.size == 0:
            return
        end = self.size + fresh.size
        if end > self._local.size:
            grow = max(end, 2 * self._local.size, 1024)
            self._local = np.resize(self._local, grow)
            old = np.empty((grow, self._old.shape[1]), dtype=np.float32)
            old[: self.size] = self._old[: self.size]
            self._old = old
        self._local[self.size:end] = fresh
        self._old[self.size:end] = records[fresh]
        self.dirty[fresh] = True
        self.size = end
        self._order = None

    def committed(self, local: np.ndarray, records: np.ndarray) -> np.ndarray:
        """Records of rows `local` as of the window's opening (what parity holds)."""
        out = records[local]
        dirty = self.dirty[local]
        if dirty.any():
            rows = self._local[: self.size]
            if self._order is None:
                self._order = np.argsort(rows, kind="stable")
            out[dirty] = self._old[self._order[np.searchsorted(rows[self._order], local[dirty])]]
        return out

    def drain(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows, old records) of the window, which closes and reopens empty."""
        local = self._local[: self.size].copy()
        old = self._old[: self.size].copy()
        self.dirty[local] = False
        self.size = 0
        self._order = None
        if self._local.size > 1 << 16:  # do not pin the memory of one huge window forever
            self._local = np.empty(0, dtype=np.int64)
            self._old = np.empty((0, self._old.shape[1]), dtype=np.float32)
        return local, old
