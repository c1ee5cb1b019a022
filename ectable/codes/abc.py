"""The erasure-code interface.

A code protects stripes of `k` equal-length data blocks with `r` parity blocks.
Blocks are uint8 arrays of shape `[n, B]`: row `x` of every block belongs to
stripe `x`, so one call encodes or decodes `n` stripes at once. Slots number
the blocks of a stripe: `0..k-1` data, `k..k+r-1` parity.

Every code is linear over GF(2^8): parity slot `j` equals the sum of
`coefficient(j, i) * data_i`, which is what lets a node keep parity current
with deltas: `parity_j ^= coefficient(j, i) * (old_i ^ new_i)`.
Implementations must make `encode`, `decode` and `add_delta` agree bit for bit.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from functools import cached_property
from typing import Mapping, Sequence

import numpy as np

from ..arrays import unique
from . import gf256


class Code(ABC):
    """An erasure code over GF(2^8) with k data and r parity slots per stripe."""

    codec_id: str = ""
    unit = False  # every coefficient is 1: a delta is its own term (`delta_terms` returns it)

    def __init__(self, k: int, r: int):
        self.k, self.r = int(k), int(r)

    @abstractmethod
    def coefficient(self, j: int, i: int) -> int:
        """Coefficient of data slot i in parity slot j (0 <= j < r)."""

    @abstractmethod
    def encode(self, data: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The r parity blocks of k data blocks."""

    def decode(self, blocks: Mapping[int, np.ndarray], lost: Sequence[int]) -> dict[int, np.ndarray]:
        """Rebuild the `lost` slots from at least k surviving slots in `blocks`."""
        data = self._data_blocks(blocks)
        parity = None
        out = {}
        for slot in lost:
            if slot < self.k:
                out[slot] = data[slot]
            else:
                if parity is None:
                    parity = self.encode(data)
                out[slot] = parity[slot - self.k]
        return out

    def decode_stripes(self, blocks: np.ndarray, chosen: np.ndarray) -> None:
        """Fill in place every slot of `blocks` ([n, k + r, B] uint8) that `chosen` ([n, k + r] bool, at least
        k slots per stripe) leaves out, from the slots it chooses."""
        slots = np.arange(blocks.shape[1])
        pattern = chosen @ (1 << slots)
        for value in unique(pattern).tolist():
            lost = [int(t) for t in slots if not value >> t & 1]
            if not lost:
                continue
            group = np.flatnonzero(pattern == value)
            every = group.size == blocks.shape[0]  # one pattern for all stripes: views, no copies
            have = {int(t): blocks[:, t] if every else blocks[group, t] for t in slots if value >> t & 1}
            for t, found in self.decode(have, lost).items():
                blocks[group, t] = found

    @abstractmethod
    def _data_blocks(self, blocks: Mapping[int, np.ndarray]) -> list[np.ndarray]:
        """All k data blocks, recovered from at least k slots."""

    def add_delta(self, parity: np.ndarray, j: int, i: int, delta: np.ndarray) -> None:
        """parity ^= coefficient(j, i) * delta, in place."""
        gf256.addmul(parity, self.coefficient(j, i), delta)

    @cached_property
    def coefficients(self) -> np.ndarray:
        """The r x k matrix of coefficient(j, i)."""
        return np.array([[self.coefficient(j, i) for i in range(self.k)] for j in range(self.r)], dtype=np.uint8)

    def delta_terms(self, j: np.ndarray, i: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """Row x of the result is coefficient(j[x], i[x]) * delta[x]: what parity row x must XOR in."""
        return gf256.scale_rows(self.coefficients[j, i], delta)

    def grouped(self, j: np.ndarray, i: np.ndarray, groups: np.ndarray) -> tuple:
        """(order, coefficients): an order of the rows that sorts them by `groups` (non-negative, below 2**55,
        non-decreasing along the rows, so each group's rows stay in its place) and within a group by
        coefficient, and coefficient(j[o], i[o]) of each row o in that order (for `gf256.addmul_sorted`)."""
        coef = self.coefficients[j, i]
        order = np.argsort(groups.astype(np.int64) << 8 | coef, kind="stable")
        return order, coef[order]

    def get_config(self) -> dict:
        return {"id": self.codec_id, "k": self.k, "r": self.r}

    def __repr__(self):
        return f"{type(self).__name__}(k={self.k}, r={self.r})"

    def _check_survivors(self, blocks: Mapping[int, np.ndarray]) -> None:
        if len(blocks) < self.k:
            raise ValueError(f"{self!r} needs {self.k} surviving slots, got {sorted(blocks)}")
