"""A drain's handover: a node's position, identity and state moved to a spare, with no failure.

One `Handover` is one attempt, run by the acting decider within one step (`Decider._drain`):

1. the node's data rows are copied to the spare while the node serves (`hand_over` with `rows`,
   under a name of this attempt; rows changed from then on are flagged);
2. the node is frozen on this map's epoch (`freeze`): it refuses writes and deltas (`moved`),
   closes its window, and is waited for (HANDOVER_FLUSH at most) until its deltas are acknowledged;
3. the rest of its state (`hand_over`, the copy named) goes to the spare (`take_over`), which
   takes the position under the node's identity when sent the map with it;
4. one map change, guarded by the drain request, gives that identity the spare's endpoint.

The calls that carry a node's memory are not sent twice (a repeat would cost more than a timeout).
`run()` says why an attempt failed; the decider then thaws the node and tries again later.
"""
from __future__ import annotations

from .. import clock
from ..protocol.messages import Freeze, HandOver, TakeOver
from . import plans
from .map import Map

HANDOVER_FLUSH = 5.0  # longest a handover waits for the frozen node to get quiet (its deltas acknowledged)
HANDOVER_TIMEOUT = 60.0  # longest one transfer of a node's memory (to the decider, then to the spare) may take


def freeze(decider, endpoints: list[str], epoch: int, deadline: float, deltas: bool = False) -> str | None:
    """Freeze the nodes at `endpoints` on map `epoch` (with `deltas`, they still take their peers') and wait until
    each is quiet (its window closed, its deltas acknowledged), until `deadline` at most; None once they are, else
    why not."""
    request = Freeze(epoch=epoch, deltas=deltas, token=decider.token).header()
    while True:
        ok, _ = decider._ask({e: (request, []) for e in endpoints})
        silent = [e for e in endpoints if e not in ok]
        if silent:
            return f"{silent[0]} did not answer the freeze"
        busy = {e: why for e in endpoints if (why := ok[e][0].get("not_ready")) is not None}
        if not busy:
            return None
        if clock.monotonic() > deadline:
            return "not quiet in time: " + "; ".join(f"{e}: {why}" for e, why in sorted(busy.items()))
        clock.sleep(0.01)


class Handover:
    """One attempt to move position `p` of map `m` to `spare` (`guard`: the drain request still stands)."""

    def __init__(self, decider, m: Map, p: int, spare: str, guard: list):
        self.decider, self.m, self.p, self.spare, self.guard = decider, m, p, spare, guard
        self.endpoint, self.token = m.endpoints[p], decider.token
        self.state: tuple | None = None  # the node's state as it came: (header, arrays)
        self.at: dict[str, float] = {}  # when each stage began
        self.built = 0.0  # seconds the spare took to build the node

    def run(self) -> str | None:
        """Hand the position over; None once the map gives it to the spare, else why not."""
        self.at["copy"] = clock.monotonic()
        self.copied = self._copy_rows()
        self.at["freeze"] = clock.monotonic()
        return self._freeze() or self._export(self.copied) or self._take_over() or self._check() or self._swap()

    def summary(self) -> str:
        """Where the time went, for the decider's log."""
        at, size = self.at, sum(a.nbytes for a in self.state[1]) / 2**20
        return (f"rows copied in {at['freeze'] - at['copy']:.2f} s; then frozen {at['done'] - at['freeze']:.2f} s: "
                f"flush {at['export'] - at['freeze']:.2f}, {size:.1f} MiB out {at['take'] - at['export']:.2f}, "
                f"in {at['taken'] - at['take']:.2f} of which building the node {self.built:.2f}")

    def _ask(self, endpoint: str, request, arrays=(), timeout: float = HANDOVER_TIMEOUT):
        """The reply (header, arrays) of one call that may carry a node's memory, or the exception met."""
        return self.decider.control.call_all({endpoint: (request.header(), list(arrays))}, timeout, again=False)[endpoint]

    def _copy_rows(self) -> str | None:
        """The name of the copy of the node's rows the spare holds, or None (all rows cross once it is frozen)."""
        self.decider.copies += 1
        copy = f"{self.decider.name}/{self.decider.copies}"
        rows = self._ask(self.endpoint, HandOver(rows=True, copy=copy, token=self.token))
        if isinstance(rows, Exception):
            return None
        header = TakeOver(state=rows[0]["state"], config=self.m.config, rows=True, copy=copy, token=self.token)
        return None if isinstance(self._ask(self.spare, header, rows[1]), Exception) else copy

    def _freeze(self) -> str | None:
        return freeze(self.decider, [self.endpoint], self.m.epoch, self.at["freeze"] + HANDOVER_FLUSH)

    def _export(self, copied: str | None) -> str | None:
        self.at["export"] = clock.monotonic()
        answer = self._ask(self.endpoint, HandOver(copied=copied, token=self.token))
        if isinstance(answer, Exception):
            return f"its state did not come: {answer}"
        self.state = answer
        return None

    def _take_over(self) -> str | None:
        """The spare builds the node, then takes the position and announces it, the map still giving it to the
        node (whose identity it now has: no stray, `plans.strays`)."""
        self.at["take"] = clock.monotonic()
        header, arrays = self.state
        answer = self._ask(self.spare, TakeOver(state=header["state"], config=self.m.config, copy=self.copied,
                                                epoch=self.m.epoch, token=self.token), arrays)
        self.at["taken"] = clock.monotonic()
        if isinstance(answer, Exception):
            return f"{self.spare} did not take the state: {answer}"
        self.built = answer[0].get("seconds", 0.0)
        ok, _ = self.decider._ask({self.spare: (self.decider.map_header(self.m, position=self.p), [])})
        if ok.get(self.spare, ({}, []))[0].get("source") != self.m.sources[self.p]:
            return f"{self.spare} did not take the position"
        return None

    def _check(self) -> str | None:
        presence = self.presence = self.decider.store.presence()
        if self.endpoint not in presence or self.spare not in presence or plans.silent(self.m, presence):
            return "a node went away meanwhile"
        return None

    def _swap(self) -> str | None:
        new = self.m.with_position(self.p, endpoint=self.spare, key=self.presence[self.spare].get("key"))
        if self.decider._swap(self.m, new, self.guard) is None:
            return "the map changed, or the request was withdrawn"
        self.at["done"] = clock.monotonic()
        return None
