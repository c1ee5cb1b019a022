"""Set operations on integer arrays by sorting, and row scatters that copy each row whole.

numpy 2.3 and later find `np.unique(a)` (with no index, inverse or counts asked for) with a hash
set that allocates a node per distinct value: for arrays of many distinct integers, as row ids
and stripes are, it is 20-80 times slower than sorting (numpy issue 31969; 1.6 s against 0.08 s
for the 400,000 stripes a failover reconciles on this project's benchmark machine). `unique` and `union` do
the same by sorting, as numpy before 2.3 did. `put_rows` says why it is there.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np


def unique(a) -> np.ndarray:
    """The distinct values of `a` (flattened), ascending: `np.unique(a)` for integer arrays."""
    values = np.sort(np.asarray(a).reshape(-1))
    if values.size < 2:
        return values
    keep = np.empty(values.size, dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def union(a, b) -> np.ndarray:
    """The distinct values of `a` and `b`, ascending: `np.union1d(a, b)` for integer arrays."""
    return unique(np.concatenate([np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)]))


def put_rows(dst: np.ndarray, rows, values: np.ndarray) -> None:
    """`dst[rows] = values` for a 2-D `dst`, each row copied whole: numpy's fancy assignment copies a row of a
    2-D array item by item, which for the byte rows of parity is several times slower. Gathers go as fast
    with `np.take(dst, rows, axis=0)`."""
    if (dst.ndim == values.ndim == 2 and dst.shape[1] == values.shape[1] > 0 and dst.strides[1] == dst.itemsize
            and values.dtype == dst.dtype):
        cell = _cell(dst.shape[1] * dst.itemsize)
        dst.view(cell)[:, 0][rows] = np.ascontiguousarray(values).view(cell)[:, 0]
    else:
        dst[rows] = values


@lru_cache(maxsize=None)
def _cell(size: int) -> np.dtype:
    """One opaque item of `size` bytes."""
    return np.dtype((np.void, size))
