import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ectable
from ectable.__main__ import render
from ectable.testing import check_parity, read_records


@pytest.fixture
def cluster():
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=1, processes=False) as c:
        client = c.connect()
        client.create_table("items", num_rows=1000, dim=8, optimizer="rowwise_adagrad", lr=0.05, seed=1)
        client.create_table("users", num_rows=333, dim=4, optimizer="adagrad", lr=0.1, init="normal")
        yield c, client


def everything(client):
    return {t: read_records(client, t, np.arange(spec["num_rows"])) for t, spec in client.tables().items()}


def same(a, b):
    return all(np.array_equal(a[t], b[t]) for t in a)


def test_get_returns_rows_in_order_with_duplicates(cluster):
    _, client = cluster
    ids = [5, 999, 5, 0, 12]
    rows = client.get("items", ids)
    assert rows.shape == (5, 8) and rows.dtype == np.float32
    np.testing.assert_array_equal(rows[0], rows[2])
    np.testing.assert_array_equal(rows[1], client.get("items", [999])[0])
    assert client.get("items", []).shape == (0, 8)


def test_put_then_get_and_float64_is_cast(cluster):
    _, client = cluster
    client.put("items", [3, 1], np.array([[1.5] * 8, [2.5] * 8]))
    np.testing.assert_array_equal(client.get("items", [1, 3]), [[2.5] * 8, [1.5] * 8])


@pytest.mark.parametrize("call,args,words", [
    ("get", ("nope", [1]), "unknown table 'nope'"),
    ("get", ("items", [1000]), "id 1000 is out of range"),
    ("get", ("items", [-1]), "id -1 is out of range"),
    ("get", ("items", [1.5]), "must be integers"),
    ("apply_gradient", ("items", [[1, 2]], np.zeros((2, 8))), "shape (1, 2, 8)"),
    ("put", ("items", [1, 1], np.zeros((2, 8))), "duplicate id 1"),
    ("put", ("items", [1], np.zeros((1, 7))), "shape (1, 8)"),
    ("put", ("items", [1], np.zeros((1, 8), dtype=np.int32)), "dtype int32"),
    ("put", ("items", [1], np.full((1, 8), np.inf)), "non-finite"),
    ("apply_gradient", ("items", [1, 2], np.array([[0] * 8, [np.nan] * 8], dtype=np.float32)), "non-finite"),
    ("apply_gradient", ("items", [1, 1], np.full((2, 8), 3e38, dtype=np.float32)), "non-finite"),
])
def test_bad_input_is_named_and_changes_nothing(cluster, call, args, words):
    c, client = cluster
    before = everything(client)
    with pytest.raises(ectable.InvalidRequest) as err:
        getattr(client, call)(*args)
    assert isinstance(err.value, ValueError) and isinstance(err.value, ectable.Error)
    assert words in str(err.value) and repr(args[0]) in str(err.value)
    assert same(before, everything(client))
    assert all(c.state(p) == "up" for p in range(5))


def test_multi_table_batches(cluster):
    _, client = cluster
    out = client.get_many({"items": [1, 2], "users": [7]})
    assert out["items"].shape == (2, 8) and out["users"].shape == (1, 4)
    before = everything(client)
    with pytest.raises(ectable.InvalidRequest):
        client.apply_gradient_many({"items": ([1], np.ones((1, 8))), "users": ([400], np.ones((1, 4)))})
    assert same(before, everything(client))
    client.apply_gradient_many({"items": ([1], np.ones((1, 8))), "users": ([7], np.ones((1, 4)))})
    assert not same(before, everything(client))


