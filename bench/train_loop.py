"""Training-loop throughput: get + (model step) + apply_gradient + step, over a workload's batches.

In one run, interleaved, each `--repeat` times (the median counts):
- numpy: in-process gather/scatter of the same rows with the same optimizer (the floor);
- numpy + a full checkpoint of every table to disk (fsync) every `--checkpoint-every`
  iterations: how embedding tables are protected today;
- code "none", xor(4,1) and rs(4,2) on 6 nodes (the codes also with a window per 4 iterations,
  `window_steps=4`), and "none" and rs(6,3) on 9 nodes; each code's ratio is against "none" on as
  many nodes. Each store's node CPU and trainer CPU per iteration are measured too.
Nodes are processes on loopback (ZeroMQ) unless `--in-process`. With `--curve`, instead: "none" and
xor(4,1) on 6 nodes, each with and without CURVE (every connection authenticated and encrypted).

    python -m bench.train_loop --workload criteo movielens --scale 0.1 --compute-ms 20
    python -m bench.train_loop --workload criteo --curve
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

import ectable
from ectable.protocol.validate import sum_rows

from .common import add_node_nice, cpu_seconds, nice, report
from .workloads import DIM, WORKLOADS, Workload

WARMUP = 3  # untimed iterations first
GROUPED = {"window_steps": 4, "window_seconds": 1.0}  # a window per 4 iterations (the timer must not close it first)
STORES = [("none", 4, 0, 6), ("xor", 4, 1, 6), ("rs", 4, 2, 6), ("xor", 4, 1, 6, GROUPED), ("rs", 4, 2, 6, GROUPED),
          ("none", 4, 0, 9), ("rs", 6, 3, 9)]
NODE_NICE: int | None = None  # `--node-nice`: the node processes' `node_nice` (None: LocalCluster's default)
CURVE_STORES = [("none", 4, 0, 6), ("xor", 4, 1, 6), ("none", 4, 0, 6, {"keys": True}), ("xor", 4, 1, 6, {"keys": True})]


def rowwise_adagrad(rec: np.ndarray, summed: np.ndarray, lr=np.float32(0.01), eps=np.float32(1e-8)) -> None:
    """One row-wise Adagrad step (FBGEMM semantics) on records [n, DIM + 1], in place."""
    rec[:, DIM:] += np.mean(summed * summed, axis=1, keepdims=True)
    rec[:, :DIM] -= lr * summed / (np.sqrt(rec[:, DIM:]) + eps)


def full_checkpoint(tables: dict, path: str) -> float:
    """Write every table to `path` and fsync it; returns the seconds taken."""
    start = time.perf_counter()
    with open(path, "wb") as f:
        for records in tables.values():
            np.save(f, records)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - start


def numpy_loop(work: Workload, compute: float = 0.0, checkpoint_every: int = 0) -> float:
    """Seconds for the timed iterations on in-process numpy tables, with optional full checkpoints."""
    tables = {t: np.ones((rows, DIM + 1), dtype=np.float32) for t, rows in work.sizes.items()}  # pages exist
    with tempfile.TemporaryDirectory(prefix="ectable-ckpt-") as tmp:
        start = 0.0
        for n, batch in enumerate(work.batches):
            if n == WARMUP:
                start = time.perf_counter()
            if checkpoint_every and n > WARMUP and n % checkpoint_every == 0:
                full_checkpoint(tables, os.path.join(tmp, "checkpoint.npy"))
            plan = {t: np.unique(ids, return_inverse=True) for t, ids in batch.items()}
            for t, (uniq, _) in plan.items():
                tables[t][uniq]  # the get
            time.sleep(compute)
            for t, (ids, grads) in work.gradients(batch).items():
                uniq, inv = plan[t]
                summed = sum_rows(inv.reshape(-1), grads, uniq.size)  # what the client does, too
                rec = tables[t][uniq]
                rowwise_adagrad(rec, summed)
                tables[t][uniq] = rec
        return time.perf_counter() - start


def create_tables(client, work: Workload, init: str = "zeros") -> None:
    for t, rows in work.sizes.items():
        client.create_table(t, num_rows=rows, dim=DIM, optimizer="rowwise_adagrad", init=init)


def touch_all(client, work: Workload) -> None:
    """One gradient step on every row, so records and parity are not the initial values."""
    grads = np.random.default_rng(0).standard_normal((1 << 17, DIM)).astype(np.float32)
    for t, rows in work.sizes.items():
        for lo in range(0, rows, 1 << 17):
            ids = np.arange(lo, min(rows, lo + (1 << 17)))
            client.apply_gradient(t, ids, grads[:ids.size])
            client.step()
    client.flush()


def iteration(api, work: Workload, batch: dict, compute: float) -> None:
    """One training iteration through `api` (a client, or anything with its verbs): read the batch's rows,
    a model step of `compute` seconds off the trainer's CPU, apply the gradients, step."""
    api.get_many(batch)
    time.sleep(compute)  # the model's forward and backward pass, on an accelerator
    api.apply_gradient_many(work.gradients(batch))
    api.step()


