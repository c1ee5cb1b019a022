"""What checkpoints cost a training loop, and what they write, for each policy and quantization.

One run, interleaved `--repeat` times (the median counts): the criteo-like loop of
`bench.train_loop` (get_many, model step, apply_gradient_many, step) on xor(4,1) over 6 node
processes, without checkpoints and with one every `--every` iterations under each setting
below. Per setting: the loop's throughput against the same loop without checkpoints, the time
`checkpoint()` holds the trainer (the nodes' in-memory copy), the bytes written per checkpoint
and the bytes a restore of the last one reads, each also against full exact checkpoints
(Check-N-Run reports both: write bandwidth and storage capacity). That restores give back what
was checkpointed is proven by the tests (`tests/test_checkpoint.py`, the state machine).

    python -m bench.checkpoint --scale 0.1 --iters 60 --every 10
"""
from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

import ectable
from ectable.checkpoint.history import Chain

from .common import report
from .train_loop import WARMUP, create_tables
from .workloads import WORKLOADS, Workload

SETTINGS = [  # (name, policy, bits, adaptive)
    ("full, exact", "full", None, False),
    ("incremental, exact", "incremental", None, False),
    ("differential, exact", "differential", None, False),
    ("intermittent, exact", "intermittent", None, False),
    ("intermittent, 8-bit", "intermittent", 8, False),
    ("intermittent, 4-bit", "intermittent", 4, False),
    ("incremental, 4-bit", "incremental", 4, False),
]


def loop(work: Workload, compute: float, every: int, setting: tuple | None, directory: str) -> dict:
    """Seconds of the timed iterations; with a setting, checkpoints every `every` iterations (the last one
    waited for), their blocking seconds, bytes written and the bytes a restore of the last reads."""
    with ectable.LocalCluster(nodes=6, code="xor", k=4, r=1) as cluster:
        client = cluster.connect()
        create_tables(client, work, init="normal")
        blocked, start = [], 0.0
        for n, batch in enumerate(work.batches):
            if n == WARMUP:
                start = time.perf_counter()
            client.get_many(batch)
            time.sleep(compute)
            client.apply_gradient_many(work.gradients(batch))
            client.step()
            if setting and n >= WARMUP and (n - WARMUP) % every == every - 1:
                _, policy, bits, adaptive = setting
                began = time.perf_counter()
                client.checkpoint(directory, policy=policy, bits=bits, adaptive=adaptive)
                blocked.append(time.perf_counter() - began)
        if setting:
            client.checkpoint_wait()
        seconds = time.perf_counter() - start
        out = {"seconds": seconds}
        if setting:
            chain = Chain(directory)
            sizes = {m["number"]: sum(p["bytes"] for p in m["pieces"]) for m in chain.manifests}
            last = chain.manifests[-1]
            out.update(blocked=float(np.median(blocked)), written=float(np.mean(list(sizes.values()))),
                       kept=sum(sizes[n] for n in last["chain_numbers"]), kinds=[m["kind"] for m in chain.manifests],
                       rows=float(np.mean([m["rows"] for m in chain.manifests])))
        return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="criteo", choices=sorted(WORKLOADS))
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--every", type=int, default=10, help="iterations between checkpoints")
    parser.add_argument("--compute-ms", type=float, default=20.0, help="the model's own step per iteration")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    work = WORKLOADS[args.workload](args.iters, args.scale)
    compute = args.compute_ms / 1000
    runs: dict[str, list] = {}
    for _ in range(args.repeat):  # interleaved
        for setting in [None, *SETTINGS]:
            with tempfile.TemporaryDirectory(prefix="ectable-bench-ckpt-") as tmp:
                runs.setdefault(setting[0] if setting else "no checkpoints", []).append(
                    loop(work, compute, args.every, setting, tmp + "/chain"))
    median = {name: {key: (float(np.median([r[key] for r in rs])) if key != "kinds" else rs[-1][key])
                     for key in rs[0]} for name, rs in runs.items()}
    base, full = median["no checkpoints"]["seconds"], median["full, exact"]
    rows = [["no checkpoints", 1.0, "-", "-", "-", "-", "-", "-"]]
    for name, m in median.items():
        if name == "no checkpoints":
            continue
        rows.append([name, round(base / m["seconds"], 3), round(m["blocked"] * 1000, 1), round(m["rows"]),
                     round(m["written"] / 2**20, 2), round(full["written"] / m["written"], 2),
                     round(m["kept"] / 2**20, 2), round(full["kept"] / m["kept"], 2)])
    print(f"\n{work.describe()}; {args.iters} iterations, a checkpoint every {args.every}, {args.compute_ms:g} ms "
          f"model step, xor(4,1) on 6 node processes")
    report(f"checkpoint_{args.workload}", ["setting", "vs no checkpoints", "blocks ms", "rows/ckpt", "MiB/ckpt",
                                            "write saving", "restore MiB", "capacity saving"], rows,
           {"runs": runs, "median": median, "iters": args.iters, "every": args.every, "compute_ms": args.compute_ms,
            "workload": work.describe()})


if __name__ == "__main__":
    main()
