"""Train a DLRM with several trainer processes sharing ectable tables.

Each trainer is a process of its own with a client of the same cluster. `torch.distributed` (gloo,
CPU) joins them: DDP averages the dense layers' gradients, and the `SparseOptimizer` averages the
embedding gradients the same way, each row applied once, by one trainer. Every global batch is cut
into one slice per trainer, so N trainers compute what one trainer computes on the whole batch in N
micro-batches (`--trainers 1 --micro N`); `--out` saves the tables to compare the two.

    python examples/dlrm_distributed.py --trainers 2 --steps 40
    python examples/dlrm_distributed.py --trainers 1 --micro 2 --steps 40 --out one.npz
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ectable
from ectable.testing import dlrm as D
from ectable.torch import EmbeddingBagCollection, SparseOptimizer

ROWS = {"user": 5000, "item": 2000, "category": 100, "city": 300}
DIM = 16


def trainer(rank: int, args, cluster_file: str, port: int, result_file: str) -> None:
    torch.set_num_threads(1)
    world = args.trainers
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=__import__("datetime").timedelta(seconds=120))
    client = ectable.connect(cluster_file)
    try:
        net = D.model(EmbeddingBagCollection(client, list(ROWS)), list(ROWS), DIM, seed=args.seed)
        sparse = SparseOptimizer(net, process_group=dist.group.WORLD if world > 1 else None)
        if world > 1:
            net = torch.nn.parallel.DistributedDataParallel(net)
        dense = torch.optim.SGD([p for n, p in net.named_parameters() if "embeddings" not in n], lr=args.lr)
        losses, start = [], time.perf_counter()
        for x, features, y in D.batches(args.seed, args.steps, args.batch, ROWS):
            size = args.batch // world
            mine = D.split(features, world)[rank] if world > 1 else features
            losses.append(D.train_step(net, dense, sparse, x[rank * size:(rank + 1) * size], mine,
                                       y[rank * size:(rank + 1) * size], micro=args.micro))
        seconds = time.perf_counter() - start
        if rank == 0:
            with open(result_file, "w") as f:
                json.dump({"losses": losses, "seconds": seconds}, f)
    finally:
        client.close()
        if world > 1:
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trainers", type=int, default=2, help="trainer processes (default 2)")
    p.add_argument("--micro", type=int, default=1, help="micro-batches per trainer and step (default 1)")
    p.add_argument("--steps", type=int, default=40, help="global batches to train on (default 40)")
    p.add_argument("--batch", type=int, default=128, help="global batch size (default 128)")
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adagrad", "rowwise_adagrad"],
                   help="the tables' optimizer (default sgd)")
    p.add_argument("--lr", type=float, default=0.0625, help="learning rate, dense and sparse (default 1/16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data and the dense layers (default 0)")
    p.add_argument("--out", help="save the trained tables here (.npz)")
    args = p.parse_args(argv)
    if args.batch % (args.trainers * args.micro):
        p.error("--batch must be a multiple of --trainers x --micro")
    with ectable.LocalCluster(nodes=5, code="xor", k=4, processes=True) as cluster, \
            tempfile.TemporaryDirectory() as tmp:
        client = cluster.connect()
        for name, rows in ROWS.items():
            client.create_table(name, rows, DIM, optimizer=args.optimizer, lr=args.lr)
        cluster_file, result_file = os.path.join(tmp, "cluster.toml"), os.path.join(tmp, "result.json")
        with open(cluster_file, "w") as f:
            f.write(ectable.config.dumps(cluster.describe()))
        port = _free_port()
        if args.trainers == 1:
            trainer(0, args, cluster_file, port, result_file)
        else:
            mp.spawn(trainer, args=(args, cluster_file, port, result_file), nprocs=args.trainers, join=True)
        with open(result_file) as f:
            result = json.load(f)
        tables = {name: client.get(name, np.arange(rows)) for name, rows in ROWS.items()}
        client.close()
    if args.out:
        np.savez(args.out, **tables)
    losses = result["losses"] or [float("nan")]
    print(f"{args.trainers} trainer(s) x {args.micro} micro-batch(es): {args.steps} steps of {args.batch} in "
          f"{result['seconds']:.2f} s; loss {losses[0]:.4f} -> {losses[-1]:.4f} (trainer 0's slice)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
