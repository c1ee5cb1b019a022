"""No protection: r = 0, the baseline overheads are measured against."""
from __future__ import annotations

from .abc import Code


class NoCode(Code):
    codec_id = "none"

    def __init__(self, k: int, r: int = 0):
        if r != 0:
            raise ValueError(f"code 'none' has r = 0, got r={r}")
        super().__init__(k, 0)

    def coefficient(self, j, i):
        raise ValueError("code 'none' has no parity")

    def encode(self, data):
        return []

    def _data_blocks(self, blocks):
        self._check_survivors(blocks)
        return [blocks[i] for i in range(self.k)]
