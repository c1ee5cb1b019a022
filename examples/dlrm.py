"""Train a DLRM whose embedding tables live in an ectable cluster, beside the same DLRM on torch's
own `nn.EmbeddingBag`s, and compare them step by step.

The cluster is xor(4,1) on 5 node processes and a spare. With `--kill-at N`, node 2 is SIGKILLed
before step N: training goes on, the spare takes its place, and the loss curve stays that of the
torch run (to float32 rounding). With `--lookahead L`, the ectable run reads its batches through an
`ectable.Lookahead` (rows of the next L batches prefetched, rows reused within them cached on the
trainer), which changes no bit of it. `--plot` draws both curves.

    python examples/dlrm.py --steps 300 --kill-at 100 --plot dlrm.png
    python examples/dlrm.py --steps 300 --lookahead 8
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

import ectable
from ectable.testing import dlrm as D
from ectable.torch import EmbeddingBagCollection, SparseOptimizer, jagged_ids

ROWS = D.TABLES
DIM = 16


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="batches to train on (default 300)")
    p.add_argument("--batch", type=int, default=256, help="batch size (default 256)")
    p.add_argument("--optimizer", default="rowwise_adagrad", choices=["sgd", "adagrad", "rowwise_adagrad"],
                   help="the tables' optimizer; the torch run uses its counterpart (default rowwise_adagrad)")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate, dense and sparse (default 0.05)")
    p.add_argument("--kill-at", type=int, help="SIGKILL node 2 before this step")
    p.add_argument("--apply-in-backward", action="store_true",
                   help="send embedding gradients during backward instead of from a SparseOptimizer")
    p.add_argument("--lookahead", type=int, help="read the ectable run's batches through a Lookahead of this many")
    p.add_argument("--cache-rows", type=int, default=100_000, help="the lookahead's cache, in rows (default 100000)")
    p.add_argument("--plot", help="draw both loss curves into this PNG (needs matplotlib)")
    p.add_argument("--json", help="write the losses and timings here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    with ectable.LocalCluster(nodes=5, code="xor", k=4, spares=1, processes=True) as cluster:
        client = cluster.connect()
        for name, rows in ROWS.items():
            client.create_table(name, rows, DIM, optimizer=args.optimizer, lr=args.lr, eps=1e-8)
        weights = {name: client.get(name, np.arange(rows)) for name, rows in ROWS.items()}
        batches = list(D.batches(0, args.steps, args.batch, ROWS))
        feed = batches
        if args.lookahead is not None:  # the one extra line: the modules and the loop take the lookahead
            feed = ectable.Lookahead(client, batches, lookahead=args.lookahead, cache_rows=args.cache_rows,
                                     ids=lambda batch: jagged_ids(batch[1]))
        ebc = EmbeddingBagCollection(client if feed is batches else feed, list(ROWS),
                                     apply_in_backward=args.apply_in_backward)
        net = D.model(ebc, list(ROWS), DIM)
        ref = D.model(D.LocalBags(weights), list(ROWS), DIM)
        runs = {"ectable": (net, None if args.apply_in_backward else SparseOptimizer(net)),
                "torch": (ref, D.torch_optimizer(args.optimizer, list(ref.embeddings.parameters()), args.lr))}
        dense = {k: torch.optim.SGD([p for n, p in m.named_parameters() if not n.startswith("embeddings")], lr=args.lr)
                 for k, (m, _) in runs.items()}
        losses = {k: [] for k in runs}
        seconds = {k: 0.0 for k in runs}
        for step, (x, features, y) in enumerate(feed):
            if step == args.kill_at:
                cluster.kill(2)
            for k, (model, sparse) in runs.items():
                start = time.perf_counter()
                losses[k].append(D.train_step(model, dense[k], sparse, x, features, y))
                seconds[k] += time.perf_counter() - start
        if feed is not batches:
            print(f"  lookahead {args.lookahead}: {feed.stats['hit_rate']:.1%} of the rows each batch named were "
                  f"cached, {feed.stats['fetched'] / args.steps:.0f} rows fetched per batch")
            feed.close()
        diff = max(np.abs(client.get(t, np.arange(n)) - ref.embeddings.bags[t].weight.detach().numpy()).max()
                   for t, n in ROWS.items())
        client.close()
    gap = max(abs(a - b) for a, b in zip(losses["ectable"], losses["torch"]))
    print(f"{args.steps} steps of {args.batch}, {args.optimizer}"
          + (f", node 2 killed before step {args.kill_at}" if args.kill_at is not None else ""))
    for k in runs:
        print(f"  {k:8s} loss {losses[k][0]:.5f} -> {losses[k][-1]:.5f}   {args.steps / seconds[k]:7.1f} steps/s")
    print(f"  largest loss difference {gap:.2e}, largest table difference {diff:.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "losses": losses, "seconds": seconds, "loss_gap": gap, "table_gap": float(diff)}, f)
    if args.plot:
        _plot(args, losses)
    return 0


def _plot(args, losses) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.5))
    window = 10
    for k, style in (("torch", dict(lw=3, alpha=0.4)), ("ectable", dict(lw=1))):
        smooth = np.convolve(losses[k], np.ones(window) / window, mode="valid")
        ax.plot(np.arange(smooth.size) + window - 1, smooth, label=f"{k} ({'nn.EmbeddingBag' if k == 'torch' else 'xor(4,1), 5 node processes'})", **style)
    if args.kill_at is not None:
        ax.axvline(args.kill_at, color="red", ls="--", lw=1, label=f"node 2 SIGKILLed (step {args.kill_at})")
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss (mean of {window})")
    ax.set_title(f"DLRM, {len(ROWS)} tables, batch {args.batch}, {args.optimizer}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
