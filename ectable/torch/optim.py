"""`SparseOptimizer`: the step that sends ectable modules' gradients to their tables."""
from __future__ import annotations

import numpy as np
import torch

from ..errors import Error, InvalidRequest
from ..lookahead import Lookahead
from .lookup import Grad, apply
from .modules import RemoteModule


class SparseOptimizer:
    """Applies the gradients that backward passes left on ectable modules, like a torch optimizer
    applies `.grad`: `step()` after `backward()` (after several, for gradient accumulation: a row's
    gradients are summed), `zero_grad()` to drop them. Every unique row takes one step of its table's
    optimizer on the nodes, then every client steps (closes its write window).

    `modules`: ectable modules, or any modules holding them (a whole model). With `process_group`
    (torch.distributed), every trainer calls `step()` at once: the trainers' gradients are averaged
    as DDP averages dense ones (so N trainers on a batch each equal one trainer on their union), every
    row is applied by one trainer, and `step()` returns once all have applied theirs."""

    def __init__(self, modules, process_group=None):
        if isinstance(modules, torch.nn.Module):
            modules = [modules]
        modules = list(modules)
        if not all(isinstance(mod, torch.nn.Module) for mod in modules):
            raise InvalidRequest("SparseOptimizer takes torch modules (ectable modules or models holding them)")
        found = {id(m): m for mod in modules for m in mod.modules() if isinstance(m, RemoteModule)}
        if not found:
            raise InvalidRequest("SparseOptimizer found no ectable module among the modules given")
        in_backward = [type(m).__name__ for m in found.values() if m.sink.apply_in_backward]
        if in_backward:
            raise InvalidRequest(f"modules with apply_in_backward=True apply their own gradients: {in_backward}")
        self.modules = list(found.values())
        self.clients = list({id(m.client): m.client for m in self.modules}.values())
        if process_group is not None and any(isinstance(c, Lookahead) for c in self.clients):
            raise InvalidRequest("a Lookahead's cache belongs to one trainer: several trainers would read rows "
                                 "another one holds updated in its cache")
        if process_group is not None and len(self.clients) > 1:
            raise InvalidRequest("across trainers, a SparseOptimizer's modules must share one client")
        self.group = process_group

    def zero_grad(self) -> None:
        """Drop every gradient not applied yet."""
        for m in self.modules:
            m.sink.clear()

    def step(self) -> None:
        """Apply the gradients (taken, even if the store refuses them: see `Client.apply_gradient_many`)."""
        grads = [g for m in self.modules for g in m.sink.take()]
        if self.group is None:
            apply(grads, self.clients)
            return
        import torch.distributed as dist
        every = _gathered(self.modules, grads, self.group)
        bad = [g.table for g in every if not np.isfinite(g.grads).all()]  # the same answer on every trainer
        if bad:
            raise InvalidRequest(f"tables {sorted(set(bad))}: a trainer's gradients are not finite; nothing applied")
        failed = None
        try:
            apply(_owned(every, self.group), self.clients)
        except Exception as exc:  # every trainer must learn of it, or the others would wait for it
            failed = exc
        flag = torch.tensor([failed is not None], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)  # also keeps any trainer from reading early
        if failed is not None:
            raise failed
        if flag.item():
            raise Error("another trainer's part of this step was refused (its rows are not applied; the other "
                        "trainers' rows are)")


def _gathered(modules: list, grads: list[Grad], group) -> list[Grad]:
    """Every trainer's gradients, table by table (sorted by name) and trainer by trainer, each scaled by
    trainers: three all_gathers (counts, ids, gradients) for all tables. Every trainer holds the
    same modules; tensors go over the group, never pickles."""
    import torch.distributed as dist
    world = dist.get_world_size(group)
    tables = {t: (m.client, dim) for m in modules for t, dim in m.table_dims.items()}  # one client
    names = sorted(tables)
    ids = [np.concatenate([g.ids for g in grads if g.table == t] or [np.empty(0, np.int64)]) for t in names]
    rows = [np.concatenate([g.grads for g in grads if g.table == t] or [np.empty((0, tables[t][1]), np.float32)])
            for t in names]
    counts = torch.tensor([i.size for i in ids], dtype=torch.int64)
    every = [torch.empty_like(counts) for _ in range(world)]
    dist.all_gather(every, counts, group=group)
    dims = torch.tensor([tables[t][1] for t in names], dtype=torch.int64)
    id_max = max(int(c.sum()) for c in every)
    if not id_max:
        return []
    float_max = max(int((c * dims).sum()) for c in every)
    mine_ids, mine_rows = torch.zeros(id_max, dtype=torch.int64), torch.zeros(float_max, dtype=torch.float32)
    mine_ids[: int(counts.sum())] = torch.from_numpy(np.concatenate(ids))
    mine_rows[: int((counts * dims).sum())] = torch.from_numpy(np.concatenate([r.reshape(-1) for r in rows]))
    all_ids = [torch.empty_like(mine_ids) for _ in range(world)]
    all_rows = [torch.empty_like(mine_rows) for _ in range(world)]
    dist.all_gather(all_ids, mine_ids, group=group)
    dist.all_gather(all_rows, mine_rows, group=group)
    parts = [[] for _ in names]  # per table, trainer by trainer
    for c, i, r in zip(every, all_ids, all_rows):
        id_at = float_at = 0
        for n, (table, count) in enumerate(zip(names, c.tolist())):
            dim = tables[table][1]
            if count:
                grads = r[float_at: float_at + count * dim].reshape(count, dim) / world  # as DDP averages
                parts[n].append(Grad(tables[table][0], table, i[id_at: id_at + count].numpy(), grads.numpy()))
            id_at, float_at = id_at + count, float_at + count * dim
    return [g for part in parts for g in part]


def _owned(grads: list[Grad], group) -> list[Grad]:
    """The gradients of the rows this trainer applies: those with id % trainers == its rank."""
    import torch.distributed as dist
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    out = []
    for g in grads:
        mine = g.ids % world == rank
        if mine.any():
            out.append(Grad(g.client, g.table, g.ids[mine], g.grads[mine]))
    return out
