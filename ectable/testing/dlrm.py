"""DLRM training for the PyTorch adapter's equivalence tests and examples: seeded batches, a reference
collection of `torch.nn.EmbeddingBag`s holding the same weights as ectable tables, a hand-written
rowwise Adagrad, and one training step shared by ectable and the reference."""
from __future__ import annotations

import numpy as np
import torch

from ..torch import DLRM, Jagged

TABLES = {"user": 50_000, "item": 20_000, "category": 500, "city": 3_000, "device": 50, "hour": 24, "ad": 30_000,
          "site": 5_000}  # the examples' and the benchmark's tables: name -> rows


def batches(seed: int, steps: int, batch: int, rows: dict, dense_in: int = 8, hot: float = 1.2):
    """`steps` batches of (dense [batch, dense_in], Jagged over the features of `rows` {feature:
    num_rows}, labels [batch] in {0, 1}): Zipf-skewed ids, 0-3 ids per bag, dyadic dense values, and
    labels that a hidden score of each id and of the dense values decides, with 10% of them flipped."""
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal(dense_in)
    for _ in range(steps):
        lengths = rng.integers(0, 4, size=(len(rows), batch))
        values = [np.minimum(rng.zipf(hot, size=int(n)) - 1, r - 1) for n, r in zip(lengths.sum(1), rows.values())]
        dense = rng.integers(-8, 8, size=(batch, dense_in)) / 8.0
        score = dense @ weights
        for f, ids in enumerate(values):  # each id's hidden score, in [-1, 1), summed per bag
            bag = np.repeat(np.arange(batch), lengths[f])
            np.add.at(score, bag, ((ids * 2654435761 + 977 * f) % 2048) / 1024.0 - 1.0)
        labels = (score > 0) ^ (rng.random(batch) < 0.1)
        yield (torch.tensor(dense, dtype=torch.float32),
               Jagged(list(rows), torch.from_numpy(np.concatenate(values)).to(torch.int64),
                      lengths=torch.from_numpy(lengths.reshape(-1)).to(torch.int64)),
               torch.tensor(labels, dtype=torch.float32))


def split(features: Jagged, parts: int) -> list[Jagged]:
    """`features` cut into `parts` equal consecutive slices of its batch (one per trainer)."""
    keys, values, offsets = features.keys(), features.values(), features.offsets()
    batch = (offsets.numel() - 1) // len(keys)
    size = batch // parts
    out = []
    for p in range(parts):
        vals, lens = [], []
        for f in range(len(keys)):
            lo, hi = f * batch + p * size, f * batch + (p + 1) * size
            vals.append(values[offsets[lo]:offsets[hi]])
            lens.append(offsets[lo + 1:hi + 1] - offsets[lo:hi])
        out.append(Jagged(keys, torch.cat(vals), lengths=torch.cat(lens)))
    return out


class LocalBags(torch.nn.Module):
    """Like `EmbeddingBagCollection`, over `torch.nn.EmbeddingBag`s holding `weights` {feature: [rows, dim]}."""

    def __init__(self, weights: dict, mode: str = "sum"):
        super().__init__()
        self.bags = torch.nn.ModuleDict({f: torch.nn.EmbeddingBag.from_pretrained(torch.tensor(w), freeze=False,
                                                                                 mode=mode)
                                         for f, w in weights.items()})

    def forward(self, features) -> dict:
        keys, values, offsets = features.keys(), features.values(), features.offsets()
        batch = (offsets.numel() - 1) // len(keys)
        out = {}
        for f, key in enumerate(keys):
            start = offsets[f * batch]
            out[key] = self.bags[key](values[start:offsets[(f + 1) * batch]], offsets[f * batch:(f + 1) * batch] - start)
        return out


class RowwiseAdagrad(torch.optim.Optimizer):
    """Rowwise Adagrad (FBGEMM's) on dense 2-D weights, written out: for each row with a gradient,
    s += mean(g * g); w -= lr * g / (sqrt(s) + eps)."""

    def __init__(self, params, lr: float, eps: float = 1e-8):
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for w in group["params"]:
                if w.grad is None:
                    continue
                state = self.state[w].setdefault("sum", torch.zeros(w.shape[0], 1))
                rows = w.grad.abs().sum(1).nonzero().squeeze(1)
                g = w.grad[rows]
                state[rows] += (g * g).mean(1, keepdim=True)
                w[rows] -= group["lr"] * g / (state[rows].sqrt() + group["eps"])


def torch_optimizer(name: str, params, lr: float, eps: float = 1e-8) -> torch.optim.Optimizer:
    """torch's counterpart of an ectable table optimizer, over dense embedding weights."""
    return {"sgd": lambda: torch.optim.SGD(params, lr=lr), "adagrad": lambda: torch.optim.Adagrad(params, lr=lr, eps=eps),
            "rowwise_adagrad": lambda: RowwiseAdagrad(params, lr=lr, eps=eps)}[name]()


def model(embeddings, features: list[str], dim: int, seed: int = 0, dense_in: int = 8) -> DLRM:
    """A small DLRM whose dense layers start from `seed`."""
    torch.manual_seed(seed)
    return DLRM(embeddings, features, dense_in=dense_in, dim=dim, bottom=(16,), top=(16,))


def train_step(net: DLRM, dense_opt, sparse_opt, dense, features, labels, micro: int = 1) -> float:
    """One step of binary cross-entropy training over `micro` equal micro-batches (gradients accumulated,
    each micro-batch's loss weighted 1 / micro); returns the loss of the whole batch."""
    for opt in (dense_opt, sparse_opt):
        if opt is not None:
            opt.zero_grad()
    total = 0.0
    parts = split(features, micro) if micro > 1 else [features]
    size = dense.shape[0] // micro
    for p, sparse in enumerate(parts):
        logits = net(dense[p * size:(p + 1) * size], sparse)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels[p * size:(p + 1) * size])
        (loss / micro if micro > 1 else loss).backward()
        total += loss.item() / micro
    dense_opt.step()
    if sparse_opt is not None:
        sparse_opt.step()
    return total


__all__ = ["TABLES", "batches", "split", "LocalBags", "RowwiseAdagrad", "torch_optimizer", "model", "train_step"]
