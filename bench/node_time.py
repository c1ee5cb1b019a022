"""Where a node's time goes: each request type and each piece of parity work, per iteration.

Runs the training loop (get_many, apply_gradient_many, step; no model step) on an in-process
cluster, so that every node runs in this one thread and the times are CPU times with no other
process competing, and times each of the node's methods below in thread CPU time, summed over
the nodes. Each store runs `--repeat` times; the run with the lowest parity total counts.

    python -m bench.node_time --workload criteo --scale 0.1
"""
from __future__ import annotations

import time
from collections import defaultdict

import ectable
from ectable.storage.node import Node

from .common import report
from .train_loop import create_tables
from .workloads import WORKLOADS, profile_args

PARITY = ["close_window", "op_delta", "apply_queued"]  # what a code with parity adds
SHARED = ["op_get_many", "op_write"]
STORES = [("none", 4, 0), ("xor", 4, 1), ("rs", 4, 2)]


def timed(work, code: str, k: int, r: int) -> dict:
    """{method: ms per iteration} over the workload's batches on 6 in-process nodes."""
    spent: dict[str, float] = defaultdict(float)
    saved = {name: getattr(Node, name) for name in PARITY + SHARED}

    def wrap(name, method):
        def call(*args, **kwargs):
            start = time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                spent[name] += time.thread_time() - start
        return call

    for name, method in saved.items():
        setattr(Node, name, wrap(name, method))
    ops = Node._ops
    Node._ops = {op: getattr(Node, f"op_{op}") for op in ops}  # the dispatcher's table, wrapped too
    try:
        with ectable.LocalCluster(nodes=6, code=code, k=k, r=r, processes=False) as cluster:
            client = cluster.connect()
            create_tables(client, work)
            for batch in work.batches:
                client.get_many(batch)
                client.apply_gradient_many(work.gradients(batch))
                client.step()
            client.flush()
    finally:
        for name, method in saved.items():
            setattr(Node, name, method)
        Node._ops = ops
    return {name: spent[name] / len(work.batches) * 1000 for name in PARITY + SHARED}


def main():
    args = profile_args(__doc__.splitlines()[0])
    work = WORKLOADS[args.workload](args.iters, args.scale)
    rows = []
    for code, k, r in STORES:
        best = min((timed(work, code, k, r) for _ in range(args.repeat)), key=lambda t: sum(t[n] for n in PARITY))
        rows.append([f"{code}({k},{r})" if r else "none", *(round(best[n], 2) for n in PARITY),
                     round(sum(best[n] for n in PARITY), 2), *(round(best[n], 2) for n in SHARED)])
    print(f"\n{work.describe()}; {args.iters} iterations in process, ms per iteration summed over 6 nodes")
    report(f"node_time_{args.workload}", ["store", *PARITY, "parity", *SHARED], rows)


if __name__ == "__main__":
    main()
