"""Failover decisions as pure functions of the map and what nodes report (no I/O)."""
from __future__ import annotations

import numpy as np

from ..arrays import unique
from ..layout import Layout
from .map import RETIRED_GROWS, Map


def silent(m: Map, presence: dict) -> list[int]:
    """Live positions whose node is gone: no presence at its endpoint, or another incarnation there (nodes
    announce a position they take before they answer the decider that gave it, and the identity a grow gave
    them to take, `pending`, before the map gives it). A position whose node never took it is waited for,
    not failed."""
    out = []
    for p in m.live():
        if m.sources[p] is None:
            continue  # not started yet (nodes may start after the map is written): it holds nothing
        info = presence.get(m.endpoints[p])
        if info is None or m.sources[p] not in (info.get("source"), info.get("pending")):
            out.append(p)
    return out


def declare_dead(m: Map, positions) -> Map:
    """The map with `positions` dead, their identities fenced and their parity to reconcile."""
    for p in positions:
        source = m.sources[p]
        m = m.with_position(p, state="dead").replace(
            fenced=m.fenced + ((source,) if source else ()),
            failing=m.failing + (((p, source),) if source else ()))
    return m


def rebuild_states(m: Map, presence: dict) -> Map:
    """The map with each live position's up/rebuilding state as its node reports it; a report from
    before the node was last told to rebuild (an older generation) changes nothing."""
    for p in m.live():
        info = presence.get(m.endpoints[p])
        if info is None or m.sources[p] is None or info.get("source") != m.sources[p]:
            continue
        generation = info.get("generation") if isinstance(info.get("generation"), int) else 0
        if generation < m.generations[p]:
            continue
        state = "rebuilding" if info.get("rebuilding") else "up"
        if state != m.states[p] or generation != m.generations[p]:
            m = m.with_position(p, state=state, generation=generation)
    return m


def unassigned(m: Map, presence: dict) -> list[int]:
    """Live positions no node took yet whose node announced its presence: only those are given theirs (the
    key the node announced goes in the map, and peers take its deltas only with that key; a node that
    answered before its presence was read went in without one, and its deltas were refused for good)."""
    return [p for p in m.live() if m.sources[p] is None and m.endpoints[p] in presence]


def strays(m: Map, presence: dict) -> list[str]:
    """Identities of nodes that hold a position the map does not give them (not fenced yet)."""
    out = []
    for endpoint, info in presence.items():
        p, source = info.get("position"), info.get("source")
        if not isinstance(p, int) or not isinstance(source, str) or source in m.fenced:
            continue
        if not (0 <= p < m.nodes) or m.sources[p] not in (None, source):
            out.append(source)
        elif m.endpoints[p] != endpoint and m.sources[p] != source:  # the map's identity at another endpoint:
            out.append(source)  # a handover in flight, whose node the map does not name leaves by itself
    return out


def frozen(m: Map, presence: dict) -> list[str]:
    """Endpoints of nodes the map gives a live position that a handover or a grow froze (one that did not
    finish: a decider does either within one step; a node the map gives its new identity after a grow takes
    it unfrozen)."""
    return [m.endpoints[p] for p in m.live() if presence.get(m.endpoints[p], {}).get("frozen")
            and presence[m.endpoints[p]].get("source") == m.sources[p]]


def given(m: Map, presence: dict) -> list[str]:
    """Endpoints of spares that hold a node a handover or a grow gave them (`pending`) which no map gives them:
    left by a decider that died before its map change (a decider does either within one step)."""
    taken = {m.endpoints[p] for p in m.live()}
    return [e for e, info in sorted(presence.items())
            if info.get("pending") and info.get("position") is None and e not in taken]


def arriving(m: Map, presence: dict) -> list[str]:
    """Endpoints of spares that took a dead position the map does not give them yet (being installed)."""
    return [e for e, info in sorted(presence.items())
            if isinstance(info.get("position"), int) and 0 <= info["position"] < m.nodes
            and m.states[info["position"]] == "dead" and info.get("source") not in m.fenced]


def free_spares(m: Map, presence: dict, drains=()) -> list[str]:
    """Endpoints of live nodes that hold no position and are not asked to leave (`drains`), in announcement
    order of their keys."""
    taken = {m.endpoints[p] for p in m.live()}
    return [e for e, info in sorted(presence.items())
            if info.get("position") is None and e not in taken and e not in drains]


def reconcile_stripes(layout: Layout, p: int) -> tuple[np.ndarray, np.ndarray]:
    """The stripes position p held data in, and their parity holders [stripes, r]."""
    stripes = unique(np.concatenate([layout.stripes_of(p, t) for t in range(layout.k)]))
    holders = np.stack([layout.parity_node(stripes, j) for j in range(layout.r)], axis=1)
    return stripes, holders


def parity_holders(layouts: list, p: int) -> set[int]:
    """The positions holding parity of some stripe position p holds data in, in any of `layouts`."""
    return {int(q) for layout in layouts for q in unique(reconcile_stripes(layout, p)[1])}


def holding_none(has: list) -> set[int]:
    """Rebuilding holders that answered for every table and have none of the parity rows of the dead node's
    stripes (`has`: per table {holder: which rows it has, or None if it did not answer}). Their level of
    the dead node's deltas (unknown on a spare) is moot: their rows are rebuilt after the reconcile."""
    qs = {q for h in has for q in h}
    return {q for q in qs if all(h[q] is not None and not h[q].any() for h in has if q in h)}


