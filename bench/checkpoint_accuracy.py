"""Does a quantized checkpoint change what the model learns? Matrix factorisation on MovieLens-100K
(the demo's model: users and items tables of dim 32, rowwise_adagrad), 90% of the ratings to
train on and 10% held out: train `--before` epochs, checkpoint the tables (full; weights at each
bit width, optimizer state exact), restore each into a new cluster, train `--after` more epochs
there, and compare the train and held-out loss with the run that never restored.

    python -m bench.checkpoint_accuracy --before 3 --after 2
"""
from __future__ import annotations

import argparse
import tempfile

import numpy as np

import ectable
from ectable.demo import BATCH, DIM, LR, movielens

from .common import report

SETTINGS = [("fp32", None, False), ("8-bit", 8, False), ("4-bit", 4, False), ("4-bit adaptive", 4, True),
            ("3-bit", 3, False), ("2-bit", 2, False), ("2-bit adaptive", 2, True)]
SHAPE = dict(nodes=5, code="xor", k=4, r=1, processes=False)  # the model does not depend on the transport


def split(users, items, ratings, held: float = 0.1):
    """(train, held-out) triples, shuffled with a fixed seed."""
    order = np.random.default_rng(11).permutation(users.size)
    cut = int(users.size * (1 - held))
    return [(users[o], items[o], ratings[o]) for o in (order[:cut], order[cut:])]


def create(client, users, items) -> None:
    client.create_table("users", num_rows=int(users.max()) + 1, dim=DIM, optimizer="rowwise_adagrad", lr=LR,
                        init="normal", std=0.1, seed=1)
    client.create_table("items", num_rows=int(items.max()) + 1, dim=DIM, optimizer="rowwise_adagrad", lr=LR,
                        init="normal", std=0.1, seed=2)


def train(client, data, epochs: int, first_epoch: int) -> None:
    users, items, ratings = data
    for epoch in range(first_epoch, first_epoch + epochs):
        order = np.random.default_rng(100 + epoch).permutation(users.size)
        for start in range(0, users.size, BATCH):
            b = order[start:start + BATCH]
            rows = client.get_many({"users": users[b], "items": items[b]})
            err = np.einsum("ij,ij->i", rows["users"], rows["items"]) - ratings[b]
            g = (2 * err / err.size)[:, None].astype(np.float32)
            client.apply_gradient_many({"users": (users[b], g * rows["items"]), "items": (items[b], g * rows["users"])})
            client.step()


def loss(client, data) -> float:
    users, items, ratings = data
    rows = client.get_many({"users": users, "items": items})
    return float(np.mean((np.einsum("ij,ij->i", rows["users"], rows["items"]) - ratings) ** 2))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=int, default=3, help="epochs before the checkpoint")
    parser.add_argument("--after", type=int, default=2, help="epochs after the restore")
    args = parser.parse_args()
    *data, source = movielens()
    train_set, held = split(*data)
    out = {}
    with tempfile.TemporaryDirectory(prefix="ectable-bench-acc-") as tmp, ectable.LocalCluster(**SHAPE) as cluster:
        client = cluster.connect()
        create(client, *data[:2])
        train(client, train_set, args.before, 0)
        for name, bits, adaptive in SETTINGS:
            client.checkpoint(f"{tmp}/{name}", policy="full", bits=bits, adaptive=adaptive)
            manifest = client.checkpoint_wait()
            with ectable.LocalCluster(**SHAPE) as other:
                resumed = other.connect()
                resumed.restore(f"{tmp}/{name}")
                restored = (loss(resumed, train_set), loss(resumed, held))
                train(resumed, train_set, args.after, args.before)
                out[name] = {"bytes": sum(p["bytes"] for p in manifest["pieces"]), "at_restore": restored,
                             "final": (loss(resumed, train_set), loss(resumed, held))}
        train(client, train_set, args.after, args.before)
        never = (loss(client, train_set), loss(client, held))
    rows = [["never restored", "-", round(never[0], 5), round(never[1], 5), 0.0, 0.0]]
    for name, r in out.items():
        moved = [100 * (r["final"][i] / never[i] - 1) for i in (0, 1)]
        rows.append([name, r["bytes"], round(r["final"][0], 5), round(r["final"][1], 5), round(moved[0], 4),
                     round(moved[1], 4)])
    within = [name for name, r in out.items() if all(abs(r["final"][i] / never[i] - 1) <= 0.001 for i in (0, 1))]
    print(f"\n{source}: {train_set[0].size:,} ratings to train on, {held[0].size:,} held out; checkpoint after "
          f"{args.before} epochs, {args.after} more after the restore")
    report("checkpoint_accuracy", ["checkpoint", "bytes", "train MSE", "held-out MSE", "train moved %",
                                   "held-out moved %"], rows,
           {"results": out, "never_restored": never, "within_0.1%": within, "before": args.before,
            "after": args.after, "source": source})
    print(f"within 0.1% of the run that never restored: {within}")


if __name__ == "__main__":
    main()
