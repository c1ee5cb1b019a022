"""drop_table: frees a table on every node with its parity; racing drops, creates, writes and kills."""
import gc
import threading
import weakref

import numpy as np
import pytest

import ectable
from ectable.storage.node import Node
from ectable.testing import check_parity, read_records


def table_rows(client) -> list:
    return [node.get("data_rows", 0) + node.get("parity_rows", 0) for node in client.status()["nodes"]]


@pytest.mark.parametrize("processes", [False, True], ids=["in-process", "processes"])
def test_a_dropped_table_is_gone_everywhere_and_its_name_not_used_again(processes):
    with ectable.LocalCluster(nodes=5, code="rs", k=3, r=2, processes=processes) as cluster:
        client, other = cluster.connect(), cluster.connect()
        client.create_table("t", num_rows=3000, dim=8, optimizer="adagrad", lr=0.1, init="normal", seed=1)
        client.create_table("u", num_rows=500, dim=4, init="zeros")
        ids = np.arange(3000)
        client.apply_gradient("t", ids, np.ones((3000, 8), np.float32))
        client.put("u", [3], np.ones((1, 4)))
        before = table_rows(client)
        client.drop_table("t")
        assert sum(table_rows(client)) < sum(before)  # rows and parity rows freed
        assert set(other.tables()) == {"u"}  # the other client had it cached: tables() asks the nodes
        for c in (client, other):  # the nodes say it is gone
            with pytest.raises(ectable.InvalidRequest, match="'t'"):
                c.get("t", [1])
        with pytest.raises(ectable.InvalidRequest, match="no table 't' to drop"):
            other.drop_table("t")
        with pytest.raises(ectable.InvalidRequest, match="'t' was dropped"):  # clients may still know it
            other.create_table("t", num_rows=100, dim=2, init="zeros")
        other.create_table("t2", num_rows=100, dim=2, init="zeros")
        np.testing.assert_array_equal(client.get("t2", np.arange(100)), np.zeros((100, 2), np.float32))
        np.testing.assert_array_equal(client.get("u", [3]), np.ones((1, 4), np.float32))
        client.flush()
        check_parity(cluster, client)


def test_a_late_copy_of_a_tables_create_does_not_bring_it_back_on_a_node():
    """A create that reaches a node after the table's drop (a duplicate delayed in the network: the node answered
    the first copy) is refused: the name is not used again. Before, the node created the table again and listed
    it (simulation seed rs 1271)."""
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, processes=False) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=100, dim=2, init="zeros")
        create = {"op": "create_table", "spec": client._table("t")[0].get_config()}
        client.drop_table("t")
        reply, _ = cluster.channel(1).call(create, [], 5.0)
        assert reply.get("error") == "invalid" and "'t' was dropped" in reply["message"]
        assert client.tables() == {} and [n["tables"] for n in client.status()["nodes"]] == [0] * 5


def test_racing_drops_one_wins_and_a_create_of_the_name_is_refused():
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, processes=False) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=100, dim=2, init="zeros")
        store = cluster.store
        writer = cluster.writer_id()
        assert store.drop_table("t", writer) and not store.drop_table("t", writer)  # of racing drops, one wins
        with pytest.raises(ectable.InvalidRequest, match="being dropped"):
            client.create_table("t", num_rows=100, dim=2, init="zeros")
        store.table_dropped("t")
        assert store.claim_table({"name": "t", "x": 1}) is None and not store.drop_table("t", writer)
        client.create_table("u", num_rows=100, dim=2, init="zeros")
        assert store.drop_table("u", "a-writer-that-died")  # its drop stopped half way
        client.drop_table("u")  # taken over: a drop whose writer is gone does not block the table forever
        with pytest.raises(ectable.InvalidRequest, match="'u'"):
            client.get("u", [1])


def test_writes_racing_with_a_drop_land_before_it_or_are_refused_and_a_kill_during_it_loses_nothing(tmp_path):
    """A trainer keeps writing two tables while another client drops one and a node is SIGKILLed: each write
    to the dropped table succeeds (before the drop reached its node) or is refused naming the table; the
    other table equals a model throughout, the spare never gets the dropped table, and a table created
    afterwards starts from its initial values with exact parity."""
    with ectable.LocalCluster(nodes=5, code="rs", k=3, r=2, spares=1) as cluster, \
            ectable.LocalCluster(nodes=1, code="none", k=1, r=0, processes=False) as reference:
        toml = tmp_path / "cluster.toml"
        toml.write_text(ectable.config.dumps(cluster.describe()))
        trainer, dropper, ref = cluster.connect(), ectable.connect(str(toml)), reference.connect()  # two processes' worth
        for c in (trainer, ref):
            c.create_table("keep", num_rows=2000, dim=4, optimizer="adagrad", lr=0.1, init="uniform", seed=3)
        trainer.create_table("gone", num_rows=2000, dim=4, init="zeros")
        rng = np.random.default_rng(4)
        refused, rounds, stop = [], [], threading.Event()

        def train():
            while not stop.is_set():
                ids = rng.choice(2000, 300, replace=False)
                grads = rng.standard_normal((300, 4)).astype(np.float32)
                for c in (trainer, ref):
                    c.apply_gradient("keep", ids, grads)
                try:
                    trainer.put("gone", ids, np.ones((300, 4)))
                except ectable.InvalidRequest as exc:
                    assert "'gone'" in str(exc)
                    refused.append(exc)
                trainer.step()
                rounds.append(1)
        thread = threading.Thread(target=train)
        thread.start()
        try:
            while len(rounds) < 3:
                stop.wait(0.01)
            cluster.kill(2)
            dropper.drop_table("gone")
            done = len(rounds)
            while len(rounds) < done + 3 and thread.is_alive():  # the trainer goes on after the drop
                stop.wait(0.01)
        finally:
            stop.set()
            thread.join(60)
        assert thread.is_alive() is False and refused  # writes after the drop were refused
        trainer.wait_recovered(timeout=60)
        dropper.close()
        tables = [set(t["name"] for t in trainer._call(p, {"op": "tables"}, [])[0]["tables"]) for p in range(5)]
        assert tables == [{"keep"}] * 5  # the spare at 2 included
        ids = np.arange(2000)
        np.testing.assert_array_equal(read_records(trainer, "keep", ids), read_records(ref, "keep", ids))
        trainer.create_table("new", num_rows=2000, dim=4, init="normal", seed=9)
        np.testing.assert_array_equal(trainer.get("new", ids), _initial(ids))
        trainer.flush()
        check_parity(cluster, trainer)


