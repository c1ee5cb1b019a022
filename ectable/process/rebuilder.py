"""A rebuilding node pulls what it lacks from the survivors, range by range, while clients go on.

The rebuilder runs in a thread of the rebuilding node's own process, as a client of the
cluster (through the map in the cluster's store): each round it asks its node which rows and parity
rows are missing (up to `rebuild_batch`), decodes them from a consistent cut of their
stripes, and installs them; then it rests so the node spends at most `rebuild_share` of
its time rebuilding. Rows clients touch first are rebuilt on demand by those clients.
"""
from __future__ import annotations

import sys
import threading
import time

from ..client import Client
from ..errors import Error, Unavailable


class Rebuilder(threading.Thread):
    """Rebuild the node at `position` (identity `source`) until nothing is missing or `stop()`."""

    def __init__(self, membership: dict, curve: dict | None, position: int, source: str):
        super().__init__(name=f"rebuilder-{position}", daemon=True)
        self.membership, self.curve, self.position, self.source = membership, curve, position, source
        self._halt = threading.Event()
        self.lost: str | None = None  # why some rows cannot be rebuilt (more than r slots of their stripes lost)

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        from ..cluster.maps import RemoteCluster
        try:
            cluster = RemoteCluster(self.membership, self.curve)
        except Error:
            return  # no store to reach: the node starts another rebuilder a second later
        try:
            client = Client(cluster)
            while not self._halt.is_set() and cluster.source(self.position) != self.source:
                time.sleep(0.05)  # the decider publishes the map once the node took the position
                cluster.refresh()
            cluster.mark_rebuilding(self.position)
            config = cluster.config
            while not self._halt.is_set() and cluster.source(self.position) == self.source:
                started = time.perf_counter()
                if not client._rebuild_some(self.position, config.rebuild_batch):
                    return
                share = min(max(config.rebuild_share, 0.01), 1.0)
                self._halt.wait((time.perf_counter() - started) * (1 - share) / share)
        except Unavailable as exc:  # more than r slots lost: those rows cannot come back; say so in status
            self.lost = str(exc)
            print(f"ectable rebuilder of node {self.position}: {exc}", file=sys.stderr, flush=True)
        except Error as exc:  # the node or the cluster went away: a later round starts again
            print(f"ectable rebuilder of node {self.position}: {exc}", file=sys.stderr, flush=True)
        finally:
            cluster.close()
