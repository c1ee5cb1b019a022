"""A table's definition: name, shape, optimizer and initialiser, as a config dict that round-trips."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidRequest
from .initializers import check_init
from .optimizers import Optimizer, get_optimizer

MAX_DIM = 1 << 16
FIELDS = ("name", "num_rows", "dim", "optimizer", "init", "seed")


@dataclass(frozen=True)
class TableSpec:
    name: str
    num_rows: int
    dim: int
    optimizer: dict = field(default_factory=lambda: {"name": "sgd", "lr": 0.01, "eps": 1e-8})
    init: dict = field(default_factory=lambda: {"kind": "uniform"})
    seed: int = 0

    @classmethod
    def from_config(cls, config: dict) -> "TableSpec":
        """A validated spec; raises InvalidRequest naming the table and the bad value."""
        if not isinstance(config, dict):
            raise InvalidRequest(f"table config must be a dict, got {type(config).__name__}")
        name = config.get("name")
        if not isinstance(name, str) or not name or len(name) > 200:
            raise InvalidRequest(f"table name must be a non-empty string of at most 200 characters, got {name!r}")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequest(f"table name {name!r} is not valid text (it holds a lone surrogate)") from None
        unknown = sorted(str(key) for key in config if key not in FIELDS)
        if unknown:
            raise InvalidRequest(f"table {name!r}: unknown field(s) {unknown}; a table has {list(FIELDS)}")
        try:
            num_rows, dim, seed = (_int(config.get(key), key) for key in ("num_rows", "dim", "seed"))
            if not 1 <= num_rows < 1 << 40:
                raise ValueError(f"num_rows must be in [1, 2**40), got {num_rows}")
            if not 1 <= dim <= MAX_DIM:
                raise ValueError(f"dim must be in [1, {MAX_DIM}], got {dim}")
            if not 0 <= seed < 1 << 63:
                raise ValueError(f"seed must be in [0, 2**63), got {seed}")
            optimizer = get_optimizer(config.get("optimizer") or {"name": "sgd"}).get_config()
            init = check_init(config.get("init") or {"kind": "uniform"}, dim)
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(f"table {name!r}: {exc}") from None
        return cls(name, num_rows, dim, optimizer, init, seed)

    def get_config(self) -> dict:
        return {"name": self.name, "num_rows": self.num_rows, "dim": self.dim,
                "optimizer": dict(self.optimizer), "init": dict(self.init), "seed": self.seed}

    def differences(self, other: "TableSpec") -> str:
        """The fields in which `other` differs from this spec, as "field: this vs other; ..."."""
        mine, theirs = self.get_config(), other.get_config()
        return "; ".join(f"{key}: {mine[key]!r} vs {theirs[key]!r}" for key in FIELDS if mine[key] != theirs[key])

    def make_optimizer(self) -> Optimizer:
        return get_optimizer(self.optimizer)

    @property
    def width(self) -> int:
        """Float32 values per record: weights plus optimizer state."""
        return self.dim + self.make_optimizer().state_width(self.dim)


def _int(value, key) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    return int(value)
