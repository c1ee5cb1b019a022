import numpy as np
import pytest
from hypothesis import given, strategies as st

import ectable
from ectable.storage.initializers import check_init, init_rows
from ectable.storage.optimizers import get_optimizer
from ectable.testing import ReferenceTable
from ectable.protocol.validate import coalesce, sum_rows

g32 = st.floats(-3, 3, width=32)


def formula(name, w, s, g, lr=np.float32(0.1), eps=np.float32(1e-8)):
    """SPEC section 3, written out per element."""
    if name == "sgd":  # rounded once, as torch's add_(g, alpha=-lr) (an fma)
        return (w.astype(np.float64) - np.float64(lr) * g.astype(np.float64)).astype(np.float32), s
    if name == "adagrad":  # s + g*g rounded once, as torch's addcmul_ (an fma)
        s = (s.astype(np.float64) + g.astype(np.float64) ** 2).astype(np.float32)
        return w - lr * g / (np.sqrt(s) + eps), s
    s = s + np.float32(np.mean(g * g, dtype=np.float32))
    return w - lr * g / (np.sqrt(s) + eps), s


@pytest.mark.parametrize("name", ["sgd", "adagrad", "rowwise_adagrad"])
@given(data=st.data())
def test_optimizers_follow_the_spec_in_float32(name, data):
    opt = get_optimizer({"name": name, "lr": 0.1})
    dim = data.draw(st.integers(1, 9))
    n = data.draw(st.integers(1, 5))
    sw = opt.state_width(dim)
    rec = np.array(data.draw(st.lists(g32, min_size=n * (dim + sw), max_size=n * (dim + sw))), dtype=np.float32).reshape(n, dim + sw)
    rec[:, dim:] = np.abs(rec[:, dim:])
    grads = np.array(data.draw(st.lists(g32, min_size=n * dim, max_size=n * dim)), dtype=np.float32).reshape(n, dim)
    expect = rec.copy()
    for x in range(n):
        w, s = formula(name, rec[x, :dim], rec[x, dim:], grads[x])
        expect[x, :dim], expect[x, dim:] = w, s
    opt.step(rec, grads, dim)
    assert rec.dtype == np.float32
    np.testing.assert_array_equal(rec, expect)


@given(st.lists(st.integers(0, 6), min_size=1, max_size=30), st.data())
def test_duplicates_equal_the_coalesced_batch(ids, data):
    ids = np.array(ids)
    grads = np.array(data.draw(st.lists(g32, min_size=ids.size * 3, max_size=ids.size * 3)), dtype=np.float32).reshape(-1, 3)
    with ectable.LocalCluster(nodes=3, code="xor", k=2, r=1, processes=False) as a, \
         ectable.LocalCluster(nodes=3, code="xor", k=2, r=1, processes=False) as b:
        ca, cb = a.connect(), b.connect()
        for c in (ca, cb):
            c.create_table("t", num_rows=7, dim=3, optimizer="rowwise_adagrad", lr=0.1)
        ca.apply_gradient("t", ids, grads)
        uniq, summed = coalesce(ids, grads)
        cb.apply_gradient("t", uniq, summed)
        np.testing.assert_array_equal(ca.get("t", np.arange(7)), cb.get("t", np.arange(7)))
        model = ReferenceTable(ca._table("t")[0])
        model.apply_gradient(ids, grads)
        np.testing.assert_array_equal(ca.get("t", np.arange(7)), model.get(np.arange(7)))


@given(st.lists(st.integers(0, 6), min_size=1, max_size=30), st.lists(st.integers(0, 6), max_size=30), st.data())
def test_gradients_of_the_ids_just_read_sum_as_any_others(read, ids, data):
    """A client reuses its last read's unique ids for gradients of the same ids: the rows come out as a
    reference model's, also when the array read was changed in place before the gradients named it."""
    read, ids = np.array(read), np.array(ids or read)
    grads = np.array(data.draw(st.lists(g32 | st.just(-0.0), min_size=ids.size * 3, max_size=ids.size * 3)),
                     dtype=np.float32).reshape(-1, 3)
    with ectable.LocalCluster(nodes=3, code="xor", k=2, r=1, processes=False) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=7, dim=3, optimizer="rowwise_adagrad", lr=0.1)
        model = ReferenceTable(client._table("t")[0])
        client.get_many({"t": read})
        if read.size == ids.size:
            read[:] = ids  # the array read now holds other ids (or the same)
            ids = read
        client.apply_gradient_many({"t": (ids, grads)})
        model.apply_gradient(ids, grads)
        np.testing.assert_array_equal(client.get("t", np.arange(7)), model.get(np.arange(7)))
        assert np.array_equal(coalesce(ids, grads, np.unique(ids, return_inverse=True))[1].view(np.uint32),
                              coalesce(ids, grads)[1].view(np.uint32))


@pytest.mark.parametrize("kind", ["zeros", "uniform", "normal"])
def test_initial_rows_are_a_pure_function_of_seed_table_and_id(kind):
    config = check_init({"kind": kind}, 16)
    ids = np.array([5, 0, 99999, 5])
    a = init_rows(config, 3, "items", ids, 16)
    np.testing.assert_array_equal(a[0], a[3])
    np.testing.assert_array_equal(a[[1, 2]], init_rows(config, 3, "items", ids[[1, 2]], 16))
    if kind != "zeros":
        assert not np.array_equal(a, init_rows(config, 4, "items", ids, 16))
        assert not np.array_equal(a, init_rows(config, 3, "users", ids, 16))


def test_initial_values_do_not_depend_on_the_cluster():
    rows = []
    for nodes, code, k, r in [(3, "xor", 2, 1), (6, "rs", 3, 2), (4, "none", 4, 0)]:
        with ectable.LocalCluster(nodes=nodes, code=code, k=k, r=r, processes=False) as c:
            cl = c.connect()
            cl.create_table("e", num_rows=101, dim=8, init="normal", seed=7)
            rows.append(cl.get("e", np.arange(101)))
    np.testing.assert_array_equal(rows[0], rows[1])
    np.testing.assert_array_equal(rows[0], rows[2])


def test_distributions_look_right():
    u = init_rows(check_init({"kind": "uniform"}, 64), 0, "t", np.arange(4000), 64)
    assert abs(u.max() - 0.125) < 1e-3 and abs(u.min() + 0.125) < 1e-3 and abs(u.mean()) < 2e-3
    n = init_rows(check_init({"kind": "normal", "std": 1.0}, 64), 0, "t", np.arange(4000), 64)
    assert abs(n.mean()) < 0.01 and abs(n.std() - 1) < 0.01


@given(st.lists(st.integers(0, 9), min_size=1, max_size=60), st.integers(1, 70), st.integers(0, 2**32 - 1))
def test_sum_rows_adds_in_order_of_appearance(inverse, dim, seed):
    """The flat add equals adding each row in turn, bit for bit (float32 addition is not associative)."""
    inverse = np.array(inverse)
    values = (np.random.default_rng(seed).standard_normal((inverse.size, dim))
              * 10.0 ** np.random.default_rng(seed + 1).integers(-8, 8, (inverse.size, 1))).astype(np.float32)
    expect = np.zeros((inverse.max() + 1, dim), dtype=np.float32)
    for i, row in zip(inverse, values):
        expect[i] += row
    assert np.array_equal(sum_rows(inverse, values, inverse.max() + 1).view(np.uint32), expect.view(np.uint32))
