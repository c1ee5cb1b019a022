"""Single parity: the parity block is the XOR of the k data blocks (r = 1)."""
from __future__ import annotations

import numpy as np

from . import gf256
from .abc import Code


class XorCode(Code):
    codec_id = "xor"
    unit = True

    def __init__(self, k: int, r: int = 1):
        if r != 1:
            raise ValueError(f"code 'xor' needs r = 1, got r={r}")
        super().__init__(k, 1)

    def coefficient(self, j, i):
        return 1

    def delta_terms(self, j, i, delta):
        return delta

    def encode(self, data):
        out = np.array(data[0], dtype=np.uint8, copy=True)
        for block in data[1:]:
            gf256.xor_into(out, np.ascontiguousarray(block))
        return [out]

    def decode_stripes(self, blocks, chosen):
        if chosen.all():
            return
        if (chosen.sum(axis=1) < self.k).any():
            raise ValueError(f"{self!r} needs {self.k} chosen slots in every stripe")
        # k of the k + 1 slots chosen: the one left out is the XOR of the whole stripe with itself zeroed,
        # for every stripe at once (in the widest words that divide a block)
        n, width, size = blocks.shape
        word = next(t for t in (np.uint64, np.uint32, np.uint16, np.uint8) if size % t().itemsize == 0)
        cells = blocks.reshape(n * width, size).view(np.dtype((np.void, size)))[:, 0]  # a block copies as one
        short = ~chosen.all(axis=1)
        stripes = np.flatnonzero(short)
        at = stripes * width + np.argmin(chosen[stripes], axis=1)
        cells[at] = np.zeros((), cells.dtype)
        words = blocks.view(word)
        found = np.bitwise_xor.reduce(words if short.all() else words[stripes], axis=1)
        cells[at] = found.view(cells.dtype)[:, 0]

    def _data_blocks(self, blocks):
        self._check_survivors(blocks)
        missing = [i for i in range(self.k) if i not in blocks]
        data = [blocks.get(i) for i in range(self.k)]
        if missing:
            data[missing[0]] = self.encode([blocks[s] for s in range(self.k + 1) if s in blocks])[0]
        return data
