"""A storage node's logic, independent of any transport.

A node holds, for every table, the data rows and parity rows that the layout
gives its position. It answers requests (`handle(header, arrays)`), closes its
dirty window into parity deltas for the nodes holding its stripes' parity, and
applies the deltas it receives exactly once. Its host delivers the outgoing
deltas (`take_outbox`) and reports their acknowledgements (`acked`).
"""
from __future__ import annotations

import operator
import os
from collections import deque

import numpy as np

from .. import clock as clocks
from ..config import MAX_STREAMS, ClusterConfig
from ..errors import InvalidRequest
from ..protocol import deltas as payload, messages, validate
from ..protocol.messages import ErrorCode, writer_of
from ..checkpoint.quantize import BITS
from . import snapshots
from .retained import Retained
from .optimizers import WRITES
from .arena import Arena
from .window import Windows
from .parity import Named, Queued, delta_slots, fold, window_deltas
from .shard import NotRebuilt, Shard, commit_many, local_many, updated_many
from .table import TableSpec

MAX_QUEUED_ROWS = 1 << 18  # received delta rows held before they must be folded into parity
SKIPPED_SECONDS = 10.0  # deltas skipped by parity rows not rebuilt yet are kept this long
PROMISE_SECONDS = 5.0  # a degraded write that every holder agreed to is taken this long, replacement or not
REPLAY_WAIT = 10.0  # longest a replacement holds client requests for writers' replays
LATE_WAIT = 300.0  # longest a writer awaited in vain counts as one that may still replay late (a grow waits for it)
HELD_FOR_REPLAYS = {"get_many", "write", "missing"}  # and uncommitted gets: what clients read and write, and
# what a rebuilder asks before it decodes (so it reads parity only once no writer writes through it any more)
READS_PARITY = {"get_parity", "get_parity_many", "restore", "restore_rows", "invalidate", "missing", "sync", "status",
                "holds", "holds_many"}
LEAVES_WINDOW_OPEN = {"get", "get_committed", "get_many", "delta", "applied", "ping", "step",
                      "snapshot"}  # a pending close may wait
GONE_SECONDS = 3600.0  # how long a forgotten writer's writes and replays are refused
GONE_MAX = 1 << 16  # forgotten writers remembered at most (the oldest go first)



