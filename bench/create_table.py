"""How long `create_table` keeps the nodes busy, and what the rows it did not compute cost later.

On node processes: create a table of `--rows` rows (rs(3,2) on 5 nodes, dim 16, normal init), then run
`--iters` iterations of get + apply_gradient + step over `--batch` random rows twice: first while most
rows are still fresh (their initial values and parity computed on first use), then again over the same
ids (all computed). The ratio shows what laziness moves from creation to the first touches.

    python -m bench.create_table [--rows 5000000] [--iters 20] [--batch 4096]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import ectable

from .common import report


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4096)
    args = parser.parse_args(argv)
    with ectable.LocalCluster(nodes=5, code="rs", k=3, r=2) as cluster:
        client = cluster.connect()
        started = time.perf_counter()
        client.create_table("big", num_rows=args.rows, dim=16, init="normal")
        created = time.perf_counter() - started
        rng = np.random.default_rng(0)
        batches = [rng.integers(0, args.rows, args.batch) for _ in range(args.iters)]
        grads = np.ones((args.batch, 16), dtype=np.float32)
        runs = []
        for _ in range(2):  # fresh rows, then the same rows again
            started = time.perf_counter()
            for ids in batches:
                client.get("big", ids)
                client.apply_gradient("big", ids, grads)
                client.step()
            runs.append(time.perf_counter() - started)
        client.flush()
    report("create_table", ["rows", "create_s", "rows_per_s", "first_touch_s", "warm_s", "first_over_warm"],
           [[args.rows, created, args.rows / created, runs[0], runs[1], runs[0] / runs[1]]])


if __name__ == "__main__":
    main()
