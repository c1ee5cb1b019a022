"""Robustness: stream garbage messages at every node of a process cluster, then show nothing changed.

Sends random bytes, msgpack headers with wrong ops, fields, descriptors and truncated arrays;
reports how many each node refused, that every node is still up, and that rows and parity
are exactly as before.
"""
from __future__ import annotations

import sys
import time

import msgpack
import numpy as np
import zmq

import ectable
from ectable.testing import check_parity, read_records

from .common import report


def garbage(rng: np.random.Generator, n: int):
    ops = ["get", "get_many", "write", "delta", "restore", "create_table", "map", "nope", "step", "get_parity"]
    for i in range(n):
        kind = i % 4
        if kind == 0:
            yield [rng.bytes(int(rng.integers(0, 64))) for _ in range(int(rng.integers(1, 4)))]
        elif kind == 1:
            header = {"op": ops[int(rng.integers(len(ops)))], "table": "t", "id": i,
                      "arrays": [["i8", [int(rng.integers(0, 9))]], ["f4", [2, 8]]]}
            yield [msgpack.packb(header), rng.bytes(16), rng.bytes(int(rng.integers(0, 80)))]
        elif kind == 2:
            header = {"op": "write", "parts": [["t", "put"]], "id": i, "arrays": [["i8", [1]], ["f4", [1, 8]]]}
            yield [msgpack.packb(header), np.array([10**9]).tobytes(), np.full(8, np.nan, np.float32).tobytes()]
        else:
            header = {"op": "delta", "source": "evil", "seq": int(rng.integers(-5, 5)), "tables": ["t"],
                      "id": i, "arrays": [["i8", [1]], ["u1", [1, 3]]]}
            yield [msgpack.packb(header), np.array([1]).tobytes(), b"abc"]


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    with ectable.LocalCluster(nodes=5, code="rs", k=3, r=2) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=10_000, dim=8, optimizer="adagrad")
        client.apply_gradient("t", np.arange(0, 10_000, 3), np.ones((3334, 8)))
        client.flush()
        before = read_records(client, "t", np.arange(10_000))
        ctx = zmq.Context.instance()
        socks = [ctx.socket(zmq.DEALER) for _ in cluster.endpoints]
        for sock, endpoint in zip(socks, cluster.endpoints):
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
        start = time.perf_counter()
        rng = np.random.default_rng(0)
        for i, frames in enumerate(garbage(rng, n)):
            socks[i % len(socks)].send_multipart(frames)
            for sock in socks:  # read error replies as they come
                while sock.poll(0):
                    sock.recv_multipart()
        elapsed = time.perf_counter() - start
        time.sleep(0.5)
        for sock in socks:
            sock.close(0)
        status = client.status()
        after = read_records(client, "t", np.arange(10_000))
        check_parity(cluster, client)
        rows = [[n["position"], n["health"], n["malformed"], n["rejected"]] for n in status["nodes"]]
        print(f"{n} garbage messages in {elapsed:.1f} s; rows unchanged: {np.array_equal(before, after)}; "
              f"parity equals a fresh encode: True; nodes up: {sum(n['health'] == 'up' for n in status['nodes'])}/5")
        report("garbage_stream", ["node", "health", "malformed", "rejected"], rows)


if __name__ == "__main__":
    main()
