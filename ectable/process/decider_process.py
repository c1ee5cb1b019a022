"""A failover decider process (`ectable decider`): one `Decider` over etcd and ZeroMQ.

Run two or more per cluster: they elect one through etcd, and a new one takes over within
`ELECTION_TTL` seconds of the acting one's death. It wakes on every change under the
cluster's prefix (a watch: a node's presence lapsing, a map swapped, a drain or grow asked for), and at
least every `IDLE` seconds, for the decisions that wait on time alone. While it hands a drained node over
(which copies the node's memory, maybe for longer than the election lease) or reconciles a failed node's
stripes, a thread keeps its election lease alive, for `LONG_STEP` seconds at most, through a store client of
its own.
"""
from __future__ import annotations

import os
import secrets
import signal
import sys
import threading
import traceback

import zmq

from .. import clock
from ..cluster.decider import ELECTION_TTL, STORE_GRACE, Decider
from ..cluster.map import Map
from ..cluster.store import open_store
from ..membership import MembershipUnavailable
from .control import ZmqControl
from .node_server import die_with_parent

IDLE = ELECTION_TTL / 4  # its election lease is kept alive at each step: four chances per lease
LONG_STEP = 300.0  # longest a handover's or reconcile's election lease is kept alive for it (a hung decider is then replaced)


def keep_lease_while_busy(decider: Decider, membership: dict, stop: threading.Event) -> None:
    """Every third of the election TTL: while a long step (a handover, a reconcile) has run for less than
    LONG_STEP, keep the decider's lease alive."""
    store = open_store(membership)
    while not stop.wait(ELECTION_TTL / 3):
        since, lease = decider.busy_since, decider.lease
        if since is not None and lease is not None and clock.monotonic() - since < LONG_STEP:
            try:
                store.membership.keepalive(lease)
            except MembershipUnavailable:
                pass


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
    wake, stop = threading.Event(), threading.Event()
    watch = store.membership.watch(store.prefix + "/", lambda events: wake.set())
    threading.Thread(target=keep_lease_while_busy, args=(decider, data["membership"], stop), daemon=True,
                     name="lease-keeper").start()
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
        stop.set()
        watch.cancel()
        decider.resign()
        control.close()
        context.term()
