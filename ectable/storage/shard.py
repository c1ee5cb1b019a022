"""One table's data rows and parity rows on one node, in preallocated numpy arrays."""
from __future__ import annotations

import numpy as np

from ..arrays import put_rows, unique
from ..codes import Code, gf256
from ..errors import Error, InvalidRequest
from ..protocol import validate
from .arena import Arena
from .initializers import init_rows
from .optimizers import write_rows
from .parity import delta_slots
from ..layout import Layout
from .table import TableSpec
from .window import SINCE_COPY, Windows



class NotRebuilt(Error):
    """Rows of a rebuilding shard were touched before their rebuild."""

    position = None  # the node that said so, once a client read its reply

    def __init__(self, table: str, ids: np.ndarray, kind: str = "data", missing: dict | None = None):
        super().__init__(f"table {table!r}: {ids.size} {'rows' if kind == 'data' else 'parity rows'} not rebuilt yet"
                         + (f" (and rows of {len(missing) - 1} more tables)" if missing and len(missing) > 1 else ""))
        self.table, self.ids, self.kind = table, ids, kind  # kind "parity": ids are stripes
        self.missing = missing or {table: ids}  # every table's ids (of this kind) the request touched

    @classmethod
    def of(cls, missing: dict, kind: str = "data") -> "NotRebuilt":
        """Rows (`kind` "data": {table: ids}) or parity rows ("parity": {table: stripes}) of several tables not
        rebuilt yet."""
        table = next(iter(missing))
        return cls(table, missing[table], kind, missing)


