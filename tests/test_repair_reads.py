"""Decode reads and on-demand restores carry every table at once: one request per survivor and kind (the node
logic, and a client's decode over several tables)."""
import numpy as np
import pytest

import ectable
from ectable.config import ClusterConfig
from ectable.protocol.messages import ErrorCode, GetCommitted, GetMany, GetParityMany, Invalidate, RestoreRows
from ectable.storage.node import Node
from ectable.storage.table import TableSpec

CONFIG = ClusterConfig(5, "xor", 4, 1)
SPECS = [TableSpec.from_config({"name": name, "num_rows": 60, "dim": 2, "seed": seed, "optimizer": {"name": "sgd", "lr": 0.5},
                                "init": {"kind": "normal"}}) for name, seed in (("a", 1), ("b", 2))]


def node_with_tables(position: int, rebuilding: bool) -> Node:
    node = Node(position, CONFIG, rebuilding=rebuilding)
    for spec in SPECS:
        node.handle({"op": "create_table", "spec": spec.get_config()}, [])
    return node


def owned(spec, position: int) -> np.ndarray:
    """Ids of `spec`'s rows that live on `position`."""
    ids = np.arange(spec.num_rows)
    return ids[CONFIG.layout(spec).data_node(ids) == position]


def parity_stripes(spec, position: int) -> np.ndarray:
    return CONFIG.layout(spec).stripes_of(position, CONFIG.k)


def test_a_replacement_names_every_tables_missing_rows_and_parity_rows_in_one_refusal():
    node = node_with_tables(1, rebuilding=True)
    ids = [owned(spec, 1)[:3] for spec in SPECS]
    reply, arrays = node.handle(GetCommitted(tables=["a", "b"]).header(), ids)
    assert ErrorCode(reply["error"]) is ErrorCode.NOT_REBUILT and reply["tables"] == ["a", "b"]
    assert [a.tolist() for a in arrays[1:]] == [i.tolist() for i in ids]
    stripes = [parity_stripes(spec, 1)[:2] for spec in SPECS]
    reply, arrays = node.handle(GetParityMany(tables=["a", "b"]).header(), stripes)
    assert ErrorCode(reply["error"]) is ErrorCode.NOT_REBUILT and reply["kind"] == "parity"
    assert reply["tables"] == ["a", "b"] and [a.tolist() for a in arrays[1:]] == [s.tolist() for s in stripes]


def test_restore_rows_installs_every_table_or_none():
    source, spare = node_with_tables(1, rebuilding=False), node_with_tables(1, rebuilding=True)
    ids = [owned(spec, 1)[:3] for spec in SPECS]
    reply, records = source.handle(GetCommitted(tables=["a", "b"]).header(), ids)
    assert "error" not in reply and set(reply) >= {"source", "sent", "peers", "marks", "window"}
    bad = [ids[0], records[0], ids[1], records[1][:, :1]]  # table b's records are the wrong shape
    reply, _ = spare.handle(RestoreRows(tables=["a", "b"]).header(), bad)
    assert ErrorCode(reply["error"]) is ErrorCode.INVALID and "'b'" in reply["message"]
    assert spare.rebuilt_rows == 0 and spare.shards["a"].unrebuilt(ids[0]).size == 3  # nothing installed
    reply, _ = spare.handle(RestoreRows(tables=["a", "b"]).header(), [ids[0], records[0], ids[1], records[1]])
    assert "error" not in reply and spare.rebuilt_rows == 6
    again = spare.handle(GetCommitted(tables=["a", "b"]).header(), ids)[1]
    for got, want in zip(again, records):
        np.testing.assert_array_equal(got, want)


def test_a_stale_parity_row_of_one_table_is_named_with_the_others():
    node = node_with_tables(0, rebuilding=False)
    stripes = [parity_stripes(spec, 0)[:2] for spec in SPECS]
    node.handle(Invalidate(table="b").header(), [stripes[1][:1]])
    reply, arrays = node.handle(GetParityMany(tables=["a", "b"]).header(), stripes)
    assert reply["tables"] == ["b"] and arrays[1].tolist() == stripes[1][:1].tolist()


