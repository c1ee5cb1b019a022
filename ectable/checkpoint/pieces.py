"""A checkpoint's files: pieces of rows, and the manifest that makes them a checkpoint.

A checkpoint is a directory (a local path or any `fsspec` URL) holding pieces and one
`manifest.json`. A piece holds some rows of one table, by row id, so it does not depend on
the layout of the cluster that wrote it: their ids, their weights (quantized, `quantize.py`,
or exact float32) and their optimizer state (exact unless quantized on request). Ascending ids
are stored as the first one and the gaps after it, in the narrowest unsigned type that holds
them (a full checkpoint's gaps are all alike and compress to almost nothing; a differential's
take a byte or two a row instead of eight); other ids as int64. Its bytes are MAGIC, then one lz4 frame
of the msgpack list of the message frames `transport.codec` makes of them (the wire format:
a header naming each array's dtype and shape, then the arrays' raw bytes), so decoding a
piece checks it as strictly as a message from the network. The
manifest, written last and moved into place in one step, lists every piece with its size and
SHA-256: a directory without it, or whose pieces do not match it, is not a checkpoint, and
reading it says which piece is wrong.
"""
from __future__ import annotations

import hashlib
import json
import uuid

import fsspec
import lz4.frame
import msgpack
import numpy as np

from ..errors import Error
from ..transport import codec
from . import quantize

MAGIC = b"ECTABLE-PIECE-3\n"
OLD_MAGIC = b"ECTABLE-PIECE-2\n"  # ids always int64; still read
MANIFEST = "manifest.json"
FORMAT = 1


class BadCheckpoint(Error):
    """A checkpoint is missing, partial, corrupt or does not fit what it is restored into; names the piece."""


def location(url: str):
    """(filesystem, root path) of a local path or fsspec URL."""
    return fsspec.core.url_to_fs(url)


def encode_piece(table: str, ids: np.ndarray, weights: np.ndarray, state: np.ndarray,
                 bits: int | None = None, adaptive: bool = False, state_bits: int | None = None) -> bytes:
    """A piece's bytes: rows `ids` of `table` (in any order; stored in id order), their weights float32 [n, dim]
    (as `bits`-bit codes, or exact if None) and optimizer state float32 [n, s] (exact, or as `state_bits`-bit
    codes)."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size > 1 and (ids[1:] < ids[:-1]).any():  # rows in id order (a node's rows are not)
        order = np.argsort(ids, kind="stable")
        ids, weights, state = ids[order], np.asarray(weights)[order], np.asarray(state)[order]
    first, stored = _gaps(ids)
    header = {"table": table, "rows": int(ids.size), "dim": int(weights.shape[1]), "first": first,
              "gap_bytes": stored.itemsize, "bits": bits, "adaptive": bool(adaptive and bits is not None),
              "state_bits": state_bits, "state_width": int(state.shape[1])}
    arrays = [stored if first is None else stored.view(np.uint8), *_stored(weights, bits, adaptive),
              *_stored(state, state_bits, False)]
    frames = codec.encode(header, arrays)
    return MAGIC + lz4.frame.compress(msgpack.packb([bytes(f) for f in frames], use_bin_type=True))


MAX_ID = 1 << 62  # ids at or past it are stored as int64 (no table comes near: rows < 2**40)
GAPS = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}


def _gaps(ids: np.ndarray) -> tuple[int | None, np.ndarray]:
    """(first id, the gaps after it, little-endian in 1, 2 or 4 bytes) of ascending ids; (None, ids) of
    others."""
    if ids.size == 0 or ids[0] < 0 or ids[-1] >= MAX_ID:
        return None, ids
    gaps = np.diff(ids)
    if gaps.size and (gaps.min() <= 0 or gaps.max() >= 1 << 32):
        return None, ids
    top = int(gaps.max()) if gaps.size else 0
    return int(ids[0]), gaps.astype(GAPS[1 if top < 1 << 8 else 2 if top < 1 << 16 else 4])


def _ids(n, first: int | None, width, stored: np.ndarray) -> np.ndarray:
    """The `n` row ids (int64) of what `_gaps` stored (gaps as bytes, `width` bytes each); ValueError if
    they are not its output."""
    if first is None:
        return stored
    if not isinstance(first, int) or not 0 <= first < MAX_ID or width not in GAPS or stored.dtype != np.uint8 \
            or not isinstance(n, int) or stored.size != (n - 1) * width:
        raise ValueError("its ids are not the gaps after a first id of the rows its header names")
    gaps = stored.view(GAPS[width])
    if gaps.size and (gaps.min() == 0 or first + int(gaps.sum(dtype=np.uint64)) >= MAX_ID):
        raise ValueError("its ids are not ascending, or too large")
    ids = np.empty(n, dtype=np.int64)
    ids[0] = first
    np.cumsum(gaps, dtype=np.int64, out=ids[1:])
    ids[1:] += first
    return ids


def _stored(values: np.ndarray, bits: int | None, adaptive: bool) -> list:
    """The arrays that store float32 `values`: themselves, or their codes, range starts and steps."""
    if bits is None:
        return [np.asarray(values, dtype=np.float32)]
    stored = quantize.quantize(np.asarray(values, dtype=np.float32), bits, adaptive)
    return [stored.codes, stored.lo, stored.scale]


def _loaded(arrays: list, bits: int | None, width: int) -> tuple[np.ndarray, list]:
    """(float32 values, the arrays left) from the front of `arrays`, as `_stored` stored them."""
    if bits is None:
        return arrays[0], arrays[1:]
    codes, lo, scale = arrays[:3]
    return quantize.dequantize(quantize.Quantized(codes, lo, scale, bits, width)), arrays[3:]


def decode_piece(data: bytes, name: str = "piece") -> dict:
    """{table, rows, dim, bits, adaptive, state_bits, ids, weights float32 [n, dim], state float32 [n, s]} of a
    piece's bytes; BadCheckpoint naming `name` if they are not one."""
    try:
        old = data.startswith(OLD_MAGIC)
        if not old and not data.startswith(MAGIC):
            raise ValueError("not a piece of an ectable checkpoint")
        frames = msgpack.unpackb(lz4.frame.decompress(data[len(OLD_MAGIC if old else MAGIC):]), raw=False)
        if not isinstance(frames, list) or not all(isinstance(f, bytes) for f in frames):
            raise ValueError("its body is not a list of frames")
        header, arrays = codec.decode(frames)
        n, dim, bits, state_bits = header["rows"], header["dim"], header["bits"], header["state_bits"]
        if not isinstance(header["table"], str) or bits not in (None, *quantize.BITS) \
                or state_bits not in (None, *quantize.BITS):
            raise ValueError("its header names no table or an unknown bit width")
        count = 1 + (1 if bits is None else 3) + (1 if state_bits is None else 3)
        if len(arrays) != count:
            raise ValueError(f"it holds {len(arrays)} arrays, not {count}")
        ids = arrays[0] if old else _ids(n, header["first"], header["gap_bytes"], arrays[0])
        if ids.dtype != np.int64:
            raise ValueError("its ids are not int64")
        weights, rest = _loaded(arrays[1:], bits, dim)
        state, _ = _loaded(rest, state_bits, header["state_width"])
        if ids.shape != (n,) or weights.shape != (n, dim) or state.ndim != 2 or state.shape[0] != n:
            raise ValueError("its arrays do not hold the rows its header names")
        return {**{k: header[k] for k in ("table", "rows", "dim", "bits", "adaptive", "state_bits")}, "ids": ids,
                "weights": weights, "state": state}
    except Exception as exc:  # anything malformed: lz4, msgpack, the wire format, shapes, keys, types
        raise BadCheckpoint(f"{name}: {type(exc).__name__}: {exc}"[:300]) from None


