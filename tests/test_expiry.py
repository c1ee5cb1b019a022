"""Bounded memory: what nodes keep per client (marks, applied sequences, replays) expires with the client's
writer's lease, and a writer whose lease lapsed is refused (and refuses itself) from then on."""
import time

import numpy as np
import pytest

import ectable
from ectable.config import ClusterConfig
from ectable.protocol.messages import Applied, Replay, Write
from ectable.storage import node as node_module
from ectable.storage.node import Node
from ectable.storage.table import TableSpec

GRACE = ClusterConfig.writer_grace
SPEC = TableSpec.from_config({"name": "t", "num_rows": 400, "dim": 2, "seed": 0,
                              "optimizer": {"name": "sgd", "lr": 0.1}, "init": {"kind": "zeros"}})


def cluster_of_nodes(now):
    """Five xor(4,1) nodes on the clock `now[0]`, node 0's rows, and a way to write to node 0 and deliver
    its window's deltas."""
    config = ClusterConfig(5, "xor", 4, 1)
    nodes = [Node(p, config, clock=lambda: now[0]) for p in range(5)]
    for node in nodes:
        node.handle({"op": "create_table", "spec": SPEC.get_config()}, [])
        node.source = f"node/{node.position}"
    ids = np.flatnonzero(config.layout(SPEC).data_node(np.arange(400)) == 0)

    def write(cid, cseq, row, close=True):
        reply = nodes[0].handle(Write(parts=[["t", "put"]], cid=cid, cseq=cseq).header(),
                                [np.array([row]), np.full((1, 2), cseq, np.float32)])[0]
        if close:
            nodes[0].close_window()
            for target, delta, arrays in nodes[0].take_outbox():
                assert nodes[target].handle(delta, arrays)[0]["ack"] == delta["seq"]
                nodes[0].acked(target, delta["seq"])
        return reply
    return nodes, ids, write


def bookkeeping(node) -> set:
    """Every client id and writer a node keeps something for."""
    cids = {*node.client_marks, *node.closed_marks, *node.client_writes, *node.window_clients}
    for marks in node.applied_clients.values():
        cids |= set(marks)
    return cids | {f"{w}/" for w in (*node.replayed, *node.replay_seqs)}


def test_a_node_forgets_the_clients_of_writers_gone_longer_than_the_grace_and_keeps_live_ones():
    """Node 0 serves 30 short-lived writers (one replays into it too) and one that stays; its parity holders
    get their marks. A grace after the writers left the live set, no node keeps anything of them; the
    live writer's marks stay, and so do those of a writer first seen writing after the last read."""
    now = [100.0]
    nodes, ids, write = cluster_of_nodes(now)
    replay = Replay(replayer="w3", entries=[[None, "w3/r", 1, [["t", "put"]]]]).header()
    assert nodes[0].handle(replay, [ids[:1], np.ones((1, 2), np.float32)])[0]["done"]
    for n in range(30):
        assert "seq" in write(f"w{n}/c", 1, int(ids[n]))
        assert "seq" in write("live/c", n + 1, int(ids[40]))
    assert len(bookkeeping(nodes[0])) == 33 and all(len(bookkeeping(node)) == 32 for node in nodes[1:])
    for node in nodes:
        node.expire_writers({"live"})  # the short-lived writers are gone from the live set from now on
    now[0] += GRACE / 2
    assert "seq" in write("late/c", 1, int(ids[41]), close=False)  # registered after the nodes' last read
    for node in nodes:
        node.expire_writers({"live"})
    assert len(bookkeeping(nodes[0])) == 34  # nothing dropped within the grace
    now[0] += GRACE / 2 + 1
    for node in nodes:
        node.expire_writers({"live"})
    assert bookkeeping(nodes[0]) == {"live/c", "late/c"}
    assert nodes[0].client_marks == {"live/c": 30, "late/c": 1} and nodes[0].window_clients == {"late/c": 1}
    assert nodes[0].replayed == set() and nodes[0].replay_seqs == {}
    for node in nodes[1:]:
        assert bookkeeping(node) == {"live/c"}
        assert node.handle(Applied(source="node/0").header(), [])[0]["clients"] == {"live/c": 30}
    assert nodes[0].status()["clients"] == 2 and nodes[1].status()["clients"] == 1
    now[0] += GRACE
    nodes[0].expire_writers({"live"})
    assert bookkeeping(nodes[0]) == {"live/c"}  # the late writer never showed up live: gone too


