"""Issue 12, durability: what an acknowledged write survives, with no help from the client that wrote it."""
import subprocess
import sys

import numpy as np
import pytest

import ectable
from ectable import clock
from ectable.storage.initializers import init_rows
from ectable.testing import ReferenceTable, check_parity

pytestmark = pytest.mark.timeout(240)

ROWS, DIM = 2000, 8


def _wait_parity_caught_up(client, timeout=10.0):
    """Poll status() (which never closes a window) until every node's parity holds every write."""
    deadline = clock.monotonic() + timeout
    while True:
        status = client.status()
        if status["parity_lag_writes"] == 0 and status["unacked_deltas"] == 0:
            return
        assert clock.monotonic() < deadline, (f"parity still lags after {timeout} s with no client "
                                                    f"action: {status['parity_lag_writes']} writes")
        clock.sleep(0.02)


def _batches(seed, n=6, batch=300):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, ROWS, batch), rng.standard_normal((batch, DIM)).astype(np.float32)) for _ in range(n)]


@pytest.mark.parametrize("processes", [True, False], ids=["processes", "in-process"])
def test_idle_windows_close_on_their_own(processes):
    """Writes and then nothing (no step, no flush): each node's timer closes its window, and the parity
    equals a fresh encode of the data without any client request that closes windows."""
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, processes=processes) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=ROWS, dim=DIM, optimizer="adagrad", lr=0.1, init="normal", seed=1)
        for ids, grads in _batches(5):
            client.apply_gradient("t", ids, grads)
        assert client.status()["parity_lag_writes"] > 0  # nothing closed the windows yet
        _wait_parity_caught_up(client)
        check_parity(cluster, client)


WRITER = """
import os, sys, numpy as np, ectable
client = ectable.connect(sys.argv[1])
data = np.load(sys.argv[2])
for n in range(len(data.files) // 2):
    client.apply_gradient("t", data[f"ids{n}"], data[f"grads{n}"])
print("WROTE", flush=True)
os._exit(0)  # gone without step(), flush() or close(): its redo log goes with it
"""


@pytest.mark.parametrize("code", ["xor", "rs"])
def test_idle_windows_a_writer_that_exits_loses_nothing(tmp_path, code):
    """A trainer process applies acknowledged writes and exits at once. Once its windows closed on their
    own, any r nodes holding those rows are SIGKILLed one after the other: every row still equals a
    failure-free run, weights and optimizer state."""
    k, r = (4, 1) if code == "xor" else (4, 2)
    with ectable.LocalCluster(nodes=k + r + 1, code=code, k=k, r=r, spares=r) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=ROWS, dim=DIM, optimizer="adagrad", lr=0.1, init="normal", seed=2)
        batches = _batches(7)
        np.savez(tmp_path / "writes.npz", **{f"{name}{n}": a for n, b in enumerate(batches)
                                             for name, a in zip(("ids", "grads"), b)})
        toml = tmp_path / "cluster.toml"
        toml.write_text(ectable.config.dumps(cluster.describe()))
        writer = subprocess.run([sys.executable, "-c", WRITER, str(toml), str(tmp_path / "writes.npz")],
                                capture_output=True, text=True, timeout=120)
        assert writer.stdout.strip() == "WROTE", writer.stderr[-3000:]

        model = ReferenceTable(client._table("t")[0])
        for ids, grads in batches:
            model.apply_gradient(ids, grads)
        _wait_parity_caught_up(client)
        for victim in range(r):  # data nodes of written rows, killed back to back
            cluster.kill(victim)
        client.wait_recovered(timeout=120)

        ids = np.arange(ROWS)
        expect = init_rows(model.spec.init, model.spec.seed, "t", ids, DIM)
        touched = np.array(sorted(model.rows), dtype=np.int64)
        expect[touched] = np.stack([model.rows[i][:DIM] for i in touched.tolist()])
        got = client.get("t", ids)
        bad = np.flatnonzero((got.view(np.uint32) != expect.view(np.uint32)).any(axis=1))
        assert bad.size == 0, f"{bad.size} rows lost their acknowledged writes, first {bad[:10].tolist()}"
        client.flush()
        check_parity(cluster, client)