def test_a_decode_over_several_tables_asks_each_survivor_once_per_kind():
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, processes=False) as cluster:
        client = cluster.connect()
        tables = [f"t{n}" for n in range(4)]
        for n, table in enumerate(tables):
            client.create_table(table, num_rows=400, dim=2, init="normal", seed=n)
        every = np.arange(400)
        ids = {t: every[client._table(t)[1].data_node(every) == 2][:50] for t in tables}  # rows of the node killed
        before = client.get_many(ids)
        client.flush()
        cluster.kill(2)
        asked = []
        start_all = client._start_all

        def counting(requests, *args, **kwargs):
            asked.extend((key[0], header["op"]) for key, (header, _) in requests.items())
            return start_all(requests, *args, **kwargs)

        client._start_all = counting
        after = client.get_many(ids)  # decoded: the node is dead and there is no spare
        for t in tables:
            np.testing.assert_array_equal(after[t], before[t])
        kinds = {"get": "data", "get_committed": "data", "get_parity": "parity", "get_parity_many": "parity"}
        reads = [(node, kinds[op]) for node, op in asked if op in kinds]
        assert {node for node, _ in reads} == {0, 1, 3, 4}
        assert len(reads) == len(set(reads)), f"a survivor was asked more than once per kind: {sorted(reads)}"


def test_a_partial_read_of_a_replacement_gives_the_rows_it_has_and_names_the_others():
    source, spare = node_with_tables(1, rebuilding=False), node_with_tables(1, rebuilding=True)
    ids = [owned(spec, 1)[:4] for spec in SPECS]
    records = source.handle(GetCommitted(tables=["a", "b"]).header(), ids)[1]
    spare.handle(RestoreRows(tables=["a"]).header(), [ids[0][:2], records[0][:2]])  # two rows of a rebuilt
    reply, arrays = spare.handle(GetMany(tables=["a", "b"], partial=True).header(), ids)
    assert reply.get("missing") and len(arrays) == 4
    np.testing.assert_array_equal(arrays[0][:2], records[0][:2, :2])
    assert not arrays[0][2:].any() and not arrays[1].any()
    assert arrays[2].tolist() == ids[0][2:].tolist() and arrays[3].tolist() == ids[1].tolist()
    reply, _ = spare.handle(GetMany(tables=["a", "b"]).header(), ids)  # not partial: refused, as ever
    assert ErrorCode(reply["error"]) is ErrorCode.NOT_REBUILT


def test_a_read_of_rows_a_spare_has_not_rebuilt_asks_it_once_and_rebuilds_them_there():
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=1, processes=False) as cluster:
        client = cluster.connect()
        tables = [f"t{n}" for n in range(3)]
        for n, table in enumerate(tables):
            client.create_table(table, num_rows=400, dim=2, init="normal", seed=n)
        every = np.arange(400)
        ids = {t: every[client._table(t)[1].data_node(every) == 2][:30] for t in tables}
        wanted = {t: np.concatenate([i, every[client._table(t)[1].data_node(every) == 3][:5]]) for t, i in ids.items()}
        before = client.get_many(wanted)
        client.flush()
        cluster.kill(2)
        client.status()  # fails it over: the spare takes position 2, nothing rebuilt yet
        assert client.cluster.state(2) == "rebuilding"
        asked = []
        start_all, fan_out, call = client._start_all, client._fan_out, client._call

        def counting(requests, *args, **kwargs):
            asked.extend((key if isinstance(key, int) else key[0], header["op"]) for key, (header, _) in requests.items())
            return (fan_out if requests and isinstance(next(iter(requests)), int) else start_all)(requests, *args, **kwargs)

        def calling(p, header, arrays, *args, **kwargs):
            asked.append((p, header["op"]))
            return call(p, header, arrays, *args, **kwargs)

        def later(p, header, arrays):
            asked.append((p, header["op"]))
            send_later(p, header, arrays)

        client._start_all = client._fan_out = counting
        client._call = calling
        send_later, client._send_later = client._send_later, later
        after = client.get_many(wanted)
        for t in tables:
            np.testing.assert_array_equal(after[t], before[t])
        # its rows once; a read of none beside the decode's other reads (what it had sent: a marker of the cut)
        assert sorted(op for p, op in asked if p == 2) == ["get_committed", "get_many", "restore_rows"], asked
        assert [p for p, _, _ in client._ahead] == [2]  # the restore's reply is left to the next request
        client._collect_ahead()
        assert cluster.channel(2).call({"op": "get_many", "tables": tables}, [ids[t] for t in tables], 5.0)[0] \
            .get("error") is None  # rebuilt there


