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
    if ids.dtype not in (torch.int64, torch.int32):  # as torch's embedding takes them
        raise InvalidRequest(f"table {table!r}: ids must be an int64 or int32 tensor, got {ids.dtype}")
    uniq, inverse = torch.unique(ids.detach().cpu().to(torch.int64), sorted=True, return_inverse=True)
    return uniq, inverse


def fetch(client, ids: dict, device: torch.device, sink: "Sink | None") -> dict:
    """{table: ids tensor} -> {table: (unique ids as numpy, inverse of the ids' shape on `device`, rows
    [unique, dim] on `device`)}, all tables in one read; the rows are leaves whose gradients reach `sink`
    when autograd records (never under `torch.no_grad()` or `inference_mode`, nor without a sink)."""
    plan = {table: unique(table, value) for table, value in ids.items()}
    rows = client.get_many({table: uniq.numpy() for table, (uniq, _) in plan.items()})
    record = sink is not None and torch.is_grad_enabled()
    out = {}
    for table, (uniq, inverse) in plan.items():
        leaf = torch.from_numpy(rows[table]).to(device, non_blocking=True)
        ids_np = uniq.numpy()
        if record:
            leaf.requires_grad_(True)
            leaf.register_post_accumulate_grad_hook(sink.hook(client, table, ids_np))
        out[table] = (ids_np, inverse.to(device, non_blocking=True), leaf)
    return out


class Sink:
    """Where a module's lookups' gradients go: kept for an optimizer (`take`), or, with
    `apply_in_backward`, sent when the backward pass that produced them ends."""

    def __init__(self, apply_in_backward: bool = False):
        self.apply_in_backward = apply_in_backward
        self.pending: list[Grad] = []

    def hook(self, client, table: str, ids: np.ndarray):
        def on_grad(leaf: torch.Tensor) -> None:
            grads, leaf.grad = leaf.grad.detach().cpu(), None  # taken: a later pass starts a new .grad
            entry = Grad(client, table, ids, grads.numpy())
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
    """Gradients of `apply_in_backward` lookups by backward pass (the engine's graph task), each pass's sent
    as it ends. A pass that raises never ends: its gradients are dropped once STALE passes came after."""

    STALE = 8
    pending: dict[int, list[Grad]] = {}

    @classmethod
    def add(cls, entry: Grad) -> None:
        task = torch._C._current_graph_task_id()
        if task not in cls.pending:
            for old in list(cls.pending)[: max(0, len(cls.pending) - cls.STALE)]:
                del cls.pending[old]
            cls.pending[task] = []
            torch.autograd.Variable._execution_engine.queue_callback(lambda: apply(cls.pending.pop(task, [])))
        cls.pending[task].append(entry)
