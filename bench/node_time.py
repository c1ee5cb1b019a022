"""Where a node's time goes: each request type and each piece of parity work, per iteration.

Runs the training loop (get_many, apply_gradient_many, step; no model step) on an in-process
cluster, so that every node runs in this one thread and the times are CPU times with no other
process competing, and times each of the node's methods below in thread CPU time, summed over
the nodes, over the iterations after the first `WARMUP` windows (which touch fresh pages of the tables and of
their parity: at full size, seconds once per process; a first fold of a window of 4 iterations faulted in
huge pages for 0.5 s in all). Each store runs `--repeat` times; the run with the lowest parity total counts.
Then, in one run, the gathers of a read and of a write as the nodes do them and as they did
before `3d8cea4` (each batch's rows, every node and table, interleaved).

    python -m bench.node_time --workload criteo --scale 0.1
"""
from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

import ectable
from ectable.arrays import unique
from ectable.storage.node import Node

from .common import report
from .train_loop import GROUPED, WARMUP, create_tables
from .workloads import WORKLOADS, profile_args

PARITY = ["close_window", "op_delta", "apply_queued"]  # what a code with parity adds
SHARED = ["op_get_many", "op_write"]
STORES = [("none", 4, 0), ("xor", 4, 1), ("rs", 4, 2), ("xor", 4, 1, GROUPED), ("rs", 4, 2, GROUPED)]


def timed(work, code: str, k: int, r: int, options: dict | None = None) -> dict:
    """{method: ms per iteration} over the workload's batches on 6 in-process nodes (`options`: of the cluster)."""
    spent: dict[str, float] = defaultdict(float)
    warmup = WARMUP * (options or {}).get("window_steps", 1)  # windows, not iterations: a code's first folds
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
        with ectable.LocalCluster(nodes=6, code=code, k=k, r=r, processes=False, **(options or {})) as cluster:
            client = cluster.connect()
            create_tables(client, work)
            for n, batch in enumerate(work.batches):
                if n == warmup:  # the first windows touch fresh pages of the tables and parity: not a per-iteration cost
                    spent.clear()
                client.get_many(batch)
                client.apply_gradient_many(work.gradients(batch))
                client.step()
            client.flush()
    finally:
        for name, method in saved.items():
            setattr(Node, name, method)
        Node._ops = ops
    return {name: spent[name] / (len(work.batches) - warmup) * 1000 for name in PARITY + SHARED}


def gathers(work) -> dict:
    """{way: median ms per iteration} of the record gathers of each batch's rows on 6 nodes: a read's weights
    in one pass or as records then their weights; a write's records before and after the optimizer as one
    gather and a copy, or as two gathers (the second after every table's first, as the write ran them)."""
    def read_now(parts):
        for records, local, dim in parts:
            records[local, :dim]

    def read_before(parts):
        for records, local, dim in parts:
            np.ascontiguousarray(records[local][:, :dim])

    def write_now(parts):
        for records, local, _ in parts:
            records[local].copy()

    def write_before(parts):
        for records, local, _ in parts:
            records[local]
        for records, local, _ in parts:
            records[local]

    ways = {"read, one pass": read_now, "read, records then weights": read_before,
            "write, a gather and a copy": write_now, "write, two gathers": write_before}
    spent: dict[str, list] = {way: [] for way in ways}
    with ectable.LocalCluster(nodes=6, code="none", k=4, r=0, processes=False) as cluster:
        client = cluster.connect()
        create_tables(client, work)
        nodes = [cluster.node(i) for i in range(6)]
        for n, batch in enumerate(work.batches):
            parts = []
            for table, ids in batch.items():
                ids = unique(ids)
                for node in nodes:
                    shard = node.shards[table]
                    mine = ids[shard.layout.data_node(ids) == node.position]
                    parts.append((shard.records, shard.layout.data_offset(mine), shard.dim))
            order = list(ways) if n % 2 else list(ways)[::-1]
            for way in order:
                start = time.thread_time()
                ways[way](parts)
                if n >= WARMUP:  # the first batches fault the tables' pages in
                    spent[way].append(time.thread_time() - start)
            client.get_many(batch)
            client.apply_gradient_many(work.gradients(batch))
            client.step()
    return {way: float(np.median(times)) * 1e3 for way, times in spent.items()}


def main():
    args = profile_args(__doc__.splitlines()[0])
    work = WORKLOADS[args.workload](args.iters, args.scale)
    rows = []
    for code, k, r, *options in STORES:
        best = min((timed(work, code, k, r, *options) for _ in range(args.repeat)),
                   key=lambda t: sum(t[n] for n in PARITY))
        name = (f"{code}({k},{r})" if r else "none") + (f" W={options[0]['window_steps']}" if options else "")
        rows.append([name, *(round(best[n], 2) for n in PARITY),
                     round(sum(best[n] for n in PARITY), 2), *(round(best[n], 2) for n in SHARED)])
    print(f"\n{work.describe()}; {args.iters} iterations in process, ms per iteration summed over 6 nodes")
    report(f"node_time_{args.workload}", ["store", *PARITY, "parity", *SHARED], rows)
    ways = gathers(work)
    print("\nrecord gathers of each batch's rows, 6 nodes, in process, ms per iteration (median), one run")
    names = list(ways)
    report(f"node_gathers_{args.workload}", ["gathers", "ms", "vs before"],
           [[name, round(ways[name], 2), round(ways[name] / ways[names[i | 1]], 3)] for i, name in enumerate(names)])


if __name__ == "__main__":
    main()