def write_piece(fs, directory: str, data: bytes, prefix: str = "piece") -> dict:
    """Write a piece's bytes under a fresh name in `directory`; its manifest entry {file, bytes, sha256}."""
    name = f"{prefix}-{uuid.uuid4().hex[:12]}.ectp"
    with fs.open(f"{directory}/{name}", "wb") as f:
        f.write(data)
    return {"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def read_piece(fs, directory: str, entry: dict) -> dict:
    """A piece listed in a manifest, checked against its size and checksum, decoded (`decode_piece`)."""
    name = entry["file"]
    try:
        data = fs.cat_file(f"{directory}/{name}")
    except FileNotFoundError:
        raise BadCheckpoint(f"piece {name} is missing from {directory}") from None
    if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise BadCheckpoint(f"piece {name} is corrupt or truncated: {len(data)} bytes, not the {entry['bytes']} "
                            f"its manifest lists, or another checksum")
    return decode_piece(data, f"piece {name}")


def write_manifest(fs, directory: str, manifest: dict) -> None:
    """Make `directory` a checkpoint: its manifest written under a temporary name, then moved into place."""
    tmp = f"{directory}/.{MANIFEST}.{uuid.uuid4().hex[:12]}"
    with fs.open(tmp, "wb") as f:
        f.write(json.dumps({"format": FORMAT, **manifest}, sort_keys=True).encode())
    fs.mv(tmp, f"{directory}/{MANIFEST}")


def read_manifest(fs, directory: str) -> dict:
    """The manifest of the checkpoint in `directory`; BadCheckpoint if there is none (never finished) or it
    is not one."""
    try:
        manifest = json.loads(fs.cat_file(f"{directory}/{MANIFEST}"))
    except FileNotFoundError:
        raise BadCheckpoint(f"{directory} holds no finished checkpoint (no {MANIFEST})") from None
    except ValueError as exc:
        raise BadCheckpoint(f"{directory}/{MANIFEST} is not a manifest: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(manifest.get("pieces"), list):
        raise BadCheckpoint(f"{directory}/{MANIFEST} is not a manifest of format {FORMAT}")
    return manifest
