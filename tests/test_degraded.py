"""Degraded writes (through the parity of a dead position) against a replacement: refused, unchanged,
by a holder that knows of the replacement (the node logic, without transport)."""
import numpy as np

from ectable.config import ClusterConfig
from ectable.protocol.messages import Delta, ErrorCode, Holds
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
    return node.handle(header, [np.array([row], np.int64), delta])[0]


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
