"""Every request between clients, nodes and deciders as a typed record; error codes; header checks.

A message travels as a small msgpack header ("op" and the record's fields) plus raw array frames
(`transport/codec.py`). `Request.header()` is what a sender puts on the wire; `parse(header)` is the
one place a receiver checks a header: an unknown op, a missing field or a field of the wrong type
raises `InvalidRequest` naming the op and the field. Checks of array frames (ids, rows, shapes)
are in `validate.py`. Replies are plain headers; an error reply is `error(code, message, ...)`,
its code one of `ErrorCode`.

Every request may name the node incarnation it is meant for (`node`, a source identity); a node
answers `not_member` to one meant for another. Transports add an `id`; replies carry the node's
map `epoch` and its `durable` write sequence.
"""
from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import ClassVar

from ..errors import InvalidRequest


class ErrorCode(str, enum.Enum):
    """What an error reply's "error" says."""

    INVALID = "invalid"  # the request was refused and changed nothing
    MALFORMED = "malformed"  # its frames did not decode
    INTERNAL = "internal"  # the node met a bug of its own and went on
    NOT_REBUILT = "not_rebuilt"  # rows not rebuilt yet: rebuild them, then ask again
    STALE_CUT = "stale_cut"  # rebuilt rows refused: read them again (or, "behind", send again shortly)
    NOT_MEMBER = "not_member"  # this node holds no position, or is another incarnation
    OUT_OF_ORDER = "out_of_order"  # an earlier delta of this source is still on its way
    FENCED = "fenced"  # deltas of a node declared dead are refused
    REPLAYING = "replaying"  # a replacement waits for writers' replays: ask again shortly
    REPLACED = "replaced"  # a degraded write for a position that has a replacement now: write to it
    FORBIDDEN = "forbidden"  # the sender's key may not send this (see `ectable.security`)
    EXPIRED = "expired"  # the writer's lease lapsed and nodes forgot its clients: it must connect again
    MOVED = "moved"  # the node hands its position to another (a drain): ask again once the map moved it


def writer_of(cid: str) -> str:
    """The writer a client id names (`writer/token`; an id without a writer names itself)."""
    return cid.partition("/")[0]


def error(code: ErrorCode, message: str, **extra) -> dict:
    """An error reply's header."""
    return {"error": code.value, "message": message, **extra}


REQUESTS: dict[str, type] = {}


class Request:
    """A request record; subclasses are declared with `@request(op)`."""

    op: ClassVar[str]
    _checks: ClassVar[tuple]

    def header(self) -> dict:
        """The wire header: "op" and every field that is set."""
        out = {"op": self.op}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value
        return out