def available_memory() -> int:
    """Bytes this machine can still give (MemAvailable on Linux; free pages elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")

class Node:
    """One node's shards, dirty window, outgoing deltas and received-delta bookkeeping."""

    def __init__(self, position: int, config: ClusterConfig, rebuilding: bool = False, lazy_close: bool = False,
                 clock=None):
        self.position, self.config, self.clock = position, config, clock or clocks.monotonic
        self.code = config.make_code()
        self.rebuilding = rebuilding
        self.rebuild_since = self.clock() if rebuilding else None
        self.generation = int(rebuilding)  # counts invalidations: restores carry the one they read at
        self.rebuilt_rows = 0  # data and parity rows restored since rebuilding began
        self.pulled_since: float | None = None  # when a rebuilder first asked what is missing (or rows were restored)
        self.last_rebuild: dict | None = None  # the last rebuild that ended: rows, seconds, and seconds pulling rows
        self.source = f"node/{position}/{clocks.token_hex(8)}"  # this incarnation, unique across processes
        self.shards: dict[str, Shard] = {}
        self.dropped: set[str] = set()  # tables dropped here (never created again): deltas for them are moot
        self._lists: dict[tuple, Named] = {}  # the tables of delta messages seen, by the names they list
        self.write_seq = 0
        self.window_opened = self.clock()
        self._next_seq: dict[int, int] = {}
        self.outbox: list[tuple[int, dict, list]] = []
        self.unacked: dict[tuple[int, int], int] = {}  # (target, seq) -> window number
        self.windows: dict[int, list] = {}  # window number -> [last write seq, outstanding messages], oldest first
        self.closed_windows = 0
        self.closed_upto = 0  # write seq at the last close
        self.durable_window = 0  # the last window every target acknowledged
        self.durable_seq = 0
        self.applied: dict[str, int] = {}  # source -> seq of its last delta applied (they apply in order)
        self.fenced: set[str] = set()  # sources of nodes declared dead: their late deltas are refused
        self.sources: dict[int, str] = {}  # the identity at each position, as the last map said
        self.promised: dict[str, float] = {}  # repair source -> until when its degraded deltas are taken
        self.rejected = 0
        self.lazy_close = lazy_close  # step() only marks the window for closing (node processes)
        self.close_pending = False
        self.steps = 0  # steps taken since the window was last closed (`window_steps` close it)
        self.client_marks: dict[str, int] = {}  # client id -> its last write applied here
        self.closed_marks: dict[str, int] = {}  # client marks as of the last closed window (= committed records)
        self.client_writes: dict[str, tuple[int, int]] = {}  # client id -> (its last write, our seq for it)
        self.window_clients: dict[str, int] = {}  # client id -> its last write in the open window
        self.applied_clients: dict[str, dict] = {}  # source -> the client marks of its last applied window
        self.writer: snapshots.Writer | None = None  # the pieces of this node's last checkpoint
        self.retained = Retained(None if rebuilding else 0)  # others' recent windows, to roll back to if their sender dies
        self.arena = Arena()  # every table's parity rows
        self.records_arena = Arena()  # every table's records
        self.dirty = Windows()  # every table's dirty window
        self.queued: list = []  # received deltas not folded into parity yet: (shard, ids, delta, slots, source, seq)
        self.queued_rows = 0
        self.skipped: dict[str, deque] = {}  # source -> (seq, time, table, ids, delta) skipped while missing
        self.skipped_from: dict[str, int] = {}  # source -> first seq since which `skipped` is complete
        self.skipped_rows: dict[tuple, np.ndarray] = {}  # (node source, table) -> parity rows it skipped (bool)
        self.replay_from: set[str] | None = None  # writers whose replays a replacement still waits for
        self.replay_deadline = 0.0
        self.replays_since = 0.0  # when this node began to wait for replays (see `take_writers`)
        self.late: dict[str, float] = {}  # writer awaited past the deadline -> since when: it replays late (at once),
        # lapses, or is no longer counted after LATE_WAIT
        self.replay_buffer: list = []  # (dead node's seq, arrival, replayer, entry number, cid, cseq, writes)
        self.replayed: set[str] = set()  # writers that replayed here
        self.replay_seqs: dict[str, dict] = {}  # replayer -> entry number -> this node's seq for it
        self.writer_seen: dict[str, float] = {}  # writer -> when last seen live or writing here
        self.gone: dict[str, float] = {}  # writers forgotten (their lease lapsed) -> when, oldest first

    # -- dispatch --------------------------------------------------------
    def handle(self, header: dict, arrays: list) -> tuple[dict, list]:
        """Answer one request header; errors become error replies and change nothing."""
        try:
            msg = messages.parse(header)
        except InvalidRequest as exc:
            self.rejected += 1
            return messages.error(ErrorCode.INVALID, str(exc)), []
        return self.dispatch(msg, arrays)

    def dispatch(self, msg: messages.Request, arrays: list) -> tuple[dict, list]:
        """Answer one parsed request; errors become error replies and change nothing."""
        try:
            method = self._ops.get(msg.op)
            if method is None:
                raise InvalidRequest(f"a node does not take {msg.op!r}")
            if msg.node not in (None, self.source):  # meant for another incarnation of this position
                return messages.error(ErrorCode.NOT_MEMBER, f"this is {self.source}, not {msg.node}"), []
            if self.replay_from is not None and (msg.op in HELD_FOR_REPLAYS or msg.op == "get" and not msg.committed):
                self._maybe_end_replays()
                if self.replay_from is not None:
                    return messages.error(ErrorCode.REPLAYING, f"waiting for {len(self.replay_from)} writers' replays"), []
            if self.close_pending and msg.op not in LEAVES_WINDOW_OPEN:
                self.close_window()
            if msg.op in READS_PARITY and self.queued:
                self.apply_queued()
            reply, out = method(self, msg, arrays)
            reply.setdefault("durable", self.durable_seq)
            return reply, out
        except NotRebuilt as exc:
            return (messages.error(ErrorCode.NOT_REBUILT, str(exc), table=exc.table, kind=exc.kind,
                                   tables=list(exc.missing)), [exc.ids, *exc.missing.values()])
        except InvalidRequest as exc:
            self.rejected += 1
            return messages.error(ErrorCode.INVALID, str(exc)), []
        except Exception as exc:  # a node never dies of a request
            self.rejected += 1
            return messages.error(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"), []

    def _shard(self, name) -> Shard:
        shard = self.shards.get(name) if isinstance(name, str) else None
        if shard is None:
            raise InvalidRequest(f"unknown table {name!r}")
        return shard

    @staticmethod
    def _arrays(arrays, n):
        if not isinstance(arrays, (list, tuple)) or len(arrays) != n:
            raise InvalidRequest(f"expected {n} arrays, got {len(arrays) if isinstance(arrays, (list, tuple)) else arrays!r}")
        if not all(isinstance(a, np.ndarray) for a in arrays):
            raise InvalidRequest("payload frames must be arrays")
        return arrays

    def _ids(self, shard, arr):
        return validate.ids(shard.spec.name, arr, shard.spec.num_rows)

    # -- ops -------------------------------------------------------------
    def op_create_table(self, msg, arrays):
        """Create a table (a no-op if it exists as defined); answers with this node's view of its peers (the
        identity it takes at each other position), which the client checks against its map."""
        spec = TableSpec.from_config(msg.spec)
        existing = self.shards.get(spec.name)
        peers = {"peers": {str(t): s for t, s in self.sources.items() if t != self.position}}
        if existing is None and spec.name in self.dropped:  # names are never used again: a late copy of its
            raise InvalidRequest(f"table {spec.name!r} was dropped: its name is not used again")  # create, not a new one
        if existing is not None:
            if existing.spec != spec:
                raise InvalidRequest(f"table {spec.name!r} exists with a different definition "
                                     f"(existing vs requested: {existing.spec.differences(spec)})")
            return peers, []
        layout = self.config.layout(spec)
        need = (layout.data_capacity() + layout.parity_capacity()) * spec.width * 4
        free = available_memory()
        if need > free:
            raise InvalidRequest(f"table {spec.name!r}: {spec.num_rows} rows of {spec.width} float32 need "
                                 f"{need / 2**30:.1f} GiB on each node; this node has {free / 2**30:.1f} GiB available")
        try:
            self.shards[spec.name] = Shard(spec, layout, self.position, self.code, self.rebuilding, self.arena,
                                           records_arena=self.records_arena, windows=self.dirty)
        except MemoryError:
            raise InvalidRequest(f"table {spec.name!r}: not enough memory on node {self.position} for "
                                 f"{need / 2**30:.1f} GiB") from None
        self._settle()
        return peers, []

    def op_drop_table(self, msg, arrays):
        """Free a table: its rows, parity rows, dirty window, the deltas for it queued, skipped or kept here, and
        replayed writes to it still buffered; deltas naming it that arrive later are acknowledged and skipped."""
        shard = self.shards.pop(msg.table, None)
        self.dropped.add(msg.table)  # a node without it (a spare) also skips deltas and replays naming it
        if shard is None:
            return {"dropped": False}, []
        shard.free()
        self._lists.clear()  # it would keep the dropped shard, and its memory, alive
        self.queued = [entry for entry in (entry.without(msg.table) for entry in self.queued) if entry.shards]
        self.queued_rows = sum(entry.ids.size for entry in self.queued)
        for log in self.skipped.values():
            kept = [entry for entry in log if entry[2] != shard.spec.name]
            log.clear()
            log.extend(kept)
        self.skipped_rows = {key: rows for key, rows in self.skipped_rows.items() if key[1] != shard.spec.name}
        self.retained.forget(shard.spec.name)
        self.replay_buffer = [(*entry[:6], [w for w in entry[6] if w[0] is not shard]) for entry in self.replay_buffer]
        self._settle()
        return {"dropped": True}, []

    def op_tables(self, msg, arrays):
        return {"tables": [s.spec.get_config() for s in self.shards.values()]}, []

    def op_get(self, msg, arrays):
        shard = self._shard(msg.table)
        (ids,) = self._arrays(arrays, 1)
        ids = self._ids(shard, ids)
        committed = msg.committed
        rows = shard.read(ids, committed=committed, records=msg.records)
        return (self._cut() if committed else {}), [rows]

    def _cut(self) -> dict:
        """What a committed read's reply says of the deltas that carried its rows: a reader checks its cut
        against parity holders with it."""
        return {"source": self.source, "sent": {str(t): seq for t, seq in self._next_seq.items()},
                "peers": {str(t): s for t, s in self.sources.items()}, "marks": self.closed_marks,
                "window": self.closed_windows}

    def op_get_committed(self, msg, arrays):
        """Committed records of several tables (one ids array per table) with the deltas that carried them."""
        work = self._tables_ids(msg.tables, arrays)
        self._need_rebuilt(work)
        return self._cut(), [shard.read(ids, committed=True, records=True) for shard, ids in work]

    def op_get_many(self, msg, arrays):
        """Rows of several tables: header "tables", one ids array per table; "records": whole records; "partial":
        zeros for rows not rebuilt yet, and their ids; "lacking": also every row each table lacks (see `GetMany`)."""
        if msg.lacking and not msg.partial:
            raise InvalidRequest("get_many: \"lacking\" is asked with \"partial\" only")
        work = self._tables_ids(msg.tables, arrays)
        lacking = [shard.lacks(ids) for shard, ids in work] if msg.partial else []
        if not msg.lacking and not any(lacks.any() for lacks in lacking):
            self._need_rebuilt(work)
            return {}, [shard.read(ids, records=msg.records, local=local)
                        for (shard, ids), local in zip(work, local_many(work))]
        rows = []
        for (shard, ids), lacks in zip(work, lacking):
            out = np.zeros((ids.size, shard.width if msg.records else shard.dim), dtype=np.float32)
            out[~lacks] = shard.read(ids[~lacks], records=msg.records)
            rows.append(out)
        rows += [ids[lacks] for (_, ids), lacks in zip(work, lacking)]
        if msg.lacking:
            rows += [np.packbits(shard.missing_data) if shard.missing_data is not None else np.zeros(0, np.uint8)
                     for shard, _ in work]
        return {"missing": True}, rows

    def _tables_ids(self, tables: list, arrays) -> list:
        """[(shard, ids)] of a request naming `tables`, with one ids array each."""
        self._arrays(arrays, len(tables))
        shards = [self._shard(t) for t in tables]
        return list(zip(shards, self._ids_many(shards, arrays)))

    @staticmethod
    def _ids_many(shards, arrays) -> list:
        return validate.ids_many([s.spec.name for s in shards], arrays, [s.spec.num_rows for s in shards])

    @staticmethod
    def _need_rebuilt(work) -> None:
        """Refuse a request touching rows not rebuilt yet, naming those of every table at once."""
        missing = {shard.spec.name: m for shard, ids in work if (m := shard.unrebuilt(ids)).size}
        if missing:
            raise NotRebuilt.of(missing)

    def op_write(self, msg, arrays):
        """Writes to several tables as one request: header "parts" = [[table, "put" | "apply_gradient"], ...],
        arrays (ids, values) per part. Everything is checked before anything changes."""
        cid, cseq = msg.cid, msg.cseq
        if not (isinstance(cid, str) and len(cid) <= 64 and isinstance(cseq, int)):
            cid = cseq = None
        elif self.gone and writer_of(cid) in self.gone:
            return self._expired(writer_of(cid)), []
        elif self.is_retry(msg):  # a retry of a write applied here: apply it once
            last, seq = self.client_writes.get(cid, (0, 0))
            return {"seq": seq if cseq == last else self.write_seq, "duplicate": True}, []
        work = self._writes(msg.parts, arrays)
        self._need_rebuilt([(shard, ids) for shard, _, ids, _ in work])  # refuse before any change
        updates = self._updates(work, finite=True)
        seq = self._apply_write(updates, cid, cseq)
        self._maybe_close()  # only writes close a window early: a read must never move the cut it reads
        return {"seq": seq}, []

    def is_retry(self, msg) -> bool:
        """Whether `msg` is a write this node applied already (its answer then changes nothing)."""
        return (msg.op == "write" and isinstance(msg.cid, str) and isinstance(msg.cseq, int)
                and msg.cseq <= self.client_marks.get(msg.cid, 0))

    def _writes(self, parts, arrays, dropped_ok: bool = False) -> list:
        """[(shard, kind, ids, values)] of a write's parts and arrays, all checked (a request with several faults
        is refused for the first found: tables and kinds, then ids, then duplicates, then values); with
        `dropped_ok`, parts for tables dropped here are left out (a replay of writes to a table dropped since)."""
        if not isinstance(parts, list) or not all(isinstance(x, list) and len(x) == 2 for x in parts):
            raise InvalidRequest("write needs parts [[table, kind], ...]")
        self._arrays(arrays, 2 * len(parts))
        if len({str(table) for table, _ in parts}) != len(parts):
            raise InvalidRequest("a write names a table twice")
        kept = []
        for n, (table, kind) in enumerate(parts):
            if dropped_ok and isinstance(table, str) and table in self.dropped and table not in self.shards:
                continue
            shard = self._shard(table)
            if kind not in WRITES:
                raise InvalidRequest(f"table {table!r}: unknown write {kind!r}")
            kept.append((n, shard, kind))
        checked = self._ids_many([shard for _, shard, _ in kept], [arrays[2 * n] for n, _, _ in kept])
        validate.unique_many([shard.spec.name for _, shard, _ in kept], checked)
        return [(shard, kind, ids, validate.rows(shard.spec.name, arrays[2 * n + 1], ids.size,
                                                 shard.width if kind == "records" else shard.dim, WRITES[kind]))
                for (n, shard, kind), ids in zip(kept, checked)]

    @staticmethod
    def _updates(work, finite: bool = False) -> tuple[list, list, list]:
        """([(shard, local rows, their records, new records)], scatters, window records) of checked writes
        (`finite`: refused if a new record is not); nothing is applied yet."""
        updates, scatters, logs = updated_many(work, finite)
        return [(shard, *update) for (shard, *_), update in zip(work, updates)], scatters, logs

    def _apply_write(self, computed: tuple, cid, cseq) -> int:
        """Install a write as `_updates` computed it, as this node's next write; its sequence number."""
        if self.write_seq == self.closed_upto:
            self.window_opened = self.clock()  # the window's age counts from its first write
        commit_many(*computed)
        self.write_seq += 1
        if cid is not None:
            self.writer_seen[writer_of(cid)] = self.clock()
            self.client_marks[cid] = max(cseq, self.client_marks.get(cid, 0))  # this client's writes so far
            self.window_clients[cid] = self.client_marks[cid]
            self.client_writes[cid] = (cseq, self.write_seq)
        return self.write_seq

    # -- replays into a replacement ---------------------------------------
    def expect_replays(self, writers, wait: float = REPLAY_WAIT) -> None:
        """A replacement: hold client reads and writes until every writer in `writers` replayed what the
        dead node at this position applied and no parity holds (or `wait` seconds passed), so that the
        replays of all writers land in the order the dead node applied them."""
        self.replay_from = set(writers)
        self.replays_since = self.clock()
        self.replay_deadline = self.replays_since + wait
        self._maybe_end_replays()

    def take_writers(self, live, began: float) -> None:
        """A read of the writers alive (`live`, from the store) begun at `began` on this node's clock: forget the
        clients of those gone long enough (`expire_writers`), and wait for no replay of a writer that is not alive
        (`keep_replayers`), on a read begun since the wait began only (an older one may lack a writer that
        registered just before the failure: it was once not waited for, and its writes went missing from reads
        until it replayed)."""
        self.expire_writers(live)
        if began >= self.replays_since and (self.replay_from is not None or self.late):
            self.keep_replayers(live)

    def keep_replayers(self, writers) -> None:
        """Writers still alive: a writer that died replays nothing."""
        now = self.clock()
        self.late = {w: t for w, t in self.late.items() if w in writers and now - t < LATE_WAIT}
        if self.replay_from is not None:
            self.replay_from &= set(writers)
            self._maybe_end_replays()

    def _maybe_end_replays(self) -> None:
        """Apply the buffered replays once no writer is awaited (at once for a writer replaying late)."""
        if self.replay_from is not None:
            if self.replay_from and self.clock() < self.replay_deadline:
                return
            self.late.update(dict.fromkeys(self.replay_from, self.clock()))
            self.replay_from = None
        if not self.replay_buffer:
            return
        buffered, self.replay_buffer = self.replay_buffer, []
        buffered.sort(key=lambda e: (e[0] is None, e[0] or 0, e[1]))  # the dead node's order; unknown ones last
        for _, _, replayer, n, cid, cseq, work in buffered:
            self.replay_seqs.setdefault(replayer, {})[n] = self._apply_write(self._updates(work), cid, cseq)
        self._maybe_close()

    def op_replay(self, msg, arrays):
        """A writer's writes that a dead node at this position applied and no parity holds
        (`messages.Replay`). Held until every live writer replayed, then applied in the dead node's order.
        The reply says whether they are applied ("done") and, then, this node's seq for each entry."""
        replayer, entries = msg.replayer, msg.entries
        if not all(isinstance(e, list) and len(e) == 4 and (e[0] is None or isinstance(e[0], int))
                   and isinstance(e[1], str) and isinstance(e[2], int) for e in entries):
            raise InvalidRequest("replay entries must be [[seq, cid, cseq, parts], ...]")
        if self.gone:
            gone = next((w for w in (replayer, *(writer_of(e[1]) for e in entries)) if w in self.gone), None)
            if gone is not None:
                return self._expired(gone), []
        if replayer not in self.replayed:
            work, at = [], 0
            for seq, cid, cseq, parts in entries:
                count = 2 * len(parts) if isinstance(parts, list) else 0
                work.append(self._writes(parts, arrays[at:at + count], dropped_ok=True))
                at += count
            if at != len(arrays):
                raise InvalidRequest(f"replay carries {len(arrays)} arrays, its entries name {at}")
            for shard, _, ids, _ in (part for w in work for part in w):
                shard.local(ids, rebuilt=False)  # rows of this node only: they are applied later, all or none
            self._need_rebuilt([(shard, ids) for w in work for shard, _, ids, _ in w])
            self.replayed.add(replayer)
            self.late.pop(replayer, None)
            self.writer_seen[replayer] = self.clock()
            for n, ((seq, cid, cseq, _), w) in enumerate(zip(entries, work)):
                self.replay_buffer.append((seq, len(self.replay_buffer), replayer, n, cid, cseq, w))
            if self.replay_from is not None:
                self.replay_from.discard(replayer)
        self._maybe_end_replays()
        if self.replay_from is not None:
            return {"done": False}, []
        seqs = self.replay_seqs.get(replayer, {})
        return {"done": True, "seqs": [seqs.get(n) for n in range(len(seqs))]}, []

    def op_sync(self, msg, arrays):
        """How many of this node's deltas still wait for an acknowledgement; with "close", after closing the
        window (a flush whose step did not reach this node)."""
        if msg.close:
            self.close_window()
        return {"unacked": len(self.unacked)}, []

    def op_step(self, msg, arrays):
        self.steps += 1
        if self.steps < self.config.window_steps:
            return {}, []
        if self.lazy_close:
            self.close_pending = True  # closed when idle, or before the next request that needs it
        else:
            self.close_window()
        return {}, []

    def op_delta(self, msg, arrays):
        source, seq, tables = msg.source, msg.seq, msg.tables
        if len(set(map(str, tables))) != len(tables):
            raise InvalidRequest("a delta names a table twice")
        degraded = msg.dead is not None
        if degraded and (msg.position is None or not source.startswith("repair/") or msg.window is not None
                         or msg.clients is not None):
            raise InvalidRequest(f"a degraded delta names its dead position, comes from a writer's repair source "
                                 f"and carries no window or marks, not {source!r} at {msg.position!r}")
        if not degraded and not source.startswith("node/"):
            raise InvalidRequest(f"a window's delta comes from a node, not {source!r}")
        if source in self.fenced:
            return messages.error(ErrorCode.FENCED, "deltas of a node declared dead are refused"), []
        last = self.applied.get(source, 0)
        if seq <= last:
            return {"ack": seq}, []  # a copy of one already applied: acknowledge it again
        if self._replaced(msg) and self.clock() > self.promised.get(source, -1.0):  # a new degraded write
            return self._replaced_reply(msg), []
        if seq != last + 1:  # an earlier one is still on its way: the sender resends this one
            return messages.error(ErrorCode.OUT_OF_ORDER, f"expected delta {last + 1} of {source}, got {seq}"), []
        rows, width, ids, delta = payload.unpack(len(tables), arrays)
        named = self._named(tables)
        shards, kept = named.shards, named.kept
        wrong = np.flatnonzero((width if named.all else width[kept]) != named.bytes)  # check all, then change
        if wrong.size:
            raise InvalidRequest(f"table {shards[wrong[0]].spec.name!r}: delta rows must be {named.bytes[wrong[0]]} "
                                 f"bytes, got {width[kept[wrong[0]]]}")
        deltas = None if named.all and named.width is not None else payload.split(rows, width, delta)
        if not named.all:
            bounds = np.concatenate(([0], np.cumsum(rows))).tolist()
            ids, rows = np.concatenate([ids[bounds[t]:bounds[t + 1]] for t in kept] or [ids[:0]]), rows[kept]
        slots = delta_slots(shards, rows, ids, named)  # every table's rows at once
        widths = named.bytes.tolist()
        if deltas is None:  # as usual: one width, the bytes as they came
            work = [Queued(shards, rows.tolist(), ids, delta.reshape(-1, named.width), slots, source, seq)]
        elif named.width is not None:
            work = [Queued(shards, rows.tolist(), ids, np.concatenate([deltas[t] for t in kept]), slots, source, seq)]
        else:  # an entry per width: a fold takes rows of one width
            whole = Queued(shards, rows.tolist(), ids, None, slots, source, seq)
            work = [whole.take(picked, np.concatenate([deltas[kept[t]] for t in picked]))
                    for picked in ([t for t, w in enumerate(widths) if w == width] for width in sorted(set(widths)))]
        if msg.dead is not None:  # counted at once; the bytes follow before anything reads parity
            for entry in work:
                for shard, ids, _, _ in entry.parts():
                    shard.count_degraded(ids)
        self.queued.extend(work)  # applied when the node is idle, or before anything reads parity
        self.queued_rows += int(rows.sum())
        if self.queued_rows > MAX_QUEUED_ROWS:
            self.apply_queued()
        self.applied[source] = seq
        if msg.window is not None:
            self.retained.add(source, msg.window, msg.durable, work, self.clock())
        clients = msg.clients
        if isinstance(clients, dict):  # the marks of the clients that wrote in that window: the others stand
            self.applied_clients.setdefault(source, {}).update(self._marks(clients))
        return {"ack": seq}, []

    def _named(self, tables: list) -> Named:
        """The shards of the tables a delta lists (InvalidRequest if one is unknown), those dropped here left
        out; kept per list of names while its shards stand."""
        try:
            named = self._lists.get(key := tuple(tables))
        except TypeError:  # a name that is no table at all
            named, key = None, None
        if named is not None and all(map(operator.is_, map(self.shards.get, named.names), named.shards)):
            return named
        kept = [t for t, name in enumerate(tables) if not (isinstance(name, str) and name in self.dropped)]
        named = Named([self._shard(tables[t]) for t in kept], kept, len(tables))  # a dropped table's: moot
        if key is not None:
            if len(self._lists) >= 1024:
                self._lists.clear()
            self._lists[key] = named
        return named

    def apply_queued(self) -> None:
        """Fold every received delta into the parity rows; keep what rows not rebuilt yet skipped."""
        queued, self.queued, self.queued_rows = self.queued, [], 0
        now = self.clock()
        whole: dict[int, list] = {}  # delta row bytes -> messages whose tables have every parity row there
        for entry in queued:
            if all(shard.missing_parity is None for shard in entry.shards):
                whole.setdefault(entry.delta.shape[1], []).append(entry)
                continue
            for shard, ids, delta, slots in entry.parts():
                skipped = shard.apply_delta(ids, delta, slots)
                if skipped is not None:
                    self.skipped.setdefault(entry.source, deque()).append((entry.seq, now, shard.spec.name, *skipped))
                    if entry.source.startswith("node/"):
                        rows = self.skipped_rows.setdefault((entry.source, shard.spec.name),
                                                            np.zeros(shard.missing_parity.size, bool))
                        rows[slots[1][shard.missing_parity[slots[1]]]] = True
        for entries in whole.values():  # every sender's and table's rows of a width in one pass
            fold(self.code, entries)
        for source, log in self.skipped.items():  # bounded: a rebuild reading older data reads again
            while log and now - log[0][1] > SKIPPED_SECONDS:
                self.skipped_from[source] = log.popleft()[0] + 1

    def op_applied(self, msg, arrays):
        """Per client, the last write whose delta from `source` this node holds; the window of that delta
        and the lowest window this node can roll back to (None: not known, see `Retained.level_of`)."""
        if msg.fence and msg.source is not None:
            self.fenced.add(msg.source)  # asked by a reconcile: the answer must stay true
        return {"clients": self.applied_clients.get(msg.source, {}), "window": self.retained.level_of(msg.source),
                "kept": self.retained.kept(msg.source)}, []

    def op_rollback(self, msg, arrays):
        """Take dead node `source`'s windows after `window` back out of parity (see `retained`)."""
        source, window = msg.source, msg.window
        level, kept = self.retained.level_of(source), self.retained.kept(source)
        if level is None or level < window or kept > window:
            raise InvalidRequest(f"cannot roll {source!r}'s deltas back to window {window}: "
                                 f"at window {level}, kept back to {kept}")
        self.fenced.add(source)  # none of its deltas may land after this
        for entry in self.retained.take_after(source, window):
            for shard, ids, delta, slots in entry.parts():
                self.shards[shard.spec.name].apply_delta(ids, delta, slots)  # rows not rebuilt yet are rebuilt from data
        self.applied_clients[source] = self._marks(msg.clients)
        return {}, []

    def _replaced(self, msg) -> bool:
        """Is a degraded write (`position`, `dead`) refused: a live replacement stands there, or the node it
        names as dead is alive as far as this node knows (it learns otherwise within a heartbeat)?"""
        if msg.dead is None:
            return False
        now = self.sources.get(msg.position) if msg.position is not None else None
        return now not in self.fenced and (now not in (None, msg.dead) or msg.dead == now)

    @staticmethod
    def _replaced_reply(msg) -> dict:
        return messages.error(ErrorCode.REPLACED, f"position {msg.position} has a replacement, or {msg.dead} is "
                                                  f"not known dead here: write to it (or ask again shortly)")

    def op_holds(self, msg, arrays):
        """For stripes whose parity this node holds: 1 where the parity row is there (not being rebuilt), and the
        degraded writes each holds; and the node's generation (a restore of what was read before a later
        invalidation is refused)."""
        return self._holds(msg, [msg.table], arrays)

    def op_holds_many(self, msg, arrays):
        """`op_holds` of several tables (one stripes array each), every table checked before the promise."""
        if not msg.tables or len(set(map(str, msg.tables))) != len(msg.tables):
            raise InvalidRequest(f"holds_many names each of its tables once, and at least one: {msg.tables!r}")
        return self._holds(msg, msg.tables, arrays)

    def _holds(self, msg, tables: list, arrays):
        self._arrays(arrays, len(tables))
        work = []
        for table, stripes in zip(tables, arrays):
            shard = self._shard(table)
            work.append((shard, shard.parity_slots(validate.ids(shard.spec.name, stripes, shard.layout.num_stripes))[1]))
        if msg.source is not None:
            if not msg.source.startswith("repair/") or msg.position is None or msg.dead is None:
                raise InvalidRequest(f"a degraded write's promise names a writer's repair source, a position and "
                                     f"the identity dead there, not {msg.source!r}")
            if self._replaced(msg):
                return self._replaced_reply(msg), []
            now = self.clock()
            self.promised = {s: t for s, t in self.promised.items() if t > now}  # one per writer at most
            self.promised[msg.source] = now + PROMISE_SECONDS
        out = []
        for shard, local in work:
            missing = shard.missing_parity
            out += [np.ones(local.size, np.uint8) if missing is None else (~missing[local]).astype(np.uint8),
                    shard.versions[local]]
        return {"generation": self.generation}, out

    def op_get_parity(self, msg, arrays):
        shard = self._shard(msg.table)
        (stripes,) = self._arrays(arrays, 1)
        stripes = validate.ids(shard.spec.name, stripes, shard.layout.num_stripes)
        return {"source": self.source, "applied": dict(self.applied)}, list(shard.read_parity(stripes))

    def op_get_parity_many(self, msg, arrays):
        """Parity rows of several tables (one stripes array per table) and the degraded writes each holds."""
        self._arrays(arrays, len(msg.tables))
        work = [(shard, validate.ids(shard.spec.name, stripes, shard.layout.num_stripes))
                for shard, stripes in zip(map(self._shard, msg.tables), arrays)]
        missing = {shard.spec.name: m for shard, stripes in work if (m := shard.unrebuilt_parity(stripes)).size}
        if missing:  # every table's at once
            raise NotRebuilt.of(missing, "parity")
        return {"source": self.source, "applied": dict(self.applied)}, \
            [a for shard, stripes in work for a in shard.read_parity(stripes)]

    def op_restore(self, msg, arrays):
        """Install rebuilt data records (kind "data"; arrays ids, records) or parity rows ("parity";
        arrays stripes, rows, and the degraded writes each holds)."""
        shard = self._shard(msg.table)
        if msg.kind not in ("data", "parity"):
            raise InvalidRequest(f"restore kind must be 'data' or 'parity', got {msg.kind!r}")
        keys, values, *versions = self._arrays(arrays, 3 if msg.kind == "parity" else 2)
        cut = msg.cut
        if not all(isinstance(s, str) and isinstance(v, int) for s, v in cut.items()):
            raise InvalidRequest(f"restore cut must map sources to delta numbers, got {cut!r}")
        if shard.missing_data is None:
            return {}, []
        if msg.generation not in (None, self.generation) or any(s in self.fenced for s in cut):
            return messages.error(ErrorCode.STALE_CUT, "rows were invalidated, or a source died, since the read"), []
        if isinstance(msg.seen, dict) and any(isinstance(s, str) and s != self.source for s in msg.seen.values()):
            # a data node read had not learned of this node yet: its delta numbers counted deltas to the one before
            return messages.error(ErrorCode.STALE_CUT, "a data node took another node for this position"), []
        behind = [s for s, seq in cut.items() if self.applied.get(s, 0) < seq]
        if behind:  # deltas the data already holds are still on their way here: try again shortly
            return messages.error(ErrorCode.STALE_CUT, f"deltas of {behind} still on their way", behind=True), []
        if any(self.applied.get(s, 0) > seq and self.skipped_from.get(s, 1) > seq + 1 for s, seq in cut.items()):
            return messages.error(ErrorCode.STALE_CUT, "deltas moved on further than this node remembers"), []
        before = shard.missing_count()
        if msg.kind == "parity":
            keys = validate.ids(shard.spec.name, keys, shard.layout.num_stripes)
            if values.dtype != np.uint8 or values.shape != (keys.size, shard.width * 4):
                raise InvalidRequest(f"table {shard.spec.name!r}: parity rows have the wrong shape")
            if versions[0].dtype != np.int64 or versions[0].shape != keys.shape:
                raise InvalidRequest(f"table {shard.spec.name!r}: parity rows need their degraded-write counts")
            if self._unknown_sender(shard, keys, cut):
                return messages.error(ErrorCode.STALE_CUT, "a node this read did not know of sent deltas to these "
                                                           "rows since"), []
            later = [(ids, delta) for source, seq in cut.items() for n, _, name, ids, delta
                     in self.skipped.get(source, ()) if n > seq and name == shard.spec.name]
            shard.restore_parity(keys, values, versions[0], later)
            if isinstance(msg.windows, dict):  # the window each source's data was read at
                for source, window in msg.windows.items():
                    if source in cut and isinstance(window, int):
                        self.retained.restored(source, window)
            marks = msg.marks
            if isinstance(marks, dict):  # rebuilt rows hold each source's windows up to the cut: so must its marks
                for source, m in marks.items():
                    if source in cut and isinstance(m, dict):
                        have = self.applied_clients.setdefault(source, {})
                        have.update((c, v) for c, v in self._marks(m).items() if v > have.get(c, 0))
        else:
            shard.restore(*self._records(shard, keys, values))
        self._count_rebuilt(before - shard.missing_count())
        return {}, []

    def _unknown_sender(self, shard, stripes, cut: dict) -> bool:
        """Whether a node that the restore's `cut` does not name, and that is not known dead, sent deltas to parity
        rows of `stripes` that they skipped while missing (at any time in this rebuild): a data node whose slots
        the read decoded (its position was dead then) and that a spare has taken since. Whether the data read
        holds those deltas is not known, so the rows are read again (the next read names that node: every live
        data node of a stripe is in a fresh cut)."""
        local = None
        for (source, table), rows in self.skipped_rows.items():
            if table != shard.spec.name or source in cut or source in self.fenced:
                continue
            local = shard.parity_slots(stripes)[1] if local is None else local
            if rows[local].any():
                return True
        return False

    def op_restore_rows(self, msg, arrays):
        """Install rebuilt data records of several tables (arrays: ids, records per table), every table checked
        before any is installed."""
        self._arrays(arrays, 2 * len(msg.tables))
        work = [(shard, *self._records(shard, ids, records))
                for shard, ids, records in zip(map(self._shard, msg.tables), arrays[0::2], arrays[1::2])]
        rebuilt = 0
        for shard, ids, records in work:
            if shard.missing_data is not None:
                before = shard.missing_count()
                shard.restore(ids, records)
                rebuilt += before - shard.missing_count()
        self._count_rebuilt(rebuilt)
        return {}, []

    def _records(self, shard, ids, records) -> tuple:
        """(ids, records) of rebuilt data rows of `shard`, checked: the rows live here, whole float32 records."""
        ids = self._ids(shard, ids)
        if records.dtype != np.float32 or records.shape != (ids.size, shard.width):
            raise InvalidRequest(f"table {shard.spec.name!r}: records have the wrong shape")
        if np.any(shard.layout.data_node(ids) != self.position):
            raise InvalidRequest(f"table {shard.spec.name!r}: rows do not live on node {self.position}")
        return ids, records

    def _count_rebuilt(self, rows: int) -> None:
        """`rows` more were rebuilt here; rebuilding ends once none is missing."""
        self.rebuilt_rows += rows
        if self.pulled_since is None and self.rebuilt_rows:
            self.pulled_since = self.clock()
        self._settle()

    def op_invalidate(self, msg, arrays):
        """Mark parity rows of `stripes` stale: they are skipped by deltas and rebuilt from data."""
        shard = self._shard(msg.table)
        (stripes,) = self._arrays(arrays, 1)
        stripes = validate.ids(shard.spec.name, stripes, shard.layout.num_stripes)
        shard.invalidate(stripes)
        for source, seq in self.applied.items():  # deltas applied before now are in those rows no more
            self.skipped_from[source] = max(self.skipped_from.get(source, 1), seq + 1)
        if not self.rebuilding:
            self.rebuilding, self.rebuild_since, self.rebuilt_rows, self.pulled_since = True, self.clock(), 0, None
        self.generation += 1  # restores read before this must not bring those rows back
        return {"generation": self.generation}, []

    def op_missing(self, msg, arrays):
        """Ids and stripes still to rebuild, at most `limit` of each, per table."""
        limit = msg.limit
        if limit < 0 or not 0 <= msg.part < msg.parts <= MAX_STREAMS:
            raise InvalidRequest(f"missing: limit {limit} (at least 0), part {msg.part} of {msg.parts} (parts: 1 to "
                                 f"{MAX_STREAMS})")
        self._settle()  # a spare given no tables has nothing to rebuild
        if self.rebuilding and self.pulled_since is None:
            self.pulled_since = self.clock()
        out, names = [], []
        for name, shard in self.shards.items():
            if shard.missing_data is not None:
                # parts dealt in chunks of the full batch: streams whose rounds shrank apart still get disjoint rows
                ids, stripes = shard.missing(limit, msg.part, msg.parts, self.config.rebuild_batch)
                names.append(name)
                out += [ids, stripes]
        return {"tables": names, "generation": self.generation}, out

    def op_snapshot(self, msg, arrays):
        """See `messages.Snapshot`; a node with rows still to rebuild answers "rebuilding" (the client reads
        them through the parity instead)."""
        if msg.kind not in snapshots.KINDS or {msg.bits, msg.state_bits} - {None, *BITS} or msg.number < 1:
            raise InvalidRequest(f"snapshot: bad kind {msg.kind!r}, bits {msg.bits!r}, state_bits {msg.state_bits!r} "
                                 f"or number {msg.number!r}")
        if any(shard.missing_data is not None and shard.missing_data.any() for shard in self.shards.values()):
            return {"rebuilding": True}, []
        fits = all(snapshots.fits(s, msg.kind, msg.root, msg.after, msg.base) for s in self.shards.values())
        if msg.check or not fits:
            return {"fits": fits}, []
        work = [(name, shard.dim, *snapshots.take(shard, msg.kind, msg.root, msg.number))
                for name, shard in self.shards.items()]
        if self.writer is not None:
            self.writer.cancel()  # still writing a checkpoint its client gave up (every client waits for its last)
        self.writer = snapshots.Writer(msg.number, msg.directory, f"n{self.position}", work, msg.bits, msg.adaptive,
                                       msg.state_bits, start=False)  # started by the host (`start_writer`)
        touched = sum(shard.window.written() for shard in self.shards.values())  # what a full one would write
        return {"fits": True, "rows": self.writer.rows, "touched": touched}, []

    def start_writer(self) -> None:
        """Begin writing the pieces of the last snapshot (if not begun)."""
        if self.writer is not None:
            self.writer.start()

    def op_snapshot_progress(self, msg, arrays):
        if self.writer is None or self.writer.number != msg.number:
            raise InvalidRequest(f"checkpoint {msg.number} is not being written on this node")
        return self.writer.progress(), []

    def op_status(self, msg, arrays):
        return {"status": self.status()}, []

    _ops = {name[3:]: fn for name, fn in list(locals().items()) if name.startswith("op_")}

    # -- windows and deltas ----------------------------------------------
    @property
    def window_open(self) -> bool:
        """Whether writes wait in the window: applied here, their deltas not built yet."""
        return self.write_seq != self.closed_upto

    def window_due(self) -> bool:
        """Whether the open window's oldest write is `window_seconds` old: its host's timer closes it then,
        whatever the clients do."""
        return self.window_open and self.clock() - self.window_opened >= self.config.window_seconds

    def _maybe_close(self):
        dirty = self.dirty.rows()
        if dirty and (dirty >= self.config.window_rows or self.window_due()):
            self.close_window()

    def close_window(self) -> None:
        """Turn the dirty rows into one delta message per parity-holding node."""
        self.close_pending, self.steps = False, 0
        if self.write_seq == self.closed_upto:
            return  # nothing written since the last close
        self.closed_upto = self.write_seq
        if self.config.r == 0:
            for window in self.dirty:
                window.drain(views=True)
            self.durable_seq = self.write_seq
            self.window_clients = {}
            return
        parts = window_deltas(self.dirty, self.position, self.config)
        self.closed_marks = dict(self.client_marks)
        window_clients, self.window_clients = self.window_clients, {}
        self.closed_windows += 1
        window = self.closed_windows
        self.windows[window] = [self.write_seq, len(parts)]
        for target, (names, arrays) in parts.items():
            seq = self._next_seq.get(target, 0) + 1
            self._next_seq[target] = seq
            # the marks of the clients that wrote in this window (a target's first delta: of every client)
            clients = dict(self.client_marks) if seq == 1 else window_clients
            header = messages.Delta(source=self.source, seq=seq, tables=names, clients=clients, window=window,
                                    durable=self.durable_window).header()
            self.outbox.append((target, header, arrays))
            self.unacked[(target, seq)] = window
        self._advance()

    def take_outbox(self) -> list[tuple[int, dict, list]]:
        out, self.outbox = self.outbox, []
        return out

    def acked(self, target: int, seq: int) -> None:
        """A delta was applied by `target` (or is moot: target died and is rebuilt from data)."""
        window = self.unacked.pop((target, seq), None)
        if window is None:
            return
        self.windows[window][1] -= 1
        self._advance()

    def _advance(self):
        for window, (last, outstanding) in list(self.windows.items()):
            if outstanding:
                break
            self.durable_seq, self.durable_window = last, window
            del self.windows[window]

    def _settle(self):
        if self.rebuilding and all(s.missing_data is None for s in self.shards.values()):
            self.rebuilding = False
            now = self.clock()
            self.last_rebuild = {"rows": self.rebuilt_rows, "seconds": now - self.rebuild_since,
                                 "pulling": now - (self.pulled_since or now)}
            self.skipped.clear()
            self.skipped_rows.clear()
            self.retained.base = 0  # every row rebuilt: a sender first heard of now starts at window 0 here

    def rebuild_progress(self) -> dict:
        """Rows rebuilt and left, the rate since rebuilding began (rows/s), and the time left at that rate."""
        left = sum(s.missing_count() for s in list(self.shards.values()))
        elapsed = self.clock() - self.rebuild_since if self.rebuild_since is not None else 0.0
        rate = self.rebuilt_rows / elapsed if elapsed > 0 else 0.0
        return {"done": self.rebuilt_rows, "left": left, "rate": rate, "eta": left / rate if rate else None}

    def status(self) -> dict:
        shards = self.shards.values()
        return {
            "position": self.position,
            "source": self.source,
            "role": "rebuilding" if self.rebuilding else "active",
            "tables": len(self.shards),
            "data_rows": sum(s.rows for s in shards),
            "initial_rows": sum(s.initial_rows() for s in shards),
            "parity_rows": sum(s.parity.shape[0] for s in shards),
            "dirty_rows": self.dirty.rows(),
            "unacked_deltas": len(self.unacked),
            "write_seq": self.write_seq,
            "durable_seq": self.durable_seq,
            "rebuild_missing": sum(s.missing_count() for s in shards),
            "rebuild": self.rebuild_progress() if self.rebuilding else {},
            "last_rebuild": self.last_rebuild,
            "rejected": self.rejected,
            "clients": len(self._clients()),
            "writers": len(self.writer_seen),
            "gone_writers": len(self.gone),
            "bytes": sum(s.nbytes() for s in shards),
            "checkpoint": {k: v for k, v in self.writer.progress().items() if k != "pieces"} if self.writer else None,
        }

    # -- per-client bookkeeping ---------------------------------------------
    def _clients(self) -> set:
        """Every client id this node keeps something for."""
        cids = {*self.client_marks, *self.closed_marks, *self.client_writes, *self.window_clients}
        for marks in self.applied_clients.values():
            cids.update(marks)
        return cids

    def expire_writers(self, live) -> set:
        """Forget the clients of writers missing from `live` (the writers alive, as just read from the store)
        for longer than the config's `writer_grace`, counted from when this node last saw each live or
        writing; remember them as gone (bounded, for GONE_SECONDS), so their writes and replays are refused
        from then on. The writers forgotten now."""
        now = self.clock()
        known = {writer_of(c) for c in self._clients()} | self.replayed | set(self.replay_seqs)
        seen = self.writer_seen
        for w in known:
            if w in live or w not in seen:
                seen[w] = now
        self.writer_seen = seen = {w: t for w, t in seen.items() if w in known}
        gone = {w for w, t in seen.items() if now - t > self.config.writer_grace and w not in live}
        if gone:
            keep = lambda marks: {c: v for c, v in marks.items() if writer_of(c) not in gone}  # noqa: E731
            self.client_marks, self.closed_marks = keep(self.client_marks), keep(self.closed_marks)
            self.client_writes, self.window_clients = keep(self.client_writes), keep(self.window_clients)
            self.applied_clients = {s: keep(m) for s, m in self.applied_clients.items()}
            self.replayed -= gone
            self.replay_seqs = {w: v for w, v in self.replay_seqs.items() if w not in gone}
            for w in gone:
                del seen[w]
                self.gone.pop(w, None)
                self.gone[w] = now
        while self.gone and (len(self.gone) > GONE_MAX or now - next(iter(self.gone.values())) > GONE_SECONDS):
            del self.gone[next(iter(self.gone))]
        return gone

    def _marks(self, clients: dict) -> dict:
        """`_marks`, without those of writers forgotten here (a peer that has not forgotten them yet sent them)."""
        marks = _marks(clients)
        if self.gone:
            marks = {c: v for c, v in marks.items() if writer_of(c) not in self.gone}
        return marks

    @staticmethod
    def _expired(writer: str) -> dict:
        return messages.error(ErrorCode.EXPIRED, f"writer {writer!r}: its lease expired and this node forgot its "
                                                 f"clients; connect again")

    def peer_replaced(self, target: int) -> None:
        """A new node took position `target`: what it missed is rebuilt from data, so deltas to it restart."""
        for key in [key for key in self.unacked if key[0] == target]:
            self.acked(*key)
        self.outbox = [msg for msg in self.outbox if msg[0] != target]
        self._next_seq.pop(target, None)


def _marks(clients: dict) -> dict:
    """{client id: last write} as sent, without entries of the wrong types."""
    return {c: v for c, v in clients.items() if isinstance(c, str) and isinstance(v, int)}
