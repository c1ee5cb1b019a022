"""A Redis-style kill loop: write, SIGKILL a node at a random moment, read everything, rebuild, read again.

Every round compares every record (weights and optimizer state) of every table with a
failure-free in-process run of the same requests, bit for bit, once degraded and once
after the rebuild, and checks parity against a fresh encode. The killed node's process
is replaced by a new spare for the next round. With r >= 2 half the rounds (`--double SHARE`) kill a second
node one batch after the first, while its spare is still rebuilding. With `--drains SHARE`
that share of the rounds drains the first node (`LocalCluster.drain`: its position handed to
a spare, no kill) instead of killing it. With `--adds SHARE` that share of the rounds first adds a node
(`LocalCluster.add_node`: the cluster laid out again over one more position, mid-window), then kills
(or drains) a node of the new layout, up to four nodes more than it began with. With `--trace DIR` every
process logs its changes to rows (`process/trace.py`) and the loop stops at the first round that reads a row
wrong, telling what touched each wrong row, and when, against the reference's value after each batch. With
`--writers N` the rows are written by N clients, each through a cluster map of its own (as trainers on other
machines would be), at once: writer w takes the rows whose id is w modulo N, so that they share every stripe and no
row, and the reference (which applies every batch whole) is the same whatever their order. Every writer flushes
before a round reads (a writer's last writes to a dead node are replayed when it fails that node over).

    python -m ectable.testing.kill_loop --rounds 50 --code rs --drains 0.3 --adds 0.1 --log kill_loop.log
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import numpy as np

from ..client import Client
from ..cluster.maps import RemoteCluster
from ..process import trace as tracing
from ..process.local import LocalCluster
from .checks import check_parity, read_records

TABLES = {"users": (6_000, 16, "rowwise_adagrad"), "items": (20_000, 8, "adagrad")}
MOMENTS = ("mid-window", "deltas in flight", "after flush")


def _requests(rng, batches):
    """Random writes: apply_gradient_many with skewed ids, and some puts."""
    for _ in range(batches):
        batch = {}
        for name, (rows, dim, _) in TABLES.items():
            ids = (rng.pareto(1.2, 600) * rows / 50).astype(np.int64) % rows
            batch[name] = ("grad", ids, rng.standard_normal((ids.size, dim)).astype(np.float32))
        if rng.random() < 0.3:
            rows, dim, _ = TABLES["users"]
            ids = rng.choice(rows, 50, replace=False)
            batch["users"] = ("put", ids, rng.standard_normal((ids.size, dim)).astype(np.float32))
        yield batch


def _apply(client, batch) -> None:
    grads = {name: (ids, values) for name, (kind, ids, values) in batch.items() if kind == "grad"}
    client.apply_gradient_many(grads)
    for name, (kind, ids, values) in batch.items():
        if kind == "put":
            client.put(name, ids, values)


def _part(batch, w: int, writers: int) -> dict:
    """Writer w's part of `batch`: the rows whose id is w modulo `writers`, in their order."""
    if writers == 1:
        return batch
    out = {}
    for name, (kind, ids, values) in batch.items():
        mine = ids % writers == w
        out[name] = (kind, ids[mine], values[mine])
    return out


def _each(clients: list, act) -> None:
    """act(client, w) for every writer at once, the first in this thread (the one that reads); the first error is
    raised."""
    with ThreadPoolExecutor(max(1, len(clients) - 1)) as pool:
        others = [pool.submit(act, c, w) for w, c in enumerate(clients) if w]
        act(clients[0], 0)
        for done in others:
            done.result(timeout=300)  # (a client call gives up on its own deadline first)


def _records(client) -> dict:
    return {name: read_records(client, name, np.arange(rows)) for name, (rows, _, _) in TABLES.items()}


def _lost(client, reference, got: dict | None = None) -> int:
    """Rows whose whole record differs from the failure-free run (`got`: filled with the records read)."""
    read = _records(client)
    if got is not None:
        got.update(read)
    want = _records(reference)
    return sum(int((read[name] != want[name]).any(axis=1).sum()) for name in TABLES)


