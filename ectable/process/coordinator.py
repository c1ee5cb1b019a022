"""The coordinator: owns the cluster map and its epoch, hears heartbeats, fails nodes over onto spares.

One small process per cluster (`ectable coordinator`, started by `LocalCluster` and
`ectable up`). Nodes send it a heartbeat every `HEARTBEAT` seconds; a node silent for
`DEAD_AFTER` seconds, or one a client suspects and that does not answer a ping, is
declared dead: the epoch goes up, its identity is fenced (peers refuse its late deltas,
and if it comes back it is told so and starts over as a spare), and a live spare is
given its position, its tables, and the job of being rebuilt. Every change is pushed
to the nodes before any client can read it, and nodes stamp the epoch on their replies,
so clients notice a new map on their next request.

`Membership` is the map and its rules (no I/O); `CoordinatorServer` does the talking.
"""
from __future__ import annotations

import os
import re
import signal
import sys
import time
import traceback

import numpy as np
import zmq

from ..errors import Error, NodeDown
from ..config import ENDPOINT, ClusterConfig
from ..storage.table import TableSpec
from ..transport import ZmqChannel, codec
from ..transport.zeromq import bind_to, make_socket, start_authenticator

HEARTBEAT = 0.5  # seconds between a node's heartbeats
DEAD_AFTER = 3.0  # a node silent this long is declared dead
CONTROL_TIMEOUT = 2.0  # a control call to a node (map, tables, ping)


class Membership:
    """Who holds each position (endpoint, identity, state), the spares, the fenced identities, the epoch."""

    def __init__(self, config: ClusterConfig, endpoints: list[str], spares: list[str]):
        self.config, self.clock = config, time.monotonic
        self.epoch = 1
        self.endpoints = list(endpoints)
        self.sources: list[str | None] = [None] * len(endpoints)  # known once the node took its position
        self.states = ["up"] * len(endpoints)  # up | rebuilding | dead
        self.generations = [0] * len(endpoints)  # per position: how often its node began rebuilding
        self.spares = list(spares)
        self.fenced: list[str] = []
        now = self.clock()
        self.beats = {e: now for e in [*endpoints, *spares]}  # a grace period from the start

    def view(self) -> dict:
        """The map as clients and nodes read it."""
        return {"epoch": self.epoch, "config": self.config.get_config(), "endpoints": self.endpoints,
                "sources": self.sources, "states": self.states,
                "spares": len(self.spares), "fenced": self.fenced}

    def heartbeat(self, beat: dict) -> dict:
        """A node is alive; a node declared dead is told it is fenced (it starts over as a spare)."""
        endpoint, source, position = beat.get("endpoint"), beat.get("source"), beat.get("position")
        if not (isinstance(endpoint, str) and ENDPOINT.match(endpoint)):
            return {"error": "invalid", "message": "heartbeat needs the node's tcp://host:port endpoint"}
        if source in self.fenced:
            return {"epoch": self.epoch, "fenced": True}
        if isinstance(position, int) and 0 <= position < len(self.endpoints) and self.endpoints[position] == endpoint \
                and self.states[position] != "dead" and self.sources[position] in (None, source):
            self.beats[endpoint] = self.clock()
            self.sources[position] = source
            state = "rebuilding" if beat.get("rebuilding") else "up"
            generation = beat.get("generation") if isinstance(beat.get("generation"), int) else 0
            if generation < self.generations[position]:
                state = self.states[position]  # a beat sent before the node was told to rebuild
            self.generations[position] = max(generation, self.generations[position])
            if state != self.states[position]:
                self.states[position] = state
                self.epoch += 1
        elif position is None and endpoint not in [e for e, s in zip(self.endpoints, self.states) if s != "dead"]:
            if endpoint not in self.spares:
                self.spares.append(endpoint)
            self.beats[endpoint] = self.clock()
        return {"epoch": self.epoch, "fenced": False}

    def silent(self) -> list[int]:
        """Live positions whose node missed its heartbeats for DEAD_AFTER seconds."""
        now = self.clock()
        return [p for p, e in enumerate(self.endpoints)
                if self.states[p] != "dead" and now - self.beats.get(e, now) > DEAD_AFTER]

    def declare_dead(self, p: int) -> None:
        if self.states[p] == "dead":
            return
        self.states[p] = "dead"
        if self.sources[p] is not None:
            self.fenced.append(self.sources[p])
        self.epoch += 1

    def take_spare(self) -> str | None:
        """A spare that beat recently (dead spares are dropped), or None."""
        now = self.clock()
        while self.spares:
            endpoint = self.spares.pop(0)
            if now - self.beats.get(endpoint, 0.0) <= DEAD_AFTER:
                return endpoint
        return None

    def install(self, p: int, endpoint: str, source: str) -> None:
        """A spare took dead position p; it is rebuilding."""
        self.endpoints[p], self.sources[p], self.states[p] = endpoint, source, "rebuilding"
        self.generations[p] = 0
        self.beats[endpoint] = self.clock()
        self.epoch += 1


