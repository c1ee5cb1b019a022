"""What checkpoints cost a training loop and what they write, for each policy and bit width.

One run, each setting once after the other: the criteo-like loop of `bench.train_loop`
(get_many, model step, apply_gradient_many, step) on xor(4,1) over 6 node processes, without
checkpoints and with one every `--every` iterations under each setting below. Per setting:

- the loop's throughput against the same loop without checkpoints;
- the pause: how long `checkpoint()` holds the trainer (the nodes copy their rows to write),
  against the time numpy takes to copy that many rows in this process (the floor);
- the time until the pieces are written (the slowest node), in the background;
- bytes written per checkpoint, and bytes a restore of the last one reads, each against full
  fp32 checkpoints (Check-N-Run reports both: write bandwidth and storage capacity);
- the time to restore the last checkpoint into a new cluster (rs(4,2) on 6 node processes).

With `--trained`, every row is written once before the timed loop, as it is after a first epoch
of real data (whose vocabularies hold only ids that occur in it): a full checkpoint then writes
every row, as it does for the rest of a long training run.

    python -m bench.checkpoint --scale 0.1 --iters 400 --every 100 [--trained]
"""
from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

import ectable
from ectable.checkpoint.history import Chain

from .common import report
from .train_loop import WARMUP, create_tables, iteration, touch_all
from .workloads import DIM, WORKLOADS, Workload

SETTINGS = [  # (name, policy, bits, adaptive)
    ("full, fp32", "full", None, False),
    ("incremental, fp32", "incremental", None, False),
    ("differential, fp32", "differential", None, False),
    ("intermittent, fp32", "intermittent", None, False),
    ("intermittent, 8-bit", "intermittent", 8, False),
    ("intermittent, 4-bit", "intermittent", 4, False),
    ("intermittent, 4-bit adaptive", "intermittent", 4, True),
    ("intermittent, 3-bit", "intermittent", 3, False),
    ("intermittent, 2-bit", "intermittent", 2, False),
]
WIDTH = DIM + 1  # rowwise_adagrad: weights and one state value


def loop(work: Workload, compute: float, every: int, setting: tuple | None, directory: str,
         trained: bool = False) -> dict:
    """Seconds of the timed iterations; with a setting, a checkpoint every `every` iterations: pauses, write
    times, rows and bytes per checkpoint, bytes a restore of the last reads, and that restore's seconds.
    `trained`: every row written once first."""
    with ectable.LocalCluster(nodes=6, code="xor", k=4, r=1) as cluster:
        client = cluster.connect()
        create_tables(client, work, init="normal")
        if trained:
            touch_all(client, work)
        paused, start = [], 0.0
        for n, batch in enumerate(work.batches):
            if n == WARMUP:
                start = time.perf_counter()
            iteration(client, work, batch, compute)
            if setting and n >= WARMUP and (n - WARMUP) % every == every - 1:
                _, policy, bits, adaptive = setting
                began = time.perf_counter()
                client.checkpoint(directory, policy=policy, bits=bits, adaptive=adaptive)
                paused.append(time.perf_counter() - began)
        seconds = time.perf_counter() - start
        if not setting:
            return {"seconds": seconds}
        client.checkpoint_wait()
    chain = Chain(directory)
    sizes = {m["number"]: sum(p["bytes"] for p in m["pieces"]) for m in chain.manifests}
    last = chain.manifests[-1]
    with ectable.LocalCluster(nodes=6, code="rs", k=4, r=2, spares=0) as other:
        began = time.perf_counter()
        ectable.restore(directory, other)
        restore = time.perf_counter() - began
    rows = [m["rows"] for m in chain.manifests]
    return {"seconds": seconds, "paused": paused, "rows": rows, "bytes": list(sizes.values()),
            "write_seconds": [m["write_seconds"] for m in chain.manifests], "kinds": [m["kind"] for m in chain.manifests],
            "restore_bytes": sum(sizes[n] for n in last["chain_numbers"]), "restore_seconds": restore}


def copy_seconds(table: np.ndarray, rows: int, repeat: int = 3) -> float:
    """Best time numpy takes to gather `rows` random records out of `table` in this process."""
    pick = np.sort(np.random.default_rng(0).choice(table.shape[0], min(rows, table.shape[0]), replace=False))
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        table[pick]
        best = min(best, time.perf_counter() - began)
    return best


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="criteo", choices=sorted(WORKLOADS))
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--iters", type=int, default=400)
    parser.add_argument("--every", type=int, default=100, help="iterations between checkpoints")
    parser.add_argument("--trained", action="store_true", help="every row written once first (as after an epoch)")
    parser.add_argument("--compute-ms", type=float, default=20.0, help="the model's own step per iteration")
    args = parser.parse_args()
    work = WORKLOADS[args.workload](args.iters + WARMUP, args.scale)
    compute = args.compute_ms / 1000
    results = {"no checkpoints": loop(work, compute, args.every, None, "", args.trained)}
    for setting in SETTINGS:
        with tempfile.TemporaryDirectory(prefix="ectable-bench-ckpt-") as tmp:
            results[setting[0]] = loop(work, compute, args.every, setting, tmp + "/chain", args.trained)
    table = np.ones((sum(work.sizes.values()), WIDTH), dtype=np.float32)  # every record of the workload
    for r in list(results.values())[1:]:
        r["copy_seconds"] = [copy_seconds(table, n) for n in r["rows"]]
    base, full = results["no checkpoints"]["seconds"], results["full, fp32"]
    full_bytes = np.mean(full["bytes"])
    rows = [["no checkpoints", 1.0] + ["-"] * 10]
    for name, r in list(results.items())[1:]:
        pause, copy = np.median(r["paused"]), np.median(r["copy_seconds"])
        rows.append([name, round(base / r["seconds"], 3), round(float(pause) * 1000, 1),
                     round(float(copy) * 1000, 1), round(float(pause / copy), 1),
                     round(float(np.median(r["write_seconds"])), 2), round(float(np.mean(r["rows"]))),
                     round(float(np.mean(r["bytes"])) / 2**20, 2), round(float(full_bytes / np.mean(r["bytes"])), 2),
                     round(r["restore_bytes"] / 2**20, 2), round(full["restore_bytes"] / r["restore_bytes"], 2),
                     round(r["restore_seconds"], 2)])
    print(f"\n{work.describe()}; {args.iters} iterations, a checkpoint every {args.every}, {args.compute_ms:g} ms "
          f"model step, xor(4,1) on 6 node processes" + ("; every row trained once first" if args.trained else ""))
    report(f"checkpoint_{args.workload}" + ("_trained" if args.trained else ""),
           ["setting", "vs none", "pause ms", "copy ms", "pause/copy", "write s", "rows/ckpt", "MiB/ckpt",
            "fp32/this", "restore MiB", "fp32/this", "restore s"], rows,
           {"results": results, "iters": args.iters, "every": args.every, "compute_ms": args.compute_ms,
            "workload": work.describe(), "trained": args.trained})


if __name__ == "__main__":
    main()