def _explain(directory: str, client, ignore: set, refs: list, got: dict, log) -> None:
    """What the traces in `directory` say touched each row read wrong (at most 6 per table), each record compared
    with the reference's after each batch (`refs`; 0: before the round); `ignore`: the reference's nodes."""
    evs = tracing.events(directory)
    t0 = evs[0]["t"] if evs else 0.0

    def batches(name, row, record):
        return [j for j, ref in enumerate(refs) if (ref[name][row] == record).all()] or "none"
    for e in evs:
        if e["kind"] in ("batch", "kill"):
            log("  " + tracing.describe(e, None, t0))
    for name in TABLES:
        layout = client._table(name)[1]
        wrong = np.flatnonzero((got[name] != refs[-1][name]).any(axis=1))
        for row in wrong[:6].tolist():
            stripe = layout.stripe(np.array([row]))
            slots = [int(layout.slot_node(stripe, t)[0]) for t in range(layout.width)]
            log(f"  {name} row {row}: data on node {int(layout.data_node(np.array([row]))[0])}, stripe {int(stripe[0])} "
                f"on nodes {slots} (data, then parity); read as the reference after batch {batches(name, row, got[name][row])}")
            for e, hit in tracing.history(evs, name, [row], layout):
                if e.get("node") in ignore:
                    continue
                line = tracing.describe(e, hit, t0)
                if e["kind"] in ("apply", "restore"):
                    line += f"; the reference after batch {batches(name, row, e['records'][hit][0])}"
                log("    " + line)


def _state(cluster) -> str:
    """The stored map and every node's presence, for a failed round's log."""
    m, presence = cluster.store.read_map(), cluster.store.presence()
    return (f"map epoch {m.epoch}: states {list(m.states)}, endpoints {list(m.endpoints)}, sources {list(m.sources)}, "
            f"fenced {list(m.fenced)}, failing {list(m.failing)}; presence {presence}")


