"""A trainer process that checks every row it reads: for tests on separate hosts (`host_cluster`).

It reads the whole table once, then until the stop file exists: reads a random batch and
compares it with what it last wrote there (a stale or lost row is counted, never tolerated),
writes new rows, and takes a `step()`. A request that fails is logged with its error and the
time it took; rows a failed write may or may not have changed are not checked again until they
are written again. At the end it reads the whole table once more. Every event is one JSON line
on `--out`; the last is {"final": {...}}.

    python -m ectable.testing.trainer --config client-0.toml --table t0 --out t0.jsonl --stop STOP
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from .. import Error, connect


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the client's cluster TOML")
    parser.add_argument("--table", required=True, help="a table of this trainer's own")
    parser.add_argument("--rows", type=int, default=20_000, help="rows in the table")
    parser.add_argument("--dim", type=int, default=8, help="row width")
    parser.add_argument("--batch", type=int, default=256, help="rows read and written per step")
    parser.add_argument("--pace", type=float, default=0.02, help="seconds between steps (the model's step)")
    parser.add_argument("--seed", type=int, default=0, help="of the batches and rows it writes")
    parser.add_argument("--stop", required=True, help="the trainer finishes once this file exists")
    parser.add_argument("--out", required=True, help="JSON lines: steps, errors, and the final check")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    with open(args.out, "a", buffering=1) as out:
        def log(**event) -> None:
            out.write(json.dumps({"t": time.time(), **event}) + "\n")

        client = connect(args.config)
        try:
            client.create_table(args.table, num_rows=args.rows, dim=args.dim)  # (any trainer may continue it)
            model = client.get(args.table, np.arange(args.rows))
            known = np.ones(args.rows, dtype=bool)  # rows whose stored value this trainer knows
            counts = {"steps": 0, "stale": 0, "errors": 0}
            log(started=True)
            while not os.path.exists(args.stop):
                ids = rng.choice(args.rows, args.batch, replace=False)
                rows = rng.standard_normal((args.batch, args.dim)).astype(np.float32)
                began, stage = time.monotonic(), "get"
                try:
                    got = client.get(args.table, ids)
                    wrong = known[ids] & (got != model[ids]).any(axis=1)
                    if wrong.any():
                        counts["stale"] += int(wrong.sum())
                        log(stale=ids[wrong][:10].tolist(), step=counts["steps"])
                    stage = "put"
                    client.put(args.table, ids, rows)
                    model[ids], known[ids] = rows, True
                    client.step()
                    counts["steps"] += 1
                    log(step=counts["steps"])
                except Error as exc:
                    if stage == "put":
                        known[ids] = False  # applied on some nodes, maybe: unknown until written again
                    counts["errors"] += 1
                    log(error=type(exc).__name__, message=str(exc), stage=stage,
                        seconds=round(time.monotonic() - began, 2))
                    time.sleep(0.2)
                time.sleep(args.pace)
            client.flush()
            final = client.get(args.table, np.arange(args.rows))
            lost = int((known & (final != model).any(axis=1)).sum())
            log(final={**counts, "lost": lost, "unknown": int((~known).sum())})
        finally:
            client.close()


if __name__ == "__main__":
    main()
