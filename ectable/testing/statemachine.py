"""A Hypothesis state machine that drives a cluster against a dict of rows, killing, draining, adding and
recovering nodes and taking checkpoints.

Subclass `ClusterMachine` (or call `machine_for`) with the cluster's settings; run it with
`run_state_machine_as_test` or expose its `TestCase`. Invariants: every row equals the model,
after `flush()` every parity row equals a fresh encode of its stripe, and every finished
checkpoint restores, into a cluster of another shape, exactly the model as it was at its cut.
"""
from __future__ import annotations

import shutil
import tempfile
import time

import numpy as np
from hypothesis import event, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ..process.local import LocalCluster
from ..checkpoint.history import Chain
from ..checkpoint.policy import POLICIES
from ..errors import Error, InvalidRequest
from .checks import check_parity, read_records
from .reference import ReferenceTable

TABLES = {  # name: (rows, dim, optimizer); row counts leave the last stripe short
    "users": (37, 3, "rowwise_adagrad"),
    "items": (61, 4, "adagrad"),
    "ads": (23, 2, "sgd"),
}

finite = st.floats(-4, 4, width=32, allow_subnormal=False)


class ClusterMachine(RuleBasedStateMachine):
    """put / get / apply_gradient / step / flush / kill / drain / add_node / recover against a dict model."""

    nodes, code, k, r, spares = 5, "xor", 4, 1, 2
    window_rows = 50  # small, so windows also close by size
    window_steps = 1  # steps per window
    processes = False

    def __init__(self):
        super().__init__()
        self.cluster = LocalCluster(nodes=self.nodes, code=self.code, k=self.k, r=self.r, spares=self.spares,
                                    processes=self.processes, window_rows=self.window_rows, window_seconds=1e9,
                                    window_steps=self.window_steps)
        self.client = self.cluster.connect()
        self.model = {}
        for seed, (name, (rows, dim, optimizer)) in enumerate(TABLES.items()):
            self.client.create_table(name, num_rows=rows, dim=dim, optimizer=optimizer, lr=0.1,
                                     init="normal" if seed % 2 else "uniform", seed=seed)
            self.model[name] = ReferenceTable(self.client._table(name)[0])
        self.lost = set()  # positions whose node died and has not been rebuilt
        self.killed: dict[int, str] = {}  # position -> identity killed there, until recovered
        self.chain = tempfile.mkdtemp(prefix="ectable-machine-")  # where checkpoints go
        self.cuts: dict[int, dict] = {}  # checkpoint number -> the model's records at its cut
        self.finished: set[int] = set()
        self.killed_while_writing: set[int] = set()  # positions killed since the last checkpoint was taken

    def teardown(self):
        self.cluster.close()
        shutil.rmtree(self.chain, ignore_errors=True)

    def _records(self) -> dict:
        return {name: np.array([self.model[name].record(i) for i in range(rows)]) for name, (rows, _, _) in TABLES.items()}

    def _ids(self, data, name, unique=False):
        rows = TABLES[name][0]
        return np.array(data.draw(st.lists(st.integers(0, rows - 1), min_size=1, max_size=12, unique=unique)), dtype=np.int64)

    def _matrix(self, data, name, n):
        dim = TABLES[name][1]
        return np.array(data.draw(st.lists(finite, min_size=n * dim, max_size=n * dim)), dtype=np.float32).reshape(n, dim)

    @rule(data=st.data(), name=st.sampled_from(sorted(TABLES)))
    def get(self, data, name):
        ids = self._ids(data, name)
        np.testing.assert_array_equal(self.client.get(name, ids), self.model[name].get(ids))

    @rule(data=st.data(), name=st.sampled_from(sorted(TABLES)))
    def put(self, data, name):
        ids = self._ids(data, name, unique=True)
        rows = self._matrix(data, name, ids.size)
        self.client.put(name, ids, rows)
        self.model[name].put(ids, rows)

    @rule(data=st.data(), name=st.sampled_from(sorted(TABLES)))
    def apply_gradient(self, data, name):
        ids = self._ids(data, name)
        grads = self._matrix(data, name, ids.size)
        self.client.apply_gradient(name, ids, grads)
        self.model[name].apply_gradient(ids, grads)

    @rule(data=st.data(), name=st.sampled_from(sorted(TABLES)))
    def apply_gradient_many(self, data, name):
        other = sorted(TABLES)[0]
        batch = {}
        for table in {name, other}:
            ids = self._ids(data, table)
            batch[table] = (ids, self._matrix(data, table, ids.size))
        self.client.apply_gradient_many(batch)
        for table, (ids, grads) in batch.items():
            self.model[table].apply_gradient(ids, grads)

    @rule(name=st.sampled_from(sorted(TABLES)), bad=st.sampled_from(["id", "nan", "shape", "dup"]))
    def rejected(self, name, bad):
        rows, dim, _ = TABLES[name]
        ids, values = np.array([0, 1]), np.zeros((2, dim), dtype=np.float32)
        if bad == "id":
            ids = np.array([0, rows])
        elif bad == "nan":
            values[1, 0] = np.nan
        elif bad == "shape":
            values = np.zeros((2, dim + 1), dtype=np.float32)
        else:
            ids = np.array([1, 1])
        try:
            (self.client.put if bad == "dup" else self.client.apply_gradient)(name, ids, values)
        except InvalidRequest as exc:
            assert repr(name) in str(exc)
        else:
            raise AssertionError(f"bad {bad} was accepted")

    @rule()
    def step(self):
        self.client.step()

    @rule()
    def flush(self):
        self.client.flush()
        check_parity(self.cluster, self.client)

    @rule(policy=st.sampled_from(POLICIES), bits=st.sampled_from([None, None, 8]))
    def checkpoint(self, policy, bits):
        self._wait_checkpoint()
        number = self.client.checkpoint(self.chain, policy=policy, bits=bits)
        self.cuts[number] = (bits, self._records())
        self.killed_while_writing = set()

    @rule()
    def checkpoint_wait(self):
        self._wait_checkpoint()

    def _wait_checkpoint(self):
        """The checkpoint being written finishes, or fails only because a node was killed meanwhile."""
        pending = self.client._checkpoints.pending
        try:
            self.client.checkpoint_wait()
        except Error as exc:
            assert "failed" in str(exc) and pending is not None and set(pending.nodes) & self.killed_while_writing, exc
            event("a checkpoint failed: a node was killed while it was written")
            return
        if pending is not None:
            self.finished.add(pending.number)

    @precondition(lambda self: self.finished)
    @rule(data=st.data())
    def restore(self, data):
        number = data.draw(st.sampled_from(sorted(self.finished)))
        cut = self.cuts[number][1]
        links = Chain(self.chain).manifest(number)["chain_numbers"]  # a row comes from the last that holds it
        bits = max((self.cuts[n][0] or 0 for n in links), default=0) or None
        with LocalCluster(nodes=4, code="rs", k=2, r=2, processes=False) as other:
            client = other.connect()
            assert client.restore(self.chain, number).number == number
            for name, (rows, dim, _) in TABLES.items():
                got = read_records(client, name, np.arange(rows))
                if bits is None:
                    np.testing.assert_array_equal(got, cut[name], err_msg=name)
                else:  # 8-bit weights: within half a step of each row's range; optimizer state exact
                    np.testing.assert_array_equal(got[:, dim:], cut[name][:, dim:], err_msg=name)
                    span = np.ptp(cut[name][:, :dim], axis=1, keepdims=True)
                    assert (np.abs(got[:, :dim] - cut[name][:, :dim]) <= span / 255 * 0.5001 + 1e-6).all(), name
        event(f"restored checkpoint {number}")

    @precondition(lambda self: len(self.lost) < self.r)  # the machine's own count: preconditions must not race
    @rule(data=st.data())
    def kill(self, data):
        self._settle_others()
        alive = [p for p in range(self.nodes) if p not in self.lost]
        victim = data.draw(st.sampled_from(alive))
        self.killed[victim] = self.client._sources.get(victim)
        self.cluster.kill(victim)
        self.lost.add(victim)
        self.killed_while_writing.add(victim)
        event(f"killed, {len(self.lost)} lost")

    @precondition(lambda self: not self.lost)
    @rule(data=st.data())
    def drain(self, data):
        """An operator drains a node once every position is up: if a spare is free, the node is handed over to it,
        with or without parity (the same identity at another endpoint; nothing lost, every position stays up);
        with none, the drain gives up and changes nothing."""
        self._settle_others()
        p = data.draw(st.sampled_from(range(self.nodes)))
        source, epoch, leaving = self.cluster.source(p), self.cluster.epoch, self.cluster.endpoints[p]
        if self.cluster.spares_left() == 0:
            try:  # in process, each poll of the drain runs the decider until it has nothing left to do
                self.cluster.drain(p, timeout=0.1 if self.processes else 0.01)
            except Error as exc:
                assert "no free spare" in str(exc) and self.cluster.epoch == epoch, exc
                event("a drain without a spare gave up")
                return
            raise AssertionError("a drain without a spare went ahead")
        self.cluster.drain(p)
        moved = (self.cluster.source(p), self.cluster.state(p), self.cluster.endpoints[p] != leaving)
        assert moved == (source, "up", True), moved
        event("drained")

    @precondition(lambda self: not self.lost and self.nodes < type(self).nodes + 2)
    @rule()
    def add_node(self):
        """An operator adds a node once every position is up: the cluster is laid out again over one more position,
        each under a new identity, every one up (and every row as the model has it: the invariant)."""
        self._settle_others()
        sources = {self.cluster.source(p) for p in range(self.nodes)}
        p = self.cluster.add_node()
        self.nodes = self.cluster.config.nodes
        assert p == self.nodes - 1 and all(self.cluster.state(q) == "up" for q in range(self.nodes))
        assert not sources & {self.cluster.source(q) for q in range(self.nodes)}
        event("added a node")

    @rule()
    def recover(self):
        if self.cluster.spares_left() >= len([p for p in range(self.nodes) if self.cluster.state(p) == "dead"]):
            rebuilding = bool(self.client.status()["recovery"]["rebuilding"])
            self.client.wait_recovered(timeout=60)
            assert self.client.status()["recovery"]["rebuilding"] == []
            self.lost.clear()
            self.killed.clear()
            event("recovered" + (" a rebuilding node" if rebuilding else ""))

    def _settle_others(self, timeout: float = 60.0):
        """Wait until every node the machine did not kill is up: a node whose parity rows were dropped
        after a failure (its holders disagreed) counts as a failure until it rebuilt them."""
        deadline = time.monotonic() + timeout
        while True:
            self.cluster.refresh()
            if all(self.cluster.state(p) == "up" for p in range(self.nodes) if p not in self.lost):
                return
            assert time.monotonic() < deadline, "nodes stayed unhealthy"
            self.client.status()  # fails over what the map moved
            time.sleep(0.02)

    @invariant()
    def every_row_equals_the_model(self):
        """A full read, when it cannot change what it checks: not while the client has yet to fail over a
        killed node (the read would do it, at a moment the rules did not choose; they do it themselves)."""
        if any(self.client._sources.get(p) == source for p, source in self.killed.items()):
            event("full read skipped: a failover is pending")
            return
        for name, (rows, _, _) in TABLES.items():
            ids = np.arange(rows)
            expect = np.array([self.model[name].record(i) for i in ids])
            np.testing.assert_array_equal(read_records(self.client, name, ids), expect, err_msg=name)


def machine_for(**settings) -> type[ClusterMachine]:
    """A ClusterMachine subclass with other cluster settings (nodes, code, k, r, spares, processes,
    window_rows, window_steps)."""
    return type(f"ClusterMachine_{settings.get('code', 'xor')}", (ClusterMachine,), settings)
