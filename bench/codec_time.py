"""The wire format's cost per message: encoding and decoding a many-table write as a node gets one.

A write of `--tables` tables (ids: `--rows` int64; gradients: `--rows` x 64 float32 each), what a
criteo-like batch at a tenth of the size sends each of 6 nodes, encoded and decoded `--reps` times;
microseconds per message, the median of `--repeat` runs. `--codec` times another tree's
`transport/codec.py` (it needs only numpy and msgpack) with the same message.

    python -m bench.codec_time
    python -m bench.codec_time --codec <another tree>/transport/codec.py
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import numpy as np

from ectable.transport import codec as ours

from .common import report


def message(tables: int, rows: int) -> tuple[dict, list]:
    rng = np.random.default_rng(0)
    arrays = []
    for _ in range(tables):
        arrays += [np.sort(rng.choice(100_000, rows, replace=False)).astype(np.int64),
                   rng.random((rows, 64), dtype=np.float32)]
    header = {"op": "write", "id": 5, "parts": [[f"t{t}", "apply_gradient"] for t in range(tables)],
              "cid": "trainer/1", "cseq": 7}
    return header, arrays


def load(path: str):
    """The codec module in file `path`."""
    spec = importlib.util.spec_from_file_location("codec_timed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def per_call(fn, reps: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=23)
    parser.add_argument("--rows", type=int, default=90)
    parser.add_argument("--reps", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--codec", help="a codec.py to time instead of this tree's")
    args = parser.parse_args()
    codec = load(args.codec) if args.codec else ours
    header, arrays = message(args.tables, args.rows)
    frames = [bytes(f) for f in codec.encode(header, arrays)]
    got_header, got = codec.decode(frames)
    assert got_header == header and all(np.array_equal(a, b) for a, b in zip(got, arrays))
    encode = [per_call(lambda: codec.encode(header, arrays), args.reps) for _ in range(args.repeat)]
    decode = [per_call(lambda: codec.decode(frames), args.reps) for _ in range(args.repeat)]
    print(f"{codec.__file__}: a write of {args.tables} tables x {args.rows} rows ({2 * args.tables} arrays), "
          f"median of {args.repeat} runs")
    report("codec_time", ["message", "encode us", "decode us"],
           [[f"write, {args.tables} tables", round(statistics.median(encode), 1), round(statistics.median(decode), 1)]])


if __name__ == "__main__":
    main()
