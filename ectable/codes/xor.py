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

    def _data_blocks(self, blocks):
        self._check_survivors(blocks)
        missing = [i for i in range(self.k) if i not in blocks]
        data = [blocks.get(i) for i in range(self.k)]
        if missing:
            data[missing[0]] = self.encode([blocks[s] for s in range(self.k + 1) if s in blocks])[0]
        return data
