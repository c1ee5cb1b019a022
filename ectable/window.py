"""The dirty window: rows written since it opened, with their records before the first write."""
from __future__ import annotations

import numpy as np


class Window:
    """Copy-on-first-write tracking over a shard of `capacity` records of `width` float32."""

    def __init__(self, capacity: int, width: int):
        self.slot = np.full(capacity, -1, dtype=np.int32)  # row -> index in the buffers, -1: clean
        self._local = np.empty(0, dtype=np.int64)
        self._old = np.empty((0, width), dtype=np.float32)
        self.size = 0

    def __len__(self):
        return self.size

    def touch(self, local: np.ndarray, records: np.ndarray) -> None:
        """Call before writing unique rows `local`: keeps the old record of each row's first write."""
        fresh = local[self.slot[local] < 0]
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
        self.slot[fresh] = np.arange(self.size, end, dtype=np.int32)
        self.size = end

    def committed(self, local: np.ndarray, records: np.ndarray) -> np.ndarray:
        """Records of rows `local` as of the window's opening (what parity holds)."""
        out = records[local]
        where = self.slot[local]
        dirty = where >= 0
        out[dirty] = self._old[where[dirty]]
        return out

    def drain(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows, old records) of the window, which closes and reopens empty."""
        local = self._local[: self.size].copy()
        old = self._old[: self.size].copy()
        self.slot[local] = -1
        self.size = 0
        if self._local.size > 1 << 16:  # do not pin the memory of one huge window forever
            self._local = np.empty(0, dtype=np.int64)
            self._old = np.empty((0, self._old.shape[1]), dtype=np.float32)
        return local, old