def test_a_restore_sent_ahead_that_comes_late_or_never_loses_no_write():
    """The restore of rows decoded for a read is not waited for: a write that overtakes it is refused and
    rebuilds the rows first, and the restore, when it comes, leaves rows already rebuilt as they are."""
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=1, processes=False) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=400, dim=2, init="normal", seed=1, optimizer="sgd", lr=0.5)
        every = np.arange(400)
        ids = every[client._table("t")[1].data_node(every) == 2][:30]
        before = client.get("t", ids)
        client.flush()
        cluster.kill(2)
        client.status()  # the spare takes position 2, nothing rebuilt yet
        held = []
        client._send_later = lambda p, header, arrays: held.append((p, header, arrays))
        np.testing.assert_array_equal(client.get("t", ids), before)  # decoded; its restore held back
        assert [(p, header["op"]) for p, header, _ in held] == [(2, "restore_rows")]
        grads = np.full((ids.size, 2), 2.0, dtype=np.float32)
        client.apply_gradient("t", ids, grads)  # overtakes the restore: refused, the rows rebuilt, then written
        p, header, arrays = held[0]
        reply, _ = cluster.channel(p).call(header, arrays, 5.0)  # the restore comes at last
        assert reply.get("error") is None
        np.testing.assert_array_equal(client.get("t", ids), before - np.float32(0.5) * grads)


def test_a_partial_read_asked_what_is_lacking_names_every_row_a_replacement_lacks():
    spare = node_with_tables(1, rebuilding=True)
    ids = [owned(spec, 1)[:4] for spec in SPECS]
    spare.handle(RestoreRows(tables=["a"]).header(), [ids[0][:2], np.zeros((2, SPECS[0].width), np.float32)])
    reply, arrays = spare.handle(GetMany(tables=["a", "b"], partial=True, lacking=True).header(), ids)
    assert reply.get("missing") and len(arrays) == 6
    for n, spec in enumerate(SPECS):  # one bit per local row of the table, not only those asked
        lacks = np.unpackbits(arrays[4 + n]).view(bool)
        offsets = CONFIG.layout(spec).data_offset(owned(spec, 1))
        assert lacks[offsets].tolist() == [n == 1 or row not in ids[0][:2] for row in owned(spec, 1)]
    source = node_with_tables(1, rebuilding=False)  # lacking nothing: rows, no ids, empty bits
    reply, arrays = source.handle(GetMany(tables=["a", "b"], partial=True, lacking=True).header(), ids)
    assert [a.size for a in arrays[2:]] == [0, 0, 0, 0] and arrays[0].shape == (4, 2)
    reply, _ = spare.handle(GetMany(tables=["a"], lacking=True).header(), ids[:1])  # lacking without partial
    assert ErrorCode(reply["error"]) is ErrorCode.INVALID


