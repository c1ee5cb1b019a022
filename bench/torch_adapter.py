"""A DLRM training loop in PyTorch through `ectable.torch`, against the same DLRM on torch's own
`nn.EmbeddingBag`s (the floor: tables in the trainer's memory, no protection).

In one run, `--repeat` rounds of every setting one after the other (the median counts), each on a
cluster of its own with no other running, `--iters` timed iterations after 5 untimed ones, on the same
seeded batches (8 tables, 108,574 rows of dim 16, rowwise Adagrad, batch `--batch`):
- torch: `nn.EmbeddingBag`s and the hand-written rowwise Adagrad of the tests, in process;
- ectable with code "none", and xor(4,1), on 6 node processes, gradients from a `SparseOptimizer`;
- xor(4,1) with `apply_in_backward=True`;
- xor(4,1) through an `ectable.Lookahead` of 8 batches (its final write-back timed too);
- xor(4,1) with node 2 SIGKILLed before the timed iterations (a spare takes over and rebuilds
  while they run).
`--compute-ms` adds a model step that does not use the trainer's CPU (a GPU's) as the embeddings
return, before the dense layers run.
Every run's tables are compared with the torch run's of its round at the end (rowwise Adagrad in
both; the largest difference is reported).

    python -m bench.torch_adapter --iters 100 --repeat 3
"""
from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
import torch

import ectable
from ectable.testing import dlrm as D
from ectable.torch import EmbeddingBagCollection, SparseOptimizer, jagged_ids

from .common import report

ROWS = D.TABLES
DIM, LR = 16, 0.05
SETTINGS = [("torch", None, {}), ("ectable none", ("none", 4, 0), {}), ("ectable xor(4,1)", ("xor", 4, 1), {}),
            ("ectable xor(4,1), apply_in_backward", ("xor", 4, 1), {"apply_in_backward": True}),
            ("ectable xor(4,1), lookahead 8", ("xor", 4, 1), {"lookahead": 8})]
KILLED = "ectable xor(4,1), node 2 killed"
WARMUP = 5  # untimed iterations first


class Run:
    """One setting's model, optimizers and (for ectable) cluster."""

    def __init__(self, name, code, options, weights=None, batches=()):
        self.name, self.cluster, self.lookahead = name, None, None
        if code is None:
            self.net = D.model(D.LocalBags(weights), list(ROWS), DIM)
            self.sparse = D.RowwiseAdagrad(list(self.net.embeddings.parameters()), lr=LR, eps=1e-8)
        else:
            name_, k, r = code
            self.cluster = ectable.LocalCluster(nodes=6, code=name_, k=k, r=r, spares=1, processes=True)
            self.client = self.cluster.connect()
            for table, rows in ROWS.items():
                self.client.create_table(table, rows, DIM, optimizer="rowwise_adagrad", lr=LR, eps=1e-8)
            options = dict(options)
            if "lookahead" in options:
                self.lookahead = ectable.Lookahead(self.client, batches, lookahead=options.pop("lookahead"),
                                                   ids=lambda batch: jagged_ids(batch[1]))
            self.net = D.model(EmbeddingBagCollection(self.lookahead or self.client, list(ROWS), **options),
                               list(ROWS), DIM)
            self.sparse = None if options.get("apply_in_backward") else SparseOptimizer(self.net)
        self.dense = torch.optim.SGD([p for n, p in self.net.named_parameters() if not n.startswith("embeddings")],
                                     lr=LR)

    def train(self, batches, compute: float, last: bool = True) -> float:
        """Seconds for `batches` (the next ones of a lookahead, which the `last` call closes), with a model
        step of `compute` seconds off the trainer's CPU as the embeddings return (where a GPU computes the
        dense forward and backward passes)."""
        hook = self.net.embeddings.register_forward_hook(lambda *_: time.sleep(compute)) if compute else None
        start = time.perf_counter()
        feed = batches if self.lookahead is None else itertools.islice(self.lookahead, len(batches))
        for x, features, y in feed:
            D.train_step(self.net, self.dense, self.sparse, x, features, y)
        if self.lookahead is not None and last:
            self.lookahead.close()  # every update written back
        seconds = time.perf_counter() - start
        if hook is not None:
            hook.remove()
        return seconds

    def tables(self) -> dict:
        if self.cluster is None:
            return {t: self.net.embeddings.bags[t].weight.detach().numpy() for t in ROWS}
        return {t: self.client.get(t, np.arange(n)) for t, n in ROWS.items()}

    def close(self) -> None:
        if self.lookahead is not None:
            self.lookahead.close()
        if self.cluster is not None:
            self.client.close()
            self.cluster.close()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=100, help="timed iterations per repeat (default 100)")
    p.add_argument("--repeat", type=int, default=3, help="rounds of every setting (default 3)")
    p.add_argument("--batch", type=int, default=256, help="batch size (default 256)")
    p.add_argument("--compute-ms", type=float, default=0.0, help="a model step off the trainer's CPU (default 0)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    compute = args.compute_ms / 1000
    batches = list(D.batches(0, WARMUP + args.iters, args.batch, ROWS))
    settings = SETTINGS + [(KILLED, ("xor", 4, 1), {})]
    seconds = {name: [] for name, _, _ in settings}
    gaps = {name: 0.0 for name in seconds}
    with ectable.LocalCluster(nodes=6, code="none", k=4, r=0, processes=False) as cluster:
        client = cluster.connect()
        for table, rows in ROWS.items():  # the tables every cluster starts from (same seeds)
            client.create_table(table, rows, DIM, optimizer="rowwise_adagrad", lr=LR, eps=1e-8)
        weights = {t: client.get(t, np.arange(n)) for t, n in ROWS.items()}
    for _ in range(args.repeat):  # rounds of every setting, each on a cluster of its own (no other running)
        reference = None
        for name, code, options in settings:
            run = Run(name, code, options, weights, batches)
            try:
                run.train(batches[:WARMUP], compute, last=False)
                if name == KILLED:
                    run.cluster.kill(2)  # a spare takes over and rebuilds while the timed iterations run
                seconds[name].append(run.train(batches[WARMUP:], compute))
                tables = run.tables()
            finally:
                run.close()
            reference = reference or tables
            gaps[name] = max(gaps[name], *(float(np.abs(tables[t] - reference[t]).max()) for t in ROWS))
    median = {name: float(np.median([args.iters / s for s in secs])) for name, secs in seconds.items()}
    rows = [[name, round(median[name], 2), round(median[name] / median["torch"], 3),
             round(median[name] / median["ectable none"], 3) if name != "torch" else "", f"{gaps[name]:.2g}"]
            for name in seconds]
    report("torch_adapter" + (f"_{args.compute_ms:g}ms" if args.compute_ms else ""), ["setting", "iterations/s", "vs torch", "vs ectable none", "largest table difference"],
           rows, {"iters": args.iters, "repeat": args.repeat, "batch": args.batch, "compute_ms": args.compute_ms,
                  "seconds": seconds})


if __name__ == "__main__":
    main()
