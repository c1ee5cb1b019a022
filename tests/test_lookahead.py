"""Lookahead: the store ends bit for bit as the plain loop leaves it, every row read equals the plain loop's
read (no stale row), the cache never holds more than its capacity, failures are survived, bad input
changes nothing."""
import itertools

import numpy as np
import pytest
from hypothesis import given, strategies as st

import ectable
from ectable import Error, InvalidRequest, Lookahead
from ectable.lookahead.cache import CacheFull, RowCache

TABLES = {"a": (40, 3), "b": (15, 2)}  # name: (rows, dim)
_names = itertools.count()


@pytest.fixture(scope="module")
def pair():
    """Two in-process clusters: one for the plain loop, one for the lookahead."""
    with ectable.LocalCluster(nodes=3, code="xor", k=2, processes=False) as one, \
            ectable.LocalCluster(nodes=4, code="rs", k=2, r=2, processes=False) as two:
        clients = one.connect(), two.connect()
        yield clients
        for c in clients:
            c.close()


def _create(clients, optimizer, tables=TABLES):
    """Fresh tables of the same names (so the same initial rows) on every client: {name: (rows, dim)}."""
    made = {f"{t}{next(_names)}": shape for t, shape in tables.items()}
    for c in clients:
        for name, (rows, dim) in made.items():
            c.create_table(name, rows, dim, optimizer=optimizer, lr=0.1, eps=1e-3)
    return made


def _grads(rows: dict, ids: dict, scale: float) -> dict:
    """Gradients that depend on the rows read: a stale read changes them."""
    return {t: (ids[t], np.sin(rows[t] * scale) + np.float32(0.25)) for t in ids}


def _plain(client, batches, scale):
    reads = []
    for b in batches:
        rows = client.get_many(b)
        reads.append(rows)
        client.apply_gradient_many(_grads(rows, b, scale))
        client.step()
    return reads


def _records(client, tables):
    return {t: client.get_many({t: np.arange(rows)}, records=True)[t] for t, (rows, _) in tables.items()}


def _same(x: dict, y: dict) -> bool:
    return x.keys() == y.keys() and all(np.array_equal(x[t].view(np.uint32), y[t].view(np.uint32)) for t in x)


def _drop(clients, tables):
    for c in clients:
        for t in tables:
            c.drop_table(t)


batch_ids = st.lists(st.integers(0, 1 << 30), max_size=24)


@given(optimizer=st.sampled_from(["sgd", "adagrad", "rowwise_adagrad"]),
       stream=st.lists(st.tuples(batch_ids, batch_ids, st.booleans()), min_size=1, max_size=12),
       lookahead=st.integers(0, 12), spare=st.integers(0, 40), sync_every=st.none() | st.integers(1, 5),
       group=st.integers(1, 4), scale=st.floats(0.5, 3.0))
def test_bit_identical_to_the_plain_loop(pair, optimizer, stream, lookahead, spare, sync_every, group, scale):
    tables = _create(pair, optimizer)
    (a, arows), (b, brows) = ((t, TABLES[t[0]][0]) for t in tables)
    batches = [{a: np.array(x, dtype=np.int64) % arows, **({b: np.array(y, dtype=np.int64) % brows} if with_b else {})}
               for x, y, with_b in stream]
    widest = max(sum(np.unique(ids).size for ids in batch.values()) for batch in batches)
    plain = _plain(pair[0], batches, scale)
    reads = []
    with Lookahead(pair[1], batches, lookahead=lookahead, cache_rows=max(1, widest + spare),
                   sync_every=sync_every) as la:
        la._worker.GROUP = group  # write-backs held and sent together: reads meet them
        for n, batch in enumerate(la):
            assert batch is batches[n]
            rows = la.get_many(batch)
            reads.append(rows)
            la.apply_gradient_many(_grads(rows, batch, scale))
            la.step()
            assert len(la.cache) + la._worker.held <= la.cache.capacity
        assert la.stats["batches"] == len(batches)
    assert all(_same(x, y) for x, y in zip(plain, reads))  # no read was stale
    assert _same(_records(pair[0], tables), _records(pair[1], tables))
    _drop(pair, tables)


