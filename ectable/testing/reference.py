"""A plain reference model of a table: a dict of row id -> record, updated row by row from SPEC formulas."""
from __future__ import annotations

import numpy as np

from ..storage.initializers import init_rows
from ..storage.optimizers import fused_add
from ..storage.table import TableSpec


class ReferenceTable:
    """What a failure-free store must hold: weights and optimizer state per row, in float32."""

    def __init__(self, spec: TableSpec):
        self.spec = spec
        self.rows: dict[int, np.ndarray] = {}
        self.lr = np.float32(spec.optimizer["lr"])
        self.eps = np.float32(spec.optimizer["eps"])

    def record(self, i: int) -> np.ndarray:
        i = int(i)
        if i not in self.rows:
            rec = np.zeros(self.spec.width, dtype=np.float32)
            rec[: self.spec.dim] = init_rows(self.spec.init, self.spec.seed, self.spec.name, [i], self.spec.dim)[0]
            self.rows[i] = rec
        return self.rows[i]

    def get(self, ids) -> np.ndarray:
        return np.array([self.record(i)[: self.spec.dim] for i in ids], dtype=np.float32).reshape(-1, self.spec.dim)

    def put(self, ids, rows) -> None:
        for i, row in zip(ids, np.asarray(rows, dtype=np.float32)):
            self.record(i)[: self.spec.dim] = row

    def apply_gradient(self, ids, grads) -> None:
        summed: dict[int, np.ndarray] = {}
        for i, g in zip(ids, np.asarray(grads, dtype=np.float32)):
            i = int(i)
            summed[i] = summed[i] + g if i in summed else g.copy()
        dim, name = self.spec.dim, self.spec.optimizer["name"]
        for i, g in summed.items():
            rec = self.record(i)
            w, s = rec[:dim], rec[dim:]
            if name == "sgd":
                w[:] = fused_add(w, -self.lr, g)
            elif name == "adagrad":
                s[:] = fused_add(s, g, g)
                w -= self.lr * g / (np.sqrt(s) + self.eps)
            else:  # rowwise_adagrad: FBGEMM semantics, mean of squares per row
                s += np.mean(g * g, dtype=np.float32)
                w -= self.lr * g / (np.sqrt(s[0]) + self.eps)
