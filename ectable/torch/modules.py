"""`torch.nn` modules whose weights live in an ectable cluster.

Each forward reads the unique rows of its batch once (one `get_many` for every table), runs torch's
own `F.embedding` / `F.embedding_bag` on them, and records their gradients for a `SparseOptimizer`
(or, with `apply_in_backward=True`, sends them to the store as the backward pass ends). Results equal
torch's modules holding the same weights. The modules have no parameters: the dense optimizer never
sees the tables.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import InvalidRequest
from ..storage.table import TableSpec
from .lookup import Sink, fetch

MODES = ("sum", "mean", "max")


class RemoteModule(torch.nn.Module):
    """What every ectable module shares: the client, a sink for its gradients, and a device (moved
    with `.to()` like any module's)."""

    def __init__(self, client, apply_in_backward: bool = False, grad_scale: float = 1.0):
        super().__init__()
        self.client = client
        self.sink = Sink(apply_in_backward, grad_scale)
        self.register_buffer("_device", torch.empty(0), persistent=False)
        self.table_dims: dict[str, int] = {}  # every table this module reads, and its dim

    @property
    def device(self) -> torch.device:
        return self._device.device

    def _spec(self, table: str):
        if not isinstance(table, str):
            raise InvalidRequest(f"a table is named by a string, got {type(table).__name__}")
        specs = self.client.tables()
        if table not in specs:
            raise InvalidRequest(f"unknown table {table!r}; the cluster has {sorted(specs)}")
        spec = TableSpec.from_config(specs[table])
        self.table_dims[table] = spec.dim
        return spec

    def _rows(self, ids: dict) -> dict:
        return fetch(self.client, ids, self.device, self.sink)


def _padding(padding_idx, num_rows: int):
    """`padding_idx` as a row id in [0, num_rows), or None; as torch's modules check it."""
    if padding_idx is None:
        return None
    if not isinstance(padding_idx, (int, np.integer)) or not -num_rows <= padding_idx < num_rows:
        raise InvalidRequest(f"padding_idx must be an int within num_embeddings ({num_rows}), got {padding_idx!r}")
    return int(padding_idx) % num_rows


def _local_padding(padding_idx, uniq: np.ndarray):
    """The position of row `padding_idx` among the unique rows read, or None if it is not among them."""
    if padding_idx is None:
        return None
    at = int(np.searchsorted(uniq, padding_idx))
    return at if at < uniq.size and uniq[at] == padding_idx else None


class Embedding(RemoteModule):
    """`torch.nn.Embedding` over table `table`: `forward(input)` takes ids of any shape and returns
    rows of shape [*input.shape, dim]. Row `padding_idx` is returned as stored and takes no gradient."""

    def __init__(self, client, table: str, padding_idx: int | None = None, apply_in_backward: bool = False,
                 grad_scale: float = 1.0):
        super().__init__(client, apply_in_backward, grad_scale)
        spec = self._spec(table)
        self.table, self.num_embeddings, self.embedding_dim = table, spec.num_rows, spec.dim
        self.padding_idx = _padding(padding_idx, spec.num_rows)

    @torch.compiler.disable  # eager, inside a compiled model too: it reads from the cluster
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        uniq, inverse, rows = self._rows({self.table: input})[self.table]
        return F.embedding(inverse.reshape(input.shape), rows, padding_idx=_local_padding(self.padding_idx, uniq))

    def extra_repr(self) -> str:
        return f"table={self.table!r}, {self.num_embeddings}, {self.embedding_dim}"


class EmbeddingBag(RemoteModule):
    """`torch.nn.EmbeddingBag` over table `table`, with its forward's signature: `forward(input,
    offsets=None, per_sample_weights=None)`, `input` 1-D with `offsets` or 2-D (fixed-size bags)."""

    def __init__(self, client, table: str, mode: str = "mean", include_last_offset: bool = False,
                 padding_idx: int | None = None, apply_in_backward: bool = False, grad_scale: float = 1.0):
        super().__init__(client, apply_in_backward, grad_scale)
        if mode not in MODES:
            raise InvalidRequest(f"mode must be one of {MODES}, got {mode!r}")
        spec = self._spec(table)
        self.table, self.num_embeddings, self.embedding_dim = table, spec.num_rows, spec.dim
        self.mode, self.include_last_offset = mode, bool(include_last_offset)
        self.padding_idx = _padding(padding_idx, spec.num_rows)

    @torch.compiler.disable  # eager, inside a compiled model too: it reads from the cluster
    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        _check_bags(input, offsets, per_sample_weights, self.mode)
        uniq, inverse, rows = self._rows({self.table: input})[self.table]
        return F.embedding_bag(inverse.reshape(input.shape), rows, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights, include_last_offset=self.include_last_offset,
                               padding_idx=_local_padding(self.padding_idx, uniq))

    def extra_repr(self) -> str:
        return f"table={self.table!r}, {self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}"


def _check_bags(input, offsets, per_sample_weights, mode) -> None:
    """What `F.embedding_bag` would refuse, refused before anything is read."""
    if not isinstance(input, torch.Tensor) or input.dim() not in (1, 2):
        raise InvalidRequest(f"input must be a 1-D or 2-D tensor of ids, got {getattr(input, 'shape', type(input))}")
    if input.dim() == 1 and offsets is None:
        raise InvalidRequest("a 1-D input needs offsets (the start of each bag)")
    if input.dim() == 2 and offsets is not None:
        raise InvalidRequest("a 2-D input holds one bag per row: pass no offsets")
    if per_sample_weights is not None:
        if mode != "sum":
            raise InvalidRequest(f"per_sample_weights need mode='sum', not {mode!r}")
        if per_sample_weights.shape != input.shape:
            raise InvalidRequest(f"per_sample_weights must have input's shape {tuple(input.shape)}, "
                                 f"got {tuple(per_sample_weights.shape)}")


class Jagged:
    """A batch of several sparse features, laid out as TorchRec's `KeyedJaggedTensor` (which is taken
    as it is, by its methods): `values` of every feature one after the other, feature by feature, and
    for each feature `batch` bag lengths (`lengths`, [features * batch]) or their `offsets`
    ([features * batch + 1]); optional per-value `weights`."""

    def __init__(self, keys, values: torch.Tensor, lengths: torch.Tensor | None = None,
                 offsets: torch.Tensor | None = None, weights: torch.Tensor | None = None):
        if (lengths is None) == (offsets is None):
            raise InvalidRequest("a jagged batch takes lengths or offsets, exactly one of them")
        self._keys, self._values, self._weights = list(keys), values, weights
        if offsets is None:
            offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
        self._offsets = offsets

    def keys(self) -> list:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def offsets(self) -> torch.Tensor:
        return self._offsets

    def weights_or_none(self) -> torch.Tensor | None:
        return self._weights


def _bags(features) -> tuple[list, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(keys, values, offsets [F*B + 1], weights or None) of a jagged batch, checked."""
    try:
        keys, values = list(features.keys()), features.values()
        offsets = features.offsets() if hasattr(features, "offsets") else None
        if offsets is None:
            lengths = features.lengths()
            offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
        weights = features.weights_or_none() if hasattr(features, "weights_or_none") else None
    except (AttributeError, TypeError) as exc:
        raise InvalidRequest(f"expected a jagged batch (keys(), values(), offsets() or lengths()), got "
                             f"{type(features).__name__}: {exc}") from None
    offsets = offsets.to(torch.int64)
    if not keys or (offsets.numel() - 1) % len(keys) or offsets.numel() < 1:
        raise InvalidRequest(f"a jagged batch of {len(keys)} features needs features * batch + 1 offsets, "
                             f"got {offsets.numel()}")
    if offsets[0] != 0 or offsets[-1] != values.numel() or bool((offsets[1:] < offsets[:-1]).any()):
        raise InvalidRequest(f"jagged offsets must rise from 0 to the number of values ({values.numel()})")
    if weights is not None and weights.shape != values.shape:
        raise InvalidRequest(f"jagged weights must have the values' shape {tuple(values.shape)}")
    return keys, values, offsets, weights


class EmbeddingBagCollection(RemoteModule):
    """Pooled embeddings of several sparse features: `tables` names each feature's table (a list of
    table names, each its own feature, or a dict feature -> table; features may share a table).
    `forward(features)` takes a jagged batch (`Jagged`, or TorchRec's `KeyedJaggedTensor`) and returns
    {feature: [batch, dim]}, reading every table's unique rows in one round trip."""

    def __init__(self, client, tables, mode: str = "sum", apply_in_backward: bool = False, grad_scale: float = 1.0):
        super().__init__(client, apply_in_backward, grad_scale)
        if mode not in MODES:
            raise InvalidRequest(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.tables = dict(tables) if isinstance(tables, dict) else {t: t for t in tables}
        if not self.tables:
            raise InvalidRequest("an EmbeddingBagCollection needs at least one table")
        self.dims = {feature: self._spec(table).dim for feature, table in self.tables.items()}

    @torch.compiler.disable  # eager, inside a compiled model too: it reads from the cluster
    def forward(self, features) -> dict:
        keys, values, offsets, weights = _bags(features)
        unknown = [k for k in keys if k not in self.tables]
        if unknown:
            raise InvalidRequest(f"features {unknown} have no table here (features: {sorted(self.tables)})")
        if weights is not None and self.mode != "sum":
            raise InvalidRequest(f"per-value weights need mode='sum', not {self.mode!r}")
        batch = (offsets.numel() - 1) // len(keys)
        if batch == 0:
            return {key: torch.empty((0, self.dims[key]), device=self.device) for key in keys}
        starts = offsets[::batch].tolist()  # where each feature's values begin, and the end
        ids: dict[str, list] = {}
        for f, key in enumerate(keys):
            ids.setdefault(self.tables[key], []).append(values[starts[f]:starts[f + 1]])
        rows = self._rows({table: torch.cat(parts) for table, parts in ids.items()})
        out, used = {}, {table: 0 for table in ids}
        for f, key in enumerate(keys):
            table = self.tables[key]
            _, inverse, table_rows = rows[table]
            n = starts[f + 1] - starts[f]
            local = inverse[used[table]: used[table] + n]
            used[table] += n
            bag_offsets = (offsets[f * batch:(f + 1) * batch] - starts[f]).to(local.device)
            psw = None if weights is None else weights[starts[f]:starts[f + 1]].to(local.device)
            out[key] = F.embedding_bag(local, table_rows, bag_offsets, mode=self.mode, per_sample_weights=psw)
        return out

    def extra_repr(self) -> str:
        return f"tables={self.tables!r}, mode={self.mode!r}"