def test_hot_rows_stay_cached_and_cold_rows_are_written_back(pair):
    tables = _create(pair, "adagrad", {"a": (1000, 4)})
    [t] = tables
    rng = np.random.default_rng(0)
    batches = [{t: np.concatenate([np.arange(5), rng.integers(5, 1000, 30)])} for _ in range(30)]
    _plain(pair[0], batches, 1.0)
    with Lookahead(pair[1], batches, lookahead=4, sync_every=None) as la:
        for batch in la:
            la.apply_gradient_many(_grads(la.get_many(batch), batch, 1.0))
        stats = la.stats
    assert stats["rows"] == sum(np.unique(b[t]).size for b in batches)
    assert stats["fetched"] < stats["rows"] - 5 * 25  # rows 0-4 are read once
    assert stats["written"] <= stats["fetched"]  # every row leaves once at most per read
    assert 0 < stats["hit_rate"] < 1 and stats["cached"] == 0
    assert _same(_records(pair[0], tables), _records(pair[1], tables))
    _drop(pair, tables)


def test_a_small_cache_shrinks_the_lookahead_and_stays_within_capacity(pair):
    tables = _create(pair, "sgd", {"a": (500, 2)})
    [t] = tables
    batches = [{t: np.arange(i * 10, i * 10 + 20) % 500} for i in range(40)]  # 20 rows each, 10 shared
    _plain(pair[0], batches, 2.0)
    with Lookahead(pair[1], batches, lookahead=8, cache_rows=35) as la:
        most = 0
        for batch in la:
            la.apply_gradient_many(_grads(la.get_many(batch), batch, 2.0))
            most = max(most, len(la.cache) + la._worker.held)
            assert la.stats["ahead"] <= 1  # a third batch's rows would not fit
    assert most <= 35
    assert _same(_records(pair[0], tables), _records(pair[1], tables))
    with pytest.raises(InvalidRequest, match="more than cache_rows=10"), Lookahead(pair[1], batches, cache_rows=10) as la:
        next(la)
    _drop(pair, tables)


def test_bad_input_is_refused_and_changes_nothing(pair):
    tables = _create(pair, "adagrad")
    a, b = tables
    batches = [{a: np.array([1, 2, 3])}, {a: np.array([3, 4])}]
    with pytest.raises(InvalidRequest, match="lookahead must be"):
        Lookahead(pair[1], batches, lookahead=-1)
    with pytest.raises(InvalidRequest, match="ids must be a function"):
        Lookahead(pair[1], batches, ids=3)
    la = Lookahead(pair[1], batches, lookahead=1)
    with pytest.raises(InvalidRequest, match="no current batch"):
        la.get_many({a: [1]})
    next(la)
    before = la.get_many({a: [1, 2, 3]})[a].copy()
    for bad, match in [({a: [4]}, "not in the lookahead's current batch"), ({b: [0]}, "not in the lookahead's"),
                       ({"nope": [0]}, "unknown table"), ({a: [1.5]}, "ids"), ([1], "must be a dict")]:
        with pytest.raises(InvalidRequest, match=match):
            la.get_many(bad)
    for bad, match in [({a: ([1, 4], np.ones((2, 3)))}, "not in the lookahead's current batch"),
                       ({a: ([1, 2], np.ones((2, 2)))}, "shape"),
                       ({a: ([1, 2], np.array([[1, np.nan, 1], [1, 1, 1]]))}, "non-finite"),
                       ({a: ([1, 1], np.full((2, 3), 3e38))}, "non-finite"),
                       ({a: ([1], np.ones((1, 3))), b: ([9], np.ones((1, 2)))}, "not in the lookahead's")]:
        with pytest.raises(InvalidRequest, match=match):
            la.apply_gradient_many(bad)
    assert _same({a: la.get_many({a: [1, 2, 3]})[a]}, {a: before})
    assert not la.cache.dirty.any()  # nothing was applied
    la.close()
    with pytest.raises(Error, match="closed"):
        next(la)
    with Lookahead(pair[1], [{a: [1]}, [1, 2]]) as bad:
        assert next(bad) == {a: [1]}  # the batches before a bad one are trained
        with pytest.raises(InvalidRequest, match="must be a dict"):
            next(bad)
        with pytest.raises(StopIteration):
            next(bad)
    _drop(pair, tables)


def test_checkpoint_writes_back_the_cache_first(pair, tmp_path):
    tables = _create(pair, "rowwise_adagrad", {"a": (200, 4)})
    [t] = tables
    batches = [{t: np.array([0, 1, 2, 3 + i])} for i in range(20)]
    _plain(pair[0], batches[:10], 1.5)
    with Lookahead(pair[1], batches, lookahead=4, sync_every=None) as la:
        for n, batch in enumerate(la):
            la.apply_gradient_many(_grads(la.get_many(batch), batch, 1.5))
            if n == 9:
                assert la.cache.dirty.any()  # rows 0-2 were updated and are held
                la.checkpoint(str(tmp_path / "ckpt"), policy="full")
                assert la.checkpoint_wait(60)["kind"] == "full"
    with ectable.LocalCluster(nodes=3, code="xor", k=2, processes=False) as fresh:
        ectable.restore(str(tmp_path / "ckpt"), fresh)
        client = fresh.connect()
        assert _same(_records(client, tables), _records(pair[0], tables))
        client.close()
    _drop(pair, tables)