def test_lacks_is_corrected_by_every_read_and_ignores_what_it_cannot_read():
    from ectable.client.lacks import REFRESH, Lacks
    lacks = Lacks()
    assert lacks.due(3, "n", 0.0) and not lacks.guess(3, "n", "t", np.arange(4)).any()
    lacks.learn(3, "n", 0.0, ["t", "u"], [np.packbits(np.array([1, 0, 1, 1], bool)), np.zeros((2, 2), np.uint8)])
    assert not lacks.due(3, "n", REFRESH / 2) and lacks.due(3, "n", REFRESH * 2) and lacks.due(3, "other", 0.0)
    assert lacks.guess(3, "n", "t", np.array([0, 1, 2, 3, 99])).tolist() == [True, False, True, True, False]
    assert not lacks.guess(3, "n", "u", np.arange(2)).any()  # bits of the wrong shape: nothing believed
    assert not lacks.guess(3, "other", "t", np.arange(4)).any()  # another incarnation at the position
    lacks.present(3, "n", "t", np.array([2, 99]))
    assert lacks.guess(3, "n", "t", np.arange(4)).tolist() == [True, False, False, True]
    lacks.forget(3)
    assert not lacks.guess(3, "n", "t", np.arange(4)).any()


def test_rows_believed_lacking_are_decoded_with_the_read_and_a_stale_belief_changes_no_value():
    """A client that learned what a spare lacks starts decoding those rows before the spare answers, so the read
    takes one round trip; a row rebuilt and written since it learned is read from the spare, not the decode."""
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=1, processes=False) as cluster:
        client, other = cluster.connect(), cluster.connect()
        client.create_table("t", num_rows=600, dim=2, init="normal", seed=1, optimizer="sgd", lr=0.5)
        other._refresh_tables()
        every = np.arange(600)
        ids = every[client._table("t")[1].data_node(every) == 2]
        first, fresh, stale = ids[:10], ids[10:40], ids[40:70]
        before = client.get("t", ids)
        client.flush()
        cluster.kill(2)
        client.status()
        other.status()  # both see the spare at position 2, nothing rebuilt yet
        np.testing.assert_array_equal(client.get("t", first), before[:10])  # learns what the spare lacks
        grads = np.ones((stale.size, 2), dtype=np.float32)
        other.get("t", stale)
        other.apply_gradient("t", stale, grads)  # rebuilt and written since: the decode would give the old rows
        asked = []
        start_all, fan_out = client._start_all, client._fan_out

        def starting(requests, *args, **kwargs):
            asked.extend(header["op"] for header, _ in requests.values())
            return start_all(requests, *args, **kwargs)

        def fanning(requests, *args, **kwargs):
            asked.extend(header["op"] for header, _ in requests.values())
            return fan_out(requests, *args, **kwargs)

        client._start_all, client._fan_out = starting, fanning
        both = np.concatenate([fresh, stale])
        after = client.get("t", both)
        np.testing.assert_array_equal(after[:30], before[10:40])
        np.testing.assert_array_equal(after[30:], before[40:70] - np.float32(0.5) * grads)
        reads = [op for op in asked if op in ("get_committed", "get_parity_many")]
        assert reads and asked.index("get_many") > max(n for n, op in enumerate(asked) if op in reads), asked
        client._start_all, client._fan_out = start_all, fan_out
        np.testing.assert_array_equal(client.get("t", both), after)


def test_a_decode_begun_ahead_that_meets_another_spare_lacking_its_slots_reads_around_it():
    with ectable.LocalCluster(nodes=6, code="rs", k=4, r=2, spares=2, processes=False) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=2000, dim=2, init="normal", seed=3)
        every = np.arange(2000)
        ids = every[client._table("t")[1].data_node(every) == 2]
        before = client.get("t", ids)
        client.flush()
        cluster.kill(2)
        cluster.kill(3)
        client.status()
        assert client.cluster.state(2) == client.cluster.state(3) == "rebuilding"
        np.testing.assert_array_equal(client.get("t", ids[:5]), before[:5])  # learns what position 2 lacks
        begun = []
        read_ahead = client.repair.read_ahead
        client.repair.read_ahead = lambda *a, **kw: begun.append(read_ahead(*a, **kw)) or begun[-1]
        refused, not_rebuilt = [], client.repair._not_rebuilt
        client.repair._not_rebuilt = lambda node, *a: refused.append(node) or not_rebuilt(node, *a)
        finished, finish = [], client.repair._finish
        client.repair._finish = lambda *a: finished.append(finish(*a)) or finished[-1]
        decode = client.repair._decode
        client.repair._decode = lambda ids, skip, begun=None: \
            decode(ids, skip, begun) if begun is not None else pytest.fail("decoded again after the begun decode")
        np.testing.assert_array_equal(client.get("t", ids[5:]), before[5:])
        assert begun and begun[0] is not None
        assert 3 in refused  # its first reads asked the other spare, which lacked those slots: read around it
        assert finished and finished[0]  # and the rows came from the decode begun early


