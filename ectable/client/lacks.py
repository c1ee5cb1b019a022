"""What a client believes a rebuilding node still lacks, so that a read decodes those rows at once.

A rebuilding node answers a read of rows it has not rebuilt yet with their ids (`GetMany` "partial"), and
the client decodes them from the survivors: a second round trip after the first. Asked with "lacking", the
node also sends which rows of each table it still lacks (packed bits), and the client keeps that
picture: the next reads start decoding the rows it names before the node answers, both in flight at
once. A row only ever goes from lacking to rebuilt, so a picture grows stale one way only: it may name
rows rebuilt since (decoded for nothing; the node's answer is used). Every read marks the rows it
touched present, those it is restoring included; should that restore fail, the node says so at the
next read of them, which then decodes them after its answer, as without a picture. Pure bookkeeping:
no I/O.
"""
from __future__ import annotations

import numpy as np

REFRESH = 0.5  # seconds after which a node's picture is asked for again (with the next read of it)


class Lacks:
    """{position: (node identity, when, {table: bool per local row})} of rebuilding nodes."""

    def __init__(self):
        self._seen: dict[int, tuple] = {}

    def due(self, p: int, source: str | None, now: float) -> bool:
        """Whether the next read of rebuilding node p (identity `source`) should ask for its picture again."""
        seen = self._seen.get(p)
        return seen is None or seen[0] != source or now - seen[1] > REFRESH

    def learn(self, p: int, source: str | None, now: float, tables: list, bits: list) -> None:
        """Node p's packed bits per table (as its reply carried them; one that is not 1-D uint8 is ignored)."""
        got = {table: np.unpackbits(b).view(bool) for table, b in zip(tables, bits)
               if isinstance(b, np.ndarray) and b.dtype == np.uint8 and b.ndim == 1}
        seen = self._seen.get(p)
        if seen is not None and seen[0] == source:
            got = {**seen[2], **got}
        self._seen[p] = (source, now, got)

    def guess(self, p: int, source: str | None, table: str, offsets: np.ndarray) -> np.ndarray:
        """Per local row offset of `table` on node p: whether p is believed to lack it."""
        seen = self._seen.get(p)
        lacks = seen[2].get(table) if seen is not None and seen[0] == source else None
        if lacks is None or not lacks.size:
            return np.zeros(offsets.size, dtype=bool)
        inside = offsets < lacks.size
        return inside & lacks[np.where(inside, offsets, 0)]

    def present(self, p: int, source: str | None, table: str, offsets: np.ndarray) -> None:
        """Node p has (or is sent) the rows at `offsets` of `table` now."""
        seen = self._seen.get(p)
        lacks = seen[2].get(table) if seen is not None and seen[0] == source else None
        if lacks is not None and lacks.size:
            lacks[offsets[offsets < lacks.size]] = False

    def forget(self, p: int) -> None:
        self._seen.pop(p, None)
