"""Bad input, table-driven (SPEC §3 and §4.4): every public call and every wire operation given a bad value
raises (or answers) a clear `InvalidRequest` naming the value, changes nothing (a full read after
`flush()` equals the model, parity equals a fresh encode) and crashes no node. Runs against node processes
over ZeroMQ and against in-process nodes alike."""
import numpy as np
import pytest

import ectable
from ectable.protocol.messages import ErrorCode
from ectable.testing import ReferenceTable, check_parity, read_records

pytestmark = pytest.mark.timeout(300)

F = np.float32
TABLES = {"items": dict(num_rows=1000, dim=8, optimizer="rowwise_adagrad", lr=0.05, seed=1),
          "users": dict(num_rows=333, dim=4, optimizer="adagrad", lr=0.1, init="normal"),
          "plain": dict(num_rows=100, dim=2, optimizer="sgd", lr=1e30, init="zeros"),
          "twin": dict(num_rows=500, dim=8, optimizer="rowwise_adagrad", lr=0.05, seed=2)}  # one step with items'


@pytest.fixture(scope="module", params=[True, False], ids=["processes", "in-process"])
def world(request):
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, processes=request.param) as cluster:
        client = cluster.connect()
        models = {}
        for name, spec in TABLES.items():
            client.create_table(name, **spec)
            models[name] = ReferenceTable(client._table(name)[0])
        rng = np.random.default_rng(0)
        for name, model in models.items():  # rows that differ from their initial values
            ids = rng.integers(0, TABLES[name]["num_rows"], 64)
            grads = rng.standard_normal((64, TABLES[name]["dim"])).astype(F) * (1e-30 if name == "plain" else 1)
            client.apply_gradient(name, ids, grads)
            model.apply_gradient(ids, grads)
        twins = {name: (rng.integers(0, TABLES[name]["num_rows"], 64), rng.standard_normal((64, 8)).astype(F))
                 for name in ("items", "twin")}
        client.apply_gradient_many(twins)  # a node steps both tables' rows together (`updated_many`)
        for name, (ids, grads) in twins.items():
            models[name].apply_gradient(ids, grads)
        client.flush()
        yield cluster, client, models


def unchanged(cluster, client, models):
    """Nothing changed: every record equals the model's; parity is exact; every node answers, up."""
    client.flush()
    for name, model in models.items():
        ids = np.arange(TABLES[name]["num_rows"])
        got = read_records(client, name, ids)
        touched = np.array(sorted(model.rows), dtype=np.int64)
        want = np.stack([model.rows[i] for i in touched.tolist()])
        assert np.array_equal(got[touched].view(np.uint32), want.view(np.uint32)), f"table {name!r} changed"
    check_parity(cluster, client)
    assert all(cluster.state(p) == "up" for p in range(cluster.config.nodes))
    assert all(n["health"] == "up" for n in client.status()["nodes"])


