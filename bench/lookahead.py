"""Lookahead (Bagpipe-style prefetch and cache) against the plain training loop.

For each workload and model step, in one run and interleaved (`--repeat` times, the median counts):
the plain loop (get_many, model step, apply_gradient_many, step) and `ectable.Lookahead` loops for
each `--lookahead` L (with `--cache-rows` C) and each extra C at the largest L. Every run has its own
xor(4,1) cluster of 6 node processes, tables of rowwise Adagrad. Beside them, the in-process numpy
loop of `bench.train_loop` with the same model step: the trainer's own work on its rows (gather,
summing duplicates' gradients, the optimizer step) with no store at all, which is what is left when
the store's work is hidden entirely. Reported per batch: rows the
batch names, rows fetched from the store and written back, hit rate, bytes over the wire (rows read
and written, as records), and iteration time against the plain loop and against the model step
alone. At the end of every run its tables' touched rows are compared bit for bit with the plain
loop's (every run of a workload must match the first plain run exactly).

    python -m bench.lookahead --workload criteo movielens --scale 0.1 --compute-ms 0 20
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import ectable
from ectable.arrays import unique

from .common import report
from .train_loop import create_tables, iteration, numpy_loop
from .workloads import WORKLOADS, Workload

WARMUP = 3
STORE = dict(nodes=6, code="xor", k=4, r=1)


def one_run(work: Workload, compute: float, lookahead: int | None, cache_rows: int) -> dict:
    """Seconds of the timed batches (the final write-back included), the lookahead's counts and the touched
    rows' records, of one run; `lookahead` None: the plain loop."""
    with ectable.LocalCluster(processes=True, **STORE) as cluster:
        client = cluster.connect()
        create_tables(client, work)
        la = None
        if lookahead is not None:
            la = ectable.Lookahead(client, work.batches, lookahead=lookahead, cache_rows=cache_rows)
        api, feed = (la, la) if la is not None else (client, work.batches)
        start = 0.0
        for n, batch in enumerate(feed):
            if n == WARMUP:
                start = time.perf_counter()
            iteration(api, work, batch, compute)
        stats = None
        if la is not None:
            stats = la.stats  # the iteration's end wrote everything back
            la.close()
        else:
            client.flush()
        seconds = time.perf_counter() - start
        touched = {t: unique(np.concatenate([b[t] for b in work.batches])) for t in work.sizes}
        records = client.get_many(touched, records=True)
        client.close()
    return {"seconds": seconds, "stats": stats, "records": records}


def run(work: Workload, compute: float, lookaheads: list[int], caches: list[int], repeat: int) -> list[dict]:
    configs = [(None, 0)] + [(L, caches[0]) for L in lookaheads] + [(lookaheads[-1], c) for c in caches[1:]]
    results = {c: [] for c in configs}
    reference = None
    for _ in range(repeat):
        for config in configs:
            out = one_run(work, compute, *config)
            if reference is None:
                reference = out["records"]
            same = all(np.array_equal(out["records"][t].view(np.uint32), reference[t].view(np.uint32))
                       for t in reference)
            results[config].append((out["seconds"], out["stats"], same))
            print(f"  {work.name} compute {compute * 1000:.0f} ms, L={config[0]} C={config[1]}: "
                  f"{out['seconds']:.2f} s, identical={same}", flush=True)
    timed = len(work.batches) - WARMUP
    plain = float(np.median([s for s, _, _ in results[(None, 0)]]))
    floor = float(np.median([numpy_loop(work, compute) for _ in range(repeat)]))
    rows = [{"workload": work.name, "compute_ms": round(compute * 1000), "L": "numpy, in process", "C": "-",
             "rows/batch": round(work.unique_per_batch()), "fetched/batch": "-", "written/batch": "-", "hit rate": "-",
             "KB/batch": "-", "ms/batch": round(floor / timed * 1000, 2), "vs plain": round(plain / floor, 3),
             "vs model step": round(floor / timed / compute, 3) if compute else "-", "vs numpy": 1.0,
             "identical": "-"}]
    for (L, C), runs in results.items():
        seconds = float(np.median([s for s, _, _ in runs]))
        stats = runs[-1][1]
        batches = len(work.batches)
        per = (lambda key: round(stats[key] / batches)) if stats else (lambda key: "-")
        rows.append({"workload": work.name, "compute_ms": round(compute * 1000), "L": "plain" if L is None else L,
                     "C": C or "-", "rows/batch": round(work.unique_per_batch()),
                     "fetched/batch": per("fetched"), "written/batch": per("written"),
                     "hit rate": round(stats["hit_rate"], 3) if stats else "-",
                     "KB/batch": round((stats["bytes_read"] + stats["bytes_written"]) / batches / 1024) if stats else
                     round(work.unique_per_batch() * (64 + 64 + 1) * 4 / 1024),
                     "ms/batch": round(seconds / timed * 1000, 2), "vs plain": round(plain / seconds, 3),
                     "vs model step": round(seconds / timed / compute, 3) if compute else "-",
                     "vs numpy": round(seconds / floor, 3), "identical": all(same for _, _, same in runs)})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", nargs="+", default=["criteo", "movielens"], choices=sorted(WORKLOADS))
    p.add_argument("--scale", type=float, default=0.1)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--compute-ms", type=float, nargs="+", default=[0.0, 20.0])
    p.add_argument("--lookahead", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--cache-rows", type=int, nargs="+", default=[1 << 20, 20_000],
                   help="the first for every L, the others at the largest L")
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args()
    rows = []
    for name in args.workload:
        work = WORKLOADS[name](args.iters, args.scale)
        print(work.describe(), flush=True)
        for compute in args.compute_ms:
            rows += run(work, compute / 1000, args.lookahead, args.cache_rows, args.repeat)
    columns = list(rows[0])
    report("lookahead", columns, [[r[c] for c in columns] for r in rows], {"args": vars(args)})


if __name__ == "__main__":
    main()
