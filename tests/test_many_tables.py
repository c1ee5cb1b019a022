"""The checks and placement math of a request naming many tables, done in one pass over all of them, say and
return exactly what the same done table by table says and returns: the same arrays, the same errors, naming
the same table. On a node (the ids' checks, their local offsets) and on the client (their routing to nodes)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ectable
from ectable.codes import get_code
from ectable.errors import Error
from ectable.layout import Layout, table_offset
from ectable.protocol import validate
from ectable.storage.shard import Shard, local_many
from ectable.storage.table import TableSpec

NODES = 5


def outcome(call):
    """What `call()` returns, or the type and message of the error it raises."""
    try:
        return "ok", call()
    except Error as exc:
        return type(exc).__name__, str(exc)


def same(got, want) -> None:
    assert got[0] == want[0], (got, want)
    if got[0] == "ok":
        assert len(got[1]) == len(want[1])
        for a, b in zip(got[1], want[1]):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
    else:
        assert got[1] == want[1]


tables = st.lists(st.tuples(st.integers(1, 60), st.lists(st.integers(-3, 65), max_size=12),
                            st.sampled_from([np.int64, np.int64, np.int32])), max_size=5)


@settings(max_examples=300, deadline=None)
@given(tables)
def test_ids_of_many_tables_checked_at_once_are_checked_as_one_by_one(specs):
    """`validate.ids_many`: ids out of range (negative too) or of another dtype, in any table."""
    names = [f"t{n}" for n in range(len(specs))]
    values = [np.array(ids, dtype=dtype) for _, ids, dtype in specs]
    rows = [num_rows for num_rows, _, _ in specs]
    same(outcome(lambda: validate.ids_many(names, values, rows)),
         outcome(lambda: [validate.ids(t, v, n) for t, v, n in zip(names, values, rows)]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 12), max_size=8), max_size=5), st.booleans())
def test_unique_ids_of_many_tables_checked_at_once_are_checked_as_one_by_one(ids, ascending):
    """`validate.unique_many`: a duplicate in any table, ids ascending or not, tables sharing ids."""
    arrays = [np.array(sorted(set(a)) if ascending else a, dtype=np.int64) for a in ids]
    names = [f"t{n}" for n in range(len(ids))]
    want = outcome(lambda: [validate.unique(t, a) for t, a in zip(names, arrays)])
    got = outcome(lambda: validate.unique_many(names, arrays))
    assert got[0] == want[0] and (got[0] == "ok" or got[1] == want[1])


def shards(sizes: list, node: int, rebuilding: int | None = None) -> list:
    out = []
    for n, num_rows in enumerate(sizes):
        spec = TableSpec.from_config({"name": f"t{n}", "num_rows": num_rows, "dim": 2, "seed": 1})
        layout = Layout(nodes=NODES, k=3, r=1, num_rows=num_rows, offset=table_offset(spec.name, NODES))
        out.append(Shard(spec, layout, node, get_code("xor", 3, 1), rebuilding=n == rebuilding))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 80), min_size=1, max_size=5), st.integers(0, NODES - 1), st.data())
def test_local_offsets_of_many_tables_found_at_once_are_found_one_by_one(sizes, node, data):
    """`local_many`: rows of this node (local offsets), of another node (refused, naming table and row), and of
    a replacement's table whose rows are not rebuilt yet (refused, naming the rows)."""
    rebuilding = data.draw(st.sampled_from([None, *range(len(sizes))]))
    here = shards(sizes, node, rebuilding)
    work = []
    for shard in here:
        mine = shard.layout.rows_on(node)
        pick = data.draw(st.lists(st.sampled_from(mine.tolist()), unique=True, max_size=6)) if mine.size else []
        if data.draw(st.integers(0, 9)) == 0:  # now and then a row of another node
            pick.append(data.draw(st.integers(0, shard.spec.num_rows - 1)))
        work.append((shard, np.array(sorted(set(pick)), dtype=np.int64)))
    same(outcome(lambda: local_many(work)), outcome(lambda: [shard.local(ids) for shard, ids in work]))


