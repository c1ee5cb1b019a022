"""Wire format: one msgpack header frame, then the arrays' raw bytes (never pickle).

The header is a map of plain values; its key "arrays" lists `[dtype, shape]` or
`[dtype, shape, offset]` per array. Arrays of `PACK_BELOW` bytes or more travel as frames of
their own, zero-copy, in order after the header; smaller ones are copied side by side (at
8-byte-aligned offsets) into one frame that comes first, since a frame costs far more than
copying a few KiB (ZeroMQ copies small frames anyway). Only the dtypes in `DTYPES` cross.
"""
from __future__ import annotations

import math

import msgpack
import numpy as np

DTYPES = {"i8": np.dtype("<i8"), "f4": np.dtype("<f4"), "f8": np.dtype("<f8"), "u1": np.dtype("u1")}
_CODES = {dt: code for code, dt in DTYPES.items()}
MAX_HEADER = 1 << 20
MAX_DIMS = 4
PACK_BELOW = 1 << 16
ALIGN = 8
_ZEROS = bytes(ALIGN)


class Malformed(ValueError):
    """A message that does not follow the wire format."""


def encode(header: dict, arrays) -> list:
    """Frames of a message: the packed header, the small arrays' shared frame, then each large array's buffer."""
    descs, small, large, at = [], [], [], 0
    for arr in arrays:
        if type(arr) is not np.ndarray or not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        code = _CODES.get(arr.dtype)
        if code is None:
            arr, code = _wire_dtype(arr)
        nbytes = arr.nbytes
        if nbytes < PACK_BELOW:
            descs.append([code, list(arr.shape), at])
            small.append(arr)  # its bytes, as `bytes.join` reads a C-contiguous array
            padded = -(-nbytes // ALIGN) * ALIGN
            if padded != nbytes:
                small.append(_ZEROS[: padded - nbytes])
            at += padded
        else:
            descs.append([code, list(arr.shape)])
            large.append(memoryview(arr).cast("B"))
    frames = [msgpack.packb({**header, "arrays": descs}, use_bin_type=True)]
    if small:
        frames.append(b"".join(small))  # one copy of them all, with the alignment padding
    return frames + large


def _wire_dtype(arr: np.ndarray) -> tuple[np.ndarray, str]:
    """`arr` in the little-endian dtype it crosses as, and that dtype's code; TypeError if none."""
    code = _CODES.get(arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype)
    if code is None:
        raise TypeError(f"cannot send arrays of dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=DTYPES[code]), code


LIMIT = 1 << 40  # of a dimension or an offset


def _descriptor(desc) -> tuple[np.dtype, tuple, int | None]:
    """(dtype, shape, offset or None) of a descriptor; Malformed unless it is [code, [dims], offset?] with
    a known code, at most MAX_DIMS ints in [0, LIMIT) and an ALIGN-aligned int offset in [0, LIMIT)."""
    if type(desc) is list and 2 <= len(desc) <= 3:  # exact types, few calls: a write carries tens of these
        dtype, shape = DTYPES.get(desc[0]) if type(desc[0]) is str else None, desc[1]
        if dtype is not None and type(shape) is list and len(shape) <= MAX_DIMS and all(
                type(d) is int and 0 <= d < LIMIT for d in shape):
            if len(desc) == 2:
                return dtype, tuple(shape), None
            offset = desc[2]
            if type(offset) is int and 0 <= offset < LIMIT and offset % ALIGN == 0:
                return dtype, tuple(shape), offset
    raise Malformed(f"bad array descriptor {desc!r}"[:200])


def decode(frames) -> tuple[dict, list]:
    """(header, arrays) of received frames; raises Malformed. Arrays are read-only views of the frames."""
    if not frames:
        raise Malformed("empty message")
    first = frames[0]
    raw = first.buffer if hasattr(first, "buffer") else first
    if len(raw) > MAX_HEADER:
        raise Malformed("header too large")
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:
        raise Malformed(f"header is not msgpack: {type(exc).__name__}") from None
    if not isinstance(header, dict):
        raise Malformed("header is not a map")
    descs = header.pop("arrays", [])
    if not isinstance(descs, list):
        raise Malformed("header's arrays is not a list")
    descs = [_descriptor(d) for d in descs]
    packed = any(offset is not None for _, _, offset in descs)
    bufs = [f.buffer if hasattr(f, "buffer") else memoryview(f) for f in frames[1:]]
    if len(bufs) != packed + sum(offset is None for _, _, offset in descs):
        raise Malformed(f"header lists {len(descs)} arrays, message has {len(frames) - 1} frames")
    pack, large = (bufs[0] if packed else None), iter(bufs[packed:])
    arrays = []
    for dtype, shape, offset in descs:
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        if offset is None:
            buf = next(large)
            if nbytes != len(buf):
                raise Malformed(f"array frame of {len(buf)} bytes does not hold {dtype.str}{list(shape)}")
            array = np.frombuffer(buf, dtype=dtype)
        else:
            if offset + nbytes > len(pack):
                raise Malformed(f"array at {offset} of {nbytes} bytes overruns the shared frame of {len(pack)}")
            array = np.frombuffer(pack, dtype=dtype, count=count, offset=offset)
        arrays.append(array if len(shape) == 1 else array.reshape(shape))
    return header, arrays
