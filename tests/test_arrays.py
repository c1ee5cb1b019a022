"""`ectable.arrays`: set operations by sorting, checked against numpy's own."""
import numpy as np
from hypothesis import given, settings, strategies as st

from ectable.arrays import put_rows, union, unique


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-2**40, 2**40), max_size=300), st.sampled_from([np.int64, np.int32, np.uint8]),
       st.lists(st.integers(0, 300), max_size=50))
def test_unique_and_union_by_sorting_are_numpys(values, dtype, more):
    """`ectable.arrays.unique` and `union` (which avoid numpy 2.3+'s slow hash-based unique) give what
    `np.unique` and `np.union1d` give: values, dtype and order, for flat and 2-D arrays."""
    a = np.array(values, dtype=np.int64).astype(dtype)
    for arr in (a, a.reshape(-1, 2) if a.size % 2 == 0 else a[None, :]):
        got, want = unique(arr), np.unique(arr)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    b = np.array(more, dtype=np.int64).astype(dtype)
    np.testing.assert_array_equal(union(a, b), np.union1d(a, b))
    assert union(a, b).dtype == np.union1d(a, b).dtype


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.integers(1, 12), st.sampled_from([np.uint8, np.float32, np.int64]), st.data())
def test_put_rows_is_numpys_assignment(n, width, dtype, data):
    """`put_rows` (each row copied whole) leaves a 2-D array as `dst[rows] = values` does, for arrays whose
    rows are contiguous or strided (a slice of columns) and rows in any order."""
    rows = np.array(data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n)), dtype=np.int64)
    values = np.arange(rows.size * width).astype(dtype).reshape(rows.size, width) + 1
    for cut in (width, width + 3):  # contiguous rows, then a slice of wider rows
        want = np.zeros((n, cut), dtype=dtype)[:, :width]
        got = np.zeros((n, cut), dtype=dtype)[:, :width]
        want[rows] = values
        put_rows(got, rows, values)
        np.testing.assert_array_equal(got, want)
        put_rows(got, rows, values[:, ::-1])  # values not contiguous
        want[rows] = values[:, ::-1]
        np.testing.assert_array_equal(got, want)
