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
    with `.to()` like any module's). `requires_grad_(False)` freezes its tables: its lookups then
    record no gradient."""

    def __init__(self, client, apply_in_backward: bool = False):
        super().__init__()
        self.client = client
        self.sink = Sink(apply_in_backward)
        self.records = True
        self.register_buffer("_device", torch.empty(0), persistent=False)
        self.table_dims: dict[str, int] = {}  # every table this module reads, and its dim

    @property
    def device(self) -> torch.device:
        return self._device.device

    def requires_grad_(self, requires_grad: bool = True) -> "RemoteModule":
        self.records = bool(requires_grad)
        return super().requires_grad_(requires_grad)

    def _specs(self, tables) -> list[TableSpec]:
        """The definitions of `tables` (names), as the cluster has them now."""
        specs = self.client.tables()
        out = []
        for table in tables:
            if not isinstance(table, str):
                raise InvalidRequest(f"a table is named by a string, got {type(table).__name__}")
            if table not in specs:
                raise InvalidRequest(f"unknown table {table!r}; the cluster has {sorted(specs)}")
            out.append(TableSpec.from_config(specs[table]))
            self.table_dims[table] = out[-1].dim
        return out

    def _rows(self, ids: dict) -> dict:
        return fetch(self.client, ids, self.device, self.sink if self.records else None)


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

    def __init__(self, client, table: str, padding_idx: int | None = None, apply_in_backward: bool = False):
        super().__init__(client, apply_in_backward)
        [spec] = self._specs([table])
        self.table, self.num_embeddings, self.embedding_dim = table, spec.num_rows, spec.dim
        self.padding_idx = _padding(padding_idx, spec.num_rows)

    @torch.compiler.disable  # eager, inside a compiled model too: it reads from the cluster
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        uniq, inverse, rows = self._rows({self.table: input})[self.table]
        return F.embedding(inverse, rows, padding_idx=_local_padding(self.padding_idx, uniq))

    def extra_repr(self) -> str:
        return f"table={self.table!r}, {self.num_embeddings}, {self.embedding_dim}"


class EmbeddingBag(RemoteModule):
    """`torch.nn.EmbeddingBag` over table `table`, with its forward's signature: `forward(input,
    offsets=None, per_sample_weights=None)`, `input` 1-D with `offsets` or 2-D (fixed-size bags)."""

    def __init__(self, client, table: str, mode: str = "mean", include_last_offset: bool = False,
                 padding_idx: int | None = None, apply_in_backward: bool = False):
        super().__init__(client, apply_in_backward)
        if mode not in MODES:
            raise InvalidRequest(f"mode must be one of {MODES}, got {mode!r}")
        [spec] = self._specs([table])
        self.table, self.num_embeddings, self.embedding_dim = table, spec.num_rows, spec.dim
        self.mode, self.include_last_offset = mode, bool(include_last_offset)
        self.padding_idx = _padding(padding_idx, spec.num_rows)

    @torch.compiler.disable  # eager, inside a compiled model too: it reads from the cluster
    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(input, torch.Tensor) or input.dim() not in (1, 2):
            raise InvalidRequest(f"input must be a 1-D or 2-D tensor of ids, got {getattr(input, 'shape', input)!r}")
        if (input.dim() == 1) != (offsets is not None):
            raise InvalidRequest("a 1-D input needs offsets (the start of each bag); a 2-D one holds a bag per "
                                 "row and takes none")
        if offsets is not None:
            offsets = _offsets(offsets, input.numel(), "offsets", last=self.include_last_offset)
        per_sample_weights = _weights(per_sample_weights, input.shape, self.mode)
        uniq, inverse, rows = self._rows({self.table: input})[self.table]
        return F.embedding_bag(inverse, rows, _to(offsets, rows), mode=self.mode,
                               per_sample_weights=_to(per_sample_weights, rows),
                               include_last_offset=self.include_last_offset,
                               padding_idx=_local_padding(self.padding_idx, uniq))

    def extra_repr(self) -> str:
        return f"table={self.table!r}, {self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}"


def _offsets(offsets, values: int, what: str, last: bool = True) -> torch.Tensor:
    """`offsets` as int64, checked: 1-D integers rising from 0, within `values` (ending at it if `last`)."""
    if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1 or offsets.dtype not in (torch.int64, torch.int32):
        raise InvalidRequest(f"{what} must be a 1-D int64 or int32 tensor, got {getattr(offsets, 'dtype', offsets)!r}")
    offsets = offsets.to(torch.int64)
    if offsets.numel() == 0 or offsets[0] != 0 or bool((offsets[1:] < offsets[:-1]).any()) or \
            offsets[-1] > values or (last and offsets[-1] != values):
        raise InvalidRequest(f"{what} must rise from 0 to at most the number of values ({values})"
                             + (", and end at it" if last else ""))
    return offsets


def _weights(weights, shape, mode: str) -> torch.Tensor | None:
    """Per-value weights, checked: float tensors of the values' shape, with mode "sum"."""
    if weights is None:
        return None
    if mode != "sum":
        raise InvalidRequest(f"per-value weights need mode='sum', not {mode!r}")
    if not isinstance(weights, torch.Tensor) or not weights.is_floating_point() or weights.shape != shape:
        raise InvalidRequest(f"per-value weights must be a float tensor of shape {tuple(shape)}, got "
                             f"{getattr(weights, 'shape', weights)!r}")
    return weights.to(torch.float32)


def _to(tensor, like: torch.Tensor):
    return None if tensor is None else tensor.to(like.device, non_blocking=True)


def _from_lengths(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])


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
        self._offsets = _from_lengths(lengths) if offsets is None else offsets

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
        offsets = features.offsets() if hasattr(features, "offsets") else _from_lengths(features.lengths())
        weights = features.weights_or_none() if hasattr(features, "weights_or_none") else None
    except (AttributeError, TypeError) as exc:
        raise InvalidRequest(f"expected a jagged batch (keys(), values(), offsets() or lengths()), got "
                             f"{type(features).__name__}: {exc}") from None
    if not isinstance(values, torch.Tensor) or values.dim() != 1:
        raise InvalidRequest(f"a jagged batch's values must be a 1-D tensor, got {getattr(values, 'shape', values)!r}")
    if not keys or len(set(keys)) != len(keys):
        raise InvalidRequest(f"a jagged batch needs distinct feature names, got {keys}")
    offsets = _offsets(offsets, values.numel(), "jagged offsets")
    if (offsets.numel() - 1) % len(keys):
        raise InvalidRequest(f"a jagged batch of {len(keys)} features needs features * batch + 1 offsets, "
                             f"got {offsets.numel()}")
    return keys, values, offsets, weights


def jagged_ids(features, tables: dict | None = None) -> dict:
    """{table: ids} of a jagged batch (`Jagged` or a `KeyedJaggedTensor`): each feature's values, features
    named by their table or mapped to it by `tables` (feature -> table; features may share a table). What
    a `Lookahead` over jagged batches takes as `ids`."""
    keys, values, offsets, _ = _bags(features)
    tables = tables or {}
    return _by_table(keys, values, offsets, {key: tables.get(key, key) for key in keys})[1]


def _by_table(keys: list, values: torch.Tensor, offsets: torch.Tensor, tables: dict) -> tuple[list, dict]:
    """(where each feature's values begin, and the end; {table: the values of its features, one after the
    other}) of a checked jagged batch whose features read `tables` (feature -> table)."""
    batch = (offsets.numel() - 1) // len(keys)
    starts = offsets[::batch].tolist() if batch else [0] * (len(keys) + 1)
    ids: dict[str, list] = {}
    for f, key in enumerate(keys):
        ids.setdefault(tables[key], []).append(values[starts[f]:starts[f + 1]])
    return starts, {table: torch.cat(parts) for table, parts in ids.items()}


class EmbeddingBagCollection(RemoteModule):
    """Pooled embeddings of several sparse features: `tables` names each feature's table (a list of
    table names, each its own feature, or a dict feature -> table; features may share a table).
    `forward(features)` takes a jagged batch (`Jagged`, or TorchRec's `KeyedJaggedTensor`) and returns
    {feature: [batch, dim]}, reading every table's unique rows in one round trip."""

    def __init__(self, client, tables, mode: str = "sum", apply_in_backward: bool = False):
        super().__init__(client, apply_in_backward)
        if mode not in MODES:
            raise InvalidRequest(f"mode must be one of {MODES}, got {mode!r}")
        if isinstance(tables, str) or not isinstance(tables, (dict, list, tuple)) or not tables:
            raise InvalidRequest(f"tables: a list of table names or a dict feature -> table, got {tables!r}")
        self.mode = mode
        self.tables = dict(tables) if isinstance(tables, dict) else {t: t for t in tables}
        specs = self._specs(self.tables.values())
        self.dims = {feature: spec.dim for feature, spec in zip(self.tables, specs)}

    @torch.compiler.disable  # eager, inside a compiled model too: it reads from the cluster
    def forward(self, features) -> dict:
        keys, values, offsets, weights = _bags(features)
        unknown = [k for k in keys if k not in self.tables]
        if unknown:
            raise InvalidRequest(f"features {unknown} have no table here (features: {sorted(self.tables)})")
        weights = _weights(weights, values.shape, self.mode)
        batch = (offsets.numel() - 1) // len(keys)
        if batch == 0:
            return {key: torch.empty((0, self.dims[key]), device=self.device) for key in keys}
        starts, ids = _by_table(keys, values, offsets, self.tables)
        rows = self._rows(ids)
        out, used = {}, {table: 0 for table in ids}
        for f, key in enumerate(keys):
            table = self.tables[key]
            _, inverse, table_rows = rows[table]
            n = starts[f + 1] - starts[f]
            local = inverse[used[table]: used[table] + n]
            used[table] += n
            bag_offsets = offsets[f * batch:(f + 1) * batch] - starts[f]
            psw = None if weights is None else weights[starts[f]:starts[f + 1]]
            out[key] = F.embedding_bag(local, table_rows, _to(bag_offsets, table_rows), mode=self.mode,
                                       per_sample_weights=_to(psw, table_rows))
        return out

    def extra_repr(self) -> str:
        return f"tables={self.tables!r}, mode={self.mode!r}"