def _initial(ids):
    """The rows of a freshly created "new" as an in-process cluster computes them."""
    with ectable.LocalCluster(nodes=1, code="none", k=1, r=0, processes=False) as fresh:
        c = fresh.connect()
        c.create_table("new", num_rows=2000, dim=4, init="normal", seed=9)
        return c.get("new", ids)


@pytest.mark.parametrize("code,r", [("xor", 1), ("rs", 2)])
def test_deltas_still_queued_for_a_dropped_table_go_and_the_rest_of_their_messages_fold(code, r, monkeypatch):
    """A node drops a table while delta messages naming it and other tables wait in its queue (and in its
    retained windows): the other tables' rows of those messages still reach parity, exactly."""
    with ectable.LocalCluster(nodes=4 + r, code=code, k=4, r=r, processes=False, window_rows=1 << 20) as cluster:
        client = cluster.connect()
        rng = np.random.default_rng(5)
        for name in ("a", "b", "c"):
            client.create_table(name, num_rows=3000, dim=4, optimizer="adagrad", init="normal", seed=ord(name))
        client.create_table("wide", num_rows=500, dim=12)  # another width: a message of two entries
        with monkeypatch.context() as patch:
            patch.setattr(Node, "apply_queued", lambda self: None)  # nothing folds: every message stays queued
            for _ in range(3):
                for name in ("a", "b", "c"):
                    ids = rng.choice(3000, 400, replace=False)
                    client.apply_gradient(name, ids, rng.normal(size=(400, 4)).astype(np.float32))
                client.put("wide", [7], np.ones((1, 12), np.float32))
                client.step()
            client.get_many({"a": [0]})  # the last step goes out
            nodes = [cluster.node(p) for p in range(4 + r)]
            named = [e for node in nodes for e in node.queued if "b" in [s.spec.name for s in e.shards]]
            assert len(named) >= 3 and any(len(e.shards) > 1 for e in named)
            client.drop_table("b")
            for node in nodes:
                assert all("b" not in [s.spec.name for s in e.shards] for e in node.queued)
                for log in node.retained.windows.values():
                    assert all("b" not in [s.spec.name for s in e.shards] for _, _, parts, _ in log for e in parts)
        for node in nodes:
            node.apply_queued()
        client.flush()
        check_parity(cluster, client)


def test_a_delta_listing_a_table_dropped_since_its_list_was_last_seen_folds_the_rest_exactly():
    """A node keeps what the table lists of delta messages resolve to; a table of such a list dropped since
    is left out of the next message with that list, and the other table's rows still reach parity."""
    from ectable.protocol import deltas, messages
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, processes=False) as cluster:
        client = cluster.connect()
        for name in ("a", "b"):
            client.create_table(name, num_rows=4000, dim=4, init="zeros")  # parity starts at zero
        node = cluster.node(0)
        shard = node.shards["a"]

        def held(name):  # 50 stripes of `name` whose parity node 0 holds
            layout = node.shards[name].layout
            return np.flatnonzero(layout.slot_on(0, np.arange(layout.num_stripes)) == 4)[:50]
        stripes, other = held("a"), held("b")
        rng = np.random.default_rng(3)

        def send(seq):
            parts = [(s * 4 + 1, rng.integers(0, 256, (s.size, 16), dtype=np.uint8)) for s in (stripes, other)]
            header = {"op": "delta", "source": "node/1/x", "seq": seq, "tables": ["a", "b"]}
            reply, _ = node.dispatch(messages.parse(header), deltas.pack(parts))
            assert reply["ack"] == seq, reply
            return parts[0][1]

        before = node.shards["a"].parity.copy()
        first = send(1)
        dropped = weakref.ref(node.shards["b"])
        client.drop_table("b")
        gc.collect()
        assert dropped() is None  # nothing kept of it, and of its memory
        second = send(2)  # the same list of tables as the first
        assert "b" not in node.shards and all(s.spec.name == "a" for e in node.queued for s in e.shards)
        node.apply_queued()
        local = shard.layout.parity_offset(stripes, 0)
        expected = before.copy()
        expected[local] ^= first ^ second
        assert np.array_equal(node.shards["a"].parity, expected)