def cluster_loop(work: Workload, code: str, k: int, r: int, nodes: int, processes: bool, compute: float = 0.0,
                 options: dict | None = None) -> tuple[float, float, float]:
    """(seconds, node CPU seconds, trainer CPU seconds) of the timed iterations on a cluster: get_many, model
    step, apply_gradient_many, step; `options` go to the cluster (with "keys", every process has its own CURVE
    key pair, and nodes check each request's role). In process, the nodes' CPU is the trainer's."""
    with ectable.LocalCluster(nodes=nodes, code=code, k=k, r=r, processes=processes,
                              **(nice(NODE_NICE) if processes else {}), **(options or {})) as cluster:
        client = cluster.connect()
        create_tables(client, work)
        pids = cluster.node_pids() if processes else []
        start = nodes_cpu = trainer_cpu = 0.0
        for n, batch in enumerate(work.batches):
            if n == WARMUP:
                # Every store's timing starts with its windows closed and their deltas folded: a window of several
                # steps would otherwise fold its first deltas, which fault in the parity rows' pages (seconds at
                # full size), inside the timed iterations.
                client.flush()
                time.sleep(0.1)  # the nodes fold what they queued once idle
                start, nodes_cpu, trainer_cpu = time.perf_counter(), cpu_seconds(pids), time.process_time()
            iteration(client, work, batch, compute)
        client.flush()
        return (time.perf_counter() - start, cpu_seconds(pids) - nodes_cpu, time.process_time() - trainer_cpu)


def store_name(code, k, r, nodes, options=None) -> str:
    options = options or {}
    return ((f"{code}({k},{r})" if r else "none") + f" {nodes} nodes" + (" + CURVE" if options.get("keys") else "")
            + "".join(f", {key}={value}" for key, value in options.items() if key != "keys"))


def run(work: Workload, repeat: int, compute: float, checkpoint_every: int, processes: bool,
        stores: list = STORES) -> dict:
    """{store: median seconds}, every store run `repeat` times, interleaved."""
    ckpt = f"numpy + checkpoint every {checkpoint_every} it."
    runs: dict[str, list] = {}
    cpu: dict[str, list] = {}  # store -> [(node CPU s, trainer CPU s)] per run
    for _ in range(repeat):  # interleaved, so a noisy neighbour hurts every store alike
        runs.setdefault("numpy", []).append(numpy_loop(work, compute))
        if not any(s[4:] and "keys" in s[4] for s in stores):
            runs.setdefault(ckpt, []).append(numpy_loop(work, compute, checkpoint_every))
        for code, k, r, nodes, *options in stores:
            name = store_name(code, k, r, nodes, *options)
            secs, node_cpu, trainer_cpu = cluster_loop(work, code, k, r, nodes, processes, compute, *options)
            runs.setdefault(name, []).append(secs)
            cpu.setdefault(name, []).append((node_cpu, trainer_cpu))
    iters = len(work.batches) - WARMUP
    per_iter = {name: [round(float(np.median([c[n] for c in runs_cpu])) / iters * 1000, 1) for n in (0, 1)]
                for name, runs_cpu in cpu.items()}  # ms per iteration: nodes, trainer
    return {"median": {name: float(np.median(t)) for name, t in runs.items()}, "seconds": runs,
            "cpu_ms_per_iteration": per_iter}


def table(work: Workload, median: dict, cpu: dict, stores: list = STORES) -> list:
    """[store, ids/s, against none on as many nodes (with CURVE if it has it), against numpy, node and trainer
    CPU ms per iteration] per store."""
    ids = sum(sum(v.size for v in b.values()) for b in work.batches[WARMUP:])
    none = {store_name(*s): median[store_name("none", 4, 0, s[3], *[{"keys": True}] * bool(s[4:] and s[4].get("keys")))]
            for s in stores}
    return [[name, round(ids / secs), round(none[name] / secs, 3) if name in none else "-",
             round(median["numpy"] / secs, 3), *cpu.get(name, ["-", "-"])] for name, secs in median.items()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", nargs="+", default=["criteo", "movielens"], choices=sorted(WORKLOADS))
    parser.add_argument("--scale", type=float, default=0.1, help="table sizes (criteo, zipf)")
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--in-process", action="store_true", help="nodes inside this process")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each store, interleaved; the median counts")
    parser.add_argument("--compute-ms", type=float, default=0.0,
                        help="idle time per iteration between get and apply_gradient (the model's own step)")
    parser.add_argument("--checkpoint-every", type=int, default=15, help="iterations between full checkpoints")
    parser.add_argument("--curve", action="store_true", help="none and xor(4,1), each with and without CURVE keys")
    parser.add_argument("--one-step-windows", action="store_true",
                        help="leave out the stores with window_steps (for a build that lacks it)")
    add_node_nice(parser)
    args = parser.parse_args()
    global NODE_NICE
    NODE_NICE = args.node_nice
    stores = CURVE_STORES if args.curve else STORES
    if args.one_step_windows:
        stores = [s for s in stores if not (s[4:] and "window_steps" in s[4])]
    compute = args.compute_ms / 1000
    for name in args.workload:
        work = WORKLOADS[name](args.iters, args.scale)
        result = run(work, args.repeat, compute, args.checkpoint_every, not args.in_process, stores)
        mode = "in process" if args.in_process else "node processes over ZeroMQ"
        print(f"\n{work.describe()}; {args.iters} iterations, {mode}, {args.compute_ms:g} ms model step")
        suffix = ("_inprocess" if args.in_process else "") + (f"_compute{args.compute_ms:g}ms" if compute else "")
        suffix += ("_curve" if args.curve else "") + (f"_nice{args.node_nice}" if args.node_nice is not None else "")
        report(f"train_loop_{name}{suffix}", ["store", "ids/s", "vs none", "vs numpy", "node CPU ms/it",
                                              "trainer CPU ms/it"],
               table(work, result["median"], result["cpu_ms_per_iteration"], stores),
               {**result, "workload": work.describe(), "compute_ms": args.compute_ms, "iters": args.iters,
                "unique_per_batch": work.unique_per_batch(), "checkpoint_every": args.checkpoint_every,
                "node_nice": args.node_nice})


if __name__ == "__main__":
    main()
