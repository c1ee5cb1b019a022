"""The store a user would reach for instead: Redis, against ectable, on the same training loop.

Each iteration gets a batch's rows and writes them back after a row-wise Adagrad step, the
same work as `bench.train_loop` on the same workloads. Redis (Debian's `redis-server`, started here on 127.0.0.1
and stopped at the end) keeps one key per row whose value is the row's record (weights and
optimizer state, float32 bytes); the client reads with pipelined MGET and writes with
pipelined MSET through redis-py with its C reply parser (hiredis, in the bench extra), and does the
optimizer step itself. Redis runs with
persistence off, then with AOF `everysec`. ectable runs none, xor(4,1) and rs(4,2) on 6 node processes.
All in one run; ratios are ectable over Redis.

    python -m bench.redis_baseline [--workload criteo zipf] [--scale 0.1] [--iters 20]
"""
from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import tempfile
import time

import numpy as np

from ectable.protocol.validate import sum_rows

from .common import report
from .train_loop import WARMUP, cluster_loop, rowwise_adagrad
from .workloads import DIM, WORKLOADS, Workload

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


def redis_loop(work: Workload, *options: str) -> float:
    """Seconds for the timed iterations of `work` against Redis with `options`."""
    with Redis(*options) as store:
        r = store.client
        zero = np.zeros((CHUNK, DIM + 1), dtype=np.float32)
        for t, rows in work.sizes.items():  # every row, initialised to zeros like the ectable runs
            for lo in range(0, rows, CHUNK):
                _mset(r, [f"{t}:{i}" for i in range(lo, min(rows, lo + CHUNK))], zero)
        start = 0.0
        for n, batch in enumerate(work.batches):
            if n == WARMUP:
                start = time.perf_counter()
            plan = {t: np.unique(ids, return_inverse=True) for t, ids in batch.items()}
            keys = {t: [f"{t}:{i}" for i in uniq.tolist()] for t, (uniq, _) in plan.items()}
            values = _mget(r, [key for ks in keys.values() for key in ks])
            records, at = {}, 0
            for t, (uniq, inv) in plan.items():
                records[t] = np.frombuffer(b"".join(values[at:at + uniq.size]), dtype=np.float32).reshape(-1, DIM + 1).copy()
                records[t][:, :DIM][inv]  # the get the model needs
                at += uniq.size
            for t, (ids, grads) in work.gradients(batch).items():
                uniq, inv = plan[t]
                summed = sum_rows(inv.reshape(-1), grads, uniq.size)  # what the client does, too
                rowwise_adagrad(records[t], summed)
            _mset(r, [key for ks in keys.values() for key in ks], np.concatenate(list(records.values())))
        return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", nargs="+", default=["criteo", "zipf"], choices=sorted(WORKLOADS))
    parser.add_argument("--scale", type=float, default=0.1, help="table sizes (criteo, zipf)")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    for name in args.workload:
        work = WORKLOADS[name](args.iters, args.scale)
        total = sum(sum(ids.size for ids in b.values()) for b in work.batches[WARMUP:])
        secs = {
            "redis (no persistence)": redis_loop(work, "--appendonly", "no"),
            "redis (AOF everysec)": redis_loop(work, "--appendonly", "yes", "--appendfsync", "everysec"),
            "ectable none": cluster_loop(work, "none", 4, 0, 6, True)[0],
            "ectable xor(4,1)": cluster_loop(work, "xor", 4, 1, 6, True)[0],
            "ectable rs(4,2)": cluster_loop(work, "rs", 4, 2, 6, True)[0],
        }
        base = secs["redis (no persistence)"]
        out = [[name_, round(total / s), round(base / s, 2)] for name_, s in secs.items()]
        print(f"\n{work.describe()}; {args.iters} iterations, rowwise_adagrad, no model step")
        report(f"redis_baseline_{name}", ["store", "ids/s", "vs redis"], out,
               {"seconds": secs, "workload": work.describe()})


if __name__ == "__main__":
    main()
