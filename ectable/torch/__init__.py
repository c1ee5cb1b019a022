"""PyTorch modules over ectable tables (`pip install ectable[torch]`).

`Embedding`, `EmbeddingBag` and `EmbeddingBagCollection` read their rows from a cluster and give the
same results as torch's own modules on the same weights; `SparseOptimizer` (or `apply_in_backward=True`)
sends the gradients back, where the tables' optimizers apply them on the nodes. `DLRM` is the
DLRM-style model of the examples and tests. Any module takes an `ectable.Lookahead` in place of its client
(with `jagged_ids` naming a jagged batch's rows), so training reads ahead and caches rows.
"""
try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("ectable.torch needs PyTorch: pip install 'ectable[torch]'") from exc

from .dlrm import DLRM
from .modules import Embedding, EmbeddingBag, EmbeddingBagCollection, Jagged, jagged_ids
from .optim import SparseOptimizer

__all__ = ["Embedding", "EmbeddingBag", "EmbeddingBagCollection", "Jagged", "SparseOptimizer", "DLRM", "jagged_ids"]