def test_a_node_killed_during_a_lookahead_run_changes_nothing(pair):
    tables = _create(pair[:1], "adagrad", {"a": (3000, 8), "b": (500, 4)})
    rng = np.random.default_rng(1)
    batches = [{t: rng.zipf(1.2, 200) % rows for t, (rows, _) in tables.items()} for _ in range(40)]
    _plain(pair[0], batches, 1.0)
    with ectable.LocalCluster(nodes=5, code="xor", k=4, spares=1, processes=True) as cluster:
        client = cluster.connect()
        for name, (rows, dim) in tables.items():
            client.create_table(name, rows, dim, optimizer="adagrad", lr=0.1, eps=1e-3)
        epoch = client.status()["epoch"]
        with Lookahead(client, batches, lookahead=6, cache_rows=3000, sync_every=10) as la:
            for n, batch in enumerate(la):
                if n == 15:
                    cluster.kill(2)  # SIGKILL, while reads and write-backs are in flight
                la.apply_gradient_many(_grads(la.get_many(batch), batch, 1.0))
        client.wait_recovered(60)
        assert client.status()["epoch"] > epoch  # the spare took position 2
        assert _same(_records(client, tables), _records(pair[0], tables))
        client.close()
    _drop(pair[:1], tables)


def test_row_cache_counts_batches_and_refuses_what_does_not_fit():
    cache = RowCache(4, 2)
    slots, new = cache.admit(np.array([1, 5, 9]))
    assert new.all() and len(cache) == 3 and cache.free == 1
    cache.arena[slots] = [[1, 1], [5, 5], [9, 9]]
    slots2, new2 = cache.admit(np.array([5, 7]))
    assert new2.tolist() == [False, True] and slots2[0] == slots[1]
    with pytest.raises(CacheFull):
        cache.admit(np.array([2, 3]))
    assert len(cache) == 4 and cache.keys.tolist() == [1, 5, 7, 9]  # nothing changed
    cache.dirty[slots[[0, 1]]] = True  # rows 1 and 5 updated
    keys, records = cache.release(np.array([1, 5, 9]))
    assert keys.tolist() == [1] and records.tolist() == [[1, 1]]  # 5 is still used; 9 was clean
    assert cache.keys.tolist() == [5, 7] and cache.free == 2
    keys, records = cache.take_dirty()
    assert keys.tolist() == [5] and records.tolist() == [[5, 5]] and not cache.dirty.any()
    with pytest.raises(KeyError):
        cache.release(np.array([1]))


def test_a_dlrm_through_a_lookahead_trains_bit_for_bit_as_without(pair):
    torch = pytest.importorskip("torch")
    from ectable.testing import dlrm as D
    from ectable.torch import EmbeddingBagCollection, SparseOptimizer, jagged_ids
    rows = {"user": 2000, "item": 500, "hour": 24}
    made = _create(pair, "rowwise_adagrad", {t: (n, 8) for t, n in rows.items()})
    names = dict(zip(rows, made))  # feature -> table
    batches = list(D.batches(3, 25, 64, rows))
    results = []
    for client, lookahead in zip(pair, (None, 4)):
        la = None if lookahead is None else Lookahead(client, batches, lookahead=lookahead,
                                                      ids=lambda b: jagged_ids(b[1], names))
        net = D.model(EmbeddingBagCollection(la or client, names), list(rows), 8)
        opts = (torch.optim.SGD([p for n, p in net.named_parameters() if not n.startswith("embeddings")], lr=0.05),
                SparseOptimizer(net))
        losses = [D.train_step(net, *opts, x, features, y) for x, features, y in (la or batches)]
        if la is not None:
            assert la.stats["hit_rate"] > 0.3
            la.close()
        results.append((losses, _records(client, made)))
    assert results[0][0] == results[1][0]  # the loss curve, bit for bit
    assert _same(results[0][1], results[1][1])
    with pytest.raises(InvalidRequest, match="one trainer"), Lookahead(pair[1], batches) as la:
        SparseOptimizer(EmbeddingBagCollection(la, names), process_group=object())
    _drop(pair, made)
