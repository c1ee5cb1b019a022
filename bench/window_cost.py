"""Per-iteration parity cost: against table size (the same ~9,000 touched rows in a 1x and a 10x
table; the criteo-like workload at `--scale` and 10x it), and against k and dim (beside code
"none" at the same dim, in the same run).

Times `apply_gradient` + `step()` (window close, deltas built and applied to parity) on an
in-process cluster. Target (SPEC section 5): 10x the rows costs <= 1.1x the time.

    python -m bench.window_cost [--rows 200000] [--scale 0.1]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import ectable

from .common import report
from .workloads import TOTAL_ROWS, criteo


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


def per_iteration_criteo(scale: float, code: str, k: int, r: int, iters: int = 20) -> tuple[float, float]:
    """Median seconds of apply_gradient_many + step over criteo-like batches at `scale`, and unique rows per batch."""
    work = criteo(iters, scale)
    with ectable.LocalCluster(nodes=6, code=code, k=k, r=r, processes=False) as cluster:
        client = cluster.connect()
        for t, rows in work.sizes.items():
            client.create_table(t, num_rows=rows, dim=64, optimizer="rowwise_adagrad", init="zeros")
        times = []
        for batch in work.batches:
            start = time.perf_counter()
            client.apply_gradient_many(work.gradients(batch))
            client.step()
            times.append(time.perf_counter() - start)
    return float(np.median(times[2:])), work.unique_per_batch()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the 1x table")
    parser.add_argument("--scale", type=float, default=0.1, help="criteo-like scale of the 1x run")
    args = parser.parse_args()
    base = args.rows
    rows = []
    for code, k, r in [("xor", 4, 1), ("rs", 4, 2)]:
        small = per_iteration(base, code, k, r, 30)
        large = per_iteration(10 * base, code, k, r, 30)
        rows.append([f"{code}({k},{r})", "one table", base, 10 * base, 9000, 9000, round(small * 1e3, 2),
                     round(large * 1e3, 2), round(large / small, 3), "yes" if large / small <= 1.1 else "NO"])
        (small, u_small), (large, u_large) = (per_iteration_criteo(s, code, k, r) for s in (args.scale, 10 * args.scale))
        per_row = (large / u_large) / (small / u_small)
        rows.append([f"{code}({k},{r})", "criteo-like", round(TOTAL_ROWS * args.scale), round(TOTAL_ROWS * args.scale * 10),
                     round(u_small), round(u_large), round(small * 1e3, 2), round(large * 1e3, 2), round(large / small, 3),
                     f"{'yes' if per_row <= 1.1 else 'NO'} ({per_row:.2f} per touched row)"])
    report("window_cost", ["code", "workload", "rows 1x", "rows 10x", "touched 1x", "touched 10x", "ms/iter 1x",
                           "ms/iter 10x", "ratio", "<= 1.1x"], rows)
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