class CoordinatorServer:
    """The coordinator's sockets: a ROUTER for heartbeats and clients, a channel per node for control."""

    def __init__(self, membership: Membership, bind: str, token: str | None, curve: dict | None = None,
                 parent: int | None = None):
        self.members, self.token, self.curve, self.parent = membership, token, curve, parent
        self.context = zmq.Context()
        self.auth = start_authenticator(self.context, curve)
        self.router = make_socket(self.context, zmq.ROUTER, curve, server=True)
        self.endpoint = bind_to(self.router, bind)
        self.channels: dict[str, ZmqChannel] = {}
        self.running = True

    # -- talking to nodes --------------------------------------------------
    def _control(self, endpoint: str, header: dict, arrays=()) -> tuple[dict, list]:
        reply = self._control_all({endpoint: (header, arrays)})[endpoint]
        if isinstance(reply, Exception):
            raise reply
        return reply

    def _control_all(self, requests: dict) -> dict:
        """{endpoint: (header, arrays)}, all sent at once -> {endpoint: its reply, or the NodeDown or
        Error it met}; one CONTROL_TIMEOUT for them all."""
        pending, out = {}, {}
        for endpoint, (header, arrays) in requests.items():
            try:
                channel = self.channels.get(endpoint)
                if channel is None:
                    channel = self.channels[endpoint] = ZmqChannel(endpoint, self.context, self.curve,
                                                                   connect_timeout=CONTROL_TIMEOUT)
                pending[endpoint] = channel.start(header, list(arrays))
            except NodeDown as exc:
                out[endpoint] = exc
            except zmq.ZMQError as exc:  # a bad endpoint, say: as good as dead
                self.channels.pop(endpoint).close()
                out[endpoint] = NodeDown(f"{endpoint}: {exc}")
        deadline = time.monotonic() + CONTROL_TIMEOUT
        for endpoint, request in pending.items():
            try:
                reply = request.wait(max(deadline - time.monotonic(), 0.01))
            except NodeDown as exc:
                out[endpoint] = exc
                continue
            out[endpoint] = Error(f"node {endpoint}: {reply[0].get('message')}") if reply[0].get("error") else reply
        return out

    def _map_header(self, **extra) -> dict:
        m = self.members
        return {"op": "map", "token": self.token, "config": m.config.get_config(), "endpoints": m.endpoints,
                "sources": m.sources,
                "dead": [p for p, s in enumerate(m.states) if s == "dead"], "fenced": m.fenced,
                "epoch": m.epoch, "coordinator": self.endpoint, **extra}

    def assign(self) -> None:
        """Give every node without a known identity its position (nodes may start after us)."""
        m = self.members
        for p, endpoint in enumerate(m.endpoints):
            if m.sources[p] is None and m.states[p] != "dead":
                try:
                    m.sources[p] = self._control(endpoint, self._map_header(position=p))[0]["source"]
                except (NodeDown, Error):
                    continue
        for endpoint in m.spares:
            try:
                self._control(endpoint, self._map_header())
            except (NodeDown, Error):
                pass

    def broadcast(self) -> None:
        """Push the map to every node not dead, at once (one that does not answer: its heartbeats will tell)."""
        m, header = self.members, self._map_header()
        self._control_all({e: (header, ()) for p, e in enumerate(m.endpoints) if m.states[p] != "dead"})

    def fail(self, p: int) -> None:
        """Declare position p dead, fence it everywhere, make its stripes' parity agree, then put
        spares in the dead positions. A survivor that cannot be asked is failed too, in the same
        pass: every dead position is reconciled before any spare is installed."""
        m = self.members
        todo: dict[int, str | None] = {}  # dead positions still to reconcile -> their source
        lost = [p]
        while lost or todo:
            for q in lost:
                todo[q] = m.sources[q]
                m.declare_dead(q)
            if lost:
                self.broadcast()  # fenced on every survivor before any client sees the new epoch
            q, source = next(iter(todo.items()))
            finished, lost = self.reconcile(q, source) if source is not None else (True, [])
            if finished:
                del todo[q]
        self.refill()

    def reconcile(self, p: int, source: str) -> tuple[bool, list[int]]:
        """A dead node's last windows may have reached some parity holders of a stripe and not others.
        Per stripe p held data in, every holder behind the stripe's most advanced holder (among those
        that have the stripe's parity row) forgets its row; it is rebuilt from data, after clients
        replayed what no parity holds. A stripe's most advanced holder is never touched.
        Returns whether it finished, and the survivors that did not answer (to be failed)."""
        m = self.members
        score = np.full(len(m.endpoints), -1, dtype=np.int64)  # windows of p each survivor applied
        survivors = [q for q in range(len(m.endpoints)) if m.states[q] != "dead"]
        answers = self._control_all({m.endpoints[q]: ({"op": "applied", "source": source}, ()) for q in survivors})
        for q in survivors:
            reply = answers[m.endpoints[q]]
            if isinstance(reply, Exception):
                return False, [q]  # it cannot be reconciled: it is as good as dead; then again without it
            score[q] = sum(reply[0]["clients"].values())
        if len(set(score[score >= 0].tolist())) < 2:
            return True, []  # every survivor holds the same windows of p
        epoch, lost = m.epoch, []
        for spec in self._tables() or []:
            layout = m.config.layout(TableSpec.from_config(spec))
            stripes = np.unique(np.concatenate([layout.stripes_of(p, t) for t in range(layout.k)]))
            holders = np.stack([layout.parity_node(stripes, j) for j in range(layout.r)], axis=1)
            held = score[holders]
            for q in np.unique(holders):
                if m.states[q] == "rebuilding":  # rows it has not rebuilt hold nothing
                    mine = holders == q
                    rows = mine.any(axis=1)
                    try:
                        has = self._control(m.endpoints[q], {"op": "holds", "table": spec["name"]},
                                            [stripes[rows]])[1][0].astype(bool)
                    except (NodeDown, Error):
                        has = np.zeros(rows.sum(), dtype=bool)
                    sub = held[rows]
                    sub[mine[rows] & ~has[:, None]] = -1
                    held[rows] = sub
            behind = (held >= 0) & (held < held.max(axis=1, keepdims=True))
            for q in np.unique(holders[behind]).tolist():
                if q in lost:
                    continue
                stale = stripes[(behind & (holders == q)).any(axis=1)]
                try:
                    reply = self._control(m.endpoints[q], {"op": "invalidate", "table": spec["name"]}, [stale])[0]
                except (NodeDown, Error):
                    lost.append(q)
                    continue
                m.generations[q] = max(m.generations[q], reply.get("generation", 0))
                if m.states[q] == "up":
                    m.states[q] = "rebuilding"
                    m.epoch += 1
        if m.epoch != epoch:
            self.broadcast()
        return True, lost

    def refill(self) -> None:
        """Put live spares in dead positions, giving each its position, then its tables."""
        m = self.members
        for p in [q for q, state in enumerate(m.states) if state == "dead"]:
            self._install(p)

    def _install(self, p: int) -> None:
        m = self.members
        tables = self._tables()
        if tables is None:  # nobody to copy the tables from: try again later
            return
        while True:
            spare = m.take_spare()
            if spare is None:
                return
            source = None
            try:
                source = self._control(spare, self._map_header(position=p, rebuilding=True))[0]["source"]
                for spec in tables:
                    self._control(spare, {"op": "create_table", "spec": spec})
            except (NodeDown, Error):
                if source is not None:  # it took the position, then failed: if it lives, it must let go
                    m.fenced.append(source)
                continue  # try the next spare
            m.install(p, spare, source)
            self.broadcast()
            return

    def _tables(self) -> list | None:
        """The tables' definitions, from any up node (None: none answered)."""
        m = self.members
        for p, endpoint in enumerate(m.endpoints):
            if m.states[p] == "up":
                try:
                    return self._control(endpoint, {"op": "tables"})[0]["tables"]
                except (NodeDown, Error):
                    continue
        return None

    # -- requests ----------------------------------------------------------
    def handle(self, header: dict) -> dict:
        op = header.get("op")
        m = self.members
        if op == "heartbeat":
            if self.token is not None and header.get("token") != self.token:
                return {"error": "invalid", "message": "heartbeats need the cluster's token"}
            epoch = m.epoch
            reply = m.heartbeat(header)
            if m.epoch != epoch:  # a node finished rebuilding (or began): nodes stamp the new epoch
                self.broadcast()
            elif isinstance(header.get("epoch"), int) and header["epoch"] < m.epoch \
                    and header.get("endpoint") in m.endpoints and not reply.get("fenced"):
                try:  # it missed a map (a push timed out): send it again
                    self._control(header["endpoint"], self._map_header())
                except (NodeDown, Error):
                    pass
            return reply
        if op == "map":
            return {"map": m.view()}
        if op == "suspect":  # a client's request to p failed: ping it, and fail it over if it is silent
            p, source = header.get("position"), header.get("source")
            if isinstance(p, int) and 0 <= p < len(m.endpoints) and m.states[p] != "dead" and m.sources[p] == source:
                if header.get("exited") and self.token is not None and header.get("token") == self.token:
                    self.fail(p)  # the process that started it saw it exit
                    return {"map": m.view()}
                try:
                    answered = self._control(m.endpoints[p], {"op": "ping"})[0].get("position") == p
                except (NodeDown, Error):
                    answered = False
                if not answered:
                    self.fail(p)
            return {"map": m.view()}
        if op == "shutdown" and self.token is not None and header.get("token") == self.token:
            self.running = False
            return {}
        return {"error": "invalid", "message": f"unknown or unauthorised op {op!r}"}

    def serve(self) -> None:
        next_assign = 0.0
        while self.running:
            if self.router.poll(int(HEARTBEAT / 5 * 1000)):
                while True:  # drain first, so queued heartbeats count before anyone is judged silent
                    try:
                        frames = self.router.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._answer(frames)
            if time.monotonic() > next_assign and None in self.members.sources:
                self.assign()
                next_assign = time.monotonic() + HEARTBEAT
            for p in self.members.silent():
                if p in self.members.silent():  # not replaced meanwhile by a failure handled in the same pass
                    self.fail(p)
            if self.members.spares and "dead" in self.members.states:
                self.refill()  # a spare that arrived after the failure
            if self.parent and os.getppid() != self.parent:
                break
        self.close()

    def _answer(self, frames) -> None:
        identity = frames[0]
        header = {}
        try:
            header, _ = codec.decode(frames[1:])
            reply = self.handle(header) if isinstance(header, dict) else {"error": "invalid", "message": "bad header"}
        except Exception as exc:  # never die of input
            reply = {"error": "malformed", "message": str(exc)}
        if not isinstance(header, dict):
            header = {}
        try:
            self.router.send_multipart([identity, *codec.encode({**reply, "id": header.get("id")}, [])],
                                       flags=zmq.NOBLOCK)
        except (zmq.ZMQError, TypeError, ValueError):
            pass

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()
        self.router.close(0)
        if self.auth is not None:
            self.auth.stop()
        self.context.term()


def run(data: dict, bind: str, token: str | None, parent: int | None = None) -> None:
    """Serve the cluster described by a TOML dict; prints `READY <endpoint>` once listening."""
    if parent:
        from .node_server import die_with_parent
        die_with_parent(parent)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    members = Membership(ClusterConfig(**data["cluster"]), data["nodes"]["endpoints"], data["nodes"].get("spares", []))
    server = CoordinatorServer(members, bind, token, data.get("security"), parent)
    print(f"READY {server.endpoint}", flush=True)
    try:
        server.serve()
    except Exception:  # a bug, not input: die at once rather than hang half-alive
        traceback.print_exc()
        os._exit(70)
