"""What draining a node, or adding one, costs a training loop. A drain hands the node's position, identity and
state to a spare (no rebuild): its rows are copied while it serves, then it is frozen (writes to it wait) while
its parity and the rows changed meanwhile cross. An add lays the cluster out again over one more position:
every node's rows are copied while they serve, then every node is frozen while the rows changed meanwhile come,
the new layout's rows and parity are built and sent to every node.

    python -m bench.drain [--iters 200] [--rows 200000 2000000] [--code xor rs] [--op drain add]

Each iteration is one get + apply_gradient + step of 512 Zipf-skewed rows of a dim-16 adagrad table on a
process cluster of k + r nodes (and one spare, for a drain). After `iters` iterations a drain of position 2 is
requested (as `ectable node drain` does), or a new spare is started and asked to be added (`ectable node
add`), and training goes on until the map changes, then `iters` more. Prints, per operation, code and table
size: one node's state in MiB, seconds from the request to the map change, the longest iteration meanwhile
against p50 / p99 before, which states the positions were seen in, and writes bench/results/drain.json.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import ectable

from .common import report


def run(op: str, code: str, rows: int, iters: int, batch: int = 512, dim: int = 16) -> list:
    k, r = (4, 1) if code == "xor" else (4, 2)
    rng = np.random.default_rng(0)
    with ectable.LocalCluster(nodes=k + r, code=code, k=k, r=r, spares=int(op == "drain")) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=rows, dim=dim, optimizer="adagrad", lr=0.05, seed=0)
        for start in range(0, rows, 1 << 20):  # every row real
            ids = np.arange(start, min(rows, start + (1 << 20)))
            client.put("t", ids, rng.standard_normal((ids.size, dim)).astype(np.float32))
        state_mib = client.status()["nodes"][2]["bytes"] / 2**20

        def iteration() -> float:
            ids = (rng.zipf(1.2, batch) - 1) % rows
            start = time.perf_counter()
            client.get("t", ids)
            client.apply_gradient("t", ids, rng.standard_normal((batch, dim)).astype(np.float32))
            client.step()
            return time.perf_counter() - start

        before = [iteration() for _ in range(iters)]
        endpoints = list(cluster.endpoints)
        if op == "drain":
            asked = time.monotonic()
            cluster.store.request_drain(endpoints[2])
        else:
            spare = cluster.add_spare()
            asked = time.monotonic()
            cluster.store.request_grow(spare)
        during, states = [], set()
        while list(cluster.endpoints) == endpoints:
            during.append(iteration())
            states |= {cluster.state(p) for p in range(cluster.config.nodes)}
            if time.monotonic() - asked > 300:
                raise RuntimeError(f"the {op} did not finish within 300 s")
        moved = time.monotonic() - asked
        after = [iteration() for _ in range(iters)]
        states |= {cluster.state(p) for p in range(cluster.config.nodes)}
        ms = lambda xs, q: round(float(np.percentile(np.array(xs) * 1e3, q)), 1)  # noqa: E731
        return [op, code, rows, round(state_mib, 1), round(moved, 2), len(during), ms(before, 50), ms(before, 99),
                ms(during, 100), ms(after, 50), "/".join(sorted(states))]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200, help="iterations before and after the drain")
    parser.add_argument("--rows", type=int, nargs="+", default=[200_000, 2_000_000], help="table sizes")
    parser.add_argument("--code", nargs="+", default=["xor", "rs"])
    parser.add_argument("--op", nargs="+", default=["drain", "add"], choices=["drain", "add"],
                        help="drain position 2, or add a node")
    args = parser.parse_args(argv)
    rows = [run(op, code, n, args.iters) for op in args.op for code in args.code for n in args.rows]
    report("drain", ["op", "code", "rows", "node state MiB", "request to map s", "iterations during",
                     "p50 before ms", "p99 before ms", "max during ms", "p50 after ms", "positions seen"], rows)


if __name__ == "__main__":
    main()
