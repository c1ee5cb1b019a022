"""A node's state handed over (`storage.handover`): the node rebuilt from it on another process is the same node —
every field of it, through the wire codec — and answers what comes next exactly as the original does."""
from collections import deque

import numpy as np
import pytest

import ectable
from ectable.errors import InvalidRequest
from ectable.protocol import messages
from ectable.storage import handover
from ectable.storage.node import Node
from ectable.storage.shard import Shard
from ectable.storage.window import TableWindow, Windows
from ectable.transport import codec

pytestmark = pytest.mark.timeout(120)

NOT_STATE = {"clock", "config", "code", "spec", "layout", "optimizer", "sources",
             "arena", "block", "parity_base",  # where parity rows sit in memory: compared as `parity`
             "records_arena", "rblock", "rbase",  # where records sit in memory: compared as `records`
             "_lists"}  # what the table lists of deltas resolve to: a cache
TIMES = {"window_opened", "rebuild_since", "writer_seen", "gone", "promised", "late"}  # travel as ages: equal within 1 s


def same(a, b, path="node") -> None:
    """Assert `a` and `b` hold the same state, field by field (objects by their attributes)."""
    if isinstance(a, (TableWindow, Windows)):  # a table's flags; the rows in the windows (where in memory: not state)
        assert type(a) is type(b), path
        if isinstance(a, TableWindow):
            same(a.dirty, b.dirty, f"{path}.dirty")
        else:
            assert a.rows() == b.rows(), f"{path}: {a.rows()} != {b.rows()} rows in the window"
    elif isinstance(a, (Node, Shard)) or type(a).__module__.startswith("ectable.storage"):
        assert type(a) is type(b), path
        for name in getattr(type(a), "__slots__", None) or vars(a).keys() | vars(b).keys():
            if name in NOT_STATE or name.startswith("_thread") or name == "_began":
                continue
            va, vb = getattr(a, name, "<missing>"), getattr(b, name, "<missing>")
            if name == "writer" and va is not None:  # a finished checkpoint's writer: what clients ask of it
                va, vb = va.progress(), vb.progress()
            if name in TIMES:
                if isinstance(va, dict):
                    assert va.keys() == vb.keys(), f"{path}.{name}"
                    assert all(abs(va[k] - vb[k]) < 1.0 for k in va), f"{path}.{name}"
                continue
            same(va, vb, f"{path}.{name}")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: {a!r} != {b!r}"
        for k in a:
            same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple, deque)):
        assert type(a) is type(b) and len(a) == len(b), f"{path}: {a!r} != {b!r}"
        for n, (x, y) in enumerate(zip(a, b)):
            if path.endswith(".windows") or "retained" in path and n == 1 and isinstance(x, float):
                continue  # arrival times: ages
            same(x, y, f"{path}[{n}]")
    elif isinstance(a, float) and path.endswith("]"):
        assert abs(a - b) < 1.0, path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def trained_cluster(tmp_path):
    """An in-process rs cluster after writes, gradients, a dropped table, a checkpoint and windows closed."""
    cluster = ectable.LocalCluster(nodes=6, code="rs", k=4, r=2, processes=False)
    client = cluster.connect()
    rng = np.random.default_rng(7)
    client.create_table("a", num_rows=5000, dim=8, optimizer="adagrad")
    client.create_table("b", num_rows=700, dim=4, init="normal")
    client.create_table("c", num_rows=100, dim=2)
    client.drop_table("c")
    for n in range(6):
        ids = rng.choice(5000, size=300, replace=False)
        client.apply_gradient_many({"a": (ids, rng.normal(size=(300, 8)).astype(np.float32)),
                                    "b": (ids[:50] % 700, rng.normal(size=(50, 4)).astype(np.float32))})
        client.step()
        if n == 2:
            client.checkpoint(str(tmp_path / "ck"), policy="full")
            client.checkpoint_wait(timeout=60)
    client.flush()
    return cluster, client


def wire(state, arrays, writable=False):
    """Through the codec, as a node process would send it (into writable frames, as ZeroMQ's)."""
    frames = codec.encode(state, arrays)
    return codec.decode([(bytearray if writable else bytes)(f) for f in frames])


def test_a_handed_over_node_is_the_same_node_and_answers_the_same(tmp_path):
    cluster, client = trained_cluster(tmp_path)
    with cluster, client:
        for p in range(6):
            with cluster.lock:  # the cluster's timer changes nothing meanwhile (it reads the writers: `late` below)
                node = cluster.node(p)
                assert handover.ready(node) is None
                node.late = {f"writer/{p}": node.clock() - 5}  # may still replay late: the spare waits for it too
                copy = handover.restore(*wire(*handover.export(node)), node.config)
                same(node, copy)
                state, arrays = wire(*handover.export(node), writable=True)
                kept = handover.restore(state, arrays, node.config, own=True)  # the wire's arrays, not copies
                same(node, kept)
                assert all(any(np.shares_memory(s.records, a) for a in arrays) for s in kept.shards.values())
                assert not any(np.shares_memory(s.parity, a) for a in arrays for s in kept.shards.values())  # arena
        node, copy = cluster.node(1), handover.restore(*handover.export(cluster.node(1)), cluster.node(1).config)
        # what comes next: a write (new, then retried), a read, a window closed into deltas
        ids = np.arange(5000, dtype=np.int64)
        ids = ids[node.shards["a"].layout.data_node(ids) == 1][::97]
        header = messages.Write(parts=[["a", "apply_gradient"]], cid="w/1", cseq=10**6).header()
        grads = np.ones((ids.size, 8), dtype=np.float32)
        for target in (node, copy):
            assert target.handle(header, [ids, grads])[0]["seq"] == node.write_seq
            assert target.handle(header, [ids, grads])[0]["duplicate"]
            target.close_window()
        assert node.handle(messages.Get(table="a").header(), [ids])[1][0].tobytes() == \
            copy.handle(messages.Get(table="a").header(), [ids])[1][0].tobytes()
        sent, resent = node.take_outbox(), copy.take_outbox()
        assert [(t, h) for t, h, _ in sent] == [(t, h) for t, h, _ in resent]
        assert all(np.array_equal(x, y) for (_, _, xs), (_, _, ys) in zip(sent, resent) for x, y in zip(xs, ys))