BIG = 2 ** 39
# (call, args, kwargs, words the message must hold)
PUBLIC = [
    ("create_table", ("",), dict(num_rows=10, dim=2), "''"),
    ("create_table", (5,), dict(num_rows=10, dim=2), "5"),
    ("create_table", ("x" * 201,), dict(num_rows=10, dim=2), "at most 200"),
    ("create_table", ("f\udc80",), dict(num_rows=10, dim=2), "surrogate"),
    ("create_table", ("a",), dict(num_rows=0, dim=2), "got 0"),
    ("create_table", ("a",), dict(num_rows=-5, dim=2), "got -5"),
    ("create_table", ("a",), dict(num_rows=2 ** 40, dim=2), "1099511627776"),
    ("create_table", ("a",), dict(num_rows=1.5, dim=2), "1.5"),
    ("create_table", ("a",), dict(num_rows=True, dim=2), "True"),
    ("create_table", ("a",), dict(num_rows=10, dim=0), "got 0"),
    ("create_table", ("a",), dict(num_rows=10, dim=2 ** 17), "131072"),
    ("create_table", ("a",), dict(num_rows=10, dim=2, optimizer="lamb"), "'lamb'"),
    ("create_table", ("a",), dict(num_rows=10, dim=2, lr=-1.0), "lr=-1.0"),
    ("create_table", ("a",), dict(num_rows=10, dim=2, lr=float("nan")), "lr=nan"),
    ("create_table", ("a",), dict(num_rows=10, dim=2, lr="fast"), "'fast'"),
    ("create_table", ("a",), dict(num_rows=10, dim=2, optimizer="adagrad", eps=0.0), "eps > 0"),
    ("create_table", ("a",), dict(num_rows=10, dim=2, optimizer="rowwise_adagrad", eps=0.0), "eps > 0"),
    ("create_table", ("a",), dict(num_rows=10, dim=2, eps=-1.0), "eps=-1.0"),
    ("create_table", ("a",), dict(num_rows=10, dim=2, init="ones"), "'ones'"),
    ("create_table", ("a",), dict(num_rows=10, dim=2, low=-1e39, high=1.0), "1e+39"),
    ("create_table", ("a",), dict(num_rows=10, dim=2, low=1.0, high=0.0), "low < high"),
    ("create_table", ("a",), dict(num_rows=10, dim=2, init="normal", std=-1.0), "std >= 0"),
    ("create_table", ("a",), dict(num_rows=10, dim=2, init="normal", std=1e38), "1e+38"),
    ("create_table", ("a",), dict(num_rows=10, dim=2, init="normal", mean="x"), "'x'"),
    ("create_table", ("a",), dict(num_rows=10, dim=2, learning_rate=0.1), "learning_rate"),
    ("create_table", ("a",), dict(num_rows=10, dim=2, init="zeros", low=0.0), "'low'"),
    ("create_table", ("a",), dict(num_rows=10, dim=2, seed=2 ** 64), "18446744073709551616"),
    ("create_table", ("a",), dict(num_rows=10, dim=2, seed=-1), "got -1"),
    ("create_table", ("a",), dict(num_rows=10, dim=2, seed="s"), "'s'"),
    ("create_table", ("a",), dict(num_rows=BIG, dim=64), "GiB"),
    ("create_table", ("items",), dict(TABLES["items"], dim=9), "dim: 8 vs 9"),
    ("create_table", ("users",), dict(TABLES["users"], lr=0.2), "optimizer"),
    ("get", ("nope", [1]), {}, "'nope'"),
    ("get", (["items"], [1]), {}, "['items']"),
    ("get", ("items", [1000]), {}, "1000"),
    ("get", ("items", [-1]), {}, "-1"),
    ("get", ("items", [1.5]), {}, "float64"),
    ("get", ("items", [[1], [1, 2]]), {}, "not an array"),
    ("get", ("items", ["a"]), {}, "<U1"),
    ("get", ("items", np.array([1, None], dtype=object)), {}, "object"),
    ("get", ("items",), {}, "needs the ids"),
    ("get_many", ([("items", [1])],), {}, "list"),
    ("get_many", ({"nope": [1]},), {}, "'nope'"),
    ("get_many", ({"items": [1], "users": [999]},), {}, "999"),
    ("put", ("items", [1, 1], np.zeros((2, 8))), {}, "duplicate id 1"),
    ("put", ("items", [1], np.zeros((1, 7))), {}, "(1, 7)"),
    ("put", ("items", [1], np.zeros((1, 8), dtype=np.int32)), {}, "int32"),
    ("put", ("items", [1], np.full((1, 8), np.inf)), {}, "inf"),
    ("put", ("items", [1], np.full((1, 8), np.nan)), {}, "nan"),
    ("put", ("items", [[1, 2]], np.zeros((2, 8))), {}, "(1, 2, 8)"),
    ("put", ("items", [1], [[1.0] * 8, [2.0]]), {}, "not an array"),
    ("put", ("users", [333], np.zeros((1, 4))), {}, "333"),
    ("put", ("items", [1], np.full((1, 8), 1e39)), {}, "inf"),  # float64 beyond float32
    ("apply_gradient", ("items", [1, 2], np.array([[0] * 8, [np.nan] * 8], dtype=F)), {}, "nan"),
    ("apply_gradient", ("items", [1, 1], np.full((2, 8), 3e38, dtype=F)), {}, "non-finite"),
    ("apply_gradient", ("plain", [3], np.full((1, 2), 1e10, dtype=F)), {}, "[3]"),  # w - lr*g overflows
    ("apply_gradient", ("items", [1, 2], np.zeros((1, 8), dtype=F)), {}, "(2, 8)"),
    ("apply_gradient", ("items", [1], np.zeros((1, 8), dtype=np.int64)), {}, "int64"),
    ("apply_gradient", ("items", [1000], np.zeros((1, 8), dtype=F)), {}, "1000"),
    ("apply_gradient", ("items", [[1, 2]], np.zeros((2, 8), dtype=F)), {}, "(1, 2, 8)"),
    ("apply_gradient_many", ({"items": [1]},), {}, "expected (ids, grads)"),
    ("apply_gradient_many", ({"items": ([1], np.ones((1, 8))), "users": ([400], np.ones((1, 4)))},), {}, "400"),
    ("apply_gradient_many", ([1],), {}, "list"),
    ("apply_gradient_many", ({"items": ([1], np.ones((1, 8), dtype=F)),
                              "twin": ([5, 5], np.full((2, 8), 3e38, dtype=F))},), {}, "'twin'"),  # overflows in one table of a step taken with another's: neither changes
    ("drop_table", ("nope",), {}, "'nope'"),
    ("drop_table", (["items"],), {}, "['items']"),
    ("checkpoint", ("memory://c",), dict(bits=5), "bits"),
    ("checkpoint", ("memory://c",), dict(policy="sometimes"), "'sometimes'"),
    ("checkpoint", ("memory://c",), dict(policy={"name": "intermittent", "threshold": 2}), "threshold"),
    ("checkpoint", ("memory://c",), dict(extra="text"), "extra must be bytes"),
    ("checkpoint", ("memory://c",), dict(state_bits=16), "state_bits"),
    ("checkpoint", ("memory://c",), dict(keep=0), "keep"),
    ("checkpoint", ("",), {}, "path"),
    ("checkpoint", (None,), {}, "path"),
]