def test_whole_records_read_and_written_for_many_tables(cluster):
    c, client = cluster
    client.apply_gradient_many({"items": ([4, 9], np.ones((2, 8))), "users": ([2], np.ones((1, 4)))})
    records = client.get_many({"items": [[9, 4]], "users": [2, 2]}, records=True)
    assert records["items"].shape == (1, 2, 9) and records["users"].shape == (2, 8)  # weights, then state
    assert (records["items"][0, :, 8] > 0).all() and (records["users"][:, 4:] > 0).all()
    np.testing.assert_array_equal(records["items"][0, :, :8], client.get("items", [9, 4]))
    before = everything(client)
    for bad, words in [({"items": ([1], np.zeros((1, 8)))}, "shape (1, 9)"), ({"items": [1]}, "expected (ids, rows)"),
                       ({"items": ([1], np.zeros((1, 9))), "users": ([1, 1], np.zeros((2, 8)))}, "duplicate id 1"),
                       ({"items": ([1], np.full((1, 9), np.nan))}, "non-finite")]:
        with pytest.raises(ectable.InvalidRequest, match=words.replace("(", r"\(").replace(")", r"\)")):
            client.put_many(bad, records=True)
    assert same(before, everything(client))
    client.put_many({"items": ([4], records["items"][0, :1]), "users": ([3], records["users"][:1])}, records=True)
    after = client.get_many({"items": [4, 9], "users": [3]}, records=True)
    np.testing.assert_array_equal(after["items"], records["items"][0, [0, 0]])  # row 4 now holds row 9's record
    np.testing.assert_array_equal(after["users"], records["users"][:1])
    client.flush()
    check_parity(c, client)


def test_create_table_is_idempotent_and_checked(cluster):
    _, client = cluster
    client.create_table("items", num_rows=1000, dim=8, optimizer="rowwise_adagrad", lr=0.05, seed=1)
    for bad in [dict(num_rows=1000, dim=9, seed=1, optimizer="rowwise_adagrad", lr=0.05),
                dict(num_rows=0, dim=8), dict(num_rows=10, dim=8, optimizer="lamb"),
                dict(num_rows=10, dim=8, init="ones"), dict(num_rows=10, dim=8, lr=-1.0)]:
        with pytest.raises(ectable.InvalidRequest):
            client.create_table("items" if bad.get("dim") == 9 else "x", **bad)
    assert set(client.tables()) == {"items", "users"}


def train(client, rng, steps, kill=None, at=None):
    for s in range(steps):
        if kill is not None and s == at:
            kill()
        for table, rows, dim in (("items", 1000, 8), ("users", 333, 4)):
            ids = rng.zipf(1.3, 64) % rows
            client.get(table, ids)
            client.apply_gradient(table, ids, rng.standard_normal((64, dim)).astype(np.float32))
        if s % 3 == 2:
            client.step()


@pytest.mark.parametrize("code,k,r,spares,kills", [
    ("xor", 4, 1, 1, [2]), ("xor", 4, 1, 0, [0]), ("rs", 3, 2, 2, [1, 4]), ("rs", 3, 2, 0, [0, 3]), ("rs", 4, 2, 1, [5, 2])])
def test_kills_mid_window_lose_nothing(code, k, r, spares, kills):
    def run(kill_nodes):
        with ectable.LocalCluster(nodes=k + r + 1, code=code, k=k, r=r, spares=spares, processes=False) as c:
            client = c.connect()
            client.create_table("items", num_rows=1000, dim=8, optimizer="rowwise_adagrad", lr=0.05)
            client.create_table("users", num_rows=333, dim=4, optimizer="adagrad", lr=0.1)
            rng = np.random.default_rng(0)
            train(client, rng, 4)
            for n in kill_nodes:
                if n is not None:
                    c.kill(n)
                train(client, rng, 4)  # degraded reads, writes to lost rows, on-demand rebuild
            state = everything(client)
            if sum(n is not None for n in kill_nodes) <= spares:
                client.wait_recovered(timeout=60)
                assert same(everything(client), state)
                client.flush()
                check_parity(c, client)
            return state
    assert same(run([None] * len(kills)), run(kills))


def test_more_than_r_failures_are_unavailable_for_lost_stripes_only():
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, processes=False) as c:
        client = c.connect()
        client.create_table("t", num_rows=100, dim=2)
        c.kill(0)
        c.kill(1)
        layout = client._table("t")[1]
        ids = np.arange(100)
        slots = layout.slot_node(layout.stripe(ids)[:, None], np.arange(5))
        lost_stripe = ((slots == 0) | (slots == 1)).sum(axis=1) == 2
        doomed = ids[lost_stripe & np.isin(layout.data_node(ids), [0, 1])]
        fine = ids[~np.isin(layout.data_node(ids), [0, 1])]
        with pytest.raises(ectable.Unavailable):
            client.get("t", doomed[:1])
        client.get("t", fine)
        with pytest.raises(ectable.Unavailable):
            client.wait_recovered(timeout=1)


