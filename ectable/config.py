"""What a cluster agrees on (`ClusterConfig`), and cluster TOML files: what `ectable up` writes and `ectable.connect` / `ectable node` read.

    [cluster]   nodes, code, k, r, window_rows, window_seconds, window_steps
    [nodes]     endpoints = ["tcp://127.0.0.1:PORT", ...]  (one per active position), spares = [...];
                names, spare_names: optional, one per endpoint (`ectable node --name`; else node-N, spare-N)
    [security]  server_public, (nodes:) server_secret, public, secret, nodes, deciders, clients
                (CURVE keys by role, optional: see `ectable.security`)
"""
from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass

from .codes import get_code
from .layout import Layout, table_offset

MAX_STREAMS = 8  # most rebuild rounds a node runs at once (`ClusterConfig.rebuild_streams`)
DEADLINE = 30.0  # seconds a request may take before its node counts as down
ENDPOINT = re.compile(r"^tcp://[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")  # what a node's address looks like


@dataclass(frozen=True)
class ClusterConfig:
    """What every node and client agrees on: active node count and code."""

    nodes: int
    code: str = "xor"
    k: int = 4
    r: int = 1
    window_rows: int = 1 << 20  # a window closes once this many rows are dirty...
    window_seconds: float = 0.25  # ...or its oldest write is this old (a timer on the node closes it)
    window_steps: int = 1  # step() closes a node's window every this many steps it took
    rebuild_batch: int = 1 << 15  # rows (and parity rows) a rebuilding node pulls per round
    rebuild_share: float = 0.5  # of its time a rebuilding node spends pulling: it rests the rest
    rebuild_streams: int = 2  # rounds a rebuilding node process runs at once, each on its own part of what it lacks
    writer_grace: float = 30.0  # nodes forget a writer's clients once it was this long out of the live writers

    def make_code(self):
        return get_code(self.code, self.k, self.r)

    def layout(self, spec) -> Layout:
        return Layout(self.nodes, self.k, self.r, spec.num_rows, table_offset(spec.name, self.nodes))

    def get_config(self) -> dict:
        return dict(self.__dict__)


def names(data: dict) -> tuple[list[str], list[str]]:
    """The names of a cluster file's nodes (one per position) and of its spares."""
    nodes = data.get("nodes", {})
    endpoints, spares = nodes.get("endpoints", []), nodes.get("spares", [])
    return (list(nodes.get("names") or [f"node-{i}" for i in range(len(endpoints))]),
            list(nodes.get("spare_names") or [f"spare-{i}" for i in range(len(spares))]))


def find_node(data: dict, name: str) -> tuple[int | None, str]:
    """(position or None for a spare, endpoint to bind) of the node a cluster file names `name`."""
    nodes, spares = names(data)
    if name in nodes:
        return nodes.index(name), data["nodes"]["endpoints"][nodes.index(name)]
    if name in spares:
        return None, data["nodes"]["spares"][spares.index(name)]
    raise ValueError(f"no node or spare named {name!r} in the cluster file (nodes: {', '.join(nodes) or '-'}; "
                     f"spares: {', '.join(spares) or '-'})")


def with_spare(data: dict, name: str, endpoint: str) -> dict:
    """The cluster file's contents with one more spare, `name` at `endpoint`."""
    if not ENDPOINT.match(endpoint):
        raise ValueError(f"{endpoint!r} is not a tcp://host:port endpoint")
    nodes, spares = names(data)
    if name in nodes + spares:
        raise ValueError(f"the cluster file names a node {name!r} already")
    taken = data.get("nodes", {}).get("endpoints", []) + data.get("nodes", {}).get("spares", [])
    if endpoint in taken:
        raise ValueError(f"the cluster file lists a node at {endpoint} already")
    section = dict(data.get("nodes", {}), spares=[*data.get("nodes", {}).get("spares", []), endpoint],
                   spare_names=[*spares, name])
    return {**data, "nodes": section}


def with_node(data: dict, name: str, nodes: int) -> dict:
    """The cluster file's contents once spare `name` holds the last of `nodes` positions (`ectable node add`)."""
    names_, spares = names(data)
    section = dict(data.get("nodes", {}))
    if name in spares:
        i = spares.index(name)
        section["endpoints"] = [*section.get("endpoints", []), section["spares"][i]]
        section["names"] = [*names_, name]
        section["spares"] = [e for j, e in enumerate(section["spares"]) if j != i]
        section["spare_names"] = [n for j, n in enumerate(spares) if j != i]
    return {**data, "cluster": {**data.get("cluster", {}), "nodes": nodes}, "nodes": section}


def write_private(path: str, data: dict) -> None:
    """Write `data` as TOML to `path`, readable by its owner only (it may hold keys and the control token); the file
    is replaced whole, never seen half-written."""
    fd = os.open(path + ".new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(dumps(data))
    os.replace(path + ".new", path)


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
