"""Memory per row on the nodes against the raw record bytes (weights + optimizer state), and
against replication that survives as many failures.

Measured with tracemalloc (numpy reports its buffers to it) around create_table on an
in-process cluster. Parity is reported apart: r/k of the data by design. Replication with r
extra copies is counted as (r + 1) times the raw records (no window, no index: a lower bound).
"""
from __future__ import annotations

import sys
import tracemalloc

import ectable

from .common import report


def measure(rows: int, dim: int, optimizer: str, code: str, k: int, r: int, nodes: int) -> dict:
    with ectable.LocalCluster(nodes=nodes, code=code, k=k, r=r, processes=False) as cluster:
        client = cluster.connect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        client.create_table("t", num_rows=rows, dim=dim, optimizer=optimizer, init="zeros")
        total = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        spec = client._table("t")[0]
        parity = sum(cluster.node(p).shards["t"].parity.nbytes for p in range(nodes))
        return {"code": f"{code}({k},{r})", "nodes": nodes, "rows": rows, "dim": dim, "optimizer": optimizer,
                "r": r, "raw": rows * spec.width * 4, "total": total, "parity": parity}


def main():
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    runs = [measure(rows, 64, "rowwise_adagrad", "xor", 4, 1, 5),
            measure(rows, 64, "adagrad", "rs", 4, 2, 6),
            measure(rows, 64, "sgd", "rs", 4, 2, 6),
            measure(rows, 16, "rowwise_adagrad", "xor", 4, 1, 5),
            measure(rows, 64, "rowwise_adagrad", "rs", 6, 3, 9)]
    out = [[m["code"], m["nodes"], m["rows"], m["dim"], m["optimizer"], round(m["raw"] / m["rows"], 1),
            round((m["total"] - m["parity"]) / m["rows"], 1), f"{100 * (m['total'] - m['raw'] - m['parity']) / m['raw']:.2f}%",
            f"{100 * m['parity'] / m['raw']:.1f}%"] for m in runs[:4]]
    report("memory", ["code", "nodes", "rows", "dim", "optimizer", "raw B/row", "data B/row", "overhead", "parity"], out)
    print()
    versus = [[m["code"], m["r"], m["optimizer"], round(m["total"] / m["rows"], 1),
               round((m["r"] + 1) * m["raw"] / m["rows"], 1), round(m["total"] / ((m["r"] + 1) * m["raw"]), 3)]
              for m in runs if m["dim"] == 64]
    report("memory_vs_replication", ["code", "failures survived", "optimizer", "ectable B/row",
                                     "replication B/row", "ectable / replication"], versus)


if __name__ == "__main__":
    main()
