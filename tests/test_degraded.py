"""Degraded writes (through the parity of a dead position) against a replacement: refused, unchanged,
by a holder that knows of the replacement (the node logic, without transport); holders made ready first."""
import contextlib

import numpy as np

import ectable
from ectable.config import ClusterConfig
from ectable.protocol import deltas as payload
from ectable.protocol.messages import Delta, ErrorCode, Holds, Invalidate
from ectable.testing import check_parity
from ectable.storage.node import Node
from ectable.storage.table import TableSpec

CONFIG = ClusterConfig(5, "xor", 4, 1)
SPEC = TableSpec.from_config({"name": "t", "num_rows": 40, "dim": 2, "seed": 0,
                              "optimizer": {"name": "sgd", "lr": 0.5, "eps": 1e-8}, "init": {"kind": "normal"}})


def holder_of(row):
    """A node holding the parity of `row`'s stripe, and the position of the row's data."""
    layout = CONFIG.layout(SPEC)
    stripe = layout.stripe(np.array([row]))
    node = Node(int(layout.parity_node(stripe, 0)[0]), CONFIG)
    node.handle({"op": "create_table", "spec": SPEC.get_config()}, [])
    return node, int(layout.data_node(np.array([row]))[0])


def degraded(node, position, dead, seq=1, row=5):
    delta = np.full((1, SPEC.width * 4), 7, dtype=np.uint8)
    header = Delta(source="repair/x", seq=seq, tables=["t"], position=position, dead=dead).header()
    return node.handle(header, payload.pack([(np.array([row], np.int64), delta)]))[0]


def test_a_holder_refuses_a_degraded_write_for_a_position_that_has_a_replacement():
    node, p = holder_of(5)
    node.sources, node.fenced = {p: "node/spare"}, {"node/dead"}
    parity = {"op": "get_parity", "table": "t"}, [CONFIG.layout(SPEC).stripe(np.array([5]))]
    before = node.handle(*parity)[1][0].copy()
    reply = degraded(node, p, "node/dead")
    assert ErrorCode(reply["error"]) is ErrorCode.REPLACED
    assert node.applied.get("repair/x", 0) == 0  # its number is free: the next write may use it
    assert np.array_equal(node.handle(*parity)[1][0], before)


def test_a_holder_takes_a_degraded_write_while_the_dead_node_is_there_and_acks_copies():
    node, p = holder_of(5)
    node.sources, node.fenced = {p: "node/dead"}, {"node/dead"}
    assert degraded(node, p, "node/dead")["ack"] == 1
    node.sources = {p: "node/spare"}  # a copy that arrives after the spare came is acknowledged, not refused
    assert degraded(node, p, "node/dead")["ack"] == 1
    node.sources = {p: "node/spare2"}
    node.fenced |= {"node/spare2"}  # the replacement died too: writes go through the parity again
    assert degraded(node, p, "node/dead", seq=2)["ack"] == 2


def test_holders_that_agreed_to_a_degraded_write_take_it_and_count_it():
    node, p = holder_of(5)
    stripes = CONFIG.layout(SPEC).stripe(np.array([5]))
    node.sources, node.fenced = {p: "node/dead"}, {"node/dead"}
    ask = Holds(table="t", source="repair/x", position=p, dead="node/dead").header()
    reply, (has, counts) = node.handle(ask, [stripes])
    assert "error" not in reply and has.tolist() == [1] and counts.tolist() == [0]
    node.sources = {p: "node/spare"}  # a replacement came between the question and the delta: still taken
    assert degraded(node, p, "node/dead")["ack"] == 1
    assert node.handle({"op": "get_parity", "table": "t"}, [stripes])[1][1].tolist() == [1]
    late = Holds(table="t", source="repair/y", position=p, dead="node/dead").header()
    assert ErrorCode(node.handle(late, [stripes])[0]["error"]) is ErrorCode.REPLACED


