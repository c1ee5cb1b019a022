"""Checks of request values; each failure raises InvalidRequest naming the table and the value."""
from __future__ import annotations

import numpy as np

from ..errors import InvalidRequest

F32_MAX = float(np.finfo(np.float32).max)


def is_number(value) -> bool:
    """An int or float (numpy's included), not a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))


def finite_result(table: str, kind: str, ids: np.ndarray, records: np.ndarray) -> None:
    """Refuse a write whose resulting `records` (rows `ids`) are not all finite (a float32 overflow)."""
    bad = ~np.isfinite(records).all(axis=1)
    if bad.any():
        raise InvalidRequest(f"table {table!r}: {kind} would make rows {ids[bad][:8].tolist()} non-finite "
                             f"(float32 overflow); nothing of this write was applied")


def ids(table: str, value, num_rows: int) -> np.ndarray:
    """A 1-D int64 array of row ids in [0, num_rows)."""
    arr, shape = shaped_ids(table, value, num_rows)
    if len(shape) != 1:
        raise InvalidRequest(f"table {table!r}: ids must be 1-D, got shape {shape}")
    return arr


def ids_many(tables: list, values: list, num_rows: list) -> list:
    """`ids` of several tables at once (`values[t]` of `tables[t]`, which has `num_rows[t]` rows): the
    ranges of all are checked in one pass; a failure is named as `ids` names it."""
    if values and all(type(v) is np.ndarray and v.ndim == 1 and v.dtype == np.int64 for v in values):
        limit = np.repeat(np.array(num_rows, dtype=np.uint64), [v.size for v in values])
        if not (np.concatenate(values).view(np.uint64) >= limit).any():  # a negative id is a huge unsigned one
            return list(values)
    return [ids(t, v, n) for t, v, n in zip(tables, values, num_rows)]


def unique_many(tables: list, arrays: list) -> None:
    """`unique` of several tables' ids; ids ascending within each table (as a client's `apply_gradient` sends
    them, coalesced) are checked in one pass over all, others (a put's, in the caller's order) table by table."""
    if arrays:
        flat = np.concatenate(arrays)
        up = flat[1:] > flat[:-1]
        starts = np.cumsum([a.size for a in arrays])[:-1]
        up[starts[(starts > 0) & (starts < flat.size)] - 1] = True  # a table's first id follows another table's
        if up.all():
            return
    for table, arr in zip(tables, arrays):
        unique(table, arr)


def shaped_ids(table: str, value, num_rows: int) -> tuple[np.ndarray, tuple]:
    """Row ids in [0, num_rows) of any shape (as torch's `embedding` takes them): (flat int64 ids, shape)."""
    try:
        arr = np.asarray(value)
    except Exception as exc:  # ragged lists and the like
        raise InvalidRequest(f"table {table!r}: ids are not an array ({exc})") from None
    if arr.dtype == object or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise InvalidRequest(f"table {table!r}: ids must be integers, got dtype {arr.dtype}")
    shape, arr = arr.shape, arr.reshape(-1)
    arr = arr.astype(np.int64, copy=False)
    if arr.size:
        lo, hi = arr.min(), arr.max()
        if lo < 0 or hi >= num_rows:
            bad = lo if lo < 0 else hi
            raise InvalidRequest(f"table {table!r}: id {bad} is out of range [0, {num_rows})")
    return arr, shape


def unique(table: str, arr: np.ndarray) -> None:
    if arr.size > 1:
        s = np.sort(arr)
        dup = s[1:][s[1:] == s[:-1]]
        if dup.size:
            raise InvalidRequest(f"table {table!r}: duplicate id {dup[0]} in put")


def rows(table: str, value, n: int, dim: int, what: str = "rows", ids_shape: tuple | None = None) -> np.ndarray:
    """A C-contiguous float32 [n, dim] array of finite values (float64 is cast); with `ids_shape`, of shape
    ids_shape + (dim,) (flattened to [n, dim])."""
    try:
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    except Exception as exc:  # ragged lists and the like
        raise InvalidRequest(f"table {table!r}: {what} are not an array ({exc})") from None
    if arr.dtype not in (np.float32, np.float64):
        raise InvalidRequest(f"table {table!r}: {what} must be float32 or float64, got dtype {arr.dtype}")
    want = (n, dim) if ids_shape is None else tuple(ids_shape) + (dim,)
    if arr.shape != want:
        raise InvalidRequest(f"table {table!r}: {what} must have shape {want}, got {arr.shape}")
    with np.errstate(over="ignore"):  # float64 beyond float32 becomes inf: refused below
        arr = np.ascontiguousarray(arr.reshape(n, dim), dtype=np.float32)
    if arr.size and not np.isfinite(arr).all():
        where = np.argwhere(~np.isfinite(arr))[0]
        raise InvalidRequest(f"table {table!r}: {what} hold a non-finite value {arr[tuple(where)]} at {tuple(int(x) for x in where)}")
    return arr


def pair(table: str, value, what: str) -> tuple:
    """A multi-table write's value for `table`: (ids, `what`)."""
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        raise InvalidRequest(f"table {table!r}: expected (ids, {what}), got {type(value).__name__}")
    return value


def finite_sums(table: str, grads: np.ndarray) -> np.ndarray:
    """`grads`, once the gradients of duplicate ids are summed; refused if a sum overflowed."""
    if not np.isfinite(grads).all():
        raise InvalidRequest(f"table {table!r}: gradients of duplicate ids sum to a non-finite value")
    return grads


def coalesce(arr: np.ndarray, grads: np.ndarray, unique: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Unique ids (ascending) and their gradients summed in order of appearance; `unique`: `arr`'s
    (unique ids, inverse) as `np.unique` gives them, if known."""
    if ascending(arr):  # unique already (a caller that took np.unique itself): nothing to sum
        return arr, grads
    uniq, inverse = unique if unique is not None else np.unique(arr, return_inverse=True)
    if uniq.size == arr.size:  # a permutation: the gradients in the ids' order, as they are
        out = np.empty_like(grads)
        out[inverse.reshape(-1)] = grads
        return uniq, out
    with np.errstate(over="ignore"):  # an overflowing sum is rejected by the caller
        return uniq, sum_rows(inverse.reshape(-1), grads, uniq.size)


def ascending(arr: np.ndarray) -> bool:
    """Whether 1-D `arr` is strictly ascending (so unique and sorted)."""
    return bool((arr[1:] > arr[:-1]).all())


def sum_rows(inverse: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """float32 [n, dim]: row i is the sum of the `values` rows whose `inverse` is i, added in order
    of appearance. One flat `np.add.at` (numpy's fast path for 1-D indices, 3-4x faster than
    indexing rows), which adds in index order: the same bits as adding row by row."""
    dim = values.shape[1]
    out = np.zeros(n * dim, dtype=np.float32)
    np.add.at(out, (inverse[:, None] * dim + np.arange(dim)).reshape(-1), values.reshape(-1))
    return out.reshape(n, dim)