def run(rounds: int, code: str = "xor", seed: int = 0, log=print, drains: float = 0.0, adds: float = 0.0,
        double: float = 0.5, trace: str | None = None, writers: int = 1) -> dict:
    """Run the loop; returns {"rounds", "kills", "drains", "adds", "lost"} (lost: rows that differed, summed over
    checks). `drains`: the share of rounds whose first node is drained, not killed; `adds`: of rounds that add a
    node first; `double`: of rounds that kill a second node (with r >= 2); `trace`: a directory for the processes'
    traces (AssertionError at the first round that reads a row wrong, after telling its history); `writers`: clients
    that write at once, each its own rows."""
    if trace:
        os.makedirs(trace, exist_ok=True)
        os.environ[tracing.ENV] = trace  # the node processes inherit it
        tracing.install()
    k, r = (4, 1) if code == "xor" else (3, 2)
    rng = np.random.default_rng(seed)
    draws = np.random.default_rng(seed + 1)  # a stream of its own: without drains the rounds run as before
    grows = np.random.default_rng(seed + 2)  # and adds one of their own
    kills = drained = added = lost = 0
    started = time.perf_counter()
    with LocalCluster(nodes=k + r + 1, code=code, k=k, r=r, spares=r, window_rows=4096) as cluster, \
            LocalCluster(nodes=1, code="none", k=1, r=0, processes=False) as ref_cluster, ExitStack() as opened:
        client, reference = cluster.connect(), ref_cluster.connect()
        for name, (rows, dim, optimizer) in TABLES.items():
            for c in (client, reference):
                c.create_table(name, num_rows=rows, dim=dim, optimizer=optimizer, lr=0.05, init="uniform", seed=1)
        others = [opened.enter_context(Client(RemoteCluster(cluster.membership))) for _ in range(writers - 1)]
        for c in others:
            c.owns_cluster = True  # closing it closes its map
        clients = [client] + others
        for n in range(1, rounds + 1):
            moment = MOMENTS[rng.integers(len(MOMENTS))]
            second = r >= 2 and rng.random() < double  # a second node dies during the first one's rebuild
            batches = list(_requests(rng, int(rng.integers(3, 9))))
            at = int(rng.integers(len(batches) - 1))
            drain = draws.random() < drains
            add = grows.random() < adds and cluster.config.nodes < k + r + 5
            notes, grew = [], ""
            if trace:
                tracing.clear(trace)
                refs = [_records(reference)]  # the reference before the round, then after each batch
            for i, batch in enumerate(batches):
                tracing.record("batch", round=n, batch=i)
                if i == at or (i == at + 1 and second):
                    if i == at and moment == "deltas in flight":
                        client.step()
                    elif i == at and moment == "after flush":
                        client.flush()
                    if i == at and add:
                        grew = f"added node {cluster.add_node()} ({cluster.config.nodes} nodes now), then "
                        added += 1
                    victim = int(rng.choice([p for p in range(cluster.config.nodes) if cluster.state(p) == "up"]))
                    rebuilding = [p for p in range(cluster.config.nodes) if cluster.state(p) == "rebuilding"]
                    notes.append(f"{'drained' if drain and i == at else 'SIGKILLed'} node {victim} "
                                 f"(pid {cluster.node_pids()[victim]})"
                                 + (f" while node {rebuilding} rebuilt" if rebuilding else ""))
                    tracing.record("kill", node=victim, note=notes[-1])
                    if drain and i == at:
                        cluster.drain(victim)
                        drained += 1
                    else:
                        cluster.kill(victim)
                        kills += 1
                _apply(reference, batch)

                def write(c, w, batch=batch, step=i != at or moment != "mid-window"):
                    _apply(c, _part(batch, w, writers))
                    if step:
                        c.step()
                _each(clients, write)
                if trace:
                    refs.append(_records(reference))
            got: dict = {}

            def explained(wrong: int, read: str) -> None:
                if trace and wrong:
                    log(f"round {n}: {' then '.join(notes)}, {moment} at batch {at + 1}/{len(batches)}; {read} of all "
                        f"rows: {wrong} lost; the traces ({trace}) say:")
                    _explain(trace, client, set(ref_cluster.store.read_map().sources), refs, got, log)
                    raise AssertionError(f"round {n}: {wrong} rows read wrong")
            for c in others:  # each fails the dead nodes over: its writes they lost are replayed
                c.flush()
            bad = _lost(client, reference, got)
            explained(bad, "degraded read")
            t0 = time.perf_counter()
            try:
                client.wait_recovered(timeout=120)
            except Exception:
                log(f"round {n}: not recovered; {_state(cluster)}")
                raise
            rebuilt = time.perf_counter() - t0
            after = _lost(client, reference, got)
            explained(after, "read after the rebuild")
            for c in clients:
                c.flush()
            try:
                check_parity(cluster, client)
            except AssertionError:  # what the round did, and where the cluster stands, before the error
                log(f"round {n}: parity check failed: {' then '.join(notes)}, {moment} at batch {at + 1}/"
                    f"{len(batches)}; degraded read of all rows: {bad} lost; read again: {after} lost; {_state(cluster)}")
                raise
            lost += bad + after
            for _ in notes:
                cluster.add_spare()
            log(f"round {n}: {grew}{' then '.join(notes)}, {moment} at batch {at + 1}/{len(batches)}; "
                f"degraded read of all rows: {bad} lost; rebuilt {rebuilt:.2f} s later, parity exact; "
                f"read again: {after} lost")
        client.wait_recovered(timeout=120)
        for c in clients:
            c.flush()
        check_parity(cluster, client)
        lost += _lost(client, reference)
    log(f"kill loop ({code}): {rounds} rounds, {kills} kills (SIGKILL), {drained} drains, {added} adds, {lost} lost, "
        f"{time.perf_counter() - started:.0f} s")
    return {"rounds": rounds, "kills": kills, "drains": drained, "adds": added, "lost": lost}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--code", default="xor", choices=["xor", "rs"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--drains", type=float, default=0.0, help="share of rounds that drain a node, not kill it")
    parser.add_argument("--adds", type=float, default=0.0, help="share of rounds that add a node first")
    parser.add_argument("--double", type=float, default=0.5,
                        help="share of rounds that kill a second node while the first one's spare rebuilds (r >= 2)")
    parser.add_argument("--writers", type=int, default=1, help="clients writing at once, each its own rows")
    parser.add_argument("--log", help="also append the log to this file")
    parser.add_argument("--trace", help="a directory for every process's trace of its changes to rows; stop at the "
                        "first round that reads a row wrong and tell its history")
    args = parser.parse_args(argv)
    out = open(args.log, "a") if args.log else None

    def log(line):
        print(line, flush=True)
        if out:
            print(line, file=out, flush=True)
    result = run(args.rounds, args.code, args.seed, log, args.drains, args.adds, args.double, args.trace, args.writers)
    sys.exit(0 if result["lost"] == 0 else 1)


if __name__ == "__main__":
    main()
