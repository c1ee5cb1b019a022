"""The raw parity deltas a holder received from each node, kept until every holder has them.

A node sends each closed window to every other node, as one delta per target. If it dies, its last
windows may have reached some holders and not others. The decider then rolls every survivor back to
the lowest window any of them holds (`Node.op_rollback`), so that the parity holders of each stripe
agree again, and nobody has to forget parity rows. Rolling back needs the raw deltas of the windows
above that level. A node's parity rows hold window 0 of a sender it never took a delta from, unless it
rebuilt them (a spare, or rows invalidated): rows rebuilt from a sender's data hold the window that data
was read at (`restored`). A holder keeps them until the sender says every target acknowledged them
(`durable` in its deltas), for at most RETAINED_SECONDS, and for at most RETAINED_WINDOWS windows
and RETAINED_ROWS rows per sender. A holder that no longer keeps a window cannot roll back below
it, and the decider then invalidates parity rows instead, as it did before.
"""
from __future__ import annotations

from collections import deque

RETAINED_WINDOWS = 64  # windows kept per sender
RETAINED_SECONDS = 120.0  # a dead sender's windows are kept this long for its reconcile
RETAINED_ROWS = 1 << 20  # delta rows kept per sender (at most a few hundred MB in all on a node)


class Retained:
    """Per sender: the window of its last delta held here, and the raw deltas of its recent windows."""

    def __init__(self, base: int | None = 0):
        self.base = base  # the level of a sender none of whose deltas came here (None: unknown, rows rebuilt)
        self.level: dict[str, int] = {}  # source -> the window of its last delta taken here
        self.windows: dict[str, deque] = {}  # source -> (window, arrival, [parity.Queued], rows), oldest first

    def add(self, source: str, window: int, durable: int | None, parts: list, now: float) -> None:
        """Keep window `window` of `source` (its deltas arrive in order); forget what every holder has."""
        log = self.windows.setdefault(source, deque())
        if self.level.get(source, window - 1) != window - 1:
            log.clear()  # not the next window: the older ones no longer lead up to it
        log.append((window, now, parts, sum(part.ids.size for part in parts)))
        self.level[source] = window
        rows = sum(entry[3] for entry in log)
        while log and (isinstance(durable, int) and log[0][0] <= durable or len(log) > RETAINED_WINDOWS
                       or rows > RETAINED_ROWS):
            rows -= log.popleft()[3]
        for kept in self.windows.values():
            while kept and now - kept[0][1] > RETAINED_SECONDS:
                kept.popleft()

    def level_of(self, source: str) -> int | None:
        """The window of `source` this holder's parity rows hold (None: not known)."""
        return self.level.get(source, self.base)

    def kept(self, source: str) -> int | None:
        """The lowest window this holder can roll `source`'s deltas back to (None: not known)."""
        log = self.windows.get(source)
        return log[0][0] - 1 if log else self.level_of(source)

    def restored(self, source: str, window: int) -> None:
        """Parity rows were rebuilt from `source`'s data as of its window `window`, none of its deltas here
        since: that is their level (a delta taken since set it already)."""
        self.level.setdefault(source, window)

    def forget(self, table: str) -> None:
        """Drop every kept delta of `table` (it was dropped: rolling back never touches it again)."""
        for log in self.windows.values():
            for n, (window, arrival, parts, _) in enumerate(log):
                parts = [part.without(table) for part in parts]
                log[n] = (window, arrival, parts, sum(part.ids.size for part in parts))

    def take_after(self, source: str, window: int) -> list:
        """Remove and return the deltas (`parity.Queued`) of `source`'s windows after `window`;
        its level becomes `window`. The caller checked `kept(source) <= window`."""
        log = self.windows.get(source, deque())
        parts = []
        while log and log[-1][0] > window:
            parts += log.pop()[2]
        self.level[source] = window
        return parts
