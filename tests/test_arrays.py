"""`ectable.arrays`: set operations by sorting, checked against numpy's own."""
import numpy as np
from hypothesis import given, settings, strategies as st

from ectable.arrays import union, unique


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
