"""The rows of a node's tables, kept together: tables whose rows have the same size share large blocks, so
that a request naming many tables touches each block with one gather or scatter instead of one per table.
A node keeps its tables' parity rows in one arena (a delta message naming many tables folds into parity with
one gather, XOR and scatter per block: `parity.fold`) and their records in another (a write of many tables
gathers and scatters records once per block: `shard.updated_many`).

A block is a private anonymous memory map: pages never written take no memory, so a block can be much larger
than the tables in it, and a dropped table's pages are given back at once. A dropped table's range is not
used again; a block is unmapped when its last table is dropped.
"""
from __future__ import annotations

import mmap
import platform
import sys

import numpy as np

# A block's size, unless one table needs more (then it has a block of its own). Only the pages written take
# memory, so a block is made large enough for every table of a width on a node of the benchmark's full size: a
# request's rows of all its tables are then one run (`parity.fold`, `shard.updated_many`); with 64 MiB blocks a
# full-size rs(6,3) delta message spanned 7 runs on average.
BLOCK_BYTES = 1 << 30
# The address space is not counted as committed memory (unless vm.overcommit_memory=2): a fork, which counts
# the parent's private mappings again, would otherwise fail for gigabytes of pages never written.
# (Python before 3.13 lacks the constant; its value differs between architectures: 0x4000 on these.)
NORESERVE = getattr(mmap, "MAP_NORESERVE",
                    0x4000 if sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64") else 0)
# A block asks for transparent huge pages (fewer TLB misses on random rows) once its tables' ranges span this
# many bytes: a huge page (2 MiB) is zeroed whole at its first write, so a smaller block keeps 4 KiB pages. Asked
# for on every block, a small cluster's first write to each block cost 2 MiB (a test's clusters, hundreds of MB).
HUGE_BYTES = 1 << 20


class Block:
    """One mapping of rows of `row_bytes` bytes each, handed out in ranges from its start."""

    def __init__(self, rows: int, row_bytes: int):
        try:
            self._map = mmap.mmap(-1, max(rows * row_bytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | NORESERVE)
        except OSError as e:  # as np.zeros would say it
            raise MemoryError(f"cannot map {rows * row_bytes} bytes: {e}") from None
        self.rows = np.frombuffer(self._map, dtype=np.uint8, count=rows * row_bytes).reshape(rows, row_bytes)
        self.floats = self.rows.view(np.float32) if row_bytes % 4 == 0 else None  # the rows as float32 records
        self.used = 0  # rows handed out, from the start
        self.tables = 0  # ranges still in use
        self.huge = False  # huge pages asked for

    def hand_out(self, rows: int) -> int:
        """The first of `rows` more rows handed out from the block's free end (the caller checked they fit)."""
        base, self.used = self.used, self.used + rows
        if not self.huge and self.used * self.rows.shape[1] >= HUGE_BYTES and hasattr(mmap, "MADV_HUGEPAGE"):
            self._map.madvise(mmap.MADV_HUGEPAGE)
            self.huge = True
        return base

    def free(self, base: int, rows: int) -> None:
        """Give back the memory of rows [base, base + rows), which are not used again."""
        row_bytes = self.rows.shape[1]
        start = -(-base * row_bytes // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages inside the range
        end = (base + rows) * row_bytes // mmap.PAGESIZE * mmap.PAGESIZE
        if end > start:
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)


class Arena:
    """The blocks of one node, by row size."""

    def __init__(self, block_bytes: int | None = None):
        self.block_bytes = BLOCK_BYTES if block_bytes is None else block_bytes  # read when made: tests set it
        self.blocks: dict[int, list[Block]] = {}

    def take(self, rows: int, row_bytes: int) -> tuple[Block, int]:
        """A range of `rows` zeroed rows: (its block, its first row there)."""
        if rows == 0:
            return Block(0, row_bytes), 0
        blocks = self.blocks.setdefault(row_bytes, [])
        block = next((b for b in blocks if b.rows.shape[0] - b.used >= rows), None)
        if block is None:
            block = Block(max(rows, self.block_bytes // max(row_bytes, 1)), row_bytes)
            blocks.append(block)
        block.tables += 1
        return block, block.hand_out(rows)

    def give(self, block: Block, base: int, rows: int) -> None:
        """The range (block, base) of `rows` rows is no longer used."""
        block.tables -= 1
        block.free(base, rows)
        blocks = self.blocks.get(block.rows.shape[1], [])
        if block.tables == 0 and block in blocks:
            blocks.remove(block)  # unmapped once no view of it is left
            if not blocks:
                del self.blocks[block.rows.shape[1]]
