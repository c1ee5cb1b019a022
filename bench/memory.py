"""Memory per row on the nodes against the raw record bytes (weights + optimizer state).

Measured with tracemalloc (numpy reports its buffers to it) around create_table on an
in-process cluster. Parity is reported apart: r/k of the data by design.
"""
from __future__ import annotations

import sys
import tracemalloc

import ectable

from .common import report


def measure(rows: int, dim: int, optimizer: str, code: str, k: int, r: int, nodes: int) -> list:
    with ectable.LocalCluster(nodes=nodes, code=code, k=k, r=r, processes=False) as cluster:
        client = cluster.connect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        client.create_table("t", num_rows=rows, dim=dim, optimizer=optimizer, init="zeros")
        total = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        spec = client._table("t")[0]
        raw = rows * spec.width * 4
        parity = sum(cluster.node(p).shards["t"].parity.nbytes for p in range(nodes))
        overhead = (total - raw - parity) / raw
        return [f"{code}({k},{r})", nodes, rows, dim, optimizer, round(raw / rows, 1), round((total - parity) / rows, 1),
                f"{100 * overhead:.2f}%", f"{100 * parity / raw:.1f}%"]


def main():
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    out = [measure(rows, 64, "rowwise_adagrad", "xor", 4, 1, 5),
           measure(rows, 64, "adagrad", "rs", 4, 2, 6),
           measure(rows, 64, "sgd", "rs", 4, 2, 6),
           measure(rows, 16, "rowwise_adagrad", "xor", 4, 1, 5)]
    report("memory", ["code", "nodes", "rows", "dim", "optimizer", "raw B/row", "data B/row", "overhead", "parity"], out)


if __name__ == "__main__":
    main()
