"""Per-row quantization of stored rows (Check-N-Run): what a checkpoint keeps of each float32 row.

Each row x (one table row's weights) is stored as `bits`-bit codes q plus its own range start
`lo` and step `scale` (float32 each), and read back as lo + q * scale (asymmetric uniform,
per row). With `adaptive`, each row's range is first shrunk greedily, one step of 1/`BINS` of
its span at a time from whichever end lowers the L2 error more, for at most `RATIO` of the span,
keeping the range of least error seen (rows with a few outliers lose less precision on the
rest); values outside the range are clipped to it. Training never sees these: rows stay
float32 in the nodes, and only a checkpoint stores them this way.

Codes are packed little-endian, `bits` per value, row by row: a row of `dim` values takes
ceil(dim * bits / 8) bytes. A row's error is at most scale / 2 per value without `adaptive`
(plus float32 rounding); with it, the row's L2 error is at most that of the plain range.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..errors import InvalidRequest

BITS = (2, 3, 4, 8)
BINS = 200  # the adaptive search's step: 1/BINS of a row's span
RATIO = 0.16  # ...for at most this share of the span (FBGEMM's greedy parameter search uses the same)


class Quantized(NamedTuple):
    """Rows as stored: packed codes uint8 [n, ceil(dim * bits / 8)], range start and step float32 [n]."""

    codes: np.ndarray
    lo: np.ndarray
    scale: np.ndarray
    bits: int
    dim: int


def row_bytes(dim: int, bits: int) -> int:
    """Bytes one stored row takes: its packed codes, its range start and its step."""
    return math.ceil(dim * bits / 8) + 8


def quantize(rows, bits: int, adaptive: bool = False) -> Quantized:
    """Float rows [n, dim] as `bits`-bit codes with a range per row; InvalidRequest for bits outside `BITS`,
    rows that are not a finite 2-D float array, or values or spans beyond float32."""
    if bits not in BITS:
        raise InvalidRequest(f"bits must be one of {BITS} (or no quantization), got {bits!r}")
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.dtype.kind != "f":
        raise InvalidRequest(f"rows to quantize must be a 2-D float array, got {rows.dtype}{list(rows.shape)}")
    if not np.isfinite(rows).all():
        raise InvalidRequest("rows to quantize must be finite")
    with np.errstate(over="ignore"):
        x = rows.astype(np.float32, copy=False)
    if not np.isfinite(x).all():
        raise InvalidRequest("rows to quantize must fit float32")
    levels = (1 << bits) - 1
    n, dim = x.shape
    if dim == 0:
        lo = hi = np.zeros(n, dtype=np.float32)
    elif adaptive:
        lo, hi = _greedy_range(x, levels)
    else:
        lo, hi = x.min(axis=1), x.max(axis=1)
    scale = ((hi.astype(np.float64) - lo) / levels).astype(np.float32)
    with np.errstate(over="ignore"):
        top = lo + np.float32(levels) * scale
    if not np.isfinite(top).all():  # a span wider than float32's largest value: its top code would not read back
        raise InvalidRequest("a row's span (its largest minus its smallest value) must fit float32")
    return Quantized(pack(_codes(x, lo, scale, levels), bits), lo, scale, bits, dim)


def dequantize(stored: Quantized) -> np.ndarray:
    """float32 rows [n, dim] of stored rows."""
    q = unpack(stored.codes, stored.bits, stored.dim)
    return stored.lo[:, None] + q.astype(np.float32) * stored.scale[:, None]


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Codes uint8 [n, dim] (each below 2**bits) packed little-endian: uint8 [n, ceil(dim * bits / 8)]."""
    n, dim = q.shape
    if bits == 8:
        return np.ascontiguousarray(q, dtype=np.uint8)
    if 8 % bits:  # 3 bits: a code may straddle two bytes
        planes = (q[:, :, None] >> np.arange(bits, dtype=np.uint8)) & 1  # [n, dim, bits], lowest bit first
        return np.packbits(planes.reshape(n, dim * bits), axis=1, bitorder="little")
    per = 8 // bits
    padded = np.zeros((n, -(-dim // per) * per), dtype=np.uint8)
    padded[:, :dim] = q
    groups = padded.reshape(n, -1, per)
    out = groups[:, :, 0].copy()
    for i in range(1, per):
        out |= groups[:, :, i] << np.uint8(i * bits)
    return out


def unpack(codes: np.ndarray, bits: int, dim: int) -> np.ndarray:
    """Codes uint8 [n, dim] of packed codes (`pack`)."""
    n = codes.shape[0]
    if bits == 8:
        return codes
    if 8 % bits:
        planes = np.unpackbits(codes, axis=1, count=dim * bits, bitorder="little").reshape(n, dim, bits)
        return (planes << np.arange(bits, dtype=np.uint8)).sum(axis=2, dtype=np.uint8)
    per, mask = 8 // bits, np.uint8((1 << bits) - 1)
    out = np.empty((n, codes.shape[1], per), dtype=np.uint8)
    for i in range(per):
        np.bitwise_and(codes >> np.uint8(i * bits), mask, out=out[:, :, i])
    return out.reshape(n, -1)[:, :dim]


def _codes(x, lo, scale, levels) -> np.ndarray:
    """Nearest codes of float32 values x [n, dim] in each row's range (clipped to it); a row of no span codes to 0."""
    out = x - lo[:, None]
    out /= np.where(scale > 0, scale, np.float32(1))[:, None]
    np.rint(out, out=out)
    np.clip(out, 0, levels, out=out)
    return out.astype(np.uint8)


def _l2(x, lo, hi, levels) -> np.ndarray:
    """Each row's squared error when stored with range [lo, hi] (float32 x, float32 lo and hi)."""
    scale = (hi - lo) / np.float32(levels)
    err = x - lo[:, None]
    err /= np.where(scale > 0, scale, np.float32(1))[:, None]
    np.rint(err, out=err)
    np.clip(err, 0, levels, out=err)
    err *= scale[:, None]
    err += lo[:, None]
    err -= x
    return np.einsum("ij,ij->i", err, err)


def _greedy_range(x, levels) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the range of least L2 error met while shrinking [min, max] a step at a time from the better end."""
    lo, hi = x.min(axis=1), x.max(axis=1)
    step = (hi - lo) / np.float32(BINS)
    best, best_lo, best_hi = _l2(x, lo, hi, levels), lo, hi
    for _ in range(int(BINS * RATIO)):
        raised, lowered = _l2(x, lo + step, hi, levels), _l2(x, lo, hi - step, levels)
        up = raised < lowered
        lo, hi = np.where(up, lo + step, lo), np.where(up, hi, hi - step)
        loss = np.where(up, raised, lowered)
        better = loss < best
        best, best_lo, best_hi = np.where(better, loss, best), np.where(better, lo, best_lo), np.where(better, hi, best_hi)
    return best_lo, best_hi
