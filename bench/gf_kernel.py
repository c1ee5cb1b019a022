"""Throughput of the parity-delta kernel `parity ^= c * delta` over GF(2^8), one core.

Compares ectable's kernel with plain XOR (the xor code's path) and with a full zfec
encode of the same bytes; and the terms of a whole received rs(4,2) delta (`delta_terms`:
rows of 260 bytes, each with its own parity index and data position, so its own coefficient).
Target (SPEC section 5): >= 1 GB/s per core from 64 KiB up.
"""
from __future__ import annotations

import numpy as np
import zfec

from ectable.codes import RSCode, gf256

from .common import best_rate, report

SIZES = [64 << 10, 1 << 20, 16 << 20]
RECORD = 260  # bytes of a dim-64 record with one optimizer value (the benchmarks' tables)


def main():
    rng = np.random.default_rng(0)
    code = RSCode(4, 2)
    rows = []
    for size in SIZES:
        delta = rng.integers(0, 256, size, dtype=np.uint8)
        parity = rng.integers(0, 256, size, dtype=np.uint8)
        gf = best_rate(lambda: gf256.addmul(parity, 0x8E, delta), size)
        xor = best_rate(lambda: gf256.xor_into(parity, delta), size)
        k = 4
        blocks = [bytes(delta[i::k][: size // k]) for i in range(k)]
        enc = zfec.Encoder(k, k + 2)
        rs = best_rate(lambda: enc.encode(blocks, [k, k + 1]), size)
        n = size // RECORD
        j, i = rng.integers(0, 2, n), rng.integers(0, k, n)
        terms = best_rate(lambda: code.delta_terms(j, i, delta[: n * RECORD].reshape(n, RECORD)), n * RECORD)
        rows.append([f"{size >> 10} KiB", round(gf / 1e9, 2), round(xor / 1e9, 2), round(rs / 1e9, 2),
                     round(terms / 1e9, 2), "yes" if gf >= 1e9 else "NO"])
    report("gf_kernel", ["batch", "GF addmul GB/s", "XOR GB/s", "zfec rs(4,2) encode GB/s", "delta terms GB/s",
                         ">= 1 GB/s"], rows)


if __name__ == "__main__":
    main()
