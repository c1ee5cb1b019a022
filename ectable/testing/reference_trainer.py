"""A trainer fed to a cluster and to the plain reference model alike, and the bit-for-bit check of the cluster
against the model (the kill and drain tests)."""
import numpy as np

from ..storage.initializers import init_rows
from .reference import ReferenceTable
from .checks import check_parity, read_records


class Trainer:
    """A cluster client and the reference model, fed the same requests: adagrad gradients (duplicate ids
    included) and puts of unique rows."""

    def __init__(self, client, table, rows, dim, seed):
        self.client, self.table, self.rows, self.dim = client, table, rows, dim
        client.create_table(table, num_rows=rows, dim=dim, optimizer="adagrad", lr=0.1, init="normal", seed=3)
        self.model = ReferenceTable(client._table(table)[0])
        self.rng = np.random.default_rng(seed)

    def train(self, rounds=3, batch=400, step=True):
        for _ in range(rounds):
            ids = self.rng.integers(0, self.rows, batch)
            grads = self.rng.standard_normal((batch, self.dim)).astype(np.float32)
            self.client.apply_gradient(self.table, ids, grads)
            self.model.apply_gradient(ids, grads)
            put = self.rng.choice(self.rows, batch // 8, replace=False)
            values = self.rng.standard_normal((put.size, self.dim)).astype(np.float32)
            self.client.put(self.table, put, values)
            self.model.put(put, values)
            if step:
                self.client.step()

    def expected(self, ids) -> np.ndarray:
        """Whole records the failure-free run holds (untouched rows: their initial weights, zero state)."""
        spec = self.model.spec
        out = np.zeros((ids.size, spec.width), dtype=np.float32)
        out[:, : spec.dim] = init_rows(spec.init, spec.seed, spec.name, ids, spec.dim)
        for n, i in enumerate(ids.tolist()):
            if i in self.model.rows:
                out[n] = self.model.rows[i]
        return out

    def check(self, what):
        """Every row's weights (client.get) and whole record (read_records) equal the model's, bit for bit."""
        ids = np.arange(self.rows)
        expect = self.expected(ids)
        weights = self.client.get(self.table, ids)
        bad = np.flatnonzero((weights.view(np.uint32) != expect[:, : self.dim].view(np.uint32)).any(axis=1))
        assert bad.size == 0, f"{what}: weights of {bad.size} rows differ, first {bad[:10].tolist()}"
        records = read_records(self.client, self.table, ids)
        bad = np.flatnonzero((records.view(np.uint32) != expect.view(np.uint32)).any(axis=1))
        assert bad.size == 0, f"{what}: records of {bad.size} rows differ, first {bad[:10].tolist()}"

    def recovered(self, cluster, batch: int = 400, timeout: float = 180.0) -> None:
        """Wait until every position is up and no spare is left, train on, then check parity and every record."""
        self.client.wait_recovered(timeout=timeout)
        assert all(cluster.state(p) == "up" for p in range(cluster.config.nodes)) and cluster.spares_left() == 0
        self.train(rounds=2, batch=batch)
        self.client.flush()
        check_parity(cluster, self.client)
        self.check("recovered")
