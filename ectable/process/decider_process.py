"""A failover decider process (`ectable decider`): one `Decider` over etcd and ZeroMQ.

Run two or more per cluster: they elect one through etcd, and a new one takes over within
`ELECTION_TTL` seconds of the acting one's death. It wakes on every change under the
cluster's prefix (a watch), and at least every `IDLE` seconds.
"""
from __future__ import annotations

import os
import secrets
import signal
import sys
import threading
import traceback

import zmq

from ..cluster.decider import STORE_GRACE, Decider
from ..cluster.map import Map
from ..cluster.store import open_store
from ..membership import MembershipUnavailable
from .control import ZmqControl
from .node_server import die_with_parent

IDLE = 0.25


def run(data: dict, token: str | None, parent: int | None = None) -> None:
    """Decide for the cluster a TOML dict names ([membership], [security]); prints `READY <name>`."""
    if parent:
        die_with_parent(parent)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    store = open_store(data["membership"])
    if "cluster" in data and "nodes" in data and store.read_map() is None:  # a cluster named by hand: its first map
        store.swap_map(None, Map.initial(data["cluster"], data["nodes"]["endpoints"]))
    context = zmq.Context()
    control = ZmqControl(context, data.get("security"))
    name = f"decider/{os.getpid()}/{secrets.token_hex(4)}"
    decider = Decider(store, control, name, token, grace=STORE_GRACE,
                      log=lambda message: print(f"ectable {name}: {message}", file=sys.stderr, flush=True))
    wake = threading.Event()
    watch = store.membership.watch(store.prefix + "/", lambda events: wake.set())
    print(f"READY {name}", flush=True)
    try:
        while not (parent and os.getppid() != parent):
            try:
                changed = decider.step()
            except MembershipUnavailable:
                changed = False
            if not changed:
                wake.wait(IDLE)
                wake.clear()
    except Exception:  # a bug, not input: die at once rather than act half-alive
        traceback.print_exc()
        os._exit(70)
    finally:
        watch.cancel()
        decider.resign()
        control.close()
        context.term()