def test_a_row_of_another_node_in_the_second_table_is_refused_by_that_tables_name():
    first, second = shards([40, 40], 0)
    ok = first.layout.rows_on(0)[:3]
    wrong = np.flatnonzero(second.layout.data_node(np.arange(40)) != 0)[:1]
    with pytest.raises(Error, match=f"table 't1': row {wrong[0]} does not live on node 0"):
        local_many([(first, ok), (second, wrong)])


@pytest.fixture(scope="module")
def client():
    with ectable.LocalCluster(nodes=NODES, code="xor", k=3, r=1, processes=False) as cluster:
        client = cluster.connect()
        for n, rows in enumerate([50, 7, 400]):
            client.create_table(f"t{n}", num_rows=rows, dim=2)
        yield client


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_ids_of_many_tables_are_routed_to_nodes_as_one_by_one(client, data):
    """A client's routing (`_parts`) of many tables' ids, in any order and with repeats: for each node, the
    tables in the order given, each with its ids for that node in their order and where they sat."""
    batch = {}
    for n in data.draw(st.permutations(range(3))):
        if data.draw(st.booleans()):
            rows = client._table(f"t{n}")[0].num_rows
            batch[f"t{n}"] = np.array(data.draw(st.lists(st.integers(0, rows - 1), max_size=30)), dtype=np.int64)
    want: dict = {}
    for table, ids in batch.items():
        for p, where in client._by_node(client._table(table)[1], ids):
            want.setdefault(p, []).append((table, ids[where], where))
    got = client._parts(batch)
    assert sorted(got) == sorted(want)
    for p in want:
        assert [t for t, _, _ in got[p]] == [t for t, _, _ in want[p]]
        for (_, ids, where), (_, ids_want, where_want) in zip(got[p], want[p]):
            np.testing.assert_array_equal(ids, ids_want)
            np.testing.assert_array_equal(where, where_want)


@pytest.mark.parametrize("block_bytes", [None, 1 << 12], ids=["one block", "a block a table"])
@pytest.mark.parametrize("code,k,r", [("xor", 4, 1), ("rs", 4, 2), ("rs", 6, 3)])
def test_deltas_of_several_windows_and_senders_folded_in_one_pass_make_parity_exact(code, k, r, block_bytes,
                                                                                    monkeypatch):
    """Messages of every sender and of three windows wait in the nodes' queues, many of them naming the same
    parity rows (the hot rows are written in every window), then fold together: parity equals the code of the
    data, as zfec computes it. With small arena blocks, each table has a block of its own, so a message's rows
    fold in several runs."""
    from ectable.storage import arena
    from ectable.storage.node import Node
    from ectable.testing import check_parity
    if block_bytes is not None:
        monkeypatch.setattr(arena, "BLOCK_BYTES", block_bytes)
    with ectable.LocalCluster(nodes=k + r + 1, code=code, k=k, r=r, processes=False, window_rows=1 << 20) as cluster:
        client = cluster.connect()
        rng = np.random.default_rng(11)
        for name in ("a", "b", "c"):
            client.create_table(name, num_rows=3000, dim=16, optimizer="rowwise_adagrad", init="normal",
                                seed=ord(name))
        client.create_table("wide", num_rows=800, dim=24, optimizer="adagrad", init="normal", seed=1)
        with monkeypatch.context() as patch:
            patch.setattr(Node, "apply_queued", lambda self: None)  # nothing folds: every message stays queued
            for _ in range(3):
                batch = {name: np.concatenate([np.arange(50), rng.choice(3000, 500)]) for name in ("a", "b", "c")}
                batch["wide"] = rng.choice(800, 300)
                client.apply_gradient_many({name: (ids, rng.normal(size=(ids.size, 24 if name == "wide" else 16)))
                                            for name, ids in batch.items()})
                client.step()
            client.get_many({"a": [0]})  # the last step goes out
            nodes = [cluster.node(p) for p in range(k + r + 1)]
            assert all(len({e.source for e in node.queued}) >= k for node in nodes)
            runs = max(len(e.runs()) for node in nodes for e in node.queued)
            assert runs == 1 if block_bytes is None else runs == 3  # "a", "b", "c" share a width
        for node in nodes:
            node.apply_queued()
        client.flush()
        check_parity(cluster, client)
