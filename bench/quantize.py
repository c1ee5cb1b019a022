"""Checkpoint quantization speed: quantize and dequantize against copying the same float32 rows, in one run.

Rows of `--dim` normal values (a trained table's weights), each bit width, plain and adaptive; rates are
the best of `--repeat` (`common.best_rate`); "vs copy" is the rate over that of `rows.copy()`.

    python -m bench.quantize --rows 100000 --dim 64
"""
from __future__ import annotations

import argparse

import numpy as np

from ectable.checkpoint import quantize

from .common import best_rate, report


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = np.random.default_rng(0).normal(0, 0.05, (args.rows, args.dim)).astype(np.float32)
    mb = rows.nbytes / 1e6
    copy = best_rate(rows.copy, mb, args.repeat)
    out = []
    for bits in quantize.BITS:
        for adaptive in (False, True):
            stored = quantize.quantize(rows, bits, adaptive)
            q = best_rate(lambda: quantize.quantize(rows, bits, adaptive), mb, 1 if adaptive else args.repeat)
            d = best_rate(lambda: quantize.dequantize(stored), mb, args.repeat)
            rmse = float(np.sqrt(((quantize.dequantize(stored) - rows) ** 2).mean()))
            out.append([bits, "adaptive" if adaptive else "plain", round(q), round(q / copy, 4), round(d),
                        round(d / copy, 3), f"{rmse:.2e}",
                        round(rows.nbytes / (stored.codes.nbytes + stored.lo.nbytes + stored.scale.nbytes), 2)])
    print(f"\n{args.rows:,} rows x {args.dim}; copying them: {copy:.0f} MB/s")
    report("quantize", ["bits", "range", "quantize MB/s", "vs copy", "dequantize MB/s", "vs copy", "rmse",
                        "fp32 / stored"], out)


if __name__ == "__main__":
    main()
