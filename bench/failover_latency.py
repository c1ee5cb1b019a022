"""Latency of a training loop's reads and writes when the acting failover decider is SIGKILLed, and
then a node: the decider is on no request's path, so nothing should move but the node's failover.

    python -m bench.failover_latency [--iters 300] [--code xor|rs]

Each iteration is one get + apply_gradient + step of a few hundred Zipf-skewed rows on a
6-node process cluster (etcd and two deciders started by the cluster). Phases: before any
kill; after the acting decider was SIGKILLed (the other one takes over within its lease);
after a node was SIGKILLed too (failed over by the surviving decider onto the spare).
Prints p50 / p99 / max per phase, and writes bench/results/failover_latency.json.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import ectable

from .common import report


def run(iters: int, code: str, rows: int = 200_000, batch: int = 512, dim: int = 16) -> list[list]:
    k, r = (4, 1) if code == "xor" else (4, 2)
    rng = np.random.default_rng(0)
    phases: dict[str, list[float]] = {"before": [], "decider killed": [], "decider and node killed": []}
    with ectable.LocalCluster(nodes=6, code=code, k=k, r=r, spares=1) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=rows, dim=dim, optimizer="adagrad", lr=0.05, seed=0)
        events = {}
        for i in range(3 * iters):
            phase = list(phases)[min(i // iters, 2)]
            if i == iters:
                cluster.kill_decider(cluster.acting_decider())
                events["decider killed at"] = time.monotonic()
            if i == 2 * iters:
                cluster.kill(2)
                events["node killed at"] = time.monotonic()
            ids = (rng.zipf(1.2, batch) - 1) % rows
            start = time.perf_counter()
            client.get("t", ids)
            client.apply_gradient("t", ids, rng.standard_normal((batch, dim)).astype(np.float32))
            client.step()
            phases[phase].append(time.perf_counter() - start)
        client.wait_recovered(timeout=120)
    out = []
    for phase, times in phases.items():
        ms = np.array(times) * 1e3
        out.append([code, phase, len(ms), round(float(np.median(ms)), 2), round(float(np.percentile(ms, 99)), 2),
                    round(float(ms.max()), 1)])
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=300, help="iterations per phase")
    parser.add_argument("--code", nargs="+", default=["xor", "rs"])
    args = parser.parse_args(argv)
    rows = [row for code in args.code for row in run(args.iters, code)]
    report("failover_latency", ["code", "phase", "iterations", "p50 ms", "p99 ms", "max ms"], rows)


if __name__ == "__main__":
    main()