@pytest.mark.parametrize("call,args,kwargs,words", PUBLIC, ids=[f"{c}-{n}" for n, (c, *_) in enumerate(PUBLIC)])
def test_a_bad_call_is_refused_by_name_and_changes_nothing(world, call, args, kwargs, words):
    cluster, client, models = world
    with pytest.raises(ectable.InvalidRequest) as err:
        getattr(client, call)(*args, **kwargs)
    assert isinstance(err.value, ValueError) and isinstance(err.value, ectable.Error)
    assert words in str(err.value), str(err.value)
    assert set(client.tables()) == set(TABLES)
    unchanged(cluster, client, models)


I64 = np.array([1, 2], dtype=np.int64)
ROWS8 = np.zeros((2, 8), dtype=F)
DELTA = {"op": "delta", "source": "node/9/x", "seq": 1, "tables": ["items"]}  # a window's parity delta of table
# "items" (records of 9 float32: 36 bytes)
# (header, arrays, words): sent to node 0 as they are
WIRE = [
    ({"op": "frobnicate"}, [], "'frobnicate'"),
    ({"op": 7}, [], "7"),
    ({"op": "get"}, [I64], "'table'"),
    ({"op": "get", "table": 5}, [I64], "'table'"),
    ({"op": "get", "table": "nope"}, [I64], "'nope'"),
    ({"op": "get", "table": "items"}, [np.array([1.5])], "float64"),
    ({"op": "get", "table": "items"}, [np.array([4000])], "4000"),
    ({"op": "get", "table": "items"}, [], "arrays"),
    ({"op": "get", "table": "items", "records": "yes"}, [I64], "'records'"),
    ({"op": "get_many", "tables": "items"}, [I64], "'tables'"),
    ({"op": "get_many", "tables": ["items"], "partial": "yes"}, [I64], "'partial'"),
    ({"op": "get_committed", "tables": ["items", "nope"]}, [I64, I64], "'nope'"),
    ({"op": "get_committed", "tables": ["items", "users"]}, [I64], "expected 2 arrays"),
    ({"op": "get_committed", "tables": ["items"]}, [np.array([4000])], "4000"),
    ({"op": "write", "parts": "items"}, [], "parts"),
    ({"op": "write", "parts": [["items", "erase"]]}, [I64, ROWS8], "'erase'"),
    ({"op": "write", "parts": [["items", "put"], ["items", "put"]]}, [I64, ROWS8, I64, ROWS8], "twice"),
    ({"op": "write", "parts": [["items", "put"]]}, [I64, np.zeros((2, 7), F)], "(2, 7)"),
    ({"op": "write", "parts": [["items", "put"]]}, [I64], "arrays"),
    ({"op": "write", "parts": [["items", "put"]]}, [np.array([1, 1]), ROWS8], "duplicate id 1"),
    ({"op": "write", "parts": [["items", "apply_gradient"]]}, [I64, np.full((2, 8), np.nan, F)], "nan"),
    ({"op": "write", "parts": [["users", "put"]]}, [I64, ROWS8], "(2, 4)"),
    ({"op": "write", "parts": [["items", "put"]], "cseq": "one"}, [I64, ROWS8], "'cseq'"),
    ({"op": "delta", "source": "x", "seq": "one", "tables": []}, [], "'seq'"),
    ({"op": "delta", "source": "x", "seq": 1, "tables": ["items", "items"]}, [], "twice"),
    ({"op": "delta", "seq": 1, "tables": []}, [], "'source'"),
    (DELTA, [I64, I64, np.zeros(72, np.uint8)], "shape must be int64 [1, 2]"),
    (DELTA, [np.array([[3, 36]]), I64, np.zeros(108, np.uint8)], "ids must be int64 [3]"),
    (DELTA, [np.array([[2, 36]]), I64, np.zeros(70, np.uint8)], "bytes must be uint8 [72]"),
    (DELTA, [np.array([[2, 32]]), I64, np.zeros(64, np.uint8)], "must be 36 bytes"),
    (DELTA, [np.array([[1, 36]]), np.array([5000]), np.zeros(36, np.uint8)], "5000"),
    (DELTA, [np.array([[-1, 36]]), I64[:0], np.zeros(0, np.uint8)], ">= 0"),
    (DELTA, [np.array([[1, 36]]), np.array([-1]), np.zeros(36, np.uint8)], "id -1"),
    ({**DELTA, "tables": ["items", "twin", "users"]},  # rows whose int64 sum wraps around to the one id
     [np.array([[2 ** 63 - 1, 36], [2 ** 63 - 1, 36], [3, 32]]), I64[:1], np.zeros(24, np.uint8)], f"ids must be int64 [{2 ** 64 + 1}]"),
    ({**DELTA, "tables": [["items"]]}, [np.array([[1, 36]]), I64[:1], np.zeros(36, np.uint8)], "['items']"),
    ({"op": "holds", "table": "nope"}, [I64], "'nope'"),
    ({"op": "holds_many", "tables": ["nope", "items"]}, [I64, I64], "'nope'"),
    ({"op": "holds_many", "tables": ["items"]}, [], "expected 1 arrays"),
    ({"op": "holds_many", "tables": [], "source": "repair/x", "position": 1, "dead": "node/1/x"}, [], "at least one"),
    ({"op": "holds_many", "tables": ["items", "items"]}, [I64, I64], "once"),
    ({"op": "holds_many", "tables": ["users", "items"], "source": "repair/x", "position": 1, "dead": "node/1/x"},
     [np.array([10 ** 9]), I64], "1000000000"),
    ({"op": "get_parity", "table": "items"}, [np.array([10 ** 9])], "1000000000"),
    ({"op": "get_parity_many", "tables": ["items", "users"]}, [I64, np.array([10 ** 9])], "1000000000"),
    ({"op": "get_parity_many", "tables": [["items"]]}, [I64], "['items']"),
    ({"op": "restore", "table": "items", "cut": {"x": "y"}}, [I64, ROWS8], "cut"),
    ({"op": "restore", "table": "items", "kind": "parity"}, [I64], "arrays"),
    ({"op": "restore_rows", "tables": ["nope", "items"]}, [I64, ROWS8, I64, np.zeros((2, 9), F)], "'nope'"),
    ({"op": "restore_rows", "tables": ["items"]}, [I64], "expected 2 arrays"),
    ({"op": "restore_rows", "tables": ["items"]}, [I64, ROWS8], "wrong shape"),
    ({"op": "restore_rows", "tables": ["items"]}, [I64, np.zeros((2, 9), F)], "do not live on node 0"),
    ({"op": "invalidate", "table": "items"}, [np.array([-1])], "-1"),
    ({"op": "invalidate", "table": "nope"}, [I64], "'nope'"),
    ({"op": "missing", "limit": "all"}, [], "'limit'"),
    ({"op": "missing", "limit": -1, "parts": 2}, [], "limit -1"),
    ({"op": "missing", "part": 2, "parts": 2}, [], "part 2 of 2"),
    ({"op": "missing", "part": -1, "parts": 2}, [], "part -1 of 2"),
    ({"op": "missing", "parts": 99}, [], "part 0 of 99"),
    ({"op": "replay", "replayer": "w", "entries": "all"}, [], "entries"),
    ({"op": "create_table", "spec": "items"}, [], "'spec'"),
    ({"op": "create_table", "spec": {"name": "items", "num_rows": 1000, "dim": 9, "seed": 1, "init": {"kind": "zeros"},
                                     "optimizer": {"name": "rowwise_adagrad", "lr": 0.05}}}, [], "dim: 8 vs 9"),
    ({"op": "map", "endpoints": []}, [], "map"),
    ({"op": "shutdown"}, [], "shutdown"),
    ({"op": "fault", "name": "die_after_write", "token": "guess"}, [], "fault"),
    ({"op": "freeze", "token": "guess"}, [], "freeze"),
    ({"op": "freeze", "on": "yes"}, [], "'on'"),
    ({"op": "hand_over"}, [], "hand_over"),
    ({"op": "take_over", "state": {}, "config": {}, "token": "guess"}, [], "take_over"),
    ({"op": "take_over", "state": "all", "config": {}}, [], "'state'"),
    ({"op": "sync", "close": "yes"}, [], "'close'"),
    ({"op": "applied", "source": 5}, [], "'source'"),
    ({"op": "rollback", "source": "x", "window": "one", "clients": {}}, [], "'window'"),
    ({"op": "rollback", "source": "node/9/x", "window": 1, "clients": {}}, [], "'node/9/x'"),
    ({"op": "drop_table", "table": 5}, [], "'table'"),
    ({"op": "write", "parts": [["items", "records"]]}, [I64, ROWS8], "(2, 9)"),
    ({"op": "snapshot", "number": 1, "root": "r", "directory": "memory://x", "kind": "most"}, [], "'most'"),
    ({"op": "snapshot", "number": 1, "root": "r", "directory": "memory://x", "kind": "full", "bits": 5}, [], "5"),
    ({"op": "snapshot", "number": 0, "root": "r", "directory": "memory://x", "kind": "full"}, [], "number"),
    ({"op": "snapshot", "number": 1, "root": "r", "directory": "memory://x", "kind": "full", "state_bits": 1}, [],
     "state_bits 1"),
    ({"op": "snapshot", "number": 1, "directory": "memory://x", "kind": "full"}, [], "'root'"),
    ({"op": "snapshot_progress", "number": 3}, [], "checkpoint 3"),
]


@pytest.mark.parametrize("header,arrays,words", WIRE, ids=[f"{h['op']}-{n}" for n, (h, _, _) in enumerate(WIRE)])
def test_a_bad_wire_request_is_refused_by_name_and_changes_nothing(world, header, arrays, words):
    cluster, client, models = world
    reply, _ = cluster.channel(0).call(dict(header), list(arrays), 10.0)
    assert reply.get("error") in (ErrorCode.INVALID, ErrorCode.MALFORMED), reply
    assert words in reply.get("message", ""), reply
    unchanged(cluster, client, models)


def test_the_table_covers_every_public_call_and_wire_operation():
    from ectable.protocol.messages import REQUESTS
    assert len(PUBLIC) + len(WIRE) >= 60
    assert {c for c, *_ in PUBLIC} >= {"create_table", "drop_table", "get", "get_many", "put", "apply_gradient",
                                        "apply_gradient_many"}
    skipped = {"tables", "step", "status", "ping"}  # take no value that could be bad
    assert {h["op"] for h, _, _ in WIRE if isinstance(h["op"], str)} >= set(REQUESTS) - skipped
