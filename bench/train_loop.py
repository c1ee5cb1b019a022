"""Training-loop throughput: get + apply_gradient + step over Zipf-skewed batches, dim 64.

Runs code="none", xor(4,1) and rs(4,2) on the same 6 nodes, and in-process numpy
gather/scatter of the same rows (the floor), all in one run; prints rows/s and ratios.
Nodes are processes on loopback (ZeroMQ) unless `--in-process`.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import ectable

from .common import report

DIM = 64
WARMUP = 3  # untimed iterations first


def training_work(rows: int, n: int, per_batch: int = 20_000, seed: int = 0) -> list:
    """`n` batches of (Zipf-skewed ids, float32 gradients [len(ids), DIM])."""
    rng = np.random.default_rng(seed)
    work = []
    for _ in range(n):
        ids = (rng.zipf(1.1, per_batch) - 1) % rows
        work.append((ids, rng.standard_normal((ids.size, DIM)).astype(np.float32)))
    return work


def rowwise_adagrad(rec: np.ndarray, summed: np.ndarray, lr=np.float32(0.01), eps=np.float32(1e-8)) -> None:
    """One row-wise Adagrad step (FBGEMM semantics) on records [n, DIM + 1], in place."""
    rec[:, DIM:] += np.mean(summed * summed, axis=1, keepdims=True)
    rec[:, :DIM] -= lr * summed / (np.sqrt(rec[:, DIM:]) + eps)


def numpy_floor(rows: int, work, compute: float = 0.0) -> float:
    table = np.ones((rows, DIM + 1), dtype=np.float32)  # written, so its pages exist before timing
    start = 0.0
    for n, (ids, grads) in enumerate(work):
        if n == WARMUP:
            start = time.perf_counter()
        uniq, inv = np.unique(ids, return_inverse=True)
        table[uniq]  # the get
        time.sleep(compute)
        summed = np.zeros((uniq.size, DIM), dtype=np.float32)
        np.add.at(summed, inv, grads)
        rec = table[uniq]
        rowwise_adagrad(rec, summed)
        table[uniq] = rec
    return time.perf_counter() - start


def cluster_loop(rows: int, work, code: str, k: int, r: int, processes: bool, compute: float = 0.0) -> float:
    with ectable.LocalCluster(nodes=6, code=code, k=k, r=r, processes=processes) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=rows, dim=DIM, optimizer="rowwise_adagrad", init="zeros")
        start = 0.0
        for n, (ids, grads) in enumerate(work):
            if n == WARMUP:
                start = time.perf_counter()
            client.get("t", ids)
            time.sleep(compute)  # the model's forward and backward pass, on an accelerator
            client.apply_gradient("t", ids, grads)
            client.step()
        client.flush()
        return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--batch", type=int, default=20_000, help="ids per batch (before dedup)")
    parser.add_argument("--in-process", action="store_true", help="nodes inside this process")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each store, interleaved; the median counts")
    parser.add_argument("--compute-ms", type=float, default=0.0,
                        help="idle time per iteration between get and apply_gradient (the model's own step)")
    args = parser.parse_args()
    work = training_work(args.rows, args.iters, args.batch)
    ids = [i for i, _ in work]
    unique = np.mean([np.unique(i).size for i in ids])
    total = sum(i.size for i in ids[WARMUP:])
    compute = args.compute_ms / 1000
    runs: dict[str, list] = {}
    for _ in range(args.repeat):  # interleaved, so a noisy neighbour hurts every store alike
        runs.setdefault("numpy", []).append(numpy_floor(args.rows, work, compute))
        for code, k, r in [("none", 4, 0), ("xor", 4, 1), ("rs", 4, 2)]:
            name = f"{code}({k},{r})" if r else "none"
            runs.setdefault(name, []).append(cluster_loop(args.rows, work, code, k, r, not args.in_process, compute))
    results = {name: float(np.median(times)) for name, times in runs.items()}
    out = [[name, round(total / secs), round(results["none"] / secs, 3), round(results["numpy"] / secs, 3)]
           for name, secs in results.items()]
    mode = "in process" if args.in_process else "node processes over ZeroMQ"
    print(f"{args.iters} batches of {args.batch} ids ({unique:.0f} unique on average), {args.rows} rows, dim {DIM}, "
          f"{mode}, {args.compute_ms} ms model step")
    name = ("train_loop_inprocess" if args.in_process else "train_loop") + (f"_compute{args.compute_ms:g}ms" if compute else "")
    report(name, ["store", "ids/s", "vs none", "vs numpy"], out,
           {"unique_per_batch": unique, "seconds": runs, "compute_ms": args.compute_ms})


if __name__ == "__main__":
    main()
