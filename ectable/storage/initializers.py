"""Deterministic row initialisers: a row's values are a pure function of (seed, table, row id).

Values come from a counter-based hash (splitmix64 of the element's index
keyed by seed and table name), so any node computes any row identically
without state, in one vectorised pass.
"""
from __future__ import annotations

import hashlib

import numpy as np

from ..protocol.validate import F32_MAX, is_number

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
KINDS = {"zeros": (), "uniform": ("low", "high"), "normal": ("mean", "std")}  # kind -> its arguments
NORMAL_REACH = 8.6  # the largest |z| the normal initialiser can draw (53-bit uniforms): sqrt(-2 ln 2**-53)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def _key(seed: int, table: str, stream: int) -> np.uint64:
    digest = hashlib.blake2b(f"{seed}/{table}/{stream}".encode(), digest_size=8).digest()
    return np.uint64(int.from_bytes(digest, "little"))


def _unit(seed, table, stream, ids, dim) -> np.ndarray:
    """Uniform float64 in [0, 1) with 53 random bits, shape [len(ids), dim]."""
    counters = np.asarray(ids, dtype=np.uint64)[:, None] * np.uint64(dim) + np.arange(dim, dtype=np.uint64)
    with np.errstate(over="ignore"):
        bits = _splitmix64(counters ^ _key(seed, table, stream))
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def check_init(config: dict, dim: int) -> dict:
    """The normalised initialiser config; raises ValueError if it is not valid."""
    config = dict(config)
    kind = config.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"unknown init {kind!r}; choose one of {list(KINDS)}")
    unknown = sorted(str(key) for key in config if key != "kind" and key not in KINDS[kind])
    if unknown:
        takes = ", ".join(KINDS[kind]) or "no arguments"
        raise ValueError(f"unknown argument(s) {unknown} for the {kind} init (it takes {takes}; create_table itself "
                         f"takes optimizer, lr, eps, init and seed)")
    for key in KINDS[kind]:
        if key in config:
            value = config[key]
            if not is_number(value):
                raise ValueError(f"{kind} init needs a number for {key}, got {value!r}")
            if not abs(float(value)) <= F32_MAX:
                raise ValueError(f"{kind} init needs a finite float32 {key}, got {value}")
    if kind == "uniform":
        bound = 1.0 / np.sqrt(dim)
        config.setdefault("low", -bound)
        config.setdefault("high", bound)
        if not float(config["low"]) < float(config["high"]):
            raise ValueError(f"uniform init needs low < high, got {config['low']} and {config['high']}")
    if kind == "normal":
        config.setdefault("mean", 0.0)
        config.setdefault("std", 1.0 / np.sqrt(dim))
        if not float(config["std"]) >= 0:
            raise ValueError(f"normal init needs std >= 0, got {config['std']}")
        if abs(float(config["mean"])) + NORMAL_REACH * float(config["std"]) > F32_MAX:
            raise ValueError(f"normal init with mean {config['mean']} and std {config['std']} would give rows "
                             f"beyond float32 (|mean| + {NORMAL_REACH} std must be at most {F32_MAX:.4g})")
    return {key: (float(v) if key != "kind" else v) for key, v in config.items()}


def init_rows(config: dict, seed: int, table: str, ids, dim: int) -> np.ndarray:
    """Initial float32 weights of rows `ids`, shape [len(ids), dim]."""
    ids = np.asarray(ids, dtype=np.int64)
    kind = config["kind"]
    if kind == "zeros":
        return np.zeros((ids.size, dim), dtype=np.float32)
    if kind == "uniform":
        low, high = config["low"], config["high"]
        return (low + (high - low) * _unit(seed, table, 0, ids, dim)).astype(np.float32)
    u1 = 1.0 - _unit(seed, table, 1, ids, dim)  # (0, 1]
    u2 = _unit(seed, table, 2, ids, dim)
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return (config["mean"] + config["std"] * z).astype(np.float32)
