"""The dirty window: rows written since it opened, each with its parity delta so far; and, in the same flag
byte per row, the rows written since the last checkpoint, since the last full one, and ever (one tracker,
two uses)."""
from __future__ import annotations

import numpy as np


IN_WINDOW, SINCE_CHECKPOINT, SINCE_FULL, WRITTEN = 1, 2, 4, 8  # the flag bits
SINCE_COPY = 16  # changed since a handover copied the rows (`storage.handover.copy_rows`), initial values computed too
CHECKPOINT_BITS = SINCE_CHECKPOINT | SINCE_FULL | WRITTEN


class Window:
    """Tracks the rows of a shard of `capacity` records of `width` float32 written since the window opened,
    and for each the XOR of its record bytes then and now (its parity delta), built at write time while
    both are at hand: closing the window reads no record.

    Costs one byte per row of the shard (the flags: in the window, written since the last checkpoint,
    written since the last full checkpoint, written ever); everything else is proportional to the rows written in the
    window. `modified` and `checkpointed` are the checkpoint tier's side of the flags.
    """

    def __init__(self, capacity: int, width: int, modified: bool = False):
        """`modified`: every row counts as written since the last checkpoint (a replacement's rows, rebuilt from
        a node whose writes since then are unknown)."""
        self.dirty = np.zeros(capacity, dtype=np.uint8)  # pages that stay zero are never touched
        if modified:
            self.dirty[:] = CHECKPOINT_BITS
        self._local = np.empty(0, dtype=np.int64)
        self._delta = np.empty((0, width), dtype=np.uint32)
        self._order = None  # argsort of the window's rows, for lookups; None: stale
        self.size = 0

    def __len__(self):
        return self.size

    def record(self, local: np.ndarray, old: np.ndarray, new: np.ndarray) -> None:
        """Unique rows `local` change from records `old` to `new` (float32 [n, width]): add to their deltas."""
        change = old.view(np.uint32) ^ new.view(np.uint32)
        flags = self.dirty[local]
        self.dirty[local] = flags | (IN_WINDOW | CHECKPOINT_BITS | SINCE_COPY)
        again = (flags & IN_WINDOW).astype(bool)
        if again.any():  # written before in this window: the deltas add up
            self._delta[self._slots(local[again])] ^= change[again]
            local, change = local[~again], change[~again]
        if local.size == 0:
            return
        end = self.size + local.size
        if end > self._local.size:
            grow = max(end, 2 * self._local.size, 1024)
            self._local = np.resize(self._local, grow)
            delta = np.empty((grow, self._delta.shape[1]), dtype=np.uint32)
            delta[: self.size] = self._delta[: self.size]
            self._delta = delta
        self._local[self.size:end] = local
        self._delta[self.size:end] = change
        self.size = end
        self._order = None

    def _slots(self, local: np.ndarray) -> np.ndarray:
        """Where dirty rows `local` sit in the window's arrays."""
        rows = self._local[: self.size]
        if self._order is None:
            self._order = np.argsort(rows, kind="stable")
        return self._order[np.searchsorted(rows[self._order], local)]

    def committed(self, local: np.ndarray, records: np.ndarray) -> np.ndarray:
        """Records of rows `local` as of the window's opening (what parity holds)."""
        out = np.take(records, local, axis=0)
        dirty = (self.dirty[local] & IN_WINDOW).astype(bool)
        if dirty.any():
            out[dirty] = (out[dirty].view(np.uint32) ^ self._delta[self._slots(local[dirty])]).view(np.float32)
        return out

    def drain(self, views: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(rows, delta bytes uint8 [n, width * 4]) of the window, which closes and reopens empty. `views`: of
        the window's own buffers, good until its next write."""
        local, delta = self._local[: self.size], self._delta[: self.size].view(np.uint8)
        if not views:
            local, delta = local.copy(), delta.copy()
        self.dirty[local] &= ~np.uint8(IN_WINDOW)
        self.size = 0
        self._order = None
        if self._local.size > 1 << 16:  # do not pin the memory of one huge window forever
            self._local = np.empty(0, dtype=np.int64)
            self._delta = np.empty((0, self._delta.shape[1]), dtype=np.uint32)
        return local, delta

    def modified(self, since: str = "checkpoint") -> np.ndarray:
        """Rows written since the last checkpoint, since the last "full" one, or "ever", ascending."""
        return np.flatnonzero(self.dirty & {"checkpoint": SINCE_CHECKPOINT, "full": SINCE_FULL, "ever": WRITTEN}[since])

    def written(self) -> int:
        """How many rows were ever written."""
        return int(np.count_nonzero(self.dirty & WRITTEN))

    def checkpointed(self, full: bool = False) -> None:
        """A checkpoint (`full`: a full one) took every row as it is now: none counts as written since."""
        self.dirty &= np.uint8((IN_WINDOW | WRITTEN if full else IN_WINDOW | SINCE_FULL | WRITTEN) | SINCE_COPY)
