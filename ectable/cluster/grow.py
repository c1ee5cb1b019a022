"""A grow: the cluster laid out again over one more position, held by a spare (`ectable node add`).

One `Grow` is one attempt, run by the acting decider within one step (`Decider._grow`):

1. every node's data rows are copied to the decider while the nodes serve (`hand_over` with `rows`, under
   a name of this attempt; rows changed from then on are flagged), laid out over the new layout
   (`storage.relayout`) and sent ahead to the nodes of the new layout, and to the spare (`take_over` with
   `rows`);
2. every node is frozen on this map's epoch (`freeze`): it still serves reads and takes peers' deltas,
   refuses writes (`moved`: clients wait and ask again), closes its window, and is waited for
   (HANDOVER_FLUSH at most) until every delta it sent is acknowledged;
3. the rest of their state comes (`hand_over`, the copy named, no parity): only rows changed since the copy;
4. the rows changed are laid out too, the parity encoded again, and every position given a new identity;
   each node, and the spare, is given the rest of its new node (`take_over`: changed rows, parity, flags),
   which it announces as the identity it is to take (`pending`);
5. one map change, guarded by the grow request, gives the new layout: one more position, the new
   identities, the old ones fenced. Each node takes its new node when it sees that map; clients see a
   new layout and send again what the frozen nodes refused.

The nodes are frozen from step 2 to step 5: for as long as the rows changed since the copy cross twice
(through the decider), the parity is encoded, and it crosses to the nodes. `run()` says why an attempt failed;
the decider then thaws the nodes (dropping the nodes they were given) and tries again later.
"""
from __future__ import annotations

from .. import clock
from ..config import ClusterConfig
from ..protocol.messages import HandOver, TakeOver
from ..storage import handover
from ..storage.relayout import Relayout
from . import plans
from .handover import HANDOVER_FLUSH, HANDOVER_TIMEOUT, freeze
from .map import Map

GROW_FROZEN = 60.0  # longest the nodes may have been frozen when they are to be given their new nodes: with that
# transfer (HANDOVER_TIMEOUT at most) and their announcements, well within what clients wait (HANDOVER_WAIT)


