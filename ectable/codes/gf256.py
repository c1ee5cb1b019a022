"""GF(2^8) arithmetic with zfec's polynomial 0x11D, vectorised over byte arrays."""
from __future__ import annotations

import numpy as np

from ..arrays import put_rows

POLY = 0x11D
CHUNK = 64 * 1024  # bytes per lookup pass: keeps source, table and product in L1/L2


def _tables():
    exp = np.zeros(512, dtype=np.int32)
    log = np.zeros(256, dtype=np.int32)
    x = 1
    for i in range(255):
        exp[i] = x
        log[x] = i
        x <<= 1
        if x & 0x100:
            x ^= POLY
    exp[255:510] = exp[:255]
    return exp, log


EXP, LOG = _tables()


def mul(a: int, b: int) -> int:
    """Product of two field elements."""
    if a == 0 or b == 0:
        return 0
    return int(EXP[LOG[a] + LOG[b]])


def _product_table(c: int) -> bytes:
    """The 256-byte table x -> c * x, for bytes.translate."""
    if c == 0:
        return bytes(256)
    out = np.zeros(256, dtype=np.uint8)
    out[1:] = EXP[LOG[np.arange(1, 256)] + LOG[c]]
    return out.tobytes()


PRODUCT = [_product_table(c) for c in range(256)]


def xor_into(dst: np.ndarray, src: np.ndarray) -> None:
    """dst ^= src on equal-shaped uint8 arrays, in wide words when possible."""
    if dst.flags.c_contiguous and src.flags.c_contiguous and dst.nbytes % 8 == 0:
        np.bitwise_xor(dst.reshape(-1).view(np.uint64), src.reshape(-1).view(np.uint64),
                       out=dst.reshape(-1).view(np.uint64))
    else:
        np.bitwise_xor(dst, src, out=dst)


def xor_rows(dst: np.ndarray, rows: np.ndarray, src: np.ndarray) -> None:
    """dst[rows] ^= src for a 2-D uint8 `dst` and unique `rows`: one gather, XOR and scatter."""
    part = np.take(dst, rows, axis=0)
    xor_into(part, src)
    put_rows(dst, rows, part)


def addmul_rows(dst: np.ndarray, rows: np.ndarray, coef: np.ndarray, src: np.ndarray, order: np.ndarray) -> None:
    """dst[rows[q]] ^= coef[q] * src[order[q]] for a 2-D uint8 `dst`, unique `rows` and `addmul_sorted`'s other
    arguments: one gather, the products XORed in, one scatter (`xor_rows` with coefficients)."""
    part = np.take(dst, rows, axis=0)
    addmul_sorted(part, coef, src, order)
    put_rows(dst, rows, part)


def scale_rows(coef: np.ndarray, src: np.ndarray) -> np.ndarray:
    """A new array whose row x is coef[x] * src[x], for 2-D uint8 `src` and one coefficient per row."""
    order = np.argsort(coef, kind="stable")  # the rows of each coefficient together: one table each
    out = np.empty(src.shape, dtype=np.uint8)
    put_rows(out, order, scale_sorted(coef[order], src, order))
    return out


def scale_sorted(coef: np.ndarray, src: np.ndarray, order: np.ndarray) -> np.ndarray:
    """A new array whose row q is coef[q] * src[order[q]], for 2-D uint8 `src`, valid row numbers `order` and
    `coef` in runs of equal values (nothing is scattered)."""
    width = src.shape[1]
    out = bytearray(coef.size * width)
    view = memoryview(out)
    for lo, hi, product in _products(coef, src, order):
        view[lo * width:hi * width] = product
    return np.frombuffer(out, dtype=np.uint8).reshape(coef.size, width)


def addmul_sorted(dst: np.ndarray, coef: np.ndarray, src: np.ndarray, order: np.ndarray) -> None:
    """dst[q] ^= coef[q] * src[order[q]] in place, for C-contiguous 2-D uint8 `dst` of `coef.size` rows and
    `scale_sorted`'s other arguments: each product is XORed in as it is made, with no array of terms."""
    flat = dst.reshape(-1)
    width = src.shape[1]
    if width % 4 == 0:  # in wider words
        flat, width, word = flat.view(np.uint32), width // 4, np.uint32
    else:
        word = np.uint8
    for lo, hi, product in _products(coef, src, order):
        seg = flat[lo * width:hi * width]
        np.bitwise_xor(seg, np.frombuffer(product, dtype=word), out=seg)


def _products(coef: np.ndarray, src: np.ndarray, order: np.ndarray):
    """(lo, hi, bytes of coef[q] * src[order[q]] for q in [lo, hi)), in order: each run of equal coefficients'
    rows are gathered and looked up in passes of `CHUNK` bytes."""
    width = src.shape[1]
    if not coef.size or not width:
        return
    cuts = (np.flatnonzero(coef[1:] != coef[:-1]) + 1).tolist()
    step = max(1, CHUNK // width)  # rows per lookup pass
    full = bytearray(min(step, coef.size) * width)  # gathered straight into what `translate` reads
    for start, end in zip([0, *cuts], [*cuts, coef.size]):
        table = PRODUCT[int(coef[start])]
        for lo in range(start, end, step):
            hi = min(end, lo + step)
            gathered = full if (hi - lo) * width == len(full) else bytearray((hi - lo) * width)
            np.take(src, order[lo:hi], axis=0, mode="clip",  # "raise" would gather into a copy first
                    out=np.frombuffer(gathered, dtype=np.uint8).reshape(hi - lo, width))
            yield lo, hi, gathered.translate(table)


def addmul(dst: np.ndarray, c: int, src: np.ndarray) -> None:
    """dst ^= c * src, in place, on equal-shaped uint8 arrays."""
    if c == 0:
        return
    if c == 1:
        xor_into(dst, src)
        return
    src = np.ascontiguousarray(src)
    if not dst.flags.c_contiguous:
        tmp = dst.copy()
        addmul(tmp, c, src)
        dst[...] = tmp
        return
    flat_in, flat_out = memoryview(src.reshape(-1)), dst.reshape(-1)
    table = PRODUCT[c]
    for start in range(0, flat_out.size, CHUNK):
        part = np.frombuffer(flat_in[start:start + CHUNK].tobytes().translate(table), dtype=np.uint8)
        seg = flat_out[start:start + part.size]
        np.bitwise_xor(seg, part, out=seg)
