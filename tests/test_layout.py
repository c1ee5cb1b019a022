import numpy as np
from hypothesis import given, strategies as st

from ectable.layout import Layout, table_offset

layouts = st.builds(
    lambda k, r, extra, rows, off: Layout(k + r + extra, k, r, rows, off % (k + r + extra)),
    st.integers(1, 6), st.integers(0, 3), st.integers(0, 4), st.integers(1, 500), st.integers(0, 100))


@given(layouts)
def test_every_row_has_exactly_one_home(lay):
    ids = np.arange(lay.num_rows)
    nodes, local = lay.data_node(ids), lay.data_offset(ids)
    homes = nodes * lay.data_capacity() + local
    assert np.unique(homes).size == ids.size
    assert (local < lay.data_capacity()).all()
    for node in range(lay.nodes):  # the inverse map agrees
        mine = ids[nodes == node]
        np.testing.assert_array_equal(lay.data_ids(node, lay.data_offset(mine)), mine)
        assert sorted(lay.rows_on(node)) == sorted(mine)


@given(layouts)
def test_stripe_slots_sit_on_distinct_nodes(lay):
    stripes = np.arange(lay.num_stripes)
    slots = lay.slot_node(stripes[:, None], np.arange(lay.width))
    assert all(np.unique(row).size == lay.width for row in slots)
    ids = np.arange(lay.num_rows)
    np.testing.assert_array_equal(lay.data_node(ids), slots[ids // lay.k, ids % lay.k])
    for j in range(lay.r):
        np.testing.assert_array_equal(lay.parity_node(stripes, j), slots[:, lay.k + j])
        for node in range(lay.nodes):
            held = lay.stripes_of(node, lay.k + j)
            np.testing.assert_array_equal(held, stripes[slots[:, lay.k + j] == node])
            s, jj = lay.parity_stripes(node, lay.parity_offset(held, j))
            np.testing.assert_array_equal(s, held)
            assert (jj == j).all() and (lay.parity_offset(held, j) < lay.parity_capacity()).all()


@given(layouts)
def test_nodes_are_balanced_within_one_stripe(lay):
    stripes = np.arange(lay.num_stripes)
    slots = lay.slot_node(stripes[:, None], np.arange(lay.width))
    data = np.bincount(slots[:, : lay.k].reshape(-1), minlength=lay.nodes)
    parity = np.bincount(slots[:, lay.k:].reshape(-1), minlength=lay.nodes)
    assert data.max() - data.min() <= lay.k
    assert parity.max() - parity.min() <= max(lay.r, 0)


def test_offsets_are_stable_and_spread():
    assert table_offset("items", 7) == table_offset("items", 7)
    assert len({table_offset(f"t{i}", 7) for i in range(26)}) > 3
