"""The wire format's cost per message: encoding and decoding a many-table write as a node gets one.

A write of `--tables` tables (ids: `--rows` int64; gradients: `--rows` x 64 float32 each), what a
criteo-like batch at a tenth of the size sends each of 6 nodes, encoded and decoded `--reps` times;
microseconds per message, the median of `--repeat` runs. `--codec` times another tree's
`transport/codec.py` (it needs only numpy and msgpack) in the same run, interleaved, as a ratio.

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


def timed(codec, header, arrays, reps: int) -> tuple[float, float]:
    """(encode, decode) microseconds per message with `codec`, after checking its round trip."""
    frames = [bytes(f) for f in codec.encode(header, arrays)]
    got_header, got = codec.decode(frames)
    assert got_header == header and all(np.array_equal(a, b) for a, b in zip(got, arrays))
    return per_call(lambda: codec.encode(header, arrays), reps), per_call(lambda: codec.decode(frames), reps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=23)
    parser.add_argument("--rows", type=int, default=90)
    parser.add_argument("--reps", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--codec", help="another codec.py, timed in the same run, interleaved")
    args = parser.parse_args()
    codecs = {"this tree's": ours, **({args.codec: load(args.codec)} if args.codec else {})}
    header, arrays = message(args.tables, args.rows)
    runs: dict = {name: [] for name in codecs}
    for _ in range(args.repeat):
        for name, codec in codecs.items():
            runs[name].append(timed(codec, header, arrays, args.reps))
    print(f"a write of {args.tables} tables x {args.rows} rows ({2 * args.tables} arrays), "
          f"median of {args.repeat} runs, interleaved")
    median = {name: [statistics.median(t[i] for t in times) for i in (0, 1)] for name, times in runs.items()}
    mine = median["this tree's"]
    report("codec_time", ["codec", "encode us", "decode us", "encode vs this", "decode vs this"],
           [[name, round(enc, 1), round(dec, 1), round(enc / mine[0], 3), round(dec / mine[1], 3)]
            for name, (enc, dec) in median.items()])


if __name__ == "__main__":
    main()
