"""Bit-exact checks of an in-process cluster's data and parity."""
from __future__ import annotations

import numpy as np
import zfec

from ..errors import NodeDown
from ..protocol.messages import GetParity
from ..storage.shard import NotRebuilt


def read_records(client, table: str, ids) -> np.ndarray:
    """Whole records (weights + optimizer state) of rows, from their nodes or decoded if they are down."""
    return client._by_layout(lambda: _read_records(client, table, ids))


def check_parity(cluster, client) -> None:
    """Assert every parity row of every healthy node equals a fresh encode of its stripe's data.

    Call after `client.flush()`. Parity is read from the nodes over their transport; RS parity
    is compared with zfec's own encoder, XOR with numpy.
    """
    client._by_layout(lambda: _check_parity(cluster, client))


def _read_records(client, table: str, ids) -> np.ndarray:
    spec, layout = client._table(table)
    ids = np.asarray(ids, dtype=np.int64)
    out = np.empty((ids.size, spec.width), dtype=np.float32)
    for p, where in client._by_node(layout, ids):
        out[where] = client._read_node(p, {table: ids[where]}, records=True)[0]
    return out


def _check_parity(cluster, client) -> None:
    config = cluster.config
    k, r = config.k, config.r
    if r == 0:
        return
    for table in client.tables():
        spec, layout = client._table(table)
        for p in range(config.nodes):
            if cluster.state(p) != "up":
                continue
            for j in range(r):
                stripes = layout.stripes_of(p, k + j)
                if stripes.size == 0:
                    continue
                ids = stripes[:, None] * k + np.arange(k)
                flat = ids.reshape(-1)
                data = np.zeros((flat.size, spec.width), dtype=np.float32)
                valid = flat < spec.num_rows
                data[valid] = _read_records(client, table, flat[valid])
                data = data.reshape(stripes.size, k, -1).view(np.uint8)
                # p as the client sees it now (the reads above may have shown a newer map), every position that
                # moved failed over, so the request names the node it is meant for, and a node given another
                # position since refuses it (rs seed 800 asked the node now at position 0 for dead 8's parity)
                if client._catch_up()[p] != "up":
                    continue
                try:
                    request = GetParity(table=table, node=client._sources.get(p))  # (refused by a new layout's node)
                    held = client._call(p, request.header(), [stripes])[1][0]
                except NodeDown:  # it died since the flush: its parity is rebuilt from the data
                    client._lost(p)
                    continue
                except NotRebuilt:  # told to rebuild some parity rows since this client read the map
                    continue
                if config.code == "xor":
                    expect = np.bitwise_xor.reduce(data, axis=1)
                else:
                    enc = zfec.Encoder(k, k + r)
                    blocks = [np.ascontiguousarray(data[:, i]).tobytes() for i in range(k)]
                    expect = np.frombuffer(enc.encode(blocks, [k + j])[0], dtype=np.uint8).reshape(held.shape)
                bad = np.flatnonzero((held != expect).any(axis=1))
                assert bad.size == 0, f"table {table!r}: parity {j} of stripe {stripes[bad[0]]} on node {p} is stale"