CREATOR = """
import sys, ectable
client = ectable.connect(sys.argv[1]); dim = int(sys.argv[2])
print("READY", flush=True)
for line in sys.stdin:
    name = line.strip()
    try:
        client.create_table(name, num_rows=400, dim=dim, optimizer="adagrad", seed=dim)
        print("WON", flush=True)
    except ectable.InvalidRequest as exc:
        print("LOST " + str(exc).replace("\\n", " "), flush=True)
"""


def test_concurrent_create_table_one_definition_wins_everywhere(tmp_path):
    """Two client processes create each of 10 tables at the same moment, with different definitions:
    exactly one wins each race, on every node; the other gets a clear error; every table then works,
    a node SIGKILL and its rebuild included."""
    from ectable.protocol.messages import Tables
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=1) as cluster:
        client = cluster.connect()
        toml = tmp_path / "cluster.toml"
        toml.write_text(ectable.config.dumps(cluster.describe()))
        creators = [subprocess.Popen([sys.executable, "-c", CREATOR, str(toml), str(dim)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True) for dim in (2, 3)]
        try:
            assert [c.stdout.readline().strip() for c in creators] == ["READY"] * 2
            winners = {}
            for n in range(10):
                for c in creators:
                    c.stdin.write(f"race{n}\n")
                    c.stdin.flush()
                answers = [c.stdout.readline().strip() for c in creators]
                assert sorted(a.split()[0] for a in answers) == ["LOST", "WON"], answers
                lost = next(a for a in answers if a.startswith("LOST"))
                assert f"'race{n}'" in lost and "different definition" in lost and "dim" in lost, lost
                winners[f"race{n}"] = (2, 3)[answers.index("WON")]
        finally:
            for c in creators:
                c.stdin.close()
                c.wait(30)
        for p in range(5):  # every node holds the winner's definition
            tables = {t["name"]: t for t in cluster.channel(p).call(Tables().header(), [], 10.0)[0]["tables"]}
            assert {name: tables[name]["dim"] for name in winners} == winners
        rng = np.random.default_rng(3)
        models = {}
        for name, dim in winners.items():
            spec = client._table(name)[0]
            assert spec.dim == dim
            models[name] = ReferenceTable(spec)
            ids = rng.integers(0, 400, 200)
            grads = rng.standard_normal((200, dim)).astype(np.float32)
            client.apply_gradient(name, ids, grads)
            models[name].apply_gradient(ids, grads)
        cluster.kill(2)
        client.wait_recovered(timeout=120)
        for name, model in models.items():
            touched = np.array(sorted(model.rows), dtype=np.int64)
            np.testing.assert_array_equal(client.get(name, touched), model.get(touched))
        client.flush()
        check_parity(cluster, client)


@pytest.mark.parametrize("processes", [True, False], ids=["processes", "in-process"])
def test_large_create_table_does_no_per_row_work_and_gives_the_same_rows(processes):
    """create_table computes no row: each row's initial value (a pure function of seed, table and id) and
    its stripe's parity are computed when first used, so other tables' training never waits for a large
    one. Reads, writes, parity and a rebuild all see exactly the initial values."""
    rows, dim = 200_000, 4
    with ectable.LocalCluster(nodes=5, code="rs", k=3, r=2, spares=1, processes=processes) as cluster:
        client = cluster.connect()
        client.create_table("big", num_rows=rows, dim=dim, optimizer="adagrad", init="normal", seed=9)
        assert sum(n["initial_rows"] for n in client.status()["nodes"]) == rows  # nothing computed
        model = ReferenceTable(client._table("big")[0])
        rng = np.random.default_rng(4)
        ids = rng.integers(0, rows, 3000)
        np.testing.assert_array_equal(client.get("big", ids), init_rows(model.spec.init, 9, "big", ids, dim))
        grads = rng.standard_normal((3000, dim)).astype(np.float32)
        client.apply_gradient("big", ids, grads)
        model.apply_gradient(ids, grads)
        left = sum(n["initial_rows"] for n in client.status()["nodes"])
        assert rows - np.unique(ids).size - 1 <= left < rows  # only what was used was computed
        client.flush()
        cluster.kill(1)
        client.wait_recovered(timeout=120)  # the spare rebuilds every row, computed or not, from the others
        sample = np.concatenate([np.unique(ids), rng.integers(0, rows, 3000)])
        np.testing.assert_array_equal(client.get("big", sample), model.get(sample))
        check_parity(cluster, client)


def test_a_delta_carries_only_the_marks_of_its_windows_clients():
    """A node that 40 clients wrote to sends, per window, the marks of the clients that wrote in it (a
    target's first delta: of all); its parity holders still know every client's last write (`applied`)."""
    from ectable.config import ClusterConfig
    from ectable.protocol.messages import Applied, Write
    from ectable.storage.node import Node
    from ectable.storage.table import TableSpec

    config = ClusterConfig(5, "xor", 4, 1)
    spec = TableSpec.from_config({"name": "t", "num_rows": 400, "dim": 2, "seed": 0,
                                  "optimizer": {"name": "sgd", "lr": 0.1}, "init": {"kind": "zeros"}})
    nodes = [Node(p, config) for p in range(5)]
    for node in nodes:
        node.handle({"op": "create_table", "spec": spec.get_config()}, [])
        node.source = f"node/{node.position}"
    layout = config.layout(spec)
    ids = np.array([i for i in range(400) if layout.data_node([i])[0] == 0][:40])
    sizes = []
    for n, row in enumerate(ids.tolist()):
        header = Write(parts=[["t", "put"]], cid=f"client-{n}", cseq=1).header()
        assert "seq" in nodes[0].handle(header, [np.array([row]), np.ones((1, 2), np.float32)])[0]
        nodes[0].close_window()
        for target, delta, arrays in nodes[0].take_outbox():
            sizes.append(len(delta["clients"]))
            assert nodes[target].handle(delta, arrays)[0]["ack"] == delta["seq"]
    assert sizes[:4] == [1, 1, 1, 1] and set(sizes[4:]) == {1}  # never the 40 of them
    for target in range(1, 5):
        marks = nodes[target].handle(Applied(source="node/0").header(), [])[0]["clients"]
        assert marks == {f"client-{n}": 1 for n in range(40)}


def test_a_holder_rolls_a_dead_nodes_windows_back_to_the_level_every_holder_has():
    """rs(3,2): node 0's third window reaches every target but node 1. Rolled back to window 2, every
    holder's parity and marks are what they would be had that window reached nobody; a holder cannot go
    below what it keeps, and a fenced sender's late delta is refused."""
    from ectable.config import ClusterConfig
    from ectable.protocol.messages import Applied, Rollback, Write
    from ectable.storage.node import Node
    from ectable.storage.table import TableSpec

    config = ClusterConfig(5, "rs", 3, 2)
    spec = TableSpec.from_config({"name": "t", "num_rows": 600, "dim": 4, "seed": 1,
                                  "optimizer": {"name": "sgd", "lr": 0.1}, "init": {"kind": "normal"}})
    layout = config.layout(spec)
    ids = np.flatnonzero(layout.data_node(np.arange(600)) == 0)

    def run(deliver_last_to):
        nodes = [Node(p, config) for p in range(5)]
        for node in nodes:
            node.handle({"op": "create_table", "spec": spec.get_config()}, [])
            node.source = f"node/{node.position}"
        rng = np.random.default_rng(3)
        for window in range(3):
            header = Write(parts=[["t", "apply_gradient"]], cid="c", cseq=window + 1).header()
            grads = rng.standard_normal((ids.size, 4)).astype(np.float32)
            assert "seq" in nodes[0].handle(header, [ids, grads])[0]
            nodes[0].close_window()
            for target, delta, arrays in nodes[0].take_outbox():
                if window < 2 or target in deliver_last_to:
                    assert nodes[target].handle(delta, arrays)[0]["ack"] == delta["seq"]
                    nodes[0].acked(target, delta["seq"])
        for node in nodes[1:]:
            node.apply_queued()
        return nodes

    nodes, expected = run(deliver_last_to={2, 3, 4}), run(deliver_last_to=set())
    replies = [nodes[q].handle(Applied(source="node/0", fence=True).header(), [])[0] for q in range(1, 5)]
    assert [r["window"] for r in replies] == [2, 3, 3, 3]
    assert [r["kept"] for r in replies] == [1, 2, 2, 2]  # window 2 was acknowledged by all before window 3 closed
    before = nodes[2].shards["t"].parity.copy()
    assert "error" in nodes[2].handle(Rollback(source="node/0", window=1, clients={}).header(), [])[0]
    np.testing.assert_array_equal(nodes[2].shards["t"].parity, before)
    for q in (2, 3, 4):
        reply = nodes[q].handle(Rollback(source="node/0", window=2, clients=replies[0]["clients"]).header(), [])[0]
        assert "error" not in reply
    for q in range(1, 5):
        np.testing.assert_array_equal(nodes[q].shards["t"].parity, expected[q].shards["t"].parity)
        assert nodes[q].handle(Applied(source="node/0").header(), [])[0]["clients"] == {"c": 2}
    late = nodes[0].handle(Write(parts=[["t", "put"]], cid="c", cseq=9).header(), [ids[:1], np.ones((1, 4), np.float32)])
    assert "seq" in late[0]
    nodes[0].close_window()
    target, delta, arrays = nodes[0].take_outbox()[0]
    assert nodes[target].handle(delta, arrays)[0]["error"] == "fenced"


def test_a_parity_restore_read_from_a_node_unaware_of_the_restorer_is_refused():
    """(found by simulation seed xor 819) A data node that has not learned of a spare at position 4 counts the
    deltas it sent to the node there before; a parity row the spare rebuilt from its data at that count
    misses the window the data node sends the spare next. The spare refuses such a restore (stale_cut)."""
    from ectable.config import ClusterConfig
    from ectable.protocol.messages import Get, Restore
    from ectable.storage.node import Node
    from ectable.storage.table import TableSpec

    config = ClusterConfig(5, "xor", 4, 1)
    spec = TableSpec.from_config({"name": "t", "num_rows": 40, "dim": 2, "seed": 0,
                                  "optimizer": {"name": "sgd", "lr": 0.1}, "init": {"kind": "zeros"}})
    layout = config.layout(spec)
    stripe = np.flatnonzero(layout.parity_node(np.arange(layout.num_stripes), 0) == 4)[:1]
    row = int(stripe[0]) * 4 + 0
    data_node = int(layout.data_node(np.array([row]))[0])
    reader, spare = Node(data_node, config), Node(4, config, rebuilding=True)
    for node in (reader, spare):
        node.handle({"op": "create_table", "spec": spec.get_config()}, [])
    reader.sources = {4: "node/4/before"}  # the map it last took: the dead node still at 4
    reply = reader.handle(Get(table="t", committed=True, records=True).header(), [np.array([row])])[0]
    assert reply["peers"] == {"4": "node/4/before"}
    restore = Restore(table="t", kind="parity", cut={reader.source: 0}, seen={reader.source: reply["peers"]["4"]},
                      generation=spare.generation)
    rows = np.zeros((1, spec.width * 4), np.uint8)
    answer = spare.handle(restore.header(), [stripe, rows, np.zeros(1, np.int64)])[0]
    assert answer.get("error") == "stale_cut" and spare.shards["t"].missing_count() > 0
    fresh = Restore(table="t", kind="parity", cut={reader.source: 0}, seen={reader.source: spare.source},
                    generation=spare.generation)
    assert "error" not in spare.handle(fresh.header(), [stripe, rows, np.zeros(1, np.int64)])[0]


def test_a_parity_restore_whose_read_decoded_a_node_that_sent_skipped_deltas_since_is_refused():
    """(found by the rs kill loop, seed 32 and others: "parity 1 of stripe 4 on node 3 is stale") A rebuilding
    spare skips deltas to parity rows it lacks and folds in, at their restore, those newer than the data read.
    A read that decoded a data position (dead then) does not name the node a spare put there since, so its
    skipped deltas (the writes replayed into it) were left out of the restored row. Such a restore is refused
    (stale_cut) and changes nothing, also once the skipped deltas themselves are forgotten (SKIPPED_SECONDS
    later); one whose read names that node folds them in."""
    from ectable.config import ClusterConfig
    from ectable.protocol.messages import Get, Restore, Write
    from ectable.storage.node import SKIPPED_SECONDS, Node
    from ectable.storage.table import TableSpec

    config = ClusterConfig(5, "xor", 4, 1)
    spec = TableSpec.from_config({"name": "t", "num_rows": 80, "dim": 2, "seed": 0,
                                  "optimizer": {"name": "sgd", "lr": 0.1}, "init": {"kind": "zeros"}})
    layout = config.layout(spec)
    stripes = np.flatnonzero(layout.parity_node(np.arange(layout.num_stripes), 0) == 4)
    row = np.array([int(stripes[0]) * 4])
    position = int(layout.data_node(row)[0])
    rows = (stripes[1:, None] * 4 + np.arange(4)).ravel()
    other = rows[layout.data_node(rows) == position][:1]  # a row of the same node in another such stripe
    now = [0.0]
    writer, spare = Node(position, config), Node(4, config, rebuilding=True, clock=lambda: now[0])
    for node in (writer, spare):
        node.handle({"op": "create_table", "spec": spec.get_config()}, [])
    zeros = np.zeros((1, spec.width * 4), np.uint8)  # a row as decoded before the writer's deltas

    def put(ids, value, cseq):
        assert "error" not in writer.handle(Write(parts=[["t", "put"]], cid="c", cseq=cseq).header(),
                                            [ids, np.full((1, 2), value, np.float32)])[0]
        writer.close_window()
        [(delta, arrays)] = [(header, arrays) for target, header, arrays in writer.take_outbox() if target == 4]
        assert "ack" in spare.handle(delta, arrays)[0]

    def restore(ids, cut, seen=None):
        header = Restore(table="t", kind="parity", cut=cut, seen=seen, generation=spare.generation).header()
        return spare.handle(header, [layout.stripe(ids), zeros, np.zeros(1, np.int64)])[0]

    put(row, 1.5, 1)
    put(other, -2.0, 2)
    missing = spare.shards["t"].missing_count()
    assert restore(row, {}).get("error") == "stale_cut" and spare.shards["t"].missing_count() == missing
    assert "error" not in restore(row, {writer.source: 0}, {writer.source: spare.source})
    record = writer.handle(Get(table="t", committed=True, records=True).header(), [row])[1][0]
    np.testing.assert_array_equal(spare.shards["t"].read_parity(layout.stripe(row))[0], record.view(np.uint8))
    now[0] += SKIPPED_SECONDS + 1
    put(row, 3.0, 3)  # a delta after that long: the spare forgets the ones it skipped before
    assert restore(other, {}).get("error") == "stale_cut" and spare.shards["t"].missing_count() == missing - 1
