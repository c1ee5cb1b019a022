"""`make demo`: train a matrix-factorisation model on an embedded cluster, kill a node half way,
keep training, and prove every row equals a failure-free run of the same batches, bit for bit."""
from __future__ import annotations

import time

import numpy as np

import ectable
from ectable.testing import read_records

USERS, ITEMS, DIM, EPOCHS, BATCH = 2000, 3000, 16, 6, 1024


def ratings(seed=0):
    """A synthetic, low-rank ratings set with Zipf-skewed item popularity."""
    rng = np.random.default_rng(seed)
    u, v = rng.normal(size=(USERS, 4)), rng.normal(size=(ITEMS, 4))
    users = rng.integers(0, USERS, 60_000)
    items = (rng.zipf(1.2, 60_000) - 1) % ITEMS
    r = np.einsum("ij,ij->i", u[users], v[items]) / 2 + rng.normal(scale=0.1, size=users.size)
    return users, items, r.astype(np.float32)


def train(cluster, kill_at=None, log=print):
    client = cluster.connect()
    client.create_table("users", num_rows=USERS, dim=DIM, optimizer="rowwise_adagrad", lr=0.1, seed=1)
    client.create_table("items", num_rows=ITEMS, dim=DIM, optimizer="rowwise_adagrad", lr=0.1, seed=2)
    users, items, r = ratings()
    batches = [slice(s, s + BATCH) for s in range(0, users.size, BATCH)]
    step, rebuilding = 0, False
    for epoch in range(EPOCHS):
        losses, start = [], time.perf_counter()
        for b in batches:
            if step == kill_at:
                pid = cluster.node_pids()[2]
                cluster.kill(2)
                log(f"  !! step {step}: node 2 (pid {pid}) SIGKILLed; training goes on")
            u, i = users[b], items[b]
            rows = client.get_many({"users": u, "items": i})
            err = np.einsum("ij,ij->i", rows["users"], rows["items"]) - r[b]
            losses.append(float(np.mean(err * err)))
            g = (2 * err / err.size)[:, None].astype(np.float32)
            client.apply_gradient_many({"users": (u, g * rows["items"]), "items": (i, g * rows["users"])})
            client.step()
            if step == kill_at or rebuilding:
                rebuilding = bool(client.status()["recovery"]["rebuilding"])
                if not rebuilding:
                    log(f"  .. step {step}: the spare finished rebuilding node 2's shard, {step - kill_at} steps after the kill")
            step += 1
        st = client.status()
        log(f"  epoch {epoch + 1}/{EPOCHS}  loss {np.mean(losses):.4f}  {len(batches) / (time.perf_counter() - start):6.0f} it/s"
            f"  degraded {st['degraded'] or '-'}  rebuilding {st['recovery']['rebuilding'] or '-'}"
            f"  rows left {st['recovery']['rows_left']}")
    client.flush()
    return client, step


def main():
    print("ectable demo: matrix factorisation, users and items tables, xor(4,1) on 5 node processes + 1 spare, "
          "rowwise_adagrad")
    print("failure-free reference run:")
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=1, processes=True) as ref:
        ref_client, steps = train(ref)
        expect = {t: read_records(ref_client, t, np.arange(n)) for t, n in (("users", USERS), ("items", ITEMS))}
    print(f"run with node 2 killed at step {steps // 2}:")
    # small rebuild rounds and a small share of the spare's time: the rebuild spreads over many steps, to show it
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=1, processes=True,
                              rebuild_batch=256, rebuild_share=0.05) as cluster:
        client, _ = train(cluster, kill_at=steps // 2)
        start = time.perf_counter()
        client.wait_recovered(timeout=120)
        print(f"  rebuild finished {time.perf_counter() - start:.2f} s after training ended; status: {client.status()['recovery']}")
        same = all(np.array_equal(read_records(client, t, np.arange(len(expect[t]))), expect[t]) for t in expect)
        from ectable.testing import check_parity
        check_parity(cluster, client)
    rows = USERS + ITEMS
    print(f"every one of {rows} rows (weights and optimizer state) equals the failure-free run: {same}")
    print("parity equals a fresh encode of the data: True")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
