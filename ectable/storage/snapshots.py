"""A node's side of a checkpoint: at the cut, which rows each table must write (`take`), frozen as they
are then (`Frozen`: copied by the writer a slice at a time, or by the shard just before a write changes
one); then their pieces quantized, compressed and written from a background thread (`Writer`), so the
training loop pays only for finding the rows.

Which rows a checkpoint writes follows from the window's flags (`Window.modified`): a full one writes
every row ever written (the others hold their initial values, a pure function of the table's seed,
computed again on restore), an incremental one the rows written since the previous
checkpoint, a differential one those written since the last full one. The flags are valid only
for the checkpoint chain they were cleared for: each shard remembers it as `marks`, one
[root, number] for "since the previous checkpoint" and one for "since the last full one" (None:
since the table was created or, for a replacement, rebuilt, which every chain may use).
"""
from __future__ import annotations

import threading
import time

import numpy as np

from ..arrays import unique
from ..checkpoint import pieces
from ..checkpoint.policy import KINDS
from .shard import Shard

PIECE_BYTES = 32 << 20  # float32 bytes of rows per piece, before quantization and compression
COPY_ROWS = 1 << 14  # rows a writer copies at a time, holding writes to their shard back meanwhile


def fits(shard: Shard, kind: str, root: str, after: int | None, base: int | None) -> bool:
    """Whether `shard`'s flags hold the rows a checkpoint of `kind` needs in chain `root` after checkpoint
    `after` (incremental) or baseline `base` (differential)."""
    if kind == "full":
        return True
    mark = shard.marks["checkpoint" if kind == "incremental" else "full"]
    return mark is None or mark == [root, after if kind == "incremental" else base]


def take(shard: Shard, kind: str, root: str, number: int) -> tuple[np.ndarray, "Frozen"]:
    """(row ids, their records as of now) that checkpoint `number` of chain `root` writes of `shard`, with
    its flags cleared for it."""
    local = shard.window.modified({"full": "ever", "incremental": "checkpoint", "differential": "full"}[kind])
    ids = shard.layout.data_ids(shard.node, local)
    real = ids < shard.spec.num_rows  # not the last stripe's padding
    if not real.all():
        local, ids = local[real], ids[real]
    records = Frozen(shard, local)  # writes after the cut do not reach it
    shard.window.checkpointed(full=kind == "full")
    shard.marks["checkpoint"] = [root, number]
    if kind == "full":
        shard.marks["full"] = [root, number]
    return ids, records


class Frozen:
    """Records of a shard's rows `local` (ascending) as of its creation, read by slices (`frozen[a:b]`). Each
    row is copied once: by a read, or by the shard (`save`) just before a write changes it, whichever comes
    first; until every row is copied or `release()`, the shard saves rows into it."""

    def __init__(self, shard: Shard, local: np.ndarray):
        self.shard, self.local = shard, local
        self.rows = np.empty((local.size, shard.width), dtype=np.float32)  # pages are touched as rows are copied
        self.copied = np.zeros(local.size, dtype=bool)
        self.chunk = COPY_ROWS  # rows a read copies at a time while writes to the shard wait
        self._left = local.size
        self._lock = threading.Lock()
        if self._left:
            shard.frozen = shard.frozen + (self,)

    @property
    def shape(self) -> tuple:
        return self.rows.shape

    def save(self, local: np.ndarray) -> None:
        """Rows `local` of the shard are about to change: copy those of them not copied yet."""
        at = np.searchsorted(self.local, local)
        inside = at < self.local.size
        at = at[inside]
        at = at[self.local[at] == local[inside]]
        with self._lock:
            self._copy(unique(at[~self.copied[at]]))

    def __getitem__(self, part: slice) -> np.ndarray:
        start, stop, _ = part.indices(self.local.size)
        for first in range(start, stop, self.chunk):
            at = np.arange(first, min(first + self.chunk, stop))
            with self._lock:
                self._copy(at[~self.copied[at]])
        return self.rows[start:stop]

    def _copy(self, at: np.ndarray) -> None:
        if at.size:
            self.rows[at] = self.shard.records[self.local[at]]
            self.copied[at] = True
            self._left -= at.size
            if self._left == 0:
                self.release()

    def release(self) -> None:
        """Stop saving rows into this copy (all are copied, or it is given up)."""
        self.shard.frozen = tuple(f for f in self.shard.frozen if f is not self)


