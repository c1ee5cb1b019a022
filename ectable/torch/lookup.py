"""A batch's rows read once per table, as autograd leaves whose gradients go back to the store.

`fetch` reads the unique rows of every table of a batch in one `get_many` and returns them as
leaf tensors beside each id's position among them (the inverse), so the caller runs torch's own
`F.embedding` / `F.embedding_bag` on the local rows. When autograd records, each leaf gets a hook
that hands its gradient ([unique rows, dim], summed by torch over duplicates) to a `Sink`.

A `Sink` keeps the gradients until an optimizer takes them (deferred), or sends them at the end of
the backward pass that produced them (`apply_in_backward`): one `apply_gradient_many` per client for
every table that pass touched, then `client.step()`.
"""
from __future__ import annotations

import numpy as np
import torch

from ..errors import InvalidRequest


class Grad:
    """One lookup's gradient: `ids` (unique, ascending, int64) of `table` and `grads` [ids, dim] float32."""

    __slots__ = ("client", "table", "ids", "grads")

    def __init__(self, client, table: str, ids: np.ndarray, grads: np.ndarray):
        self.client, self.table, self.ids, self.grads = client, table, ids, grads


def unique(table: str, ids) -> tuple[torch.Tensor, torch.Tensor]:
    """(unique ids ascending, inverse of `ids`' shape) of an integer tensor, on the CPU."""
    if not isinstance(ids, torch.Tensor):
        raise InvalidRequest(f"table {table!r}: ids must be a torch tensor, got {type(ids).__name__}")
    if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise InvalidRequest(f"table {table!r}: ids must be an integer tensor (int64 or int32), got {ids.dtype}")
    uniq, inverse = torch.unique(ids.detach().cpu().to(torch.int64), sorted=True, return_inverse=True)
    return uniq, inverse


def fetch(client, ids: dict, device: torch.device, sink: "Sink") -> dict:
    """{table: ids tensor} -> {table: (unique ids as numpy, inverse on `device`, rows [unique, dim] on
    `device`)}, all tables in one read; the rows are leaves whose gradients reach `sink` when autograd
    records (never under `torch.no_grad()` or `inference_mode`)."""
    plan = {table: unique(table, value) for table, value in ids.items()}
    rows = client.get_many({table: uniq.numpy() for table, (uniq, _) in plan.items()})
    record = torch.is_grad_enabled()
    out = {}
    for table, (uniq, inverse) in plan.items():
        leaf = torch.from_numpy(rows[table]).to(device, non_blocking=True)
        ids_np = uniq.numpy()
        if record:
            leaf.requires_grad_(True)
            leaf.register_hook(sink.hook(client, table, ids_np))
        out[table] = (ids_np, inverse.to(device, non_blocking=True), leaf)
    return out


class Sink:
    """Where a module's lookups' gradients go: kept for an optimizer (`take`), or, with
    `apply_in_backward`, sent when the backward pass that produced them ends."""

    def __init__(self, apply_in_backward: bool = False, grad_scale: float = 1.0):
        self.apply_in_backward = apply_in_backward
        self.grad_scale = float(grad_scale)
        self.pending: list[Grad] = []

    def hook(self, client, table: str, ids: np.ndarray):
        def on_grad(grad: torch.Tensor) -> None:
            grads = grad.detach().to("cpu", torch.float32)
            if self.grad_scale != 1.0:
                grads = grads * self.grad_scale
            # a copy: autograd may keep `grad` as the leaf's .grad and add later passes into it in place
            entry = Grad(client, table, ids, np.array(grads.numpy(), dtype=np.float32, order="C", copy=True))
            if self.apply_in_backward:
                _InBackward.add(entry)
            else:
                self.pending.append(entry)
        return on_grad

    def take(self) -> list[Grad]:
        """The gradients kept since the last take, in the order backward produced them."""
        out, self.pending = self.pending, []
        return out

    def clear(self) -> None:
        self.pending = []


def apply(grads: list[Grad], clients=()) -> None:
    """Apply `grads` with one `apply_gradient_many` per client (a row's gradients summed first, in
    order, so every unique row takes one optimizer step), then `step()` every client touched and
    every client in `clients`."""
    by_client: dict[int, tuple] = {id(c): (c, {}) for c in clients}
    for g in grads:
        by_client.setdefault(id(g.client), (g.client, {}))[1].setdefault(g.table, []).append(g)
    for client, tables in by_client.values():
        if tables:
            client.apply_gradient_many({table: _joined(gs) for table, gs in tables.items()})
        client.step()


def _joined(grads: list[Grad]) -> tuple[np.ndarray, np.ndarray]:
    if len(grads) == 1:
        return grads[0].ids, grads[0].grads
    return np.concatenate([g.ids for g in grads]), np.concatenate([g.grads for g in grads])


class _InBackward:
    """Gradients of `apply_in_backward` lookups, sent once the backward pass that produced them ends."""

    pending: list[Grad] = []
    queued = False

    @classmethod
    def add(cls, entry: Grad) -> None:
        cls.pending.append(entry)
        if not cls.queued:
            cls.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(cls.flush)

    @classmethod
    def flush(cls) -> None:
        grads, cls.pending, cls.queued = cls.pending, [], False
        apply(grads)
