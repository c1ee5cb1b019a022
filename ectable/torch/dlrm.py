"""A DLRM-style model (Naumov et al., 2019): a bottom MLP over dense features, pooled embeddings of
sparse features, their pairwise dot products, and a top MLP that gives one logit per sample."""
from __future__ import annotations

import torch


def mlp(sizes: list[int], last_relu: bool = True) -> torch.nn.Sequential:
    """Linear layers of `sizes` with a ReLU after each (and after the last if `last_relu`)."""
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(torch.nn.Linear(a, b))
        if last_relu or i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class DLRM(torch.nn.Module):
    """`forward(dense [B, dense_in], sparse)` -> logits [B]. `embeddings(sparse)` returns {feature:
    [B, dim]} for `features` (an `EmbeddingBagCollection`, or any module that does the same); the
    bottom MLP ends at `dim`, and the top MLP takes `dim` plus one dot product per pair of the
    features and the bottom output."""

    def __init__(self, embeddings: torch.nn.Module, features: list[str], dense_in: int, dim: int,
                 bottom: tuple[int, ...] = (64,), top: tuple[int, ...] = (64, 32)):
        super().__init__()
        self.embeddings, self.features = embeddings, list(features)
        self.bottom = mlp([dense_in, *bottom, dim])
        n = len(self.features) + 1
        self.top = mlp([dim + n * (n - 1) // 2, *top, 1], last_relu=False)
        self.register_buffer("_pairs", torch.triu_indices(n, n, offset=1), persistent=False)

    def forward(self, dense: torch.Tensor, sparse) -> torch.Tensor:
        x = self.bottom(dense)
        pooled = self.embeddings(sparse)
        t = torch.stack([x, *(pooled[f] for f in self.features)], dim=1)  # [B, n, dim]
        dots = torch.bmm(t, t.transpose(1, 2))[:, self._pairs[0], self._pairs[1]]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)
