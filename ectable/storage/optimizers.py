"""Server-side sparse optimizers: one small interface, applied in float32.

A row's record is its weights followed by its optimizer state:
`record[:, :dim]` are weights, `record[:, dim:]` the state (zeros at start).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class Optimizer(ABC):
    """Updates rows in place from their (already coalesced) gradients."""

    name = ""

    def __init__(self, lr: float = 0.01, eps: float = 1e-8):
        lr, eps = float(lr), float(eps)
        if not (np.isfinite(lr) and lr > 0 and np.isfinite(eps) and eps >= 0):
            raise ValueError(f"optimizer {self.name!r} needs lr > 0 and eps >= 0, got lr={lr} eps={eps}")
        self.lr, self.eps = np.float32(lr), np.float32(eps)

    @abstractmethod
    def state_width(self, dim: int) -> int:
        """Float32 state values kept per row."""

    @abstractmethod
    def step(self, records: np.ndarray, grads: np.ndarray, dim: int) -> None:
        """Apply one step to `records` ([n, dim + state]) in place."""

    def get_config(self) -> dict:
        return {"name": self.name, "lr": float(self.lr), "eps": float(self.eps)}


class SGD(Optimizer):
    """w -= lr * g"""

    name = "sgd"

    def state_width(self, dim):
        return 0

    def step(self, records, grads, dim):
        records[:, :dim] -= self.lr * grads


class Adagrad(Optimizer):
    """s += g*g; w -= lr * g / (sqrt(s) + eps)"""

    name = "adagrad"

    def state_width(self, dim):
        return dim

    def step(self, records, grads, dim):
        state = records[:, dim:]
        state += grads * grads
        records[:, :dim] -= self.lr * grads / (np.sqrt(state) + self.eps)


class RowwiseAdagrad(Optimizer):
    """s_row += mean(g*g); w -= lr * g / (sqrt(s_row) + eps)  (FBGEMM/DLRM semantics)."""

    name = "rowwise_adagrad"

    def state_width(self, dim):
        return 1

    def step(self, records, grads, dim):
        state = records[:, dim:]
        state += np.mean(grads * grads, axis=1, dtype=np.float32, keepdims=True)
        records[:, :dim] -= self.lr * grads / (np.sqrt(state) + self.eps)


registry: dict[str, type[Optimizer]] = {cls.name: cls for cls in (SGD, Adagrad, RowwiseAdagrad)}


def get_optimizer(config: dict) -> Optimizer:
    """An optimizer from its config dict ({"name", "lr", "eps"})."""
    config = dict(config)
    name = config.pop("name", None)
    if name not in registry:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {sorted(registry)}")
    return registry[name](**config)
