"""A grow: the cluster laid out again over one more position, held by a spare (`ectable node add`).

One `Grow` is one attempt, run by the acting decider within one step (`Decider._grow`):

1. every node's data rows are copied to the decider while the nodes serve (`hand_over` with `rows`, under
   a name of this attempt; rows changed from then on are flagged);
2. every node is frozen on this map's epoch (`freeze`): it still serves reads and takes peers' deltas,
   refuses writes (`moved`: clients wait and ask again), closes its window, and is waited for
   (HANDOVER_FLUSH at most) until every delta it sent is acknowledged;
3. the rest of their state comes (`hand_over`, the copy named): only rows changed since the copy;
4. `storage.relayout.grow` lays the rows out over one more position, encodes their parity again and gives
   every position a new identity; each node, and the spare, is given its new node (`take_over`), which it
   announces as the identity it is to take (`pending`);
5. one map change, guarded by the grow request, gives the new layout: one more position, the new
   identities, the old ones fenced. Each node takes its new node when it sees that map; clients see a
   new layout and send again what the frozen nodes refused.

The nodes are frozen from step 2 to step 5: for as long as their state, their changed rows and the new
nodes cross twice (through the decider) and the parity is encoded. `run()` says why an attempt failed;
the decider then thaws the nodes (dropping the nodes they were given) and tries again later.
"""
from __future__ import annotations

from .. import clock
from ..config import ClusterConfig
from ..protocol.messages import Freeze, HandOver, TakeOver
from ..storage import handover, relayout
from . import plans
from .handover import HANDOVER_FLUSH, HANDOVER_TIMEOUT
from .map import Map


class Grow:
    """One attempt to add `spare` as position `m.nodes` of map `m` (`guard`: the grow request still stands)."""

    def __init__(self, decider, m: Map, spare: str, guard: list):
        self.decider, self.m, self.spare, self.guard = decider, m, spare, guard
        self.endpoints, self.token = list(m.endpoints), decider.token
        self.config = ClusterConfig(**{**m.config, "nodes": m.nodes + 1})
        self.sources = [f"node/{q}/{clock.token_hex(8)}" for q in range(m.nodes + 1)]
        self.at: dict[str, float] = {}
        self.moved = 0  # bytes of state that came from the nodes

    def run(self) -> str | None:
        """Lay the cluster out again; None once the map has the new layout, else why not."""
        self.at["copy"] = clock.monotonic()
        copied = self._copy_rows()
        self.at["freeze"] = clock.monotonic()
        return self._freeze() or self._export(copied) or self._take_over() or self._swap()

    def summary(self) -> str:
        """Where the time went, for the decider's log."""
        at = self.at
        return (f"rows copied in {at['freeze'] - at['copy']:.2f} s; then frozen {at['done'] - at['freeze']:.2f} s: "
                f"flush {at['export'] - at['freeze']:.2f}, {self.moved / 2**20:.1f} MiB out "
                f"{at['build'] - at['export']:.2f}, laid out {at['take'] - at['build']:.2f}, "
                f"in {at['taken'] - at['take']:.2f}")

    def _ask(self, requests: dict) -> dict:
        """{endpoint: (reply, arrays) or the exception met} of calls that may carry a node's memory (not sent twice)."""
        return self.decider.control.call_all(requests, HANDOVER_TIMEOUT, again=False)

    def _copy_rows(self) -> dict:
        """{position: {table: rows}} of the nodes whose rows came while they served (the others send all at the export)."""
        self.decider.copies += 1
        self.copy = f"{self.decider.name}/{self.decider.copies}"
        request = HandOver(rows=True, copy=self.copy, token=self.token).header()
        answers = self._ask({e: (request, []) for e in self.endpoints})
        copied = {}
        for p, endpoint in enumerate(self.endpoints):
            answer = answers[endpoint]
            if not isinstance(answer, Exception):
                try:
                    copied[p] = handover.copied_rows(answer[0].get("state"), answer[1])
                except Exception:  # a malformed answer: the export sends all its rows
                    continue
        return copied

    def _freeze(self) -> str | None:
        deadline = self.at["freeze"] + HANDOVER_FLUSH
        freeze = Freeze(epoch=self.m.epoch, deltas=True, token=self.token).header()
        while True:
            ok, _ = self.decider._ask({e: (freeze, []) for e in self.endpoints})
            silent = [e for e in self.endpoints if e not in ok]
            if silent:
                return f"{silent[0]} did not answer the freeze"
            busy = {e: ok[e][0].get("not_ready") for e in self.endpoints if ok[e][0].get("not_ready") is not None}
            if not busy:
                return None
            if clock.monotonic() > deadline:
                return "nodes did not get quiet: " + "; ".join(f"{e}: {why}" for e, why in sorted(busy.items()))
            clock.sleep(0.01)

    def _export(self, copied: dict) -> str | None:
        self.at["export"] = clock.monotonic()
        requests = {e: (HandOver(copied=self.copy if p in copied else None, token=self.token).header(), [])
                    for p, e in enumerate(self.endpoints)}
        answers = self._ask(requests)
        states = []
        for endpoint in self.endpoints:
            answer = answers[endpoint]
            if isinstance(answer, Exception) or "state" not in answer[0]:
                return f"the state of {endpoint} did not come: {answer if isinstance(answer, Exception) else answer[0]}"
            states.append((answer[0]["state"], answer[1]))
            self.moved += sum(a.nbytes for a in answer[1])
        self.at["build"] = clock.monotonic()
        try:
            self.nodes = relayout.grow(states, self.config, self.sources, [copied.get(p, {}) for p in range(len(states))])
        except Exception as exc:  # states that do not fit together (a table created meanwhile): tried again later
            return f"the new layout could not be built: {exc}"
        return None

    def _take_over(self) -> str | None:
        """Every node, and the spare, is given its node of the new layout; they announce the identity to take."""
        self.at["take"] = clock.monotonic()
        config = self.config.get_config()
        targets = self.endpoints + [self.spare]
        answers = self._ask({e: (TakeOver(state=header, config=config, token=self.token).header(), arrays)
                             for e, (header, arrays) in zip(targets, self.nodes)})
        self.at["taken"] = clock.monotonic()
        for endpoint, source in zip(targets, self.sources):
            answer = answers[endpoint]
            if isinstance(answer, Exception) or answer[0].get("source") != source:
                return f"{endpoint} did not take its node: {answer if isinstance(answer, Exception) else answer[0]}"
        deadline = clock.monotonic() + HANDOVER_FLUSH
        while True:  # a process announces through its presence thread: the decider must see every new identity
            self.presence = presence = self.decider.store.presence()
            if plans.silent(self.m, presence) or any(e not in presence for e in targets):
                return "a node went away meanwhile"
            if all(presence[e].get("pending") == s for e, s in zip(targets, self.sources)):
                return None
            if clock.monotonic() > deadline:
                return "the nodes did not announce their new identities"
            clock.sleep(0.01)

    def _swap(self) -> str | None:
        new = plans.grown(self.m, self.config.get_config(), self.sources, self.spare,
                          self.presence[self.spare].get("key"))
        if self.decider._swap(self.m, new, self.guard) is None:
            return "the map changed, or the request was withdrawn"
        self.at["done"] = clock.monotonic()
        return None