def test_a_gone_writers_writes_and_replays_are_refused_and_change_nothing(monkeypatch):
    now = [100.0]
    nodes, ids, write = cluster_of_nodes(now)
    assert "seq" in write("gone/c", 1, int(ids[0]))
    nodes[0].expire_writers(set())
    now[0] += GRACE + 1
    nodes[0].expire_writers(set())
    assert bookkeeping(nodes[0]) == set()
    before, seq = nodes[0].shards["t"].read(ids).copy(), nodes[0].write_seq
    for cseq in (1, 2):  # a retry of an applied write (its mark is gone: it would apply twice) and a new one
        reply = write("gone/c", cseq, int(ids[1]), close=False)
        assert reply["error"] == "expired" and "lease" in reply["message"]
    replay = Replay(replayer="other", entries=[[None, "gone/c", 2, [["t", "put"]]]]).header()
    assert nodes[0].handle(replay, [ids[:1], np.ones((1, 2), np.float32)])[0]["error"] == "expired"
    replay = Replay(replayer="gone", entries=[]).header()
    assert nodes[0].handle(replay, [])[0]["error"] == "expired"
    np.testing.assert_array_equal(nodes[0].shards["t"].read(ids), before)
    assert nodes[0].write_seq == seq and bookkeeping(nodes[0]) == set()
    # marks of the gone writer that another node still sends are not taken back in
    nodes[1].handle(Write(parts=[["t", "put"]], cid="gone/d", cseq=1).header(),
                    [np.array([int(np.flatnonzero(ClusterConfig(5, "xor", 4, 1).layout(SPEC).data_node(
                        np.arange(400)) == 1)[0])]), np.ones((1, 2), np.float32)])
    nodes[1].close_window()
    for target, delta, arrays in nodes[1].take_outbox():
        if target == 0:
            assert nodes[0].handle(delta, arrays)[0]["ack"] == delta["seq"]
    assert bookkeeping(nodes[0]) == set()
    # the record of gone writers is bounded and expires
    monkeypatch.setattr(node_module, "GONE_MAX", 3)
    for n in range(5):
        write(f"x{n}/c", 1, int(ids[2 + n]))
    now[0] += 1
    nodes[0].expire_writers(set())
    now[0] += GRACE + 1
    nodes[0].expire_writers(set())
    assert len(nodes[0].gone) == 3
    now[0] += node_module.GONE_SECONDS + 1
    nodes[0].expire_writers(set())
    assert nodes[0].gone == {}


def test_a_client_whose_writer_nodes_forgot_gets_a_clear_error_in_process():
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, processes=False) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=100, dim=2, init="zeros")
        client.put("t", [1, 2, 3], np.ones((3, 2), np.float32))
        assert client.cid.startswith(cluster.writer_id() + "/")
        client.flush()
        with cluster.lock:  # (the window timer takes turns with callers under it)
            for p in range(5):  # as if its writer had been gone from the live set for longer than the grace
                node = cluster.node(p)
                node.expire_writers(set())
                node.clock = lambda: time.monotonic() + 10 * GRACE
                node.expire_writers(set())
        with pytest.raises(ectable.Error, match="lease expired"):
            client.put("t", [1], np.full((1, 2), 5, np.float32))
        np.testing.assert_array_equal(client.get("t", [1, 2, 3]), np.ones((3, 2), np.float32))


def test_an_in_process_writer_stays_live():
    """In process the writer lives as long as the nodes (no lease to lapse): its marks are never dropped."""
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, processes=False) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=100, dim=2, init="zeros")
        client.put("t", [1, 2, 3], np.ones((3, 2), np.float32))
        assert cluster.writer_id() in cluster.store.writers()
        node = next(cluster.node(p) for p in range(5) if cluster.node(p).client_marks)
        with cluster.lock:
            cluster.store.membership.clock = lambda: time.monotonic() + 7200.0  # two hours on
            node.expire_writers(cluster.store.writers())
            node.clock = lambda: time.monotonic() + 7200.0 + GRACE
            node.expire_writers(cluster.store.writers())
        assert client.cid in node.client_marks