def test_a_degraded_write_first_rebuilds_every_parity_row_its_holders_lack():
    """rs(3,2) on 5 nodes: one holder holds parity 0 of one written stripe and parity 1 of another. It lacks
    both rows (rebuilding); a write through the parity of a dead position must rebuild both on it before its
    delta goes out (a delta to a row that is rebuilt later from data read before it would be lost)."""
    with ectable.LocalCluster(nodes=5, code="rs", k=3, r=2, processes=False) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=150, dim=2, init="normal")
        layout = client._table("t")[1]
        dead, holder = 0, None
        for x in range(1, 5):  # a holder of parity 0 of a stripe and parity 1 of another, both with data on `dead`
            s0 = [s for s in layout.stripes_of(x, 3).tolist() if dead in layout.slot_node(s, np.arange(3))]
            s1 = [s for s in layout.stripes_of(x, 4).tolist() if dead in layout.slot_node(s, np.arange(3))]
            if s0 and s1:
                holder, stripes = x, np.array([s0[0], s1[0]])
                break
        assert holder is not None
        rows = stripes * 3 + np.array([int(np.flatnonzero(layout.slot_node(s, np.arange(3)) == dead)[0])
                                       for s in stripes])
        assert (layout.data_node(rows) == dead).all()
        cluster.channel(holder).call(Invalidate(table="t").header(), [stripes], 5.0)
        cluster.kill(dead)
        values = np.arange(4, dtype=np.float32).reshape(2, 2)
        client.put("t", rows, values)  # through the parity: no spare
        reply, (has, _) = cluster.channel(holder).call(Holds(table="t").header(), [stripes], 5.0)
        assert has.tolist() == [1, 1], "the write went out before its holder had both parity rows"
        np.testing.assert_array_equal(client.get("t", rows), values)
        cluster.add_spare()
        client.wait_recovered(timeout=60)
        np.testing.assert_array_equal(client.get("t", rows), values)
        client.flush()
        check_parity(cluster, client)


@contextlib.contextmanager
def failed_over_to_a_spare(rows: int, rebuild_batch: int):
    """(client, the rows before) of an in-process xor(4,1) cluster with a spare and a table "t" of `rows` rows,
    node 2 killed and failed over to the spare, which rebuilds only when asked (no threads in process)."""
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=1, processes=False,
                              rebuild_batch=rebuild_batch) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=rows, dim=2, init="normal", seed=4)
        before = client.get("t", np.arange(rows))
        cluster.kill(2)
        client.status()  # fails it over to the spare
        yield client, before


def test_a_rebuild_round_reads_fewer_rows_while_writes_keep_moving_its_stripes():
    """A rebuild round whose stripes still moved after PATIENCE reads (each read finding a parity holder behind the
    data it was read with, as when windows close while big reads run) gives up, and the next round asks for half
    as many rows; a round that reads its stripes once asks for `rebuild_batch` again. Before,
    one round read its whole batch again and again until the stripes stood still (12 s and 83 reads, once, in a
    training loop on node processes)."""
    from ectable.client.repair import Repair
    from ectable.process.rebuilder import MIN_BATCH, PATIENCE, RebuildRounds
    with failed_over_to_a_spare(40_000, rebuild_batch=4 * MIN_BATCH) as (client, before):
        rounds = RebuildRounds(client.cluster, 2, client.cluster.source(2))
        moving, reads = [PATIENCE + 1], []  # reads still to find a holder behind; reads per round
        real = Repair._lag

        def lag(senders, holders):
            lagging, ahead = real(senders, holders)
            reads[-1] += 1
            if moving[0] and holders:
                moving[0] -= 1
                lagging = lagging | {next(iter(holders))}
            return lagging, ahead

        rounds.client.repair._lag = lag
        batches = []
        while True:
            batches.append(rounds.batch)
            reads.append(0)
            if rounds.round() is None:
                break
        # round 1 gives up; round 2 reads its data rows twice (the first read moved) and its parity rows once, so
        # round 3 keeps its batch; round 3 reads once, so round 4 asks for `rebuild_batch` and ends the rebuild
        assert batches == [4 * MIN_BATCH, 2 * MIN_BATCH, 2 * MIN_BATCH, 4 * MIN_BATCH]
        assert reads == [PATIENCE, 3, 1, 1]
        assert client.status()["nodes"][2]["rebuild_missing"] == 0
        np.testing.assert_array_equal(client.get("t", np.arange(40_000)), before)