class Shard:
    """Data rows (weights + optimizer state, float32) and parity rows (bytes) of a table on node `node`."""

    def __init__(self, spec: TableSpec, layout: Layout, node: int, code: Code, rebuilding: bool = False,
                 arena: Arena | None = None, records_arena: Arena | None = None, windows: Windows | None = None):
        """`arena`: where the parity rows go, `records_arena` where the data records go, `windows` where its
        dirty window goes (the node's, shared with its other tables; None: of their own)."""
        self.spec, self.layout, self.node, self.code = spec, layout, node, code
        self.optimizer = spec.make_optimizer()
        self.dim, self.width = spec.dim, spec.width
        self.records_arena = records_arena if records_arena is not None else Arena(block_bytes=0)
        self.rblock, self.rbase = self.records_arena.take(layout.data_capacity(), self.width * 4)
        self.records = self.rblock.floats[self.rbase: self.rbase + layout.data_capacity()]  # zeros until written
        self.arena = arena if arena is not None else Arena(block_bytes=0)
        self.block, self.parity_base = self.arena.take(layout.parity_capacity(), self.width * 4)
        self.parity = self.block.rows[self.parity_base: self.parity_base + layout.parity_capacity()]
        self.versions = np.zeros(self.parity.shape[0], dtype=np.int64)  # degraded writes each parity row holds
        self.windows = windows if windows is not None else Windows(block_rows=0)
        self.window = self.windows.take(layout.data_capacity(), self.width, self, modified=rebuilding)  # a replacement: all rows
        self.marks = {"checkpoint": None, "full": None}  # the chain its flags were cleared for (`snapshots`)
        self.frozen: tuple = ()  # checkpoint copies still taking rows as they were (`snapshots.Frozen`)
        local_ids = layout.data_ids(node, np.arange(layout.data_capacity()))
        valid = local_ids < spec.num_rows
        self.rows = int(valid.sum())
        # Rows and parity rows still at their initial values are computed when first used (a pure function of
        # seed, table and id): creating a table costs its allocation only, whatever its size.
        self.fresh: np.ndarray | None = None  # per data row: not computed yet (None: none left)
        self.fresh_parity: np.ndarray | None = None
        self._fresh_left = [0, 0]
        if rebuilding:
            self.missing_data = valid
            self.missing_parity = np.zeros(self.parity.shape[0], dtype=bool)
            for j in range(layout.r):
                stripes = layout.stripes_of(node, layout.k + j)
                self.missing_parity[layout.parity_offset(stripes, j)] = True
            self._settle()
        else:
            self.missing_data = self.missing_parity = None
            if spec.init["kind"] != "zeros":  # zero rows have zero parity: nothing to compute
                self.fresh, self._fresh_left[0] = valid, self.rows
                if layout.r:
                    self.fresh_parity = np.ones(self.parity.shape[0], dtype=bool)
                    self._fresh_left[1] = self.parity.shape[0]

    # -- initial state ---------------------------------------------------
    def _initial(self, ids):
        return init_rows(self.spec.init, self.spec.seed, self.spec.name, ids, self.dim)

    def _initial_records(self, ids):
        out = np.zeros((ids.size, self.width), dtype=np.float32)
        valid = ids < self.spec.num_rows
        out[valid, : self.dim] = self._initial(ids[valid])
        return out

    def initial_rows(self) -> int:
        """Data rows whose initial values are not computed yet (they are when first used)."""
        return self._fresh_left[0] if self.fresh is not None else 0

    def _compute(self, local) -> None:
        """Give data rows `local` that are still fresh their initial values."""
        if self.fresh is None:
            return
        hit = self.fresh[local]
        if hit.any():
            pick = unique(local[hit])
            self.records[pick, : self.dim] = self._initial(self.layout.data_ids(self.node, pick))
            self.window.dirty[pick] |= SINCE_COPY
            self._computed(0, pick)

    def _compute_parity(self, local) -> None:
        """Give parity rows `local` that are still fresh the parity of their stripes' initial data."""
        if self.fresh_parity is None:
            return
        hit = self.fresh_parity[local]
        if hit.any():
            pick = unique(local[hit])
            stripes, js = self.layout.parity_stripes(self.node, pick)
            k = self.layout.k
            coded = self.code.encode([self._initial_records(stripes * k + i).view(np.uint8) for i in range(k)])
            rows = np.empty((pick.size, self.width * 4), dtype=np.uint8)
            for j in range(self.layout.r):
                rows[js == j] = coded[j][js == j]
            self.parity[pick] = rows
            self._computed(1, pick)

    def _computed(self, which: int, local) -> None:
        """Rows `local` (data: 0, parity: 1) hold real values now."""
        flags = self.fresh if which == 0 else self.fresh_parity
        if flags is None:
            return
        self._fresh_left[which] -= int(np.count_nonzero(flags[local]))
        flags[local] = False
        if self._fresh_left[which] <= 0:
            if which == 0:
                self.fresh = None
            else:
                self.fresh_parity = None

    # -- data rows -------------------------------------------------------
    def local(self, ids: np.ndarray, rebuilt: bool = True) -> np.ndarray:
        """Local offsets of ids this node must own (and, if `rebuilt`, must have rebuilt)."""
        if ids.size and np.any(self.layout.data_node(ids) != self.node):
            bad = ids[self.layout.data_node(ids) != self.node][0]
            raise InvalidRequest(f"table {self.spec.name!r}: row {bad} does not live on node {self.node}")
        local = self.layout.data_offset(ids)
        if rebuilt and self.missing_data is not None:
            missing = self.missing_data[local]
            if missing.any():
                raise NotRebuilt(self.spec.name, ids[missing])
        return local

    def unrebuilt(self, ids: np.ndarray) -> np.ndarray:
        """The ids (owned here, which is checked only while rows are missing) whose rows are not rebuilt yet."""
        return ids[:0] if self.missing_data is None else ids[self.lacks(ids)]

    def lacks(self, ids: np.ndarray) -> np.ndarray:
        """Per id of `ids` (as `unrebuilt`): whether its row is not rebuilt yet."""
        if self.missing_data is None:
            return np.zeros(ids.size, dtype=bool)
        return self.missing_data[self.local(ids, rebuilt=False)]

    def read(self, ids, committed=False, records=False, local=None) -> np.ndarray:
        """Weights (or whole records) of rows; `committed`: as of the open window's start; `local`: the ids'
        offsets as `local` (or `local_many`) gave them, checked already."""
        local = self.local(ids) if local is None else local
        self._compute(local)
        if committed:
            out = self.window.committed(local, self.records)
            return out if records else np.ascontiguousarray(out[:, : self.dim])
        return np.take(self.records, local, axis=0) if records else self.records[local, : self.dim]  # one gather

    def adopt(self, records: np.ndarray) -> None:
        """Keep the records in `records` (float32 [data capacity, width], handed over) instead of the arena."""
        if self.rblock is not None:
            self.records_arena.give(self.rblock, self.rbase, self.records.shape[0])
        self.records, self.rblock, self.rbase = records, None, 0

    # -- parity rows -----------------------------------------------------
    def parity_slots(self, stripes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(parity index j, local offset) of stripes whose parity this node holds."""
        j = self.layout.slot_on(self.node, stripes) - self.layout.k
        if (j.view(np.uint64) >= self.layout.r).any():  # negative j wraps to a huge unsigned value
            raise InvalidRequest(f"table {self.spec.name!r}: node {self.node} holds no parity of some stripes")
        return j, self.layout.parity_offset(stripes, j)

    def delta_slots(self, ids: np.ndarray) -> tuple:
        """(parity index j, local parity offset, position in the stripe) of each data row of a delta;
        raises unless the rows' stripes ascend (so each comes once) and have their parity here."""
        return delta_slots([self], np.array([ids.size]), ids)

    def apply_delta(self, ids: np.ndarray, delta: np.ndarray, slots: tuple):
        """parity ^= coefficient * delta for each data row's stripe held here (`slots`: from delta_slots).
        Rows whose parity is not rebuilt yet are skipped; returns those (ids, delta), or None."""
        j, local, pos = slots
        skipped = None
        if self.missing_parity is not None:  # not rebuilt yet: its rebuild reads the data as it is then
            keep = ~self.missing_parity[local]
            if not keep.all():
                skipped = ids[~keep], delta[~keep]
            j, local, pos, delta = j[keep], local[keep], pos[keep], delta[keep]
        self._xor_terms(j, local, pos, delta)
        return skipped

    def _xor_terms(self, j, local, pos, delta) -> None:
        self.fold(local, self.code.delta_terms(j, pos, delta))

    def fold(self, local: np.ndarray, terms: np.ndarray) -> None:
        """parity[local] ^= terms, for unique parity rows `local`."""
        gf256.xor_rows(self.block.rows, self.block_rows(local), terms)

    def block_rows(self, local: np.ndarray) -> np.ndarray:
        """Where parity rows `local` sit in `self.block`, their initial values computed."""
        self._compute_parity(local)
        return self.parity_base + local

    def free(self) -> None:
        """Give the memory of the records and parity rows back (the table is dropped); a checkpoint still
        copying rows of it takes them first."""
        for frozen in self.frozen:
            frozen.save(frozen.local)
        self.arena.give(self.block, self.parity_base, self.parity.shape[0])
        self.windows.give(self.window)
        if self.rblock is not None:
            self.records_arena.give(self.rblock, self.rbase, self.records.shape[0])

    def read_parity(self, stripes) -> tuple[np.ndarray, np.ndarray]:
        """Parity rows of `stripes` and how many degraded writes each holds (a decode that reads two
        holders of a stripe is consistent only where they hold as many)."""
        _, local = self.parity_slots(stripes)
        if self.missing_parity is not None and self.missing_parity[local].any():
            raise NotRebuilt(self.spec.name, stripes[self.missing_parity[local]], "parity")
        self._compute_parity(local)
        return self.parity[local], self.versions[local]

    def unrebuilt_parity(self, stripes: np.ndarray) -> np.ndarray:
        """The stripes (with a parity row here) whose parity rows are not rebuilt yet."""
        if self.missing_parity is None:
            return stripes[:0]
        return stripes[self.missing_parity[self.parity_slots(stripes)[1]]]

    def count_degraded(self, ids: np.ndarray) -> None:
        """A degraded write (a client's, through the parity alone) of rows `ids` reached this holder."""
        self.versions[self.parity_slots(unique(self.layout.stripe(ids)))[1]] += 1

    # -- rebuild ---------------------------------------------------------
    def restore(self, ids, records) -> None:
        """Install rebuilt data records, skipping rows already rebuilt (they may be newer)."""
        local = self.layout.data_offset(ids)
        todo = self.missing_data[local]
        for frozen in self.frozen:
            frozen.save(local[todo])
        self.records[local[todo]] = records[todo]
        self.window.dirty[local[todo]] |= SINCE_COPY
        self._computed(0, local[todo])
        self.missing_data[local[todo]] = False
        self._settle()

    def restore_parity(self, stripes, rows, versions, later=()) -> None:
        """Install rebuilt parity rows of `stripes` not rebuilt yet (with the degraded writes the decoded
        data held), then fold in the deltas `later` ([(ids, delta)], skipped while they were missing)
        that are newer than the data they came from."""
        _, local = self.parity_slots(stripes)
        todo = self.missing_parity[local]
        self.parity[local[todo]] = rows[todo]
        self._computed(1, local[todo])
        self.versions[local[todo]] = versions[todo]
        self.missing_parity[local[todo]] = False
        fresh = stripes[todo]
        for ids, delta in later:
            pick = np.isin(self.layout.stripe(ids), fresh)
            if pick.any():
                self._xor_terms(*self.delta_slots(ids[pick]), delta[pick])
        self._settle()

    def invalidate(self, stripes) -> None:
        """Parity rows of `stripes` no longer hold their data: rebuild them before use."""
        _, local = self.parity_slots(stripes)
        if self.missing_data is None:
            self.missing_data = np.zeros(self.records.shape[0], dtype=bool)
            self.missing_parity = np.zeros(self.parity.shape[0], dtype=bool)
        self.missing_parity[local] = True

    def missing(self, limit: int, part: int = 0, parts: int = 1, chunk: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Up to `limit` data row ids and parity stripes still to rebuild, from part `part` of `parts` (the
        local rows in chunks of `chunk` rows, `limit` if not given, dealt in turn); once that part has none, from
        the far end of the rest. Parts asked with one `chunk` never overlap, whatever their limits."""
        chunk = max(chunk or limit, 1)

        def pick(missing: np.ndarray) -> np.ndarray:
            local = np.flatnonzero(missing)
            if parts == 1:
                return local[:limit]
            mine = local[(local // chunk) % parts == part]
            return mine[:limit] if mine.size else local[max(local.size - limit, 0):]
        data, parity = pick(self.missing_data), pick(self.missing_parity)
        return self.layout.data_ids(self.node, data), self.layout.parity_stripes(self.node, parity)[0]

    def missing_count(self) -> int:
        if self.missing_data is None:
            return 0
        return int(self.missing_data.sum() + self.missing_parity.sum())

    def _settle(self):
        if self.missing_data is not None and not self.missing_data.any() and not self.missing_parity.any():
            self.missing_data = self.missing_parity = None

    def nbytes(self) -> int:
        return self.records.nbytes + self.parity.nbytes + self.window.dirty.nbytes


def updated_many(work: list, finite: bool = False) -> tuple[list, list, list]:
    """Several writes [(shard, kind, ids, values)], each a "put" of weights, an "apply_gradient" of gradients
    or a "records" write, computed but not applied (see `commit_many`): ([(local offsets, records now, new
    records)] each, [(array, rows, new records)] to scatter, [(window, its rows, records now, new records)] to
    record). The writes of one kind to tables of one optimizer and record width take one optimizer step
    together; the records of those in one block of the node's arena are gathered and scattered together, and
    the changes of those in one window recorded together (per-table calls, not rows, were most of what a node
    spent on a many-table write). With `finite`, InvalidRequest (`validate.finite_result`) if a new record is
    not finite."""
    out: list = [None] * len(work)
    scatters: list = []
    logs: list = []
    groups: dict = {}
    for n, (shard, kind, _, _) in enumerate(work):
        opt = shard.optimizer
        groups.setdefault((kind, shard.dim, shard.width, opt.name, opt.lr, opt.eps), []).append(n)
    located = local_many([(shard, ids) for shard, _, ids, _ in work])
    for (kind, dim, width, *_), members in groups.items():
        runs = []  # [(array, rows in it, members)]: members whose records share a block, one gather each
        for n in members:
            shard = work[n][0]
            shard._compute(located[n])
            array, base = (shard.records, 0) if shard.rblock is None else (shard.rblock.floats, shard.rbase)
            if runs and runs[-1][0] is array:
                runs[-1][1].append(base + located[n])
            else:
                runs.append((array, [base + located[n]]))
        runs = [(array, rows[0] if len(rows) == 1 else np.concatenate(rows)) for array, rows in runs]
        old = np.empty((sum(rows.size for _, rows in runs), width), dtype=np.float32)  # the members' records now
        at = 0
        for array, rows in runs:
            np.take(array, rows, axis=0, out=old[at: at + rows.size], mode="clip")  # checked rows; "raise" copies
            at += rows.size
        new = old.copy()  # the new records, in place
        values = np.concatenate([work[n][3] for n in members]) if len(members) > 1 else work[members[0]][3]
        write_rows(work[members[0]][0].optimizer, kind, new, values, dim)
        at = 0
        for array, rows in runs:
            scatters.append((array, rows, new[at: at + rows.size]))
            at += rows.size
        at, windows = 0, []  # [[window, its rows, first, end]]: members whose rows share a window, in order
        for n in members:
            part, end = work[n][0].window, at + located[n].size
            out[n] = (located[n], old[at:end], new[at:end])
            if windows and windows[-1][0] is part.window:
                windows[-1][1].append(part.base + located[n])
                windows[-1][3] = end
            else:
                windows.append([part.window, [part.base + located[n]], at, end])
            at = end
        logs += [(window, rows[0] if len(rows) == 1 else np.concatenate(rows), old[a:b], new[a:b])
                 for window, rows, a, b in windows]
        if finite and not np.isfinite(new).all():
            for n in members:  # name the first table it happened in
                validate.finite_result(work[n][0].spec.name, kind, work[n][2], out[n][2])
    return out, scatters, logs


def commit_many(updates: list, scatters: list, logs: list) -> None:
    """Install computed writes (`updated_many`: [(shard, local rows, their records, new records)], the scatters
    and the window records), nothing written since: checkpoint copies taken first, changes added to the
    windows."""
    for shard, local, _, _ in updates:
        for frozen in shard.frozen:
            frozen.save(local)
    for window, rows, old, new in logs:
        window.record(rows, old, new)
    for array, where, rows in scatters:
        put_rows(array, where, rows)


def local_many(work: list) -> list:
    """`Shard.local` of each (shard, ids) of `work`, shards of one node: the placement math of all in one
    vectorised pass (`Layout.of_rows`)."""
    if not work:
        return []
    counts = [ids.size for _, ids in work]
    ids = np.concatenate([ids for _, ids in work])
    layout = Layout.of_rows([shard.layout for shard, _ in work], counts)
    if (layout.data_node(ids) != work[0][0].node).any():
        return [shard.local(ids) for shard, ids in work]  # names the table and the row
    local = np.split(layout.data_offset(ids), np.cumsum(counts)[:-1].tolist())
    for (shard, ids), mine in zip(work, local):
        if shard.missing_data is not None and (missing := shard.missing_data[mine]).any():
            raise NotRebuilt(shard.spec.name, ids[missing])
    return local