def request(op: str):
    """Declare a request record for `op` (a keyword-only frozen dataclass; `node` may target one incarnation)."""
    def declare(cls):
        cls = dataclasses.dataclass(frozen=True, kw_only=True)(cls)
        cls.op = op
        hints = typing.get_type_hints(cls)
        cls._checks = tuple((f.name, _types(hints[f.name]),
                             f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                            for f in dataclasses.fields(cls))
        REQUESTS[op] = cls
        return cls
    return declare


def _types(hint) -> tuple:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(t for arg in typing.get_args(hint) for t in _types(arg))
    origin = typing.get_origin(hint)
    return (origin or hint,)


def _fits(value, allowed: tuple) -> bool:
    if value is None:
        return type(None) in allowed
    if isinstance(value, bool):
        return bool in allowed
    if isinstance(value, int) and float in allowed:
        return True
    return isinstance(value, tuple(t for t in allowed if t is not type(None)))


def parse(header) -> Request:
    """The record a received header carries; `InvalidRequest` naming what is wrong, if anything."""
    if not isinstance(header, dict):
        raise InvalidRequest("request header must be a map")
    op = header.get("op")
    cls = REQUESTS.get(op) if isinstance(op, str) else None
    if cls is None:
        raise InvalidRequest(f"unknown op {op!r}")
    values = {}
    for name, allowed, required in cls._checks:
        if name not in header:
            if required:
                raise InvalidRequest(f"{op}: field {name!r} is missing")
            continue
        value = header[name]
        if not _fits(value, allowed):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
            raise InvalidRequest(f"{op}: field {name!r} must be {names}, got {type(value).__name__}")
        values[name] = value
    return cls(**values)


# -- data ------------------------------------------------------------------
@request("create_table")
class CreateTable(Request):
    spec: dict
    node: str | None = None


@request("drop_table")
class DropTable(Request):
    """Free `table` on this node, its rows and parity rows; answers whether it had it."""
    table: str
    node: str | None = None


@request("tables")
class Tables(Request):
    node: str | None = None


@request("get")
class Get(Request):
    """Rows of one table (arrays: ids); "committed": as of the open window's start, with the deltas
    that carried them (for decoding); "records": weights and optimizer state."""
    table: str
    committed: bool = False
    records: bool = False
    node: str | None = None


@request("get_committed")
class GetCommitted(Request):
    """Committed records of several tables (arrays: one ids array per table), as `Get` with "committed" and
    "records" gives those of one: for a decode, with the deltas that carried them."""
    tables: list
    node: str | None = None


@request("get_many")
class GetMany(Request):
    """Rows of several tables (arrays: one ids array per table). With "partial", a rebuilding node answers rows
    it has not rebuilt yet with zeros, and after the rows the ids of those, one array per table ("missing").
    With "lacking" too, it answers so always, and after those ids which of its rows of each table it has not
    rebuilt yet: one bit per local row, packed (`np.packbits`; empty once it lacks none)."""
    tables: list
    records: bool = False
    partial: bool = False
    lacking: bool = False
    node: str | None = None


@request("write")
class Write(Request):
    """Writes to several tables (arrays: ids, values per part); `parts` [[table, "put" | "apply_gradient"]];
    `cid`/`cseq`: the client and its write number (a retry is applied once)."""
    parts: list
    cid: str | None = None
    cseq: int | None = None
    node: str | None = None


@request("replay")
class Replay(Request):
    """A writer's writes that a dead node at this position applied and no parity holds:
    `entries` [[dead node's seq or None, cid, cseq, parts], ...], arrays (ids, values) per part."""
    replayer: str
    entries: list
    node: str | None = None


@request("step")
class Step(Request):
    node: str | None = None


@request("sync")
class Sync(Request):
    """How many deltas wait for an acknowledgement; with `close`, after closing the window."""
    close: bool = False
    node: str | None = None


@request("status")
class Status(Request):
    node: str | None = None


@request("snapshot")
class Snapshot(Request):
    """Checkpoint `number` of chain `root`: copy the rows a checkpoint of `kind` writes ("full",
    "incremental" after checkpoint `after`, "differential" from baseline `base`), then write their
    pieces (weights as `bits`-bit codes, `adaptive` ranges, or exact; optimizer state exact or as
    `state_bits`-bit codes) into `directory` (a URL) in the
    background. With `check`, only say whether this node can (its flags fit the chain, no rows
    missing) and change nothing."""
    number: int
    root: str
    directory: str
    kind: str
    after: int | None = None
    base: int | None = None
    bits: int | None = None
    adaptive: bool = False
    state_bits: int | None = None
    check: bool = False
    node: str | None = None


@request("snapshot_progress")
class SnapshotProgress(Request):
    """How far the pieces of checkpoint `number` are written; when done, their manifest entries."""
    number: int
    node: str | None = None


# -- parity ----------------------------------------------------------------
@request("delta")
class Delta(Request):
    """Parity deltas of `source`'s window number `seq` (arrays: ids, delta bytes per table);
    `clients`: each client's last write in it. A node's window also carries its number `window` (the
    same for every target) and `durable`, the last window every target acknowledged. A degraded write
    (a client's, through the parity) names the `position` of its rows and the identity it saw `dead` there."""
    source: str
    seq: int
    tables: list
    clients: dict | None = None
    window: int | None = None
    durable: int | None = None
    position: int | None = None
    dead: str | None = None
    node: str | None = None


@request("applied")
class Applied(Request):
    """Per client, the last write whose delta from `source` this node holds; the window of its last
    delta, and the lowest window it can roll back to. `fence`: refuse `source`'s deltas from now on."""
    source: str | None = None
    fence: bool = False
    node: str | None = None


@request("rollback")
class Rollback(Request):
    """Take the deltas of dead node `source`'s windows after `window` back out of parity; the node then
    holds `clients` (each client's last write in `window`) as that source's marks."""
    source: str
    window: int
    clients: dict
    node: str | None = None


@request("holds")
class Holds(Request):
    """Which parity rows of stripes (arrays: stripes) this node has. Before a degraded write, `source`
    (the writer's repair source) with the `position` and `dead` identity it writes for: refused
    (`replaced`) if the position has a replacement, else the writer's deltas are taken for a while even
    if one comes (so the write reaches every holder or none)."""
    table: str
    source: str | None = None
    position: int | None = None
    dead: str | None = None
    node: str | None = None


@request("holds_many")
class HoldsMany(Request):
    """`Holds` of several tables (arrays: one stripes array per table; the reply: which are there and the
    degraded writes of each, per table), one promise for all of them."""
    tables: list
    source: str | None = None
    position: int | None = None
    dead: str | None = None
    node: str | None = None


@request("get_parity")
class GetParity(Request):
    """Parity rows of one table (arrays: stripes) and the degraded writes each holds."""
    table: str
    node: str | None = None


@request("get_parity_many")
class GetParityMany(Request):
    """`GetParity` of several tables (arrays: one stripes array per table)."""
    tables: list
    node: str | None = None


@request("restore")
class Restore(Request):
    """Rebuilt data records (`kind` "data"; arrays: ids, records) or parity rows ("parity"; arrays:
    stripes, rows) read at `cut` (source -> delta number) and the node's `generation`; `seen`: which
    identity each source then took for the restoring node's position (its delta numbers count deltas
    sent to that one); `windows`: the window each source's data was read at."""
    table: str
    kind: str = "data"
    cut: dict = dataclasses.field(default_factory=dict)
    generation: int | None = None
    marks: dict | None = None
    seen: dict | None = None
    windows: dict | None = None
    node: str | None = None


@request("restore_rows")
class RestoreRows(Request):
    """Rebuilt data records of several tables (arrays: ids, records per table), as `Restore` of kind "data"."""
    tables: list
    node: str | None = None


@request("invalidate")
class Invalidate(Request):
    table: str
    node: str | None = None


@request("missing")
class Missing(Request):
    """Rows and parity rows still to rebuild, at most `limit` of each per table; of part `part` of `parts`
    (chunks of `limit` in turn), or of any part once that part has none left."""
    limit: int = 1 << 16
    part: int = 0
    parts: int = 1
    node: str | None = None


# -- membership and control ------------------------------------------------
@request("map")
class MapUpdate(Request):
    """A cluster map for a node; `position` (with `config`, `rebuilding`) gives a spare its position."""
    endpoints: list
    token: str | None = None
    epoch: int | None = None
    config: dict | None = None
    sources: list | None = None
    states: list | None = None
    keys: list | None = None
    dead: list = dataclasses.field(default_factory=list)
    fenced: list = dataclasses.field(default_factory=list)
    position: int | None = None
    rebuilding: bool = False
    node: str | None = None


@request("freeze")
class Freeze(Request):
    """A drain's handover: the node refuses writes, deltas and every other change (`moved`) and closes its
    window (`on`), or takes them again (`on` false). `epoch`: of the map the decider read; a thaw is taken only
    with a later epoch than every freeze's (the decider wrote the map first, so that no handover begun before
    can still move the node). Answers how many of its deltas wait for an acknowledgement, and why it cannot hand
    over yet ("not_ready", None once it can). `deltas`: it still takes peers' deltas until its state is handed
    over (a grow freezes every node: their last windows' deltas go to frozen peers)."""
    on: bool = True
    epoch: int = 0
    deltas: bool = False
    token: str | None = None
    node: str | None = None


@request("hand_over")
class HandOver(Request):
    """A frozen node's whole state (`storage.handover`): header "state", and its arrays; `copied`: the name of a
    copy of its rows taken before, of whose tables only the rows changed since are sent (refused if its rows
    were copied under another name since). With `rows`, the node need not be frozen: its data rows as they are,
    under the name `copy` (rows changed from now on are flagged; the same name again flags nothing anew).
    Without `parity`, the state leaves the parity rows out (a grow encodes them again)."""
    rows: bool = False
    copy: str | None = None
    copied: str | None = None
    parity: bool = True
    token: str | None = None
    node: str | None = None


@request("take_over")
class TakeOver(Request):
    """To a spare: the `state` (arrays: its arrays) of the node whose place it takes, with the cluster's
    `config`; it holds that node, unseen, until a map gives it the position under that identity. To a frozen
    node of a growing cluster: the node that replaces it in the new layout (`storage.relayout`), held likewise
    until a map with that layout gives it its position (a thaw drops it), unless frozen since on a later map
    than `epoch` (a decider deposed meanwhile sent it). `copy` names the rows sent ahead that the state completes
    (refused if the rows held are another copy's). With `rows`,
    the node's data rows copied before it was frozen (`state` {"tables": names}), which the state laid over
    them completes."""
    state: dict
    config: dict
    rows: bool = False
    copy: str | None = None
    epoch: int = 0
    token: str | None = None
    node: str | None = None


@request("ping")
class Ping(Request):
    node: str | None = None


@request("shutdown")
class Shutdown(Request):
    token: str | None = None
    node: str | None = None


@request("fault")
class Fault(Request):
    """Arm an injected fault (tests)."""
    name: str
    value: float = 1.0
    token: str | None = None
    node: str | None = None


CONTROL = {"map", "ping", "shutdown", "fault", "freeze", "hand_over", "take_over"}  # answered by a node's host, whether it holds a position or not
