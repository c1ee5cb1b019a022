"""Memory per row on the nodes against the raw record bytes (weights + optimizer state), and
against replication that survives as many failures.

Measured around create_table on an in-process cluster: what tracemalloc sees (numpy reports its buffers to
it), plus the table's ranges of the nodes' arenas (records, parity, window flags), which are memory maps that
tracemalloc does not see. Parity is reported apart: r/k of the data by design. Replication with r
extra copies is counted as (r + 1) times the raw records (no window, no index: a lower bound).
Per node: the criteo-like tables at `--scale`, every node's shards (data, parity, window) summed.

    python -m bench.memory [--rows 1000000] [--scale 0.1]
"""
from __future__ import annotations

import argparse
import tracemalloc

import ectable

from .common import report
from .workloads import criteo_like_sizes


def measure(rows: int, dim: int, optimizer: str, code: str, k: int, r: int, nodes: int) -> dict:
    with ectable.LocalCluster(nodes=nodes, code=code, k=k, r=r, processes=False) as cluster:
        client = cluster.connect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        client.create_table("t", num_rows=rows, dim=dim, optimizer=optimizer, init="zeros")
        traced = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        spec = client._table("t")[0]
        shards = [cluster.node(p).shards["t"] for p in range(nodes)]
        total = traced + sum(shard.nbytes() for shard in shards)  # the arenas' maps: not traced
        parity = sum(shard.parity.nbytes for shard in shards)
        return {"code": f"{code}({k},{r})", "nodes": nodes, "rows": rows, "dim": dim, "optimizer": optimizer,
                "r": r, "raw": rows * spec.width * 4, "total": total, "parity": parity}


def per_node(sizes: dict, code: str, k: int, r: int, nodes: int) -> list:
    """Bytes each node holds for `sizes` (rowwise_adagrad, dim 64): data, parity, window and the count of degraded
    writes each parity row holds."""
    with ectable.LocalCluster(nodes=nodes, code=code, k=k, r=r, processes=False) as cluster:
        client = cluster.connect()
        for t, rows in sizes.items():
            client.create_table(t, num_rows=rows, dim=64, optimizer="rowwise_adagrad", init="zeros")
        return [sum(s.nbytes() + s.versions.nbytes for s in cluster.node(p).shards.values()) for p in range(nodes)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--scale", type=float, default=0.1, help="criteo-like scale for the per-node table")
    args = parser.parse_args()
    rows = args.rows
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
    print()
    sizes = criteo_like_sizes(args.scale)
    raw = sum(sizes.values()) * (64 + 1) * 4  # a rowwise_adagrad record: 64 weights and one state
    nodes_out = []
    for code, k, r, nodes in [("xor", 4, 1, 5), ("rs", 4, 2, 6), ("rs", 6, 3, 9)]:
        held = per_node(sizes, code, k, r, nodes)
        replica = (r + 1) * raw / nodes
        nodes_out.append([f"{code}({k},{r})", nodes, r, round(raw / 2**20), round(max(held) / 2**20),
                          round(sum(held) / nodes / 2**20), round(replica / 2**20), round(max(held) / replica, 3)])
    print(f"criteo-like x{args.scale:g}: {sum(sizes.values()):,} rows, rowwise_adagrad, dim 64")
    report("memory_per_node", ["code", "nodes", "failures survived", "raw MiB", "max MiB/node", "mean MiB/node",
                               "replication MiB/node", "max / replication"], nodes_out, {"scale": args.scale})


if __name__ == "__main__":
    main()
