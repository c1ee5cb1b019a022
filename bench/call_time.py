"""Where an iteration's wall time goes, call by call: get_many, the model step, apply_gradient_many, step.

The loop of `bench.train_loop` on node processes, "none", xor(4,1) and rs(4,2) on 6 nodes, interleaved,
each `--repeat` times; each call's wall time is taken on the trainer, and the median over a store's
timed iterations and runs counts. A code's extra time in a call is the work its parity adds that the
model step did not hide: the nodes are still busy when the call arrives.

    python -m bench.call_time --scale 1.0 --compute-ms 20
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import ectable

from .common import report
from .train_loop import WARMUP, create_tables
from .workloads import WORKLOADS

STORES = [("none", 4, 0), ("xor", 4, 1), ("rs", 4, 2)]
CALLS = ["get_many", "model step", "apply_gradient_many", "step"]


def timed(work, code: str, k: int, r: int, compute: float) -> np.ndarray:
    """Seconds of each call (columns: CALLS) of each timed iteration (rows) on 6 node processes."""
    with ectable.LocalCluster(nodes=6, code=code, k=k, r=r) as cluster:
        client = cluster.connect()
        create_tables(client, work)
        out = []
        for n, batch in enumerate(work.batches):
            grads = work.gradients(batch)
            marks = [time.perf_counter()]
            client.get_many(batch)
            marks.append(time.perf_counter())
            time.sleep(compute)
            marks.append(time.perf_counter())
            client.apply_gradient_many(grads)
            marks.append(time.perf_counter())
            client.step()
            marks.append(time.perf_counter())
            if n >= WARMUP:
                out.append(np.diff(marks))
        client.flush()
    return np.array(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--compute-ms", type=float, default=20.0)
    args = parser.parse_args()
    work = WORKLOADS["criteo"](args.iters + WARMUP, args.scale)
    runs: dict[str, list] = {}
    for _ in range(args.repeat):
        for code, k, r in STORES:
            name = f"{code}({k},{r})" if r else "none"
            runs.setdefault(name, []).append(timed(work, code, k, r, args.compute_ms / 1e3))
    rows = []
    for name, parts in runs.items():
        every = np.concatenate(parts) * 1e3
        medians = np.median(every, axis=0)
        rows.append([name, *(round(float(m), 1) for m in medians), round(float(every.sum(axis=1).mean()), 1)])
    print(f"\n{work.describe()}; {args.iters} iterations, {args.compute_ms:g} ms model step, 6 node processes; "
          f"ms per call (median), iteration (mean)")
    report("call_time_criteo", ["store", *CALLS, "iteration"], rows, {"scale": args.scale, "iters": args.iters,
                                                                      "repeat": args.repeat})


if __name__ == "__main__":
    main()