def test_a_decode_reads_the_tables_of_each_record_size_as_one_cut_and_gives_every_record_exactly(monkeypatch):
    """Tables of two dims (two record sizes), of sizes whose last stripes are short (virtual slots) and with
    their own rotations: a decode makes one cut per record size, gives every record of a dead node as it was,
    and names as a table's senders only the data nodes of its own stripes (what a parity restore's cut holds)."""
    from ectable.client import repair
    made = []

    class Spy(repair.Cut):
        def __init__(self, stripes, *args):
            made.append(sorted(stripes))
            super().__init__(stripes, *args)

    monkeypatch.setattr(repair, "Cut", Spy)
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=0, processes=False) as cluster:
        client = cluster.connect()
        sizes = {"a": (37, 2), "b": (101, 2), "c": (3, 3), "d": (250, 3)}
        for n, (name, (rows, dim)) in enumerate(sizes.items()):
            client.create_table(name, num_rows=rows, dim=dim, init="normal", seed=n)
        every = {name: np.arange(rows) for name, (rows, _) in sizes.items()}
        client.apply_gradient_many({name: (ids, np.ones((ids.size, sizes[name][1]), np.float32))
                                    for name, ids in every.items()})
        client.flush()
        want = client.get_many(every, records=True)
        cluster.kill(2)
        client.status()
        assert client.cluster.state(2) == "dead"
        lost = {name: ids[client._table(name)[1].data_node(ids) == 2] for name, ids in every.items()}
        lost = {name: ids for name, ids in lost.items() if ids.size}
        made.clear()
        got = client.repair.read_many(lost)
        assert sorted(made) == [sorted(t for t in lost if sizes[t][1] == dim) for dim in (2, 3)]
        for name, ids in lost.items():
            np.testing.assert_array_equal(got[name], want[name][ids], err_msg=name)
        stripes = {name: np.unique(client._table(name)[1].stripe(ids)) for name, ids in every.items()}
        for name, (_, senders, _) in client.repair.recover_many(stripes).items():
            layout = client._table(name)[1]
            data = {int(q) for s in stripes[name].tolist() for i in range(layout.k)
                    if s * layout.k + i < layout.num_rows and (q := layout.slot_node(s, i)) != 2}
            assert set(senders) == data, name


def test_one_holds_many_answers_for_every_table_in_order_and_promises_once():
    from ectable.protocol.messages import HoldsMany
    node = node_with_tables(1, rebuilding=False)
    stripes = [parity_stripes(spec, 1)[:3] for spec in SPECS]
    node.handle(Invalidate(table="b").header(), [stripes[1][1:2]])  # b's second parity row is to be rebuilt
    node.sources, node.fenced = {2: "node/dead"}, {"node/dead"}
    ask = HoldsMany(tables=["a", "b"], source="repair/x", position=2, dead="node/dead").header()
    reply, (has_a, versions_a, has_b, versions_b) = node.handle(ask, stripes)
    assert "error" not in reply and list(node.promised) == ["repair/x"]
    assert has_a.tolist() == [1, 1, 1] and has_b.tolist() == [1, 0, 1]
    assert versions_a.tolist() == versions_b.tolist() == [0, 0, 0]