class Grow:
    """One attempt to add `spare` as position `m.nodes` of map `m` (`guard`: the grow request still stands)."""

    def __init__(self, decider, m: Map, spare: str, guard: list):
        self.decider, self.m, self.spare, self.guard = decider, m, spare, guard
        self.endpoints, self.token = list(m.endpoints), decider.token
        self.config = ClusterConfig(**{**m.config, "nodes": m.nodes + 1})
        self.sources = [f"node/{q}/{clock.token_hex(8)}" for q in range(m.nodes + 1)]
        self.relayout = Relayout(self.config, m.nodes)
        self.targets = self.endpoints + [spare]  # the nodes of the new layout
        self.at: dict[str, float] = {}
        self.moved = 0  # bytes of state that came from the nodes
        self.marks: list[dict] = []  # per old position, each client's last write its node applied
        self.ahead = False  # every node of the new layout holds its rows as copied

    def run(self) -> str | None:
        """Lay the cluster out again; None once the map has the new layout, else why not."""
        self.at["copy"] = clock.monotonic()
        copied = self._copy_rows()
        self.at["ahead"] = clock.monotonic()
        if len(copied) == len(self.endpoints) and self._send_ahead():
            self.ahead = True
            self.relayout.encode()
        self.at["freeze"] = clock.monotonic()
        return self._freeze() or self._export(copied) or self._take_over() or self._swap()

    def summary(self) -> str:
        """Where the time went, for the decider's log."""
        at = self.at
        return (f"rows copied in {at['ahead'] - at['copy']:.2f} s, "
                f"{'laid out, sent ahead and encoded' if self.ahead else 'not sent ahead'} in "
                f"{at['freeze'] - at['ahead']:.2f}; then frozen {at['done'] - at['freeze']:.2f} s: "
                f"flush {at['export'] - at['freeze']:.2f}, {self.moved / 2**20:.1f} MiB out "
                f"{at['build'] - at['export']:.2f}, changed rows laid in and parity encoded "
                f"{at['take'] - at['build']:.2f}, "
                f"in {at['taken'] - at['take']:.2f}")

    def _ask(self, requests: dict) -> dict:
        """{endpoint: (reply, arrays) or the exception met} of calls that may carry a node's memory (not sent twice)."""
        return self.decider.control.call_all(requests, HANDOVER_TIMEOUT, again=False)

    def _copy_rows(self) -> set:
        """The positions whose rows came while they served, laid out (the others send all at the export)."""
        self.decider.copies += 1
        self.copy = f"{self.decider.name}/{self.decider.copies}"
        request = HandOver(rows=True, copy=self.copy, token=self.token).header()
        answers = self._ask({e: (request, []) for e in self.endpoints})
        copied = set()
        for p, endpoint in enumerate(self.endpoints):
            answer = answers[endpoint]
            if not isinstance(answer, Exception):
                try:
                    state = answer[0].get("state")
                    self.relayout.copied(p, state, handover.copied_rows(state, answer[1]))
                except Exception:  # a malformed answer: the export sends all its rows
                    continue
                copied.add(p)
        return copied

    def _send_ahead(self) -> bool:
        """Every node of the new layout is sent its rows, as copied (then only the rows changed since cross while
        the nodes are frozen); whether every one took them."""
        config = self.config.get_config()
        requests = {}
        for q, endpoint in enumerate(self.targets):
            state, arrays = self.relayout.rows_for(q)
            requests[endpoint] = (TakeOver(state=state, config=config, rows=True, copy=self.copy,
                                           token=self.token).header(), arrays)
        return not any(isinstance(a, Exception) for a in self._ask(requests).values())

    def _freeze(self) -> str | None:
        return freeze(self.decider, self.endpoints, self.m.epoch, self.at["freeze"] + HANDOVER_FLUSH, deltas=True)

    def _export(self, copied: set) -> str | None:
        self.at["export"] = clock.monotonic()
        requests = {e: (HandOver(copied=self.copy if p in copied else None, parity=False,
                                 token=self.token).header(), []) for p, e in enumerate(self.endpoints)}
        answers = self._ask(requests)
        states = []
        for endpoint in self.endpoints:
            answer = answers[endpoint]
            if isinstance(answer, Exception) or "state" not in answer[0]:
                return f"the state of {endpoint} did not come: {answer if isinstance(answer, Exception) else answer[0]}"
            states.append((answer[0]["state"], answer[1]))
            self.marks.append(answer[0]["state"].get("client_marks", {}))
            self.moved += sum(a.nbytes for a in answer[1])
        self.at["build"] = clock.monotonic()
        try:
            self.nodes = self.relayout.finish(states, self.sources)
        except Exception as exc:  # states that do not fit together (a table created meanwhile): tried again later
            return f"the new layout could not be built: {exc}"
        return None

    def _take_over(self) -> str | None:
        """Every node, and the spare, is given its node of the new layout; they announce the identity to take."""
        self.at["take"] = clock.monotonic()
        if self.at["take"] - self.at["freeze"] > GROW_FROZEN:
            return f"frozen {self.at['take'] - self.at['freeze']:.0f} s already (longer than {GROW_FROZEN:g})"
        config, targets = self.config.get_config(), self.targets
        copy = self.copy if self.ahead else None
        answers = self._ask({e: (TakeOver(state=header, config=config, copy=copy, epoch=self.m.epoch,
                                          token=self.token).header(), arrays)
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
                          self.presence[self.spare].get("key"), self.marks)
        if self.decider._swap(self.m, new, self.guard) is None:
            return "the map changed, or the request was withdrawn"
        self.at["done"] = clock.monotonic()
        return None
