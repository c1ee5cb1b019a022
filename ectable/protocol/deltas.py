"""A parity delta's payload: the delta rows of any number of tables in three arrays.

- `shape`, int64 [T, 2]: per table, in the order of the message's `tables`, its rows and bytes per row;
- `ids`, int64 [N]: every table's row ids, one table after the other;
- `delta`, uint8 [sum of rows x bytes]: every table's delta rows (old ^ new record bytes), in the same order.

So a window costs one message of three frames per peer whatever the number of tables: a frame per
table cost more to encode, send and decode than the bytes it carried.
"""
from __future__ import annotations

import numpy as np

from ..errors import InvalidRequest

MAX_ROW_BYTES = 1 << 20


def pack(parts) -> list:
    """The arrays of [(ids, delta rows uint8 [n, bytes])] per table."""
    shape = np.array([[ids.size, delta.shape[1]] for ids, delta in parts], dtype=np.int64).reshape(-1, 2)
    if not parts:
        return [shape, np.empty(0, np.int64), np.empty(0, np.uint8)]
    ids = np.concatenate([np.asarray(ids, dtype=np.int64) for ids, _ in parts])
    delta = np.concatenate([np.ascontiguousarray(d, dtype=np.uint8).reshape(-1) for _, d in parts])
    return [shape, ids, delta]


def unpack(tables: int, arrays) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(rows per table, bytes per row per table, every table's ids, every table's delta bytes, flat) of a payload
    naming `tables` tables; raises InvalidRequest unless its arrays add up."""
    if not isinstance(arrays, (list, tuple)) or len(arrays) != 3 or not all(isinstance(a, np.ndarray) for a in arrays):
        raise InvalidRequest("a delta carries three arrays: shape, ids and delta bytes")
    shape, ids, delta = arrays
    if shape.dtype != np.int64 or shape.shape != (tables, 2):
        raise InvalidRequest(f"a delta's shape must be int64 [{tables}, 2] (rows, bytes per row per table), "
                             f"got {shape.dtype}{list(shape.shape)}")
    rows, width = shape[:, 0], shape[:, 1]
    if tables and (rows.min() < 0 or width.min() < 1 or width.max() > MAX_ROW_BYTES):
        raise InvalidRequest("a delta's rows per table must be >= 0 and its bytes per row in [1, 2**20]")
    total = sum(rows.tolist())  # in Python's integers: an int64 sum of forged counts can wrap around
    if ids.dtype != np.int64 or ids.shape != (total,):
        raise InvalidRequest(f"a delta's ids must be int64 [{total}], got {ids.dtype}{list(ids.shape)}")
    size = int(rows @ width)  # (every count is at most the ids': no wrapping)
    if delta.dtype != np.uint8 or delta.shape != (size,):
        raise InvalidRequest(f"a delta's bytes must be uint8 [{size}], got {delta.dtype}{list(delta.shape)}")
    return rows, width, ids, delta


def split(rows: np.ndarray, width: np.ndarray, delta: np.ndarray) -> list:
    """[delta rows uint8 [n, bytes] per table] of an unpacked payload."""
    ends = np.cumsum(rows * width)
    starts = ends - rows * width
    return [delta[s:e].reshape(n, w) for s, e, n, w in zip(starts.tolist(), ends.tolist(), rows.tolist(), width.tolist())]
