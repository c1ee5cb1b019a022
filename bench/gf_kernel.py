"""Throughput of the parity-delta kernel `parity ^= c * delta` over GF(2^8), one core.

Compares ectable's kernel with plain XOR (the xor code's path) and with a full zfec
encode of the same bytes; and the terms of a whole received rs(4,2) delta (`delta_terms`:
rows of 260 bytes, each with its own parity index and data position, so its own coefficient), beside
the same terms made as before `adcb6f8` (each coefficient's rows gathered, copied out to `bytes` and
back 64 KiB at a time, scattered): the ratio of the two is measured in this one run.
Target (SPEC section 5): >= 1 GB/s per core from 64 KiB up.
"""
from __future__ import annotations

import numpy as np
import zfec

from ectable.codes import RSCode, gf256

from .common import best_rate, report

SIZES = [64 << 10, 1 << 20, 16 << 20]
RECORD = 260  # bytes of a dim-64 record with one optimizer value (the benchmarks' tables)


def terms_through_bytes(code, j, i, delta):
    """`code.delta_terms` as it was made before `adcb6f8`, the baseline of the ratio."""
    coef = code.coefficients[j, i]
    order = np.argsort(coef, kind="stable")
    ranked, grouped = coef[order], delta[order]
    cuts = (np.flatnonzero(ranked[1:] != ranked[:-1]) + 1).tolist()
    for start, end in zip([0, *cuts], [*cuts, ranked.size]):
        flat = grouped[start:end].reshape(-1)
        table = gf256.PRODUCT[int(ranked[start])]
        for lo in range(0, flat.size, gf256.CHUNK):
            flat[lo:lo + gf256.CHUNK] = np.frombuffer(flat[lo:lo + gf256.CHUNK].tobytes().translate(table), np.uint8)
    out = np.empty_like(grouped)
    out[order] = grouped
    return out


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
        rows_of = delta[: n * RECORD].reshape(n, RECORD)
        assert np.array_equal(code.delta_terms(j, i, rows_of), terms_through_bytes(code, j, i, rows_of))
        terms, before = 0.0, 0.0
        for _ in range(3):  # interleaved: a noisy neighbour slows both alike
            terms = max(terms, best_rate(lambda: code.delta_terms(j, i, rows_of), n * RECORD, repeat=2))
            before = max(before, best_rate(lambda: terms_through_bytes(code, j, i, rows_of), n * RECORD, repeat=2))
        rows.append([f"{size >> 10} KiB", round(gf / 1e9, 2), round(xor / 1e9, 2), round(rs / 1e9, 2),
                     round(terms / 1e9, 2), round(before / 1e9, 2), round(terms / before, 2),
                     "yes" if gf >= 1e9 else "NO"])
    report("gf_kernel", ["batch", "GF addmul GB/s", "XOR GB/s", "zfec rs(4,2) encode GB/s", "delta terms GB/s",
                         "through bytes GB/s", "terms / through bytes", ">= 1 GB/s"], rows)


if __name__ == "__main__":
    main()
