"""The cluster map: who holds each position, in which state; a pure value.

It is stored in the membership store under `<prefix>/map` and changes only by
compare-and-swap on that key's revision, which is the map's **epoch**: every change
raises it, so nodes and clients can tell a newer map from an older one.

Per position: the node's endpoint, its identity (`source`, one per node incarnation;
None until the node took the position), its state, its rebuild generation and, with CURVE
keys, the node's public key (`keys`, as it announced it; see `ectable.security`).

    up          holds all its rows and parity rows
    rebuilding  a spare put there, or a node told to rebuild some parity rows; serves
                what it has
    dead        its node is gone (its identity is in `fenced`); reads are decoded from
                the survivors until a spare is put there

`failing` lists dead positions whose stripes' parity holders are not reconciled yet
(position, identity): clients replay their redo logs only once it is empty for theirs.

`settled` records, for the last `SETTLED_KEPT` reconciled identities, what the survivors'
parity held of that node's writes when it was reconciled: `(source, ((q, {client: last write}),
...), ((q, table, stripes whose parity row q lacked), ...))`. A dead node's writes can no longer
reach any parity after that, and parity rebuilt later holds what the rebuilt data holds, so the
record stays true: a client that takes the dead node's redo log late (after other holders were
replaced, which forgets their marks) replays exactly what no parity held. A reconcile that would
list more than `decider.SETTLED_MAX_ROWS` lacking rows records nothing (such a client then asks the
survivors, as when the record has scrolled out), so the map stays small.

`retired` records, for the identities the last `RETIRED_GROWS` grows retired (`cluster.grow`: every position
takes a new one), each client's last write that node applied: a client whose write to it went unanswered
(its answer lost, or refused as the node froze) tells from this whether to send it again by the new layout
(seed xor 266 of the simulation had two grows within 0.3 s while an answer was lost).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import msgpack

STATES = ("up", "rebuilding", "dead")
SETTLED_KEPT = 64
RETIRED_GROWS = 4  # grows whose retired identities' client marks the map keeps


@dataclass(frozen=True)
class Map:
    config: dict
    endpoints: tuple
    sources: tuple
    states: tuple
    generations: tuple
    fenced: tuple = ()
    failing: tuple = ()  # ((position, source), ...)
    settled: tuple = ()  # ((source, marks per survivor, rows survivors lacked), ...): see above
    keys: tuple = ()  # per position, the node's public key (empty: no keys)
    retired: tuple = ()  # ((identity a recent grow retired, {client: its last write there}), ...): see above
    epoch: int = 0  # the store's revision of this map (not stored in it)

    @classmethod
    def initial(cls, config: dict, endpoints) -> "Map":
        n = len(endpoints)
        return cls(dict(config), tuple(endpoints), (None,) * n, ("up",) * n, (0,) * n)

    def encode(self) -> bytes:
        value = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "epoch"}
        return msgpack.packb(value, use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes, epoch: int) -> "Map":
        value = msgpack.unpackb(data, raw=False)
        value["failing"] = tuple(tuple(pair) for pair in value.get("failing", ()))
        value["settled"] = tuple(tuple(entry) for entry in value.get("settled", ()))
        value["retired"] = tuple(tuple(entry) for entry in value.get("retired", ()))
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}, epoch=epoch)

    def with_position(self, p: int, **changes) -> "Map":
        """A copy with position p's endpoint, source, state, generation or key changed."""
        fields = {"endpoint": "endpoints", "source": "sources", "state": "states", "generation": "generations",
                  "key": "keys"}
        out = {}
        for key, value in changes.items():
            name = fields[key]
            column = list(getattr(self, name)) or [None] * self.nodes
            column[p] = value
            out[name] = tuple(column)
        return dataclasses.replace(self, **out)

    def replace(self, **changes) -> "Map":
        return dataclasses.replace(self, **changes)

    def settle(self, p: int, source: str, marks: dict, lacking: list | None) -> "Map":
        """Position p's dead `source` is reconciled: it leaves `failing`, and what survivors' parity held of
        its writes is recorded (`marks` {survivor: {client: last write}}, `lacking` [[q, table, stripes]];
        None: not recorded)."""
        failing = tuple(f for f in self.failing if tuple(f) != (p, source))
        if lacking is None:
            return self.replace(failing=failing)
        entry = (source, tuple((q, dict(c)) for q, c in sorted(marks.items())), tuple(tuple(x) for x in lacking))
        return self.replace(failing=failing, settled=(self.settled + (entry,))[-SETTLED_KEPT:])

    def applied_before_grow(self, source: str, cid: str, cseq: int) -> bool | None:
        """Whether node identity `source`, retired by a grow, applied client `cid`'s write `cseq` (None: not
        recorded: `source` was not retired by one of the last RETIRED_GROWS grows)."""
        for retired, marks in self.retired:
            if retired == source:
                return cseq <= marks.get(cid, 0)
        return None

    def settled_marks(self, source: str):
        """({survivor: {client: last write}}, [(q, table, stripes lacked)]) recorded for `source`, or None."""
        for entry in self.settled:
            if entry[0] == source:
                return {int(q): dict(c) for q, c in entry[1]}, [tuple(x) for x in entry[2]]
        return None

    @property
    def nodes(self) -> int:
        return len(self.endpoints)

    def live(self) -> list[int]:
        return [p for p, s in enumerate(self.states) if s != "dead"]

    def dead(self) -> list[int]:
        return [p for p, s in enumerate(self.states) if s == "dead"]

    def position_of(self, endpoint: str) -> int | None:
        """The live position served at `endpoint`, or None."""
        for p, (e, s) in enumerate(zip(self.endpoints, self.states)):
            if e == endpoint and s != "dead":
                return p
        return None

    def view(self) -> dict:
        """The map as a plain dict (what a `map` message to a node carries)."""
        return {"epoch": self.epoch, "config": self.config, "endpoints": list(self.endpoints),
                "sources": list(self.sources), "states": list(self.states), "keys": list(self.keys) or None,
                "dead": self.dead(), "fenced": list(self.fenced)}
