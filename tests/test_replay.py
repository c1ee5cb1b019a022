"""A replacement node holds clients' reads and writes until every live writer replayed the writes its dead
predecessor applied, then applies them in the dead node's order (the node logic, without transport)."""
import numpy as np
import pytest

from ectable.client.client import _in_node_order, _Write
from ectable.config import ClusterConfig
from ectable.storage.node import Node
from ectable.storage.table import TableSpec

SPEC = TableSpec.from_config({"name": "t", "num_rows": 40, "dim": 2, "seed": 0,
                              "optimizer": {"name": "adagrad", "lr": 0.5, "eps": 1e-8}, "init": {"kind": "normal"}})


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def replacement(writers, clock=None):
    node = Node(0, ClusterConfig(5, "xor", 4, 1), clock=clock or Clock())
    node.handle({"op": "create_table", "spec": SPEC.get_config()}, [])
    node.expect_replays(writers)
    return node


def entry(seq, cid, cseq, ids, grads):
    return [seq, cid, cseq, [["t", "apply_gradient"]]], [np.array(ids, np.int64), np.array(grads, np.float32)]


def replay(node, replayer, *entries):
    header = {"op": "replay", "replayer": replayer, "entries": [e for e, _ in entries]}
    return node.handle(header, [a for _, arrays in entries for a in arrays])[0]


def rows(node, ids=(3, 6)):
    return node.handle({"op": "get_many", "tables": ["t"]}, [np.array(ids, np.int64)])


def test_reads_and_writes_wait_for_every_writer_then_replays_apply_in_the_dead_nodes_order():
    node, ordered = replacement({"a", "b"}), replacement(set())
    a1, b1, a2 = (entry(1, "A", 1, [3, 6], [[1, 2], [3, 4]]), entry(2, "B", 1, [3], [[-5, 1]]),
                  entry(3, "A", 2, [3, 6], [[2, 2], [1, 1]]))
    assert replay(node, "a", a1, a2) == {"done": False, "durable": 0}
    assert rows(node)[0]["error"] == "replaying"
    assert node.handle({"op": "write", "parts": [["t", "put"]]}, [])[0]["error"] == "replaying"
    assert replay(node, "b", b1)["done"]
    for e in (a1, b1, a2):  # what the dead node did
        header, arrays = e
        assert "seq" in ordered.handle({"op": "write", "parts": header[3]}, arrays)[0]
    np.testing.assert_array_equal(rows(node)[1][0], rows(ordered)[1][0])
    assert replay(node, "a")["seqs"] == [1, 3]  # asked again: this node's seq of each of its entries
    assert node.client_marks == {"A": 2, "B": 1}


def test_a_writer_that_does_not_replay_in_time_is_not_waited_for():
    clock = Clock()
    node = replacement({"a", "gone"}, clock)
    replay(node, "a", entry(1, "A", 1, [3], [[1, 1]]))
    assert rows(node)[0]["error"] == "replaying"
    node.keep_replayers({"a"})  # "gone" lost its lease
    assert "error" not in rows(node)[0]
    node = replacement({"slow"}, clock)
    clock.now += 60
    assert "error" not in rows(node)[0]


def test_only_a_read_of_the_writers_begun_since_the_wait_began_ends_it_for_one_not_listed():
    """A read begun before the failover may lack a writer that registered just before it: that writer must still
    be waited for (it was once not, and its writes went missing from reads until it replayed)."""
    clock = Clock()
    clock.now = 100.0
    node = replacement({"old", "new"}, clock)
    node.take_writers({"old"}, began=99.5)  # begun before the wait: "new" may simply be missing from it
    assert node.replay_from == {"old", "new"}
    node.take_writers({"old"}, began=100.2)  # begun since: "new" is gone for good
    assert node.replay_from == {"old"}


