"""Cluster TOML files: what `ectable up` writes and `ectable.connect` / `ectable node` read.

    [cluster]   nodes, code, k, r, window_rows, window_seconds
    [nodes]     endpoints = ["tcp://127.0.0.1:PORT", ...]  (one per active position), spares = [...]
    [security]  server_public, server_secret, client_public, client_secret, allowed  (CURVE, optional)
"""
from __future__ import annotations

import json
import tomllib


def load(path: str) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def dumps(data: dict) -> str:
    """TOML for a dict of tables whose values are strings, numbers, booleans or lists of them."""
    lines = []
    for table, values in data.items():
        lines.append(f"[{table}]")
        for key, value in values.items():
            lines.append(f"{key} = {_value(value)}")
        lines.append("")
    return "\n".join(lines)


def _value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")