def rollback_level(windows: dict, kept: dict) -> int | None:
    """The window of a dead node's deltas every survivor can go back to: the lowest any holds, if each
    one above it still keeps its deltas since (`windows`, `kept`: {survivor: window, or None if it took
    none of the dead node's deltas}). None when some survivor's level is not known, or it cannot go back
    that far."""
    if not windows or any(w is None for w in windows.values()):
        return None
    floor = min(windows.values())
    if any(kept[q] is None or kept[q] > floor for q, w in windows.items() if w > floor):
        return None
    return floor


def stale_parity(stripes: np.ndarray, holders: np.ndarray, score: np.ndarray, has: dict) -> dict:
    """A dead node's last windows may have reached some parity holders of a stripe and not others.
    Per stripe, every holder behind the stripe's most advanced holder forgets its parity row (it is
    rebuilt from the data, after clients replayed what no parity holds); the most advanced is never
    touched. `score[q]`: how much of the dead node's writes survivor q applied (-1: not a survivor);
    `has[q]`: for a rebuilding holder, which of the rows it holds (by `holders == q` rows) it has.
    Returns {holder: stripes whose parity row it must forget}."""
    held = score[holders]
    for q, have in has.items():
        mine = holders == q
        rows = mine.any(axis=1)
        sub = held[rows]
        sub[mine[rows] & ~have[:, None]] = -1
        held[rows] = sub
    behind = (held >= 0) & (held < held.max(axis=1, keepdims=True))
    return {int(q): stripes[(behind & (holders == q)).any(axis=1)] for q in unique(holders[behind]).tolist()}


def drain_waits(m: Map, spares: list[str]) -> str | None:
    """Why no drain may start now (None: one may). A drain hands a position to a spare, and fails it over if
    handing it over keeps failing: it starts only when every position is up (none dead, reconciling or
    rebuilding) and a free spare (`spares`) can take the place."""
    return not_up(m, "a drain") or (None if spares else "no free spare to take its place (add one: `ectable "
                                                          "spare add`)")


def not_up(m: Map, what: str) -> str | None:
    """Which position is not up (dead, rebuilding, or being reconciled), for `what` that waits for every one."""
    for p in range(m.nodes):
        if m.states[p] != "up":
            return f"position {p} is {m.states[p]}: {what} waits until every position is up"
    if m.failing:
        return f"position {m.failing[0][0]} is being reconciled"
    return None


def grow_waits(m: Map, presence: dict) -> str | None:
    """Why no grow may start now (None: one may): every position must be up, and no writer may still replay late
    what a replaced node had applied (the new layout's nodes would not know where those writes go)."""
    late = late_replays(m, presence)
    if late:
        return (f"{late} writer(s) may still replay writes a failed node had applied (each does on its next call, "
                f"or is forgotten once its lease lapses)")
    return not_up(m, "a grow")


def growable(m: Map, presence: dict, grows: dict, drains=()) -> str | None:
    """The spare to add as a new position now (`ectable node add`): the first asked for that is a free spare,
    once `grow_waits` allows. None: no grow now."""
    wanted = [e for e in sorted(grows) if e in free_spares(m, presence, drains)]
    return wanted[0] if wanted and grow_waits(m, presence) is None else None


def late_replays(m: Map, presence: dict) -> int:
    """Writers that may still replay late into a live position's node (each counted per node)."""
    live = {m.endpoints[p] for p in m.live()}
    return sum(n for e, info in presence.items() if e in live and isinstance(n := info.get("late"), int) and n > 0)


def grown(m: Map, new_config: dict, sources: list, spare: str, key: str | None, marks: list) -> Map:
    """The map of a grow: one more position, held by `spare`; every position under its new identity
    (`sources`), the old ones fenced and retired with the client marks their nodes had (`marks[p]`; those of the
    last RETIRED_GROWS grows are kept: the map stays small)."""
    retired = tuple((s, dict(c)) for s, c in zip(m.sources, marks) if s is not None)
    return m.replace(config=new_config, endpoints=m.endpoints + (spare,), sources=tuple(sources),
                     states=m.states + ("up",), generations=(0,) * (m.nodes + 1),
                     keys=m.keys + (key,) if m.keys else (), fenced=m.fenced + tuple(s for s, _ in retired),
                     retired=(m.retired + retired)[-RETIRED_GROWS * m.nodes:])


def drainable(m: Map, drains: set, spares: list[str]) -> int | None:
    """The position to drain now: the first whose node is asked to leave, if `drain_waits` allows."""
    leaving = [p for p in m.live() if m.endpoints[p] in drains and m.sources[p] is not None]
    if not leaving or drain_waits(m, spares) is not None:
        return None
    return leaving[0]


def drain_progress(m: Map, presence: dict, drains, endpoint: str, p: int | None) -> tuple[str, str]:
    """("waiting", "done" or "withdrawn"; what happens now) for the drain of the node at `endpoint`, which held
    live position `p` (None: a spare) when the drain was asked for: done once a spare holds p, up, the node is gone
    and the decider closed the request (`drains`)."""
    held = p is not None and m.endpoints[p] == endpoint
    if endpoint not in drains and (m.states[p] != "dead" if held else endpoint in presence):
        return "withdrawn", "the request was withdrawn (`--cancel`, or a drain that gave up)"
    if held:
        if m.states[p] != "dead":
            return "waiting", f"waiting: {drain_waits(m, free_spares(m, presence, drains)) or 'the decider acts next'}"
        return "waiting", f"fenced; waiting for a spare to take position {p}"
    if p is not None and m.states[p] != "up":
        return "waiting", f"{m.endpoints[p]} took position {p}: {m.states[p]}"
    if endpoint in presence or endpoint in drains:
        return "waiting", "waiting for the node to stop"
    return "done", (f"{m.endpoints[p]} holds position {p}, up; " if p is not None else "") + "the node stopped"