def test_a_rebuild_round_reads_at_most_busy_batch_rows_while_clients_use_the_node():
    """A rebuild's first round, and every round while clients read or write the rebuilding node (`busy`), asks for
    at most `BUSY_BATCH` rows; once they stop, a round that read its stripes once asks for `rebuild_batch`. Every
    row comes back. (Under training on node processes, rounds of 32,768 rows were read three times over 4 s, gave
    up, and rested 2.4 times as long: rebuilds of 19-23 s against 13-19 s; see docs/benchmarks.md.)"""
    from ectable.process.rebuilder import BUSY_BATCH, RebuildRounds
    with failed_over_to_a_spare(400_000, rebuild_batch=4 * BUSY_BATCH) as (client, before):
        busy = [True]
        rounds = RebuildRounds(client.cluster, 2, client.cluster.source(2), busy=lambda: busy[0])
        asked, real = [], rounds.client._rebuild_some

        def some(p, budget, part):
            asked.append(budget)
            return real(p, budget, part)

        rounds.client._rebuild_some = some
        while rounds.round() is not None:
            busy[0] = len(asked) < 3
        assert asked[:4] == [BUSY_BATCH] * 3 + [4 * BUSY_BATCH]
        assert client.status()["nodes"][2]["rebuild_missing"] == 0
        np.testing.assert_array_equal(client.get("t", np.arange(400_000)), before)


def test_a_node_process_is_busy_while_clients_read_or_write_it():
    """A node process counts itself busy (`serving_clients`, what its rebuilder's rounds ask) for `BUSY_SECONDS`
    after a client's read or write, not after other requests; a request whose op is no string changes nothing."""
    from ectable.process.node_server import NodeServer
    from ectable.transport import codec
    server = NodeServer("tcp://127.0.0.1:0")
    try:
        for header in ({"op": "status"}, {"op": ["get_many"]}, {"op": {"write": 1}}):
            server.answer([b"asker", *codec.encode(header, [])])  # (nobody to answer: the reply is dropped)
            assert not server.serving_clients()
        server.answer([b"asker", *codec.encode({"op": "get_many", "tables": ["t"]}, [])])
        assert server.serving_clients()
    finally:
        server.close()


def test_rebuild_streams_take_parts_of_their_own_then_help_from_the_far_end_and_rebuild_every_row():
    """A spare's streams of rounds (`rebuild_streams`) ask their node for disjoint parts of what it lacks: chunks of
    `rebuild_batch` local rows dealt in turn. A stream whose part is done takes rows from the far end of the rest,
    away from where the other one works. Together they rebuild every row and parity row exactly."""
    from ectable.process.rebuilder import RebuildRounds
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=1, processes=False, rebuild_batch=1024) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=40_000, dim=2, init="normal", seed=5)
        before = client.get("t", np.arange(40_000))
        cluster.kill(2)
        client.status()  # fails it over to the spare
        shard = cluster.node(2).shards["t"]
        local = [shard.layout.data_offset(shard.missing(1024, part, 2)[0]) for part in (0, 1)]
        np.testing.assert_array_equal(local[0], np.arange(1024))
        np.testing.assert_array_equal(local[1], np.arange(1024, 2048))
        rounds = [RebuildRounds(client.cluster, 2, client.cluster.source(2), part, 2) for part in (0, 1)]
        while (shard.layout.data_offset(shard.missing(1024, 1, 2)[0]) // 1024 % 2 == 1).any():
            assert rounds[1].round() is not None  # part 1 alone, until its rows are rebuilt
        left = np.flatnonzero(shard.missing_data)
        assert left.size and (left // 1024 % 2 == 0).all()  # part 0's rows are all that is left
        np.testing.assert_array_equal(shard.layout.data_offset(shard.missing(1024, 1, 2)[0]), left[-1024:])
        done = [False, False]
        while not all(done):
            for part in (0, 1):
                done[part] = done[part] or rounds[part].round() is None
        assert client.status()["nodes"][2]["rebuild_missing"] == 0
        np.testing.assert_array_equal(client.get("t", np.arange(40_000)), before)
        client.flush()
        check_parity(cluster, client)


def test_rebuild_streams_asking_different_limits_get_disjoint_rows():
    """A stream whose rounds shrank (writes moved its stripes) and one whose rounds did not are dealt chunks of
    `rebuild_batch` rows all the same: they never rebuild the same rows at once. (Dealt in chunks of each
    request's own limit, the second stream's first rows were the first stream's.)"""
    from ectable.protocol.messages import Missing
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=1, processes=False, rebuild_batch=4096) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=200_000, dim=2, init="normal", seed=7)
        cluster.kill(2)
        client.status()  # fails it over to the spare
        asked = [cluster.channel(2).call(Missing(limit=limit, part=part, parts=2).header(), [], 5.0)[1]
                 for limit, part in ((4096, 0), (512, 1))]
        assert asked[0][0].size == 4096 and asked[1][0].size == 512
        assert not np.intersect1d(asked[0][0], asked[1][0]).size and not np.intersect1d(asked[0][1], asked[1][1]).size


