"""A node's side of a checkpoint: at the cut, an in-memory copy of the rows each table must write
(`take`); then their pieces quantized, compressed and written from a background thread (`Writer`),
so the training loop pays only for the copy.

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

from ..checkpoint import pieces
from ..checkpoint.policy import KINDS
from .shard import Shard

PIECE_BYTES = 32 << 20  # float32 bytes of rows per piece, before quantization and compression


def fits(shard: Shard, kind: str, root: str, after: int | None, base: int | None) -> bool:
    """Whether `shard`'s flags hold the rows a checkpoint of `kind` needs in chain `root` after checkpoint
    `after` (incremental) or baseline `base` (differential)."""
    if kind == "full":
        return True
    mark = shard.marks["checkpoint" if kind == "incremental" else "full"]
    return mark is None or mark == [root, after if kind == "incremental" else base]


def take(shard: Shard, kind: str, root: str, number: int) -> tuple[np.ndarray, np.ndarray]:
    """(row ids, records copied) that checkpoint `number` of chain `root` writes of `shard`, with its
    flags cleared for it."""
    local = shard.window.modified({"full": "ever", "incremental": "checkpoint", "differential": "full"}[kind])
    ids = shard.layout.data_ids(shard.node, local)
    real = ids < shard.spec.num_rows  # not the last stripe's padding
    if not real.all():
        local, ids = local[real], ids[real]
    records = shard.records[local]  # a copy: writes after the cut do not reach it
    shard.window.checkpointed(full=kind == "full")
    shard.marks["checkpoint"] = [root, number]
    if kind == "full":
        shard.marks["full"] = [root, number]
    return ids, records


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

    def start(self) -> None:
        """Begin writing (once)."""
        if self._thread.ident is None:
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
                    data = pieces.encode_piece(table, ids[part], records[part, :dim], records[part, dim:],
                                               self.bits, self.adaptive, self.state_bits)
                    entry = pieces.write_piece(fs, directory, data, f"{self.prefix}-t{n}")
                    self.pieces.append({**entry, "table": table, "rows": int(ids[part].size)})
                    self.written += int(ids[part].size)
                    self.bytes += entry["bytes"]
            self.work = []  # the copies are freed as soon as they are written
        except Exception as exc:  # reported to the client, which fails the checkpoint
            self.error = f"{type(exc).__name__}: {exc}"[:500]
        finally:
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
