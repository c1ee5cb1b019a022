"""Server-side sparse optimizers: one small interface, applied in float32.

A row's record is its weights followed by its optimizer state:
`record[:, :dim]` are weights, `record[:, dim:]` the state (zeros at start).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from ..protocol.validate import F32_MAX, is_number


class Optimizer(ABC):
    """Updates rows in place from their (already coalesced) gradients."""

    name = ""
    divides = False  # whether eps keeps a division by the accumulated state finite (then it must be > 0)

    def __init__(self, lr: float = 0.01, eps: float = 1e-8):
        for key, value in (("lr", lr), ("eps", eps)):
            if not is_number(value):
                raise ValueError(f"optimizer {self.name!r} needs a number for {key}, got {value!r}")
        lr, eps = float(lr), float(eps)
        if not (0 < lr <= F32_MAX and 0 <= eps <= F32_MAX):
            raise ValueError(f"optimizer {self.name!r} needs a finite float32 lr > 0 and eps >= 0, got lr={lr} eps={eps}")
        if self.divides and not np.float32(eps) > 0:
            raise ValueError(f"optimizer {self.name!r} needs eps > 0 (a zero gradient on a fresh row would "
                             f"divide 0 by 0), got eps={eps}")
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
    """w -= lr * g, rounded once (as torch's `add_(g, alpha=-lr)`, a fused multiply-add)"""

    name = "sgd"

    def state_width(self, dim):
        return 0

    def step(self, records, grads, dim):
        records[:, :dim] = fused_add(records[:, :dim], -self.lr, grads)


class Adagrad(Optimizer):
    """s += g*g (fused: one rounding, as torch's `addcmul_`); w -= lr * g / (sqrt(s) + eps): the float32
    operations of `torch.optim.Adagrad(fused=True)` (its default kernel rounds the division otherwise)."""

    name = "adagrad"
    divides = True

    def state_width(self, dim):
        return dim

    def step(self, records, grads, dim):
        state = records[:, dim:]
        state[:] = fused_add(state, grads, grads)
        records[:, :dim] -= self.lr * grads / (np.sqrt(state) + self.eps)


def fused_add(s: np.ndarray, a, b: np.ndarray) -> np.ndarray:
    """float32 s + a*b rounded once, like a fused multiply-add (torch's CPU kernels use one): a float32
    product is exact in float64, and the float64 sum rounded to float32 differs from a true fma only when
    it lands on a float32 tie."""
    return (s.astype(np.float64) + np.multiply(a, b, dtype=np.float64)).astype(np.float32)


class RowwiseAdagrad(Optimizer):
    """s_row += mean(g*g); w -= lr * g / (sqrt(s_row) + eps)  (FBGEMM/DLRM semantics)."""

    name = "rowwise_adagrad"
    divides = True

    def state_width(self, dim):
        return 1

    def step(self, records, grads, dim):
        state = records[:, dim:]
        state += np.mean(grads * grads, axis=1, dtype=np.float32, keepdims=True)
        records[:, :dim] -= self.lr * grads / (np.sqrt(state) + self.eps)


registry: dict[str, type[Optimizer]] = {cls.name: cls for cls in (SGD, Adagrad, RowwiseAdagrad)}


WRITES = {"put": "rows", "apply_gradient": "gradients", "records": "records"}  # write kinds: what their values are


def write_rows(optimizer: Optimizer, kind: str, records: np.ndarray, values: np.ndarray, dim: int) -> None:
    """`records` after a "put" of weights `values`, an "apply_gradient" step with gradients `values` or a
    "records" write of whole records (weights and optimizer state: a restore), in place; an overflow is
    left for the caller to refuse (`validate.finite_result`)."""
    if kind == "put":
        records[:, :dim] = values
    elif kind == "records":
        records[:] = values
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            optimizer.step(records, values, dim)


def get_optimizer(config: dict) -> Optimizer:
    """An optimizer from its config dict ({"name", "lr", "eps"})."""
    config = dict(config)
    name = config.pop("name", None)
    if not isinstance(name, str) or name not in registry:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {sorted(registry)}")
    unknown = sorted(str(key) for key in config if key not in ("lr", "eps"))
    if unknown:
        raise ValueError(f"unknown argument(s) {unknown} for optimizer {name!r} (it takes lr and eps)")
    return registry[name](**config)