def test_only_a_quiet_node_hands_over(tmp_path):
    cluster, client = trained_cluster(tmp_path)
    with cluster, client:
        ids = np.arange(0, 5000, 7, dtype=np.int64)
        client.apply_gradient("a", ids, np.ones((ids.size, 8), dtype=np.float32))  # a window left open
        node = cluster.node(0)
        assert "window is open" in handover.ready(node)
        with pytest.raises(InvalidRequest, match="cannot hand over"):
            handover.export(node)
        node.close_window()
        assert "acknowledgement" in handover.ready(node)


@pytest.mark.parametrize("damage", ["version", "shape", "missing", "index", "retained"])
def test_a_bad_state_is_refused(tmp_path, damage):
    cluster, client = trained_cluster(tmp_path)
    with cluster, client:
        node = cluster.node(2)
        state, arrays = handover.export(node)
        if damage == "version":
            state["version"] = 99
        elif damage == "shape":
            arrays[state["shards"][0]["records"]] = np.zeros((3, 3), dtype=np.float32)
        elif damage == "missing":
            del state["applied"]
        elif damage == "retained":  # a kept delta naming a table the state does not hold
            log = next(log for log in state["retained"]["windows"].values() if log)
            log[0][3][0][0] = ["nope"]
        else:
            arrays = arrays[:2]
        with pytest.raises(InvalidRequest):
            handover.restore(state, arrays, node.config)


def test_rows_copied_while_the_node_serves_and_the_changed_ones_after_make_the_same_node(tmp_path):
    """`copy_rows` while the node serves; then writes, reads that compute rows' initial values, a checkpoint
    (which clears other flags), a window closed; `export` of only the rows changed since, laid over the copy,
    gives the same node as a whole export — and carries far fewer rows."""
    cluster, client = trained_cluster(tmp_path)
    with cluster, client:
        client.create_table("d", num_rows=900, dim=4, init="normal")  # its rows' initial values not computed yet
        node = cluster.node(3)
        head, rows = wire(*handover.copy_rows(node))
        rows = handover.copied_rows(head, rows)
        rng = np.random.default_rng(3)
        ids = rng.choice(5000, size=200, replace=False)
        client.apply_gradient("a", ids, rng.normal(size=(200, 8)).astype(np.float32))
        client.get("d", np.arange(0, 900, 3))  # initial values computed on first use: changed rows too
        client.checkpoint(str(tmp_path / "ck2"), policy="incremental")
        client.checkpoint_wait(timeout=60)
        client.flush()
        state, arrays = handover.export(node, copied=set(rows))
        copy = handover.restore(*wire(state, arrays), node.config, rows=rows)
        same(node, copy)
        whole = handover.export(node)[1]
        assert sum(a.nbytes for a in arrays) < sum(a.nbytes for a in whole) * 0.7
        changed = {e["spec"]["name"]: arrays[e["changed"][0]].size for e in state["shards"]}
        assert 0 < changed["a"] <= 200 and changed["b"] == 0 and 0 < changed["d"] <= 300
        with pytest.raises(InvalidRequest, match="not copied"):
            handover.restore(state, arrays, node.config, rows={})


def test_a_handover_uses_only_the_last_copy_of_the_rows(tmp_path):
    """Two deciders (one deposed) may copy a node's rows in turn: the flags then count from the later copy, so an
    export against the earlier one is refused (a copy asked for again, by the same name, flags nothing anew), and
    a thaw needs a later map than the freeze, and a freeze on an older map than the node's is refused."""
    cluster, client = trained_cluster(tmp_path)
    with cluster, client:
        host, token = cluster._hosts[cluster.endpoints[4]], cluster.decider.token
        first, second = "decider/a/1", "decider/b/1"
        for copy in (first, second, second):
            host.handle(messages.HandOver(rows=True, copy=copy, token=token).header(), [])
            if copy == second:
                client.apply_gradient("a", np.arange(5000), np.ones((5000, 8), np.float32))
        assert all((s.window.dirty & handover.SINCE_COPY).any() for s in (host.node.shards["a"],))
        epoch = cluster.epoch
        assert "older than this node's map" in host.handle(messages.Freeze(epoch=epoch - 1, token=token).header(),
                                                           [])[0]["message"]  # from a decider deposed since
        host.handle(messages.Freeze(epoch=epoch, token=token).header(), [])
        cluster._deliver()  # the window it closed, to its peers
        stale = host.handle(messages.HandOver(copied=first, token=token).header(), [])[0]
        assert "copied again" in stale["message"] and not host.handed
        reply, arrays = host.handle(messages.HandOver(copied=second, token=token).header(), [])
        assert all(e["changed"] is not None for e in reply["state"]["shards"]) and host.handed
        assert "later" in host.handle(messages.Freeze(on=False, epoch=epoch, token=token).header(), [])[0]["message"]
        assert host.handle(messages.Freeze(on=False, epoch=epoch + 1, token=token).header(), [])[0]["not_ready"] is None
        assert not host.frozen and not host.handed