@pytest.mark.timeout(240)
def test_clients_that_write_and_close_leave_bounded_bookkeeping_and_a_later_kill_loses_nothing(tmp_path):
    """Real processes: 12 client processes' worth (each its own writer) write and close, one after another,
    while a client that stays writes too. A grace after, every node keeps the marks of the staying client
    only; then a node is SIGKILLed, and every record still equals the model's."""
    from ectable.testing import ReferenceTable, read_records

    grace = 6.0
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=1, writer_grace=grace) as cluster:
        toml = tmp_path / "cluster.toml"
        toml.write_text(ectable.config.dumps(cluster.describe()))
        stays = cluster.connect()
        stays.create_table("t", num_rows=800, dim=4, optimizer="adagrad", lr=0.1, init="normal", seed=3)
        model = ReferenceTable(stays._table("t")[0])
        rng = np.random.default_rng(7)
        for n in range(12):
            client = ectable.connect(str(toml))
            for who in (client, stays):
                ids = rng.integers(0, 800, 200)
                grads = rng.standard_normal((200, 4)).astype(np.float32)
                who.apply_gradient("t", ids, grads)
                model.apply_gradient(ids, grads)
            client.close()
        counts = [n["clients"] for n in stays.status()["nodes"]]
        assert max(counts) > 1  # the closed clients' marks are still there (within the grace)
        deadline = time.monotonic() + 20 * grace
        while any(n["clients"] > 1 for n in stays.status()["nodes"]):
            assert time.monotonic() < deadline, f"nodes still keep clients: {stays.status()['nodes']}"
            time.sleep(0.25)
        ids = rng.integers(0, 800, 200)
        grads = rng.standard_normal((200, 4)).astype(np.float32)
        stays.apply_gradient("t", ids, grads)  # a live writer's marks stay: its writes go on once each
        model.apply_gradient(ids, grads)
        cluster.kill(2)
        stays.wait_recovered(timeout=120)
        ids = np.arange(800)
        np.testing.assert_array_equal(stays.get("t", ids), model.get(ids))
        assert all(n["clients"] <= 1 for n in stays.status()["nodes"])
        expect = np.stack([model.record(i) for i in ids.tolist()])
        np.testing.assert_array_equal(read_records(stays, "t", ids), expect)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["revoked", "no keep-alive answers"])
def test_a_writer_whose_lease_lapsed_refuses_writes_and_a_new_connection_writes(tmp_path, how):
    """A writer whose lease was revoked (the store expired it), or whose keep-alives got no answer for the
    lease's time plus half the writer grace, fences itself: its clients' writes raise an Error saying so
    and change nothing; a client connected afresh writes."""
    from ectable.cluster.maps import WRITER_TTL
    from ectable.membership import MembershipUnavailable

    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, writer_grace=6.0) as cluster:
        toml = tmp_path / "cluster.toml"
        toml.write_text(ectable.config.dumps(cluster.describe()))
        reader = cluster.connect()
        reader.create_table("t", num_rows=100, dim=2, init="zeros")
        client = ectable.connect(str(toml))
        client.put("t", [1], np.ones((1, 2), np.float32))
        keeper = client.cluster._keeper
        if how == "revoked":
            cluster.store.membership.revoke(keeper.lease)
        else:
            def unanswered(lease):
                raise MembershipUnavailable("no answer (test)")
            keeper.store.membership.keepalive = unanswered
        deadline, value = time.monotonic() + 10 * WRITER_TTL, 1.0
        with pytest.raises(ectable.Error, match="lease expired.*connect again"):
            while time.monotonic() < deadline:
                value += 1
                client.put("t", [1], np.full((1, 2), value, np.float32))
                time.sleep(0.05)
        np.testing.assert_array_equal(reader.get("t", [1]), np.full((1, 2), value - 1, np.float32))
        client.close()
        again = ectable.connect(str(toml))
        again.put("t", [2], np.ones((1, 2), np.float32))
        np.testing.assert_array_equal(reader.get("t", [1, 2]), [[value - 1] * 2, [1, 1]])
        again.close()
