"""Wire format: one msgpack header frame, then one raw frame per array (never pickle).

The header is a map of plain values; its key "arrays" lists `[dtype, shape]` for each
array frame that follows. Only the dtypes in `DTYPES` cross the wire.
"""
from __future__ import annotations

import math

import msgpack
import numpy as np

DTYPES = {"i8": np.dtype("<i8"), "f4": np.dtype("<f4"), "f8": np.dtype("<f8"), "u1": np.dtype("u1")}
_CODES = {dt: code for code, dt in DTYPES.items()}
MAX_HEADER = 1 << 20
MAX_DIMS = 4


class Malformed(ValueError):
    """A message that does not follow the wire format."""


def encode(header: dict, arrays) -> list:
    """Frames of a message: the packed header, then each array's buffer (zero-copy when contiguous)."""
    descs, frames = [], []
    for arr in arrays:
        arr = np.asarray(arr)
        code = _CODES.get(arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype)
        if code is None:
            raise TypeError(f"cannot send arrays of dtype {arr.dtype}")
        arr = np.require(arr, dtype=DTYPES[code], requirements="C")
        descs.append([code, list(arr.shape)])
        frames.append(memoryview(arr).cast("B") if arr.size else b"")
    return [msgpack.packb({**header, "arrays": descs}, use_bin_type=True), *frames]


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
    if not isinstance(descs, list) or len(descs) != len(frames) - 1:
        raise Malformed(f"header lists {len(descs) if isinstance(descs, list) else '?'} arrays, message has {len(frames) - 1}")
    arrays = []
    for desc, frame in zip(descs, frames[1:]):
        if not (isinstance(desc, list) and len(desc) == 2 and isinstance(desc[0], str) and desc[0] in DTYPES
                and isinstance(desc[1], list)
                and len(desc[1]) <= MAX_DIMS and all(isinstance(d, int) and 0 <= d < 1 << 40 for d in desc[1])):
            raise Malformed(f"bad array descriptor {desc!r}"[:200])
        dtype, shape = DTYPES[desc[0]], tuple(desc[1])
        buf = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
        if math.prod(shape) * dtype.itemsize != len(buf):
            raise Malformed(f"array frame of {len(buf)} bytes does not hold {desc[0]}{list(shape)}")
        arrays.append(np.frombuffer(buf, dtype=dtype).reshape(shape))
    return header, arrays
