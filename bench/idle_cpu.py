"""CPU an idle cluster takes: a LocalCluster of node processes, two deciders and etcd, one small table,
no requests, each process's share of one core over `--seconds` (user + system, /proc).

    python -m bench.idle_cpu --seconds 10
"""
from __future__ import annotations

import argparse
import os
import time

import ectable

from .common import cpu_seconds, descendants, kind, report


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--nodes", type=int, default=6)
    args = parser.parse_args()
    with ectable.LocalCluster(nodes=args.nodes, code="xor", k=4, r=1, processes=True) as cluster:
        cluster.connect().create_table("t", num_rows=1000, dim=8)
        time.sleep(2.0)  # past start-up
        pids = descendants(os.getpid())
        kinds = {p: kind(p) for p in pids}
        before, start = {p: cpu_seconds([p]) for p in pids}, time.perf_counter()
        time.sleep(args.seconds)
        used = {p: cpu_seconds([p]) - before[p] for p in pids}
        elapsed = time.perf_counter() - start
    shares: dict[str, list[float]] = {}
    for p, seconds in used.items():
        shares.setdefault(kinds[p], []).append(100 * seconds / elapsed)
    rows = [[name, len(s), round(sum(s), 1), round(sum(s) / len(s), 2)] for name, s in sorted(shares.items())]
    rows.append(["all", len(used), round(sum(sum(s) for s in shares.values()), 1), "-"])
    report("idle_cpu", ["process", "count", "% of a core, all", "% of a core, each"], rows,
           {"seconds": elapsed, "nodes": args.nodes})


if __name__ == "__main__":
    main()
