"""Where the trainer's time goes: each part of the client's work, per iteration.

Runs the training loop (get_many, apply_gradient_many, step; no model step) against xor(4,1) on 6
node processes under cProfile, and sums each category's functions (cumulative time; cProfile's own
overhead is in the figures). `--repeat` runs; each is a column.

    python -m bench.client_time --workload criteo --scale 0.1
"""
from __future__ import annotations

import cProfile
import pstats
import time

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


def main():
    args = profile_args(__doc__.splitlines()[0])
    work = WORKLOADS[args.workload](args.iters + WARMUP, args.scale)
    runs = [profiled(work) for _ in range(args.repeat)]
    print(f"\n{work.describe()}; xor(4,1) on 6 node processes, no model step, ms per iteration (cProfile)")
    report(f"client_time_{args.workload}", ["part", *(f"run {i + 1}" for i in range(args.repeat))],
           [[part, *(round(run[part], 1) for run in runs)] for part in runs[0]])


if __name__ == "__main__":
    main()