def test_status_reports_roles_lag_and_recovery(cluster):
    c, client = cluster
    client.apply_gradient("items", [1, 2, 3], np.ones((3, 8)))
    st = client.status()
    assert st["dirty_rows"] == 3 and st["parity_lag_writes"] >= 1
    assert [n["role"] for n in st["nodes"]] == ["active"] * 5 and st["spares"] == 1
    c.kill(3)
    client.get("items", [0])  # touches node 0 only
    client.get("items", np.arange(1000))  # touches node 3: fail over to the spare
    st = client.status()
    assert st["nodes"][3]["role"] == "rebuilding" and st["recovery"]["rebuilding"] == [3] and st["spares"] == 0
    progress = st["nodes"][3]["rebuild"]
    assert progress["left"] == st["recovery"]["rows_left"] > 0 and progress["done"] >= 0
    text = render(st)  # what `ectable status --watch` draws
    assert "node 3 rebuilding [" in text and f"/ {progress['done'] + progress['left']:,} rows" in text
    client.wait_recovered(timeout=60)
    st = client.status()
    assert st["recovery"]["rebuilding"] == [] and st["recovery"]["rows_left"] == 0 and st["degraded"] == []
    last = st["nodes"][3]["last_rebuild"]  # what the rebuild took, kept once it ended
    assert last["rows"] == progress["done"] + progress["left"] and 0 <= last["pulling"] <= last["seconds"]
    assert [n["last_rebuild"] for n in st["nodes"] if n["position"] != 3] == [None] * 4


def test_deltas_apply_exactly_once_even_duplicated_and_reordered():
    with ectable.LocalCluster(nodes=5, code="rs", k=3, r=2, processes=False) as c:
        client = c.connect()
        client.create_table("t", num_rows=90, dim=3)
        held = []
        deliver = c._deliver
        c._deliver = lambda node=None: held.extend((n, *m) for n in c._nodes for m in n.take_outbox())
        rng = np.random.default_rng(3)
        for _ in range(3):
            client.apply_gradient("t", rng.integers(0, 90, 20), rng.standard_normal((20, 3)))
            client.step()
        msgs = held + held[::-1] + held  # every message three times, in two orders
        acked = set()
        while len(acked) < len(held):  # like a sender, resend what is not acknowledged yet
            rng.shuffle(msgs)
            for src, target, header, arrays in msgs:
                reply, _ = c.node(target).handle(header, arrays)
                if "ack" in reply:
                    assert reply["ack"] == header["seq"]
                    src.acked(target, reply["ack"])
                    acked.add((src.source, target, header["seq"]))
                else:
                    assert reply["error"] == "out_of_order"
        c._deliver = deliver
        client.flush()
        check_parity(c, client)


@settings(max_examples=200)
@given(header=st.one_of(st.none(), st.integers(), st.text(), st.dictionaries(
    st.sampled_from(["op", "table", "source", "seq", "clients", "tables", "spec", "kind", "limit", "committed", "records", "parts"]),
    st.one_of(st.sampled_from(["get", "get_many", "write", "delta", "restore", "create_table", "t", "step", "get_parity", "sync"]),
              st.integers(-5, 5), st.text(max_size=3), st.lists(st.sampled_from(["t", "u"]), max_size=2), st.none()))),
    arrays=st.lists(st.sampled_from([np.array([1, 2]), np.zeros((2, 3), np.float32), np.zeros((1, 12), np.uint8),
                                     np.array([np.nan]), np.array(["x"]), np.zeros((0,))]), max_size=4))
def test_nodes_survive_garbage_requests(header, arrays):
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, processes=False) as c:
        client = c.connect()
        client.create_table("t", num_rows=10, dim=3)
        before = everything(client)
        for p in range(5):
            reply, out = c.node(p).handle(header, arrays)
            assert isinstance(reply, dict)
        c._deliver()
        if not (isinstance(header, dict) and header.get("op") in ("write", "delta")):
            assert same(before, everything(client))
        client.flush()
        check_parity(c, client)


