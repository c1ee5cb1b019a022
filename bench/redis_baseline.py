"""The store a user would reach for instead: Redis, against ectable, on the same training loop.

Each iteration gets a batch's rows and writes them back after a row-wise Adagrad step, the
same work as `bench.train_loop`. Redis (Debian's `redis-server`, started here on 127.0.0.1
and stopped at the end) keeps one key per row whose value is the row's record (weights and
optimizer state, float32 bytes); the client reads with pipelined MGET and writes with
pipelined MSET through redis-py, and does the optimizer step itself. Redis runs with
persistence off, then with AOF `everysec`. ectable runs none and xor(4,1) on node processes.
All in one run; ratios are ectable over Redis.

    python -m bench.redis_baseline [--rows 1000000] [--iters 20]
"""
from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import tempfile
import time

import numpy as np

from .common import report
from .train_loop import DIM, WARMUP, cluster_loop, rowwise_adagrad, training_work

CHUNK = 10_000  # keys per MGET / MSET command


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """A redis-server on 127.0.0.1 for the length of a `with` block."""

    def __init__(self, *options: str):
        if shutil.which("redis-server") is None:
            raise SystemExit("redis-server is not installed (Debian: apt-get install redis-server)")
        self.dir = tempfile.mkdtemp(prefix="ectable-redis-")
        self.port = free_port()
        self.proc = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(self.port),
                                      "--dir", self.dir, "--save", "", *options],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def __enter__(self):
        import redis
        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client.ping()
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def __exit__(self, *exc):
        self.client.close()
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def _mget(r, keys):
    pipe = r.pipeline(transaction=False)
    for lo in range(0, len(keys), CHUNK):
        pipe.mget(keys[lo:lo + CHUNK])
    return [v for part in pipe.execute() for v in part]


def _mset(r, keys, records):
    pipe = r.pipeline(transaction=False)
    for lo in range(0, len(keys), CHUNK):
        pipe.mset({k: records[i].tobytes() for i, k in enumerate(keys[lo:lo + CHUNK], lo)})
    pipe.execute()


def redis_loop(rows: int, work, *options: str) -> float:
    """Seconds for the timed iterations of `work` against Redis with `options`."""
    with Redis(*options) as store:
        r = store.client
        zero = np.zeros((CHUNK, DIM + 1), dtype=np.float32)
        for lo in range(0, rows, CHUNK):  # every row, initialised to zeros like the ectable runs
            _mset(r, [f"t:{i}" for i in range(lo, min(rows, lo + CHUNK))], zero)
        start = 0.0
        for n, (ids, grads) in enumerate(work):
            if n == WARMUP:
                start = time.perf_counter()
            uniq, inv = np.unique(ids, return_inverse=True)
            keys = [f"t:{i}" for i in uniq.tolist()]
            rec = np.frombuffer(b"".join(_mget(r, keys)), dtype=np.float32).reshape(-1, DIM + 1).copy()
            rec[:, :DIM][inv]  # the get the model needs
            summed = np.zeros((uniq.size, DIM), dtype=np.float32)
            np.add.at(summed, inv.reshape(-1), grads)
            rowwise_adagrad(rec, summed)
            _mset(r, keys, rec)
        return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--batch", type=int, default=20_000, help="ids per batch (before dedup)")
    args = parser.parse_args()
    work = training_work(args.rows, args.iters, args.batch)
    total = sum(ids.size for ids, _ in work[WARMUP:])
    secs = {
        "redis (no persistence)": redis_loop(args.rows, work, "--appendonly", "no"),
        "redis (AOF everysec)": redis_loop(args.rows, work, "--appendonly", "yes", "--appendfsync", "everysec"),
        "ectable none": cluster_loop(args.rows, work, "none", 4, 0, True),
        "ectable xor(4,1)": cluster_loop(args.rows, work, "xor", 4, 1, True),
    }
    base = secs["redis (no persistence)"]
    out = [[name, round(total / s), round(base / s, 2)] for name, s in secs.items()]
    print(f"{args.iters} batches of {args.batch} ids, {args.rows} rows, dim {DIM}, rowwise_adagrad, no model step")
    report("redis_baseline", ["store", "ids/s", "vs redis"], out, {"seconds": secs, "rows": args.rows})


if __name__ == "__main__":
    main()