class Writer:
    """Writes the pieces of one checkpoint's copied rows from a background thread; its progress is read
    without waiting."""

    def __init__(self, number: int, directory: str, prefix: str, work: list, bits: int | None, adaptive: bool,
                 state_bits: int | None = None, start: bool = True):
        """`work`: [(table, dim, ids, records)]; pieces are named `prefix`-... in `directory` (a URL); the
        writing begins now, or at `start()`."""
        self.number, self.directory, self.prefix = number, directory, prefix
        self.work, self.bits, self.adaptive, self.state_bits = work, bits, adaptive, state_bits
        self.rows = sum(ids.size for _, _, ids, _ in work)
        self.written = 0  # rows
        self.bytes = 0
        self.pieces: list[dict] = []
        self.error: str | None = None
        self.done = False
        self._cancelled = False
        self.seconds: float | None = None  # from the copy to the last piece written
        self._began = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"checkpoint-{number}", daemon=True)
        if start:
            self.start()

    @classmethod
    def finished(cls, progress: dict) -> "Writer":
        """A writer that is done, as `progress()` described it (another node's, handed over)."""
        writer = cls(int(progress["number"]), "", "", [], None, False, start=False)
        writer.rows, writer.written, writer.bytes = int(progress["rows"]), int(progress["written"]), int(progress["bytes"])
        writer.error, writer.seconds, writer.done = progress["error"], progress["seconds"], True
        writer.pieces = list(progress.get("pieces", ()))
        return writer

    def start(self) -> None:
        """Begin writing (once)."""
        if self._thread.ident is None and not self.done:
            self._thread.start()

    def _run(self) -> None:
        try:
            fs, directory = pieces.location(self.directory)
            for n, (table, dim, ids, records) in enumerate(self.work):
                step = max(1, PIECE_BYTES // max(1, records.shape[1] * 4))
                for start in range(0, ids.size, step):
                    if self._cancelled:
                        raise RuntimeError("superseded by a later checkpoint")
                    part = slice(start, start + step)
                    rows = records[part]
                    data = pieces.encode_piece(table, ids[part], rows[:, :dim], rows[:, dim:],
                                               self.bits, self.adaptive, self.state_bits)
                    entry = pieces.write_piece(fs, directory, data, f"{self.prefix}-t{n}")
                    self.pieces.append({**entry, "table": table, "rows": int(ids[part].size)})
                    self.written += int(ids[part].size)
                    self.bytes += entry["bytes"]
        except Exception as exc:  # reported to the client, which fails the checkpoint
            self.error = f"{type(exc).__name__}: {exc}"[:500]
        finally:
            self._release()
            self.work = []  # the copies are freed as soon as they are written (or given up)
            self.seconds = time.monotonic() - self._began
            self.done = True

    def progress(self) -> dict:
        """What a client polls: rows and bytes written so far; when done, the pieces (or the error)."""
        out = {"number": self.number, "rows": self.rows, "written": self.written, "bytes": self.bytes,
               "done": self.done, "error": self.error, "seconds": self.seconds}
        if self.done and self.error is None:
            out["pieces"] = list(self.pieces)
        return out

    def cancel(self) -> None:
        """Stop before the next piece: a later checkpoint supersedes this one (whose client gave it up)."""
        self._cancelled = True
        self._release()

    def _release(self) -> None:
        for _, _, _, records in list(self.work):
            if isinstance(records, Frozen):
                records.release()
