"""Per-iteration parity cost: against table size (the same ~9,000 touched rows in a 1x and a 10x
table), and against k and dim (beside code "none" at the same dim, in the same run).

Times `apply_gradient` + `step()` (window close, deltas built and applied to parity) on an
in-process cluster. Target (SPEC section 5): 10x the rows costs <= 1.1x the time.
"""
from __future__ import annotations

import sys
import time

import numpy as np

import ectable

from .common import report


def per_iteration(rows: int, code: str, k: int, r: int, iters: int, touched: int = 9000, dim: int = 64) -> float:
    with ectable.LocalCluster(nodes=max(6, k + r), code=code, k=k, r=r, processes=False) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=rows, dim=dim, optimizer="rowwise_adagrad", init="zeros")
        rng = np.random.default_rng(0)
        batches = [rng.choice(min(rows, 1_000_000), touched, replace=False) for _ in range(iters)]
        grads = rng.standard_normal((touched, dim)).astype(np.float32)
        times = []
        for ids in batches:
            start = time.perf_counter()
            client.apply_gradient("t", ids, grads)
            client.step()
            times.append(time.perf_counter() - start)
        return float(np.median(times[2:]))


def main():
    base = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    rows = []
    for code, k, r in [("xor", 4, 1), ("rs", 4, 2)]:
        small = per_iteration(base, code, k, r, 30)
        large = per_iteration(10 * base, code, k, r, 30)
        rows.append([f"{code}({k},{r})", base, 10 * base, round(small * 1e3, 2), round(large * 1e3, 2),
                     round(large / small, 3), "yes" if large / small <= 1.1 else "NO"])
    report("window_cost", ["code", "rows 1x", "rows 10x", "ms/iter 1x", "ms/iter 10x", "ratio", "<= 1.1x"], rows)
    print()
    sweep = []
    for dim in (16, 64, 128):
        none = per_iteration(base, "none", 4, 0, 20, dim=dim)
        for code, k, r in [("xor", 2, 1), ("xor", 4, 1), ("xor", 8, 1), ("rs", 4, 2), ("rs", 6, 3)]:
            t = per_iteration(base, code, k, r, 20, dim=dim)
            sweep.append([f"{code}({k},{r})", max(6, k + r), dim, round(none * 1e3, 2), round(t * 1e3, 2),
                          round((t - none) * 1e3, 2), round(t / none, 2)])
    report("window_cost_k_dim", ["code", "nodes", "dim", "none ms/iter", "ms/iter", "parity ms", "vs none"], sweep)


if __name__ == "__main__":
    main()
