"""Where the trainer's time goes: each part of the client's work, per iteration.

Runs the training loop (get_many, apply_gradient_many, step; no model step) against xor(4,1) on 6
node processes under cProfile, and sums each category's functions (cumulative time; cProfile's own
overhead is in the figures). `--repeat` runs; each is a column. Then, in process, the client's work on a
batch's gradients (checks, unique ids, sums) with the ids' unique ids taken from the read of the same batch
and computed again, interleaved in one run.

    python -m bench.client_time --workload criteo --scale 0.1
"""
from __future__ import annotations

import cProfile
import pstats
import time

import numpy as np

import ectable

from .common import report
from .train_loop import create_tables, iteration
from .workloads import WORKLOADS, profile_args

WARMUP = 5
# category: (file, function, the caller it is counted under, or None for every caller)
PARTS = {
    "waiting for the nodes (poll)": ("zmq/sugar/poll.py", "poll", None),
    "summing duplicate gradients": ("protocol/validate.py", "coalesce", None),
    "unique ids of the reads": ("_arraysetops_impl.py", "unique", "get_many"),
    "expanding rows to the batch": ("client/client.py", "<dictcomp>", "get_many"),
    "encoding messages": ("transport/codec.py", "encode", None),
    "sending them": ("zmq/sugar/socket.py", "send_multipart", None),
    "decoding replies": ("transport/codec.py", "decode", None),
    "routing rows to nodes": ("client/client.py", "_parts", None),
}


def profiled(work) -> dict:
    """{category: ms per iteration}, with the wall time and the trainer's CPU time, over the timed batches."""
    with ectable.LocalCluster(nodes=6, code="xor", k=4, r=1, processes=True) as cluster:
        client = cluster.connect()
        create_tables(client, work)
        for batch in work.batches[:WARMUP]:
            iteration(client, work, batch, 0.0)
        profile = cProfile.Profile()
        cpu, wall = time.process_time(), time.perf_counter()
        profile.enable()
        for batch in work.batches[WARMUP:]:
            iteration(client, work, batch, 0.0)
        profile.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    stats = pstats.Stats(profile).stats  # (file, line, function) -> (calls, calls, own, cumulative, callers)
    n = len(work.batches) - WARMUP
    out = {"wall time": wall, "trainer CPU": cpu}
    for part, (where, name, caller) in PARTS.items():
        out[part] = sum(v[3] if caller is None else sum(c[3] for key, c in v[4].items() if key[2] == caller)
                        for (f, _, fn), v in stats.items() if where in f and fn == name)
    return {part: seconds / n * 1e3 for part, seconds in out.items()}


def gradient_work(work) -> dict:
    """{"reused" | "computed": median ms per iteration} of the client's work on each batch's gradients, the
    batch read first, its unique ids then taken from the read or computed again (alternating which goes first)."""
    spent = {"reused": [], "computed": []}
    with ectable.LocalCluster(nodes=6, code="none", k=4, r=0, processes=False) as cluster:
        client = cluster.connect()
        create_tables(client, work)
        for n, batch in enumerate(work.batches):
            client.get_many(batch)
            grads, read = work.gradients(batch), dict(client._read_ids)
            for mode in ("reused", "computed") if n % 2 else ("computed", "reused"):
                client._read_ids = read if mode == "reused" else {}
                start = time.thread_time()
                for table, (ids, values) in grads.items():
                    client._gradients(table, ids, values)
                if n >= WARMUP:
                    spent[mode].append(time.thread_time() - start)
    return {mode: float(np.median(times)) * 1e3 for mode, times in spent.items()}


def main():
    args = profile_args(__doc__.splitlines()[0])
    work = WORKLOADS[args.workload](args.iters + WARMUP, args.scale)
    runs = [profiled(work) for _ in range(args.repeat)]
    print(f"\n{work.describe()}; xor(4,1) on 6 node processes, no model step, ms per iteration (cProfile)")
    report(f"client_time_{args.workload}", ["part", *(f"run {i + 1}" for i in range(args.repeat))],
           [[part, *(round(run[part], 1) for run in runs)] for part in runs[0]])
    grads = gradient_work(work)
    print("\nthe client's work on a batch's gradients, in process, ms per iteration (median)")
    report(f"client_gradients_{args.workload}", ["unique ids", "ms", "vs computed"],
           [[mode, round(ms, 2), round(ms / grads["computed"], 3)] for mode, ms in grads.items()])


if __name__ == "__main__":
    main()