def test_a_writer_awaited_past_the_deadline_is_remembered_until_it_replays_or_lapses():
    clock = Clock()
    node = replacement({"late", "lapses"}, clock)
    clock.now += 60
    assert "error" not in rows(node)[0] and set(node.late) == {"late", "lapses"}  # served: they replay late
    node.keep_replayers({"late"})  # "lapses" lost its lease: it never replays
    assert set(node.late) == {"late"}
    assert replay(node, "late", entry(1, "A", 1, [3], [[1, 1]]))["done"]  # applied at once
    assert not node.late and node.client_marks == {"A": 1}
    node = replacement({"idle"}, clock)
    clock.now += 60
    rows(node)
    assert set(node.late) == {"idle"}
    clock.now += 299
    node.keep_replayers({"idle"})
    assert set(node.late) == {"idle"}
    clock.now += 2  # counted no more: a writer idle that long may lose writes to a grow (docs/design.md)
    node.keep_replayers({"idle"})
    assert not node.late


@pytest.mark.parametrize("header, arrays", [
    ({"op": "replay", "entries": []}, []),
    ({"op": "replay", "replayer": "a", "entries": [[1, "A", 1]]}, []),
    ({"op": "replay", "replayer": "a", "entries": [["x", "A", 1, [["t", "apply_gradient"]]]]}, []),
    ({"op": "replay", "replayer": "a", "entries": [[1, "A", 1, [["t", "apply_gradient"]]]]}, []),
    ({"op": "replay", "replayer": "a", "entries": [[1, "A", 1, [["t", "apply_gradient"]]]]},
     [np.array([99]), np.zeros((1, 2), np.float32)]),
    ({"op": "replay", "replayer": "a", "entries": [[1, "A", 1, [["t", "apply_gradient"]]]]},
     [np.array([3]), np.full((1, 2), np.nan, np.float32)]),
    ({"op": "replay", "replayer": "a", "entries": [[1, "A", 1, [["nope", "put"]]]]},
     [np.array([1]), np.zeros((1, 2), np.float32)]),
    ({"op": "replay", "replayer": "a", "entries": []}, [np.array([1])]),
])
def test_bad_replays_are_refused_and_change_nothing(header, arrays):
    node = replacement({"a"})
    assert node.handle(header, arrays)[0]["error"] == "invalid"
    assert node.replay_from == {"a"} and not node.replay_buffer and "a" not in node.replayed


def test_replays_sort_into_the_dead_nodes_order_unanswered_ones_after_their_predecessor():
    entries = []
    for seq in (7, None, 3, 9, None):
        entries.append(_Write([], "c", len(entries)))
        entries[-1].seq = seq
    assert [e.cseq for e in _in_node_order(entries)] == [2, 0, 1, 3, 4]


def test_a_buffered_replay_to_a_table_dropped_since_changes_nothing_and_every_delta_is_taken():
    """A replay buffered while another writer is awaited names a table dropped before it is applied: that part
    is moot. The other tables of the dropped table's record width share its window; their deltas are still
    right, and every peer takes them."""
    config = ClusterConfig(5, "xor", 4, 1)

    def spec(name):
        return {**SPEC.get_config(), "name": name}

    def node_with_tables(position):
        node = Node(position, config)
        for name in ("s", "u", "v"):
            node.handle({"op": "create_table", "spec": spec(name)}, [])
        return node

    node = node_with_tables(0)
    u, s = node.shards["u"], node.shards["s"]
    assert u.window.window is s.window.window
    mine = [i for i in range(40) if u.layout.data_node(i) == 0][:2]
    node.expect_replays({"a", "b"})
    header = {"op": "replay", "replayer": "a", "entries": [[1, "A", 1, [["u", "apply_gradient"]]]]}
    assert node.handle(header, [np.array(mine, np.int64), np.ones((2, 2), np.float32)])[0] == {"done": False, "durable": 0}
    assert node.handle({"op": "drop_table", "table": "u"}, [])[0]["dropped"]
    assert replay(node, "b")["done"]
    assert node.dirty.rows() == 0
    ids = np.array([i for i in range(40) if s.layout.data_node(i) == 0][:3], np.int64)
    assert "seq" in node.handle({"op": "write", "parts": [["s", "apply_gradient"]]},
                                [ids, np.ones((3, 2), np.float32)])[0]
    node.close_window()
    outbox = node.take_outbox()
    assert outbox
    for target, header, arrays in outbox:
        peer = node_with_tables(target)
        peer.handle({"op": "drop_table", "table": "u"}, [])
        reply = peer.handle(header, arrays)[0]
        assert reply.get("ack") == header["seq"] and "error" not in reply, (target, header["tables"], reply)