def test_two_clients_share_what_is_not_yet_durable():
    def run(kill):
        with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=1, processes=False) as c:
            a = c.connect()
            a.create_table("t", num_rows=100, dim=2, optimizer="adagrad", init="zeros")
            b = c.connect()
            rows = [i for i in range(100) if a._table("t")[1].data_node(i) == 2][:3]
            a.apply_gradient("t", rows, np.ones((3, 2)))
            b.apply_gradient("t", rows[:2], np.full((2, 2), 2.0))
            if kill:
                c.kill(2)
            b.put("t", rows[2:], np.full((1, 2), 7.0))  # b notices; a's writes must be replayed first
            a.apply_gradient("t", rows, np.ones((3, 2)))
            b.status()
            a.wait_recovered(timeout=30)
            return read_records(b, "t", np.arange(100))
    np.testing.assert_array_equal(run(False), run(True))


def test_a_write_that_cannot_be_served_changes_nothing():
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, processes=False) as c:
        client = c.connect()
        client.create_table("t", num_rows=100, dim=2, init="zeros")
        layout = client._table("t")[1]
        c.kill(0)
        c.kill(1)
        stripe0 = np.arange(4)
        live = stripe0[~np.isin(layout.data_node(stripe0), [0, 1])]
        with pytest.raises(ectable.Unavailable):
            client.put("t", stripe0, np.ones((4, 2)))
        np.testing.assert_array_equal(client.get("t", live), np.zeros((live.size, 2)))


def test_a_replacement_with_nothing_to_rebuild_is_up_at_once():
    with ectable.LocalCluster(nodes=8, code="xor", k=2, r=1, spares=1, processes=False) as c:
        client = c.connect()
        client.create_table("t", num_rows=4, dim=2)  # 2 stripes: most nodes hold only padding
        idle = next(p for p in range(8) if client._table("t")[1].rows_on(p).size == 0
                    and p not in client._table("t")[1].slot_node(np.arange(2)[:, None], np.arange(3)))
        c.kill(idle)
        client.wait_recovered(timeout=5)
        assert c.state(idle) == "up"


@pytest.mark.parametrize("init", [{"init": "normal", "std": np.inf}, {"init": "uniform", "low": -np.inf, "high": 0.0},
                                  {"init": "normal", "mean": np.nan}])
def test_non_finite_initialiser_parameters_are_refused(cluster, init):
    _, client = cluster
    with pytest.raises(ectable.InvalidRequest, match="finite"):
        client.create_table("bad", num_rows=10, dim=2, **init)


@pytest.mark.parametrize("processes", [False, True])
def test_a_write_to_many_tables_reaches_a_replaced_node(processes):
    """A write naming more tables than the failover retries of one node meets a spare that has
    rebuilt none of them: each table's rows are rebuilt in turn and nothing is lost."""
    tables = [f"t{i}" for i in range(24)]  # more than 4 x 5 nodes

    def run(kill):
        with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=1, processes=processes and kill,
                                  rebuild_batch=8, rebuild_share=0.01) as c:  # a spare that rebuilds slowly
            client = c.connect()
            for t in tables:
                client.create_table(t, num_rows=64, dim=4, optimizer="rowwise_adagrad", lr=0.05, init="normal")
            rng = np.random.default_rng(0)
            for n in range(4):
                if kill and n == 2:
                    c.kill(2)
                batch = {t: rng.integers(0, 64, 40) for t in tables}
                if n != 2:  # right after the kill, a write that reads nothing first
                    client.get_many(batch)
                client.apply_gradient_many({t: (ids, rng.standard_normal((40, 4)).astype(np.float32))
                                            for t, ids in batch.items()})
                client.step()
            client.flush()
            state = everything(client)
            if kill:
                client.wait_recovered(timeout=60)
                check_parity(c, client)
            return state
    assert same(run(False), run(True))


@pytest.mark.parametrize("processes", [False, True], ids=["in-process", "processes"])
def test_a_client_used_after_close_raises_client_closed(tmp_path, processes):
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, processes=processes) as c:
        client = c.connect()
        client.create_table("t", num_rows=10, dim=2)
        clients = [client]
        if processes:  # one that owns its connection (sockets, map) too
            toml = tmp_path / "cluster.toml"
            toml.write_text(ectable.config.dumps(c.describe()))
            clients.append(ectable.connect(str(toml)))
        for cl in clients:
            cl.close()
            cl.close()  # twice is fine
            for call, args in [("get", ("t", [1])), ("put", ("t", [1], np.zeros((1, 2)))), ("step", ()),
                               ("flush", ()), ("status", ()), ("tables", ()), ("create_table", ("u", 5, 2))]:
                with pytest.raises(ectable.Error, match="^client closed$"):
                    getattr(cl, call)(*args)
