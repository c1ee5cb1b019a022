"""A rebuilding node pulls what it lacks from the survivors, range by range, while clients go on.

The rebuilder runs in threads of the rebuilding node's own process, as a client of the
cluster (through the map in the cluster's store): each round it asks its node which rows and parity
rows are missing (up to `rebuild_batch`), decodes them from a consistent cut of their
stripes, and installs them; then it rests so the node spends at most `rebuild_share` of
its time rebuilding. `rebuild_streams` rounds run at once, each on its own part of the rows, so that one
decodes while another waits for the survivors. While clients read or write the node (`busy`), and in its
first round, a round reads at most `BUSY_BATCH` rows: a large read under training is read again as windows
close during it, then rests in proportion. Rows clients touch first are rebuilt on demand by those clients.
`RebuildRounds` is the rebuilding itself, one round at a time, over any cluster map (the simulation runs it
too); `Rebuilder` runs a node process's streams of rounds.
"""
from __future__ import annotations

import sys
import threading
from typing import Callable

from .. import clock
from ..client import Client
from ..client.client import _Relaid
from ..client.repair import Unsettled
from ..errors import Error, Unavailable

MIN_BATCH = 1024  # fewest rows a round reads; it then waits for its stripes to settle however long they move
PATIENCE = 3  # reads of one round's stripes before it gives up and the next round reads half as many
BUSY_BATCH = 4096  # most rows a round reads while clients read or write the rebuilding node


class RebuildRounds:
    """Rounds of rebuilding the node at `position` (identity `source`) through `cluster`'s clients; `busy`: whether
    clients read or write that node now (`NodeHost.serving_clients`, a getter; None: never)."""

    def __init__(self, cluster, position: int, source: str, part: int = 0, parts: int = 1,
                 busy: Callable[[], bool] | None = None):
        self.cluster, self.position, self.source = cluster, position, source
        self.busy = busy or (lambda: False)
        self.part = (part, parts)  # the part of the missing rows this one rebuilds first (`Missing`)
        self.client = Client(cluster)
        self.started = False  # the map names this identity at the position: rebuilding has begun
        # Rows a round asks for (at most BUSY_BATCH while `busy`): halved after a round whose stripes writes moved
        # on through PATIENCE reads (a smaller read is sooner done, so fewer windows close while it runs), back to
        # `rebuild_batch` after one read once. The first round is small: clients may not have reached the node yet.
        self.batch = min(cluster.config.rebuild_batch, BUSY_BATCH)

    def round(self) -> float | None:
        """Rebuild one batch; seconds to rest before the next round, or None when there is nothing left
        (or the node no longer holds the position). Raises `Unavailable` for rows lost for good."""
        cluster = self.cluster
        if not self.started:
            if cluster.source(self.position) != self.source:
                cluster.refresh()  # the decider publishes the map once the node took the position
                return 0.05
            cluster.mark_rebuilding(self.position)
            self.started = True
        if cluster.source(self.position) != self.source:
            return None
        began, rereads = clock.monotonic(), self.client.repair.rereads
        batch = min(self.batch, BUSY_BATCH) if self.busy() else self.batch
        self.client.repair.patience = PATIENCE if batch > MIN_BATCH else None
        try:
            if not self.client._rebuild_some(self.position, batch, self.part):
                return None
        except _Relaid:  # laid out again (a grow, once this node was up): no position holds this identity now
            return None
        except Unsettled:
            self.batch = max(MIN_BATCH, batch // 2)
        else:
            if self.client.repair.rereads == rereads:
                self.batch = cluster.config.rebuild_batch
        # Each of `parts` rounds running at once rests so that, as if independent, some round runs `rebuild_share`
        # of the time: 1 - (1 - duty) ** parts = share.
        share = min(max(cluster.config.rebuild_share, 0.01), 1.0)
        duty = 1 - (1 - share) ** (1 / self.part[1])
        return (clock.monotonic() - began) * (1 - duty) / duty


class Rebuilder(threading.Thread):
    """Rebuild the node at `position` (identity `source`) until nothing is missing or `stop()`: `rebuild_streams`
    streams of rounds, each in a thread with its own connections; this thread ends when all have."""

    def __init__(self, membership: dict, curve: dict | None, position: int, source: str,
                 busy: Callable[[], bool] | None = None):
        super().__init__(name=f"rebuilder-{position}", daemon=True)
        self.membership, self.curve, self.position, self.source, self.busy = membership, curve, position, source, busy
        self._halt = threading.Event()
        self.lost: str | None = None  # why some rows cannot be rebuilt (more than r slots of their stripes lost)

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        cluster = self._connect()
        if cluster is None:
            return  # no store to reach: the node starts another rebuilder a second later
        parts = cluster.config.rebuild_streams
        others = [threading.Thread(target=self._stream, args=(None, part, parts), name=f"{self.name}.{part}",
                                   daemon=True) for part in range(1, parts)]
        for thread in others:
            thread.start()
        self._stream(cluster, 0, parts)
        for thread in others:
            while thread.is_alive() and not self._halt.is_set():
                thread.join(1.0)

    def _connect(self):
        from ..cluster.maps import RemoteCluster
        try:
            return RemoteCluster(self.membership, self.curve)
        except Error:
            return None

    def _stream(self, cluster, part: int, parts: int) -> None:
        """Rounds over `part` of `parts` through `cluster` (None: connect one), until done, stopped or failed."""
        cluster = cluster or self._connect()
        if cluster is None:
            return
        try:
            rounds = RebuildRounds(cluster, self.position, self.source, part, parts, self.busy)
            while not self._halt.is_set():
                rest = rounds.round()
                if rest is None:
                    return
                self._halt.wait(rest)
        except Unavailable as exc:  # more than r slots lost: those rows cannot come back; say so in status
            self.lost = str(exc)
            print(f"ectable rebuilder of node {self.position}: {exc}", file=sys.stderr, flush=True)
        except Error as exc:  # the node or the cluster went away: a later rebuilder starts again
            print(f"ectable rebuilder of node {self.position}: {exc}", file=sys.stderr, flush=True)
        finally:
            cluster.close()
