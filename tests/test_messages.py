"""The protocol schema: one record per op, checked in one place, each op answered by one dispatcher."""
import numpy as np
import pytest

from ectable.errors import InvalidRequest
from ectable.config import ClusterConfig
from ectable.protocol.messages import CONTROL, REQUESTS, ErrorCode, parse
from ectable.storage.node import Node


def test_every_op_has_exactly_one_dispatcher():
    node_ops = set(Node._ops)
    assert node_ops.isdisjoint(CONTROL)
    assert node_ops | CONTROL == set(REQUESTS)


@pytest.mark.parametrize("op", sorted(REQUESTS))
def test_a_header_round_trips_through_its_record(op):
    cls = REQUESTS[op]
    samples = {int: 3, str: "x", bool: True, float: 0.5, list: ["a"], dict: {"a": 1}}
    values = {name: samples[next(t for t in allowed if t is not type(None))]
              for name, allowed, required in cls._checks}
    record = cls(**values)
    assert parse(record.header()) == record
    required = {name: values[name] for name, _, needed in cls._checks if needed}
    assert parse(cls(**required).header()) == cls(**required)


@pytest.mark.parametrize("header, says", [
    (None, "must be a map"),
    ({"op": "nope"}, "unknown op 'nope'"),
    ({"op": 7}, "unknown op 7"),
    ({"op": "get"}, "get: field 'table' is missing"),
    ({"op": "get", "table": 3}, "get: field 'table' must be str, got int"),
    ({"op": "get", "table": "t", "records": 1}, "get: field 'records' must be bool, got int"),
    ({"op": "delta", "source": "s", "seq": True, "tables": []}, "delta: field 'seq' must be int, got bool"),
    ({"op": "write", "parts": [], "cid": 5}, "write: field 'cid' must be str or null, got int"),
    ({"op": "missing", "limit": "all"}, "missing: field 'limit' must be int, got str"),
])
def test_bad_headers_are_refused_naming_op_and_field(header, says):
    with pytest.raises(InvalidRequest, match=says.replace("(", r"\(")):
        parse(header)


def test_nodes_refuse_bad_headers_with_an_error_code_and_change_nothing():
    node = Node(0, ClusterConfig(5, "xor", 4, 1))
    reply, _ = node.handle({"op": "get", "table": 3}, [np.arange(2)])
    assert ErrorCode(reply["error"]) is ErrorCode.INVALID and "field 'table'" in reply["message"]
    reply, _ = node.handle({"op": "ping"}, [])  # a control op: answered by hosts only
    assert ErrorCode(reply["error"]) is ErrorCode.INVALID and node.rejected == 2 and not node.shards


def test_a_node_that_holds_a_position_refuses_a_map_giving_it_another():
    """(found by simulation seed rs 310) A decider acting on a node's stale presence ("a spare") must not get
    its identity recorded at a second position."""
    from ectable.config import ClusterConfig
    from ectable.process.host import NodeHost
    from ectable.protocol.messages import ErrorCode, MapUpdate

    config = ClusterConfig(5, "rs", 3, 2).get_config()
    endpoints = [f"tcp://127.0.0.1:{4000 + i}" for i in range(5)]
    host = NodeHost(endpoints[3], "token")
    first = host.apply_map(MapUpdate(endpoints=endpoints, token="token", epoch=1, config=config, position=3))
    assert first["source"] == host.node.source and host.node.position == 3
    again = host.apply_map(MapUpdate(endpoints=endpoints, token="token", epoch=2, config=config, position=2))
    assert ErrorCode(again["error"]) is ErrorCode.NOT_MEMBER and "position 3 already" in again["message"]
    assert host.node.position == 3 and "source" not in again
