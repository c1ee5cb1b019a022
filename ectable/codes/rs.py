"""Reed-Solomon over GF(2^8): byte-identical to zfec's systematic Vandermonde code."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import zfec

from .abc import Code


@lru_cache(maxsize=None)
def generator(k: int, r: int) -> tuple[tuple[int, ...], ...]:
    """zfec's parity coefficients G[j][i], read by encoding unit vectors."""
    unit = [bytes([int(i == c) for c in range(k)]) for i in range(k)]
    parity = zfec.Encoder(k, k + r).encode(unit, list(range(k, k + r)))
    return tuple(tuple(bytes(block)) for block in parity)


class RSCode(Code):
    codec_id = "rs"

    def __init__(self, k: int, r: int = 2):
        if not (1 <= k and 1 <= r and k + r <= 256):
            raise ValueError(f"code 'rs' needs k >= 1, r >= 1, k + r <= 256, got k={k} r={r}")
        super().__init__(k, r)
        self._G = generator(self.k, self.r)
        self._parity_nums = list(range(self.k, self.k + self.r))

    def coefficient(self, j, i):
        return self._G[j][i]

    def encode(self, data):
        shape = np.shape(data[0])
        blocks = [np.ascontiguousarray(b, dtype=np.uint8).reshape(-1) for b in data]
        encoder = zfec.Encoder(self.k, self.k + self.r)
        parity = encoder.encode(blocks, self._parity_nums)
        return [np.frombuffer(p, dtype=np.uint8).reshape(shape).copy() for p in parity]

    def _data_blocks(self, blocks):
        self._check_survivors(blocks)
        if all(i in blocks for i in range(self.k)):
            return [blocks[i] for i in range(self.k)]
        nums = sorted(blocks)[: self.k]
        shape = np.shape(blocks[nums[0]])
        flat = [np.ascontiguousarray(blocks[n], dtype=np.uint8).reshape(-1) for n in nums]
        # zfec reorders the lists it is given: hand it copies.
        data = zfec.Decoder(self.k, self.k + self.r).decode(list(flat), list(nums))
        return [np.frombuffer(d, dtype=np.uint8).reshape(shape) for d in data]
