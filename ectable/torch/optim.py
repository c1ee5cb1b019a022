"""`SparseOptimizer`: the step that sends ectable modules' gradients to their tables."""
from __future__ import annotations

import numpy as np
import torch

from ..errors import InvalidRequest
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
        found = {id(m): m for mod in modules for m in mod.modules() if isinstance(m, RemoteModule)}
        if not found:
            raise InvalidRequest("SparseOptimizer found no ectable module among the modules given")
        in_backward = [type(m).__name__ for m in found.values() if m.sink.apply_in_backward]
        if in_backward:
            raise InvalidRequest(f"modules with apply_in_backward=True apply their own gradients: {in_backward}")
        self.modules = list(found.values())
        self.group = process_group

    def zero_grad(self) -> None:
        """Drop every gradient not applied yet."""
        for m in self.modules:
            m.sink.clear()

    def step(self) -> None:
        grads = [g for m in self.modules for g in m.sink.take()]
        clients = {id(m.client): m.client for m in self.modules}.values()
        if self.group is None:
            apply(grads, clients)
            return
        import torch.distributed as dist
        apply(_owned(_gathered(self.modules, grads, self.group), self.group), clients)
        dist.barrier(group=self.group)  # nobody reads the next batch before every trainer has written


def _gathered(modules: list, grads: list[Grad], group) -> list[Grad]:
    """Every trainer's gradients, table by table (sorted by name) and trainer by trainer, each scaled by
    1 / trainers. Every trainer holds the same modules; tensors go over the group, never pickles."""
    import torch.distributed as dist
    world = dist.get_world_size(group)
    tables = {t: (m.client, dim) for m in modules for t, dim in m.table_dims.items()}
    out = []
    for table in sorted(tables):
        client, dim = tables[table]
        gs = [g for g in grads if g.table == table]
        ids = np.concatenate([g.ids for g in gs]) if gs else np.empty(0, np.int64)
        size = torch.tensor([ids.size], dtype=torch.int64)
        sizes = [torch.empty_like(size) for _ in range(world)]
        dist.all_gather(sizes, size, group=group)
        n_max = max(int(s) for s in sizes)
        if not n_max:
            continue
        ids_pad = torch.zeros(n_max, dtype=torch.int64)
        grads_pad = torch.zeros((n_max, dim), dtype=torch.float32)
        if gs:
            ids_pad[: ids.size] = torch.from_numpy(ids)
            grads_pad[: ids.size] = torch.from_numpy(np.concatenate([g.grads for g in gs]))
        all_ids = [torch.empty_like(ids_pad) for _ in range(world)]
        all_grads = [torch.empty_like(grads_pad) for _ in range(world)]
        dist.all_gather(all_ids, ids_pad, group=group)
        dist.all_gather(all_grads, grads_pad, group=group)
        for n, i, g in zip(sizes, all_ids, all_grads):
            if int(n):
                out.append(Grad(client, table, i[: int(n)].numpy(), (g[: int(n)] * (1.0 / world)).numpy()))
    return out


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