def test_a_bad_missing_request_to_a_rebuilding_node_changes_nothing():
    """A `missing` request with a bad part is refused before the node notes that its rebuilder began pulling
    (which the rebuild's reported rate counts from)."""
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=1, processes=False) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=4_000, dim=2, seed=6)
        cluster.kill(2)
        client.status()  # fails it over to the spare, which now lacks every row
        node = cluster.node(2)
        assert node.rebuilding and node.pulled_since is None
        reply, _ = node.handle({"op": "missing", "part": 2, "parts": 2}, [])
        assert reply["error"] == ErrorCode.INVALID.value and "part 2 of 2" in reply["message"]
        assert node.pulled_since is None


def test_a_many_table_write_to_a_dead_node_is_one_decode_and_one_delta_per_holder_for_every_table():
    """rs(4,2), no spare: a write to three tables (two dims) whose rows include the dead node's goes through their
    parity with one promise round and one delta message per live holder naming every table (one per table
    before: 26 tables made a degraded iteration 5.8 times slower than a healthy one). Every record then read
    is the model's, and once a spare rebuilt the node from that parity, its rows and every parity row are exact."""
    from ectable.storage.node import Node as RealNode
    from ectable.testing.reference import ReferenceTable
    sizes = {"a": (90, 2), "b": (61, 2), "c": (120, 3)}
    with ectable.LocalCluster(nodes=6, code="rs", k=4, r=2, spares=0, processes=False) as cluster:
        client = cluster.connect()
        models = {}
        for n, (name, (rows, dim)) in enumerate(sizes.items()):
            client.create_table(name, num_rows=rows, dim=dim, optimizer="adagrad", lr=0.1, init="uniform", seed=n)
            models[name] = ReferenceTable(client._table(name)[0])
        client.flush()
        cluster.kill(2)
        client.status()
        assert client.cluster.state(2) == "dead"
        rng = np.random.default_rng(7)
        batch = {name: (rng.integers(0, rows, 80), rng.standard_normal((80, dim)).astype(np.float32))
                 for name, (rows, dim) in sizes.items()}
        assert all((client._table(t)[1].data_node(ids) == 2).any() for t, (ids, _) in batch.items())
        deltas, handle = [], RealNode.op_delta

        def spy(node, msg, arrays):
            if msg.source.startswith("repair/"):
                deltas.append((node.position, list(msg.tables)))
            return handle(node, msg, arrays)
        RealNode.op_delta = spy
        RealNode._ops = {**RealNode._ops, "delta": spy}
        try:
            client.apply_gradient_many(batch)
        finally:
            RealNode.op_delta = handle
            RealNode._ops = {**RealNode._ops, "delta": handle}
        for name, (ids, grads) in batch.items():
            models[name].apply_gradient(ids, grads)
        def holders(table, ids):
            layout = client._table(table)[1]
            stripes = layout.stripe(ids[layout.data_node(ids) == 2])
            return {int(q) for j in range(layout.r) for q in layout.parity_node(stripes, j)}
        held = {table: holders(table, ids) for table, (ids, _) in batch.items()}
        assert sorted(p for p, _ in deltas) == sorted(set().union(*held.values()))  # one message per holder
        for p, tables in deltas:
            assert sorted(tables) == sorted(table for table in held if p in held[table])
        for name, (rows, _) in sizes.items():
            every = np.arange(rows)
            np.testing.assert_array_equal(client.get(name, every), models[name].get(every), err_msg=name)
        cluster.add_spare()
        client.wait_recovered(timeout=60)
        client.flush()
        for name, (rows, _) in sizes.items():
            every = np.arange(rows)
            np.testing.assert_array_equal(client.get(name, every), models[name].get(every), err_msg=name)
        check_parity(cluster, client)
